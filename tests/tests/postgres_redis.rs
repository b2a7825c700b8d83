//! End to end: PostgreSQL → one `outbox-relay run` process → Redis Streams: its HTTP endpoints,
//! `status`, and a clean stop, also while it is still connecting. (The scenario itself runs in
//! `matrix.rs`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

/// A scenario on a new Redis prefix whose relays serve their endpoints on the port returned,
/// with `relay` in their `[relay]` table.
async fn serving_endpoints(prefix: &str, relay: &str) -> (u16, Arc<RedisSide>, Scenario) {
    let name = unique(prefix);
    let port = free_port();
    let redis = Arc::new(RedisSide::open(&name).await);
    let settings = Settings::default().listen_on(port).relay(relay);
    let scenario = Scenario::on_postgres(&name, redis.clone(), settings).await;
    (port, redis, scenario)
}

/// Wait until the relay serving its endpoints on `port` counts `events` published.
async fn wait_published(port: u16, events: usize) {
    let what = format!("{events} published in /metrics");
    let total = "outbox_events_published_total";
    wait_for_metric(&what, port, total, Duration::from_secs(30), |v| {
        v >= events as f64
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_serves_metrics_health_and_status_and_stops_cleanly() {
    let (port, redis, mut scenario) = serving_endpoints("e2e", "status_interval = \"200ms\"").await;

    // Before any relay runs: a backlog that status reports.
    scenario.store.enqueue_many(&placed_events(300, 7)).await;
    let (ok, text, err) = scenario.cli(&["status"]);
    assert!(ok, "status failed: {err}");
    assert!(text.contains("pending              300"), "{text}");
    assert!(text.contains("no relay is running"), "{text}");

    scenario.start_relay("relay-metrics", &[]);
    wait_for_ready("/readyz", port, 200, Duration::from_secs(20)).await;
    wait_published(port, 300).await;
    let (code, _) = http_get(port, "/healthz").unwrap();
    assert_eq!(code, 200);
    wait_for_metric(
        "gauges refreshed",
        port,
        "outbox_pending_events",
        Duration::from_secs(10),
        |v| v == 0.0,
    )
    .await;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    for name in [
        "outbox_oldest_pending_age_seconds",
        "outbox_dead_events",
        "outbox_held_back_aggregates",
        "outbox_commit_to_ack_seconds_bucket",
        "outbox_shards_owned",
    ] {
        assert!(metrics.contains(name), "/metrics lacks {name}:\n{metrics}");
    }
    assert_eq!(metric_value(&metrics, "outbox_shards_owned"), Some(32.0));
    // `retention = "delete"` (the default) keeps nothing: no kept age, and no query for it.
    assert_eq!(
        metric_value(&metrics, "outbox_oldest_kept_age_seconds"),
        None,
        "{metrics}"
    );
    // Every metric carries the pipeline; a configuration of one pipeline names it `default`.
    assert!(
        metrics.contains("outbox_shards_owned{pipeline=\"default\"} 32"),
        "{metrics}"
    );
    let (_, ready) = http_get(port, "/readyz").unwrap();
    assert_eq!(ready, "default: ready, 32 shards owned\n");
    assert_eq!(http_get(port, "/nope").unwrap().0, 404);

    let status = scenario.status();
    assert_eq!(status["pending"], 0);
    // Nothing pending has no age: the text says so rather than "0.000s".
    let (ok, text, _) = scenario.cli(&["status"]);
    assert!(
        ok && text.contains("oldest pending age   none pending\n"),
        "{text}"
    );
    let owners = status["owners"].as_object().unwrap();
    assert_eq!(owners.len(), 1, "{status}");
    let (owner, shards) = owners.iter().next().unwrap();
    assert!(owner.starts_with("relay-metrics"), "{status}");
    assert_eq!(shards.as_array().map(Vec::len), Some(32), "{status}");

    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    assert!(
        relay.log_text().contains("relay stopped"),
        "{}",
        relay.log_text()
    );

    let delivered = redis.read_stream(&redis.destination("order")).await;
    assert_eq!(delivered.len(), 300);
    scenario.cleanup().await;
}

/// The per-destination counters label the first `relay.destination_labels` destinations by
/// name and count the others together under `(other)`: a template with `{aggregate_id}` would
/// otherwise add a series, kept until the relay exits, for every aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_destination_counters_stop_at_destination_labels() {
    let (port, redis, mut scenario) =
        serving_endpoints("e2elabels", "destination_labels = 1").await;
    // Both aggregate types, so two destinations: `<name>.order` and `<name>.customer`.
    let events: Vec<NewEvent> = (0..20u64)
        .map(|i| {
            NewEvent::new(
                aggregate_type(i),
                i.to_string(),
                "Placed",
                serde_json::json!({}),
            )
        })
        .collect();
    scenario.store.enqueue_many(&events).await;
    scenario.start_relay("relay-labels", &[]);
    wait_published(port, 20).await;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    let mut labels: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("outbox_events_published_total{"))
        .filter_map(|l| l.split("destination=\"").nth(1)?.split('"').next())
        .collect();
    labels.sort_unstable();
    // `(` sorts before the prefix's letters.
    assert_eq!(labels.len(), 2, "{metrics}");
    assert_eq!(labels[0], "(other)", "{metrics}");
    let named = [redis.destination("order"), redis.destination("customer")];
    assert!(named.iter().any(|d| d == labels[1]), "{metrics}");
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    let log = relay.log_text();
    assert_eq!(
        log.matches("more destinations than relay.destination_labels")
            .count(),
        1,
        "{log}"
    );
    scenario.cleanup().await;
}

/// `relay.max_events_per_second`: a backlog of 600 drains at 200 a second (16 events, then
/// claims of at most 200, each after the one before had its second), not at once; every event
/// arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_drains_at_max_events_per_second() {
    let (port, redis, mut scenario) =
        serving_endpoints("e2erate", "max_events_per_second = 200").await;
    scenario.store.enqueue_many(&placed_events(600, 13)).await;
    // `status` says the backlog drains at that pace.
    let (ok, text, err) = scenario.cli(&["status"]);
    assert!(
        ok && text.contains(
            "\npace                 at most 200 events/s per relay (relay.max_events_per_second)\n"
        ),
        "{text}{err}"
    );
    assert_eq!(scenario.status()["max_events_per_second"], 200);
    let started = Instant::now();
    scenario.start_relay("relay-rate", &[]);
    wait_published(port, 600).await;
    let took = started.elapsed();
    // 16 + 200 + 200 + 184: the last claim goes 2.08 s after the first, at the earliest.
    assert!(took >= Duration::from_secs(2), "600 events in {took:?}");
    assert_eq!(redis.stream_len(&redis.destination("order")).await, 600);
    // The waits are counted: at least the last two claims', about a second each.
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    let waited: f64 = metrics
        .lines()
        .find(|l| l.starts_with("outbox_pace_wait_seconds_sum{"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no outbox_pace_wait_seconds_sum in:\n{metrics}"));
    assert!(waited >= 1.5, "waited {waited} s");
    scenario.cleanup().await;
}

/// A SIGTERM while the relay is still connecting — here to a Redis behind a cut network, which
/// takes the connection and never answers — ends the start at once with exit code 0, as a
/// SIGTERM does at any other time (before, the signal's default action killed the process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_while_connecting_ends_the_start_cleanly() {
    let name = unique("e2eterm");
    let redis = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::on_postgres(&name, redis, Settings::default()).await;
    let (cut_off, url) = redis_behind_blackhole().await;
    cut_off.partition();
    let i = scenario.start_relay(
        "relay-connecting",
        &[("OUTBOX_SINK__REDIS_STREAMS__URL", url.as_str())],
    );
    let proxy = cut_off.clone();
    wait_for(
        "the relay connecting to Redis",
        Duration::from_secs(20),
        move || {
            let proxy = proxy.clone();
            async move { proxy.accepted() > 0 }
        },
    )
    .await;

    let relay = &mut scenario.relays[i];
    assert!(relay.is_running(), "it stopped: {}", relay.log_text());
    let signalled = Instant::now();
    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    // Well before the sink's connect_timeout (5 s) would have ended the wait.
    assert!(
        signalled.elapsed() < Duration::from_secs(3),
        "{:?}",
        signalled.elapsed()
    );
    assert!(log.contains("stopped while connecting"), "{log}");
    scenario.cleanup().await;
}

/// `run --wait` with one pipeline whose broker does not answer at start (Redis behind a cut
/// network): the relay stays up, not ready on `/readyz` with the reason, and relays once the
/// network is back; without `--wait` the same start ends with an error (the orchestrator's
/// restart), as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_wait_keeps_trying_a_broker_that_does_not_answer_at_start() {
    let (port, redis, mut scenario) = serving_endpoints("e2ewait", "").await;
    let (cut_off, url) = redis_behind_blackhole().await;
    cut_off.partition();
    let env = [
        ("OUTBOX_SINK__REDIS_STREAMS__URL", url.as_str()),
        ("OUTBOX_SINK__REDIS_STREAMS__CONNECT_TIMEOUT", "1s"),
    ];
    let log = scenario.stopped_at_start("relay-no-wait", &env);
    assert!(log.contains("no answer within 1s"), "{log}");

    let i = scenario.start_relay_command("relay-wait", &["run", "--wait"], &env);
    wait_for_ready("/readyz", port, 503, Duration::from_secs(20)).await;
    let (_, ready) = http_get(port, "/readyz").expect("/readyz");
    assert!(ready.contains("no answer within 1s"), "{ready}");
    assert!(
        scenario.relays[i].is_running(),
        "{}",
        scenario.relays[i].log_text()
    );

    cut_off.heal();
    scenario.store.enqueue_many(&placed_events(50, 5)).await;
    wait_for_ready("/readyz", port, 200, Duration::from_secs(30)).await;
    wait_published(port, 50).await;
    let log = scenario.relays[i].log_text();
    assert!(
        log.contains("cannot connect yet; keeps trying (run --wait)"),
        "{log}"
    );
    let exit = scenario.relays[i].terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}");
    assert_eq!(redis.stream_len(&redis.destination("order")).await, 50);
    scenario.cleanup().await;
}

/// SIGHUP (the terminal the relay ran in closed, or a `kill -HUP` meant to reload it) stops the
/// relay as SIGTERM does: it finishes and marks its batch and exits 0, saying it reloads
/// nothing. Before, the signal's default action killed it with its batch unmarked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_stops_the_relay_cleanly_and_says_it_reloads_nothing() {
    let name = unique("e2ehup");
    let broker = RedisSide::open(&name).await;
    let mut scenario = Scenario::on_postgres(&name, Arc::new(broker), Settings::default()).await;
    scenario.store.enqueue_many(&placed_events(100, 5)).await;
    let i = scenario.start_relay("relay-hup", &[]);
    scenario.drain("100 events", Duration::from_secs(30)).await;

    let relay = &mut scenario.relays[i];
    let exit = relay.signal_and_wait("HUP", Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    assert!(
        log.contains("SIGHUP: outbox-relay does not reload its configuration")
            && log.contains("shutdown requested: finishing in-flight work signal=\"SIGHUP\"")
            && log.contains("relay stopped relay_id=relay-hup published=100"),
        "{log}"
    );
    scenario.cleanup().await;
}
