//! PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::{NewEvent, PayloadType, Store};
use outboxkit_store_postgres::Outbox;
use outboxkit_store_postgres::Postgres;
use outboxkit_store_sql::payload::PayloadColumn;
use uuid::Uuid;

use super::{DeadRow, SqlOutbox, SqlSide, StoreSide, PENDING};
use crate::scenario::WriteError;

/// PostgreSQL for tests: `OUTBOX_TEST_POSTGRES_URL`, default the machine's local server.
pub fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// The PostgreSQL side: [`PostgresSide::open`] and the rest of [`SqlSide`].
pub type PostgresSide = SqlSide<Outbox>;

impl SqlOutbox for Outbox {
    type Store = outboxkit_store_postgres::Postgres;
    type Db = sqlx::Postgres;
    const SERVER: &'static str = "PostgreSQL";

    fn test_url() -> String {
        postgres_url()
    }

    fn on_table(table: &str) -> Self {
        Outbox::new(table).expect("a valid outbox table name")
    }
}

impl PostgresSide {
    /// The test server with outbox table `<schema>.outbox` in `schema`, which it creates: the
    /// tenant-per-schema layout. [`Self::drop_schema`] removes it.
    pub async fn open_in_schema(schema: &str) -> Self {
        let side = Self::open(&format!("{schema}.outbox")).await;
        side.exec(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .await;
        side
    }

    /// [`StoreSide::transact`], the aggregate's business row locked first when `lock` (the
    /// writer contract of polling) or not at all (log-based capture needs no contract).
    pub async fn transact_locking(
        &self,
        event: &NewEvent,
        commit: bool,
        lock: bool,
    ) -> Result<i64, WriteError> {
        let mut tx = self.pool.begin().await.map_err(WriteError::before)?;
        if lock {
            sqlx::query(&format!(
                "UPDATE {} SET version = version + 1 WHERE id = $1",
                self.orders
            ))
            .bind(&event.aggregate_id)
            .execute(&mut *tx)
            .await
            .map_err(WriteError::before)?;
        }
        let id = self
            .outbox
            .enqueue(&mut tx, event)
            .await
            .map_err(WriteError::before)?;
        if commit {
            tx.commit().await.map_err(WriteError::after)?;
        } else {
            tx.rollback().await.map_err(WriteError::after)?;
        }
        Ok(id)
    }

    /// Drop `schema` and everything in it.
    pub async fn drop_schema(&self, schema: &str) {
        self.exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await;
    }
}

#[async_trait]
impl StoreSide for PostgresSide {
    fn name(&self) -> &str {
        "PostgreSQL"
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn store_toml(&self) -> String {
        self.relay_toml()
    }

    async fn server_version(&self) -> String {
        sqlx::query_scalar("SELECT 'PostgreSQL ' || current_setting('server_version')")
            .fetch_one(&self.pool)
            .await
            .expect("reading the server version")
    }

    async fn connect_store(&self, shards: u32, connections: u32) -> Arc<dyn Store> {
        self.connect_migrated(shards, connections).await
    }

    async fn truncate(&self) {
        self.exec(&format!("TRUNCATE {}", self.table)).await;
    }

    async fn analyze(&self) {
        self.exec(&format!("VACUUM ANALYZE {}", self.table)).await;
        self.exec(&format!("VACUUM ANALYZE {}", self.orders)).await;
    }

    async fn bulk_load(&self, events: u64, aggregates: u64, pad: usize, payload_type: PayloadType) {
        self.truncate().await;
        let column = Postgres::column_type(payload_type);
        self.exec(&format!(
            "ALTER TABLE {} ALTER COLUMN payload TYPE {column} USING NULL::{column}",
            self.table
        ))
        .await;
        let json = format!(
            "jsonb_build_object('n', g, 'order_id', (g - 1) % $2, 'pad', repeat('x', {pad}))"
        );
        let payload = match payload_type {
            PayloadType::Json => json,
            PayloadType::Text => format!("{json}::text"),
            PayloadType::Binary => format!("convert_to({json}::text, 'UTF8')"),
        };
        sqlx::query(&format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', ((g - 1) % $2)::text, 'OrderChanged', {payload} \
             FROM generate_series(1, $1) g",
            self.table
        ))
        .bind(events as i64)
        .bind(aggregates as i64)
        .execute(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("loading {events} events: {e}"));
        self.exec(&format!("VACUUM ANALYZE {}", self.table)).await;
    }

