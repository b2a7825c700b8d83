//! What every SQL store checks in its tests (feature `testkit`): the errors all servers share,
//! classified with the store's wording ([`check_shared_errors`]); the test server of the live
//! tests ([`TestServer`]); the steps of the store suite's live cases that are the same SQL on
//! every server ([`SqlPool`], [`SqlTx`], [`enqueue_with!`](crate::enqueue_with));
//! and the inbox cases on the store's `Inbox` ([`sql_inbox_suite!`](crate::sql_inbox_suite)).

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::ops::{Deref, DerefMut};
use std::sync::Mutex;

use sqlx::error::{DatabaseError, ErrorKind as SqlxErrorKind};
use sqlx::pool::{PoolConnection, PoolOptions};
use sqlx::{ColumnIndex, Connection, Database, Decode, Executor, Pool, Type};

use outboxkit_core::testkit::store_suite::{WriterPool, WriterTx};
use outboxkit_core::ErrorKind;

use crate::classify::{classify, Dialect, Target};
use crate::config::{SqlStore, SqlStoreConfig, TableName, TableRules, SCHEMA_TABLE};

/// What [`sql_inbox_suite!`](crate::sql_inbox_suite) expands to needs.
#[doc(hidden)]
pub mod __private {
    pub use async_trait::async_trait;
    pub use outboxkit_core;
}

/// A database error with a given SQLSTATE and nothing driver-specific (no MySQL error number),
/// as the server would send it through another driver layer.
#[derive(Debug)]
pub struct FakeDbError(pub &'static str);

impl fmt::Display for FakeDbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server says {}", self.0)
    }
}

impl StdError for FakeDbError {}

impl DatabaseError for FakeDbError {
    fn message(&self) -> &str {
        "server says no"
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0))
    }
    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> SqlxErrorKind {
        SqlxErrorKind::Other
    }
}

/// `sqlx::Error::Database` carrying [`FakeDbError`].
pub fn database_error(sqlstate: &'static str) -> sqlx::Error {
    sqlx::Error::Database(Box::new(FakeDbError(sqlstate)))
}

/// Check a store's table of server error codes (SQLSTATEs, error numbers): `kind_of` gives
/// every code of a row that row's kind and retryability.
#[track_caller]
pub fn check_kinds<C: Copy + fmt::Display>(
    kind_of: impl Fn(C) -> (ErrorKind, bool),
    table: &[(&[C], ErrorKind, bool)],
) {
    for (codes, kind, retryable) in table {
        for &code in *codes {
            assert_eq!(kind_of(code), (*kind, *retryable), "{code}");
        }
    }
}

/// Check what `D` classifies the way every server does, for a `target` with an endpoint: I/O,
/// TLS, protocol and pool errors are retryable connection errors naming the server and its
/// endpoint; a bad URL is a configuration error; rows that do not decode are permanent errors
/// naming the table.
pub fn check_shared_errors<D: Dialect>(target: &Target) {
    let endpoint = target
        .endpoint
        .as_deref()
        .expect("a target with an endpoint");
    let io = |kind, text: &str| sqlx::Error::Io(io::Error::new(kind, text.to_owned()));

    let e = classify::<D>(io(io::ErrorKind::ConnectionRefused, "os error 111"), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.is_retryable());
    assert_eq!(
        e.full_message(),
        format!(
            "cannot reach {} at {endpoint} (store.url): connection refused",
            D::PRODUCT
        )
    );
    let e = classify::<D>(io(io::ErrorKind::UnexpectedEof, "eof"), target);
    assert!(
        e.message().ends_with("connection closed by the server"),
        "{e}"
    );
    let e = classify::<D>(sqlx::Error::Io(io::Error::other("weird failure")), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.message().contains("weird failure"), "{e}");

    let e = classify::<D>(sqlx::Error::Tls("bad certificate".into()), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.message().contains("bad certificate") && e.message().contains(D::TLS_OPTION));

    for error in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
        let e = classify::<D>(error, target);
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert!(e.is_retryable());
        assert!(e.message().contains(endpoint), "{e}");
    }
    for error in [
        sqlx::Error::Protocol("unexpected message".into()),
        sqlx::Error::WorkerCrashed,
    ] {
        assert_eq!(classify::<D>(error, target).kind(), ErrorKind::Connection);
    }

    let bad = format!("bad {}", D::TLS_OPTION);
    let e = classify::<D>(sqlx::Error::Configuration(bad.into()), target);
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.message().starts_with("store.url"), "{e}");

    let e = classify::<D>(sqlx::Error::ColumnNotFound("shard".into()), target);
    assert_eq!(e.kind(), ErrorKind::Other);
    assert!(!e.is_retryable());
    assert!(e.message().contains(&target.table), "{e}");
    assert_eq!(
        classify::<D>(sqlx::Error::RowNotFound, target).kind(),
        ErrorKind::Other
    );
}

