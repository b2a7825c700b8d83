//! Chaos: RabbitMQ restarts (`rabbitmqctl stop_app` / `start_app`) under steady writes while two
//! `outbox-relay run` processes publish. Nothing is lost, per-aggregate order holds, and the
//! relays reconnect by themselves (they are never restarted).
//!
//! The test always starts the broker again, also when it fails (`RabbitMqApp` runs `start_app`
//! when dropped). Run it alone: it disturbs every other user of the local RabbitMQ.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_restart_under_steady_writes_loses_nothing_and_relays_reconnect() {
    let name = unique("e2e_rmq_restart");
    let mut scenario = Scenario::on_postgres(
        &name,
        Arc::new(RabbitMqSide::open(&name).await),
        Settings::default(),
    )
    .await;
    // Steady writers; once a third is written the broker goes away for 12 s under load, with
    // writes going on (`Scenario::run` checks the delivery).
    let broker = Arc::new(RabbitMqApp::default());
    let scale = Scale {
        events: 12_000,
        aggregates: 200,
        writers: 4,
        relays: 2,
    };
    let plan = Plan::with_fault(scale, broker.clone(), Duration::from_secs(12))
        .pausing(Duration::from_millis(5))
        .watching_health();
    let run = scenario.run(plan).await;

    let outage = run.outage.as_ref().expect("the outage was watched");
    println!(
        "{} committed ({} while RabbitMQ was down for {:.1}s, {} pending at restart); relays \
         ready {:.1}s after the restart, backlog drained at {:.1}s",
        run.writes.committed.len(),
        outage.written_during,
        outage.held.as_secs_f64(),
        outage.pending_at_end,
        outage.ready_after,
        run.drain_secs
    );
    assert!(
        outage.not_ready_seen,
        "no relay reported the broker down on /readyz"
    );
    assert!(outage.written_during > 0, "no writes during the outage");
    assert!(outage.pending_at_end > 0, "the outage held nothing back");
    for (relay, log) in &run.relay_logs {
        assert!(
            log.matches("connected to RabbitMQ").count() >= 2,
            "{relay} never reconnected; log:\n{log}"
        );
        assert_no_error_lines(relay, log);
    }
    scenario.cleanup().await;
    drop(broker);
}
