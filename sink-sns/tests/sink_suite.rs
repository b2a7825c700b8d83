//! The sink conformance suite of `outboxkit-core` against a real SNS-API server
//! (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack on `http://127.0.0.1:4566`), on standard
//! topics, read back through subscribed SQS queues by the harness's SNS side. FIFO topics are
//! covered by `tests/sns.rs`.

use crate::common;

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::ConfigHarness;
use outboxkit_harness::SnsSide;
use outboxkit_sink_sns::SnsConfig;

async fn harness() -> ConfigHarness<SnsConfig, SnsSide> {
    let reader = common::server().await;
    reader.require_server().await;
    let unreachable = SnsConfig {
        endpoint: Some("http://127.0.0.1:1".to_owned()),
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..common::config("{aggregate_type}")
    };
    let config = common::config("{aggregate_type}");
    ConfigHarness::new(config, unreachable, common::sink, reader)
}

outboxkit_core::sink_suite!(harness().await);
