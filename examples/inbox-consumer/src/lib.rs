//! An idempotent consumer of the events outbox relay writes to Redis Streams.
//!
//! At least once means a message may arrive twice (a relay crash between the broker's
//! acknowledgement and the mark, a consumer crash between its commit and `XACK`). This consumer
//! reads a stream with a consumer group and applies each event inside a PostgreSQL transaction
//! that also records `(consumer, event_id)` in the inbox: the second delivery finds the mark and
//! is skipped; a failed transaction leaves no mark and the message is delivered again.
//!
//! The business effect here is a running total per order (`order_totals`), so the test can
//! see whether an event was applied twice.

use outboxkit_store_postgres::Inbox;
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use uuid::Uuid;

/// What one pass over the stream did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Messages read.
    pub read: usize,
    /// Events applied (first delivery).
    pub applied: usize,
    /// Messages skipped as already processed.
    pub duplicates: usize,
}

/// A consumer of one stream, in one consumer group, applying events to PostgreSQL.
#[derive(Debug, Clone)]
pub struct OrderTotalsConsumer {
    pub name: String,
    pub stream: String,
    pub group: String,
    pub inbox: Inbox,
    pub totals_table: String,
}

impl OrderTotalsConsumer {
    /// Create the consumer group (from the start of the stream), the inbox and the totals table.
    pub async fn prepare(
        &self,
        redis: &mut redis::aio::MultiplexedConnection,
        pool: &sqlx::PgPool,
    ) -> Result<(), String> {
        let created: redis::RedisResult<()> = redis
            .xgroup_create_mkstream(&self.stream, &self.group, "0")
            .await;
        if let Err(e) = created {
            if e.code() != Some("BUSYGROUP") {
                return Err(format!(
                    "creating group {} on {}: {e}",
                    self.group, self.stream
                ));
            }
        }
        self.inbox.migrate(pool).await.map_err(|e| e.to_string())?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {} (order_id text PRIMARY KEY, total bigint NOT NULL)",
            self.totals_table
        ))
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Read what is there (up to `count` messages) and process each: apply-and-mark in one
    /// transaction, then `XACK`.
    pub async fn pass(
        &self,
        redis: &mut redis::aio::MultiplexedConnection,
        pool: &sqlx::PgPool,
        count: usize,
    ) -> Result<Pass, String> {
        let options = StreamReadOptions::default()
            .group(&self.group, &self.name)
            .count(count);
        let reply: StreamReadReply = redis
            .xread_options(&[&self.stream], &[">"], &options)
            .await
            .map_err(|e| format!("reading {}: {e}", self.stream))?;
        let mut pass = Pass::default();
        for key in reply.keys {
            for entry in key.ids {
                pass.read += 1;
                let event_id: String = entry.get("event_id").unwrap_or_default();
                let event_id = Uuid::parse_str(&event_id)
                    .map_err(|e| format!("message {} has no valid event_id: {e}", entry.id))?;
                let aggregate_id: String = entry.get("aggregate_id").unwrap_or_default();
                let payload: String = entry.get("payload").unwrap_or_default();
                let amount = serde_json::from_str::<serde_json::Value>(&payload)
                    .ok()
                    .and_then(|v| v["amount"].as_i64())
                    .unwrap_or(0);

                let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
                if self
                    .inbox
                    .try_mark_processed(&mut tx, &self.name, event_id)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    sqlx::query(&format!(
                        "INSERT INTO {} (order_id, total) VALUES ($1, $2) \
                         ON CONFLICT (order_id) DO UPDATE SET total = {}.total + EXCLUDED.total",
                        self.totals_table, self.totals_table
                    ))
                    .bind(&aggregate_id)
                    .bind(amount)
                    .execute(&mut *tx)
                    .await
                    .map_err(|e| e.to_string())?;
                    pass.applied += 1;
                } else {
                    pass.duplicates += 1;
                }
                tx.commit().await.map_err(|e| e.to_string())?;
                // Acknowledge only after the effect (and its mark) are committed.
                let _: i64 = redis
                    .xack(&self.stream, &self.group, &[&entry.id])
                    .await
                    .map_err(|e| format!("acknowledging {}: {e}", entry.id))?;
            }
        }
        Ok(pass)
    }
}
