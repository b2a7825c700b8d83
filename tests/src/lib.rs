//! Support for the end-to-end tests: service URLs, the `outbox-relay` binary as a child
//! process, and an independent reader of Redis streams.
//!
//! Services are real. A test fails — never skips — when one is unreachable.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use uuid::Uuid;

/// PostgreSQL for tests: `OUTBOX_TEST_POSTGRES_URL`, default the machine's local server.
pub fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Redis for tests: `OUTBOX_TEST_REDIS_URL`, default the machine's local server.
pub fn redis_url() -> String {
    std::env::var("OUTBOX_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned())
}

/// A short random name part, so every test has its own table and streams.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}_{}", &Uuid::new_v4().simple().to_string()[..10])
}

/// The `outbox-relay` binary built by `cargo build -p outboxkit-relay`.
pub fn relay_binary() -> PathBuf {
    if let Ok(path) = std::env::var("OUTBOX_TEST_RELAY_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join("outbox-relay");
    assert!(
        path.exists(),
        "{} does not exist: build it first with `cargo build -p outboxkit-relay` (scripts/test.sh does), \
         or point OUTBOX_TEST_RELAY_BIN at it",
        path.display()
    );
    path
}

/// A scratch directory for config files and relay logs.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join("outbox-relay-tests").join(name);
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}

/// Write `text` to `dir/name` and return the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("creating a test file");
    f.write_all(text.as_bytes()).expect("writing a test file");
    path
}

/// A relay process; killed (SIGKILL) when dropped if still running.
#[derive(Debug)]
pub struct RelayProcess {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl RelayProcess {
    /// Start `outbox-relay --config <config> run`, logging to `dir/<name>.log`.
    pub fn start(config: &Path, dir: &Path, name: &str) -> Self {
        Self::start_with_env(config, dir, name, &[])
    }

    /// Same with extra environment variables.
    pub fn start_with_env(config: &Path, dir: &Path, name: &str, env: &[(&str, &str)]) -> Self {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("opening the relay log");
        let err = out.try_clone().expect("cloning the log handle");
        let mut cmd = Command::new(relay_binary());
        cmd.arg("--config")
            .arg(config)
            .arg("run")
            .env("OUTBOX_RELAY__RELAY_ID", name)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("starting outbox-relay");
        Self {
            name: name.to_owned(),
            child,
            log,
        }
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit status (bounded).
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the relay") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{} did not exit within {timeout:?} of SIGTERM; log:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.kill_hard();
        }
    }
}

/// Run `outbox-relay --config FILE <args>` to completion; returns (success, stdout, stderr).
pub fn run_cli(config: &Path, args: &[&str]) -> (bool, String, String) {
    run_cli_with_env(config, args, &[])
}

