//! An idempotent consumer of the events outbox relay writes to Redis Streams.
//!
//! At least once means a message may arrive twice (a relay crash between the broker's
//! acknowledgement and the mark, a consumer crash between its commit and `XACK`). This consumer
//! reads a stream with a consumer group and applies each event inside a PostgreSQL transaction
//! that also records `(consumer, event_id)` in the inbox: the second delivery finds the mark and
//! is skipped; a failed transaction leaves no mark and the message stays pending, and the next
//! pass takes this consumer's pending messages before new ones. A message that is not an event
//! goes to a dead-letter stream instead of stopping the consumer.
//!
//! The business effect here is a running total per order (`order_totals`), so the test can
//! see whether an event was applied twice.

use outboxkit_store_postgres::Inbox;
use redis::streams::{StreamId, StreamReadOptions, StreamReadReply};
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
    /// Messages that were not events (no valid `event_id`), moved to the dead-letter stream.
    pub malformed: usize,
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
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {} (order_id text PRIMARY KEY, total bigint NOT NULL)",
            self.totals_table
        )))
        .execute(pool)
        .await
        .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The stream a message goes to when it cannot be an event (no valid `event_id`): the
    /// consumer copies it there with the reason, then acknowledges it, so that it neither blocks
    /// the consumer nor disappears.
    pub fn dead_letter_stream(&self) -> String {
        format!("{}.dead", self.stream)
    }

    /// One pass, up to `count` messages: first this consumer's own pending messages (read by it
    /// before and not acknowledged: its transaction failed, or it stopped before `XACK`), and
    /// only when there are none, new ones. Each is applied and marked in one transaction, then
    /// acknowledged. An error (the database unreachable...) ends the pass: the messages not
    /// acknowledged yet stay pending and the next pass takes them again. `XREADGROUP ... >`
    /// alone would never return them again: they would be lost to this consumer.
    pub async fn pass(
        &self,
        redis: &mut redis::aio::MultiplexedConnection,
        pool: &sqlx::PgPool,
        count: usize,
    ) -> Result<Pass, String> {
        let mut entries = self.read(redis, "0", count).await?;
        if entries.is_empty() {
            entries = self.read(redis, ">", count).await?;
        }
        let mut pass = Pass::default();
        for entry in entries {
            pass.read += 1;
            match Uuid::parse_str(&entry.get::<String>("event_id").unwrap_or_default()) {
                Ok(event_id) => {
                    if self.apply(pool, &entry, event_id).await? {
                        pass.applied += 1;
                    } else {
                        pass.duplicates += 1;
                    }
                    // Acknowledge only after the effect (and its mark) are committed.
                    let _: i64 = redis
                        .xack(&self.stream, &self.group, &[&entry.id])
                        .await
                        .map_err(|e| format!("acknowledging {}: {e}", entry.id))?;
                }
                Err(e) => {
                    self.dead_letter(redis, &entry, &format!("no valid event_id: {e}"))
                        .await?;
                    pass.malformed += 1;
                }
            }
        }
        Ok(pass)
    }

    /// Up to `count` messages of the group for this consumer, from `id` (`0`: its pending
    /// ones; `>`: new ones). A pending message trimmed from the stream since comes with no
    /// fields.
    async fn read(
        &self,
        redis: &mut redis::aio::MultiplexedConnection,
        id: &str,
        count: usize,
    ) -> Result<Vec<StreamId>, String> {
        let options = StreamReadOptions::default()
            .group(&self.group, &self.name)
            .count(count);
        let reply: StreamReadReply = redis
            .xread_options(&[&self.stream], &[id], &options)
            .await
            .map_err(|e| format!("reading {} from {id}: {e}", self.stream))?;
        Ok(reply.keys.into_iter().flat_map(|key| key.ids).collect())
    }

    /// Apply `entry` and record `event_id` in one transaction; `false` when it was processed
    /// already (nothing applied).
    async fn apply(
        &self,
        pool: &sqlx::PgPool,
        entry: &StreamId,
        event_id: Uuid,
    ) -> Result<bool, String> {
        let aggregate_id: String = entry.get("aggregate_id").unwrap_or_default();
        let payload: String = entry.get("payload").unwrap_or_default();
        let amount = serde_json::from_str::<serde_json::Value>(&payload)
            .ok()
            .and_then(|v| v["amount"].as_i64())
            .unwrap_or(0);
        let failed = |e: sqlx::Error| format!("applying {} ({event_id}): {e}", entry.id);
        let mut tx = pool.begin().await.map_err(failed)?;
        let first = self
            .inbox
            .try_mark_processed(&mut tx, &self.name, event_id)
            .await
            .map_err(|e| format!("applying {} ({event_id}): {e}", entry.id))?;
        if first {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {} (order_id, total) VALUES ($1, $2) \
                 ON CONFLICT (order_id) DO UPDATE SET total = {}.total + EXCLUDED.total",
                self.totals_table, self.totals_table
            )))
            .bind(&aggregate_id)
            .bind(amount)
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)?;
        Ok(first)
    }

    /// Copy `entry` (its fields, its id as `source_id`, `reason`) to the dead-letter stream and
    /// acknowledge it, in one `MULTI`.
    async fn dead_letter(
        &self,
        redis: &mut redis::aio::MultiplexedConnection,
        entry: &StreamId,
        reason: &str,
    ) -> Result<(), String> {
        let mut add = redis::cmd("XADD");
        add.arg(self.dead_letter_stream())
            .arg("*")
            .arg("source_id")
            .arg(&entry.id)
            .arg("reason")
            .arg(reason);
        for field in entry.map.keys() {
            add.arg(field)
                .arg(entry.get::<Vec<u8>>(field).unwrap_or_default());
        }
        let mut transaction = redis::pipe();
        transaction
            .atomic()
            .add_command(add)
            .ignore()
            .xack(&self.stream, &self.group, &[&entry.id])
            .ignore();
        transaction
            .query_async::<()>(redis)
            .await
            .map_err(|e| format!("moving {} to {}: {e}", entry.id, self.dead_letter_stream()))
    }
}
