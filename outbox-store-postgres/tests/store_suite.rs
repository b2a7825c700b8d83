//! The store conformance suite of outboxkit-core, on a real PostgreSQL: the common cases and
//! the live ones.

use crate::common;

use std::str::FromStr;

use async_trait::async_trait;
use outboxkit_core::testkit::store_suite::{LiveHarness, StoreFactory, Writer};
use outboxkit_core::{NewEvent, Result, Store};
use outboxkit_store_postgres::sqlx::postgres::PgConnectOptions;
use outboxkit_store_postgres::sqlx::{self, Connection, Executor, PgConnection, Postgres};
use outboxkit_store_postgres::{
    PostgresShardSession, PostgresStore, PostgresStoreConfig, TableName, SCHEMA_VERSION,
};
use outboxkit_store_sql::testkit::{self, CreatedTables, SqlPool};

type Tx = sqlx::Transaction<'static, Postgres>;

/// Each store on a new random table; the tables are dropped when a case passes.
#[derive(Debug)]
struct PostgresFactory {
    /// The database the stores under test connect to.
    url: String,
    tables: CreatedTables<TableName>,
}

impl Default for PostgresFactory {
    fn default() -> Self {
        Self {
            url: common::SERVER.url(),
            tables: CreatedTables::default(),
        }
    }
}

impl PostgresFactory {
    /// The same database over TLS (`sslmode=require`: the connection fails unless encrypted).
    /// The machine's PostgreSQL has `ssl = on`; certificate verification is tested against
    /// private TLS-only servers in tests/tests/tls.rs.
    fn over_tls() -> Self {
        let url = common::SERVER.url();
        let sep = if url.contains('?') { '&' } else { '?' };
        Self {
            url: format!("{url}{sep}sslmode=require"),
            ..Self::default()
        }
    }

    fn fresh_config(&self) -> PostgresStoreConfig {
        testkit::fresh_config(&self.url)
    }
}

#[async_trait]
impl StoreFactory for PostgresFactory {
    async fn fresh_store(&self) -> Box<dyn Store> {
        let store = common::connect(PostgresFactory::fresh_config(self)).await;
        if self.url.contains("sslmode=require") {
            assert!(
                store.describe().contains(", TLS TLS"),
                "{}",
                store.describe()
            );
        }
        self.tables.add(store.table().clone());
        Box::new(store)
    }

    async fn cleanup(&self) {
        for table in self.tables.take() {
            common::drop_table(&table).await;
        }
    }
}

#[async_trait]
impl LiveHarness for PostgresFactory {
    type Store = PostgresStore;
    type Session = PostgresShardSession;
    type Config = PostgresStoreConfig;
    type Pool = SqlPool<Postgres>;
    type Conn = PgConnection;
    type Blocker = Tx;

