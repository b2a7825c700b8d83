//! Shared by the live tests: the server URL, fresh table names, clean-up.
//!
//! The tests need MySQL or MariaDB: they fail (never skip) when it is unreachable.

#![allow(dead_code)]

use outboxkit_store_mysql::sqlx::{self, Connection, Executor, MySqlConnection};
use outboxkit_store_mysql::{MySqlStore, MySqlStoreConfig, TableName};

/// `OUTBOX_TEST_MYSQL_URL`, or the local test database.
pub fn test_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A random name such as `outbox_t_1f2e3d4c5b6a7980`.
pub fn random_name(prefix: &str) -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &hex[..16])
}

/// A configuration for a new, random table.
pub fn fresh_config() -> MySqlStoreConfig {
    MySqlStoreConfig::new(test_url()).table(random_name("outbox_t"))
}

/// Connect a store, failing the test with a clear message when the server is unreachable.
pub async fn connect(config: MySqlStoreConfig) -> MySqlStore {
    match MySqlStore::connect(config).await {
        Ok(store) => store,
        Err(e) => panic!(
            "MySQL or MariaDB is required for this test (set OUTBOX_TEST_MYSQL_URL, default \
             mysql://root@127.0.0.1:3306/test; scripts/services.sh starts it): {e}"
        ),
    }
}

/// A plain connection to the test database.
pub async fn raw_connection() -> MySqlConnection {
    MySqlConnection::connect(&test_url())
        .await
        .unwrap_or_else(|e| panic!("MySQL or MariaDB is required for this test: {e}"))
}

/// Drop an outbox table and forget its migrations and members.
pub async fn drop_table(table: &TableName) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {}",
        table.quoted()
    )))
    .await
    .expect("drop table");
    for bookkeeping in ["outbox_relay_schema", "outbox_relay_members"] {
        let database = table
            .database()
            .expect("a connected store's table is qualified");
        let exists: Option<String> = sqlx::query_scalar(
            "SELECT CAST(TABLE_NAME AS CHAR) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?",
        )
        .bind(database)
        .bind(bookkeeping)
        .fetch_optional(&mut conn)
        .await
        .expect("look up the bookkeeping tables");
        if exists.is_some() {
            sqlx::query(&format!(
                "DELETE FROM `{database}`.`{bookkeeping}` WHERE table_name = ?"
            ))
            .bind(table.name())
            .execute(&mut conn)
            .await
            .expect("forget the table");
        }
    }
    let _ = conn.close().await;
}

/// Drop a whole database.
pub async fn drop_database(database: &str) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "DROP DATABASE IF EXISTS `{database}`"
    )))
    .await
    .expect("drop database");
    let _ = conn.close().await;
}
