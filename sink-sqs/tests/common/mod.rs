//! Shared by the SQS integration tests: what is particular to this sink — building it with
//! the test credentials, and the harness's SQS side reading its overflow attribute.

#![allow(dead_code)]

use outboxkit_aws::testkit;
use outboxkit_harness::{sqs_endpoint, SqsSide};
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
