//! Shared by the SNS integration tests: building the sink with the test credentials, and the
//! harness's SNS side (topics read back through subscribed SQS queues) merging its overflow
//! attribute.

#![allow(dead_code)]

use outboxkit_aws::testkit;
use outboxkit_harness::{sqs_endpoint, SnsSide};
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
