//! End to end: PostgreSQL → `outbox-relay run` processes → RabbitMQ (publisher confirms),
//! checked by an independent consumer of queues bound to the relay's exchange.

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
    let table = unique("e2e_rmq");
    let orders = format!("{table}_orders");
    let exchange = unique("e2e.rmq");
    let queues = vec![
        format!("{exchange}.orders"),
        format!("{exchange}.customers"),
    ];
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_rabbitmq_config(&table, &exchange, "", ""),
    );

    // migrate is idempotent.
    for _ in 0..2 {
        let (ok, out, err) = run_cli(&config, &["migrate"]);
        assert!(ok, "migrate failed: {out}{err}");
    }
    let pool = postgres_pool().await;
    let (_rabbit, channel) = rabbitmq_channel().await;
    // The independent consumer's queues, bound before anything is published. Routing keys are
    // the default `{aggregate_type}.{event_type}`.
    rabbitmq_bound_queue(&channel, &exchange, &queues[0], "order.*").await;
    rabbitmq_bound_queue(&channel, &exchange, &queues[1], "customer.*").await;
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
    assert_eq!(status["dead"], 0, "{status}");
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

    let mut delivered = Vec::new();
    for queue in &queues {
        delivered.extend(consume_queue(&channel, queue).await);
    }
    let committed = committed.lock().unwrap().clone();
    let check = check_delivery(&committed, &delivered);
    let rolled_back = rolled_back.lock().unwrap().clone();
    println!(
        "{} committed ({} rolled back), killed relay-0 after {killed_at} writes; writes took \
         {write_secs:.1}s ({:.0} events/s), drained at {drain_secs:.1}s ({:.0} events/s end to \
         end); consumed {} messages, {} distinct, {} duplicates",
        committed.len(),
        rolled_back.len(),
        committed.len() as f64 / write_secs,
        committed.len() as f64 / drain_secs,
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
    // Routing and message contents: each aggregate's events are in its type's queue, with the
    // routing key `{aggregate_type}.{event_type}` and the writer's headers.
    for m in &delivered {
        let (_, aggregate) = &committed[&m.event_id];
        assert_eq!(&m.aggregate_id, aggregate);
        let is_order = aggregate.parse::<u64>().unwrap() % 2 == 0;
        assert_eq!(
            m.stream == queues[0],
            is_order,
            "{aggregate} in {}",
            m.stream
        );
        let expected_key = if is_order {
            "order.Changed"
        } else {
            "customer.Changed"
        };
        assert_eq!(m.fields["routing_key"], expected_key);
        assert!(m.fields["traceparent"].starts_with("00-4bf92f35"));
        assert_eq!(m.fields["event_id"], m.event_id.to_string());
    }

    rabbitmq_delete(&channel, &queues, &exchange).await;
    sqlx::query(&format!("DROP TABLE {orders}, {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_events_are_never_published_and_end_dead_with_their_error() {
    let table = unique("e2e_rmq");
    let exchange = unique("e2e.rmq");
    let queue = format!("{exchange}.orders");
    let dir = scratch_dir(&table);
    let port = free_port();
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_rabbitmq_config(
            &table,
            &exchange,
            &format!("127.0.0.1:{port}"),
            "max_attempts = 3\nstatus_interval = \"200ms\"",
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    let (_rabbit, channel) = rabbitmq_channel().await;
    // Only orders are bound; invoices are unroutable.
    rabbitmq_bound_queue(&channel, &exchange, &queue, "order.*").await;

    let outbox = Outbox::new(&table).unwrap();
    let mut events = Vec::new();
    for i in 0..30 {
        let kind = if i % 3 == 0 { "invoice" } else { "order" };
        events.push(NewEvent::new(
            kind,
            format!("{kind}-{}", i % 7),
            "Changed",
            serde_json::json!({ "i": i }),
        ));
    }
    let mut conn = pool.acquire().await.unwrap();
    outbox.enqueue_many(&mut conn, &events).await.unwrap();
    drop(conn);

    let mut relay = RelayProcess::start(&config, &dir, "relay-unroutable");
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

    let dead: Vec<(i32, String)> = sqlx::query_as(&format!(
        "SELECT attempts, last_error FROM {table} WHERE dead_at IS NOT NULL ORDER BY id"
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead.len(), 10, "{dead:?}");
    for (attempts, error) in &dead {
        assert_eq!(*attempts, 3, "{error}");
        assert!(error.contains("gave up after 3 attempts"), "{error}");
        assert!(error.contains("312 NO_ROUTE"), "{error}");
        assert!(error.contains("routing key `invoice.Changed`"), "{error}");
    }
    let published: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {table} WHERE dead_at IS NULL"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(published, 0, "retention = delete: published rows are gone");

    wait_for("the metrics", Duration::from_secs(10), || async move {
        http_get(port, "/metrics")
            .and_then(|(_, body)| metric_value(&body, "outbox_events_dead_total"))
            .is_some_and(|v| v >= 10.0)
    })
    .await;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(
        metric_value(&metrics, "outbox_events_published_total"),
        Some(20.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "outbox_events_dead_total"),
        Some(10.0),
        "{metrics}"
    );
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());

    let delivered = consume_queue(&channel, &queue).await;
    assert_eq!(delivered.len(), 20);
    assert!(delivered
        .iter()
        .all(|m| m.fields["routing_key"] == "order.Changed"));

    rabbitmq_delete(&channel, std::slice::from_ref(&queue), &exchange).await;
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
