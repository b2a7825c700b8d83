//! End to end: PostgreSQL → `outbox-relay run` processes → Kafka (a real Kafka-API broker
//! process, tansu, installed and started by `scripts/services.sh`), checked by an independent
//! consumer that reads every partition.
//!
//! The broker-outage test freezes a private broker it starts itself (SIGSTOP/SIGCONT), so
//! other tests using the shared broker are not disturbed.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_store_postgres::Outbox;
use outboxkit_tests::*;
use uuid::Uuid;

const EVENTS: u64 = 20_000;
const AGGREGATES: u64 = 500;
const WRITERS: u64 = 8;
const PARTITIONS: i32 = 6;

type Committed = Arc<Mutex<HashMap<Uuid, (i64, String)>>>;

fn delivered(messages: &[KafkaMessage]) -> Vec<StreamMessage> {
    messages.iter().map(|m| m.message.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_one_sigkilled_deliver_every_event_in_order() {
    let bootstrap = kafka_bootstrap();
    let table = unique("e2ek");
    let orders = format!("{table}_orders");
    let prefix = unique("e2ek");
    let topics = vec![format!("{prefix}.order"), format!("{prefix}.customer")];
    kafka_create_topics(&bootstrap, &topics, PARTITIONS, &[]).await;
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_kafka_config(
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            &bootstrap,
            "",
            "",
            "",
        ),
    );

    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    create_postgres_orders(&pool, &orders, "", AGGREGATES).await;

    let mut relays: Vec<RelayProcess> = (0..3)
        .map(|i| RelayProcess::start(&config, &dir, &format!("relay-{i}")))
        .collect();

    // Concurrent writers: each event in a business transaction that updates (locks) its
    // aggregate's row; every 50th transaction rolls back.
    let committed: Committed = Arc::default();
    let rolled_back: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let outbox = Outbox::new(&table).unwrap();
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (pool, outbox, committed, rolled_back, written, orders) = (
            pool.clone(),
            outbox.clone(),
            committed.clone(),
            rolled_back.clone(),
            written.clone(),
            orders.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (w + 1);
            let mut n = 0;
            while n < EVENTS / WRITERS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let aggregate = (x % AGGREGATES).to_string();
                let kind = if x % AGGREGATES % 2 == 0 {
                    "order"
                } else {
                    "customer"
                };
                let mut tx = pool.begin().await.unwrap();
                touch_postgres_order(&mut tx, &orders, &aggregate).await;
                let event = NewEvent::new(
                    kind,
                    aggregate.clone(),
                    "Changed",
                    serde_json::json!({ "w": w, "n": n }),
                )
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .event_id(Uuid::now_v7());
                let event_id = event.event_id.unwrap();
                let id = outbox.enqueue(&mut tx, &event).await.unwrap();
                if x % 50 == 0 {
                    tx.rollback().await.unwrap();
                    rolled_back.lock().unwrap().push(event_id);
                    continue;
                }
                tx.commit().await.unwrap();
                committed.lock().unwrap().insert(event_id, (id, aggregate));
                written.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }

    // Mid-run, SIGKILL one relay, then start it again.
    wait_for(
        "a third of the events written",
        Duration::from_secs(180),
        || {
            let written = written.clone();
            async move { written.load(Ordering::Relaxed) >= EVENTS / 3 }
        },
    )
    .await;
    relays[0].kill_hard();
    let killed_at = written.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    relays[0] = RelayProcess::start(&config, &dir, "relay-0");

    for w in writers {
        w.await.expect("writer");
    }
    let write_secs = started.elapsed().as_secs_f64();
    wait_for("the backlog to drain", Duration::from_secs(300), || {
        let pool = pool.clone();
        let table = table.clone();
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let drain_secs = started.elapsed().as_secs_f64();

    let (ok, status, err) = run_cli(&config, &["status", "--json"]);
    assert!(ok, "status failed: {err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pending"], 0);
    assert_eq!(status["dead"], 0, "{status}");
    assert_eq!(status["shards_owned"], 32, "{status}");
    assert_eq!(status["owners"].as_object().unwrap().len(), 3, "{status}");

    for relay in &mut relays {
        let exit = relay.terminate(Duration::from_secs(30));
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    // The independent consumer: every partition of both topics.
    let read_started = Instant::now();
    let messages = read_kafka_topics(
        &bootstrap,
        &topics,
        EVENTS as usize,
        Duration::from_secs(180),
    )
    .await;
    let read_secs = read_started.elapsed().as_secs_f64();
    let delivered = delivered(&messages);
    let committed = committed.lock().unwrap().clone();
    let check = check_delivery(&committed, &delivered);
    let rolled_back = rolled_back.lock().unwrap().clone();
    let partitions_used: HashSet<(String, i32)> = messages
        .iter()
        .map(|m| (m.message.stream.clone(), m.partition))
        .collect();
    println!(
        "{} committed ({} rolled back), killed relay-0 after {killed_at} writes; writes took \
         {write_secs:.1}s, drained at {drain_secs:.1}s; read back {} messages ({} distinct, {} \
         duplicates) from {} partitions in {read_secs:.1}s",
        committed.len(),
        rolled_back.len(),
        check.messages,
        check.distinct,
        check.duplicates,
        partitions_used.len()
    );
    assert_eq!(committed.len() as u64, EVENTS);
    assert!(!rolled_back.is_empty());
    assert!(
        check.missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        check.missing.len(),
        &check.missing[..check.missing.len().min(5)]
    );
    assert!(
        check.unexpected.is_empty(),
        "events that were never committed arrived: {:?}",
        &check.unexpected[..check.unexpected.len().min(5)]
    );
    let rolled_back: HashSet<Uuid> = rolled_back.into_iter().collect();
    assert!(
        delivered.iter().all(|m| !rolled_back.contains(&m.event_id)),
        "a rolled-back event was published"
    );
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    let split = kafka_partition_violations(&messages);
    assert!(
        split.is_empty(),
        "an aggregate's events are spread over partitions: {:?}",
        &split[..split.len().min(5)]
    );
    assert_eq!(
        partitions_used.len(),
        2 * PARTITIONS as usize,
        "500 aggregates spread over every partition of both topics"
    );
    // Routing, key and headers.
    for m in &delivered {
        let (_, aggregate) = &committed[&m.event_id];
        assert_eq!(&m.aggregate_id, aggregate, "key = aggregate_id");
        let parity = aggregate.parse::<u64>().unwrap() % 2;
        assert_eq!(
            m.stream.ends_with(".order"),
            parity == 0,
            "{} in {}",
            aggregate,
            m.stream
        );
        assert_eq!(m.fields.get("aggregate_id"), Some(aggregate));
        assert_eq!(
            m.fields.get("event_type").map(String::as_str),
            Some("Changed")
        );
        assert!(m.fields.contains_key("created_at"), "{:?}", m.fields);
        assert!(m.fields.contains_key("traceparent"), "{:?}", m.fields);
    }

    sqlx::query(&format!("DROP TABLE {orders}, {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// Under steady writes, the broker stops answering for 30 seconds and then comes back:
/// nothing is lost or parked as dead, the relay recovers by itself (same process), and
/// `/metrics` showed the backlog grow during the outage and drain after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_outage_of_30s_loses_nothing_and_the_relay_recovers_by_itself() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let table = unique("e2ek");
    let prefix = unique("e2ek");
    let topics = vec![format!("{prefix}.order")];
    let dir = scratch_dir(&table);
    let broker = KafkaBrokerProcess::start(&dir);
    kafka_create_topics(&broker.bootstrap, &topics, 4, &[]).await;
    let port = free_port();
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_kafka_config(
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            &broker.bootstrap,
            &format!("127.0.0.1:{port}"),
            "status_interval = \"500ms\"",
            "delivery_timeout = \"10s\"",
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    let outbox = Outbox::new(&table).unwrap();

    let mut relay = RelayProcess::start(&config, &dir, "relay-outage");
    wait_for("/readyz", Duration::from_secs(30), || async move {
        matches!(http_get(port, "/readyz"), Some((200, _)))
    })
    .await;

    // Steady writes: about 50 events per second over 100 aggregates, until told to stop.
    let committed: Committed = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (pool, outbox, committed, stop) = (
            pool.clone(),
            outbox.clone(),
            committed.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            let mut n: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let aggregate = format!("a{}", n % 100);
                let event = NewEvent::new(
                    "order",
                    aggregate.clone(),
                    "Changed",
                    serde_json::json!({ "n": n }),
                )
                .event_id(Uuid::now_v7());
                let event_id = event.event_id.unwrap();
                let mut tx = pool.begin().await.unwrap();
                let id = outbox.enqueue(&mut tx, &event).await.unwrap();
                tx.commit().await.unwrap();
                committed.lock().unwrap().insert(event_id, (id, aggregate));
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // Sample /metrics every 250 ms from here on.
    let samples: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    let sampling = Arc::new(AtomicBool::new(true));
    let t0 = Instant::now();
    let sampler = {
        let (samples, sampling) = (samples.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                let pending = tokio::task::spawn_blocking(move || {
                    http_get(port, "/metrics")
                        .and_then(|(_, body)| metric_value(&body, "outbox_pending_events"))
                })
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
    let before = pending_rows(&pool, &table).await;
    broker.freeze();
    let frozen_at = t0.elapsed().as_secs_f64();
    tokio::time::sleep(OUTAGE).await;
    let during = pending_rows(&pool, &table).await;
    let ready_during = http_get(port, "/readyz").map(|(code, _)| code);
    broker.thaw();
    let thawed_at = t0.elapsed().as_secs_f64();
    let thawed = Instant::now();

    // Writes go on for a while after the outage, then stop; everything drains.
    tokio::time::sleep(Duration::from_secs(5)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    wait_for("the backlog to drain", Duration::from_secs(120), || {
        let pool = pool.clone();
        let table = table.clone();
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let drained_after = thawed.elapsed().as_secs_f64();
    wait_for(
        "/metrics to show the drained backlog",
        Duration::from_secs(30),
        || async move {
            http_get(port, "/metrics")
                .and_then(|(_, body)| metric_value(&body, "outbox_pending_events"))
                .is_some_and(|v| v == 0.0)
        },
    )
    .await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("sampler");
    wait_for(
        "/readyz after the outage",
        Duration::from_secs(30),
        || async move { matches!(http_get(port, "/readyz"), Some((200, _))) },
    )
    .await;
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");

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
        committed.lock().unwrap().len()
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

    let committed = committed.lock().unwrap().clone();
    let messages = read_kafka_topics(
        &broker.bootstrap,
        &topics,
        committed.len(),
        Duration::from_secs(60),
    )
    .await;
    let check = check_delivery(&committed, &delivered(&messages));
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
    assert!(kafka_partition_violations(&messages).is_empty());

    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

/// An event larger than the topic's maximum message size is parked as dead with its error
/// recorded, while the other aggregates (and the later events of its own aggregate, with
/// `on_dead = "skip"`) keep flowing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_ends_dead_with_its_error_while_others_flow() {
    const MAX: usize = 100_000;
    let bootstrap = kafka_bootstrap();
    let table = unique("e2ek");
    let prefix = unique("e2ek");
    let topics = vec![format!("{prefix}.order")];
    // The topic's limit, and the producer's limit set to match it (as one should: the
    // producer then refuses the event itself instead of sending it to be refused).
    kafka_create_topics(
        &bootstrap,
        &topics,
        3,
        &[("max.message.bytes", &MAX.to_string())],
    )
    .await;
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_kafka_config(
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            &bootstrap,
            "",
            "",
            &format!("\"message.max.bytes\" = {MAX}"),
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    let outbox = Outbox::new(&table).unwrap();

    // 60 small events over 6 aggregates, with a 200 KB event of aggregate "big" in the
    // middle and more events of "big" after it.
    let mut events = Vec::new();
    let mut big_id = Uuid::nil();
    for i in 0..60 {
        let aggregate = if i % 6 == 0 {
            "big".to_owned()
        } else {
            format!("a{}", i % 6)
        };
        let mut payload = serde_json::json!({ "i": i });
        if i == 30 {
            payload = serde_json::json!({ "i": i, "blob": "x".repeat(2 * MAX) });
        }
        let event = NewEvent::new("order", aggregate, "Changed", payload).event_id(Uuid::now_v7());
        if i == 30 {
            big_id = event.event_id.unwrap();
        }
        events.push(event);
    }
    let mut conn = pool.acquire().await.unwrap();
    let ids = outbox.enqueue_many(&mut conn, &events).await.unwrap();
    drop(conn);
    let committed: HashMap<Uuid, (i64, String)> = events
        .iter()
        .zip(&ids)
        .filter(|(e, _)| e.event_id != Some(big_id))
        .map(|(e, id)| (e.event_id.unwrap(), (*id, e.aggregate_id.clone())))
        .collect();

    let mut relay = RelayProcess::start(&config, &dir, "relay-oversized");
    wait_for(
        "every event published or dead",
        Duration::from_secs(60),
        || {
            let pool = pool.clone();
            let table = table.clone();
            async move { pending_rows(&pool, &table).await == 0 }
        },
    )
    .await;
    let exit = relay.terminate(Duration::from_secs(30));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());

    let dead: Vec<(Uuid, i32, Option<String>)> = sqlx::query_as(&format!(
        "SELECT event_id, attempts, last_error FROM {table} WHERE dead_at IS NOT NULL"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    println!("dead: {dead:?}");
    assert_eq!(
        dead.len(),
        1,
        "exactly the oversized event is dead: {dead:?}"
    );
    let (event_id, attempts, error) = &dead[0];
    assert_eq!(*event_id, big_id);
    assert_eq!(*attempts, 1, "rejected at once, not retried");
    let error = error.as_deref().unwrap_or_default();
    assert!(
        error.contains("message.max.bytes (100000 bytes)")
            && error.contains(&format!("topic `{}`", topics[0]))
            && error.contains("MSG_SIZE_TOO_LARGE"),
        "the recorded error says what and why: {error}"
    );

    let messages = read_kafka_topics(
        &bootstrap,
        &topics,
        committed.len(),
        Duration::from_secs(60),
    )
    .await;
    let check = check_delivery(&committed, &delivered(&messages));
    let missing: Vec<_> = check
        .missing
        .iter()
        .map(|id| (id, &committed[id]))
        .collect();
    let mut per_partition: HashMap<i32, (usize, i64)> = HashMap::new();
    for m in &messages {
        let e = per_partition.entry(m.partition).or_default();
        e.0 += 1;
        e.1 = e.1.max(m.offset);
    }
    assert!(
        check.missing.is_empty(),
        "missing: {missing:?}; read {} messages, per partition (count, last offset): {per_partition:?}",
        messages.len()
    );
    assert!(
        check.unexpected.is_empty(),
        "the oversized event must not arrive: {:?}",
        check.unexpected
    );
    assert!(
        check.order_violations.is_empty(),
        "{:?}",
        check.order_violations
    );
    let big_later = messages
        .iter()
        .filter(|m| m.message.aggregate_id == "big")
        .count();
    assert_eq!(
        big_later, 9,
        "the dead event's aggregate flowed on (on_dead = skip)"
    );

    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
