//! Log-based capture (`store.capture = "logical"`) end to end, on a PostgreSQL cluster each
//! test starts itself with `wal_level = logical` (the machine's shared server runs `replica`).
//!
//! Writers lock no business row: they enqueue and commit, so ids do not follow commit order.
//! The order every aggregate's first deliveries must follow is the commit order, read from the
//! log by a `test_decoding` slot of the test's own ([`LogicalSide::commit_order`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_core::{
    ClaimRequest, DeadFilter, Failure, MarkMode, NewEvent, ReplaySelection, ShardSession, Store,
};
use outboxkit_harness::proxy::Blackhole;
use outboxkit_harness::*;
use outboxkit_store_postgres::sqlx;
use outboxkit_store_postgres::{Capture, CaptureStyle, PostgresStore, PostgresStoreConfig};

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

/// [`prepare`] with the machine's Redis as the broker, and the default settings.
async fn prepare_on_redis(
    name: &str,
    style: &'static str,
) -> (PrivatePostgres, Arc<LogicalSide>, Scenario) {
    prepare(
        name,
        style,
        Arc::new(RedisSide::open(name).await),
        Settings::default(),
    )
    .await
}

/// The index of the relay reading the slot (relays are named `relay-<i>`), waiting for one.
pub(super) async fn reader_index(side: &LogicalSide, timeout: Duration) -> usize {
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
pub(super) async fn takeover(
    side: &LogicalSide,
    gone: usize,
    timeout: Duration,
) -> (usize, Duration) {
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

/// Wait up to a minute until the broker holds `events` messages.
async fn wait_until_held(scenario: &Scenario, what: &str, events: u64) {
    let broker = scenario.broker.clone();
    wait_for(what, Duration::from_secs(60), move || {
        let broker = broker.clone();
        async move { broker.held(events, Duration::ZERO).await >= events }
    })
    .await;
}

/// Wait until the slot is confirmed past every event.
pub(super) async fn drain_slot(scenario: &Scenario, timeout: Duration) {
    let what = "the slot confirmed past every event";
    scenario.drain(what, timeout).await;
}

/// Committed events keyed by their commit position (the oracle's), then read back and checked:
/// every committed event arrived, none rolled back did, first deliveries in commit order.
pub(super) async fn check_in_commit_order(
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
    let (server, side, mut scenario) = prepare_on_redis(&name, style).await;
    let mut proxies = Vec::new();
    for i in 0..scale.relays {
        let proxy = Blackhole::to(format!("127.0.0.1:{}", server.port())).await;
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
    drain_slot(&scenario, Duration::from_secs(300)).await;
    let drain_secs = started.elapsed().as_secs_f64();
    scenario.assert_relays_running();
    let status = scenario.settled_status().await;
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
    // Relays racing for the slot, a SIGKILL and a partition are all expected.
    for (relay, log) in scenario.relay_logs() {
        assert_no_error_lines(&relay, &log);
    }

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

/// An event the broker refuses (over the NATS stream's message size) ends dead, as a row of
/// the outbox table, while every other event flows, its aggregate's later ones included; a
/// message under the table's prefix that is not an envelope ends dead too. `dead discard`
/// removes one; once the stream takes larger messages, `dead retry` writes the other again
/// and it arrives, with the time it was first written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_event_and_a_malformed_message_end_dead_and_can_be_retried() {
    poison_event_ends_dead_and_can_be_retried("message", "lgpoison").await;
}

/// As above in table style (no malformed message: a row is always an event): the retried
/// event is a new row, with the dead row's `created_at`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_style_a_poison_event_ends_dead_and_can_be_retried() {
    poison_event_ends_dead_and_can_be_retried("table", "lgpoisont").await;
}

async fn poison_event_ends_dead_and_can_be_retried(style: &'static str, prefix: &str) {
    let name = unique(prefix);
    let nats = Arc::new(NatsSide::open(&name).await);
    let (server, side, mut scenario) =
        prepare(&name, style, nats.clone(), Settings::default()).await;
    nats.limit_message_size(Some(64 * 1024)).await;
    scenario
        .oversized_event_ends_dead(100, |error| {
            error.contains("message size exceeds maximum allowed")
        })
        .await;

    if style == "message" {
        malformed_message_ends_dead(&name, &side, &mut scenario).await;
    } else {
        scenario.start_relay("relay-again", &[]);
    }

    // The stream now takes large messages: the oversized event, written again, arrives. (The
    // running relay started with its dead row there: in message style it asks about the event
    // written again, which must not be taken for the one parked, docs/ARCHITECTURE.md.)
    nats.limit_message_size(None).await;
    let big = side.dead_rows().await[0].event_id;
    let written_at = side
        .query_text(&format!(
            "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') \
             FROM {name} WHERE event_id = '{big}'"
        ))
        .await;
    // `events` finds the dead event by its id, in either style.
    let (ok, out, err) = scenario.cli(&["events", "--event-id", &big.to_string()]);
    assert!(ok && out.contains("dead since "), "{out}{err}");
    let (ok, out, err) = scenario.cli(&["dead", "retry", "--all"]);
    assert!(ok, "{out}{err}");
    let delivered = scenario
        .broker
        .read_back(&[big].into(), Duration::from_secs(60))
        .await;
    let Some(retried) = delivered.iter().find(|d| d.event_id == big) else {
        panic!("the retried event never arrived");
    };
    println!(
        "retried event {big}: written at {written_at}, delivered with created_at {}",
        retried.header("created_at")
    );
    assert_eq!(
        retried.header("created_at"),
        written_at,
        "a retried event keeps the time it was written"
    );
    scenario
        .drain("the retried event settled", Duration::from_secs(30))
        .await;
    assert!(side.dead_rows().await.is_empty());
    scenario.stop_relays(Duration::from_secs(30));
    scenario.cleanup().await;
    drop(server);
}

/// A message under the table's prefix that is not an envelope ends dead (read by a relay this
/// starts, which keeps running); `dead discard` removes it.
async fn malformed_message_ends_dead(name: &str, side: &Arc<LogicalSide>, scenario: &mut Scenario) {
    side.exec(&format!(
        "SELECT pg_logical_emit_message(true, 'outbox:public.{name}', 'not an envelope')"
    ))
    .await;
    scenario.start_relay("relay-again", &[]);
    let store = side.clone();
    wait_for(
        "the malformed message parked as dead",
        Duration::from_secs(30),
        move || {
            let store = store.clone();
            async move { store.dead_rows().await.len() == 2 }
        },
    )
    .await;
    let dead = side.dead_rows().await;
    let malformed = dead
        .iter()
        .find(|d| d.last_error.contains("cannot be read"))
        .unwrap_or_else(|| panic!("no dead row for the malformed message: {dead:?}"));
    println!("malformed message dead with: {}", malformed.last_error);
    let (ok, list, err) = scenario.cli(&["dead", "list"]);
    assert!(ok, "{err}");
    assert!(list.contains("outbox-relay"), "{list}");
    let (ok, out, err) = scenario.cli(&["dead", "discard", &malformed.id.to_string(), "--yes"]);
    assert!(ok, "{out}{err}");
    assert_eq!(side.dead_rows().await.len(), 1);
}

/// A relay stopped with SIGTERM right after publishing tells the server how far it got before
/// it goes: the relay reading the slot after it publishes nothing again. (A SIGKILLed one
/// leaves up to a second of events to be read again: at-least-once.) Redis, which keeps every
/// copy, shows a duplicate where a NATS stream would drop it by `Nats-Msg-Id`. Both styles, one
/// after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_stopped_with_sigterm_leaves_nothing_to_publish_again() {
    for (style, prefix) in [("table", "lgtermt"), ("message", "lgtermm")] {
        sigterm_leaves_nothing_to_publish_again(style, prefix).await;
    }
}

async fn sigterm_leaves_nothing_to_publish_again(style: &'static str, prefix: &str) {
    let name = unique(prefix);
    let (server, side, mut scenario) = prepare_on_redis(&name, style).await;
    scenario.start_relay("relay-0", &[]);
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 0);
    let writers = scenario
        .start_writers(&writers(Scale::trickle(500, 20)))
        .await;
    let mut writes = writers.finish().await;
    let expected = writes.committed.len() as u64;
    wait_until_held(&scenario, "relay-0 to publish every event", expected).await;
    // At once: the slot's position is reported once a second.
    let exit = scenario.relays[0].terminate(Duration::from_secs(20));
    assert!(exit.success(), "relay-0 exit {exit}");
    scenario.start_relay("relay-1", &[]);
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 1);
    // What relay-1 would read again, it publishes at once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    scenario.stop_relays(Duration::from_secs(30));
    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    assert_eq!(
        check.duplicates, 0,
        "{style} style: {} events published again after a graceful stop",
        check.duplicates
    );
    scenario.cleanup().await;
    drop(server);
}

