//! End to end: MySQL / MariaDB → `outbox-relay run` processes → every broker other than Redis
//! Streams (which `mysql_redis.rs` covers), checked by an independent reader of each broker:
//!
//! - RabbitMQ: 20,000 events over 500 aggregates, three relays, one SIGKILLed and restarted
//!   mid-run; read back from queues bound to the relay's exchange;
//! - SQS (LocalStack, FIFO queue): 5,000 events over 200 aggregates, two relays (LocalStack is
//!   slow), one SIGKILLed and restarted mid-run; read back with `ReceiveMessage` + delete, and
//!   per message group order checked;
//! - Kafka (tansu): 20,000 events over 500 aggregates, three relays, one SIGKILLed and restarted
//!   mid-run; read back from every partition of both topics.
//!
//! Each checks that every committed `event_id` arrived, nothing rolled back did, and per
//! aggregate the first occurrences came in commit (`id`) order.
//!
//! The relay binary must have `store-mysql`, `sink-rabbitmq`, `sink-sqs` and `sink-kafka`:
//! `cargo build -p outboxkit-relay --features sink-kafka`.
//!
//! Environment: `OUTBOX_TEST_MYSQL_URL`, `OUTBOX_TEST_RABBITMQ_URL`, `OUTBOX_TEST_KAFKA_BOOTSTRAP`,
//! `OUTBOX_TEST_SQS_ENDPOINT` (default `http://127.0.0.1:4566`).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, MessageSystemAttributeName};
use outboxkit_core::NewEvent;
use outboxkit_store_mysql::Outbox;
use outboxkit_tests::mysql_pending_rows as pending_rows;
use outboxkit_tests::*;
use uuid::Uuid;

type Committed = Arc<Mutex<HashMap<Uuid, (i64, String)>>>;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The credentials every relay process gets through the standard AWS chain (environment).
const AWS_ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

/// A configuration file for MySQL / MariaDB → the sink described by `sink` (the `[sink]`
/// table and its sub-table).
fn mysql_config(table: &str, sink: &str) -> String {
    format!(
        r#"
[store]
kind = "mysql"
url = "{url}"
table = "{table}"
shards = 32

[relay]
batch_size = 200
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "2s"
shutdown_grace = "10s"

{sink}

[server]
listen = ""
"#,
        url = mysql_url(),
    )
}

/// Drop the outbox table, its bookkeeping rows and the business table.
async fn drop_tables(pool: &sqlx::MySqlPool, table: &str, orders: &str) {
    sqlx::query(&format!("DROP TABLE IF EXISTS {orders}, {table}"))
        .execute(pool)
        .await
        .unwrap();
    for bookkeeping in ["outbox_relay_schema", "outbox_relay_members"] {
        sqlx::query(&format!("DELETE FROM {bookkeeping} WHERE table_name = ?"))
            .bind(table)
            .execute(pool)
            .await
            .unwrap();
    }
}

/// The size of one run.
#[derive(Debug, Clone, Copy)]
struct Scale {
    events: u64,
    aggregates: u64,
    writers: u64,
    relays: usize,
}

/// What the writers and relays did.
#[derive(Debug)]
struct Run {
    committed: HashMap<Uuid, (i64, String)>,
    rolled_back: Vec<Uuid>,
    killed_at: u64,
    write_secs: f64,
    drain_secs: f64,
    started: Instant,
}

impl Run {
    fn summary(&self) -> String {
        format!(
            "{} committed ({} rolled back), relay-0 SIGKILLed after {} writes and restarted; \
             writes took {:.1}s, outbox drained at {:.1}s",
            self.committed.len(),
            self.rolled_back.len(),
            self.killed_at,
            self.write_secs,
            self.drain_secs
        )
    }
}

