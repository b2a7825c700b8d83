//! `outbox-relay status`, end to end on PostgreSQL and on MySQL/MariaDB, and with log-based
//! capture in message style (no row per event: the slot's reader reports what it holds back):
//! an aggregate held back behind an event that waits for a retry is named, with the row, its
//! attempts, its next try, how many events wait behind it and the broker's last error, as text
//! and as JSON; beyond the 20 listed, how many more are held back; once the retries went out
//! none is named. A running relay's gauge and `status` name one that RabbitMQ does not route.
//! With log-based capture, a failed event read again by the next reader of the slot keeps its
//! attempts and next try, in both styles.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_core::{ClaimRequest, Failure, MarkMode, NewEvent, OutboxEvent, ShardSession, Store};
use outboxkit_harness::*;
use outboxkit_store_postgres::{Capture, CaptureStyle, PostgresStore, PostgresStoreConfig};

on_each_sql_store!(
    held_back_when_polling,
    "held",
    postgres_status_names_each_held_back_aggregate,
    mysql_status_names_each_held_back_aggregate
);

async fn held_back_when_polling(name: &str, side: Arc<dyn StoreSide>) {
    let (_redis, scenario, _port) = RedisSide::scenario(name, side.clone(), "").await;
    let store = side.connect_store(32, 1).await;
    let session = held_back_round_trip(&scenario, &*store).await;
    session.close().await.expect("closing the session");
    scenario.cleanup().await;
}

/// Message style: the slot's reader holds the retries in memory and reports them in the capture
/// bookkeeping row, which `status` reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_message_style_status_names_each_held_back_aggregate() {
    let name = unique("held_lg");
    let server = PrivatePostgres::start_logical(&name);
    let side = Arc::new(LogicalSide::open(&server, &name, "message").await);
    let (_redis, scenario, _port) = RedisSide::scenario(&name, side.clone(), "").await;
    let store = message_style_store(&side, &name).await;
    let session = held_back_round_trip(&scenario, &store).await;
    session.close().await.expect("closing the session");
    scenario.cleanup().await;
    drop(server);
}

/// The store of `side`'s table, read from the log in message style.
async fn message_style_store(side: &LogicalSide, table: &str) -> PostgresStore {
    logical_store(side, table, CaptureStyle::Message).await
}

/// The store of `side`'s table, read from the log in `style`.
async fn logical_store(side: &LogicalSide, table: &str, style: CaptureStyle) -> PostgresStore {
    let mut config = PostgresStoreConfig::new(side.url())
        .table(table)
        .capture(Capture::Logical);
    config.logical.style = style;
    PostgresStore::connect(config).await.expect("connecting")
}

/// A failed event read again by the next reader of the slot keeps what the last reader
/// recorded of it. In message style the reader leaves the failed events it lists in the capture
/// bookkeeping row (at each status report, and as it stops); in table style the row records
/// them. The event waits for the same next try, `status` shows the same attempts and error, and
/// it is handed out with its attempts (its aggregate's next event still behind it), so that
/// `relay.max_attempts` counts across readers as a row's `attempts` does with polling: its next
/// failure parks it as dead after 3 attempts, not 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logical_attempts_carry_over_to_the_next_reader() {
    for (style, prefix) in [
        (CaptureStyle::Message, "held_carry"),
        (CaptureStyle::Table, "held_carry_t"),
    ] {
        attempts_carry_over_to_the_next_reader(style, prefix).await;
    }
}

