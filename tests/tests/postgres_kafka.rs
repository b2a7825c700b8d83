//! End to end: PostgreSQL → `outbox-relay run` → Kafka (a real Kafka-API broker process, tansu):
//! a broker outage, and an oversized event, both on the harness's scenarios (`Scenario::run`
//! with a fault, `Scenario::oversized_event_ends_dead`); the plain scenario runs in `matrix.rs`.
//!
//! The broker-outage test freezes a private broker it starts itself (SIGSTOP/SIGCONT), so
//! other tests using the shared broker are not disturbed.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

/// Under steady writes, the broker stops answering for 30 seconds and then comes back:
/// nothing is lost or parked as dead, the relay recovers by itself (same process), and
/// `/metrics` showed the backlog grow during the outage and drain after it. The scenario
/// (`Scenario::run` with the private broker as its fault) checks the delivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_outage_of_30s_loses_nothing_and_the_relay_recovers_by_itself() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let name = unique("e2ek");
    let broker = Arc::new(KafkaBrokerProcess::start(&scratch_dir(&name)));
    let mut scenario = Scenario::on_postgres(
        &name,
        Arc::new(
            KafkaSide::open_at(&broker.bootstrap, &name)
                .await
                .partitions(4),
        ),
        Settings::default()
            .relay("status_interval = \"500ms\"")
            .sink("delivery_timeout = \"10s\""),
    )
    .await;
    // Steady writes, about 50 events per second over 100 aggregates; the broker frozen once a
    // third is written, writes going on through the outage and after it.
    let plan = Plan::with_fault(Scale::trickle(2_400, 100), broker.clone(), OUTAGE)
        .pausing(Duration::from_millis(20))
        .watching_health();
    let run = scenario.run(plan).await;

    let outage = run.outage.as_ref().expect("the outage was watched");
    let metrics = &outage.metrics_after;
    let last = metric_value(metrics, "outbox_pending_events").unwrap_or(-1.0);
    let dead = metric_value(metrics, "outbox_dead_events").unwrap_or(-1.0);
    let publish_errors = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_relay_errors_total") && l.contains("stage=\"publish\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    println!(
        "outage of {:.1}s after {} writes: pending {} before, {} at the end of the outage (peak \
         in /metrics {}), /readyz at its end {:?}; ready again {:.1}s after the broker came \
         back; {publish_errors} whole-call publish failures; {} events committed",
        outage.held.as_secs_f64(),
        run.killed_at,
        outage.pending_before,
        outage.pending_at_end,
        outage.pending_metric_peak,
        outage.ready_at_end,
        outage.ready_after,
        run.writes.committed.len()
    );
    assert!(
        outage.pending_at_end >= 500,
        "the backlog grew during the outage (up to 50 writes/s for 30 s): {}",
        outage.pending_at_end
    );
    assert!(
        outage.pending_metric_peak >= 500.0,
        "/metrics showed the backlog grow during the outage: peak {}",
        outage.pending_metric_peak
    );
    assert_eq!(last, 0.0, "/metrics showed the backlog drain");
    assert_eq!(
        dead, 0.0,
        "no event was parked as dead because of the outage"
    );
    assert!(
        publish_errors >= 1.0,
        "the outage was seen as whole-call publish failures:\n{metrics}"
    );
    assert_eq!(
        outage.ready_at_end,
        Some(503),
        "/readyz reported the broker outage"
    );
    scenario.cleanup().await;
    drop(broker);
}

/// An event larger than the topic's maximum message size is parked as dead with its error
/// recorded, while the other aggregates (and the later events of its own aggregate, with
/// `on_dead = "skip"`) keep flowing (see `Scenario::oversized_event_ends_dead`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_ends_dead_with_its_error_while_others_flow() {
    const MAX: usize = 100_000;
    let name = unique("e2ek");
    // The topic's limit, and the producer's limit set to match it (as one should: the
    // producer then refuses the event itself instead of sending it to be refused).
    let kafka = Arc::new(
        KafkaSide::open(&name)
            .await
            .partitions(3)
            .topic_config("max.message.bytes", &MAX.to_string()),
    );
    let mut scenario = Scenario::on_postgres(
        &name,
        kafka.clone(),
        Settings::default().sink(&format!("\"message.max.bytes\" = {MAX}")),
    )
    .await;
    let topic = format!("topic `{}`", kafka.destination("order"));
    // About 200 KB, twice the limit.
    scenario
        .oversized_event_ends_dead(2 * MAX / 1024, |error| {
            error.contains("message.max.bytes (100000 bytes)")
                && error.contains(&topic)
                && error.contains("MSG_SIZE_TOO_LARGE")
        })
        .await;
    scenario.cleanup().await;
}
