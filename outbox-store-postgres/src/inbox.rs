//! The consumer's half of at-least-once: an inbox of processed event ids.
//!
//! The relay delivers every event at least once, so a consumer may see an event twice (after a
//! relay crash, a broker redelivery, a consumer restart). Call
//! [`Inbox::try_mark_processed`] inside the consumer's own business transaction, before its
//! side effects: it returns `true` the first time an `(consumer, event_id)` pair is seen and
//! `false` afterwards. Because the mark is part of the business transaction, a rolled-back
//! transaction leaves no mark, and two consumers racing on the same event serialize on the
//! unique key: exactly one of them gets `true`.
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

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use outboxkit_core::Result;

use crate::classify::{classify, Target};
use crate::config::TableName;

/// A `processed_events` table: `(consumer, event_id)` unique, with the time it was processed.
#[derive(Debug, Clone)]
pub struct Inbox {
    target: Target,
    create: String,
    insert: String,
    purge: String,
}

impl Inbox {
    /// The inbox table `table` or `schema.table` (e.g. `processed_events`).
    pub fn new(table: &str) -> Result<Self> {
        let name = TableName::parse(table)?;
        let t = name.quoted();
        let index = format!("\"{}_processed_at_idx\"", name.name());
        Ok(Self {
            target: Target::table(name.to_string()),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                   consumer text NOT NULL, \
                   event_id uuid NOT NULL, \
                   processed_at timestamptz NOT NULL DEFAULT clock_timestamp(), \
                   PRIMARY KEY (consumer, event_id)); \
                 CREATE INDEX IF NOT EXISTS {index} ON {t} (processed_at)"
            ),
            insert: format!(
                "INSERT INTO {t} (consumer, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING"
            ),
            purge: format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY(\
                   SELECT ctid FROM {t} WHERE processed_at < clock_timestamp() - $1::interval \
                   ORDER BY processed_at LIMIT $2))"
            ),
        })
    }

    /// Create the table and its purge index if they do not exist (idempotent).
    pub async fn migrate(&self, pool: &PgPool) -> Result<()> {
        sqlx::raw_sql(&self.create)
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| classify(e, &self.target))
    }

    /// Record that `consumer` processed `event_id`, inside the caller's transaction. `true`:
    /// first time — process it; `false`: already processed — skip it (and acknowledge it).
    pub async fn try_mark_processed(
        &self,
        conn: &mut PgConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool> {
        let done = sqlx::query(&self.insert)
            .bind(consumer)
            .bind(event_id)
            .execute(conn)
            .await
            .map_err(|e| classify(e, &self.target))?;
        Ok(done.rows_affected() == 1)
    }

    /// Forget marks older than `older_than` (longer than any redelivery can take), at most
    /// `limit` per call; returns how many were deleted.
    pub async fn purge_processed(
        &self,
        pool: &PgPool,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64> {
        let interval = format!("{} milliseconds", older_than.as_millis());
        let done = sqlx::query(&self.purge)
            .bind(interval)
            .bind(i64::from(limit))
            .execute(pool)
            .await
            .map_err(|e| classify(e, &self.target))?;
        Ok(done.rows_affected())
    }
}