async fn attempts_carry_over_to_the_next_reader(style: CaptureStyle, prefix: &str) {
    let name = unique(prefix);
    let server = PrivatePostgres::start_logical(&name);
    let side = Arc::new(LogicalSide::open(&server, &name, style.as_str()).await);
    let (_redis, scenario, _port) = RedisSide::scenario(&name, side.clone(), "").await;
    let store = logical_store(&side, &name, style).await;
    let ids = store
        .insert(&[event("A", 1), event("A", 2), event("B", 1)])
        .await
        .expect("writing");
    let mut first = open_every_shard(&store, "relay-first").await;
    claim_count(&mut first, 3).await;
    // A's first event fails twice; the second time it is to be tried again in 3 s.
    first
        .record_failures(&[slow_down(&ids[0])])
        .await
        .expect("recording the failure");
    let soon = Failure {
        retry_in: Some(Duration::from_secs(3)),
        ..slow_down(&ids[0])
    };
    first
        .record_failures(&[soon])
        .await
        .expect("recording the failure");
    first
        .mark_published(&[ids[2]], MarkMode::Delete)
        .await
        .expect("marking B's");
    assert_eq!(relays_count(&store).await, (1, 1));
    let left = scenario.status()["held_back"].clone();
    assert_eq!(left[0]["attempts"], 2, "{left}");
    first.close().await.expect("closing the session");

    let mut next = open_every_shard(&store, "relay-next").await;
    // Claims read the log: A's first event comes out once its time came, with its attempts
    // (B's, published but read again, may come out too); A's second does not, behind it.
    let next_try = left[0]["next_attempt_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("a next attempt time: {left}"));
    let started = Instant::now();
    let mut handed: Vec<OutboxEvent> = Vec::new();
    let mut carried = serde_json::Value::Null;
    while started.elapsed() < Duration::from_secs(30) {
        let exclude: Vec<i64> = handed.iter().map(|e| e.id).collect();
        let request = ClaimRequest {
            limit: 100,
            exclude_ids: &exclude,
            dead_holds_aggregate: false,
        };
        let claimed = next.claim(&request).await.expect("claiming");
        if claimed.iter().any(|e| e.id == ids[0]) {
            let early = next_try.with_timezone(&chrono::Utc) - chrono::Utc::now();
            assert!(early < chrono::Duration::milliseconds(100), "{early} early");
        }
        handed.extend(claimed);
        relays_count(&store).await;
        // Once A's events were read again: the same entry, A's second waiting behind it.
        carried = scenario.status()["held_back"].clone();
        if carried[0]["waiting_behind"] == 1 && handed.iter().any(|e| e.id == ids[0]) {
            break;
        }
    }
    assert_eq!(carried, left, "what the first reader left");
    let again: Vec<(i64, i32)> = handed.iter().map(|e| (e.id, e.attempts)).collect();
    println!("{style:?} style: handed out again (id, attempts): {again:?}");
    assert!(again.contains(&(ids[0], 2)), "{again:?}");
    assert!(!again.iter().any(|(id, _)| *id == ids[1]), "{again:?}");
    let dead = Failure {
        retry_in: None,
        ..slow_down(&ids[0])
    };
    next.record_failures(&[dead]).await.expect("parking it");
    let rows = side.dead_rows().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].attempts, 3, "{rows:?}");
    next.close().await.expect("closing the session");
    scenario.cleanup().await;
    drop(server);
}

/// Real relays, in each style: a relay taking the slot over from one stopped with SIGTERM carries
/// on a failed event's attempts. RabbitMQ does not route invoices; relay-0 (`max_attempts = 3`,
/// retries 3 to 6 s apart) tries invoice-1's event twice and is stopped; relay-1 tries it once
/// more, no sooner than relay-0 set, and parks it as dead. relay-1 retried nothing itself, and
/// the dead row has 3 attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_taking_the_slot_over_carries_on_the_attempts() {
    for (style, prefix) in [("message", "held_take"), ("table", "held_take_t")] {
        let name = unique(prefix);
        let server = PrivatePostgres::start_logical(&name);
        let side = Arc::new(LogicalSide::open(&server, &name, style).await);
        let rabbit = Arc::new(RabbitMqSide::open(&name).await);
        let ports = (free_port(), free_port());
        let settings = Settings::default()
            .listen_on(ports.0)
            .relay("status_interval = \"200ms\"\nmax_attempts = 3");
        let retries = [
            ("OUTBOX_RELAY__BACKOFF_INITIAL", "6s"),
            ("OUTBOX_RELAY__BACKOFF_MAX", "6s"),
        ];
        let mut scenario = Scenario::prepare(side.clone(), rabbit, settings).await;
        let invoice = NewEvent::new("invoice", "invoice-1", "Changed", serde_json::json!({}));
        scenario.store.enqueue_many(&[invoice]).await;
        scenario.start_relay("relay-0", &retries);
        wait_for("relay-0's second attempt", Duration::from_secs(30), || {
            let tried = scenario.status()["held_back"][0]["attempts"] == 2;
            async move { tried }
        })
        .await;
        let exit = scenario.relays[0].terminate(Duration::from_secs(20));
        assert!(exit.success(), "relay-0 exit {exit}");
        let listen = format!("127.0.0.1:{}", ports.1);
        let mut env = retries.to_vec();
        env.push(("OUTBOX_SERVER__LISTEN", &listen));
        scenario.start_relay("relay-1", &env);
        wait_for_metric(
            "relay-1 to park the event",
            ports.1,
            "outbox_events_dead_total",
            Duration::from_secs(30),
            |v| v == 1.0,
        )
        .await;
        let retried = metric_at(ports.1, "outbox_events_retried_total");
        let dead = side.dead_rows().await;
        scenario.stop_relays(Duration::from_secs(20));
        assert_eq!(
            retried.unwrap_or(0.0),
            0.0,
            "{style} style: relay-1 retried it"
        );
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert_eq!(dead[0].attempts, 3, "{style} style: {dead:?}");
        scenario.cleanup().await;
        drop(server);
    }
}

