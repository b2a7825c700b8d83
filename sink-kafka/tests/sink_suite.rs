//! The sink conformance suite of `outboxkit-core` against the real Kafka-API broker
//! (`OUTBOX_TEST_KAFKA_BOOTSTRAP`, default `127.0.0.1:9092`; `scripts/services.sh` starts
//! one), read back by the harness's Kafka side: each case's topics have 3 partitions and are
//! read by a plain consumer over all of them.

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::ConfigHarness;
use outboxkit_harness::{kafka_bootstrap, KafkaSide};
use outboxkit_sink_kafka::{KafkaSink, KafkaSinkConfig};

async fn harness() -> ConfigHarness<KafkaSinkConfig, KafkaSide> {
    let unreachable = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(5),
        check_timeout: Duration::from_secs(3),
        ..KafkaSinkConfig::new("127.0.0.1:1")
    };
    let config = KafkaSinkConfig::new(kafka_bootstrap());
    let reader = KafkaSide::open("suite").await.partitions(3);
    ConfigHarness::new(config, unreachable, KafkaSink::new, reader)
}

outboxkit_core::sink_suite!(harness().await);
