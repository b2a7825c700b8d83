//! End to end: PostgreSQL → `outbox-relay run` → SNS (LocalStack with SNS, started by
//! `scripts/services.sh sqs`), read back by an independent consumer of an SQS queue subscribed
//! to the topic with raw message delivery. (The scenario itself, on standard and FIFO topics,
//! runs in `matrix.rs`.) The same scenarios as `postgres_sqs.rs`, from `aws/mod.rs`:
//!
//! - an event over 256 KiB ends dead (over the sink's `max_payload_bytes`) while the others
//!   flow;
//! - the test's own LocalStack frozen (SIGSTOP) for 30 s under steady writes to a FIFO topic:
//!   nothing lost, per-group order kept, the relay recovers by itself.
//!
//! Environment: `OUTBOX_TEST_SQS_ENDPOINT` (default `http://127.0.0.1:4566`),
//! `OUTBOX_TEST_LOCALSTACK_PYTHON` (default `/opt/outbox-relay/localstack-venv/bin/python`).

use std::sync::Arc;

use outboxkit_harness::*;

use crate::aws;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_256_kib_ends_dead_while_others_flow() {
    let name = unique("e2e_sns_big");
    let sns = Arc::new(SnsSide::standard(&name).await.consumers(2));
    aws::an_event_over_256_kib_ends_dead_while_others_flow(&name, sns, |error| {
        error.contains("larger than the sns sink accepts (262144 bytes)")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sns_frozen_for_30s_under_steady_writes_loses_nothing_and_recovers_by_itself() {
    aws::own_server_frozen_for_30s_under_steady_writes("sns").await;
}