/// A session of `relay` on `store` holding every shard.
async fn open_every_shard(store: &dyn Store, relay: &str) -> Box<dyn ShardSession> {
    let mut session = store.open_session(relay).await.expect("a session");
    for shard in 0..session.shard_count() as i32 {
        assert!(session.try_acquire(shard).await.expect("taking a shard"));
    }
    session
}

/// A running relay, polling: RabbitMQ does not route invoices, so invoice-1's first event is
/// retried (in 5 minutes), its second waits behind it, the order goes out. The relay's gauge
/// and `status` name it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_reports_an_aggregate_held_back() {
    let name = unique("held_run");
    let side = Arc::new(PostgresSide::open(&name).await);
    running_relay_reports_held_back(&name, side, false).await;
}

/// As above, reading the log in message style: the relay reading the slot counts it, and
/// reports it for `status`. Its capture bookkeeping table is one made before the row had room
/// for that (the columns dropped): the relay says so and its gauge counts; `status` shows none
/// until `migrate` adds the columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_relay_reports_an_aggregate_held_back_in_message_style() {
    let name = unique("held_run_lg");
    let server = PrivatePostgres::start_logical(&name);
    let side = Arc::new(LogicalSide::open(&server, &name, "message").await);
    running_relay_reports_held_back(&name, side, true).await;
    drop(server);
}

async fn running_relay_reports_held_back(
    name: &str,
    side: Arc<dyn StoreSide>,
    older_capture_table: bool,
) {
    let port = free_port();
    let rabbit = Arc::new(RabbitMqSide::open(name).await);
    let settings = Settings::default()
        .listen_on(port)
        .relay("status_interval = \"200ms\"");
    let mut scenario = Scenario::prepare(side, rabbit.clone(), settings).await;
    let invoice = |n: u32| {
        NewEvent::new(
            "invoice",
            "invoice-1",
            "Changed",
            serde_json::json!({ "n": n }),
        )
    };
    let order = NewEvent::new("order", "order-1", "Changed", serde_json::json!({ "n": 1 }));
    let events = [invoice(1), invoice(2), order];
    scenario.store.enqueue_many(&events).await;
    if older_capture_table {
        scenario
            .store
            .exec_sql(
                "ALTER TABLE outbox_relay_capture DROP COLUMN reader_retrying, \
                 DROP COLUMN reader_held_back_aggregates, DROP COLUMN reader_held_back",
            )
            .await;
    }
    let retry_in_5m = [
        ("OUTBOX_RELAY__BACKOFF_INITIAL", "5m"),
        ("OUTBOX_RELAY__BACKOFF_MAX", "5m"),
    ];
    scenario.start_relay("relay-held", &retry_in_5m);
    wait_for_metric(
        "the held-back gauge",
        port,
        "outbox_held_back_aggregates",
        Duration::from_secs(30),
        |v| v == 1.0,
    )
    .await;
    if older_capture_table {
        let log = scenario.relays[0].log_text();
        assert!(
            log.contains("has no room for the events held back behind a retry"),
            "{log}"
        );
        assert_eq!(
            scenario.status_line("retrying             "),
            "0 events in 0 held-back aggregates",
            "the bookkeeping row has no room for them"
        );
        let (ok, _, err) = scenario.cli(&["migrate"]);
        assert!(ok, "migrate: {err}");
        let retrying = || scenario.status_line("retrying             ");
        wait_for(
            "the relay's next report, once migrate made room",
            Duration::from_secs(10),
            || {
                let reported = retrying() == "1 event in 1 held-back aggregate";
                async move { reported }
            },
        )
        .await;
    }
    assert_eq!(rabbit.consume(&rabbit.destination("order")).await.len(), 1);
    assert_eq!(
        scenario.status_line("retrying             "),
        "1 event in 1 held-back aggregate"
    );
    let held = scenario.status_line("  held back ");
    assert!(
        held.starts_with("invoice/invoice-1: row ")
            && held.contains(" after 1 attempt, next try ")
            && held.contains(" UTC, 1 waiting behind; ")
            && held.contains("312 NO_ROUTE"),
        "{held}"
    );
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    scenario.cleanup().await;
}

/// The events retrying and the aggregates held back, as the relay's process counts them (its
/// metrics): its status, which in message style also reports them for `status` run elsewhere,
/// as the relay's status loop does every `relay.status_interval`.
async fn relays_count(store: &dyn Store) -> (i64, i64) {
    let status = store.status().await.expect("status in the relay's process");
    (status.retrying, status.held_back_aggregates)
}