/// The shared scenario: migrate (twice: it is idempotent), create the business table, start
/// `scale.relays` relays, run concurrent writers (each event in a business transaction that
/// updates — locks — its aggregate's row; every 50th rolls back; aggregates of even number are
/// `order`s, the others `customer`s), SIGKILL relay-0 once a third is written and start it
/// again, wait for the outbox to drain and for the relays to share every shard, then stop them
/// all with SIGTERM (each must exit cleanly).
async fn run_relays_and_writers(
    config: &Path,
    dir: &Path,
    pool: &sqlx::MySqlPool,
    table: &str,
    orders: &str,
    scale: Scale,
) -> Run {
    for _ in 0..2 {
        let (ok, out, err) = run_cli_with_env(config, &["migrate"], AWS_ENV);
        assert!(ok, "migrate failed: {out}{err}");
    }
    create_mysql_orders(pool, orders, scale.aggregates).await;

    let mut relays: Vec<RelayProcess> = (0..scale.relays)
        .map(|i| RelayProcess::start_with_env(config, dir, &format!("relay-{i}"), AWS_ENV))
        .collect();

    let committed: Committed = Arc::default();
    let rolled_back: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let outbox = Outbox::new(table).unwrap();
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..scale.writers {
        let (pool, outbox, committed, rolled_back, written, orders) = (
            pool.clone(),
            outbox.clone(),
            committed.clone(),
            rolled_back.clone(),
            written.clone(),
            orders.to_owned(),
        );
        writers.push(tokio::spawn(async move {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (w + 1);
            let mut n = 0;
            while n < scale.events / scale.writers {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let aggregate = (x % scale.aggregates).to_string();
                let kind = if x % scale.aggregates % 2 == 0 {
                    "order"
                } else {
                    "customer"
                };
                let mut tx = pool.begin().await.unwrap();
                sqlx::query(&format!(
                    "UPDATE {orders} SET version = version + 1 WHERE id = ?"
                ))
                .bind(&aggregate)
                .execute(&mut *tx)
                .await
                .unwrap();
                let event = NewEvent::new(
                    kind,
                    aggregate.clone(),
                    "Changed",
                    serde_json::json!({ "aggregate": aggregate, "w": w, "n": n, "note": "caf\u{e9}" }),
                )
                .header("traceparent", TRACEPARENT)
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
            async move { written.load(Ordering::Relaxed) >= scale.events / 3 }
        },
    )
    .await;
    relays[0].kill_hard();
    let killed_at = written.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    relays[0] = RelayProcess::start_with_env(config, dir, "relay-0", AWS_ENV);

    for w in writers {
        w.await.expect("writer");
    }
    let write_secs = started.elapsed().as_secs_f64();
    wait_for("the backlog to drain", Duration::from_secs(300), || {
        let (pool, table) = (pool.clone(), table.to_owned());
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let drain_secs = started.elapsed().as_secs_f64();

    // Every relay is alive and they share the shards; nothing is dead.
    let relay_count = scale.relays;
    wait_for(
        "the relays sharing the 32 shards",
        Duration::from_secs(30),
        || {
            let config = config.to_owned();
            async move {
                let (ok, status, _) = run_cli_with_env(&config, &["status", "--json"], AWS_ENV);
                let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
                ok && status["shards_owned"] == 32
                    && status["owners"].as_object().map(|o| o.len()) == Some(relay_count)
            }
        },
    )
    .await;
    let (ok, status, err) = run_cli_with_env(config, &["status", "--json"], AWS_ENV);
    assert!(ok, "status failed: {err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["dead"], 0, "{status}");
    for owner in status["owners"].as_object().unwrap().keys() {
        assert!(owner.starts_with("relay-"), "{status}");
    }

    for relay in &mut relays {
        let exit = relay.terminate(Duration::from_secs(30));
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    let committed = committed.lock().unwrap().clone();
    let rolled_back = rolled_back.lock().unwrap().clone();
    assert_eq!(committed.len() as u64, scale.events);
    assert!(!rolled_back.is_empty());
    Run {
        committed,
        rolled_back,
        killed_at,
        write_secs,
        drain_secs,
        started,
    }
}

/// The checks every sink shares: every committed event arrived, nothing else and nothing rolled
/// back did, per aggregate the first occurrences came in `id` order, and each message names
/// its aggregate.
fn assert_delivery(run: &Run, check: &DeliveryCheck, delivered: &[StreamMessage]) {
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
    let rolled_back: HashSet<Uuid> = run.rolled_back.iter().copied().collect();
    assert!(
        delivered.iter().all(|m| !rolled_back.contains(&m.event_id)),
        "a rolled-back event was published"
    );
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken ({} violations): {:?}",
        check.order_violations.len(),
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    for m in delivered {
        let (_, aggregate) = &run.committed[&m.event_id];
        assert_eq!(&m.aggregate_id, aggregate, "{m:?}");
        let payload: serde_json::Value =
            serde_json::from_str(&m.payload).unwrap_or_else(|e| panic!("{e}: {m:?}"));
        assert_eq!(payload["aggregate"], aggregate.as_str(), "{m:?}");
        assert_eq!(payload["note"], "caf\u{e9}", "{m:?}");
    }
}

// ---- SQS (FIFO) ---------------------------------------------------------------------------

fn sqs_endpoint() -> String {
    std::env::var("OUTBOX_TEST_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned())
}

/// An SQS client for the consumer and set-up: short attempts, the consumer retries by itself.
fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    let config = aws_sdk_sqs::Config::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "outboxkit-tests",
        ))
        .endpoint_url(endpoint)
        .timeout_config(
            aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(5))
                .build(),
        )
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::standard().with_max_attempts(1))
        .build();
    aws_sdk_sqs::Client::from_conf(config)
}

/// Create a FIFO queue or fail the test saying what to start.
async fn create_fifo_queue(client: &aws_sdk_sqs::Client, name: &str, endpoint: &str) -> String {
    let request = client
        .create_queue()
        .queue_name(name)
        .attributes(aws_sdk_sqs::types::QueueAttributeName::FifoQueue, "true");
    match request.send().await {
        Ok(answer) => answer.queue_url().expect("a queue URL").to_owned(),
        Err(e) => panic!(
            "creating SQS queue {name} at {endpoint} failed ({}): is the SQS server up? start it \
             with scripts/services.sh or set OUTBOX_TEST_SQS_ENDPOINT",
            DisplayErrorContext(&e)
        ),
    }
}

/// One message as the independent consumer received it.
#[derive(Debug, Clone)]
struct Delivered {
    event_id: Uuid,
    aggregate_id: String,
    group_id: Option<String>,
    traceparent: String,
    body: String,
}

/// An independent consumer: `tasks` loops of `ReceiveMessage`, each recording its messages
/// before deleting them (a FIFO queue hands out a group's next message only once the previous
/// one is deleted, so the record keeps each group's order), until stopped.
struct Consumer {
    records: Arc<Mutex<Vec<Delivered>>>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Consumer {
    fn start(client: aws_sdk_sqs::Client, url: String, tasks: usize) -> Self {
        let records: Arc<Mutex<Vec<Delivered>>> = Arc::default();
        let errors = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..tasks)
            .map(|_| {
                let (client, url, records, errors, stop) = (
                    client.clone(),
                    url.clone(),
                    records.clone(),
                    errors.clone(),
                    stop.clone(),
                );
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        consume_once(&client, &url, &records, &errors).await;
                    }
                })
            })
            .collect();
        Self {
            records,
            errors,
            stop,
            tasks,
        }
    }

    fn distinct(&self) -> HashSet<Uuid> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.event_id)
            .collect()
    }

    async fn wait_for_all(&self, committed: &HashMap<Uuid, (i64, String)>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.distinct();
            let missing = committed.keys().filter(|id| !seen.contains(id)).count();
            if missing == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the consumer still misses {missing} of {} committed events after {timeout:?} \
                 ({} receive/delete errors)",
                committed.len(),
                self.errors.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(self) -> Vec<Delivered> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = task.await;
        }
        let records = self.records.lock().unwrap().clone();
        records
    }
}

