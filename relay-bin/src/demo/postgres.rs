//! The demo on PostgreSQL.

use std::sync::Arc;

use async_trait::async_trait;
use outboxkit_core::Store;
use outboxkit_store_postgres::sqlx::{self, Row};
use outboxkit_store_postgres::{Outbox, PostgresStore, PostgresStoreConfig};
use uuid::Uuid;

use super::{order_event, DemoArgs, DemoDatabase, DEMO_SHARDS, ORDERS, TABLE};
use crate::cli::Failure;

struct PostgresDemo {
    store: Arc<PostgresStore>,
    outbox: Outbox,
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoDatabase>, Failure> {
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let config = PostgresStoreConfig::new(url)
        .table(TABLE)
        .shards(DEMO_SHARDS);
    let store = Arc::new(PostgresStore::connect(config).await?);
    store.migrate().await?;
    let pool = store.pool();
    let db = |e: sqlx::Error| Failure::runtime(format!("preparing the demo tables: {e}"));
    sqlx::query(&format!("DELETE FROM {TABLE}"))
        .execute(pool)
        .await
        .map_err(db)?;
    sqlx::query(&format!("DROP TABLE IF EXISTS {ORDERS}"))
        .execute(pool)
        .await
        .map_err(db)?;
    sqlx::query(&format!(
        "CREATE TABLE {ORDERS} (id bigint PRIMARY KEY, version bigint NOT NULL)"
    ))
    .execute(pool)
    .await
    .map_err(db)?;
    sqlx::query(&format!(
        "INSERT INTO {ORDERS} SELECT g, 0 FROM generate_series(1, $1) g"
    ))
    .bind(args.aggregates as i64)
    .execute(pool)
    .await
    .map_err(db)?;
    Ok(Arc::new(PostgresDemo {
        store,
        outbox: Outbox::new(TABLE)?,
    }))
}

#[async_trait]
impl DemoDatabase for PostgresDemo {
    fn describe(&self) -> String {
        format!("{} (business table {ORDERS})", self.store.describe())
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn write_order_event(&self, order: i64) -> Result<Uuid, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        let row = sqlx::query(&format!(
            "UPDATE {ORDERS} SET version = version + 1 WHERE id = $1 RETURNING version"
        ))
        .bind(order)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let event = order_event(order, row.get::<i64, _>(0));
        self.outbox
            .enqueue(&mut tx, &event)
            .await
            .map_err(|e| e.full_message())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(event.event_id_or_new())
    }
}
