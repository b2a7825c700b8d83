//! The sink conformance suite of `outboxkit-core` against the real Kafka-API broker
//! (`OUTBOX_TEST_KAFKA_BOOTSTRAP`, default `127.0.0.1:9092`; `scripts/services.sh` starts
//! one). Each case creates its topics with 3 partitions and reads them back with a plain
//! consumer over all partitions.

mod common;

use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ReceivedMessage, SinkHarness};
use outboxkit_core::Sink;
use outboxkit_sink_kafka::{KafkaSink, KafkaSinkConfig};
use uuid::Uuid;

struct KafkaHarness;

#[async_trait]
impl SinkHarness for KafkaHarness {
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        Box::new(common::connect(common::config(destination_template)).await)
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        let config = KafkaSinkConfig {
            delivery_timeout: Duration::from_secs(5),
            check_timeout: Duration::from_secs(3),
            ..KafkaSinkConfig::new("127.0.0.1:1")
        };
        Box::new(KafkaSink::new(config).expect("a valid configuration"))
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        common::read_topic(destination, expected, timeout)
            .await
            .into_iter()
            .map(|m| {
                let event_id = m.header("event_id").expect("event_id header");
                let aggregate_id = m.header("aggregate_id").expect("aggregate_id header");
                assert_eq!(m.key_text(), aggregate_id, "key = aggregate_id");
                ReceivedMessage {
                    event_id: Uuid::parse_str(event_id).expect("event_id is a UUID"),
                    aggregate_id: aggregate_id.to_owned(),
                    event_type: m
                        .header("event_type")
                        .expect("event_type header")
                        .to_owned(),
                    payload: m.payload.clone(),
                    headers: m.header_map(),
                }
            })
            .collect()
    }

    async fn prepare_destination(&self, destination: &str) {
        common::create_topic(destination, &[]).await;
    }
}

outboxkit_core::sink_suite!(KafkaHarness);
