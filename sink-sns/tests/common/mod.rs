//! Shared by the SNS integration tests: building the sink with the test credentials, and the
//! harness's SNS side (topics read back through subscribed SQS queues) merging its overflow
//! attribute, and the shared cases' fixture on topics.

#![allow(dead_code)]

use async_trait::async_trait;
use outboxkit_aws::testkit::{self, Fields, READ_TIMEOUT};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::SOURCE_TEMPLATE;
use outboxkit_harness::{sqs_endpoint, SnsSide, SqsMessage};
use outboxkit_sink_sns::{SnsConfig, SnsSink, OVERFLOW_ATTRIBUTE};

/// A sink configuration for the test server routing with `topic`.
pub fn config(topic: &str) -> SnsConfig {
    SnsConfig {
        endpoint: Some(sqs_endpoint()),
        region: Some("us-east-1".to_owned()),
        ..SnsConfig::new(topic)
    }
}

/// A sink built from `config` with the dummy credentials `test`/`test` LocalStack accepts.
pub fn sink(config: SnsConfig) -> outboxkit_core::Result<SnsSink> {
    SnsSink::from_sdk_config(config, &testkit::sdk_config())
}

/// The harness's SNS side on the test server, merging the sink's overflow attribute.
pub async fn server() -> SnsSide {
    SnsSide::standard("sink-sns")
        .await
        .json_attribute(OVERFLOW_ATTRIBUTE)
}

/// Create topic `name` and a queue of the same name subscribed to it (raw delivery): the
/// topic's ARN and the queue's URL.
pub async fn topic(sns: &SnsSide, name: &str) -> (String, String) {
    let arn = sns.create_topic(name).await;
    let url = sns.queue().create_queue(name, &[]).await;
    sns.subscribe(&arn, &url).await;
    (arn, url)
}

/// The shared cases' fixture (see [`testkit::Fixture`]): destinations are topics, each read
/// back through a queue of the same name subscribed to it, known by the topic's ARN and the
/// queue's URL.
pub struct Topics {
    pub server: SnsSide,
}

/// The fixture on the test server.
pub async fn topics() -> Topics {
    Topics {
        server: server().await,
    }
}

#[async_trait]
impl testkit::Fixture for Topics {
    type Sink = SnsSink;
    type Destination = (String, String);
    type Message = SqsMessage;

    async fn create(&self, name: &str) -> (String, String) {
        topic(&self.server, name).await
    }

    /// SNS refuses messages past 256 KiB on every topic.
    async fn create_capped(&self, name: &str) -> (String, String) {
        self.create(name).await
    }

    fn sink(&self, route: &str) -> SnsSink {
        sink(config(route)).expect("a valid sink configuration")
    }

    fn cloudevents_sink(&self, route: &str) -> SnsSink {
        let config = SnsConfig {
            format: Format::CloudEvents,
            cloudevents_source: SOURCE_TEMPLATE.to_owned(),
            ..config(route)
        };
        sink(config).expect("a valid sink configuration")
    }

    async fn receive(&self, (_, url): &(String, String), expected: usize) -> Vec<SqsMessage> {
        let queue = self.server.queue();
        queue.receive_all(url, expected, READ_TIMEOUT).await
    }

    fn fields(message: &SqsMessage) -> Fields<'_> {
        message.fields()
    }

    async fn delete(&self, (arn, url): (String, String)) {
        self.server.queue().delete_queue(&url).await;
        self.server.delete_topic(&arn).await;
    }
}
