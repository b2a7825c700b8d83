//! The store conformance suite of outboxkit-core, on a real MySQL / MariaDB: the common cases
//! and the live ones.

use crate::common;

use std::str::FromStr;

use async_trait::async_trait;
use outboxkit_core::testkit::store_suite::{LiveHarness, StoreFactory, Writer};
use outboxkit_core::{NewEvent, Result, Store};
use outboxkit_store_mysql::sqlx::mysql::MySqlConnectOptions;
use outboxkit_store_mysql::sqlx::{self, Connection, Executor, MySql, MySqlConnection, Row};
use outboxkit_store_mysql::{
    MySqlShardSession, MySqlStore, MySqlStoreConfig, TableName, MAX_NAME_CHARS, SCHEMA_VERSION,
};
use outboxkit_store_sql::testkit::{CreatedTables, SqlPool};

/// Each store on a new random table; the tables are dropped when a case passes.
#[derive(Debug, Default)]
struct MySqlFactory {
    tables: CreatedTables<TableName>,
}

#[async_trait]
impl StoreFactory for MySqlFactory {
    async fn fresh_store(&self) -> Box<dyn Store> {
        let store = common::connect(common::fresh_config()).await;
        self.tables.add(store.table().clone());
        Box::new(store)
    }

    async fn cleanup(&self) {
        for table in self.tables.take() {
            common::drop_table(&table).await;
        }
    }
}

/// Text columns of `information_schema`, whatever their collation.
fn text(row: &sqlx::mysql::MySqlRow, index: usize) -> String {
    row.try_get_unchecked(index).unwrap()
}

/// The rows of `sql`, a query of `information_schema` about the store's table (its database
/// and name bound in that order).
async fn about_table(store: &MySqlStore, sql: &'static str) -> Vec<sqlx::mysql::MySqlRow> {
    sqlx::query(sql)
        .bind(store.table().qualifier().unwrap())
        .bind(store.table().name())
        .fetch_all(store.pool())
        .await
        .unwrap()
}

#[async_trait]
impl LiveHarness for MySqlFactory {
    type Store = MySqlStore;
    type Session = MySqlShardSession;
    type Config = MySqlStoreConfig;
    type Pool = SqlPool<MySql>;
    type Conn = MySqlConnection;
    type Blocker = MySqlConnection;

