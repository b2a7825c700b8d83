//! Chaos: RabbitMQ restarts (`rabbitmqctl stop_app` / `start_app`) under steady writes while two
//! `outbox-relay run` processes publish. Nothing is lost, per-aggregate order holds, and the
//! relays reconnect by themselves (they are never restarted).
//!
//! The test always starts the broker again, also when it fails (`RabbitMqApp` runs `start_app`
//! when dropped). Run it alone: it disturbs every other user of the local RabbitMQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let ports = [free_port(), free_port()];
    for (i, port) in ports.iter().enumerate() {
        let listen = format!("127.0.0.1:{port}");
        scenario.start_relay(
            &format!("relay-{i}"),
            &[("OUTBOX_SERVER__LISTEN", listen.as_str())],
        );
    }
    for port in ports {
        wait_for_ready("the relays ready", port, 200, Duration::from_secs(30)).await;
    }

    // Steady writers until told to stop.
    let writers = scenario
        .start_writers(&WriterPlan::steady(4, 200, Duration::from_millis(5)))
        .await;
    writers.wait_written(1000, Duration::from_secs(120)).await;

    // The broker goes away under load...
    let broker = RabbitMqApp::default();
    let stopped_at = Instant::now();
    let written_before = writers.written();
    broker.begin().await;
    wait_for(
        "a relay to report the broker down on /readyz",
        Duration::from_secs(60),
        || async move {
            ports
                .iter()
                .any(|port| matches!(http_get(*port, "/readyz"), Some((503, _))))
        },
    )
    .await;
    // ... for a while, with writes going on.
    let down_until = stopped_at + Duration::from_secs(12);
    tokio::time::sleep(down_until.saturating_duration_since(Instant::now())).await;
    let pending_during_outage = scenario.store.pending().await;
    let written_during_outage = writers.written() - written_before;
    broker.end().await;
    let restarted_at = Instant::now();
    let outage = restarted_at - stopped_at;

    // Writes go on a little, then stop; the relays (never restarted) drain the backlog.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let writes = writers.finish().await;
    scenario
        .drain("the backlog to drain", Duration::from_secs(180))
        .await;
    let recovered_in = restarted_at.elapsed();
    for (relay, port) in scenario.relays.iter_mut().zip(ports) {
        assert!(
            relay.is_running(),
            "{} died during the outage; log:\n{}",
            relay.name(),
            relay.log_text()
        );
        wait_for_ready("the relays ready again", port, 200, Duration::from_secs(30)).await;
    }
    for relay in &mut scenario.relays {
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(
            exit.success(),
            "{} exited with {exit}; log:\n{}",
            relay.name(),
            relay.log_text()
        );
        let log = relay.log_text();
        assert!(
            log.matches("connected to RabbitMQ").count() >= 2,
            "{} never reconnected; log:\n{log}",
            relay.name()
        );
    }

    let delivered = scenario
        .read_back(&writes.committed, Duration::from_secs(60))
        .await;
    let check = check_delivery(&writes.committed, &delivered);
    println!(
        "{} committed ({written_during_outage} while RabbitMQ was down for {:.1}s, {} pending at \
         restart); backlog drained {:.1}s after the restart; consumed {} messages, {} distinct, \
         {} duplicates",
        writes.committed.len(),
        outage.as_secs_f64(),
        pending_during_outage,
        recovered_in.as_secs_f64(),
        check.messages,
        check.distinct,
        check.duplicates
    );
    assert!(written_during_outage > 0, "no writes during the outage");
    assert!(pending_during_outage > 0, "the outage held nothing back");
    assert!(
        check.missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        check.missing.len(),
        &check.missing[..check.missing.len().min(5)]
    );
    assert!(check.unexpected.is_empty(), "{:?}", check.unexpected);
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    let status = scenario.status();
    assert_eq!(
        status["dead"], 0,
        "an outage must not dead-letter: {status}"
    );
    scenario.cleanup().await;
}