/// A URL that reaches the server through its Unix socket (`host=/dir`: a database on the same
/// host, a sidecar proxy): the slot's reader connects through that socket too. It used to go to
/// the socket directory sqlx finds by default (/var/run/postgresql), whatever the URL said, and
/// retried for ever while `run` had passed its start checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_read_through_the_unix_socket_the_url_names() {
    slot_read_through("lgsock", |server| server.socket_url("postgres")).await;
}

/// A URL whose `host` only names the server (no DNS knows it: a name for TLS, a proxy) and whose
/// `hostaddr` says where it is: the slot's reader connects to that address too, as sqlx's
/// connections do (since sqlx 0.9; 0.8 took `hostaddr` for `host`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_read_at_the_hostaddr_the_url_names() {
    slot_read_through("lgaddr", |server| {
        server
            .url("postgres", "hostaddr=127.0.0.1")
            .replacen("@127.0.0.1:", "@pg.invalid:", 1)
    })
    .await;
}

/// One relay given the URL `url_of` the server delivers 100 events from the slot it reads.
async fn slot_read_through(prefix: &str, url_of: impl FnOnce(&PrivatePostgres) -> String) {
    let name = unique(prefix);
    let (server, side, mut scenario) = prepare_on_redis(&name, "table").await;
    let url = url_of(&server);
    scenario.start_relay("relay-0", &[("OUTBOX_STORE__URL", url.as_str())]);
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 0);
    scenario.store.enqueue_many(&placed_events(100, 10)).await;
    scenario.drain("100 events", Duration::from_secs(30)).await;
    assert_eq!(scenario.broker.held(100, Duration::ZERO).await, 100);
    scenario.stop_relays(Duration::from_secs(20));
    scenario.cleanup().await;
    drop(server);
}

/// `capture = "poll"` on a table `migrate` set up for logical capture (a setting forgotten in
/// one deployment): message style is refused, since its events are in no row and polling would
/// publish none of them while the slot keeps the log; table style runs, with a warning that its
/// slot keeps the server's log. Both styles, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_a_table_set_up_for_logical_capture_is_refused_or_warned() {
    for (style, prefix) in [("message", "lgpollm"), ("table", "lgpollt")] {
        let name = unique(prefix);
        let (server, _side, mut scenario) = prepare_on_redis(&name, style).await;
        let mut env = scenario.broker.relay_env();
        env.push(("OUTBOX_STORE__CAPTURE".to_owned(), "poll".to_owned()));
        let err = if style == "message" {
            // A relay process, so that a relay that does start is stopped, not waited for.
            let i = scenario.start_relay("relay-polling", &[("OUTBOX_STORE__CAPTURE", "poll")]);
            let exit = scenario.relays[i].exit_within(
                Duration::from_secs(30),
                "polling a message-style table started",
            );
            let err = scenario.relays[i].log_text();
            assert_eq!(exit.code(), Some(2), "{err}");
            assert!(
                err.contains("store.capture") && err.contains("message style"),
                "{err}"
            );
            let (_, status, _) = run_cli(&scenario.config, &["status"], &env);
            assert!(status.contains("\nproblem "), "{status}");
            err
        } else {
            // `run` would run: `status` makes the same check, and logs the same warning.
            let (ok, _, err) = run_cli(&scenario.config, &["status"], &env);
            assert!(ok, "{err}");
            assert!(err.contains("set it up for logical capture"), "{err}");
            err
        };
        println!("{style} style polled: {}", err.trim());
        scenario.cleanup().await;
        drop(server);
    }
}

/// The broker (a private nats-server) frozen for 30 s under steady writes, message style: the
/// slot's lag grows on `/metrics` in bytes and seconds while nothing is acknowledged and
/// nothing is lost; once thawed, everything arrives in commit order and the lag falls back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_shows_as_slot_lag_and_loses_nothing() {
    let name = unique("lgout");
    let nats_server = PrivateNats::start(&name, &[]);
    let port = free_port();
    let (server, side, mut scenario) = prepare(
        &name,
        "message",
        Arc::new(NatsSide::open_at(&nats_server.url(), &name).await),
        Settings::default()
            .listen_on(port)
            .relay("status_interval = \"500ms\"")
            .sink("request_timeout = \"3s\"\nconnect_timeout = \"2s\""),
    )
    .await;
    // relay-0 reads the slot and serves /metrics; relay-1 stands by.
    scenario.start_relay("relay-0", &[]);
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 0);
    let standby_listen = format!("127.0.0.1:{}", free_port());
    scenario.start_relay("relay-1", &[("OUTBOX_SERVER__LISTEN", &standby_listen)]);
    wait_for_ready("/readyz", port, 200, Duration::from_secs(30)).await;
    let writers = scenario
        .start_writers(&WriterPlan::steady(2, 100, Duration::from_millis(10)))
        .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let lag = |name: &'static str| metric_at(port, name).unwrap_or(-1.0);
    let before = (lag("outbox_slot_lag_bytes"), lag("outbox_slot_lag_seconds"));

    nats_server.freeze();
    let frozen = Instant::now();
    let written_at_freeze = writers.written();
    let mut samples = Vec::new();
    while frozen.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push((lag("outbox_slot_lag_bytes"), lag("outbox_slot_lag_seconds")));
    }
    let written_in_outage = writers.written() - written_at_freeze;
    let seen = scrape_documented(port);
    for metric in ["outbox_slot_lag_bytes", "outbox_slot_lag_seconds"] {
        assert!(seen.contains(metric), "{metric} not exported: {seen:?}");
    }
    // `status`, another process, sees what the reader holds.
    let status = scenario.status();
    nats_server.thaw();
    let held = status["slot"]["unsettled"].as_i64().unwrap_or_default();
    let held_secs = status["slot"]["lag_secs"].as_f64().unwrap_or_default();
    assert!(held > 1_000 && held_secs > 25.0, "{status}");
    assert_eq!(
        status["pending"], held,
        "message style: pending is what the reader holds"
    );
    let thawed = Instant::now();
    let mut writes = writers.finish().await;
    drain_slot(&scenario, Duration::from_secs(120)).await;
    let drained_after = thawed.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = (lag("outbox_slot_lag_bytes"), lag("outbox_slot_lag_seconds"));

    let (last_bytes, last_secs) = *samples.last().unwrap();
    let (first_bytes, _) = samples[2];
    println!(
        "slot lag before the outage {:.0} B, {:.2} s; after 3 s frozen {first_bytes:.0} B; after \
         30 s frozen {last_bytes:.0} B, {last_secs:.1} s ({written_in_outage} events committed \
         meanwhile; `status`: the reader holds {held}, the oldest {held_secs:.1} s old); drained \
         {:.1} s after the thaw; then {:.0} B, {:.2} s",
        before.0,
        before.1,
        drained_after.as_secs_f64(),
        after.0,
        after.1
    );
    assert!(before.1 >= 0.0 && before.1 < 2.0, "lag before: {before:?}");
    assert!(
        written_in_outage > 1_000,
        "{written_in_outage} events during the outage"
    );
    assert!(last_bytes > first_bytes && first_bytes > 0.0, "{samples:?}");
    assert!(
        last_secs > 25.0,
        "the lag in seconds must grow with the outage: {samples:?}"
    );
    assert!(after.1 < 2.0, "lag after the drain: {after:?}");
    scenario.assert_relays_running();
    scenario.stop_relays(Duration::from_secs(30));
    check_in_commit_order(&scenario, &side, &mut writes).await;
    drop(server);
}