    async fn any_pending(&self) -> bool {
        sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE {PENDING})",
            self.table
        ))
        .fetch_one(&self.pool)
        .await
        .expect("looking for a pending row")
    }

    async fn create_orders(&self, aggregates: u64) {
        let orders = &self.orders;
        sqlx::raw_sql(&format!(
            "DROP TABLE IF EXISTS {orders}; \
             CREATE TABLE {orders} (id text PRIMARY KEY, version bigint NOT NULL); \
             INSERT INTO {orders} SELECT g::text, 0 FROM generate_series(0, {}) g",
            aggregates as i64 - 1
        ))
        .execute(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("creating {orders}: {e}"));
    }

    async fn transact(&self, event: &NewEvent, commit: bool) -> Result<i64, WriteError> {
        self.transact_locking(event, commit, true).await
    }

    async fn enqueue_many(&self, events: &[NewEvent]) -> Vec<i64> {
        let mut tx = self.pool.begin().await.expect("a transaction");
        let ids = self
            .outbox
            .enqueue_many(&mut tx, events)
            .await
            .expect("enqueueing events");
        tx.commit().await.expect("committing");
        ids
    }

    async fn count_rows(&self, condition: &str) -> i64 {
        self.count_where(condition).await
    }

    async fn publish_latencies(&self) -> Vec<Duration> {
        let micros: Vec<i64> = sqlx::query_scalar(&format!(
            "SELECT (EXTRACT(EPOCH FROM published_at - created_at) * 1000000)::int8 FROM {} \
             WHERE published_at IS NOT NULL",
            self.table
        ))
        .fetch_all(&self.pool)
        .await
        .expect("reading publish times");
        micros
            .into_iter()
            .map(|us| Duration::from_micros(us.max(0) as u64))
            .collect()
    }

    async fn row_of(&self, event_id: Uuid) -> Option<i64> {
        sqlx::query_scalar(&format!(
            "SELECT id FROM {} WHERE event_id = $1",
            self.table
        ))
        .bind(event_id)
        .fetch_optional(&self.pool)
        .await
        .expect("looking up a row")
    }

    async fn dead_rows(&self) -> Vec<DeadRow> {
        let rows: Vec<(i64, Uuid, i64, Option<String>)> = sqlx::query_as(&format!(
            "SELECT id, event_id, attempts::bigint, last_error FROM {} \
             WHERE dead_at IS NOT NULL ORDER BY id",
            self.table
        ))
        .fetch_all(&self.pool)
        .await
        .expect("reading dead rows");
        rows.into_iter()
            .map(|(id, event_id, attempts, last_error)| DeadRow {
                id,
                event_id,
                attempts,
                last_error: last_error.unwrap_or_default(),
            })
            .collect()
    }

    async fn drop_tables(&self) {
        self.drop_both_tables().await;
        // The schema row, or `migrate` of a table of the same name would take it for migrated.
        let bookkeeping: bool =
            sqlx::query_scalar("SELECT to_regclass('outbox_relay_schema') IS NOT NULL")
                .fetch_one(&self.pool)
                .await
                .expect("looking for the bookkeeping table");
        if bookkeeping {
            sqlx::query("DELETE FROM outbox_relay_schema WHERE table_name = $1")
                .bind(&self.table)
                .execute(&self.pool)
                .await
                .expect("deleting the bookkeeping row");
        }
    }
}