/// `url` refused by the driver `O` of the store `S` at `connect_options`, with `expected`: the
/// configuration error that names `store.url` and says what to write instead.
pub fn check_url_refused<S: SqlStore + Dialect, O: sqlx::ConnectOptions>(
    url: &str,
    expected: &str,
) {
    let config = SqlStoreConfig::<S>::new(url);
    let e = config
        .connect_options::<O>(|options, _| options)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(e.message(), expected);
}

/// What every store checks of its table names under its rules `R`: a plain name has no
/// qualifier; each of `quoted` — (a name, the qualifier it is put in or `None`, its quoted form,
/// its text) — quotes and shows as given; the bookkeeping table beside `app.outbox_2` is
/// `sibling`, and a qualified name keeps its qualifier; names valid nowhere, this server's
/// `bad` ones, its reserved names and names longer than `longest` bytes are configuration
/// errors, a name of `longest` bytes is valid.
pub fn check_table_names<R: TableRules>(
    quoted: &[(&str, Option<&str>, &str, &str)],
    sibling: &str,
    bad: &[&str],
    longest: usize,
) {
    let t = TableName::<R>::parse("outbox").unwrap();
    assert_eq!((t.qualifier(), t.name()), (None, "outbox"));
    for (name, qualifier, expected, text) in quoted {
        let mut t = TableName::<R>::parse(name).unwrap();
        if let Some(qualifier) = qualifier {
            t = t.or_in(qualifier);
        }
        assert_eq!(t.quoted(), *expected);
        assert_eq!(t.to_string(), *text);
    }
    let t = TableName::<R>::parse("app.outbox_2").unwrap();
    assert_eq!(t.quoted_sibling(SCHEMA_TABLE), sibling);
    assert_eq!(t.clone().or_in("other"), t);

    let too_long = "x".repeat(longest + 1);
    let anywhere = [
        "",
        "a.",
        ".a",
        "a.b.c",
        "Outbox",
        "1outbox",
        "out box",
        "outbox;drop table x",
        too_long.as_str(),
    ];
    for bad in anywhere.iter().chain(bad).chain(R::RESERVED) {
        let e = TableName::<R>::parse(bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
    }
    TableName::<R>::parse(&"x".repeat(longest)).unwrap();
}

/// The settings the store suite's live cases vary, once for every SQL store.
impl<S: crate::SqlStore> outboxkit_core::testkit::store_suite::SuiteConfig
    for crate::SqlStoreConfig<S>
{
    fn for_url(url: &str) -> Self {
        Self::new(url)
    }

    fn with_table(self, table: &str) -> Self {
        self.table(table)
    }

    fn with_shards(self, shards: u32) -> Self {
        self.shards(shards)
    }

    fn with_session_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    fn with_payload_type(mut self, payload_type: outboxkit_core::PayloadType) -> Self {
        self.payload_type = Some(payload_type);
        self
    }

    fn table_setting(&self) -> String {
        self.table.clone()
    }
}

/// The server a SQL store's live tests run on: what messages call it, the variable that gives
/// its URL (`OUTBOX_TEST_POSTGRES_URL`) and the URL otherwise. The tests fail, never skip, when
/// it is unreachable.
#[derive(Debug, Clone, Copy)]
pub struct TestServer {
    /// `PostgreSQL`, `MySQL or MariaDB`.
    pub product: &'static str,
    /// The environment variable that overrides [`Self::default_url`].
    pub url_env: &'static str,
    /// The local test database.
    pub default_url: &'static str,
}

impl TestServer {
    /// `$url_env`, or the local test database.
    pub fn url(&self) -> String {
        std::env::var(self.url_env).unwrap_or_else(|_| self.default_url.to_owned())
    }

    /// Fail the test: it needs the server, which `error` says is unreachable.
    #[track_caller]
    pub fn required(&self, error: impl fmt::Display) -> ! {
        panic!(
            "{} is required for this test (set {}, default {}; scripts/services.sh starts it): \
             {error}",
            self.product, self.url_env, self.default_url
        )
    }

    /// Connect a store (not migrated), failing the test when the server is unreachable.
    pub async fn connect<S: SqlStore>(&self, config: SqlStoreConfig<S>) -> S::Store {
        S::connect(config)
            .await
            .unwrap_or_else(|e| self.required(e))
    }

    /// Connect a store and migrate its table, failing the test when the server is unreachable.
    pub async fn migrated<S: SqlStore>(&self, config: SqlStoreConfig<S>) -> S::Store {
        let store = self.connect(config).await;
        outboxkit_core::Store::migrate(&store)
            .await
            .expect("migrate");
        store
    }

    /// A plain connection to the test database.
    pub async fn raw_connection<C: Connection>(&self) -> C {
        C::connect(&self.url())
            .await
            .unwrap_or_else(|e| self.required(e))
    }

    /// Run `sql` (one statement or more) on a new plain connection `C` to the test database.
    pub async fn execute<C>(&self, sql: &str)
    where
        C: Connection,
        for<'c> &'c mut C: Executor<'c, Database = C::Database>,
    {
        let mut conn: C = self.raw_connection().await;
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let _ = conn.close().await;
    }

    /// A pool of one connection with `options` (which name the schema or database it uses by
    /// default), where a table `orders (id, status)` of 20 characters each is created: the
    /// writers' pool of the store suite's `LiveHarness::pool_in`.
    pub async fn orders_pool<DB>(
        &self,
        options: <DB::Connection as Connection>::Options,
    ) -> SqlPool<DB>
    where
        DB: Database,
        for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    {
        let pool = PoolOptions::<DB>::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| self.required(e));
        pool.execute(sqlx::raw_sql(
            "CREATE TABLE orders (id VARCHAR(20) PRIMARY KEY, status VARCHAR(20) NOT NULL)",
        ))
        .await
        .unwrap();
        SqlPool(pool)
    }
}

