//! Store sides: a database with one test's outbox table and business table.

#[cfg(feature = "postgres")]
pub mod logical;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub mod private_postgres;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::{NewEvent, PayloadType, Store};
use uuid::Uuid;

use crate::scenario::WriteError;

/// The rows the relay has not published yet and has not parked as dead (the same SQL on every
/// store).
pub const PENDING: &str = "published_at IS NULL AND dead_at IS NULL";

/// A dead row of the outbox table.
#[derive(Debug, Clone)]
pub struct DeadRow {
    pub id: i64,
    pub event_id: Uuid,
    pub attempts: i64,
    pub last_error: String,
}

/// One database and one test's tables in it: the outbox table (named by the test, created by
/// `outbox-relay migrate`) and the business table `<table>_orders`.
///
/// Writers follow the writer contract (README, "Writing events"): a business transaction
/// updates — and so locks — its aggregate's row before it enqueues the aggregate's event, so
/// `id` order is each aggregate's commit order. Without it two transactions can take ids 7 and 8
/// for one aggregate and commit 8 first, and no relay can publish them in `id` order.
#[async_trait]
pub trait StoreSide: Send + Sync + std::fmt::Debug {
    /// The database, for messages ("PostgreSQL", "MariaDB").
    fn name(&self) -> &str;
    /// The outbox table.
    fn table(&self) -> &str;
    /// The `[store]` table of the relay's configuration (`shards` is added by the harness).
    fn store_toml(&self) -> String;
    /// The server and its version as the server reports them, for reports.
    async fn server_version(&self) -> String;
    /// The store crate's store of this outbox table (`shards` shards, a pool of `connections`),
    /// its schema migrated first (as `outbox-relay migrate` does), for driving the store
    /// directly.
    async fn connect_store(&self, shards: u32, connections: u32) -> Arc<dyn Store>;
    /// Empty the outbox table.
    async fn truncate(&self);
    /// Refresh the planner's statistics of the outbox table and the business table (which
    /// [`Self::create_orders`] made): `VACUUM ANALYZE` / `ANALYZE TABLE`.
    async fn analyze(&self);
    /// Empty the outbox table and load `events` pending rows with one `INSERT ... SELECT`, in
    /// `id` order: row `n` (from 1) is event `OrderChanged` of aggregate `order`
    /// `(n - 1) % aggregates`, payload `{"n", "order_id", "pad": <pad times "x">}`; then
    /// refresh the outbox table's statistics. Much faster than writers for a large backlog.
    /// The emptied table's payload column is made `payload_type` first (the payloads are then
    /// that JSON as text, or as its UTF-8 bytes).
    async fn bulk_load(&self, events: u64, aggregates: u64, pad: usize, payload_type: PayloadType);
    /// (Re)create the business table with rows `0` .. `aggregates - 1`.
    async fn create_orders(&self, aggregates: u64);
    /// One business transaction: update the row of `event`'s aggregate in the business table,
    /// enqueue `event`, then commit (`commit`) or roll back. The event's row id.
    async fn transact(&self, event: &NewEvent, commit: bool) -> Result<i64, WriteError>;
    /// Enqueue `events` in one transaction of their own; their row ids in order.
    async fn enqueue_many(&self, events: &[NewEvent]) -> Vec<i64>;
    /// How many rows of the outbox table match `condition` (SQL both stores read alike, such as
    /// `dead_at IS NULL`).
    async fn count_rows(&self, condition: &str) -> i64;
    /// Rows not yet published and not dead.
    async fn pending(&self) -> i64 {
        self.count_rows(PENDING).await
    }
    /// Whether any row is pending: cheaper than [`Self::pending`] (the first entry of the
    /// pending index), for polling a large table.
    async fn any_pending(&self) -> bool;
    /// For every published row, how long after its insert it was marked published (the
    /// database's clock on both ends).
    async fn publish_latencies(&self) -> Vec<Duration>;
    /// The row id of the event `event_id`, if its row is in the table.
    async fn row_of(&self, event_id: Uuid) -> Option<i64>;
    /// The dead rows, in `id` order.
    async fn dead_rows(&self) -> Vec<DeadRow>;
    /// Drop the outbox table (with its bookkeeping) and the business table.
    async fn drop_tables(&self);
}

/// A SQL store crate's writers' handle on an outbox table (its `Outbox`), as a [`SqlSide`]
/// opens it: the crate's store and sqlx database, the server and its test URL.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub trait SqlOutbox: Sized {
    /// The store, as the shared SQL code names it (`outboxkit_store_postgres::Postgres`).
    type Store: outboxkit_store_sql::SqlStore;
    /// The store's sqlx database.
    type Db: sqlx::Database;
    /// The server, for messages ("PostgreSQL").
    const SERVER: &'static str;
    /// The test server: `OUTBOX_TEST_*_URL`, default the machine's local server.
    fn test_url() -> String;
    /// The handle on `table`.
    fn on_table(table: &str) -> Self;
}