/// Same with extra environment variables (e.g. AWS test credentials).
pub fn run_cli_with_env(
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let out = Command::new(relay_binary())
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("running outbox-relay");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Rows of `table` not yet published and not dead (the same SQL on PostgreSQL and MySQL).
fn pending_rows_sql(table: &str) -> String {
    format!("SELECT COUNT(*) FROM {table} WHERE published_at IS NULL AND dead_at IS NULL")
}

/// Pending rows of a PostgreSQL outbox table.
pub async fn pending_rows(pool: &sqlx::PgPool, table: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(&pending_rows_sql(table))
        .fetch_one(pool)
        .await
        .expect("counting pending rows")
}

/// Pending rows of a MySQL / MariaDB outbox table.
pub async fn mysql_pending_rows(pool: &sqlx::MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(&pending_rows_sql(table))
        .fetch_one(pool)
        .await
        .expect("counting pending rows")
}

/// A configuration file for PostgreSQL → Redis Streams.
pub fn postgres_redis_config(
    table: &str,
    stream_template: &str,
    listen: &str,
    extra_relay: &str,
) -> String {
    format!(
        r#"
[store]
kind = "postgres"
url = "{pg}"
table = "{table}"
shards = 32

[relay]
batch_size = 200
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "2s"
shutdown_grace = "10s"
{extra_relay}

[sink]
kind = "redis-streams"
destination = "{stream_template}"

[sink.redis_streams]
url = "{redis}"

[server]
listen = "{listen}"
"#,
        pg = postgres_url(),
        redis = redis_url(),
    )
}

/// One message read back from a stream.
#[derive(Debug, Clone)]
pub struct StreamMessage {
    pub stream: String,
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub payload: String,
    pub fields: HashMap<String, String>,
}

/// Read whole streams back with XRANGE, independently of the relay.
pub async fn read_streams(
    redis: &mut redis::aio::MultiplexedConnection,
    streams: &[String],
) -> Vec<StreamMessage> {
    let mut out = Vec::new();
    for stream in streams {
        let mut cursor = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&cursor)
                .arg("+")
                .arg("COUNT")
                .arg(5000)
                .query_async(redis)
                .await
                .expect("XRANGE");
            for entry in &reply.ids {
                let mut fields: HashMap<String, String> = entry
                    .map
                    .iter()
                    .filter_map(|(k, v)| {
                        redis::from_redis_value_ref::<String>(v)
                            .ok()
                            .map(|s| (k.clone(), s))
                    })
                    .collect();
                // The stream entry id (server time-sequence), under a name no field uses.
                fields.insert("__entry_id".to_owned(), entry.id.clone());
                out.push(StreamMessage {
                    stream: stream.clone(),
                    event_id: fields
                        .get("event_id")
                        .and_then(|s| Uuid::parse_str(s).ok())
                        .unwrap_or_default(),
                    aggregate_id: fields.get("aggregate_id").cloned().unwrap_or_default(),
                    payload: fields.get("payload").cloned().unwrap_or_default(),
                    fields,
                });
            }
            match reply.ids.last() {
                Some(last) if reply.ids.len() == 5000 => cursor = format!("({}", last.id),
                _ => break,
            }
        }
    }
    out
}

/// Connect to Redis or fail the test with a message that says what to start.
pub async fn redis_connection() -> redis::aio::MultiplexedConnection {
    let url = redis_url();
    let client =
        redis::Client::open(url.as_str()).expect("OUTBOX_TEST_REDIS_URL is a redis:// URL");
    client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("Redis at {url} is unreachable ({e}): start it (scripts/services.sh)")
        })
}

/// Connect to PostgreSQL or fail the test with a message that says what to start.
pub async fn postgres_pool() -> sqlx::PgPool {
    let url = postgres_url();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(12)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable ({e}): start it (scripts/services.sh)")
        })
}

/// The result of checking delivered messages against what was committed.
#[derive(Debug, Default)]
pub struct DeliveryCheck {
    pub messages: usize,
    pub distinct: usize,
    pub duplicates: usize,
    pub missing: Vec<Uuid>,
    pub unexpected: Vec<Uuid>,
    pub order_violations: Vec<String>,
}

/// Every committed `event_id` must be delivered, nothing else may be, and per aggregate the
/// first occurrences must come in `id` order. `committed` maps event id → (row id, aggregate).
pub fn check_delivery(
    committed: &HashMap<Uuid, (i64, String)>,
    delivered: &[StreamMessage],
) -> DeliveryCheck {
    let mut check = DeliveryCheck {
        messages: delivered.len(),
        ..DeliveryCheck::default()
    };
    let mut seen = std::collections::HashSet::new();
    let mut last_id: HashMap<&str, i64> = HashMap::new();
    for m in delivered {
        if !seen.insert(m.event_id) {
            check.duplicates += 1;
            continue;
        }
        let Some((id, aggregate)) = committed.get(&m.event_id) else {
            check.unexpected.push(m.event_id);
            continue;
        };
        if let Some(prev) = last_id.insert(aggregate.as_str(), *id) {
            if prev > *id {
                check.order_violations.push(format!(
                    "aggregate {aggregate}: id {id} arrived after {prev}"
                ));
            }
        }
    }
    check.distinct = seen.len();
    check.missing = committed
        .keys()
        .filter(|id| !seen.contains(*id))
        .copied()
        .collect();
    check
}

