//! The sink conformance suite of `outboxkit-core` once more, over TLS: every case starts its own
//! private TLS-only Redis (`PrivateRedis`, no plain TCP port; nextest runs each case in a
//! process of its own, and a server with a fresh test PKI starts in a few tens of milliseconds),
//! the sink connects with `rediss://` and `tls.ca_file`, the harness's TLS side reads back.

use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ConfigHarness, ReceivedMessage, SuiteConsumer};
use outboxkit_harness::tls::TestPki;
use outboxkit_harness::{scratch_dir, unique, PrivateRedis, RedisSide};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink, TlsConfig};

/// The harness's Redis side over TLS, and the private server it reads, which lives as long as
/// the case (stopped on drop).
struct TlsReader {
    side: RedisSide,
    _server: PrivateRedis,
}

#[async_trait]
impl SuiteConsumer for TlsReader {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        self.side.read_back(to, expected, wait).await
    }
}

async fn harness() -> ConfigHarness<RedisStreamsConfig, TlsReader> {
    let name = unique("redis_tls_suite");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let server = PrivateRedis::start(&name, &pki, false);
    let tls = TlsConfig {
        ca_file: Some(pki.ca.clone()),
        ..TlsConfig::default()
    };
    let config = RedisStreamsConfig {
        tls: tls.clone(),
        ..RedisStreamsConfig::new(server.url())
    };
    let unreachable = RedisStreamsConfig {
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_secs(5),
        tls,
        ..RedisStreamsConfig::new("rediss://127.0.0.1:1")
    };
    let reader = TlsReader {
        side: server.side("suite").await,
        _server: server,
    };
    ConfigHarness::new(config, unreachable, RedisStreamsSink::connect_lazy, reader)
}

outboxkit_core::sink_suite!(harness().await);
