//! The store conformance suite of outboxkit-core, on a real MySQL / MariaDB.

mod common;

use std::sync::Mutex;

use async_trait::async_trait;
use outboxkit_core::testkit::store_suite::StoreFactory;
use outboxkit_core::Store;
use outboxkit_store_mysql::TableName;

/// Each store on a new random table; the tables are dropped when a case passes.
#[derive(Debug, Default)]
struct MySqlFactory {
    tables: Mutex<Vec<TableName>>,
}

#[async_trait]
impl StoreFactory for MySqlFactory {
    async fn fresh_store(&self) -> Box<dyn Store> {
        let store = common::connect(common::fresh_config()).await;
        self.tables
            .lock()
            .expect("tables lock")
            .push(store.table().clone());
        Box::new(store)
    }

    async fn cleanup(&self) {
        let tables = std::mem::take(&mut *self.tables.lock().expect("tables lock"));
        for table in &tables {
            common::drop_table(table).await;
        }
    }
}

outboxkit_core::store_suite!(MySqlFactory::default());
