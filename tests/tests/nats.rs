//! End to end with NATS JetStream (the scenario itself runs in `matrix.rs`):
//!
//! - a private `nats-server` (JetStream, its own port and store directory) frozen (SIGSTOP)
//!   for 30 s while writers write: nothing lost, the relays recover by themselves. Only that
//!   server is frozen, by its pid; it is always thawed and killed, even when the test fails;
//! - an event over the stream's `max_msg_size` ends dead with the server's error while the
//!   other aggregates flow.
//!
//! Environment: `OUTBOX_TEST_NATS_URL` (default `nats://127.0.0.1:4222`).

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_frozen_for_30s_under_writes_loses_nothing_and_the_relays_recover() {
    let name = unique("e2e_nats_outage");
    let server = Arc::new(PrivateNats::start(&name, &[]));
    let nats = Arc::new(NatsSide::open_at(&server.url(), &name).await);
    let mut scenario = Scenario::on_postgres(
        &name,
        nats,
        Settings::default().sink("request_timeout = \"3s\"\nconnect_timeout = \"2s\""),
    )
    .await;
    let scale = Scale {
        events: 6_000,
        aggregates: 200,
        writers: 4,
        relays: 2,
    };
    let plan = Plan::with_fault(scale, server.clone(), Duration::from_secs(30));
    let run = scenario.run(plan).await;
    assert_eq!(run.status["dead"], 0, "{}", run.status);
    println!(
        "NATS frozen 30 s after {} events: {} committed, all delivered; writes took {:.1} s, \
         drained at {:.1} s",
        run.killed_at,
        run.writes.committed.len(),
        run.write_secs,
        run.drain_secs
    );
    scenario.cleanup().await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_over_the_stream_max_msg_size_ends_dead_while_others_flow() {
    let name = unique("e2e_nats_big");
    let nats = Arc::new(NatsSide::open(&name).await);
    let mut scenario = Scenario::on_postgres(&name, nats.clone(), Settings::default()).await;
    nats.limit_message_size(Some(64 * 1024)).await;

    scenario
        .oversized_event_ends_dead(100, |error| {
            // The server's own error.
            error.contains("message size exceeds maximum allowed")
        })
        .await;
    scenario.cleanup().await;
}