fn event(agg: &str, n: u32) -> NewEvent {
    NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }))
}

fn slow_down(&id: &i64) -> Failure {
    Failure {
        id,
        error: "the broker asked to slow down".to_owned(),
        retry_in: Some(Duration::from_secs(3600)),
    }
}

/// Claims until `count` events were handed out, each once (polling hands them out at once; a
/// reader of the log, what it has read so far), and no more.
async fn claim_count(session: &mut Box<dyn ShardSession>, count: usize) {
    let started = Instant::now();
    let mut claimed: Vec<OutboxEvent> = Vec::new();
    while claimed.len() < count && started.elapsed() < Duration::from_secs(30) {
        let handed: Vec<i64> = claimed.iter().map(|e| e.id).collect();
        let request = ClaimRequest {
            limit: 100,
            exclude_ids: &handed,
            dead_holds_aggregate: false,
        };
        claimed.extend(session.claim(&request).await.expect("claiming"));
    }
    assert_eq!(claimed.len(), count, "{claimed:?}");
}

/// Drives a relay's session on `store` (its only reader) and checks `status` as it goes; the
/// session, still open.
async fn held_back_round_trip(scenario: &Scenario, store: &dyn Store) -> Box<dyn ShardSession> {
    let ids = store
        .insert(&[event("A", 1), event("A", 2), event("A", 3), event("B", 1)])
        .await
        .expect("writing");
    // A relay's session: A's first event fails, to be tried again in an hour; B's goes out.
    let mut session = open_every_shard(store, "relay-held").await;
    claim_count(&mut session, 4).await;
    session
        .record_failures(&[slow_down(&ids[0])])
        .await
        .expect("recording the failure");
    session
        .mark_published(&[ids[3]], MarkMode::Delete)
        .await
        .expect("marking B's");
    assert_eq!(relays_count(store).await, (1, 1));

    let status = scenario.status();
    let held = &status["held_back"];
    let next_try = held[0]["next_attempt_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("a next attempt time: {held}"));
    let from_now = next_try.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        from_now > chrono::Duration::minutes(59) && from_now <= chrono::Duration::minutes(60),
        "the next try, an hour after the failure: {next_try}"
    );
    assert_eq!(
        *held,
        serde_json::json!([{
            "aggregate_type": "order",
            "aggregate_id": "A",
            "id": ids[0],
            "attempts": 1,
            "next_attempt_at": held[0]["next_attempt_at"],
            "last_error": "the broker asked to slow down",
            "waiting_behind": 2,
        }]),
        "status --json"
    );
    assert_eq!(
        scenario.status_line("retrying             "),
        "1 event in 1 held-back aggregate"
    );
    assert_eq!(
        scenario.status_line("  held back "),
        format!(
            "order/A: row {} after 1 attempt, next try {} UTC, 2 waiting behind; the broker \
             asked to slow down",
            ids[0],
            next_try.format("%Y-%m-%d %H:%M:%S")
        )
    );

    // 21 more aggregates held back: the 20 waiting longest are listed, and how many are not.
    let more: Vec<NewEvent> = (1..=21).map(|n| event(&format!("C{n}"), 1)).collect();
    let more = store.insert(&more).await.expect("writing");
    claim_count(&mut session, 21).await;
    let failures: Vec<Failure> = more.iter().map(slow_down).collect();
    session
        .record_failures(&failures)
        .await
        .expect("recording the failures");
    relays_count(store).await;
    let held = &scenario.status()["held_back"];
    let listed: Vec<i64> = (0..20).filter_map(|i| held[i]["id"].as_i64()).collect();
    let longest: Vec<i64> = ids[..1].iter().chain(&more[..19]).copied().collect();
    assert_eq!(listed, longest, "{held}");
    assert_eq!(held.as_array().map(Vec::len), Some(20));
    assert_eq!(
        scenario.status_line("retrying             "),
        "22 events in 22 held-back aggregates"
    );
    assert_eq!(
        scenario.status_line("  and "),
        "2 more held-back aggregates (the 20 waiting longest are listed)"
    );

    // The retries go out: nothing is held back.
    let first: Vec<i64> = ids[..1].iter().chain(&more).copied().collect();
    session
        .mark_published(&first, MarkMode::Delete)
        .await
        .expect("marking the retried events");
    relays_count(store).await;
    assert_eq!(scenario.status()["held_back"], serde_json::json!([]));
    assert_eq!(
        scenario.status_line("retrying             "),
        "0 events in 0 held-back aggregates"
    );
    // What waited behind A's first event goes out too.
    session
        .mark_published(&ids[1..3], MarkMode::Delete)
        .await
        .expect("marking A's others");
    session
}
