//! End to end: PostgreSQL → `outbox-relay run` → SQS (LocalStack, started by
//! `scripts/services.sh`), checked by an independent consumer (`ReceiveMessage` + delete).
//! (The scenario itself, on standard and FIFO queues, runs in `matrix.rs`.)
//!
//! - FIFO: a redelivery of already delivered `event_id`s is dropped by SQS;
//! - an event over 256 KiB ends dead with SQS's error while the others flow;
//! - the SQS server frozen (SIGSTOP) for 30 s under steady writes: nothing lost, the relay
//!   recovers by itself. This test runs its own LocalStack on a free port, so freezing it never
//!   disturbs the other tests; it is always thawed and stopped, even when the test fails.
//!
//! Environment: `OUTBOX_TEST_SQS_ENDPOINT` (default `http://127.0.0.1:4566`),
//! `OUTBOX_TEST_LOCALSTACK_PYTHON` (default `/opt/outbox-relay/localstack-venv/bin/python`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_harness::*;
use uuid::Uuid;

/// FIFO: SQS drops a second copy of an `event_id` for 5 minutes, even after the first was
/// consumed and deleted. After a small scenario, enqueue 20 already delivered event ids again
/// (their rows are gone: retention = delete) plus one fresh event; once the fresh one arrived,
/// none of the 20 may have arrived a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_queue_drops_a_redelivered_event_id() {
    let name = unique("e2e_fifo");
    let sqs = Arc::new(SqsSide::fifo(&name).await);
    let mut scenario = Scenario::prepare(
        Arc::new(PostgresSide::open(&name).await),
        sqs.clone(),
        Settings::default(),
    )
    .await;
    scenario
        .run(Plan::new(Scale {
            events: 300,
            aggregates: 20,
            writers: 2,
            relays: 1,
        }))
        .await;

    let again: Vec<(Uuid, String)> = sqs
        .received()
        .iter()
        .rev()
        .take(20)
        .map(|d| (d.event_id, d.aggregate_id.clone()))
        .collect();
    let mut events: Vec<NewEvent> = again
        .iter()
        .map(|(event_id, aggregate)| {
            NewEvent::new(
                "order",
                aggregate.clone(),
                "OrderChanged",
                serde_json::json!({ "again": true }),
            )
            .event_id(*event_id)
        })
        .collect();
    let fresh = Uuid::now_v7();
    events.push(
        NewEvent::new(
            "order",
            "agg-fresh",
            "OrderChanged",
            serde_json::json!({ "fresh": true }),
        )
        .event_id(fresh),
    );
    scenario.store.enqueue_many(&events).await;
    scenario.start_relay("relay-again", &[]);
    scenario
        .drain("the backlog to drain", Duration::from_secs(60))
        .await;
    sqs.wait_for_all(&HashSet::from([fresh]), Duration::from_secs(60))
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let delivered = sqs.received();
    for (event_id, _) in &again {
        let copies = delivered.iter().filter(|d| d.event_id == *event_id).count();
        assert_eq!(
            copies, 1,
            "event {event_id} was redelivered {copies} times: FIFO deduplication failed"
        );
    }
    println!("{} redelivered event ids dropped by SQS", again.len());
    scenario
        .relays
        .last_mut()
        .unwrap()
        .stop(Duration::from_secs(20));
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_256_kib_ends_dead_with_sqs_error_while_others_flow() {
    let name = unique("e2e_big");
    let sqs = Arc::new(
        SqsSide::standard(&name)
            .await
            .attribute(QueueAttributeName::MaximumMessageSize, "262144")
            .consumers(2),
    );
    let mut scenario = Scenario::prepare(
        Arc::new(PostgresSide::open(&name).await),
        sqs.clone(),
        Settings::default(),
    )
    .await;

    // 60 events over 6 aggregates; the 11th (aggregate a4) carries 300 KiB.
    let events: Vec<NewEvent> = (0..60)
        .map(|i| {
            let payload = if i == 10 {
                serde_json::json!({ "i": i, "blob": "z".repeat(300 * 1024) })
            } else {
                serde_json::json!({ "i": i })
            };
            NewEvent::new("order", format!("a{}", i % 6), "Changed", payload)
                .event_id(Uuid::now_v7())
        })
        .collect();
    let big = events[10].event_id.unwrap();
    scenario.store.enqueue_many(&events).await;

    scenario.start_relay("relay-big", &[]);
    scenario
        .drain("the backlog to drain", Duration::from_secs(60))
        .await;
    let expected: HashSet<Uuid> = events
        .iter()
        .filter_map(|e| e.event_id)
        .filter(|id| *id != big)
        .collect();
    sqs.wait_for_all(&expected, Duration::from_secs(60)).await;

    let dead = scenario.store.dead_rows().await;
    let big_row = dead.iter().find(|row| row.event_id == big);
    let Some(big_row) = big_row else {
        panic!("the oversized event is not dead; dead rows: {dead:?}");
    };
    let last_error = &big_row.last_error;
    assert!(
        last_error.contains("262144") && last_error.contains(&format!("SQS queue `{name}`")),
        "SQS's own error must be recorded: {last_error}"
    );
    let status = scenario.status();
    assert_eq!(status["dead"], 1, "{status}");
    assert_eq!(status["pending"], 0, "{status}");
    println!(
        "dead after {} attempt(s) with: {last_error}",
        big_row.attempts
    );

    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    let delivered = sqs.received();
    assert!(delivered.iter().all(|d| d.event_id != big));
    // Later events of the oversized event's aggregate flowed on (on_dead = "skip").
    let later_of_a4: Vec<Uuid> = events[11..]
        .iter()
        .filter(|e| e.aggregate_id == "a4")
        .filter_map(|e| e.event_id)
        .collect();
    assert!(!later_of_a4.is_empty());
    for id in &later_of_a4 {
        assert!(
            delivered.iter().any(|d| d.event_id == *id),
            "event {id} of a4 missing"
        );
    }
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqs_frozen_for_30s_under_steady_writes_loses_nothing_and_recovers_by_itself() {
    let name = unique("sqs");
    let server = OwnSqsServer::start(&name).await;
    let sqs = Arc::new(SqsSide::fifo_at(&server.endpoint, &name).await.consumers(2));
    let port = free_port();
    let mut scenario = Scenario::prepare(
        Arc::new(PostgresSide::open(&name).await),
        sqs.clone(),
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
        let n = sqs.distinct().len();
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
    sqs.wait_for_all(&expected, Duration::from_secs(120)).await;

    let status = scenario.status();
    assert_eq!(status["dead"], 0, "{status}");
    let relay = &mut scenario.relays[0];
    let log = relay.log_text();
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    let consumer_errors = sqs.consumer_errors();
    let delivered = sqs.received();
    let check = check_delivery(&writes.committed, &delivered);
    println!(
        "outage: {} events committed ({written_during} during the 30 s freeze); /readyz 503 during \
         the freeze: {not_ready_seen}; ready again {ready_after:.1}s and backlog drained {drained_after:.1}s \
         after the thaw; read back {} messages, {} distinct, {} duplicates; consumer retried {consumer_errors} calls",
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
        "per-group order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    scenario.cleanup().await;
    drop(server);
}