    const KIND: &'static str = "mysql";
    const PRODUCT: &'static str = "MySQL";
    const SCHEMA_VERSION: i32 = SCHEMA_VERSION;
    const DUPLICATE_KEY: &'static str = "error 1062";
    const NORMALIZES_JSON: bool = false;
    const MAX_NAME_CHARS: Option<usize> = Some(MAX_NAME_CHARS);
    const TABLE_NEEDS_DATABASE: bool = true;
    const ACCEPTS_ANY_PASSWORD: bool = false;
    const COLUMNS: &'static [(&'static str, &'static str)] = &[
        ("id", "bigint"),
        ("event_id", "char"),
        ("aggregate_type", "varchar"),
        ("aggregate_id", "varchar"),
        ("event_type", "varchar"),
        ("payload", "json"),
        ("headers", "json"),
        ("destination", "varchar"),
        ("created_at", "datetime"),
        ("published_at", "datetime"),
        ("attempts", "int"),
        ("next_attempt_at", "datetime"),
        ("last_error", "text"),
        ("dead_at", "datetime"),
        ("shard", "smallint"),
        ("pending", "tinyint"),
        ("retry_aggregate_id", "varchar"),
    ];

    fn test_url(&self) -> String {
        common::SERVER.url()
    }

    fn fresh_config(&self) -> MySqlStoreConfig {
        common::fresh_config()
    }

    fn table(&self, store: &MySqlStore) -> String {
        store.table().to_string()
    }

    async fn open_session(&self, store: &MySqlStore, relay_id: &str) -> MySqlShardSession {
        store
            .open_mysql_session(relay_id)
            .await
            .expect("open session")
    }

    fn is_poisoned(&self, session: &MySqlShardSession) -> bool {
        session.is_poisoned()
    }

    fn owner_prefix(&self, relay_id: &str) -> String {
        format!("{relay_id} (connection ")
    }

    async fn kill(&self, store: &MySqlStore, session: &MySqlShardSession, _relay_id: &str) {
        assert!(session.slot().is_some());
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "KILL {}",
            session.connection_id()
        )))
        .execute(store.pool())
        .await
        .unwrap();
    }

    async fn block_table(&self, store: &MySqlStore) -> MySqlConnection {
        let mut blocker = common::raw_connection().await;
        blocker
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "LOCK TABLES {} WRITE",
                store.table().quoted()
            ))))
            .await
            .unwrap();
        blocker
    }

    async fn unblock(&self, mut blocker: MySqlConnection) {
        blocker.execute("UNLOCK TABLES").await.unwrap();
        let _ = blocker.close().await;
    }

    async fn execute(&self, sql: &str) {
        common::SERVER.execute::<MySqlConnection>(sql).await;
    }

    async fn drop_table(&self, store: &MySqlStore) {
        common::drop_table(store.table()).await;
    }

    async fn drop_namespace(&self, namespace: &str) {
        common::drop_database(namespace).await;
    }

    fn quoted_in(&self, namespace: &str, name: &str) -> String {
        format!("`{namespace}`.`{name}`")
    }

    async fn schema_row(&self, store: &MySqlStore) -> (i32, i32, bool) {
        let database = store.table().qualifier().unwrap();
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT version, shard_count, applied_at IS NOT NULL AS applied \
             FROM `{database}`.outbox_relay_schema WHERE table_name = ?"
        )))
        .bind(store.table().name())
        .fetch_one(store.pool())
        .await
        .unwrap()
    }

    async fn columns(&self, store: &MySqlStore) -> Vec<(String, String)> {
        let rows = about_table(
            store,
            "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR), CAST(EXTRA AS CHAR) \
             FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
        )
        .await;
        let columns: Vec<(String, String, String)> = rows
            .iter()
            .map(|r| (text(r, 0), text(r, 1), text(r, 2)))
            .collect();
        assert!(columns[0].2.contains("auto_increment"));
        for generated in &columns[14..] {
            assert!(
                generated.2.to_ascii_uppercase().contains("STORED")
                    || generated.2.to_ascii_uppercase().contains("PERSISTENT"),
                "{generated:?}"
            );
        }
        columns
            .into_iter()
            .map(|(name, data_type, _)| match data_type.as_str() {
                // MariaDB's JSON is LONGTEXT with a JSON_VALID check.
                "longtext" => (name, "json".to_owned()),
                _ => (name, data_type),
            })
            .collect()
    }

    async fn check_indexes(&self, store: &MySqlStore) {
        let rows = about_table(
            store,
            "SELECT CAST(INDEX_NAME AS CHAR), \
                    CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS CHAR) \
             FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
             GROUP BY INDEX_NAME ORDER BY INDEX_NAME",
        )
        .await;
        let mut indexes: Vec<(String, String)> =
            rows.iter().map(|r| (text(r, 0), text(r, 1))).collect();
        let mut expected: Vec<(String, String)> = [
            ("PRIMARY", "id"),
            ("dead_idx", "dead_at"),
            ("event_id_key", "event_id"),
            ("pending_idx", "pending,id,shard"),
            ("published_idx", "published_at"),
            ("retry_idx", "retry_aggregate_id,id"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        indexes.sort();
        expected.sort();
        assert_eq!(indexes, expected);
    }

    async fn write_with_plain_sql(&self, store: &MySqlStore) {
        let mut conn = common::raw_connection().await;
        let t = store.table().quoted();
        // What a writer in another language does (see the README), with the session in another
        // time zone: created_at is UTC all the same.
        conn.execute("SET time_zone = '+05:00'").await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers) \
             VALUES ('order', '42', 'OrderConfirmed', ?, ?)"
        )))
        .bind(r#"{"total": 99}"#)
        .bind(r#"{"traceparent": "00-abc-01", "retries": 3, "flags": {"a": true}}"#)
        .execute(&mut conn)
        .await
        .unwrap();
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '42', 'OrderShipped', '{{\"n\": 2}}')"
        ))))
        .await
        .unwrap();
        for (what, values) in [
            (
                "headers must be a JSON object",
                "('order', '42', 'Bad', '{}', '[1]', DEFAULT)",
            ),
            (
                "payload must be JSON",
                "('order', '42', 'Bad', 'not json', '{}', DEFAULT)",
            ),
            (
                "event_id must be a UUID",
                "('order', '42', 'Bad', '{}', '{}', 'not-a-uuid')",
            ),
        ] {
            let refused = conn
                .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers, \
                     event_id) VALUES {values}"
                ))))
                .await;
            assert!(refused.is_err(), "{what}");
        }
        let _ = conn.close().await;
    }

    fn pool(&self, store: &MySqlStore) -> SqlPool<MySql> {
        SqlPool(store.pool().clone())
    }

    async fn pool_in(&self, namespace: &str) -> SqlPool<MySql> {
        let options = MySqlConnectOptions::from_str(&common::SERVER.url())
            .unwrap()
            .database(namespace);
        common::SERVER.orders_pool(options).await
    }

    async fn enqueue(
        &self,
        store: &MySqlStore,
        conn: &mut MySqlConnection,
        writer: Writer,
        events: &[NewEvent],
    ) -> Result<Vec<i64>> {
        outboxkit_store_sql::enqueue_with!(outboxkit_store_mysql, store, conn, writer, events)
    }
}

outboxkit_core::store_suite!(MySqlFactory::default(), live);
