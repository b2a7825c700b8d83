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
    /// How many committed business transactions updated `aggregate`'s business row (its
    /// `version`), where the side's transactions update it.
    async fn business_version(&self, aggregate: &str) -> Option<i64> {
        let _ = aggregate;
        None
    }
    /// The dead rows, in `id` order.
    async fn dead_rows(&self) -> Vec<DeadRow>;
    /// Drop the outbox table (with its bookkeeping) and the business table.
    async fn drop_tables(&self);
    /// Run `sql`, a statement of the test's own (DDL, `GRANT`), on the side's pool; fails the
    /// test with the server's error.
    async fn exec_sql(&self, sql: &str);
    /// Lock the outbox table from a connection of its own: every other statement on the table
    /// waits until [`TableLock::release`].
    async fn lock_table(&self) -> TableLock;
    /// How many connections from `client` (an IP address) wait on a table lock.
    async fn lock_waiters(&self, client: &str) -> i64;
}

/// The outbox table locked by [`StoreSide::lock_table`].
pub struct TableLock(Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>);

impl TableLock {
    /// Run `lock` on a connection of `pool`'s own; [`Self::release`] runs `release` on it.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) async fn take<DB: sqlx::Database>(
        pool: &sqlx::Pool<DB>,
        lock: String,
        release: &'static str,
    ) -> Self
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        let mut conn = pool.acquire().await.expect("connecting");
        sqlx::Executor::execute(&mut *conn, sqlx::AssertSqlSafe(lock.as_str()))
            .await
            .unwrap_or_else(|e| panic!("{lock}: {e}"));
        Self(Box::new(move || {
            Box::pin(async move {
                sqlx::Executor::execute(&mut *conn, release)
                    .await
                    .unwrap_or_else(|e| panic!("{release}: {e}"));
            })
        }))
    }

    /// Let the table go.
    pub async fn release(self) {
        (self.0)().await
    }
}

impl std::fmt::Debug for TableLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TableLock")
    }
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// A SQL store crate's writers' handle on an outbox table (its `Outbox`), as a [`SqlSide`]
/// opens it: the crate's store and sqlx database, the server and its test URL, and what the
/// [`StoreSide`] of a [`SqlSide`] says or does differently on its server.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[async_trait]
pub trait SqlOutbox: Sized + Send + Sync + std::fmt::Debug + 'static {
    /// The store, as the shared SQL code names it (`outboxkit_store_postgres::Postgres`).
    type Store: outboxkit_store_sql::SqlStore;
    /// The store's sqlx database.
    type Db: sqlx::Database;
    /// How the outbox table's `event_id` column is bound and read (a `Uuid`, or its text).
    type EventId: sqlx::Type<Self::Db>
        + for<'q> sqlx::Encode<'q, Self::Db>
        + for<'r> sqlx::Decode<'r, Self::Db>
        + Send
        + Unpin;
    /// The server, for messages ("PostgreSQL").
    const SERVER: &'static str;
    /// The database, for [`StoreSide::name`] ("PostgreSQL", "MariaDB").
    const NAME: &'static str;
    /// [`StoreSide::server_version`]: the query of the server and its version.
    const VERSION_SQL: &'static str;
    /// [`StoreSide::truncate`]: the statement emptying the table named after it.
    const TRUNCATE: &'static str;
    /// [`StoreSide::publish_latencies`]: a published row's microseconds from insert to publish.
    const LATENCY_MICROS: &'static str;
    /// [`StoreSide::dead_rows`]: the columns after `id` (event id, attempts, last error).
    const DEAD_COLUMNS: &'static str;
    /// The first parameter of a statement (`$1`, `?`).
    const PARAM: &'static str;
    /// The test server: `OUTBOX_TEST_*_URL`, default the machine's local server.
    fn test_url() -> String;
    /// The handle on `table`.
    fn on_table(table: &str) -> Self;
    /// `event_id` as [`Self::EventId`] binds it.
    fn event_id(event_id: Uuid) -> Self::EventId;
    /// An `event_id` read back.
    fn uuid(event_id: Self::EventId) -> Uuid;
    /// The crate's `Outbox::enqueue`.
    async fn enqueue(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        event: &NewEvent,
    ) -> outboxkit_core::Result<i64>;
    /// The crate's `Outbox::enqueue_many`.
    async fn enqueue_many(
        &self,
        conn: &mut <Self::Db as sqlx::Database>::Connection,
        events: &[NewEvent],
    ) -> outboxkit_core::Result<Vec<i64>>;
    /// [`StoreSide::analyze`] of `side`.
    async fn analyze(side: &SqlSide<Self>);
    /// [`StoreSide::bulk_load`] into `side`.
    async fn bulk_load(
        side: &SqlSide<Self>,
        events: u64,
        aggregates: u64,
        pad: usize,
        payload_type: PayloadType,
    );
    /// [`StoreSide::any_pending`] of `side`.
    async fn any_pending(side: &SqlSide<Self>) -> bool;
    /// [`StoreSide::create_orders`]: the statements (re)creating the business table `orders`.
    fn create_orders_sql(orders: &str, aggregates: u64) -> String;
    /// [`StoreSide::lock_table`]: the statement locking `table`, and the one letting it go.
    fn lock_table_sql(table: &str) -> (String, &'static str);
    /// [`StoreSide::lock_waiters`]: the count of the connections from `client` waiting on a
    /// table lock.
    fn lock_waiters_sql(client: &str) -> String;
    /// [`StoreSide::drop_tables`] after the tables: the store's bookkeeping rows of `side`.
    async fn drop_bookkeeping(side: &SqlSide<Self>);
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
    <O::Db as sqlx::Database>::Arguments: sqlx::IntoArguments<O::Db>,
    String: sqlx::Type<O::Db> + for<'q> sqlx::Encode<'q, O::Db>,
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

    /// Its connection pool, for a test's own queries.
    pub fn pool(&self) -> &sqlx::Pool<O::Db> {
        &self.pool
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
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {} SET version = version + 1 WHERE id = {}",
                self.orders,
                O::PARAM
            )))
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

    /// Run `sql` (one statement or more) on the pool; fails the test with the server's error.
    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// `SELECT {what} FROM {table} WHERE {column} = ` the one bound value.
    fn select_where(what: &str, table: &str, column: &str) -> sqlx::AssertSqlSafe<String> {
        sqlx::AssertSqlSafe(format!(
            "SELECT {what} FROM {table} WHERE {column} = {}",
            O::PARAM
        ))
    }
}