/// The database crashes (`pg_ctl -m immediate`) a third of the way through and restarts 3 s
/// later; writers retry. Every committed event arrives, in commit order (the slot survives the
/// crash; what it had not confirmed is read again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_crash_and_restart_loses_nothing() {
    let name = unique("lgcrash");
    let scale = Scale {
        events: 10_000,
        aggregates: 300,
        writers: 4,
        relays: 2,
    };
    let (server, side, mut scenario) = prepare_on_redis(&name, "table").await;
    scenario.start_relays(scale.relays);
    reader_index(&side, Duration::from_secs(30)).await;
    let writers = scenario
        .start_writers(&writers(scale).retrying(Duration::from_secs(60)))
        .await;
    writers
        .wait_written(scale.events / 3, Duration::from_secs(120))
        .await;
    let crashed_at = writers.written();
    server.crash();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start_again();
    let restarted = Instant::now();
    reader_index(&side, Duration::from_secs(60)).await;
    let reading_after = restarted.elapsed();

    let mut writes = writers.finish().await;
    let resolved = scenario.resolve_uncertain(&mut writes).await;
    scenario
        .drain("every row published", Duration::from_secs(300))
        .await;
    scenario.assert_relays_running();
    let status = scenario.status();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["dead"], 0, "{status}");
    scenario.stop_relays(Duration::from_secs(30));
    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    println!(
        "{}: crashed after {crashed_at} writes, restarted 3 s later, a relay read the slot again \
         {:.2} s after the restart; {} committed ({} failed attempts, {resolved} of the uncertain \
         ones committed after all); {} messages, {} duplicates, in commit order",
        side.name(),
        reading_after.as_secs_f64(),
        writes.committed.len(),
        writes.failed_attempts,
        check.messages,
        check.duplicates
    );
    drop(server);
}

/// A slot the server invalidated (past `max_slot_wal_keep_size`), then one that was dropped:
/// `run` and `migrate` stop with an error naming the slot and the runbook, `status` shows it
/// lost, and no new slot is made behind the operator's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_or_dropped_slot_is_a_loud_error_never_a_silent_new_slot() {
    let name = unique("lgslot");
    let (server, side, scenario) = prepare_on_redis(&name, "table").await;
    let slot = side.slot().to_owned();

    // Past max_slot_wal_keep_size with nobody reading, the server gives the slot up.
    server.psql("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'");
    server.psql("SELECT pg_reload_conf()");
    side.exec(
        "CREATE TABLE filler AS SELECT repeat('x', 1000) AS x FROM generate_series(1, 40000); \
         SELECT pg_switch_wal(); CHECKPOINT;",
    )
    .await;
    let status = side
        .query_text(&format!(
            "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .await;
    assert_eq!(status, "lost", "the server did not invalidate the slot");
    let (ok, out, err) = scenario.cli(&["run"]);
    assert!(!ok, "run started on a lost slot: {out}");
    assert!(err.contains(&slot) && err.contains("invalidated"), "{err}");
    assert!(err.contains("docs/OPERATIONS.md"), "the runbook: {err}");
    println!("run on a lost slot: {}", err.trim());
    let (ok, text, err) = scenario.cli(&["status"]);
    assert!(ok, "{err}");
    assert!(text.contains("LOST"), "{text}");
    assert!(
        text.contains("\nproblem ") && text.contains("invalidated"),
        "status names what run stops with: {text}"
    );

    server.psql("ALTER SYSTEM RESET max_slot_wal_keep_size");
    server.psql("SELECT pg_reload_conf()");
    side.exec(&format!("SELECT pg_drop_replication_slot('{slot}')"))
        .await;
    for command in ["run", "migrate"] {
        let (ok, out, err) = scenario.cli(&[command]);
        assert!(!ok, "{command} went on without the slot: {out}");
        assert!(
            err.contains("was dropped") && err.contains(&slot),
            "{command}: {err}"
        );
    }
    let slots = side
        .query_text(&format!(
            "SELECT count(*)::text FROM pg_replication_slots WHERE slot_name = '{slot}'"
        ))
        .await;
    assert_eq!(slots, "0", "a slot was made again");
    // The runbook's step 2 reads the pending rows with `status`: its figures stay, beside the
    // slot's fate, with one pipeline and with several (a second one, by environment variables,
    // reading the same table by polling).
    side.exec(&format!(
        "INSERT INTO {name} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'a1', 'Placed', '{{}}')"
    ))
    .await;
    let (ok, text, err) = scenario.cli(&["status", "--json"]);
    assert!(ok, "{err}");
    let one: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(one["pending"], 1, "{one}");
    let problem = one["problem"].as_str().unwrap_or_default();
    assert!(problem.contains("was dropped"), "{one}");
    let mut env = scenario.broker.relay_env();
    for (key, value) in [
        ("STORE__KIND", "postgres"),
        ("STORE__URL", side.url()),
        ("STORE__TABLE", name.as_str()),
        ("SINK__KIND", "redis-streams"),
    ] {
        env.push((
            format!("OUTBOX_PIPELINES__POLLING__{key}"),
            value.to_owned(),
        ));
    }
    let (ok, text, err) = run_cli(&scenario.config, &["status", "--json"], &env);
    assert!(ok, "{err}");
    let each: serde_json::Value = serde_json::from_str(&text).unwrap();
    let default = &each["pipelines"]["default"];
    assert_eq!(default["pending"], 1, "{each}");
    assert!(
        default["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("was dropped"),
        "{each}"
    );
    assert_eq!(each["pipelines"]["polling"]["pending"], 1, "{each}");
    assert!(
        each["pipelines"]["polling"].get("problem").is_none(),
        "{each}"
    );

    // The operator's acknowledgement (the runbook's step 3): migrate makes a new slot.
    side.exec(&format!(
        "DELETE FROM outbox_relay_capture WHERE table_name = '{name}'"
    ))
    .await;
    let (ok, out, err) = scenario.cli(&["migrate"]);
    assert!(ok, "{out}{err}");
    drop(server);
}

/// `migrate` with `capture = "logical"` checks what the server must offer, each missing piece
/// an error naming the setting to change: `wal_level` (the machine's shared server runs
/// `replica`), the user's replication privilege, a free replication slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_names_each_missing_prerequisite() {
    let name = unique("lgpre");
    let dir = scratch_dir(&name);
    let migrate = |url: &str| {
        let config = write_file(
            &dir,
            "relay.toml",
            &format!(
                "[store]\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"{name}\"\n\
                 capture = \"logical\"\n\n[sink]\nkind = \"redis-streams\"\n"
            ),
        );
        let (ok, out, err) = run_cli(&config, &["migrate"], &[]);
        assert!(!ok, "migrate went on: {out}");
        println!("{}", err.trim());
        err
    };

    let shared = PostgresSide::open(&name).await;
    let err = migrate(&postgres_url());
    assert!(
        err.contains("wal_level = logical") && err.contains("wal_level = replica"),
        "{err}"
    );
    // Nothing was made (the check comes first); drop whatever a regression would leave.
    shared.drop_tables().await;

    let server = PrivatePostgres::start_logical_tuned(&name, "max_replication_slots = 2\n");
    server.psql("CREATE ROLE plain LOGIN");
    server.psql("ALTER DATABASE test OWNER TO plain");
    let err = migrate(&server.url("plain", ""));
    assert!(err.contains("ALTER ROLE \"plain\" REPLICATION"), "{err}");

    server.psql("SELECT pg_create_logical_replication_slot('taken_1', 'pgoutput')");
    server.psql("SELECT pg_create_logical_replication_slot('taken_2', 'pgoutput')");
    let err = migrate(&server.url("postgres", ""));
    assert!(
        err.contains("no free replication slot") && err.contains("max_replication_slots = 2"),
        "{err}"
    );
    drop(server);
}

/// Default slot names past PostgreSQL's 63 bytes: two tenants whose names begin alike get a
/// slot each (cut to 63 bytes they shared one, and the second table could not be set up), and a
/// table set up with the name an earlier version gave it keeps that slot, which `run` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_table_names_get_a_slot_each_and_keep_the_recorded_one() {
    let name = unique("lgslot");
    let server = PrivatePostgres::start_logical(&name);
    let url = server.url("postgres", "");
    // 51 bytes each: `outbox_relay_<schema>_outbox` is 71.
    let schemas = [1, 2, 3].map(|n| format!("t_{name}_{}{n}", "x".repeat(30)));
    let side = PostgresSide::open_with_pool(&url, "probe", 2).await;
    for schema in &schemas {
        side.exec_sql(&format!("CREATE SCHEMA {schema}")).await;
    }
    let redis = RedisSide::open(&name).await;
    let (dir, config) = one_pipeline_config(
        &name,
        &format!(
            "kind = \"postgres\"\nurl = \"{url}\"\ntable = \"t_{name}_*.outbox\"\n\
             capture = \"logical\"\ndiscovery_interval = \"1s\"\n"
        ),
        &redis.sink_toml(),
    );
    let migrate = |schema: &str, slot: Option<&str>| {
        let mut env = vec![("OUTBOX_STORE__TABLE".to_owned(), format!("{schema}.outbox"))];
        env.extend(slot.map(|s| ("OUTBOX_STORE__LOGICAL__SLOT".to_owned(), s.to_owned())));
        let (ok, out, err) = run_cli(&config, &["migrate"], &env);
        assert!(ok, "migrate {schema}: {out}{err}");
    };
    migrate(&schemas[0], None);
    migrate(&schemas[1], None);
    // The third as an earlier version set it up: the default name cut to 63 bytes.
    let mut old = format!("outbox_relay_{}_outbox", schemas[2]);
    old.truncate(63);
    migrate(&schemas[2], Some(&old));

    let slots = side
        .query_text(
            "SELECT string_agg(slot_name, ' ' ORDER BY slot_name) FROM pg_replication_slots",
        )
        .await;
    let slots: Vec<String> = slots.split(' ').map(str::to_owned).collect();
    assert_eq!(slots.len(), 3, "{slots:?}");
    assert!(slots.contains(&old), "{slots:?}");
    assert!(slots.iter().all(|s| s.len() <= 63), "{slots:?}");

    // Without the slot setting, every table (the third with its recorded slot) is relayed.
    let (ok, out, err) = run_cli(&config, &["status"], &[]);
    assert!(ok, "{out}{err}");
    let mut relay = RelayProcess::start(&config, &dir, "relay-long-names", &[]);
    for schema in &schemas {
        side.exec_sql(&format!(
            "INSERT INTO {schema}.outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('order', '{schema}', 'Placed', '{{}}')"
        ))
        .await;
    }
    let mut tables = Vec::new();
    for schema in &schemas {
        tables.push(PostgresSide::open_with_pool(&url, &format!("{schema}.outbox"), 1).await);
    }
    wait_for("every tenant relayed", Duration::from_secs(30), || async {
        let mut pending = 0;
        for table in &tables {
            pending += table.pending().await;
        }
        pending == 0
    })
    .await;
    relay.stop(Duration::from_secs(30));
    let delivered = redis.read_back(&Default::default(), Duration::ZERO).await;
    let mut aggregates: Vec<String> = delivered.iter().map(|d| d.aggregate_id.clone()).collect();
    aggregates.sort();
    assert_eq!(aggregates, schemas.to_vec(), "{}", relay.log_text());
    redis.cleanup().await;
    drop(server);
}

