//! Shared by the live tests: the test server, fresh table names, clean-up.
//!
//! The tests need MySQL or MariaDB: they fail (never skip) when it is unreachable.

#![allow(dead_code)]

use outboxkit_store_mysql::sqlx::{self, Connection, Executor, MySqlConnection};
use outboxkit_store_mysql::{MySqlStore, MySqlStoreConfig, TableName};
use outboxkit_store_sql::testkit::{self, TestServer};

/// `OUTBOX_TEST_MYSQL_URL`, or the local test database.
pub const SERVER: TestServer = TestServer {
    product: "MySQL or MariaDB",
    url_env: "OUTBOX_TEST_MYSQL_URL",
    default_url: "mysql://root@127.0.0.1:3306/test",
};

/// A configuration for a new, random table.
pub fn fresh_config() -> MySqlStoreConfig {
    testkit::fresh_config(&SERVER.url())
}

/// Connect a store, failing the test with a clear message when the server is unreachable.
pub async fn connect(config: MySqlStoreConfig) -> MySqlStore {
    SERVER.connect(config).await
}

/// A plain connection to the test database.
pub async fn raw_connection() -> MySqlConnection {
    SERVER.raw_connection().await
}

/// Drop an outbox table and forget its migrations and members.
pub async fn drop_table(table: &TableName) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        table.quoted()
    ))))
    .await
    .expect("drop table");
    for bookkeeping in ["outbox_relay_schema", "outbox_relay_members"] {
        let database = table
            .qualifier()
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
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM `{database}`.`{bookkeeping}` WHERE table_name = ?"
            )))
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
    SERVER
        .execute::<MySqlConnection>(&format!("DROP DATABASE IF EXISTS `{database}`"))
        .await;
}