/// A SQL database and one test's tables in it: the outbox table and the business table
/// `<table>_orders`, with a pool and the store crate's writers' handle `O` on the outbox table.
/// [`PostgresSide`](postgres::PostgresSide) and [`MySqlSide`](mysql::MySqlSide) are this with
/// their store's `Outbox`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[derive(Debug)]
pub struct SqlSide<O: SqlOutbox> {
    url: String,
    table: String,
    orders: String,
    pool: sqlx::Pool<O::Db>,
    outbox: O,
}

/// Not derived: the derive would ask the sqlx database type to be `Clone` too.
#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<O: SqlOutbox + Clone> Clone for SqlSide<O> {
    fn clone(&self) -> Self {
        Self {
            url: self.url.clone(),
            table: self.table.clone(),
            orders: self.orders.clone(),
            pool: self.pool.clone(),
            outbox: self.outbox.clone(),
        }
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
impl<O: SqlOutbox> SqlSide<O>
where
    for<'c> &'c mut <O::Db as sqlx::Database>::Connection: sqlx::Executor<'c, Database = O::Db>,
{
    /// The test server ([`SqlOutbox::test_url`]) with outbox table `table`; fails the test,
    /// saying what to start, when the server is unreachable.
    pub async fn open(table: &str) -> Self {
        Self::open_at(&O::test_url(), table).await
    }

    /// The server at `url`.
    pub async fn open_at(url: &str, table: &str) -> Self {
        Self::open_with_pool(url, table, 12).await
    }

    /// The server at `url`, with a pool of `connections` (the most transactions in flight).
    pub async fn open_with_pool(url: &str, table: &str, connections: u32) -> Self {
        let pool = sqlx::pool::PoolOptions::new()
            .max_connections(connections)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "{} at {url} is unreachable ({e}): start it (scripts/services.sh)",
                    O::SERVER
                )
            });
        Self {
            url: url.to_owned(),
            table: table.to_owned(),
            orders: format!("{table}_orders"),
            pool,
            outbox: O::on_table(table),
        }
    }

    /// Run `sql` on the test's pool (a test's own DDL); fails the test with the server's error.
    pub async fn exec_sql(&self, sql: &str) {
        self.exec(sql).await;
    }

    /// Its connection pool, for a test's own queries.
    pub fn pool(&self) -> &sqlx::Pool<O::Db> {
        &self.pool
    }

    /// [`StoreSide::store_toml`]: the same keys on both servers.
    fn relay_toml(&self) -> String {
        format!(
            "[store]\nkind = \"{}\"\nurl = \"{}\"\ntable = \"{}\"\n",
            <O::Store as outboxkit_store_sql::SqlStore>::KIND,
            self.url,
            self.table
        )
    }

    /// [`StoreSide::connect_store`]: the store built as the relay builds it (the
    /// configuration's own `build`) and migrated; fails the test with the store's error.
    async fn connect_migrated(&self, shards: u32, connections: u32) -> Arc<dyn Store> {
        use outboxkit_core::StoreConfig;
        let (url, table) = (&self.url, &self.table);
        let mut config = outboxkit_store_sql::SqlStoreConfig::<O::Store>::new(url)
            .table(table)
            .shards(shards);
        config.pool_size = connections;
        let kind = <O::Store as outboxkit_store_sql::SqlStore>::KIND;
        let store = config
            .build()
            .await
            .unwrap_or_else(|e| panic!("{kind} store at {url}: {e}"));
        store
            .migrate()
            .await
            .unwrap_or_else(|e| panic!("migrating {table}: {e}"));
        Arc::new(store)
    }

    /// Run `sql` (one statement or more) on the pool; fails the test with the server's error.
    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// [`StoreSide::count_rows`]: the same SQL on both servers.
    async fn count_where(&self, condition: &str) -> i64
    where
        for<'q> <O::Db as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, O::Db>,
        i64: sqlx::Type<O::Db> + for<'r> sqlx::Decode<'r, O::Db>,
        usize: sqlx::ColumnIndex<<O::Db as sqlx::Database>::Row>,
    {
        sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.table
        ))
        .fetch_one(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("counting rows of {} where {condition}: {e}", self.table))
    }

    /// [`StoreSide::drop_tables`] up to the store's bookkeeping rows: the outbox table and the
    /// business table.
    async fn drop_both_tables(&self) {
        self.exec(&format!(
            "DROP TABLE IF EXISTS {}, {}",
            self.orders, self.table
        ))
        .await;
    }
}
