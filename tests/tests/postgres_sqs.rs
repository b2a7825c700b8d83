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
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;
use uuid::Uuid;

use crate::aws;

/// FIFO: SQS drops a second copy of an `event_id` for 5 minutes, even after the first was
/// consumed and deleted. After a small scenario, enqueue 20 already delivered event ids again
/// (their rows are gone: retention = delete) plus one fresh event; once the fresh one arrived,
/// none of the 20 may have arrived a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_queue_drops_a_redelivered_event_id() {
    let name = unique("e2e_fifo");
    let sqs = Arc::new(SqsSide::fifo(&name).await);
    let mut scenario = Scenario::on_postgres(&name, sqs.clone(), Settings::default()).await;
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
    aws::an_event_over_256_kib_ends_dead_while_others_flow(&name, sqs, |error| {
        error.contains("262144") && error.contains(&format!("SQS queue `{name}`"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqs_frozen_for_30s_under_steady_writes_loses_nothing_and_recovers_by_itself() {
    aws::own_server_frozen_for_30s_under_steady_writes("sqs").await;
}