/// Large payloads read from the log while the broker is out of reach, the worst case: nothing
/// is settled, so the relay reads ahead as far as its bounds let it. It holds at most
/// `store.logical.max_unsettled_bytes` of payload (and the replication client's buffer), not
/// the 10,000 events `max_unsettled` allows, in the middle of a transaction too: 1,600 events
/// of 128 KiB (200 MiB) written by one transaction, then every one delivered once the broker
/// is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_are_read_from_the_log_a_bounded_amount_at_a_time() {
    let name = unique("lgbig");
    let (server, side, mut scenario) = prepare_on_redis(&name, "table").await;
    let (cut_off, url) = redis_behind_blackhole().await;
    scenario.start_relay(
        "relay-0",
        &[
            ("OUTBOX_SINK__REDIS_STREAMS__URL", url.as_str()),
            ("OUTBOX_STORE__LOGICAL__MAX_UNSETTLED_BYTES", "8388608"),
        ],
    );
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 0);
    cut_off.partition();
    side.exec(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', (g % 20)::text, 'OrderChanged', \
                jsonb_build_object('n', g, 'pad', repeat('x', 128 * 1024)) \
         FROM generate_series(1, 1600) g",
        side.table()
    ))
    .await;
    // Time to read up to the bounds and fill the replication client's buffer.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let peak = peak_rss_mib(scenario.relays[0].id());
    cut_off.heal();
    scenario
        .drain("1,600 large events", Duration::from_secs(120))
        .await;
    assert!(scenario.broker.held(1_600, Duration::ZERO).await >= 1_600);
    // A debug build's relay peaks near 80 MiB here; 240 MiB when it read a transaction whole
    // before handing any of it out. (With the load in transactions of 100: 84 MiB; 243 MiB
    // with the bound in events alone; 176 MiB with a client buffer of 1,024 messages.)
    assert!(peak > 0.0 && peak < 130.0, "peak RSS {peak:.1} MiB");
    scenario.stop_relays(Duration::from_secs(20));
    scenario.cleanup().await;
    drop(server);
}

/// The events of the transaction relay-0 is killed inside.
const TRANSACTION_EVENTS: u64 = 20_000;

/// Relay-0 reads the log a hundred events at a time (`max_unsettled = 100`, batches of 20).
const SMALL_READS: [(&str, &str); 2] = [
    ("OUTBOX_STORE__LOGICAL__MAX_UNSETTLED", "100"),
    ("OUTBOX_RELAY__BATCH_SIZE", "20"),
];

/// Relay-0 started with [`SMALL_READS`] and reading the slot, then `events` enqueued in one
/// transaction (`enqueue_many` emits them in message style): the transaction's end in the log.
async fn one_transaction_read_by_relay_0(
    scenario: &mut Scenario,
    side: &LogicalSide,
    events: &[NewEvent],
) -> i64 {
    scenario.start_relay("relay-0", &SMALL_READS);
    assert_eq!(reader_index(side, Duration::from_secs(30)).await, 0);
    side.enqueue_many(events).await;
    side.commit_order()
        .await
        .values()
        .copied()
        .max()
        .expect("the transaction in the log")
}

/// SIGKILL relay-0 once the broker holds `held` events of the transaction that ends at `end`;
/// what it published, checked to be part of the transaction only, the slot confirmed before
/// its end.
async fn kill_relay_0_inside(
    scenario: &mut Scenario,
    side: &LogicalSide,
    style: &str,
    held: u64,
    end: i64,
) -> u64 {
    wait_until_held(scenario, "relay-0 to publish part of the transaction", held).await;
    scenario.relays.remove(0).kill_hard();
    let published = scenario.broker.held(0, Duration::ZERO).await;
    assert!(
        published < TRANSACTION_EVENTS,
        "{style} style: relay-0 published all {published} events before its kill; the test \
         needs it killed in the middle"
    );
    let confirmed = side.confirmed().await.expect("the relay's slot");
    assert!(
        confirmed < end,
        "{style} style: the slot was confirmed to {confirmed}, past the transaction's end \
         ({end}), with {published} of its {TRANSACTION_EVENTS} events published"
    );
    published
}

/// The events of `events` that have an `event_id`, in the order they were written.
fn committed_in_order(events: &[NewEvent]) -> Committed {
    events
        .iter()
        .zip(1..)
        .filter_map(|(e, n)| Some((e.event_id?, (n, e.aggregate_id.clone()))))
        .collect()
}

