//! The sink conformance suite of `outboxkit-core` against the real Redis
//! (`OUTBOX_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`), read back by the harness's
//! Redis side.

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::ConfigHarness;
use outboxkit_harness::{redis_url, RedisSide};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};

async fn harness() -> ConfigHarness<RedisStreamsConfig, RedisSide> {
    let unreachable = RedisStreamsConfig {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
        ..RedisStreamsConfig::new("redis://127.0.0.1:1")
    };
    let config = RedisStreamsConfig::new(redis_url());
    let reader = RedisSide::open("suite").await;
    ConfigHarness::new(config, unreachable, RedisStreamsSink::connect_lazy, reader)
}

outboxkit_core::sink_suite!(harness().await);
