//! End to end: PostgreSQL → `outbox-relay run` → Kafka (a real Kafka-API broker process, tansu):
//! a broker outage, and an oversized event. (The scenario itself runs in `matrix.rs`.)
//!
//! The broker-outage test freezes a private broker it starts itself (SIGSTOP/SIGCONT), so
//! other tests using the shared broker are not disturbed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_harness::*;

/// Under steady writes, the broker stops answering for 30 seconds and then comes back:
/// nothing is lost or parked as dead, the relay recovers by itself (same process), and
/// `/metrics` showed the backlog grow during the outage and drain after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_outage_of_30s_loses_nothing_and_the_relay_recovers_by_itself() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let name = unique("e2ek");
    let broker = KafkaBrokerProcess::start(&scratch_dir(&name));
    let port = free_port();
    let mut scenario = Scenario::on_postgres(
        &name,
        Arc::new(
            KafkaSide::open_at(&broker.bootstrap, &name)
                .await
                .partitions(4),
        ),
        Settings::default()
            .listen_on(port)
            .relay("status_interval = \"500ms\"")
            .sink("delivery_timeout = \"10s\""),
    )
    .await;
    scenario.start_relay("relay-outage", &[]);
    wait_for_ready("/readyz", port, 200, Duration::from_secs(30)).await;

    // Steady writes: about 50 events per second over 100 aggregates, until told to stop.
    let writers = scenario
        .start_writers(&WriterPlan::steady(1, 100, Duration::from_millis(20)))
        .await;

    // Sample /metrics every 250 ms from here on.
    let samples: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let sampler = {
        let (samples, sampling) = (samples.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                let pending =
                    tokio::task::spawn_blocking(move || metric_at(port, "outbox_pending_events"))
                        .await
                        .ok()
                        .flatten();
                if let Some(pending) = pending {
                    samples
                        .lock()
                        .unwrap()
                        .push((t0.elapsed().as_secs_f64(), pending));
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    };

    // Flowing before the outage.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = scenario.store.pending().await;
    broker.freeze();
    let frozen_at = t0.elapsed().as_secs_f64();
    tokio::time::sleep(OUTAGE).await;
    let during = scenario.store.pending().await;
    let ready_during = http_get(port, "/readyz").map(|(code, _)| code);
    broker.thaw();
    let thawed_at = t0.elapsed().as_secs_f64();
    let thawed = Instant::now();

    // Writes go on for a while after the outage, then stop; everything drains.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = writers.finish().await;
    scenario
        .drain("the backlog to drain", Duration::from_secs(120))
        .await;
    let drained_after = thawed.elapsed().as_secs_f64();
    wait_for_metric(
        "/metrics to show the drained backlog",
        port,
        "outbox_pending_events",
        Duration::from_secs(30),
        |v| v == 0.0,
    )
    .await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("sampler");
    wait_for_ready(
        "/readyz after the outage",
        port,
        200,
        Duration::from_secs(30),
    )
    .await;
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");

    let relay = &mut scenario.relays[0];
    assert!(
        relay.is_running(),
        "the relay exited during the outage; log:\n{}",
        relay.log_text()
    );
    let samples = samples.lock().unwrap().clone();
    let peak = samples
        .iter()
        .filter(|(t, _)| *t >= frozen_at && *t <= thawed_at + 5.0)
        .map(|(_, p)| *p)
        .fold(0.0, f64::max);
    // The sampler may stop just before the gauge's next refresh: read the drained backlog
    // from the /metrics fetched after the wait above saw it at 0.
    let last = metric_value(&metrics, "outbox_pending_events").unwrap_or(-1.0);
    let caught_up = samples
        .iter()
        .find(|(t, p)| *t > thawed_at && *p <= 100.0)
        .map(|(t, _)| t - thawed_at);
    let dead = metric_value(&metrics, "outbox_dead_events").unwrap_or(-1.0);
    let publish_errors = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_relay_errors_total") && l.contains("stage=\"publish\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    println!(
        "outage {frozen_at:.1}s..{thawed_at:.1}s: pending {before} before, {during} at the end of \
         the outage (peak in /metrics {peak}), /readyz during the outage {ready_during:?}; \
         backlog under 100 again {caught_up:.1?}s after the broker came back (writes went on \
         for 5 s more, all drained {drained_after:.1}s after it); {publish_errors} whole-call \
         publish failures; {} events committed",
        writes.committed.len()
    );
    assert!(
        during >= 500,
        "the backlog grew during the outage (up to 50 writes/s for 30 s): {during}"
    );
    assert!(
        peak >= 500.0,
        "/metrics showed the backlog grow during the outage: peak {peak}, samples {samples:?}"
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
        ready_during,
        Some(503),
        "/readyz reported the broker outage"
    );

    let exit = relay.terminate(Duration::from_secs(30));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());

    let delivered = scenario
        .read_back(&writes.committed, Duration::from_secs(60))
        .await;
    let check = check_delivery(&writes.committed, &delivered);
    println!(
        "read back {} messages, {} distinct, {} duplicates",
        check.messages, check.distinct, check.duplicates
    );
    assert!(
        check.missing.is_empty(),
        "{} committed events never arrived",
        check.missing.len()
    );
    assert!(check.unexpected.is_empty());
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    assert!(KafkaSide::partition_violations(&delivered).is_empty());
    scenario.cleanup().await;
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