/// Settings for a new, random table (`outbox_t_<16 hex digits>`) of the database at `url`.
pub fn fresh_config<S: SqlStore>(url: &str) -> SqlStoreConfig<S> {
    SqlStoreConfig::new(url).table(outboxkit_core::testkit::store_suite::random_name(
        "outbox_t",
    ))
}

/// A writers' pool of the store suite's live cases (`LiveHarness::Pool`): the store's own pool,
/// or one of [`TestServer::orders_pool`].
#[derive(Debug, Clone)]
pub struct SqlPool<DB: Database>(pub Pool<DB>);

/// A writer's transaction of the store suite's live cases (`WriterPool::Tx`), on its connection.
#[derive(Debug)]
pub struct SqlTx<DB: Database>(pub sqlx::Transaction<'static, DB>);

#[async_trait::async_trait]
impl<DB> WriterPool for SqlPool<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    i64: Type<DB> + for<'r> Decode<'r, DB>,
    usize: ColumnIndex<DB::Row>,
{
    type Conn = DB::Connection;
    type Tx = SqlTx<DB>;
    type Lease = PoolConnection<DB>;

    async fn begin(&self) -> SqlTx<DB> {
        SqlTx(self.0.begin().await.unwrap())
    }

    async fn acquire(&self) -> PoolConnection<DB> {
        self.0.acquire().await.unwrap()
    }

    async fn count_orders(&self) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM orders")
            .fetch_one(&self.0)
            .await
            .unwrap()
    }
}

#[async_trait::async_trait]
impl<DB> WriterTx for SqlTx<DB>
where
    DB: Database,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    async fn commit(self) {
        self.0.commit().await.unwrap();
    }

    async fn rollback(self) {
        self.0.rollback().await.unwrap();
    }

    async fn insert_order(&mut self, id: &str) {
        let sql = format!("INSERT INTO orders VALUES ('{id}', 'confirmed')");
        self.0
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .unwrap();
    }
}

impl<DB: Database> Deref for SqlTx<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        &self.0
    }
}

impl<DB: Database> DerefMut for SqlTx<DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        &mut self.0
    }
}

/// The tables a store factory created, to drop when a case passes (`StoreFactory::cleanup`).
#[derive(Debug)]
pub struct CreatedTables<T>(Mutex<Vec<T>>);

impl<T> Default for CreatedTables<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> CreatedTables<T> {
    /// Remember `table`.
    pub fn add(&self, table: T) {
        self.0.lock().expect("tables lock").push(table);
    }

    /// The tables remembered so far; forget them.
    pub fn take(&self) -> Vec<T> {
        std::mem::take(&mut *self.0.lock().expect("tables lock"))
    }
}