/// One transaction of 20,000 events, read a hundred at a time (`max_unsettled = 100`): the
/// relay publishes its events before it has read the transaction's end, so the slot must not
/// move past the transaction until that end is read and every event settled. The relay is
/// SIGKILLed in the middle; the next one publishes the whole transaction again (duplicates,
/// never losses), first deliveries in order. Both styles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_killed_inside_a_transaction_leaves_all_of_it_to_the_next() {
    for (style, prefix) in [("table", "lgtxkt"), ("message", "lgtxkm")] {
        killed_inside_a_transaction(style, prefix).await;
    }
}

async fn killed_inside_a_transaction(style: &'static str, prefix: &str) {
    const EVENTS: u64 = TRANSACTION_EVENTS;
    let name = unique(prefix);
    let (server, side, mut scenario) = prepare_on_redis(&name, style).await;
    // The scenario writers' events.
    let events: Vec<NewEvent> = (1..=EVENTS).map(|n| scenario_event(0, n, n % 50)).collect();
    let end = one_transaction_read_by_relay_0(&mut scenario, &side, &events).await;
    let published = kill_relay_0_inside(&mut scenario, &side, style, 2_000, end).await;

    // Table style: the rows relay-0 deleted, read again, are published again and their marks
    // find nothing. They must not hold relay-1's backlog while it waits to see whether they
    // are only not visible yet: their transaction is visible, so they are gone, settled at the
    // second try (docs/ARCHITECTURE.md). Held 5 s each, they would let relay-1 through 200
    // every 5 s: 2,000 of them, 50 s.
    scenario.start_relay(
        "relay-1",
        &[("OUTBOX_STORE__LOGICAL__MAX_UNSETTLED", "200")],
    );
    let restarted = Instant::now();
    drain_slot(&scenario, Duration::from_secs(120)).await;
    let drained_in = restarted.elapsed();
    assert!(
        drained_in < Duration::from_secs(30),
        "{style} style: relay-1 took {drained_in:.1?} to drain the transaction after relay-0 \
         published {published} of it"
    );
    scenario.stop_relays(Duration::from_secs(20));
    let mut writes = Writes {
        committed: committed_in_order(&events),
        ..Writes::default()
    };
    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    println!(
        "{style} style: relay-0 published {published} of {EVENTS} before its kill; {} published \
         again by relay-1, which drained the rest in {drained_in:.1?}",
        check.duplicates
    );
    if style == "table" {
        // Relay-1 checks the rows of what it reads again and skips those relay-0 deleted: it
        // publishes again only what relay-0 held unsettled at its kill (max_unsettled = 100),
        // not everything relay-0 published since the slot's last confirmation.
        assert!(
            check.duplicates <= 100,
            "table style: relay-1 published {} of relay-0's {published} events again",
            check.duplicates
        );
    }
    scenario.cleanup().await;
    drop(server);
}

/// An event the last reader parked as dead stays dead when the next reader reads it again. It
/// is in a transaction of 20,000 events that relay-0 is SIGKILLed in the middle of, so the slot
/// is confirmed before it and relay-1 reads it again; by then the stream takes it, so publishing
/// it again would show at the broker (`check_in_commit_order` refuses an event that was not
/// committed: it is left out of those). It waits for `dead retry`, as its dead row says, and
/// the rest of the transaction arrives in commit order. Table style checks the rows of what it
/// reads again; message style, the dead rows of the events. Both styles, one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_parked_as_dead_stays_dead_after_a_takeover() {
    for (style, prefix) in [("table", "lgdeadt"), ("message", "lgdeadm")] {
        parked_as_dead_stays_dead(style, prefix).await;
    }
}

async fn parked_as_dead_stays_dead(style: &'static str, prefix: &str) {
    const EVENTS: u64 = TRANSACTION_EVENTS;
    let name = unique(prefix);
    let nats = Arc::new(NatsSide::open(&name).await);
    let (server, side, mut scenario) =
        prepare(&name, style, nats.clone(), Settings::default()).await;
    nats.limit_message_size(Some(64 * 1024)).await;
    // One transaction; its tenth event is over the stream's message size.
    let mut events: Vec<NewEvent> = (1..=EVENTS).map(|n| scenario_event(0, n, n % 50)).collect();
    events[9].payload = serde_json::json!({ "blob": "z".repeat(100 * 1024) }).into();
    let big = events[9]
        .event_id
        .expect("scenario events carry an event_id");
    let end = one_transaction_read_by_relay_0(&mut scenario, &side, &events).await;
    let store = side.clone();
    wait_for(
        "relay-0 to park the oversized event as dead",
        Duration::from_secs(60),
        move || {
            let store = store.clone();
            async move { !store.dead_rows().await.is_empty() }
        },
    )
    .await;
    let published = kill_relay_0_inside(&mut scenario, &side, style, 1_000, end).await;

    // The stream takes large messages now: only the dead row's state keeps the event back.
    nats.limit_message_size(None).await;
    scenario.start_relay("relay-1", &SMALL_READS);
    drain_slot(&scenario, Duration::from_secs(120)).await;
    scenario.stop_relays(Duration::from_secs(20));

    let dead = side.dead_rows().await;
    assert!(
        dead.len() == 1 && dead[0].event_id == big && dead[0].attempts == 1,
        "the oversized event must be the one dead row, as relay-0 left it: {dead:?}"
    );
    let mut committed = committed_in_order(&events);
    committed.remove(&big);
    let mut writes = Writes {
        committed,
        ..Writes::default()
    };
    // The dead event is not among the committed: had relay-1 published it, this fails with
    // "events that were never committed arrived".
    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    println!(
        "{style} style: relay-0 published {published} of {EVENTS} before its kill; relay-1 left \
         the dead event dead; {} duplicates arrived (the stream drops a message id it holds)",
        check.duplicates
    );
    scenario.cleanup().await;
    drop(server);
}

