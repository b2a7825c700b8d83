//! Log-based capture (`store.capture = "logical"`) end to end, on a PostgreSQL cluster each
//! test starts itself with `wal_level = logical` (the machine's shared server runs `replica`).
//!
//! Writers lock no business row: they enqueue and commit, so ids do not follow commit order.
//! The order every aggregate's first deliveries must follow is the commit order, read from the
//! log by a `test_decoding` slot of the test's own ([`LogicalSide::commit_order`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::proxy::Blackhole;
use outboxkit_harness::*;

/// The writers of the end-to-end runs: no business row locked, about 5% rolled back.
fn writers(scale: Scale) -> WriterPlan {
    let mut plan = WriterPlan::bounded(scale);
    plan.rollback_one_in = 20;
    plan
}

/// A cluster, its logical side (oracle slot made) and a scenario to `broker`, migrated.
async fn prepare(
    name: &str,
    style: &'static str,
    broker: Arc<dyn BrokerSide>,
    settings: Settings,
) -> (PrivatePostgres, Arc<LogicalSide>, Scenario) {
    let server = PrivatePostgres::start_logical(name);
    let side = Arc::new(LogicalSide::open(&server, name, style).await);
    let scenario = Scenario::prepare(side.clone(), broker, settings).await;
    (server, side, scenario)
}

/// The index of the relay reading the slot (relays are named `relay-<i>`), waiting for one.
async fn reader_index(side: &LogicalSide, timeout: Duration) -> usize {
    let started = Instant::now();
    loop {
        if let Some(i) = side
            .reader()
            .await
            .and_then(|r| r.strip_prefix("relay-").and_then(|i| i.parse().ok()))
        {
            return i;
        }
        assert!(
            started.elapsed() < timeout,
            "no relay reads the slot after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long until a relay other than `gone` reads the slot.
async fn takeover(side: &LogicalSide, gone: usize, timeout: Duration) -> (usize, Duration) {
    let started = Instant::now();
    loop {
        if let Some(i) = side
            .reader()
            .await
            .and_then(|r| {
                r.strip_prefix("relay-")
                    .and_then(|i| i.parse::<usize>().ok())
            })
            .filter(|i| *i != gone)
        {
            return (i, started.elapsed());
        }
        assert!(
            started.elapsed() < timeout,
            "no other relay took the slot over within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Committed events keyed by their commit position (the oracle's), then read back and checked:
/// every committed event arrived, none rolled back did, first deliveries in commit order.
async fn check_in_commit_order(
    scenario: &Scenario,
    side: &LogicalSide,
    writes: &mut Writes,
) -> DeliveryCheck {
    let order = side.commit_order().await;
    // How often ids alone would have got an aggregate's order wrong: events that committed
    // before an earlier-numbered event of their aggregate.
    let mut by_aggregate: std::collections::HashMap<&str, Vec<(i64, i64)>> = Default::default();
    for (event_id, (id, aggregate)) in &writes.committed {
        if let Some(position) = order.get(event_id) {
            by_aggregate
                .entry(aggregate)
                .or_default()
                .push((*position, *id));
        }
    }
    let out_of_id_order: usize = by_aggregate
        .values_mut()
        .map(|events| {
            events.sort_unstable();
            events.windows(2).filter(|w| w[1].1 < w[0].1).count()
        })
        .sum();
    println!(
        "{out_of_id_order} events committed before an earlier-numbered event of their aggregate"
    );
    for (event_id, (position, _)) in writes.committed.iter_mut() {
        *position = *order
            .get(event_id)
            .unwrap_or_else(|| panic!("event {event_id} committed, but not in the log"));
    }
    for event_id in &writes.rolled_back {
        assert!(!order.contains_key(event_id), "rolled back, yet in the log");
    }
    let delivered = scenario
        .read_back(&writes.committed, Duration::from_secs(180))
        .await;
    let check = check_delivery(&writes.committed, &delivered);
    scenario.assert_delivery(writes, &check, &delivered);
    check
}

/// Three relays, each through its own proxy to the database. A third in, the relay reading the
/// slot is SIGKILLed (and restarted); two thirds in, the one reading then is partitioned away
/// from the database for 12 s. A standby takes over each time.
async fn kill_and_partition(style: &'static str) {
    let name = unique(&format!("lg{}", &style[..3]));
    let scale = Scale::FULL;
    let (server, side, mut scenario) = prepare(
        &name,
        style,
        Arc::new(RedisSide::open(&name).await),
        Settings::default(),
    )
    .await;
    let mut proxies = Vec::new();
    for i in 0..scale.relays {
        let proxy = Blackhole::start(server.port()).await;
        let url = format!("postgres://postgres@127.0.0.1:{}/test", proxy.port());
        scenario.start_relay(&format!("relay-{i}"), &[("OUTBOX_STORE__URL", &url)]);
        proxies.push(proxy);
    }
    reader_index(&side, Duration::from_secs(30)).await;
    let started = Instant::now();
    let writers = scenario.start_writers(&writers(scale)).await;

    writers
        .wait_written(scale.events / 3, Duration::from_secs(180))
        .await;
    let killed = reader_index(&side, Duration::from_secs(10)).await;
    let killed_at = writers.written();
    scenario.relays[killed].kill_hard();
    let (after_kill, kill_takeover) = takeover(&side, killed, Duration::from_secs(30)).await;
    scenario.relays[killed].respawn();

    writers
        .wait_written(2 * scale.events / 3, Duration::from_secs(180))
        .await;
    let cut = reader_index(&side, Duration::from_secs(10)).await;
    let cut_at = writers.written();
    proxies[cut].partition();
    let partitioned = Instant::now();
    let (after_cut, cut_takeover) = takeover(&side, cut, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(12).saturating_sub(partitioned.elapsed())).await;
    proxies[cut].heal();

    let mut writes = writers.finish().await;
    let write_secs = started.elapsed().as_secs_f64();
    scenario
        .drain(
            "the slot confirmed past every event",
            Duration::from_secs(300),
        )
        .await;
    let drain_secs = started.elapsed().as_secs_f64();
    scenario.assert_relays_running();
    let status = scenario.status();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["dead"], 0, "{status}");
    assert!(
        status["slot"]["reader"]
            .as_str()
            .is_some_and(|r| r.starts_with("relay-")),
        "{status}"
    );
    assert_eq!(writes.committed.len() as u64, scale.events);
    assert!(
        writes.rolled_back.len() as u64 > scale.events / 40,
        "about 5% roll back"
    );
    scenario.stop_relays(Duration::from_secs(30));

    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    println!(
        "{}: {} committed over {} aggregates ({} rolled back), no business row locked; relay-{killed} \
         SIGKILLed after {killed_at} writes, relay-{after_kill} read the slot {:.2}s later; \
         relay-{cut} partitioned from the database after {cut_at} writes, relay-{after_cut} read \
         it {:.2}s later (store.logical.takeover_after = 3s); writes took {write_secs:.1}s, \
         drained at {drain_secs:.1}s; {} messages, {} distinct, {} duplicates, 0 order violations \
         (commit order)",
        side.name(),
        writes.committed.len(),
        scale.aggregates,
        writes.rolled_back.len(),
        kill_takeover.as_secs_f64(),
        cut_takeover.as_secs_f64(),
        check.messages,
        check.distinct,
        check.duplicates,
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_style_survives_sigkill_and_partition_in_commit_order() {
    kill_and_partition("table").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn message_style_survives_sigkill_and_partition_in_commit_order() {
    kill_and_partition("message").await;
}
