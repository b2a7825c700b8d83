//! The sink conformance suite of `outboxkit-core` against the real RabbitMQ
//! (`OUTBOX_TEST_RABBITMQ_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`).
//!
//! Destinations are routing keys on the test exchange; `prepare_destination` declares a queue
//! named after the routing key and binds it, and `read_back` drains that queue.

mod common;

use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ReceivedMessage, SinkHarness};
use outboxkit_core::Sink;
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink};
use uuid::Uuid;

struct RabbitMqHarness {
    admin: common::Admin,
}

impl RabbitMqHarness {
    async fn new() -> Self {
        Self {
            admin: common::Admin::connect().await,
        }
    }
}

#[async_trait]
impl SinkHarness for RabbitMqHarness {
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        let config = RabbitMqConfig {
            routing_key: destination_template.to_owned(),
            ..RabbitMqConfig::new(common::rabbitmq_url(), common::TEST_EXCHANGE)
        };
        match RabbitMqSink::connect(config).await {
            Ok(sink) => Box::new(sink),
            Err(e) => panic!("connecting the sink: {e}"),
        }
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        let config = RabbitMqConfig {
            connect_timeout: Duration::from_secs(2),
            confirm_timeout: Duration::from_secs(5),
            ..RabbitMqConfig::new("amqp://guest:guest@127.0.0.1:1/%2f", common::TEST_EXCHANGE)
        };
        Box::new(RabbitMqSink::connect_lazy(config).expect("a valid configuration"))
    }

    async fn prepare_destination(&self, destination: &str) {
        self.admin
            .bind_queue(destination, common::TEST_EXCHANGE, destination, &[])
            .await;
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        let deliveries = self.admin.drain(destination, expected, timeout).await;
        deliveries
            .iter()
            .map(|delivery| {
                let message_id = delivery
                    .properties
                    .message_id()
                    .as_ref()
                    .expect("message_id is set")
                    .to_string();
                ReceivedMessage {
                    event_id: Uuid::parse_str(&message_id).expect("message_id is a UUID"),
                    aggregate_id: common::header(delivery, "aggregate_id")
                        .expect("aggregate_id header"),
                    event_type: delivery
                        .properties
                        .kind()
                        .as_ref()
                        .expect("type property")
                        .to_string(),
                    payload: delivery.data.clone(),
                    headers: common::headers(delivery),
                }
            })
            .collect()
    }
}

outboxkit_core::sink_suite!(RabbitMqHarness::new().await);
