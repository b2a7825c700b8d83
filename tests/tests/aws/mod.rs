//! What the AWS brokers' end-to-end tests share (SQS in `postgres_sqs.rs`, SNS in
//! `postgres_sns.rs`): the same scenarios, read back through an SQS queue.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

/// An event of 300 KiB ends dead with an error `expected_error` accepts, while the others
/// flow (see `Scenario::oversized_event_ends_dead`).
pub async fn an_event_over_256_kib_ends_dead_while_others_flow(
    name: &str,
    broker: Arc<dyn BrokerSide>,
    expected_error: impl Fn(&str) -> bool,
) {
    let mut scenario = Scenario::on_postgres(name, broker, Settings::default()).await;
    scenario
        .oversized_event_ends_dead(300, expected_error)
        .await;
    scenario.cleanup().await;
}

/// A LocalStack of the test's own (on a free port), a FIFO destination of the sink `kind` on it
/// (`sqs`: a queue; `sns`: a topic, read through the queue subscribed to it; two consumers),
/// then [`frozen_for_30s_under_steady_writes`]: only that server is frozen, and it is stopped
/// at the end, whatever the outcome.
pub async fn own_server_frozen_for_30s_under_steady_writes(kind: &str) {
    let name = unique(kind);
    let server = Arc::new(OwnSqsServer::start(&name).await);
    let endpoint = &server.endpoint;
    match kind {
        "sqs" => {
            let sqs = Arc::new(SqsSide::fifo_at(endpoint, &name).await.consumers(2));
            frozen_for_30s_under_steady_writes(&name, server.clone(), sqs.clone(), &sqs).await;
        }
        "sns" => {
            let sns = Arc::new(SnsSide::fifo_at(endpoint, &name).await.consumers(2));
            frozen_for_30s_under_steady_writes(&name, server.clone(), sns.clone(), sns.queue())
                .await;
        }
        other => panic!("not an AWS sink: {other}"),
    }
    drop(server);
}

/// The private server frozen (SIGSTOP) for 30 s under steady writes, as the scenario's fault
/// (`Scenario::run`): nothing lost, each aggregate's events in order in the queue (its
/// `SequenceNumber` order: `SqsSide::read_back` of a FIFO queue), the relay recovers by itself
/// and reported the outage on `/readyz` and in its log. `reader` is the queue the broker side
/// reads (`broker` itself, or behind it). Prints the recovery figures.
async fn frozen_for_30s_under_steady_writes(
    name: &str,
    server: Arc<OwnSqsServer>,
    broker: Arc<dyn BrokerSide>,
    reader: &SqsSide,
) {
    let mut scenario = Scenario::on_postgres(
        name,
        broker,
        Settings::default().sink("request_timeout = \"3s\"\nretry_attempts = 2"),
    )
    .await;
    // Steady writes: one event every 50 ms over 40 aggregates (about 20 a second); the server
    // frozen once a third is written, writes going on through the freeze and about 5 s after.
    let plan = Plan::with_fault(Scale::trickle(1_000, 40), server, Duration::from_secs(30))
        .pausing(Duration::from_millis(50))
        .watching_health();
    let run = scenario.run(plan).await;

    let outage = run.outage.as_ref().expect("the outage was watched");
    let (_, log) = &run.relay_logs[0];
    // The order the queue took the events in is the relay's, checked by the scenario; the
    // order the consumers got them in is the emulator's after a freeze (see
    // `SqsSide::received_in_queue_order`): reported.
    let as_received = check_delivery(&run.writes.committed, &reader.received());
    println!(
        "outage: {} events committed ({} during the {:.1}s freeze); /readyz 503 during the \
         freeze: {}; ready again {:.1}s after the thaw; consumer retried {} calls and received \
         {} out of their group's order",
        run.writes.committed.len(),
        outage.written_during,
        outage.held.as_secs_f64(),
        outage.not_ready_seen,
        outage.ready_after,
        reader.consumer_errors(),
        as_received.order_violations.len()
    );
    assert!(
        outage.written_during > 100,
        "writes went on during the outage: {}",
        outage.written_during
    );
    assert!(
        outage.not_ready_seen,
        "/readyz never reported the outage; log:\n{log}"
    );
    assert!(
        log.contains("publishing failed as a whole"),
        "the relay never saw the outage; log:\n{log}"
    );
    scenario.cleanup().await;
}
