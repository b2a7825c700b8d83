//! The consumer's half of at-least-once: an inbox of processed event ids (MySQL / MariaDB).
//!
//! Call [`Inbox::try_mark_processed`] inside the consumer's own business transaction, before
//! its side effects: `true` the first time `(consumer, event_id)` is seen, `false` afterwards.
//! A rolled-back transaction leaves no mark; two consumers racing on one event serialize on the
//! primary key and exactly one gets `true`.
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

use sqlx::{MySqlConnection, MySqlPool};
use uuid::Uuid;

use outboxkit_core::{Error, Result};

use crate::classify::{classify, Target};
use crate::config::TableName;

/// Longest consumer name (the column is `VARCHAR(255)`).
pub const MAX_CONSUMER_CHARS: usize = 255;

/// A `processed_events` table: `(consumer, event_id)` primary key, with the time it was
/// processed.
#[derive(Debug, Clone)]
pub struct Inbox {
    target: Target,
    create: String,
    insert: String,
    purge: String,
}

impl Inbox {
    /// The inbox table `table` or `database.table` (e.g. `processed_events`).
    pub fn new(table: &str) -> Result<Self> {
        let name = TableName::parse(table)?;
        let t = name.quoted();
        Ok(Self {
            target: Target::table(name.to_string()),
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                   consumer VARCHAR(255) NOT NULL, \
                   event_id CHAR(36) CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL, \
                   processed_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
                   PRIMARY KEY (consumer, event_id), \
                   KEY processed_at_idx (processed_at)\
                 ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin"
            ),
            // A duplicate key is the only error IGNORE can hide here: the consumer name's
            // length is checked before, and the event id is always 36 characters.
            insert: format!("INSERT IGNORE INTO {t} (consumer, event_id) VALUES (?, ?)"),
            purge: format!(
                "DELETE FROM {t} WHERE processed_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                 ORDER BY processed_at LIMIT ?"
            ),
        })
    }

    /// Create the table if it does not exist (idempotent).
    pub async fn migrate(&self, pool: &MySqlPool) -> Result<()> {
        sqlx::query(&self.create)
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| classify(e, &self.target))
    }

    /// Record that `consumer` processed `event_id`, inside the caller's transaction. `true`:
    /// first time — process it; `false`: already processed — skip it (and acknowledge it).
    pub async fn try_mark_processed(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool> {
        if consumer.is_empty() || consumer.chars().count() > MAX_CONSUMER_CHARS {
            return Err(Error::config(format!(
                "inbox consumer name must be 1 to {MAX_CONSUMER_CHARS} characters, got {}",
                consumer.chars().count()
            )));
        }
        let done = sqlx::query(&self.insert)
            .bind(consumer)
            .bind(event_id.hyphenated().to_string())
            .execute(conn)
            .await
            .map_err(|e| classify(e, &self.target))?;
        Ok(done.rows_affected() == 1)
    }

    /// Forget marks older than `older_than`, at most `limit` per call; returns how many.
    pub async fn purge_processed(
        &self,
        pool: &MySqlPool,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64> {
        let micros = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        let done = sqlx::query(&self.purge)
            .bind(micros)
            .bind(i64::from(limit))
            .execute(pool)
            .await
            .map_err(|e| classify(e, &self.target))?;
        Ok(done.rows_affected())
    }
}