/// The reader tells the server how far it settled within a tenth of a second, so a relay
/// killed right after the broker acknowledged events leaves little to publish again. Five
/// single events, one after the other: each is confirmed in the slot within 600 ms of reaching
/// the broker (measured 50–100 ms; with a report once a second, 930–990 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slot_is_confirmed_soon_after_the_broker_acknowledged() {
    let name = unique("lgconf");
    let (server, side, mut scenario) = prepare_on_redis(&name, "message").await;
    scenario.start_relay("relay-0", &[]);
    reader_index(&side, Duration::from_secs(30)).await;
    let mut lags = Vec::new();
    for n in 1..=5_u64 {
        let event = scenario_event(0, n, n);
        side.enqueue_many(std::slice::from_ref(&event)).await;
        let id = event.event_id.expect("scenario events carry an event_id");
        let position = side.commit_order().await[&id];
        let started = Instant::now();
        while scenario.broker.held(n, Duration::ZERO).await < n {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "event {n} never arrived"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let arrived = Instant::now();
        while side.confirmed().await.is_none_or(|c| c < position) {
            assert!(
                arrived.elapsed() < Duration::from_secs(30),
                "event {n} never confirmed"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        lags.push(arrived.elapsed());
    }
    println!("confirmed after the broker held them: {lags:.0?}");
    let slowest = lags.iter().max().copied().unwrap_or_default();
    assert!(
        slowest < Duration::from_millis(600),
        "an event was confirmed {slowest:.0?} after it reached the broker ({lags:.0?})"
    );
    scenario.stop_relays(Duration::from_secs(20));
    scenario.cleanup().await;
    drop(server);
}

/// The store of table `name` on `server`, captured from the log in table style, migrated.
async fn logical_store(server: &PrivatePostgres, name: &str) -> PostgresStore {
    logical_store_in(server, name, CaptureStyle::Table).await
}

/// [`logical_store`] in `style`.
async fn logical_store_in(
    server: &PrivatePostgres,
    name: &str,
    style: CaptureStyle,
) -> PostgresStore {
    let mut config = PostgresStoreConfig::new(server.url("postgres", ""))
        .table(name)
        .capture(Capture::Logical);
    config.logical.style = style;
    let store = PostgresStore::connect(config).await.expect("connecting");
    store.migrate().await.expect("migrating");
    store
}

/// A store session of `store` reading the slot as `relay`, waiting for the last reader's
/// connection to end.
async fn reading_session(store: &PostgresStore, relay: &str) -> Box<dyn ShardSession> {
    let mut session = store.open_session(relay).await.expect("opening a session");
    let started = Instant::now();
    while !session.try_acquire(0).await.expect("taking the slot") {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{relay}: the slot was still read by another after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    session
}

/// Claims of `session` (of at most `limit` events, none of `exclude`) until `count` events were
/// handed out, then one more that must hand out nothing; their ids in order.
async fn claim_all(
    session: &mut Box<dyn ShardSession>,
    limit: usize,
    exclude: &[i64],
    count: usize,
    mut settle: impl FnMut(&[i64]) -> Vec<i64>,
) -> Vec<i64> {
    let mut handed: Vec<i64> = Vec::new();
    let started = Instant::now();
    loop {
        let excluded: Vec<i64> = exclude.iter().chain(&handed).copied().collect();
        let request = ClaimRequest {
            limit,
            exclude_ids: &excluded,
            dead_holds_aggregate: false,
        };
        let batch: Vec<i64> = session
            .claim(&request)
            .await
            .expect("claiming")
            .iter()
            .map(|e| e.id)
            .collect();
        let marked = settle(&batch);
        if !marked.is_empty() {
            session
                .mark_published(&marked, MarkMode::Delete)
                .await
                .expect("marking");
        }
        if batch.is_empty() && handed.len() >= count {
            return handed;
        }
        handed.extend(batch);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "30 s of claims handed out {} of {count} events: {handed:?}",
            handed.len()
        );
    }
}

/// Table style: a new reader checks against the table every event it reads again (committed
/// before it started), not only up to its first claim that finds none of them gone. relay-0
/// read 33 events: the first of aggregate 1 failed (to be tried again at once; the 30 later
/// events of aggregate 1 wait behind it), the one of aggregate 2 was parked as dead and the one
/// of aggregate 3 published; the slot stays confirmed before all of them. relay-1's first claim
/// (of at most 20) holds aggregate 1's failed event alone, still pending (its row records the
/// failure, so the later ones wait behind it); the check used to end at such a claim, and a
/// later claim handed out the dead event and the published one again. The sessions are
/// driven by hand, as the engine drives them, so the claims are the same in every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_reader_checks_every_event_read_again() {
    let name = unique("lg_again");
    let server = PrivatePostgres::start_logical(&name);
    let store = logical_store(&server, &name).await;
    let first = store.insert(&[scenario_event(0, 0, 1)]).await.unwrap()[0];
    let held: Vec<NewEvent> = (1..=30).map(|n| scenario_event(0, n, 1)).collect();
    let held = store.insert(&held).await.unwrap();
    let others = [scenario_event(0, 0, 2), scenario_event(0, 0, 3)];
    let (dead, published) = match store.insert(&others).await.unwrap()[..] {
        [dead, published] => (dead, published),
        ref ids => panic!("two ids, not {ids:?}"),
    };

    let mut relay_0 = reading_session(&store, "relay-0").await;
    let read = claim_all(&mut relay_0, 100, &[], 33, |_| Vec::new()).await;
    assert_eq!(read.len(), 33, "relay-0 reads every event once: {read:?}");
    relay_0
        .record_failures(&[
            Failure {
                id: first,
                error: "the broker asked to slow down".to_owned(),
                retry_in: Some(Duration::ZERO),
            },
            Failure {
                id: dead,
                error: "message too large".to_owned(),
                retry_in: None,
            },
        ])
        .await
        .expect("recording the failures");
    relay_0
        .mark_published(&[published], MarkMode::Delete)
        .await
        .expect("marking");
    // Killed: its connections end, its slot confirmed before the first event still.
    drop(relay_0);

    let mut relay_1 = reading_session(&store, "relay-1").await;
    let mut first_claim = None;
    let handed = claim_all(&mut relay_1, 20, &[], 31, |batch| {
        first_claim.get_or_insert_with(|| batch.to_vec());
        batch.to_vec()
    })
    .await;
    let expected: Vec<i64> = std::iter::once(first).chain(held).collect();
    let first_claim = first_claim.unwrap_or_default();
    assert_eq!(
        first_claim,
        [first],
        "relay-1's first claim holds aggregate 1's failed event alone"
    );
    assert_eq!(
        handed, expected,
        "relay-1 hands out aggregate 1's events and nothing relay-0 published ({published}) or \
         parked as dead ({dead})"
    );
    let dead_rows = store
        .dead_list(&DeadFilter {
            limit: 10,
            ..DeadFilter::default()
        })
        .await
        .expect("listing dead rows");
    assert!(
        dead_rows.len() == 1 && dead_rows[0].id == dead && dead_rows[0].attempts == 1,
        "the dead row stays as relay-0 left it: {dead_rows:?}"
    );
    relay_1.close().await.expect("closing relay-1's session");
    drop(server);
}

/// Claims of `session` until one fails, within 15 s of `what`; those before hand out nothing.
async fn claims_until_refused(
    session: &mut Box<dyn ShardSession>,
    what: &str,
) -> outboxkit_core::Error {
    let started = Instant::now();
    let request = ClaimRequest {
        limit: 100,
        exclude_ids: &[],
        dead_holds_aggregate: false,
    };
    loop {
        match session.claim(&request).await {
            Ok(batch) => assert!(batch.is_empty(), "nothing is in the log: {batch:?}"),
            Err(e) => return e,
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the reader still claimed without an error 15 s after {what}"
        );
    }
}

/// Table style: a table out of its publication (dropped and created again by a tool that does
/// not know of it) has no insert in the log. A reader reading finds out within 5 s, and the
/// relay's check and a starting reader refuse it, all loudly, where a relay used to read
/// nothing and report nothing; `migrate` adds the table back, as it does after a `DROP TABLE`
/// it makes the table anew for, and writes again the rows written meanwhile, which are then
/// read, with the later ones. A publication changed by hand to leave out inserts, or with a row
/// filter, is refused and mended the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_out_of_its_publication_is_refused_and_migrate_puts_it_back() {
    let name = unique("lg_pub");
    let server = PrivatePostgres::start_logical(&name);
    let store = logical_store(&server, &name).await;
    let table = store.table().quoted();
    let publication = store
        .logical_names()
        .expect("captured from the log")
        .publication
        .clone();
    let exec = async |sql: String| {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.as_str()))
            .execute(store.pool())
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    };
    let refused_for = |e: &outboxkit_core::Error, why: &str| {
        assert!(
            e.kind() == outboxkit_core::ErrorKind::Schema
                && e.message().contains(why)
                && e.message().contains("migrate"),
            "{e}"
        );
    };
    let refused = |e: &outboxkit_core::Error| refused_for(e, "does not publish table");

    exec(format!("DROP TABLE {table}")).await;
    store
        .migrate()
        .await
        .expect("migrate makes the dropped table anew and adds it back to its publication");
    let first = store.insert(&[scenario_event(0, 0, 1)]).await.unwrap();
    let mut relay_0 = reading_session(&store, "relay-0").await;
    let read = claim_all(&mut relay_0, 100, &[], 1, |batch| batch.to_vec()).await;
    assert_eq!(read, first, "the table made anew is read");

    exec(format!(
        "ALTER PUBLICATION \"{publication}\" DROP TABLE {table}"
    ))
    .await;
    let meanwhile = [scenario_event(0, 1, 1), scenario_event(0, 0, 2)];
    let meanwhile = store.insert(&meanwhile).await.unwrap();
    refused(&claims_until_refused(&mut relay_0, "the table left its publication").await);
    drop(relay_0);
    refused(
        &store
            .check()
            .await
            .expect_err("the check refuses the table"),
    );
    let mut session = store.open_session("relay-1").await.expect("a session");
    refused(
        &session
            .try_acquire(0)
            .await
            .expect_err("a reader refuses to start"),
    );
    drop(session);

    store.migrate().await.expect("migrate adds the table back");
    store.check().await.expect("the table is published again");
    let later = store.insert(&[scenario_event(0, 2, 1)]).await.unwrap();
    let mut relay_1 = reading_session(&store, "relay-1").await;
    let handed = claim_all(&mut relay_1, 100, &[], 3, |batch| batch.to_vec()).await;
    let expected: Vec<i64> = [meanwhile, later].concat();
    assert_eq!(
        handed, expected,
        "the events written while the table was out of its publication (written again by \
         migrate, same ids) are read, then the later one"
    );

    // Changed by hand: inserts left out, or a row filter. Refused the same way, mended by
    // `migrate`, and what the filter left out is read once it has.
    exec(format!(
        "ALTER PUBLICATION \"{publication}\" SET (publish = 'update')"
    ))
    .await;
    refused_for(
        &store.check().await.expect_err("no inserts published"),
        "leaves out insert",
    );
    exec(format!(
        "ALTER PUBLICATION \"{publication}\" SET (publish = 'insert'); \
         ALTER PUBLICATION \"{publication}\" SET TABLE {table} WHERE (aggregate_id <> '3')"
    ))
    .await;
    let filtered = store.insert(&[scenario_event(0, 0, 3)]).await.unwrap();
    refused_for(
        &claims_until_refused(&mut relay_1, "the row filter was set").await,
        "with a row filter (WHERE (aggregate_id <> '3'::text))",
    );
    drop(relay_1);
    store.migrate().await.expect("migrate removes the filter");
    store
        .check()
        .await
        .expect("every insert is published again");
    let mut relay_2 = reading_session(&store, "relay-2").await;
    let handed = claim_all(&mut relay_2, 100, &[], 1, |batch| batch.to_vec()).await;
    assert_eq!(handed, filtered, "the event the filter left out is read");
    relay_2.close().await.expect("closing the session");
    drop(server);
}

