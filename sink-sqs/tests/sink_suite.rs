//! The sink conformance suite of `outboxkit-core` against a real SQS-API server
//! (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack on `http://127.0.0.1:4566`), on standard
//! queues, read back by the harness's SQS side. FIFO queues are covered by `tests/sqs.rs`.

use crate::common;

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::ConfigHarness;
use outboxkit_harness::SqsSide;
use outboxkit_sink_sqs::SqsConfig;

async fn harness() -> ConfigHarness<SqsConfig, SqsSide> {
    let reader = common::server().await;
    reader.require_server().await;
    let unreachable = SqsConfig {
        endpoint: Some("http://127.0.0.1:1".to_owned()),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..common::config("{aggregate_type}")
    };
    let config = common::config("{aggregate_type}");
    ConfigHarness::new(config, unreachable, common::sink, reader)
}

outboxkit_core::sink_suite!(harness().await);
