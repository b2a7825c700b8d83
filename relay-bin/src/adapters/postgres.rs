//! `kind = "postgres"` (feature `store-postgres`).

use std::sync::Arc;

use crate::registry::{BoxFuture, Registry};

fn postgres(
    s: &crate::settings::StoreSettings,
) -> BoxFuture<'_, outbox_core::Result<Arc<dyn outbox_core::Store>>> {
    Box::pin(async move {
        let config = outbox_store_postgres::PostgresStoreConfig {
            url: s.url.clone(),
            table: s.table.clone(),
            shards: s.shards,
            pool_size: s.pool_size,
            connect_timeout: s.connect_timeout,
            session_timeout: s.session_timeout,
        };
        config.validate()?;
        let store = outbox_store_postgres::PostgresStore::connect(config).await?;
        Ok(Arc::new(store) as Arc<dyn outbox_core::Store>)
    })
}

/// Register `kind = "postgres"`.
pub fn register(registry: &mut Registry) {
    registry.register_store("postgres", postgres);
}
