//! The sink conformance suite of `outboxkit-core` against the real Redis
//! (`OUTBOX_TEST_REDIS_URL`, default `redis://127.0.0.1:6379`).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ReceivedMessage, SinkHarness};
use outboxkit_core::Sink;
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
use redis::aio::MultiplexedConnection;
use uuid::Uuid;

struct RedisHarness {
    admin: MultiplexedConnection,
}

impl RedisHarness {
    async fn new() -> Self {
        Self {
            admin: common::admin_connection().await,
        }
    }
}

#[async_trait]
impl SinkHarness for RedisHarness {
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        let config = RedisStreamsConfig {
            stream: destination_template.to_owned(),
            ..RedisStreamsConfig::new(common::redis_url())
        };
        match RedisStreamsSink::connect(config).await {
            Ok(sink) => Box::new(sink),
            Err(e) => panic!("connecting the sink: {e}"),
        }
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        let config = RedisStreamsConfig {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            ..RedisStreamsConfig::new("redis://127.0.0.1:1")
        };
        Box::new(RedisStreamsSink::connect_lazy(config).expect("a valid configuration"))
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        let mut admin = self.admin.clone();
        let deadline = Instant::now() + timeout;
        let entries = loop {
            let entries = common::xrange(&mut admin, destination).await;
            if entries.len() >= expected || Instant::now() >= deadline {
                break entries;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !entries.is_empty() {
            common::expire_soon(&mut admin, destination).await;
        }
        entries
            .iter()
            .map(|entry| ReceivedMessage {
                event_id: Uuid::parse_str(&entry.text("event_id")).expect("event_id is a UUID"),
                aggregate_id: entry.text("aggregate_id"),
                event_type: entry.text("event_type"),
                payload: entry.field("payload").expect("payload field").to_vec(),
                headers: serde_json::from_str::<BTreeMap<String, String>>(&entry.text("headers"))
                    .expect("headers field is a JSON object of strings"),
            })
            .collect()
    }
}

outboxkit_core::sink_suite!(RedisHarness::new().await);
