//! Chaos: RabbitMQ restarts (`rabbitmqctl stop_app` / `start_app`) under steady writes while two
//! `outbox-relay run` processes publish. Nothing is lost, per-aggregate order holds, and the
//! relays reconnect by themselves (they are never restarted).
//!
//! The test always starts the broker again, also when it fails (a guard runs `start_app` when
//! dropped). Run it alone: it disturbs every other user of the local RabbitMQ.

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_store_postgres::Outbox;
use outboxkit_tests::*;
use uuid::Uuid;

const AGGREGATES: u64 = 200;
const WRITERS: u64 = 4;

fn rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .map_err(|e| format!("running rabbitmqctl {args:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("rabbitmqctl {args:?} failed: {text}"))
    }
}

fn start_broker() -> Result<(), String> {
    rabbitmqctl(&["start_app"])?;
    rabbitmqctl(&["await_startup", "--timeout", "120"]).map(drop)
}

/// Starts the RabbitMQ application again when dropped while it is stopped — on success and
/// on failure (panics unwind through it).
struct BrokerGuard {
    stopped: bool,
}

impl BrokerGuard {
    fn stop(&mut self) {
        self.stopped = true;
        if let Err(e) = rabbitmqctl(&["stop_app"]) {
            panic!("{e}");
        }
    }

    fn start(&mut self) {
        if let Err(e) = start_broker() {
            panic!("{e}");
        }
        self.stopped = false;
    }
}

impl Drop for BrokerGuard {
    fn drop(&mut self) {
        if self.stopped {
            if let Err(e) = start_broker() {
                eprintln!("could not start RabbitMQ again ({e}): run scripts/services.sh");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_restart_under_steady_writes_loses_nothing_and_relays_reconnect() {
    let table = unique("e2e_rmq_restart");
    let orders = format!("{table}_orders");
    let exchange = unique("e2e.rmq");
    let queue = format!("{exchange}.all");
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_rabbitmq_config(&table, &exchange, "", ""),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    create_postgres_orders(&pool, &orders, "", AGGREGATES).await;
    let (rabbit, channel) = rabbitmq_channel().await;
    rabbitmq_bound_queue(&channel, &exchange, &queue, "#").await;

    let ports = [free_port(), free_port()];
    let mut relays: Vec<RelayProcess> = ports
        .iter()
        .enumerate()
        .map(|(i, port)| {
            let listen = format!("127.0.0.1:{port}");
            RelayProcess::start_with_env(
                &config,
                &dir,
                &format!("relay-{i}"),
                &[("OUTBOX_SERVER__LISTEN", listen.as_str())],
            )
        })
        .collect();
    for port in ports {
        wait_for("the relays ready", Duration::from_secs(30), || async move {
            matches!(http_get(port, "/readyz"), Some((200, _)))
        })
        .await;
    }

    // Steady writers until told to stop; each event in a business transaction that updates
    // (locks) its aggregate's row, as the writer contract asks.
    let committed: Arc<Mutex<HashMap<Uuid, (i64, String)>>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let outbox = Outbox::new(&table).unwrap();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (pool, outbox, committed, written, stop, orders) = (
            pool.clone(),
            outbox.clone(),
            committed.clone(),
            written.clone(),
            stop.clone(),
            orders.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (w + 1);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let aggregate = (x % AGGREGATES).to_string();
                let event = NewEvent::new(
                    "order",
                    aggregate.clone(),
                    "Changed",
                    serde_json::json!({ "w": w, "n": n }),
                )
                .event_id(Uuid::now_v7());
                let event_id = event.event_id.unwrap();
                let mut tx = pool.begin().await.unwrap();
                touch_postgres_order(&mut tx, &orders, &aggregate).await;
                let id = outbox.enqueue(&mut tx, &event).await.unwrap();
                tx.commit().await.unwrap();
                committed.lock().unwrap().insert(event_id, (id, aggregate));
                written.fetch_add(1, Ordering::Relaxed);
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    let count = |w: &Arc<AtomicU64>| w.load(Ordering::Relaxed);
    wait_for("1,000 events written", Duration::from_secs(120), || {
        let written = written.clone();
        async move { count(&written) >= 1000 }
    })
    .await;

    // The broker goes away under load...
    let mut broker = BrokerGuard { stopped: false };
    let stopped_at = Instant::now();
    let written_before = count(&written);
    tokio::task::block_in_place(|| broker.stop());
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
    let pending_during_outage = pending_rows(&pool, &table).await;
    let written_during_outage = count(&written) - written_before;
    tokio::task::block_in_place(|| broker.start());
    let restarted_at = Instant::now();
    let outage = restarted_at - stopped_at;
    drop(rabbit);

    // Writes go on a little, then stop; the relays (never restarted) drain the backlog.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    wait_for("the backlog to drain", Duration::from_secs(180), || {
        let pool = pool.clone();
        let table = table.clone();
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let recovered_in = restarted_at.elapsed();
    for (relay, port) in relays.iter_mut().zip(ports) {
        assert!(
            relay.is_running(),
            "{} died during the outage; log:\n{}",
            relay.name,
            relay.log_text()
        );
        wait_for(
            "the relays ready again",
            Duration::from_secs(30),
            || async move { matches!(http_get(port, "/readyz"), Some((200, _))) },
        )
        .await;
    }
    for relay in &mut relays {
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(
            exit.success(),
            "{} exited with {exit}; log:\n{}",
            relay.name,
            relay.log_text()
        );
        let log = relay.log_text();
        assert!(
            log.matches("connected to RabbitMQ").count() >= 2,
            "{} never reconnected; log:\n{log}",
            relay.name
        );
    }

    let (_rabbit, channel) = rabbitmq_channel().await;
    let delivered = consume_queue(&channel, &queue).await;
    let committed = committed.lock().unwrap().clone();
    let check = check_delivery(&committed, &delivered);
    println!(
        "{} committed ({written_during_outage} while RabbitMQ was down for {:.1}s, {} pending at \
         restart); backlog drained {:.1}s after the restart; consumed {} messages, {} distinct, \
         {} duplicates",
        committed.len(),
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
    let (ok, status, err) = run_cli(&config, &["status", "--json"]);
    assert!(ok, "status failed: {err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        status["dead"], 0,
        "an outage must not dead-letter: {status}"
    );

    rabbitmq_delete(&channel, std::slice::from_ref(&queue), &exchange).await;
    sqlx::query(&format!("DROP TABLE {orders}, {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