/// A PostgreSQL business table `orders` with rows `{prefix}0` .. `{prefix}{aggregates - 1}`.
///
/// Writers that run concurrently must update (and so lock) an aggregate's row before
/// enqueueing its event: that is the writer contract that makes `id` order the commit order of
/// an aggregate (README, "Writing events"). Without it two transactions can take ids 7 and 8
/// for one aggregate and commit 8 first, and no relay can publish them in `id` order.
pub async fn create_postgres_orders(
    pool: &sqlx::PgPool,
    orders: &str,
    prefix: &str,
    aggregates: u64,
) {
    sqlx::query(&format!(
        "CREATE TABLE {orders} (id text PRIMARY KEY, version bigint NOT NULL)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {orders} SELECT $1 || g, 0 FROM generate_series(0, {}) g",
        aggregates - 1
    ))
    .bind(prefix)
    .execute(pool)
    .await
    .unwrap();
}

/// The MySQL/MariaDB business table `orders` with rows `0` .. `aggregates - 1` (see
/// [`create_postgres_orders`] for why concurrent writers need it).
pub async fn create_mysql_orders(pool: &sqlx::MySqlPool, orders: &str, aggregates: u64) {
    sqlx::query(&format!(
        "CREATE TABLE {orders} (id VARCHAR(16) PRIMARY KEY, version INT NOT NULL) ENGINE = InnoDB"
    ))
    .execute(pool)
    .await
    .unwrap();
    let values: Vec<String> = (0..aggregates).map(|a| format!("('{a}', 0)")).collect();
    sqlx::query(&format!(
        "INSERT INTO {orders} VALUES {}",
        values.join(", ")
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// The writer contract's first step: update (and so lock) `aggregate`'s row of the business
/// table made by [`create_postgres_orders`], inside the writer's transaction.
pub async fn touch_postgres_order(tx: &mut sqlx::PgConnection, orders: &str, aggregate: &str) {
    sqlx::query(&format!(
        "UPDATE {orders} SET version = version + 1 WHERE id = $1"
    ))
    .bind(aggregate)
    .execute(tx)
    .await
    .unwrap();
}

/// Poll `cond` until it holds or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

/// GET `path` from 127.0.0.1:`port` with a bare HTTP/1.1 request; (status code, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

/// The value of an unlabelled (or first matching) Prometheus sample.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

/// MySQL / MariaDB for tests: `OUTBOX_TEST_MYSQL_URL`, default the machine's local MariaDB.
pub fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A configuration file for MySQL / MariaDB (at `url`) → Redis Streams.
pub fn mysql_redis_config(
    url: &str,
    table: &str,
    stream_template: &str,
    listen: &str,
    extra_relay: &str,
) -> String {
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
{extra_relay}

[sink]
kind = "redis-streams"
destination = "{stream_template}"

[sink.redis_streams]
url = "{redis}"

[server]
listen = "{listen}"
"#,
        redis = redis_url(),
    )
}

/// Connect to MySQL / MariaDB at `url` or fail the test with a message that says what to start.
pub async fn mysql_pool(url: &str) -> sqlx::MySqlPool {
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(12)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
        .unwrap_or_else(|e| {
            panic!("MySQL at {url} is unreachable ({e}): start it (scripts/services.sh)")
        })
}

/// RabbitMQ for tests: `OUTBOX_TEST_RABBITMQ_URL`, default the machine's local broker.
pub fn rabbitmq_url() -> String {
    std::env::var("OUTBOX_TEST_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// A configuration file for PostgreSQL → RabbitMQ: events go to `exchange` (declared by the
/// relay, topic, durable) with the default routing key `{aggregate_type}.{event_type}`.
pub fn postgres_rabbitmq_config(
    table: &str,
    exchange: &str,
    listen: &str,
    extra_relay: &str,
) -> String {
    format!(
        r#"
[store]
kind = "postgres"
url = "{pg}"
table = "{table}"
shards = 32

[relay]
batch_size = 200
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "2s"
shutdown_grace = "10s"
{extra_relay}

[sink]
kind = "rabbitmq"

[sink.rabbitmq]
url = "{amqp}"
exchange = "{exchange}"
declare_exchange = true
exchange_type = "topic"
connect_timeout = "5s"
confirm_timeout = "15s"

[server]
listen = "{listen}"
"#,
        pg = postgres_url(),
        amqp = rabbitmq_url(),
    )
}

/// A connection and channel to RabbitMQ, or fail the test with a message that says what to
/// start.
pub async fn rabbitmq_channel() -> (lapin::Connection, lapin::Channel) {
    let url = rabbitmq_url();
    let connect = lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
    let connection = match tokio::time::timeout(Duration::from_secs(10), connect).await {
        Ok(Ok(connection)) => connection,
        Ok(Err(e)) => panic!("RabbitMQ is unreachable ({e}): start it (scripts/services.sh)"),
        Err(_) => panic!("RabbitMQ did not answer within 10s: start it (scripts/services.sh)"),
    };
    let channel = connection
        .create_channel()
        .await
        .expect("opening a RabbitMQ channel");
    (connection, channel)
}

/// Declare `exchange` (topic, durable, as the relay configuration above does) and a durable
/// queue bound to it for `binding_key`; the queue expires an hour after its last use.
pub async fn rabbitmq_bound_queue(
    channel: &lapin::Channel,
    exchange: &str,
    queue: &str,
    binding_key: &str,
) {
    use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable};
    channel
        .exchange_declare(
            exchange.into(),
            lapin::ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("declaring exchange {exchange}: {e}"));
    let mut arguments = FieldTable::default();
    arguments.insert("x-expires".into(), AMQPValue::LongInt(3_600_000));
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            arguments,
        )
        .await
        .unwrap_or_else(|e| panic!("declaring queue {queue}: {e}"));
    channel
        .queue_bind(
            queue.into(),
            exchange.into(),
            binding_key.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("binding queue {queue} to {exchange} ({binding_key}): {e}"));
}

/// Consume everything `queue` holds now, in queue order, as an independent consumer
/// (`basic.consume`, no ack: the messages leave the queue). Each message becomes a
/// [`StreamMessage`] (`stream` = the queue, `event_id` = `message_id`, `fields` = the AMQP
/// headers plus `routing_key`), so [`check_delivery`] applies.
pub async fn consume_queue(channel: &lapin::Channel, queue: &str) -> Vec<StreamMessage> {
    use lapin::options::{BasicCancelOptions, BasicConsumeOptions, QueueDeclareOptions};
    use lapin::types::{AMQPValue, FieldTable};
    let expected = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("queue {queue}: {e}"))
        .message_count() as usize;
    let tag = unique("reader");
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.as_str().into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("consuming {queue}: {e}"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
        let tx = tx.clone();
        async move {
            if let Ok(Some(delivery)) = delivery {
                let _ = tx.send(delivery);
            }
        }
    });
    // lapin runs the delegate as one task per delivery, so deliveries reach the channel in
    // any order: collect them all, then restore the queue order by delivery tag.
    let mut deliveries = Vec::with_capacity(expected);
    let deadline = Instant::now() + Duration::from_secs(60);
    while deliveries.len() < expected {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(delivery)) = tokio::time::timeout(left, rx.recv()).await else {
            panic!(
                "{queue}: got {} of its {expected} messages within 60s",
                deliveries.len()
            );
        };
        deliveries.push(delivery);
    }
    let _ = channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await;
    deliveries.sort_by_key(|d: &lapin::message::Delivery| d.delivery_tag);
    let mut out = Vec::with_capacity(expected);
    for delivery in deliveries {
        let mut fields: HashMap<String, String> = delivery
            .properties
            .headers()
            .as_ref()
            .map(|table| {
                table
                    .inner()
                    .iter()
                    .filter_map(|(k, v)| match v {
                        AMQPValue::LongString(s) => Some((
                            k.to_string(),
                            String::from_utf8_lossy(s.as_bytes()).into_owned(),
                        )),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        fields.insert("routing_key".to_owned(), delivery.routing_key.to_string());
        out.push(StreamMessage {
            stream: queue.to_owned(),
            event_id: delivery
                .properties
                .message_id()
                .as_ref()
                .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                .unwrap_or_default(),
            aggregate_id: fields.get("aggregate_id").cloned().unwrap_or_default(),
            payload: String::from_utf8_lossy(&delivery.data).into_owned(),
            fields,
        });
    }
    out
}

/// Delete RabbitMQ queues and an exchange (test clean-up; errors ignored).
pub async fn rabbitmq_delete(channel: &lapin::Channel, queues: &[String], exchange: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    for queue in queues {
        let _ = channel
            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let _ = channel
        .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
        .await;
}

// ---- Kafka (sink-kafka) -------------------------------------------------------------------

/// The Kafka-API broker for tests: `OUTBOX_TEST_KAFKA_BOOTSTRAP`, default the tansu broker
/// that `scripts/services.sh` starts on 127.0.0.1:9092.
pub fn kafka_bootstrap() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A configuration file for PostgreSQL → Kafka. `extra_kafka` lines go into `[sink.kafka]`.
pub fn postgres_kafka_config(
    table: &str,
    topic_template: &str,
    bootstrap: &str,
    listen: &str,
    extra_relay: &str,
    extra_kafka: &str,
) -> String {
    format!(
        r#"
[store]
kind = "postgres"
url = "{pg}"
table = "{table}"
shards = 32

[relay]
batch_size = 200
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "2s"
shutdown_grace = "10s"
{extra_relay}

[sink]
kind = "kafka"
destination = "{topic_template}"

[sink.kafka]
"bootstrap.servers" = "{bootstrap}"
{extra_kafka}

[server]
listen = "{listen}"
"#,
        pg = postgres_url(),
    )
}

/// Create `topics` (each with `partitions` partitions and the given topic configs) on the
/// broker at `bootstrap`, or fail the test saying what to start.
pub async fn kafka_create_topics(
    bootstrap: &str,
    topics: &[String],
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let specs: Vec<outboxkit_sink_kafka::TopicSpec> = topics
        .iter()
        .map(|t| {
            configs.iter().fold(
                outboxkit_sink_kafka::TopicSpec::new(t.clone(), partitions),
                |spec, (k, v)| spec.config(*k, *v),
            )
        })
        .collect();
    let config = outboxkit_sink_kafka::KafkaSinkConfig::new(bootstrap);
    outboxkit_sink_kafka::ensure_topics(&config, &specs, Duration::from_secs(15))
        .await
        .unwrap_or_else(|e| {
            panic!("creating topics on Kafka at {bootstrap} failed ({e}): start it (scripts/services.sh)")
        });
}

/// One message read back from Kafka: its partition and offset, and the message as the
/// delivery checks take it (`fields` = the headers, `aggregate_id` = the key).
#[derive(Debug, Clone)]
pub struct KafkaMessage {
    pub partition: i32,
    pub offset: i64,
    pub message: StreamMessage,
}

/// Read every message of every partition of `topics` from the beginning, independently of
/// the relay (a plain consumer with manually assigned partitions): until `expected` distinct
/// event ids arrived and then 2 s passed without a message (so late duplicates are seen too),
/// or until `timeout`. (Partition end offsets are not used: tansu 0.6's ListOffsets high
/// watermark lags behind when a produce batch holds several records.)
pub async fn read_kafka_topics(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
) -> Vec<KafkaMessage> {
    let bootstrap = bootstrap.to_owned();
    let topics = topics.to_vec();
    tokio::task::spawn_blocking(move || {
        read_kafka_topics_blocking(&bootstrap, &topics, expected, timeout)
    })
    .await
    .expect("the Kafka reader thread")
}

fn read_kafka_topics_blocking(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
) -> Vec<KafkaMessage> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};

    const QUIET: Duration = Duration::from_secs(2);
    let deadline = Instant::now() + timeout;
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", unique("reader"))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .expect("creating the test consumer");
    let mut assignment = rdkafka::TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .unwrap_or_else(|e| panic!("metadata of {topic} from Kafka at {bootstrap}: {e}"));
        for t in metadata.topics().iter().filter(|t| t.name() == topic) {
            for p in t.partitions() {
                assignment
                    .add_partition_offset(topic, p.id(), rdkafka::Offset::Beginning)
                    .expect("assigning a partition");
            }
        }
    }
    assert!(
        assignment.count() > 0,
        "Kafka at {bootstrap} has none of the topics {topics:?}"
    );
    consumer.assign(&assignment).expect("assigning partitions");
    let mut out = Vec::new();
    let mut distinct = std::collections::HashSet::new();
    let mut last_message = Instant::now();
    while Instant::now() < deadline {
        if distinct.len() >= expected && last_message.elapsed() >= QUIET {
            break;
        }
        let Some(result) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = result.unwrap_or_else(|e| panic!("reading Kafka at {bootstrap}: {e}"));
        last_message = Instant::now();
        let fields: HashMap<String, String> = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|header| {
                        (
                            header.key.to_owned(),
                            String::from_utf8_lossy(header.value.unwrap_or_default()).into_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let event_id = fields
            .get("event_id")
            .and_then(|s| Uuid::parse_str(s).ok())
            .unwrap_or_default();
        distinct.insert(event_id);
        out.push(KafkaMessage {
            partition: m.partition(),
            offset: m.offset(),
            message: StreamMessage {
                stream: m.topic().to_owned(),
                event_id,
                aggregate_id: String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                payload: String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned(),
                fields,
            },
        });
    }
    out
}

/// Every aggregate's messages in one partition (of its topic); returns the violations.
pub fn kafka_partition_violations(messages: &[KafkaMessage]) -> Vec<String> {
    let mut home: HashMap<(&str, &str), i32> = HashMap::new();
    let mut violations = Vec::new();
    for m in messages {
        let key = (m.message.stream.as_str(), m.message.aggregate_id.as_str());
        let partition = *home.entry(key).or_insert(m.partition);
        if partition != m.partition {
            violations.push(format!(
                "aggregate {} of {} in partitions {partition} and {}",
                key.1, key.0, m.partition
            ));
        }
    }
    violations
}

/// A private Kafka-API broker (tansu, in-memory) on a free loopback port, for tests that
/// freeze their broker without disturbing the shared one. Killed when dropped.
#[derive(Debug)]
pub struct KafkaBrokerProcess {
    pub bootstrap: String,
    child: Child,
}

impl KafkaBrokerProcess {
    /// The tansu binary: `OUTBOX_TEST_TANSU_BIN`, default where `scripts/services.sh`
    /// installs it.
    pub fn binary() -> PathBuf {
        let path = std::env::var("OUTBOX_TEST_TANSU_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from("/opt/outbox-relay/tansu/bin/tansu"));
        assert!(
            path.exists(),
            "{} does not exist: install the Kafka-API broker with scripts/services.sh \
             (or point OUTBOX_TEST_TANSU_BIN at a tansu binary)",
            path.display()
        );
        path
    }

    /// Start it and wait until it answers.
    pub fn start(dir: &Path) -> Self {
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("tansu.log")).expect("creating the broker log");
        let child = Command::new(Self::binary())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("cloning the log handle"))
            .stderr(log)
            .spawn()
            .expect("starting tansu");
        let broker = Self {
            bootstrap: format!("127.0.0.1:{port}"),
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "tansu did not listen on {port} within 30s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        broker
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {signal} of the test broker failed");
    }

    /// SIGSTOP: the broker stops answering (connections stay open, requests hang) and
    /// forgets nothing — what a hung or unreachable broker looks like to the relay.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT: the broker answers again.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }
}

impl Drop for KafkaBrokerProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
