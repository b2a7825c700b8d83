//! Factories of the adapters this project ships, each behind its cargo feature.

#[cfg(any(feature = "store-postgres", feature = "sink-redis-streams"))]
use std::sync::Arc;

#[cfg(any(feature = "store-postgres", feature = "sink-redis-streams"))]
use crate::registry::{BoxFuture, Registry};

#[cfg(feature = "store-postgres")]
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
#[cfg(feature = "store-postgres")]
pub fn register_postgres(registry: &mut Registry) {
    registry.register_store("postgres", postgres);
}

/// `[sink.redis_streams]` with `sink.destination` applied, checked; errors name the key and
/// where it was set.
#[cfg(feature = "sink-redis-streams")]
fn redis_streams_config(
    ctx: crate::registry::FactoryContext<'_>,
) -> outbox_core::Result<outbox_sink_redis_streams::RedisStreamsConfig> {
    use crate::settings::{locate, sink_section};
    use outbox_core::Error;

    let file = ctx.file.map(|p| p.as_path());
    let mut config: outbox_sink_redis_streams::RedisStreamsConfig =
        sink_section(ctx.figment, "redis_streams", file).map_err(|e| Error::config(e.0))?;
    if let Some(destination) = &ctx.settings.sink.destination {
        outbox_core::DestinationTemplate::parse(destination).map_err(|e| {
            let e = e.context("sink.destination");
            Error::config(locate(e.message(), ctx.figment, file))
        })?;
        config.stream = destination.clone();
    }
    config
        .validate()
        .map_err(|e| Error::config(locate(e.message(), ctx.figment, file)))?;
    Ok(config)
}

#[cfg(feature = "sink-redis-streams")]
fn redis_streams(
    ctx: crate::registry::FactoryContext<'_>,
) -> BoxFuture<'_, outbox_core::Result<Arc<dyn outbox_core::Sink>>> {
    Box::pin(async move {
        let config = redis_streams_config(ctx)?;
        let sink = outbox_sink_redis_streams::RedisStreamsSink::connect(config).await?;
        Ok(Arc::new(sink) as Arc<dyn outbox_core::Sink>)
    })
}

/// Register `kind = "redis-streams"` (settings in `[sink.redis_streams]`).
#[cfg(feature = "sink-redis-streams")]
pub fn register_redis_streams(registry: &mut Registry) {
    registry.register_sink("redis-streams", redis_streams);
    registry.register_sink_check("redis-streams", |ctx| redis_streams_config(ctx).map(drop));
}
