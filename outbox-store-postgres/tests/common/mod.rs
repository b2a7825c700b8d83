//! Shared by the live tests: the test server, fresh table names, clean-up.
//!
//! The tests need PostgreSQL: they fail (never skip) when it is unreachable.

#![allow(dead_code)]

use outboxkit_store_postgres::sqlx::{self, Connection, Executor, PgConnection};
use outboxkit_store_postgres::{PostgresStore, PostgresStoreConfig, TableName};
use outboxkit_store_sql::testkit::{self, TestServer};

/// `OUTBOX_TEST_POSTGRES_URL`, or the local test database.
pub const SERVER: TestServer = TestServer {
    product: "PostgreSQL",
    url_env: "OUTBOX_TEST_POSTGRES_URL",
    default_url: "postgres://postgres@127.0.0.1:5432/test",
};

/// A configuration for a new, random table.
pub fn fresh_config() -> PostgresStoreConfig {
    testkit::fresh_config(&SERVER.url())
}

/// Connect a store, failing the test with a clear message when PostgreSQL is unreachable.
pub async fn connect(config: PostgresStoreConfig) -> PostgresStore {
    SERVER.connect(config).await
}

/// A plain connection to the test database.
pub async fn raw_connection() -> PgConnection {
    SERVER.raw_connection().await
}

/// Drop an outbox table and forget its migrations.
pub async fn drop_table(table: &TableName) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        table.quoted()
    ))))
    .await
    .expect("drop table");
    let schema = table.qualifier().unwrap_or("public");
    let regclass = format!("\"{schema}\".outbox_relay_schema");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&regclass)
        .fetch_one(&mut conn)
        .await
        .expect("look up outbox_relay_schema");
    if exists {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DELETE FROM {regclass} WHERE table_name = $1"
        )))
        .bind(table.name())
        .execute(&mut conn)
        .await
        .expect("forget migrations");
    }
    let _ = conn.close().await;
}

/// Drop a whole schema.
pub async fn drop_schema(schema: &str) {
    SERVER
        .execute::<PgConnection>(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .await;
}