/// Enqueue `events` through `writer` (an `outboxkit_core::testkit::store_suite::Writer`) on
/// `conn`, with the writers' API of the SQL store crate `krate`: `store.outbox()`'s `enqueue` and
/// `enqueue_many`, and the crate's free functions `enqueue` and `enqueue_many`. `conn` is a
/// writer's transaction or a plain connection; for one-event writers, `events` is one event.
/// Evaluates to the `Result<Vec<i64>>` of `LiveHarness::enqueue`:
///
/// ```text
/// async fn enqueue(&self, store: &PostgresStore, conn: &mut PgConnection, writer: Writer,
///     events: &[NewEvent]) -> Result<Vec<i64>> {
///     outboxkit_store_sql::enqueue_with!(outboxkit_store_postgres, store, conn, writer, events)
/// }
/// ```
#[macro_export]
macro_rules! enqueue_with {
    ($krate:ident, $store:expr, $conn:expr, $writer:expr, $events:expr) => {{
        use $crate::testkit::__private::outboxkit_core::testkit::store_suite::Writer;
        let (outbox, events) = ($store.outbox(), $events);
        match $writer {
            Writer::Outbox => outbox.enqueue($conn, &events[0]).await.map(|id| vec![id]),
            Writer::OutboxMany => outbox.enqueue_many($conn, events).await,
            Writer::Free => $krate::enqueue($conn, &events[0]).await.map(|id| vec![id]),
            Writer::FreeMany => $krate::enqueue_many($conn, events).await,
        }
    }};
}

/// The inbox cases of the store suite ([`outboxkit_core::inbox_suite!`]) on the `Inbox` of the
/// SQL store crate `krate`, whose sqlx database is `krate::sqlx::$db`, at the [`TestServer`]
/// `server`: each case on a new table `inbox_t_<10 hex digits>` of a pool of 4 connections. The
/// calling crate needs `tokio` (macros, rt).
///
/// ```text
/// outboxkit_store_sql::sql_inbox_suite!(outboxkit_store_postgres, Postgres, common::SERVER);
/// ```
#[macro_export]
macro_rules! sql_inbox_suite {
    ($krate:ident, $db:ident, $server:expr) => {
        /// An inbox on a new table, and its pool.
        #[derive(Debug, Clone)]
        struct SqlInbox {
            pool: $krate::sqlx::Pool<$krate::sqlx::$db>,
            inbox: $krate::Inbox,
            table: String,
        }

        #[$crate::testkit::__private::async_trait]
        impl $crate::testkit::__private::outboxkit_core::testkit::store_suite::inbox::InboxHarness
            for SqlInbox
        {
            type Tx = $krate::sqlx::Transaction<'static, $krate::sqlx::$db>;

            async fn fresh() -> Self {
                let server = $server;
                let pool = $krate::sqlx::pool::PoolOptions::new()
                    .max_connections(4)
                    .connect(&server.url())
                    .await
                    .unwrap_or_else(|e| server.required(e));
                let id = $krate::sqlx::types::Uuid::new_v4().simple().to_string();
                let table = format!("inbox_t_{}", &id[..10]);
                let inbox = $krate::Inbox::new(&table).unwrap();
                inbox.migrate(&pool).await.unwrap();
                inbox.migrate(&pool).await.expect("migrate is idempotent");
                Self { pool, inbox, table }
            }

            async fn begin(&self) -> Self::Tx {
                self.pool.begin().await.unwrap()
            }

            async fn commit(&self, tx: Self::Tx) {
                tx.commit().await.unwrap();
            }

            async fn rollback(&self, tx: Self::Tx) {
                tx.rollback().await.unwrap();
            }

            async fn try_mark_processed(
                &self,
                tx: &mut Self::Tx,
                consumer: &str,
                event: $krate::sqlx::types::Uuid,
            ) -> bool {
                self.inbox
                    .try_mark_processed(tx, consumer, event)
                    .await
                    .unwrap()
            }

            async fn mark_processed_now(
                &self,
                consumer: &str,
                event: $krate::sqlx::types::Uuid,
            ) -> bool {
                let mut conn = self.pool.acquire().await.unwrap();
                self.inbox
                    .try_mark_processed(&mut conn, consumer, event)
                    .await
                    .unwrap()
            }

            async fn purge_processed(&self, older_than: ::std::time::Duration, limit: u32) -> u64 {
                self.inbox
                    .purge_processed(&self.pool, older_than, limit)
                    .await
                    .unwrap()
            }

            async fn drop_table(&self) {
                $krate::sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {}", self.table)))
                    .execute(&self.pool)
                    .await
                    .unwrap();
            }
        }

        $crate::testkit::__private::outboxkit_core::inbox_suite!(SqlInbox);
    };
}
