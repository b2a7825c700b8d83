//! The sink conformance suite of `outboxkit-core` against a real SQS-API server
//! (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack on `http://127.0.0.1:4566`), on standard
//! queues. FIFO queues are covered by `tests/sqs.rs`.

mod common;

use std::time::Duration;

use async_trait::async_trait;
use outboxkit_core::testkit::sink_suite::{ReceivedMessage, SinkHarness};
use outboxkit_core::Sink;
use outboxkit_sink_sqs::SqsConfig;
use uuid::Uuid;

struct SqsHarness {
    admin: aws_sdk_sqs::Client,
}

impl SqsHarness {
    async fn new() -> Self {
        let admin = common::admin();
        common::require_server(&admin).await;
        Self { admin }
    }
}

#[async_trait]
impl SinkHarness for SqsHarness {
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        Box::new(common::sink(common::config(destination_template)))
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        let config = SqsConfig {
            endpoint: Some("http://127.0.0.1:1".to_owned()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            ..common::config("{aggregate_type}")
        };
        Box::new(common::sink(config))
    }

    async fn prepare_destination(&self, destination: &str) {
        common::create_queue(&self.admin, destination, &[]).await;
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        let url = match self
            .admin
            .get_queue_url()
            .queue_name(destination)
            .send()
            .await
        {
            Ok(answer) => answer.queue_url().expect("a queue URL").to_owned(),
            Err(_) => return Vec::new(),
        };
        let received = common::receive_all(&self.admin, &url, expected, timeout).await;
        if received.len() >= expected {
            common::delete_queue(&self.admin, &url).await;
        }
        received
            .into_iter()
            .map(|m| {
                let mut headers = m.attributes.clone();
                let event_id = headers.remove("event_id").expect("event_id attribute");
                let aggregate_id = headers
                    .remove("aggregate_id")
                    .expect("aggregate_id attribute");
                let event_type = headers.remove("event_type").expect("event_type attribute");
                ReceivedMessage {
                    event_id: Uuid::parse_str(&event_id).expect("event_id is a UUID"),
                    aggregate_id,
                    event_type,
                    payload: m.body.into_bytes(),
                    headers,
                }
            })
            .collect()
    }
}

outboxkit_core::sink_suite!(SqsHarness::new().await);
