//! `kind = "postgres"` (feature `store-postgres`).

use std::sync::Arc;

use crate::registry::{BoxFuture, Registry};

fn postgres(
    s: &crate::settings::StoreSettings,
) -> BoxFuture<'_, outboxkit_core::Result<Arc<dyn outboxkit_core::Store>>> {
    Box::pin(async move {
        let config = outboxkit_store_postgres::PostgresStoreConfig {
            url: s.url.clone(),
            table: s.table.clone(),
            shards: s.shards,
            pool_size: s.pool_size,
            connect_timeout: s.connect_timeout,
            session_timeout: s.session_timeout,
        };
        config.validate()?;
        let store = outboxkit_store_postgres::PostgresStore::connect(config).await?;
        Ok(Arc::new(store) as Arc<dyn outboxkit_core::Store>)
    })
}

/// Register `kind = "postgres"`.
pub fn register(registry: &mut Registry) {
    registry.register_store("postgres", postgres);
}
