//! Store sides: a database with one test's outbox table and business table.

#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "postgres")]
pub mod private_postgres;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::{NewEvent, Store};
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
    async fn bulk_load(&self, events: u64, aggregates: u64, pad: usize);
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

/// A store on `table` of the SQL database at `url`, built as the relay builds it (the
/// configuration's own `build`) and migrated; fails the test with the store's error.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn connect_migrated<S: outboxkit_store_sql::SqlStore>(
    url: &str,
    table: &str,
    shards: u32,
    connections: u32,
) -> Arc<dyn Store> {
    use outboxkit_core::StoreConfig;
    let mut config = outboxkit_store_sql::SqlStoreConfig::<S>::new(url)
        .table(table)
        .shards(shards);
    config.pool_size = connections;
    let store = config
        .build()
        .await
        .unwrap_or_else(|e| panic!("{} store at {url}: {e}", S::KIND));
    store
        .migrate()
        .await
        .unwrap_or_else(|e| panic!("migrating {table}: {e}"));
    Arc::new(store)
}
