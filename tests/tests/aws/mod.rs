//! What the AWS brokers' end-to-end tests share (SQS in `postgres_sqs.rs`, SNS in
//! `postgres_sns.rs`): the same scenarios, read back through an SQS queue.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::*;
use uuid::Uuid;

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
    let server = OwnSqsServer::start(&name).await;
    let endpoint = &server.endpoint;
    match kind {
        "sqs" => {
            let sqs = Arc::new(SqsSide::fifo_at(endpoint, &name).await.consumers(2));
            frozen_for_30s_under_steady_writes(&name, &server, sqs.clone(), &sqs).await;
        }
        "sns" => {
            let sns = Arc::new(SnsSide::fifo_at(endpoint, &name).await.consumers(2));
            frozen_for_30s_under_steady_writes(&name, &server, sns.clone(), sns.queue()).await;
        }
        other => panic!("not an AWS sink: {other}"),
    }
    drop(server);
}

/// The private server frozen (SIGSTOP) for 30 s under steady writes: nothing lost, each
/// aggregate's events in order in the queue, the relay recovers by itself; `reader` is the
/// queue the broker side reads (`broker` itself, or behind it). Prints the recovery figures.
async fn frozen_for_30s_under_steady_writes(
    name: &str,
    server: &OwnSqsServer,
    broker: Arc<dyn BrokerSide>,
    reader: &SqsSide,
) {
    let port = free_port();
    let mut scenario = Scenario::on_postgres(
        name,
        broker,
        Settings::default()
            .listen_on(port)
            .sink("request_timeout = \"3s\"\nretry_attempts = 2"),
    )
    .await;
    scenario.start_relay("relay-outage", &[]);

    // Steady writes: one event every 50 ms over 40 aggregates, until told to stop.
    let writers = scenario
        .start_writers(&WriterPlan::steady(1, 40, Duration::from_millis(50)))
        .await;
    wait_for("events flowing", Duration::from_secs(60), || {
        let n = reader.distinct().len();
        async move { n >= 100 }
    })
    .await;
    wait_for_ready(
        "/readyz before the outage",
        port,
        200,
        Duration::from_secs(20),
    )
    .await;

    // The outage: the server frozen for 30 s while writes go on.
    server.freeze();
    let frozen_at = Instant::now();
    let written_before = writers.written();
    let mut not_ready_seen = false;
    while frozen_at.elapsed() < Duration::from_secs(30) {
        if matches!(http_get(port, "/readyz"), Some((503, _))) {
            not_ready_seen = true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let written_during = writers.written() - written_before;
    let relay = &mut scenario.relays[0];
    assert!(
        relay.is_running(),
        "the relay died during the outage:\n{}",
        relay.log_text()
    );
    server.thaw();
    let thawed_at = Instant::now();

    wait_for_ready(
        "/readyz after the outage",
        port,
        200,
        Duration::from_secs(60),
    )
    .await;
    let ready_after = thawed_at.elapsed().as_secs_f64();
    scenario
        .drain("the backlog to drain", Duration::from_secs(120))
        .await;
    let drained_after = thawed_at.elapsed().as_secs_f64();
    // Some more steady writes after the recovery.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = writers.finish().await;
    scenario
        .drain("the backlog to drain", Duration::from_secs(60))
        .await;
    let expected: HashSet<Uuid> = writes.committed.keys().copied().collect();
    reader
        .wait_for_all(&expected, Duration::from_secs(120))
        .await;

    let status = scenario.status();
    assert_eq!(status["dead"], 0, "{status}");
    let relay = &mut scenario.relays[0];
    let log = relay.log_text();
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    let consumer_errors = reader.consumer_errors();
    // The order the queue took the events in is the relay's; the order the consumers got them
    // in is the emulator's after a freeze (see `SqsSide::received_in_queue_order`): reported.
    let check = check_delivery(&writes.committed, &reader.received_in_queue_order());
    let as_received = check_delivery(&writes.committed, &reader.received());
    let received_out_of_order = as_received.order_violations.len();
    println!(
        "outage: {} events committed ({written_during} during the 30 s freeze); /readyz 503 during \
         the freeze: {not_ready_seen}; ready again {ready_after:.1}s and backlog drained {drained_after:.1}s \
         after the thaw; read back {} messages, {} distinct, {} duplicates; consumer retried \
         {consumer_errors} calls and received {received_out_of_order} out of their group's order",
        writes.committed.len(),
        check.messages,
        check.distinct,
        check.duplicates
    );
    assert!(written_during > 100, "writes went on during the outage");
    assert!(
        not_ready_seen,
        "/readyz never reported the outage; log:\n{log}"
    );
    assert!(
        log.contains("publishing failed as a whole"),
        "the relay never saw the outage; log:\n{log}"
    );
    assert!(
        check.missing.is_empty(),
        "{} events lost",
        check.missing.len()
    );
    assert!(
        check.unexpected.is_empty(),
        "{:?}",
        &check.unexpected[..check.unexpected.len().min(5)]
    );
    assert!(
        check.order_violations.is_empty(),
        "per-group order broken in the queue: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    scenario.cleanup().await;
}
