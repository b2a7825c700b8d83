//! PostgreSQL with log-based capture (`store.capture = "logical"`), on a test's own cluster
//! ([`PrivatePostgres::start_logical`]): the relay reads the outbox table's inserts (table
//! style) or the emit function's messages (message style) from a replication slot.
//!
//! Writers here follow no writer contract: a transaction enqueues its event and commits, with
//! no business row locked, so ids do not follow commit order. What does is recorded by an
//! oracle of the test's own: a second slot with `test_decoding`, made before any write, whose
//! `COMMIT` lines give each event's commit position ([`LogicalSide::commit_order`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::{NewEvent, PayloadType, Store};
use uuid::Uuid;

use super::{DeadRow, StoreSide};
use crate::scenario::WriteError;
use crate::{PostgresSide, PrivatePostgres};

/// See the module's documentation.
#[derive(Debug)]
pub struct LogicalSide {
    inner: PostgresSide,
    style: &'static str,
    url: String,
    /// The oracle's slot (`None`: made without, for a benchmark).
    oracle: Option<String>,
    /// Whether writers lock their aggregate's business row as polling's writer contract asks
    /// (a benchmark comparing the modes with the same writers).
    lock: bool,
    /// The relay's slot (the default name of the table's).
    slot: String,
}

impl LogicalSide {
    /// Outbox table `table` on `server`, read in `style` (`table` or `message`); the oracle
    /// slot is made now, before anything is written.
    pub async fn open(server: &PrivatePostgres, table: &str, style: &'static str) -> Self {
        let side = Self::open_with_pool(server, table, style, 10).await;
        let oracle = format!("oracle_{table}");
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
            .bind(&oracle)
            .execute(side.pool())
            .await
            .expect("creating the oracle slot");
        Self {
            oracle: Some(oracle),
            ..side
        }
    }

    /// Without the oracle (no commit order: [`Self::commit_order`] is empty), with a pool of
    /// `connections`: for a benchmark.
    pub async fn open_with_pool(
        server: &PrivatePostgres,
        table: &str,
        style: &'static str,
        connections: u32,
    ) -> Self {
        let url = server.url("postgres", "");
        let inner = PostgresSide::open_with_pool(&url, table, connections).await;
        Self {
            inner,
            style,
            url,
            oracle: None,
            lock: false,
            slot: format!("outbox_relay_public_{table}"),
        }
    }

    /// Writers lock their aggregate's business row first, as with polling.
    pub fn locking(mut self) -> Self {
        self.lock = true;
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The relay's replication slot.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    /// Run `sql` on the server; fails the test with the server's error.
    pub async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The first column of the first row of `sql`, which must be text.
    pub async fn query_text(&self, sql: &str) -> String {
        self.inner.query_text(sql).await
    }

    /// The pool of the test's own connections.
    pub fn pool(&self) -> &sqlx::PgPool {
        self.inner.pool()
    }

    /// Each committed event's commit position, as the oracle slot read the log: the order
    /// every aggregate's first deliveries must follow. Read without consuming.
    pub async fn commit_order(&self) -> HashMap<Uuid, i64> {
        let Some(oracle) = &self.oracle else {
            return HashMap::new();
        };
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_changes($1, NULL, NULL)",
        )
        .bind(oracle)
        .fetch_all(self.pool())
        .await
        .expect("reading the oracle slot");
        let mut order = HashMap::new();
        let mut open: Vec<Uuid> = Vec::new();
        for (lsn, data) in rows {
            if data.starts_with("BEGIN") {
                open.clear();
            } else if data.starts_with("COMMIT") {
                let position = parse_lsn(&lsn);
                for event_id in open.drain(..) {
                    order.insert(event_id, position);
                }
            } else if let Some(event_id) = event_id_in(&data) {
                open.push(event_id);
            }
        }
        order
    }

