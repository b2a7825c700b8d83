//! The consumer's half of at-least-once: an inbox of processed event ids (see
//! [`outboxkit_store_sql::inbox`]).
//!
//! ```no_run
//! # async fn handle(pool: sqlx::PgPool, event_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
//! use outboxkit_store_postgres::Inbox;
//!
//! let inbox = Inbox::new("processed_events")?;
//! inbox.migrate(&pool).await?; // once, at start-up
//! let mut tx = pool.begin().await?;
//! if inbox.try_mark_processed(&mut tx, "billing", event_id).await? {
//!     // ... the business effect of the event, in the same transaction ...
//! }
//! tx.commit().await?; // then acknowledge the message to the broker
//! # Ok(()) }
//! ```

use std::time::Duration;

use uuid::Uuid;

use outboxkit_store_sql::config::TableRules;
use outboxkit_store_sql::inbox::{InboxSql, InboxStatements};

use crate::classify::Postgres;
use crate::config::TableName;

/// A `processed_events` table: `(consumer, event_id)` unique, with the time it was processed.
pub type Inbox = outboxkit_store_sql::inbox::Inbox<Postgres>;

/// The inbox in PostgreSQL: a purge index beside the table, ages as intervals.
impl InboxSql for Postgres {
    type Database = sqlx::Postgres;
    type EventId = Uuid;
    type Age = String;

    fn statements(name: &TableName) -> InboxStatements {
        let t = name.quoted();
        let index = Postgres::quote_ident(&format!("{}_processed_at_idx", name.name()));
        InboxStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                   consumer text NOT NULL, \
                   event_id uuid NOT NULL, \
                   processed_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
                   PRIMARY KEY (consumer, event_id)); \
                 CREATE INDEX IF NOT EXISTS {index} ON {t} (processed_at)"
            )
            .into(),
            insert: format!(
                "INSERT INTO {t} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            )
            .into(),
            purge: format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY(\
                   SELECT ctid FROM {t} WHERE processed_at < clock_timestamp() - $1::interval \
                   ORDER BY processed_at LIMIT $2))"
            )
            .into(),
        }
    }

    fn event_id(event_id: Uuid) -> Uuid {
        event_id
    }

    fn age(older_than: Duration) -> String {
        format!("{} milliseconds", older_than.as_millis())
    }

    fn rows_affected(done: &sqlx::postgres::PgQueryResult) -> u64 {
        done.rows_affected()
    }
}
