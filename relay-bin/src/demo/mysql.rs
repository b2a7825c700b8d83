//! The demo on MySQL / MariaDB.

use std::sync::Arc;

use async_trait::async_trait;
use outboxkit_core::Store;
use outboxkit_store_mysql::sqlx;
use outboxkit_store_mysql::{MySqlStore, MySqlStoreConfig, Outbox};
use uuid::Uuid;

use super::{order_event, DemoArgs, DemoDatabase, DEMO_SHARDS, ORDERS, TABLE};
use crate::cli::Failure;

/// Orders inserted per statement when the demo fills its business table.
const ORDERS_PER_INSERT: u64 = 1000;

struct MySqlDemo {
    store: Arc<MySqlStore>,
    outbox: Outbox,
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoDatabase>, Failure> {
    let url = args
        .database_url
        .clone()
        .unwrap_or_else(|| "mysql://root@127.0.0.1:3306/test".to_owned());
    let config = MySqlStoreConfig::new(url).table(TABLE).shards(DEMO_SHARDS);
    let store = Arc::new(MySqlStore::connect(config).await?);
    store.migrate().await?;
    let pool = store.pool();
    let db = |e: sqlx::Error| Failure::runtime(format!("preparing the demo tables: {e}"));
    let outbox_table = store.table().quoted();
    // The business table lives next to the outbox table, in the URL's database.
    let orders = ORDERS;
    sqlx::query(&format!("DELETE FROM {outbox_table}"))
        .execute(pool)
        .await
        .map_err(db)?;
    sqlx::query(&format!("DROP TABLE IF EXISTS {orders}"))
        .execute(pool)
        .await
        .map_err(db)?;
    sqlx::query(&format!(
        "CREATE TABLE {orders} (id BIGINT PRIMARY KEY, version BIGINT NOT NULL) ENGINE = InnoDB"
    ))
    .execute(pool)
    .await
    .map_err(db)?;
    let mut next = 1;
    while next <= args.aggregates {
        let last = (next + ORDERS_PER_INSERT - 1).min(args.aggregates);
        let values: Vec<String> = (next..=last).map(|id| format!("({id}, 0)")).collect();
        sqlx::query(&format!(
            "INSERT INTO {orders} (id, version) VALUES {}",
            values.join(", ")
        ))
        .execute(pool)
        .await
        .map_err(db)?;
        next = last + 1;
    }
    Ok(Arc::new(MySqlDemo {
        outbox: store.outbox().clone(),
        store,
    }))
}

#[async_trait]
impl DemoDatabase for MySqlDemo {
    fn describe(&self) -> String {
        format!("{} (business table {ORDERS})", self.store.describe())
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn write_order_event(&self, order: i64) -> Result<Uuid, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        // The update locks the order's row until commit: its events get ids in commit order.
        sqlx::query(&format!(
            "UPDATE {ORDERS} SET version = version + 1 WHERE id = ?"
        ))
        .bind(order)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let version: i64 =
            sqlx::query_scalar(&format!("SELECT version FROM {ORDERS} WHERE id = ?"))
                .bind(order)
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| e.to_string())?;
        let event = order_event(order, version);
        self.outbox
            .enqueue(&mut tx, &event)
            .await
            .map_err(|e| e.full_message())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(event.event_id_or_new())
    }
}