/// Message style: the slot can be confirmed only at a transaction's end, so a reader killed
/// inside a large transaction used to leave all of it to be published again, what it had
/// published too. A reader inside a transaction it has not settled whole for a second leaves
/// how far it got (a resume point in the bookkeeping row); the next reader hands out only
/// the rest. Sessions driven by hand: relay-0 reads a transaction of 100 events, 60 of them
/// are published, and it is killed; relay-1 publishes 20 more and stops gracefully, which
/// leaves its place at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_reader_resumes_inside_a_transaction_in_message_style() {
    let name = unique("lg_resume");
    let server = PrivatePostgres::start_logical(&name);
    let store = logical_store_in(&server, &name, CaptureStyle::Message).await;
    let events: Vec<NewEvent> = (0..100).map(|n| scenario_event(0, n, n % 10)).collect();
    let ids = store.insert(&events).await.unwrap();
    let (published, rest) = ids.split_at(60);

    let mut relay_0 = reading_session(&store, "relay-0").await;
    let read = claim_all(&mut relay_0, 100, &[], 100, |_| Vec::new()).await;
    assert_eq!(read, ids, "relay-0 reads the whole transaction");
    relay_0
        .mark_published(published, MarkMode::Delete)
        .await
        .expect("marking");
    // More than a second of claims (with the rest in flight): it leaves how far it got.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(2_500) {
        let request = ClaimRequest {
            limit: 100,
            exclude_ids: rest,
            dead_holds_aggregate: false,
        };
        let batch = relay_0.claim(&request).await.expect("claiming");
        assert!(batch.is_empty(), "the rest is in flight: {batch:?}");
    }
    drop(relay_0);

    let mut relay_1 = reading_session(&store, "relay-1").await;
    let handed = claim_all(&mut relay_1, 100, &[], rest.len(), |_| Vec::new()).await;
    assert_eq!(
        handed, rest,
        "relay-1 hands out only the events relay-0 had not published"
    );
    // Stopped gracefully right after publishing 20 more: it leaves where it got to at once.
    let (published, rest) = rest.split_at(20);
    relay_1
        .mark_published(published, MarkMode::Delete)
        .await
        .expect("marking");
    relay_1.close().await.expect("closing the session");
    let mut relay_2 = reading_session(&store, "relay-2").await;
    let handed = claim_all(&mut relay_2, 100, &[], rest.len(), |batch| batch.to_vec()).await;
    assert_eq!(handed, rest, "relay-2 hands out the last 20 only");
    relay_2.close().await.expect("closing the session");
    drop(server);
}

/// `replay` in table style writes the kept rows it selects again, so the log carries them: the
/// reader hands them out again (new rows, the same event ids), after what it read before; more
/// than one statement's worth (10,000) all go. In message style, which keeps no published
/// events, it is refused, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_events_are_replayed_through_the_log_in_table_style() {
    let name = unique("lg_replay");
    let server = PrivatePostgres::start_logical(&name);
    let store = logical_store(&server, &name).await;
    let events: Vec<NewEvent> = (0..4).map(|n| scenario_event(0, n, 1 + n % 2)).collect();
    let ids = store.insert(&events).await.unwrap();
    let mut reader = reading_session(&store, "relay-0").await;
    assert_eq!(
        claim_all(&mut reader, 100, &[], 4, |_| Vec::new()).await,
        ids
    );
    reader
        .mark_published(&ids, MarkMode::Keep)
        .await
        .expect("marking, rows kept");

    let kept = ReplaySelection::since(chrono::Utc::now() - chrono::Duration::hours(1));
    assert_eq!(store.replay(&kept, true).await.expect("counting"), 4);
    let aggregate_1 = ReplaySelection {
        aggregate_id: Some("1".to_owned()),
        ..kept.clone()
    };
    assert_eq!(store.replay(&aggregate_1, false).await.expect("replay"), 2);
    let again = claim_all(&mut reader, 100, &ids, 2, |_| Vec::new()).await;
    let event_ids = |ids: &[i64]| {
        let ids = ids.to_vec();
        let pool = store.pool().clone();
        let table = store.table().quoted();
        async move {
            sqlx::query_scalar::<_, uuid::Uuid>(sqlx::AssertSqlSafe(format!(
                "SELECT event_id FROM {table} WHERE id = ANY($1) ORDER BY id"
            )))
            .bind(ids)
            .fetch_all(&pool)
            .await
            .expect("reading event ids")
        }
    };
    assert!(again.iter().all(|id| *id > ids[3]), "new rows: {again:?}");
    assert_eq!(
        event_ids(&again).await,
        [events[0].event_id.unwrap(), events[2].event_id.unwrap()],
        "aggregate 1's events again, in their order"
    );
    assert_eq!(
        store.replay(&kept, true).await.expect("counting"),
        2,
        "aggregate 2's, still kept (aggregate 1's are pending)"
    );
    reader.close().await.expect("closing the session");

    // More than one statement's worth (10,000), published by hand: every one written again.
    let many: Vec<NewEvent> = (0..10_003)
        .map(|n| scenario_event(1, n, 3 + n % 50))
        .collect();
    for chunk in many.chunks(1_000) {
        store.insert(chunk).await.expect("inserting");
    }
    let table = store.table().quoted();
    let pool = store.pool().clone();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET published_at = now() WHERE published_at IS NULL AND id > $1"
    )))
    .bind(again[1])
    .execute(&pool)
    .await
    .expect("publishing by hand");
    assert_eq!(store.replay(&kept, false).await.expect("replay"), 10_005);
    let (pending, kept_now): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE published_at IS NULL), \
                count(*) FILTER (WHERE published_at IS NOT NULL) FROM {table}"
    )))
    .fetch_one(&pool)
    .await
    .expect("counting");
    assert_eq!(
        (pending, kept_now),
        (10_007, 0),
        "all written again, pending"
    );

    let message_style =
        logical_store_in(&server, &unique("lg_replay_msg"), CaptureStyle::Message).await;
    for dry_run in [true, false] {
        let e = message_style
            .replay(&kept, dry_run)
            .await
            .expect_err("message style keeps no published events");
        assert!(
            e.to_string()
                .contains("message style (store.logical.style), which keeps no published events"),
            "{e}"
        );
    }
    drop(server);
}