async fn consume_once(
    client: &aws_sdk_sqs::Client,
    url: &str,
    records: &Mutex<Vec<Delivered>>,
    errors: &AtomicU64,
) {
    let answer = match client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(10)
        .wait_time_seconds(1)
        .visibility_timeout(20)
        .message_attribute_names("All")
        .message_system_attribute_names(MessageSystemAttributeName::MessageGroupId)
        .send()
        .await
    {
        Ok(answer) => answer,
        Err(_) => {
            errors.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(500)).await;
            return;
        }
    };
    let mut handles = Vec::new();
    {
        let mut records = records.lock().unwrap();
        for message in answer.messages() {
            let attribute = |name: &str| {
                message
                    .message_attributes()
                    .and_then(|a| a.get(name))
                    .and_then(|v| v.string_value())
                    .unwrap_or_default()
                    .to_owned()
            };
            records.push(Delivered {
                event_id: Uuid::parse_str(&attribute("event_id")).unwrap_or_default(),
                aggregate_id: attribute("aggregate_id"),
                group_id: message
                    .attributes()
                    .and_then(|a| a.get(&MessageSystemAttributeName::MessageGroupId))
                    .cloned(),
                traceparent: attribute("traceparent"),
                body: message.body().unwrap_or_default().to_owned(),
            });
            if let Some(handle) = message.receipt_handle() {
                handles.push(handle.to_owned());
            }
        }
    }
    if handles.is_empty() {
        return;
    }
    let entries: Vec<DeleteMessageBatchRequestEntry> = handles
        .iter()
        .enumerate()
        .map(|(i, handle)| {
            DeleteMessageBatchRequestEntry::builder()
                .id(format!("d{i}"))
                .receipt_handle(handle)
                .build()
                .expect("a delete entry")
        })
        .collect();
    // Keep deleting through a hiccup: an undeleted FIFO message blocks its group.
    let deadline = Instant::now() + Duration::from_secs(60);
    while client
        .delete_message_batch()
        .queue_url(url)
        .set_entries(Some(entries.clone()))
        .send()
        .await
        .is_err()
        && Instant::now() < deadline
    {
        errors.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqs_fifo_two_relays_one_sigkilled_deliver_every_event_in_group_order() {
    let table = unique("e2e_mysqs");
    let orders = format!("{table}_orders");
    let queue = format!("{}.fifo", unique("e2e-mysqs"));
    let endpoint = sqs_endpoint();
    let client = sqs_client(&endpoint);
    let url = create_fifo_queue(&client, &queue, &endpoint).await;
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &mysql_config(
            &table,
            &format!(
                r#"[sink]
kind = "sqs"

[sink.sqs]
queue = "{queue}"
endpoint = "{endpoint}"
region = "us-east-1""#
            ),
        ),
    );
    let pool = mysql_pool(&mysql_url()).await;
    let consumer = Consumer::start(client.clone(), url.clone(), 4);

    let run = run_relays_and_writers(
        &config,
        &dir,
        &pool,
        &table,
        &orders,
        Scale {
            events: 5_000,
            aggregates: 200,
            writers: 4,
            relays: 2,
        },
    )
    .await;
    consumer
        .wait_for_all(&run.committed, Duration::from_secs(180))
        .await;
    let consumed_secs = run.started.elapsed().as_secs_f64();
    // A little longer, so late duplicates are counted too.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let errors = consumer.errors.load(Ordering::Relaxed);
    let delivered = consumer.stop().await;
    let messages: Vec<StreamMessage> = delivered
        .iter()
        .map(|d| StreamMessage {
            stream: queue.clone(),
            event_id: d.event_id,
            aggregate_id: d.aggregate_id.clone(),
            payload: d.body.clone(),
            fields: HashMap::new(),
        })
        .collect();
    let check = check_delivery(&run.committed, &messages);
    println!(
        "MariaDB → SQS FIFO queue {queue}: {}; the consumer had every event at \
         {consumed_secs:.1}s; received {} messages ({} distinct, {} duplicates, {errors} \
         receive/delete errors)",
        run.summary(),
        check.messages,
        check.distinct,
        check.duplicates
    );
    assert_delivery(&run, &check, &messages);
    // FIFO: the message group is the aggregate (so the order checked above is SQS's per-group
    // order), and the writer's headers travel as message attributes.
    for d in &delivered {
        let (_, aggregate) = &run.committed[&d.event_id];
        assert_eq!(d.group_id.as_deref(), Some(aggregate.as_str()), "{d:?}");
        assert_eq!(d.traceparent, TRACEPARENT, "{d:?}");
    }

    let _ = client.delete_queue().queue_url(&url).send().await;
    drop_tables(&pool, &table, &orders).await;
}
