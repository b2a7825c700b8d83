//! PostgreSQL.

use async_trait::async_trait;
use outboxkit_core::{NewEvent, PayloadType, Result};
use outboxkit_store_postgres::Outbox;
use outboxkit_store_postgres::Postgres;
use outboxkit_store_sql::payload::PayloadColumn;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{SqlOutbox, SqlSide, StoreSide, PENDING};

/// PostgreSQL for tests: `OUTBOX_TEST_POSTGRES_URL`, default the machine's local server.
pub use outboxkit_core::testkit::relay_process::postgres_url;

/// The PostgreSQL side: [`PostgresSide::open`] and the rest of [`SqlSide`].
pub type PostgresSide = SqlSide<Outbox>;

#[async_trait]
impl SqlOutbox for Outbox {
    type Store = outboxkit_store_postgres::Postgres;
    type Db = sqlx::Postgres;
    type EventId = Uuid;
    const SERVER: &'static str = "PostgreSQL";
    const NAME: &'static str = "PostgreSQL";
    const VERSION_SQL: &'static str = "SELECT 'PostgreSQL ' || current_setting('server_version')";
    const TRUNCATE: &'static str = "TRUNCATE";
    const LATENCY_MICROS: &'static str =
        "(EXTRACT(EPOCH FROM published_at - created_at) * 1000000)::int8";
    const DEAD_COLUMNS: &'static str = "event_id, attempts::bigint, last_error";
    const PARAM: &'static str = "$1";

    fn test_url() -> String {
        postgres_url()
    }

    fn on_table(table: &str) -> Self {
        Outbox::new(table).expect("a valid outbox table name")
    }

    fn event_id(event_id: Uuid) -> Uuid {
        event_id
    }

    fn uuid(event_id: Uuid) -> Uuid {
        event_id
    }

    async fn enqueue(&self, conn: &mut PgConnection, event: &NewEvent) -> Result<i64> {
        Outbox::enqueue(self, conn, event).await
    }

    async fn enqueue_many(&self, conn: &mut PgConnection, events: &[NewEvent]) -> Result<Vec<i64>> {
        Outbox::enqueue_many(self, conn, events).await
    }

    async fn analyze(side: &PostgresSide) {
        side.exec(&format!("VACUUM ANALYZE {}", side.table)).await;
        side.exec(&format!("VACUUM ANALYZE {}", side.orders)).await;
    }

    async fn bulk_load(
        side: &PostgresSide,
        events: u64,
        aggregates: u64,
        pad: usize,
        payload_type: PayloadType,
    ) {
        side.truncate().await;
        let column = Postgres::column_type(payload_type);
        side.exec(&format!(
            "ALTER TABLE {} ALTER COLUMN payload TYPE {column} USING NULL::{column}",
            side.table
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
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', ((g - 1) % $2)::text, 'OrderChanged', {payload} \
             FROM generate_series(1, $1) g",
            side.table
        )))
        .bind(events as i64)
        .bind(aggregates as i64)
        .execute(&side.pool)
        .await
        .unwrap_or_else(|e| panic!("loading {events} events: {e}"));
        side.exec(&format!("VACUUM ANALYZE {}", side.table)).await;
    }

    async fn any_pending(side: &PostgresSide) -> bool {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT EXISTS (SELECT 1 FROM {} WHERE {PENDING})",
            side.table
        )))
        .fetch_one(&side.pool)
        .await
        .expect("looking for a pending row")
    }

    fn lock_table_sql(table: &str) -> (String, &'static str) {
        let lock = format!("BEGIN; LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE");
        (lock, "ROLLBACK")
    }

    fn lock_waiters_sql(client: &str) -> String {
        format!(
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '{client}' \
             AND wait_event_type = 'Lock'"
        )
    }

    fn create_orders_sql(orders: &str, aggregates: u64) -> String {
        format!(
            "DROP TABLE IF EXISTS {orders}; \
             CREATE TABLE {orders} (id text PRIMARY KEY, version bigint NOT NULL); \
             INSERT INTO {orders} SELECT g::text, 0 FROM generate_series(0, {}) g",
            aggregates as i64 - 1
        )
    }

    /// The schema row, or `migrate` of a table of the same name would take it for migrated.
    async fn drop_bookkeeping(side: &PostgresSide) {
        let bookkeeping: bool =
            sqlx::query_scalar("SELECT to_regclass('outbox_relay_schema') IS NOT NULL")
                .fetch_one(&side.pool)
                .await
                .expect("looking for the bookkeeping table");
        if bookkeeping {
            sqlx::query("DELETE FROM outbox_relay_schema WHERE table_name = $1")
                .bind(&side.table)
                .execute(&side.pool)
                .await
                .expect("deleting the bookkeeping row");
        }
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

    /// Drop `schema` and everything in it.
    pub async fn drop_schema(&self, schema: &str) {
        self.exec(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await;
    }

    /// The first column of the first row of `sql`, which must be text.
    pub async fn query_text(&self, sql: &str) -> String {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }
}
