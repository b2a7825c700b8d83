//! Shared by the live tests: the database URL, fresh table names, clean-up.
//!
//! The tests need PostgreSQL: they fail (never skip) when it is unreachable.

#![allow(dead_code)]

use outboxkit_store_postgres::sqlx::{self, Connection, Executor, PgConnection};
use outboxkit_store_postgres::{PostgresStore, PostgresStoreConfig, TableName};

/// `OUTBOX_TEST_POSTGRES_URL`, or the local test database.
pub fn test_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A random name such as `outbox_t_1f2e3d4c5b6a7980`.
pub fn random_name(prefix: &str) -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &hex[..16])
}

/// A configuration for a new, random table.
pub fn fresh_config() -> PostgresStoreConfig {
    PostgresStoreConfig::new(test_url()).table(random_name("outbox_t"))
}

/// Connect a store, failing the test with a clear message when PostgreSQL is unreachable.
pub async fn connect(config: PostgresStoreConfig) -> PostgresStore {
    match PostgresStore::connect(config).await {
        Ok(store) => store,
        Err(e) => panic!(
            "PostgreSQL is required for this test (set OUTBOX_TEST_POSTGRES_URL, default \
             postgres://postgres@127.0.0.1:5432/test): {e}"
        ),
    }
}

/// A plain connection to the test database.
pub async fn raw_connection() -> PgConnection {
    PgConnection::connect(&test_url())
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL is required for this test: {e}"))
}

/// Drop an outbox table and forget its migrations.
pub async fn drop_table(table: &TableName) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        table.quoted()
    )))
    .await
    .expect("drop table");
    let schema = table.schema().unwrap_or("public");
    let regclass = format!("\"{schema}\".outbox_relay_schema");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&regclass)
        .fetch_one(&mut conn)
        .await
        .expect("look up outbox_relay_schema");
    if exists {
        sqlx::query(&format!("DELETE FROM {regclass} WHERE table_name = $1"))
            .bind(table.name())
            .execute(&mut conn)
            .await
            .expect("forget migrations");
    }
    let _ = conn.close().await;
}

/// Drop a whole schema.
pub async fn drop_schema(schema: &str) {
    let mut conn = raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .await
    .expect("drop schema");
    let _ = conn.close().await;
}
