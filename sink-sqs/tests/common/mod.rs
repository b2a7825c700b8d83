//! Shared by the SQS integration tests: what is particular to this sink — building it with
//! the test credentials, the harness's SQS side reading its overflow attribute, and the shared
//! cases' fixture on queues.

#![allow(dead_code)]

use async_trait::async_trait;
use aws_sdk_sqs::types::QueueAttributeName;
use outboxkit_aws::testkit::{self, Fields, READ_TIMEOUT};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::SOURCE_TEMPLATE;
use outboxkit_harness::{sqs_endpoint, SqsMessage, SqsSide};
use outboxkit_sink_sqs::{SqsConfig, SqsSink, OVERFLOW_ATTRIBUTE};

/// A sink configuration for the test server routing with `queue`.
pub fn config(queue: &str) -> SqsConfig {
    SqsConfig {
        endpoint: Some(sqs_endpoint()),
        region: Some("us-east-1".to_owned()),
        ..SqsConfig::new(queue)
    }
}

/// A sink built from `config` with the dummy credentials `test`/`test` LocalStack accepts.
pub fn sink(config: SqsConfig) -> outboxkit_core::Result<SqsSink> {
    SqsSink::from_sdk_config(config, &testkit::sdk_config())
}

/// The harness's SQS side on the test server, merging the sink's overflow attribute.
pub async fn server() -> SqsSide {
    SqsSide::standard("sink-sqs")
        .await
        .json_attribute(OVERFLOW_ATTRIBUTE)
}

/// The shared cases' fixture (see [`testkit::Fixture`]): destinations are queues, known by
/// their URL.
pub struct Queues {
    pub server: SqsSide,
}

/// The fixture on the test server.
pub async fn queues() -> Queues {
    Queues {
        server: server().await,
    }
}

#[async_trait]
impl testkit::Fixture for Queues {
    type Sink = SqsSink;
    type Destination = String;
    type Message = SqsMessage;

    async fn create(&self, name: &str) -> String {
        self.server.create_queue(name, &[]).await
    }

    async fn create_capped(&self, name: &str) -> String {
        let size = [(QueueAttributeName::MaximumMessageSize, "262144")];
        self.server.create_queue(name, &size).await
    }

    fn sink(&self, route: &str) -> SqsSink {
        sink(config(route)).expect("a valid sink configuration")
    }

    fn cloudevents_sink(&self, route: &str) -> SqsSink {
        let config = SqsConfig {
            format: Format::CloudEvents,
            cloudevents_source: SOURCE_TEMPLATE.to_owned(),
            ..config(route)
        };
        sink(config).expect("a valid sink configuration")
    }

    async fn receive(&self, url: &String, expected: usize) -> Vec<SqsMessage> {
        self.server.receive_all(url, expected, READ_TIMEOUT).await
    }

    fn fields(message: &SqsMessage) -> Fields<'_> {
        message.fields()
    }

    async fn delete(&self, url: String) {
        self.server.delete_queue(&url).await;
    }
}
