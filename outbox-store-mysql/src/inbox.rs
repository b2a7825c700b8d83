//! The consumer's half of at-least-once: an inbox of processed event ids (MySQL / MariaDB; see
//! [`outboxkit_store_sql::inbox`]).
//!
//! ```no_run
//! # async fn handle(pool: sqlx::MySqlPool, event_id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
//! use outboxkit_store_mysql::Inbox;
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

use outboxkit_store_sql::inbox::{InboxSql, InboxStatements};

use crate::classify::MySql;
use crate::config::TableName;

/// Longest consumer name (the column is `VARCHAR(255)`).
pub const MAX_CONSUMER_CHARS: usize = 255;

/// A `processed_events` table: `(consumer, event_id)` primary key, with the time it was
/// processed.
pub type Inbox = outboxkit_store_sql::inbox::Inbox<MySql>;

/// The inbox in MySQL / MariaDB: event ids as text, ages in microseconds, consumer names of at
/// most [`MAX_CONSUMER_CHARS`].
impl InboxSql for MySql {
    type Database = sqlx::MySql;
    type EventId = String;
    type Age = i64;
    const MAX_CONSUMER_CHARS: Option<usize> = Some(MAX_CONSUMER_CHARS);

    fn statements(name: &TableName) -> InboxStatements {
        let t = name.quoted();
        InboxStatements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                   consumer VARCHAR(255) NOT NULL, \
                   event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL, \
                   processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
                   PRIMARY KEY (consumer, event_id), \
                   KEY processed_at_idx (processed_at)\
                 ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
            )
            .into(),
            // A duplicate key is the only error IGNORE can hide here: the consumer name's
            // length is checked before, and the event id is always 36 characters.
            insert: format!("INSERT IGNORE INTO {t} (consumer, event_id) VALUES (?, ?)").into(),
            purge: format!(
                "DELETE FROM {t} WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY processed_at LIMIT ?"
            )
            .into(),
        }
    }

    fn event_id(event_id: Uuid) -> String {
        event_id.hyphenated().to_string()
    }

    fn age(older_than: Duration) -> i64 {
        i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX)
    }

    fn rows_affected(done: &sqlx::mysql::MySqlQueryResult) -> u64 {
        done.rows_affected()
    }
}