/// Where the relay's user may not create tables, publications or slots, a database
/// administrator applies `migrate --print-sql` with psql (`-f`, stopping at the first error).
/// For either style it sets the table up as `migrate` does: the same bookkeeping row,
/// publication, slot, emit function and table as a table `migrate` set up beside it. Then a
/// user with only the privileges the store README lists for log-based capture passes `check`
/// and relays what writers wrote, and `migrate` finds nothing to change. On a server without
/// `wal_level = logical` the script stops at its first statement, with `migrate`'s words, and
/// leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_printed_sql_sets_log_based_capture_up_as_migrate_does() {
    use super::privileges::{readme_grants, with_user, POSTGRES_README};

    let name = unique("lgsql");
    let server = PrivatePostgres::start_logical(&name);
    let url = server.url("postgres", "");
    let admin = PostgresSide::open_with_pool(&url, "probe", 2).await;
    let dir = scratch_dir(&name);
    for style in ["table", "message"] {
        let (by_hand, by_migrate) = (format!("{name}_{style}"), format!("{name}_{style}_m"));
        let redis = RedisSide::open(&by_hand).await;
        let config = |table: &str, url: &str| {
            one_pipeline_config(
                &format!("{table}_c"),
                &format!(
                    "kind = \"postgres\"\nurl = \"{url}\"\ntable = \"public.{table}\"\n\
                     capture = \"logical\"\n\n[store.logical]\nstyle = \"{style}\"\n"
                ),
                &redis.sink_toml(),
            )
            .1
        };
        let (ok, script, err) = run_cli(&config(&by_hand, &url), &["migrate", "--print-sql"], &[]);
        assert!(ok, "{err}");
        let file = write_file(&dir, &format!("{style}.sql"), &script);
        psql_file(&url, &file).unwrap_or_else(|e| panic!("applying the script: {e}\n{script}"));
        let (ok, out, err) = run_cli(&config(&by_migrate, &url), &["migrate"], &[]);
        assert!(ok, "migrate: {out}{err}");
        let set_up = capture_shape(&admin, &by_hand).await;
        assert_eq!(set_up, capture_shape(&admin, &by_migrate).await, "{script}");
        assert!(set_up[0].ends_with(&format!(" {style} t")), "{set_up:?}");

        // The relay's user: the README's grants, and log-based capture's.
        admin
            .exec_sql(&format!(
                "CREATE ROLE {by_hand} LOGIN REPLICATION PASSWORD 'pw'"
            ))
            .await;
        let grants = readme_grants(
            POSTGRES_README,
            &by_hand,
            &[("app.", "public."), ("SCHEMA app", "SCHEMA public")],
        );
        for grant in grants.iter().chain(&[
            format!("GRANT INSERT ON public.{by_hand} TO {by_hand};"),
            format!("GRANT SELECT, UPDATE ON public.outbox_relay_capture TO {by_hand};"),
        ]) {
            admin.exec_sql(grant).await;
        }
        let relay_config = config(&by_hand, &with_user(&url, &by_hand));
        let (ok, out, err) = run_cli(&relay_config, &["check"], &[]);
        assert!(ok, "check as the relay's user: {out}{err}");
        let mut relay = RelayProcess::start(&relay_config, &dir, &format!("relay-{style}"), &[]);
        for n in 1..=3 {
            admin
                .exec_sql(&if style == "table" {
                    format!(
                        "INSERT INTO public.{by_hand} (aggregate_type, aggregate_id, event_type, \
                         payload) VALUES ('order', 'o-1', 'Placed', '{{\"n\": {n}}}')"
                    )
                } else {
                    format!(
                        "SELECT public.{by_hand}_emit('order', 'o-1', 'Placed', '{{\"n\": {n}}}')"
                    )
                })
                .await;
        }
        wait_for(
            "the three events relayed",
            Duration::from_secs(30),
            || async { redis.held(3, Duration::ZERO).await >= 3 },
        )
        .await;
        relay.stop(Duration::from_secs(30));
        let delivered = redis.read_back(&Default::default(), Duration::ZERO).await;
        let payloads: Vec<String> = delivered
            .iter()
            .map(|d| String::from_utf8_lossy(&d.payload).into_owned())
            .collect();
        assert_eq!(
            payloads,
            [r#"{"n": 1}"#, r#"{"n": 2}"#, r#"{"n": 3}"#],
            "{}",
            relay.log_text()
        );

        let (ok, out, err) = run_cli(&config(&by_hand, &url), &["migrate"], &[]);
        assert!(ok, "migrate after the script: {out}{err}");
        assert_eq!(capture_shape(&admin, &by_hand).await, set_up);
        redis.cleanup().await;
    }

    // The machine's shared server runs wal_level = replica.
    let table = format!("{name}_replica");
    let redis = RedisSide::open(&table).await;
    let (_, config) = one_pipeline_config(
        &table,
        &format!(
            "kind = \"postgres\"\nurl = \"{}\"\ntable = \"public.{table}\"\ncapture = \"logical\"\n",
            postgres_url()
        ),
        &redis.sink_toml(),
    );
    let (ok, script, err) = run_cli(&config, &["migrate", "--print-sql"], &[]);
    assert!(ok, "{err}");
    let file = write_file(&dir, "replica.sql", &script);
    let refused = psql_file(&postgres_url(), &file);
    let shared = PostgresSide::open(&table).await;
    let left = shared
        .query_text(&format!(
            "SELECT coalesce(to_regclass('public.{table}')::text, '')"
        ))
        .await;
    shared.drop_tables().await;
    let refused = refused.expect_err("the script ran on a server without wal_level = logical");
    assert!(
        refused.contains("needs the server setting wal_level = logical")
            && refused.contains("runs with wal_level = replica"),
        "{refused}"
    );
    assert_eq!(left, "", "the script left the table behind");
    drop(server);
}

/// `psql -f script` on the database `url` names, stopping at the first error (psql's output
/// then).
fn psql_file(url: &str, script: &std::path::Path) -> Result<(), String> {
    let out = std::process::Command::new("psql")
        .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f"])
        .arg(script)
        .output()
        .unwrap_or_else(|e| panic!("running psql: {e}"));
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// What logical capture's set-up of `table` is, its name replaced by `T`: its bookkeeping row
/// (slot, style, publication, whether the first position is recorded), the publication's
/// options and tables, the slot's plugin and database, the emit function, and the table's
/// columns and indexes.
async fn capture_shape(admin: &PostgresSide, table: &str) -> Vec<String> {
    let capture = format!("(SELECT {{}} FROM outbox_relay_capture WHERE table_name = '{table}')");
    let queries = [
        format!(
            "SELECT concat_ws(' ', slot, publication, style, created_lsn IS NOT NULL) \
             FROM outbox_relay_capture WHERE table_name = '{table}'"
        ),
        format!(
            "SELECT concat_ws(' ', pubinsert, pubupdate, pubdelete, pubtruncate, puballtables, \
             (SELECT string_agg(schemaname || '.' || tablename, ',') FROM pg_publication_tables \
              t WHERE t.pubname = p.pubname)) FROM pg_publication p WHERE pubname = {}",
            capture.replace("{}", "publication")
        ),
        format!(
            "SELECT concat_ws(' ', plugin, slot_type, database) FROM pg_replication_slots \
             WHERE slot_name = {}",
            capture.replace("{}", "slot")
        ),
        format!("SELECT pg_get_functiondef('public.{table}_emit'::regproc)"),
        format!(
            "SELECT string_agg(concat_ws(' ', column_name, data_type, is_nullable, \
             column_default), ', ' ORDER BY ordinal_position) FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = '{table}'"
        ),
        format!(
            "SELECT string_agg(indexdef, '; ' ORDER BY indexname) FROM pg_indexes \
             WHERE schemaname = 'public' AND tablename = '{table}'"
        ),
    ];
    let mut shape = Vec::new();
    for query in queries {
        shape.push(admin.query_text(&query).await.replace(table, "T"));
    }
    shape
}