/// What is the same on both servers; [`SqlOutbox`] says what is not.
#[cfg(any(feature = "postgres", feature = "mysql"))]
#[async_trait]
impl<O: SqlOutbox> StoreSide for SqlSide<O>
where
    for<'c> &'c mut <O::Db as sqlx::Database>::Connection: sqlx::Executor<'c, Database = O::Db>,
    <O::Db as sqlx::Database>::Arguments: sqlx::IntoArguments<O::Db>,
    String: sqlx::Type<O::Db> + for<'q> sqlx::Encode<'q, O::Db> + for<'r> sqlx::Decode<'r, O::Db>,
    i64: sqlx::Type<O::Db> + for<'r> sqlx::Decode<'r, O::Db>,
    usize: sqlx::ColumnIndex<<O::Db as sqlx::Database>::Row>,
{
    fn name(&self) -> &str {
        O::NAME
    }

    fn table(&self) -> &str {
        &self.table
    }

    /// The same keys on both servers.
    fn store_toml(&self) -> String {
        format!(
            "[store]\nkind = \"{}\"\nurl = \"{}\"\ntable = \"{}\"\n",
            <O::Store as outboxkit_store_sql::SqlStore>::KIND,
            self.url,
            self.table
        )
    }

    async fn server_version(&self) -> String {
        sqlx::query_scalar(O::VERSION_SQL)
            .fetch_one(&self.pool)
            .await
            .expect("reading the server version")
    }

    /// The store built as the relay builds it (the configuration's own `build`) and migrated;
    /// fails the test with the store's error.
    async fn connect_store(&self, shards: u32, connections: u32) -> Arc<dyn Store> {
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

    async fn truncate(&self) {
        self.exec(&format!("{} {}", O::TRUNCATE, self.table)).await;
    }

    async fn analyze(&self) {
        O::analyze(self).await;
    }

    async fn bulk_load(&self, events: u64, aggregates: u64, pad: usize, payload_type: PayloadType) {
        O::bulk_load(self, events, aggregates, pad, payload_type).await;
    }

    async fn any_pending(&self) -> bool {
        O::any_pending(self).await
    }

    async fn create_orders(&self, aggregates: u64) {
        let orders = &self.orders;
        sqlx::raw_sql(sqlx::AssertSqlSafe(O::create_orders_sql(
            orders, aggregates,
        )))
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
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT COUNT(*) FROM {} WHERE {condition}",
            self.table
        )))
        .fetch_one(&self.pool)
        .await
        .unwrap_or_else(|e| panic!("counting rows of {} where {condition}: {e}", self.table))
    }

    async fn lock_table(&self) -> TableLock {
        let (lock, release) = O::lock_table_sql(&self.table);
        TableLock::take(&self.pool, lock, release).await
    }

    async fn lock_waiters(&self, client: &str) -> i64 {
        let sql = O::lock_waiters_sql(client);
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn publish_latencies(&self) -> Vec<Duration> {
        let micros: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT {} FROM {} WHERE published_at IS NOT NULL",
            O::LATENCY_MICROS,
            self.table
        )))
        .fetch_all(&self.pool)
        .await
        .expect("reading publish times");
        micros
            .into_iter()
            .map(|us| Duration::from_micros(us.max(0) as u64))
            .collect()
    }

    async fn business_version(&self, aggregate: &str) -> Option<i64> {
        sqlx::query_scalar(Self::select_where("version", &self.orders, "id"))
            .bind(aggregate.to_owned())
            .fetch_optional(&self.pool)
            .await
            .ok()
            .flatten()
    }

    async fn row_of(&self, event_id: Uuid) -> Option<i64> {
        sqlx::query_scalar(Self::select_where("id", &self.table, "event_id"))
            .bind(O::event_id(event_id))
            .fetch_optional(&self.pool)
            .await
            .expect("looking up a row")
    }

    async fn exec_sql(&self, sql: &str) {
        self.exec(sql).await;
    }

    async fn dead_rows(&self) -> Vec<DeadRow> {
        let rows: Vec<(i64, O::EventId, i64, Option<String>)> =
            sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "SELECT id, {} FROM {} WHERE dead_at IS NOT NULL ORDER BY id",
                O::DEAD_COLUMNS,
                self.table
            )))
            .fetch_all(&self.pool)
            .await
            .expect("reading dead rows");
        rows.into_iter()
            .map(|(id, event_id, attempts, last_error)| DeadRow {
                id,
                event_id: O::uuid(event_id),
                attempts,
                last_error: last_error.unwrap_or_default(),
            })
            .collect()
    }

    /// The outbox table and the business table, then the store's bookkeeping rows.
    async fn drop_tables(&self) {
        self.exec(&format!(
            "DROP TABLE IF EXISTS {}, {}",
            self.orders, self.table
        ))
        .await;
        O::drop_bookkeeping(self).await;
    }
}
