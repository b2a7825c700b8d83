//! The sink conformance suite of `outboxkit-core` against the real RabbitMQ
//! (`OUTBOX_TEST_RABBITMQ_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`), read back by
//! the harness's RabbitMQ side: destinations are routing keys on the test exchange, each read
//! from a queue of its name bound for it.

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::ConfigHarness;
use outboxkit_harness::{rabbitmq_url, RabbitMqSide};
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink};

/// The durable topic exchange the tests publish to (each test uses its own routing keys).
const TEST_EXCHANGE: &str = "outbox.tests";

async fn harness() -> ConfigHarness<RabbitMqConfig, RabbitMqSide> {
    let reader = RabbitMqSide::open(TEST_EXCHANGE).await;
    reader.declare_exchange().await;
    let unreachable = RabbitMqConfig {
        connect_timeout: Duration::from_secs(2),
        confirm_timeout: Duration::from_secs(5),
        ..RabbitMqConfig::new("amqp://guest:guest@127.0.0.1:1/%2f", TEST_EXCHANGE)
    };
    let config = RabbitMqConfig::new(rabbitmq_url(), TEST_EXCHANGE);
    ConfigHarness::new(config, unreachable, RabbitMqSink::connect_lazy, reader)
}

outboxkit_core::sink_suite!(harness().await);
