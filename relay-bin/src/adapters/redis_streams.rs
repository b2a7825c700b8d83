//! `kind = "redis-streams"` (feature `sink-redis-streams`).

use std::sync::Arc;

use crate::registry::{BoxFuture, Registry};

/// `[sink.redis_streams]` with `sink.destination` applied, checked; errors name the key and
/// where it was set.
fn redis_streams_config(
    ctx: crate::registry::FactoryContext<'_>,
) -> outboxkit_core::Result<outboxkit_sink_redis_streams::RedisStreamsConfig> {
    use crate::settings::{locate, sink_section};
    use outboxkit_core::Error;

    let file = ctx.file.map(|p| p.as_path());
    let mut config: outboxkit_sink_redis_streams::RedisStreamsConfig =
        sink_section(ctx.figment, "redis_streams", file).map_err(|e| Error::config(e.0))?;
    if let Some(destination) = &ctx.settings.sink.destination {
        outboxkit_core::DestinationTemplate::parse(destination).map_err(|e| {
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

fn redis_streams(
    ctx: crate::registry::FactoryContext<'_>,
) -> BoxFuture<'_, outboxkit_core::Result<Arc<dyn outboxkit_core::Sink>>> {
    Box::pin(async move {
        let config = redis_streams_config(ctx)?;
        let sink = outboxkit_sink_redis_streams::RedisStreamsSink::connect(config).await?;
        Ok(Arc::new(sink) as Arc<dyn outboxkit_core::Sink>)
    })
}

/// Register `kind = "redis-streams"` (settings in `[sink.redis_streams]`).
pub fn register(registry: &mut Registry) {
    registry.register_sink("redis-streams", redis_streams);
    registry.register_sink_check("redis-streams", |ctx| redis_streams_config(ctx).map(drop));
}