    const KIND: &'static str = "postgres";
    const PRODUCT: &'static str = "PostgreSQL";
    const SCHEMA_VERSION: i32 = SCHEMA_VERSION;
    const DUPLICATE_KEY: &'static str = "23505";
    const NORMALIZES_JSON: bool = true;
    const MAX_NAME_CHARS: Option<usize> = None;
    const TABLE_NEEDS_DATABASE: bool = false;
    const ACCEPTS_ANY_PASSWORD: bool = true;
    const COLUMNS: &'static [(&'static str, &'static str)] = &[
        ("id", "bigint"),
        ("event_id", "uuid"),
        ("aggregate_type", "text"),
        ("aggregate_id", "text"),
        ("event_type", "text"),
        ("payload", "jsonb"),
        ("headers", "jsonb"),
        ("destination", "text"),
        ("created_at", "timestamp with time zone"),
        ("published_at", "timestamp with time zone"),
        ("attempts", "integer"),
        ("next_attempt_at", "timestamp with time zone"),
        ("last_error", "text"),
        ("dead_at", "timestamp with time zone"),
        ("shard", "smallint"),
    ];

    fn test_url(&self) -> String {
        self.url.clone()
    }

    fn fresh_config(&self) -> PostgresStoreConfig {
        PostgresFactory::fresh_config(self)
    }

    fn table(&self, store: &PostgresStore) -> String {
        store.table().to_string()
    }

    async fn open_session(&self, store: &PostgresStore, relay_id: &str) -> PostgresShardSession {
        store
            .open_postgres_session(relay_id)
            .await
            .expect("open session")
    }

    fn is_poisoned(&self, session: &PostgresShardSession) -> bool {
        session.is_poisoned()
    }

    fn owner_prefix(&self, relay_id: &str) -> String {
        format!("{relay_id} (pid ")
    }

    async fn kill(&self, store: &PostgresStore, session: &PostgresShardSession, relay_id: &str) {
        let application: String =
            sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
                .bind(session.backend_pid())
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(application, format!("outbox-relay:{relay_id}"));
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(session.backend_pid())
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert!(killed);
    }

    async fn block_table(&self, store: &PostgresStore) -> Tx {
        let mut blocker = store.pool().begin().await.unwrap();
        blocker
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
                store.table().quoted()
            ))))
            .await
            .unwrap();
        blocker
    }

    async fn unblock(&self, blocker: Tx) {
        blocker.rollback().await.unwrap();
    }

    async fn execute(&self, sql: &str) {
        common::SERVER.execute::<PgConnection>(sql).await;
    }

    async fn drop_table(&self, store: &PostgresStore) {
        common::drop_table(store.table()).await;
    }

    async fn drop_namespace(&self, namespace: &str) {
        common::drop_schema(namespace).await;
    }

    async fn schema_row(&self, store: &PostgresStore) -> (i32, i32, bool) {
        let schema_table = format!(
            "\"{}\".outbox_relay_schema",
            store.table().qualifier().unwrap()
        );
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT version, shard_count, applied_at IS NOT NULL AS applied FROM {schema_table} \
             WHERE table_name = $1"
        )))
        .bind(store.table().name())
        .fetch_one(store.pool())
        .await
        .unwrap()
    }

    async fn columns(&self, store: &PostgresStore) -> Vec<(String, String)> {
        sqlx::query_as(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
        )
        .bind(store.table().qualifier().unwrap())
        .bind(store.table().name())
        .fetch_all(store.pool())
        .await
        .unwrap()
    }

    async fn check_indexes(&self, store: &PostgresStore) {
        let indexes: Vec<String> = sqlx::query_scalar(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2",
        )
        .bind(store.table().qualifier().unwrap())
        .bind(store.table().name())
        .fetch_all(store.pool())
        .await
        .unwrap();
        let has = |needle: &str| indexes.iter().any(|d| d.contains(needle));
        assert!(
            has("(id) WHERE ((published_at IS NULL) AND (dead_at IS NULL))"),
            "{indexes:#?}"
        );
        assert!(has(
            "(aggregate_id, id) WHERE ((published_at IS NULL) AND (attempts > 0))"
        ));
        assert!(has("(published_at) WHERE (published_at IS NOT NULL)"));
        assert!(has("(id) WHERE (dead_at IS NOT NULL)"));

        let options: Vec<String> = sqlx::query_scalar(
            "SELECT unnest(reloptions) FROM pg_class WHERE oid = to_regclass($1)",
        )
        .bind(store.table().quoted())
        .fetch_all(store.pool())
        .await
        .unwrap();
        assert!(
            options
                .iter()
                .any(|o| o.starts_with("autovacuum_vacuum_scale_factor=")),
            "{options:?}"
        );
    }

    async fn write_with_plain_sql(&self, store: &PostgresStore) {
        let mut conn = common::raw_connection().await;
        // What a writer in another language does (see the README).
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', '42', 'OrderConfirmed', $1::jsonb, $2::jsonb), \
                    ('order', '42', 'OrderShipped', '{{\"n\": 2}}', DEFAULT)",
            store.table().quoted()
        )))
        .bind(r#"{"total": 99}"#)
        .bind(r#"{"traceparent": "00-abc-01", "retries": 3, "flags": {"a": true}}"#)
        .execute(&mut conn)
        .await
        .unwrap();
        let writer_error = sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', '42', 'Bad', '{{}}', '[1]')",
            store.table().quoted()
        )))
        .execute(&mut conn)
        .await;
        assert!(writer_error.is_err(), "headers must be a JSON object");
        let _ = conn.close().await;
    }

    fn pool(&self, store: &PostgresStore) -> SqlPool<Postgres> {
        SqlPool(store.pool().clone())
    }

    async fn pool_in(&self, namespace: &str) -> SqlPool<Postgres> {
        let options = PgConnectOptions::from_str(&self.url)
            .unwrap()
            .options([("search_path", namespace)]);
        common::SERVER.orders_pool(options).await
    }

    async fn enqueue(
        &self,
        store: &PostgresStore,
        conn: &mut PgConnection,
        writer: Writer,
        events: &[NewEvent],
    ) -> Result<Vec<i64>> {
        outboxkit_store_sql::enqueue_with!(outboxkit_store_postgres, store, conn, writer, events)
    }
}

outboxkit_core::store_suite!(PostgresFactory::default(), live);

/// The whole suite once more, every connection of the stores under test encrypted.
mod over_tls {
    use super::*;

    outboxkit_core::store_suite!(PostgresFactory::over_tls(), live);
}
