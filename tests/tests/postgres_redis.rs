//! End to end: PostgreSQL → `outbox-relay run` processes → Redis Streams, checked by an
//! independent reader.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_store_postgres::Outbox;
use outboxkit_tests::*;
use uuid::Uuid;

const EVENTS: u64 = 20_000;
const AGGREGATES: u64 = 500;
const WRITERS: u64 = 8;

type Committed = Arc<Mutex<HashMap<Uuid, (i64, String)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_one_sigkilled_deliver_every_event_in_order() {
    let table = unique("e2e");
    let orders = format!("{table}_orders");
    let prefix = unique("e2e");
    let streams = vec![format!("{prefix}.order"), format!("{prefix}.customer")];
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_redis_config(&table, &format!("{prefix}.{{aggregate_type}}"), "", ""),
    );

    // migrate is idempotent.
    for _ in 0..2 {
        let (ok, out, err) = run_cli(&config, &["migrate"]);
        assert!(ok, "migrate failed: {out}{err}");
    }
    let pool = postgres_pool().await;
    let mut redis = redis_connection().await;
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
        Duration::from_secs(120),
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
    wait_for("the backlog to drain", Duration::from_secs(180), || {
        let pool = pool.clone();
        let table = table.clone();
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let drain_secs = started.elapsed().as_secs_f64();

    // All three relays are alive and share the shards.
    let (ok, status, err) = run_cli(&config, &["status", "--json"]);
    assert!(ok, "status failed: {err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pending"], 0);
    assert_eq!(status["shards_owned"], 32, "{status}");
    assert_eq!(status["owners"].as_object().unwrap().len(), 3, "{status}");

    for relay in &mut relays {
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    let delivered = read_streams(&mut redis, &streams).await;
    let committed = committed.lock().unwrap().clone();
    let check = check_delivery(&committed, &delivered);
    let rolled_back = rolled_back.lock().unwrap().clone();
    println!(
        "{} committed ({} rolled back), killed relay-0 after {killed_at} writes; writes took {write_secs:.1}s, \
         drained at {drain_secs:.1}s; read back {} messages, {} distinct, {} duplicates",
        committed.len(),
        rolled_back.len(),
        check.messages,
        check.distinct,
        check.duplicates
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
    for id in &rolled_back {
        assert!(
            delivered.iter().all(|m| m.event_id != *id),
            "rolled-back event {id} was published"
        );
    }
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    // Routing and fields: each aggregate's events are in its aggregate type's stream.
    for m in &delivered {
        let (_, aggregate) = &committed[&m.event_id];
        assert_eq!(&m.aggregate_id, aggregate);
        let parity = aggregate.parse::<u64>().unwrap() % 2;
        assert_eq!(
            m.stream.ends_with(".order"),
            parity == 0,
            "{} in {}",
            aggregate,
            m.stream
        );
        assert!(m.fields["headers"].contains("traceparent"));
    }

    let _: () = redis::cmd("DEL")
        .arg(&streams)
        .query_async(&mut redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {orders}, {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_serves_metrics_health_and_status_and_stops_cleanly() {
    let table = unique("e2e");
    let prefix = unique("e2e");
    let stream = format!("{prefix}.order");
    let dir = scratch_dir(&table);
    let port = free_port();
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_redis_config(
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            &format!("127.0.0.1:{port}"),
            "status_interval = \"200ms\"",
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    let mut redis = redis_connection().await;
    let outbox = Outbox::new(&table).unwrap();

    // Before any relay runs: a backlog that status reports.
    let events: Vec<NewEvent> = (0..300)
        .map(|i| {
            NewEvent::new(
                "order",
                format!("o{}", i % 7),
                "Placed",
                serde_json::json!({ "i": i }),
            )
        })
        .collect();
    let mut conn = pool.acquire().await.unwrap();
    outbox.enqueue_many(&mut conn, &events).await.unwrap();
    drop(conn);
    let (ok, text, err) = run_cli(&config, &["status"]);
    assert!(ok, "status failed: {err}");
    assert!(text.contains("pending              300"), "{text}");
    assert!(text.contains("no relay is running"), "{text}");

    let mut relay = RelayProcess::start(&config, &dir, "relay-metrics");
    wait_for("/readyz", Duration::from_secs(20), || async move {
        matches!(http_get(port, "/readyz"), Some((200, _)))
    })
    .await;
    wait_for(
        "300 published in /metrics",
        Duration::from_secs(30),
        || async move {
            http_get(port, "/metrics")
                .and_then(|(_, body)| metric_value(&body, "outbox_events_published_total"))
                .is_some_and(|v| v >= 300.0)
        },
    )
    .await;
    let (code, _) = http_get(port, "/healthz").unwrap();
    assert_eq!(code, 200);
    wait_for("gauges refreshed", Duration::from_secs(10), || async move {
        http_get(port, "/metrics")
            .and_then(|(_, body)| metric_value(&body, "outbox_pending_events"))
            .is_some_and(|v| v == 0.0)
    })
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
    assert_eq!(http_get(port, "/nope").unwrap().0, 404);

    let (ok, json, _) = run_cli(&config, &["status", "--json"]);
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(status["pending"], 0);
    let owners = status["owners"].as_object().unwrap();
    assert_eq!(owners.len(), 1, "{status}");
    let (owner, shards) = owners.iter().next().unwrap();
    assert!(owner.starts_with("relay-metrics"), "{status}");
    assert_eq!(shards.as_array().map(Vec::len), Some(32), "{status}");

    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    assert!(
        relay.log_text().contains("relay stopped"),
        "{}",
        relay.log_text()
    );

    let delivered = read_streams(&mut redis, std::slice::from_ref(&stream)).await;
    assert_eq!(delivered.len(), 300);
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