    /// The relay reading the slot now (its relay id), if any.
    pub async fn reader(&self) -> Option<String> {
        sqlx::query_scalar(
            "SELECT a.application_name FROM pg_replication_slots s \
             JOIN pg_stat_activity a ON a.pid = s.active_pid WHERE s.slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(self.pool())
        .await
        .ok()
        .flatten()
        .map(|name: String| name.trim_start_matches("outbox-relay:").to_owned())
    }

    /// Whether the relay confirmed the slot past every committed event (as the oracle saw
    /// them; without it, up to the server's log position now).
    async fn confirmed_all(&self) -> bool {
        let last = match &self.oracle {
            Some(_) => self
                .commit_order()
                .await
                .values()
                .copied()
                .max()
                .unwrap_or(0),
            None => {
                let now: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
                    .fetch_one(self.pool())
                    .await
                    .expect("reading the log position");
                parse_lsn(&now)
            }
        };
        self.confirmed().await.is_some_and(|c| c >= last)
    }

    /// Where the relay's slot is confirmed to, if it exists (in the units of
    /// [`Self::commit_order`]).
    pub async fn confirmed(&self) -> Option<i64> {
        let confirmed: Option<String> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(self.pool())
        .await
        .ok()
        .flatten();
        confirmed.map(|c| parse_lsn(&c))
    }
}

/// `16/B374D848` as a number.
fn parse_lsn(text: &str) -> i64 {
    let (hi, lo) = text.split_once('/').expect("an LSN");
    ((u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()) as i64
}

/// The event id in a `test_decoding` line: an insert's `event_id[uuid]:'…'`, or a message's
/// envelope `"event_id": "…"`.
fn event_id_in(data: &str) -> Option<Uuid> {
    for marker in ["event_id[uuid]:'", "\"event_id\" : \"", "\"event_id\":\""] {
        if let Some(at) = data.find(marker) {
            let start = at + marker.len();
            return data
                .get(start..start + 36)
                .and_then(|id| Uuid::parse_str(id).ok());
        }
    }
    None
}

#[async_trait]
impl StoreSide for LogicalSide {
    fn name(&self) -> &str {
        if self.style == "message" {
            "PostgreSQL (logical, message style)"
        } else {
            "PostgreSQL (logical, table style)"
        }
    }

    fn table(&self) -> &str {
        self.inner.table()
    }

    fn store_toml(&self) -> String {
        format!(
            "{}capture = \"logical\"\nlogical = {{ style = \"{}\", takeover_after = \"3s\" }}\n",
            self.inner.store_toml(),
            self.style
        )
    }

    async fn server_version(&self) -> String {
        self.inner.server_version().await
    }

    /// A polling store of the table, not one reading the log (the benchmark's database
    /// ceiling measures polling's statements): a test that drives a reader of the log builds
    /// its store with `Capture::Logical` and the style (`tests/tests/held_back.rs`).
    async fn connect_store(&self, shards: u32, connections: u32) -> Arc<dyn Store> {
        self.inner.connect_store(shards, connections).await
    }

    async fn truncate(&self) {
        self.inner.truncate().await
    }

    async fn analyze(&self) {
        self.inner.analyze().await
    }

    /// As [`PostgresSide`]'s (JSON payloads only), but in transactions of 100 events, as the
    /// benchmark's drains were measured. Message style emits the events instead of inserting
    /// them.
    async fn bulk_load(&self, events: u64, aggregates: u64, pad: usize, payload_type: PayloadType) {
        assert_eq!(
            payload_type,
            PayloadType::Json,
            "the logical sides load JSON payloads"
        );
        self.inner.truncate().await;
        let table = self.inner.table();
        let values = format!(
            "'order', ((g - 1) % {aggregates})::text, 'OrderChanged', \
             jsonb_build_object('n', g, 'order_id', (g - 1) % {aggregates}, 'pad', repeat('x', {pad}))"
        );
        let rows = format!("FROM generate_series(b * 100 + 1, least((b + 1) * 100, {events})) g");
        let write = if self.style == "message" {
            format!("PERFORM {table}_emit({values}) {rows};")
        } else {
            format!(
                "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT {values} {rows};"
            )
        };
        self.exec(&format!(
            "DO $$ BEGIN FOR b IN 0..{} LOOP {write} COMMIT; END LOOP; END $$",
            events.div_ceil(100).saturating_sub(1)
        ))
        .await;
        self.exec(&format!("VACUUM ANALYZE {table}")).await;
    }

    async fn create_orders(&self, aggregates: u64) {
        self.inner.create_orders(aggregates).await
    }

    /// No business row is locked (unless [`Self::locking`]): the transaction only writes its
    /// event.
    async fn transact(&self, event: &NewEvent, commit: bool) -> Result<i64, WriteError> {
        self.inner.transact_locking(event, commit, self.lock).await
    }

    async fn enqueue_many(&self, events: &[NewEvent]) -> Vec<i64> {
        self.inner.enqueue_many(events).await
    }

    async fn count_rows(&self, condition: &str) -> i64 {
        self.inner.count_rows(condition).await
    }

    /// Table style: rows not published and not dead. Message style (no rows): 1 until the relay
    /// confirmed the slot past every committed event.
    async fn pending(&self) -> i64 {
        if self.style == "message" {
            i64::from(!self.confirmed_all().await)
        } else {
            self.inner.pending().await
        }
    }

    async fn any_pending(&self) -> bool {
        self.pending().await > 0
    }

    async fn publish_latencies(&self) -> Vec<Duration> {
        self.inner.publish_latencies().await
    }

    /// Only when the writers lock (so update) their aggregate's business row.
    async fn business_version(&self, aggregate: &str) -> Option<i64> {
        if self.lock {
            self.inner.business_version(aggregate).await
        } else {
            None
        }
    }

    /// A committed event's position in the log, as the oracle saw it commit (the row may be
    /// gone: the relay deletes published rows).
    async fn row_of(&self, event_id: Uuid) -> Option<i64> {
        self.commit_order().await.get(&event_id).copied()
    }

    async fn exec_sql(&self, sql: &str) {
        self.inner.exec_sql(sql).await
    }

    async fn lock_table(&self) -> crate::store::TableLock {
        self.inner.lock_table().await
    }

    async fn lock_waiters(&self, client: &str) -> i64 {
        self.inner.lock_waiters(client).await
    }

    async fn dead_rows(&self) -> Vec<DeadRow> {
        self.inner.dead_rows().await
    }

    async fn drop_tables(&self) {
        self.inner.drop_tables().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oracle_reads_event_ids_and_positions() {
        let id = Uuid::now_v7();
        assert_eq!(
            event_id_in(&format!(
                "table public.t: INSERT: id[bigint]:1 event_id[uuid]:'{id}' aggregate_type[text]:'o'"
            )),
            Some(id)
        );
        assert_eq!(
            event_id_in(&format!(
                "message: transactional: 1 prefix: outbox:public.t, sz: 9 content:{{\"v\" : 1, \"event_id\" : \"{id}\", \"x\" : 1}}"
            )),
            Some(id)
        );
        assert_eq!(event_id_in("BEGIN 5"), None);
        assert_eq!(parse_lsn("1/10"), (1 << 32) + 16);
    }
}
