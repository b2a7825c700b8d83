//! Broker sides of the benchmark: Redis Streams, Kafka (a private tansu broker), RabbitMQ and
//! SQS (LocalStack). Each resets to an empty destination, counts what was delivered, and runs
//! an independent consumer for the latency runs.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::Sink;
use outboxkit_sink_kafka::{ensure_topics, KafkaSink, KafkaSinkConfig, TopicSpec};
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
use outboxkit_sink_sqs::{SqsConfig, SqsSink};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::pair::BrokerSide;

/// The first line a command prints, or "unknown".
pub fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{cmd} (version unknown)"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Redis Streams side: one stream, `bench.order`.
pub struct RedisSide {
    url: String,
    sink: Arc<RedisStreamsSink>,
    connection: redis::aio::MultiplexedConnection,
}

const STREAM: &str = "bench.order";

impl RedisSide {
    pub async fn open(url: &str) -> Result<Self, String> {
        let mut config = RedisStreamsConfig::new(url);
        config.stream = STREAM.to_owned();
        let sink = RedisStreamsSink::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            url: url.to_owned(),
            sink: Arc::new(sink),
            connection,
        })
    }
}

#[async_trait]
impl BrokerSide for RedisSide {
    fn describe(&self) -> String {
        first_line("redis-server", &["--version"])
    }

    fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    fn relay_toml(&self) -> String {
        format!(
            "[sink]\nkind = \"redis-streams\"\ndestination = \"{STREAM}\"\n\n[sink.redis_streams]\nurl = \"{}\"\n",
            self.url
        )
    }

    async fn reset(&self) -> Result<(), String> {
        redis::cmd("DEL")
            .arg(STREAM)
            .query_async::<()>(&mut self.connection.clone())
            .await
            .map_err(|e| e.to_string())
    }

    async fn delivered(&self, _expected: u64) -> Result<u64, String> {
        redis::cmd("XLEN")
            .arg(STREAM)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| e.to_string())
    }

    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String> {
        let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
        // A dedicated connection: XREAD BLOCK holds it.
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut last = "$".to_owned();
            loop {
                let reply: Result<Option<redis::streams::StreamReadReply>, _> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("BLOCK")
                    .arg(200)
                    .arg("STREAMS")
                    .arg(STREAM)
                    .arg(&last)
                    .query_async(&mut connection)
                    .await;
                let Ok(reply) = reply else { return };
                let now = Instant::now();
                for key in reply.map(|r| r.keys).unwrap_or_default() {
                    for entry in key.ids {
                        let id: String = entry.get("event_id").unwrap_or_default();
                        if let Ok(id) = Uuid::parse_str(&id) {
                            if tx.send((id, now)).is_err() {
                                return;
                            }
                        }
                        last = entry.id;
                    }
                }
            }
        });
        Ok(rx)
    }
}

// ---- Kafka ---------------------------------------------------------------------------------

const TOPIC: &str = "bench.order";
const PARTITIONS: i32 = 8;

/// Kafka side: a private tansu broker (in-memory storage) that each reset replaces by a fresh
/// one, so the runs do not pile messages up in memory; topic `bench.order`, 8 partitions.
pub struct KafkaSide {
    bin: PathBuf,
    state: Mutex<Option<KafkaState>>,
}

struct KafkaState {
    child: Child,
    bootstrap: String,
    sink: Arc<KafkaSink>,
}

impl Drop for KafkaSide {
    fn drop(&mut self) {
        if let Some(mut old) = lock(&self.state).take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
    }
}

impl KafkaSide {
    pub async fn open(bin: &Path) -> Result<Self, String> {
        if !bin.exists() {
            return Err(format!(
                "{} does not exist: install the Kafka-API broker with scripts/services.sh kafka \
                 (or pass --tansu-bin)",
                bin.display()
            ));
        }
        let side = Self {
            bin: bin.to_owned(),
            state: Mutex::new(None),
        };
        side.reset().await?;
        Ok(side)
    }

    fn bootstrap(&self) -> String {
        lock(&self.state)
            .as_ref()
            .map(|s| s.bootstrap.clone())
            .unwrap_or_default()
    }

    fn start_broker(&self) -> Result<(Child, String), String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = std::fs::File::create(std::env::temp_dir().join("outbox-bench-tansu.log"))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.bin.display()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "tansu did not listen on 127.0.0.1:{port} within 30 s"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((child, format!("127.0.0.1:{port}")))
    }
}

#[async_trait]
impl BrokerSide for KafkaSide {
    fn describe(&self) -> String {
        format!(
            "{} (Kafka API, in-memory storage)",
            first_line(&self.bin.to_string_lossy(), &["--version"])
        )
    }

    fn sink(&self) -> Arc<dyn Sink> {
        lock(&self.state)
            .as_ref()
            .map(|s| s.sink.clone() as Arc<dyn Sink>)
            .expect("the Kafka side is reset before use")
    }

    fn relay_toml(&self) -> String {
        format!(
            "[sink]\nkind = \"kafka\"\ndestination = \"{TOPIC}\"\n\n[sink.kafka]\n\"bootstrap.servers\" = \"{}\"\n",
            self.bootstrap()
        )
    }

    async fn reset(&self) -> Result<(), String> {
        if let Some(mut old) = lock(&self.state).take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        let (child, bootstrap) = self.start_broker()?;
        let mut config = KafkaSinkConfig::new(bootstrap.clone());
        config.topic = TOPIC.to_owned();
        ensure_topics(
            &config,
            &[TopicSpec::new(TOPIC, PARTITIONS)],
            Duration::from_secs(15),
        )
        .await
        .map_err(|e| format!("creating {TOPIC} on tansu: {e}"))?;
        let sink = KafkaSink::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        *lock(&self.state) = Some(KafkaState {
            child,
            bootstrap,
            sink: Arc::new(sink),
        });
        Ok(())
    }

    async fn delivered(&self, expected: u64) -> Result<u64, String> {
        let bootstrap = self.bootstrap();
        tokio::task::spawn_blocking(move || kafka_count(&bootstrap, expected))
            .await
            .map_err(|e| e.to_string())?
    }

    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String> {
        // The topic is new (reset starts a new broker) and nothing is written before the
        // writers start: read from the beginning (an `End` assignment resolves lazily and
        // would miss the first events).
        let consumer = kafka_consumer(&self.bootstrap(), rdkafka::Offset::Beginning)?;
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            use rdkafka::consumer::Consumer as _;
            while !tx.is_closed() {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let now = Instant::now();
                if let Some(id) = kafka_event_id(&m) {
                    let _ = tx.send((id, now));
                }
            }
            consumer.unassign().ok();
        });
        Ok(rx)
    }
}

/// A consumer with every partition of the topic assigned at `offset`.
fn kafka_consumer(
    bootstrap: &str,
    offset: rdkafka::Offset,
) -> Result<rdkafka::consumer::BaseConsumer, String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("bench-{}", Uuid::now_v7()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.error.backoff.ms", "10")
        .set("fetch.queue.backoff.ms", "0")
        .create()
        .map_err(|e| e.to_string())?;
    let mut assignment = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment
            .add_partition_offset(TOPIC, p, offset)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    Ok(consumer)
}

fn kafka_event_id(m: &rdkafka::message::BorrowedMessage<'_>) -> Option<Uuid> {
    use rdkafka::message::{Headers, Message};
    let headers = m.headers()?;
    headers
        .iter()
        .find(|h| h.key == "event_id")
        .and_then(|h| std::str::from_utf8(h.value?).ok())
        .and_then(|s| Uuid::parse_str(s).ok())
}

/// Distinct events in the topic, read from the beginning: until `expected` or 10 s of silence.
fn kafka_count(bootstrap: &str, expected: u64) -> Result<u64, String> {
    let consumer = kafka_consumer(bootstrap, rdkafka::Offset::Beginning)?;
    let mut seen = HashSet::new();
    let mut last = Instant::now();
    while (seen.len() as u64) < expected && last.elapsed() < Duration::from_secs(10) {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.map_err(|e| format!("reading {TOPIC} back: {e}"))?;
            last = Instant::now();
            if let Some(id) = kafka_event_id(&m) {
                seen.insert(id);
            }
        }
    }
    Ok(seen.len() as u64)
}

// ---- RabbitMQ ------------------------------------------------------------------------------

const EXCHANGE: &str = "bench";
const QUEUE: &str = "bench.order";

/// RabbitMQ side: topic exchange `bench` (durable, declared by the relay too), durable queue
/// `bench.order` bound with `#`; messages are persistent and confirmed.
pub struct RabbitMqSide {
    url: String,
    max_events: u64,
    sink: Arc<RabbitMqSink>,
    _connection: lapin::Connection,
    channel: lapin::Channel,
    consumer: Mutex<Option<String>>,
}

impl RabbitMqSide {
    pub async fn open(url: &str, max_events: u64) -> Result<Self, String> {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| format!("RabbitMQ: {e}: start it with scripts/services.sh rabbitmq"))?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| e.to_string())?;
        channel
            .exchange_declare(
                EXCHANGE.into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        channel
            .queue_bind(
                QUEUE.into(),
                EXCHANGE.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        let mut config = RabbitMqConfig::new(url, EXCHANGE);
        config.declare_exchange = true;
        config.exchange_type = "topic".to_owned();
        let sink = RabbitMqSink::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            url: url.to_owned(),
            max_events,
            sink: Arc::new(sink),
            _connection: connection,
            channel,
            consumer: Mutex::new(None),
        })
    }

    async fn queued(&self) -> Result<u64, String> {
        use lapin::options::QueueDeclareOptions;
        let queue = self
            .channel
            .queue_declare(
                QUEUE.into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        Ok(u64::from(queue.message_count()))
    }
}

#[async_trait]
impl BrokerSide for RabbitMqSide {
    fn describe(&self) -> String {
        let version = first_line("dpkg-query", &["-W", "-f", "${Version}", "rabbitmq-server"]);
        format!("RabbitMQ {version}")
    }

    fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    fn max_events(&self) -> Option<u64> {
        Some(self.max_events)
    }

    fn relay_toml(&self) -> String {
        format!(
            "[sink]\nkind = \"rabbitmq\"\n\n[sink.rabbitmq]\nurl = \"{}\"\nexchange = \"{EXCHANGE}\"\ndeclare_exchange = true\nexchange_type = \"topic\"\n",
            self.url
        )
    }

    async fn reset(&self) -> Result<(), String> {
        let tag = lock(&self.consumer).take();
        if let Some(tag) = tag {
            self.channel
                .basic_cancel(tag.as_str().into(), Default::default())
                .await
                .map_err(|e| e.to_string())?;
        }
        self.channel
            .queue_purge(QUEUE.into(), Default::default())
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    async fn delivered(&self, expected: u64) -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = self.queued().await?;
            if n >= expected || Instant::now() > deadline {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String> {
        use lapin::options::BasicConsumeOptions;
        let tag = format!("bench-{}", Uuid::now_v7());
        let consumer = self
            .channel
            .basic_consume(
                QUEUE.into(),
                tag.as_str().into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .map_err(|e| e.to_string())?;
        *lock(&self.consumer) = Some(tag);
        let (tx, rx) = mpsc::unbounded_channel();
        consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
            let now = Instant::now();
            let tx = tx.clone();
            async move {
                if let Ok(Some(delivery)) = delivery {
                    if let Some(id) = delivery
                        .properties
                        .message_id()
                        .as_ref()
                        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                    {
                        let _ = tx.send((id, now));
                    }
                }
            }
        });
        Ok(rx)
    }
}

// ---- SQS -----------------------------------------------------------------------------------

/// SQS side: a standard queue on LocalStack, a new one (`bench-order-N`) at each reset.
pub struct SqsSide {
    endpoint: String,
    max_events: u64,
    sdk: aws_config::SdkConfig,
    client: aws_sdk_sqs::Client,
    state: Mutex<Option<SqsState>>,
    resets: std::sync::atomic::AtomicU32,
}

struct SqsState {
    name: String,
    url: String,
    sink: Arc<SqsSink>,
}

const REGION: &str = "us-east-1";

impl SqsSide {
    pub async fn open(endpoint: &str, max_events: u64) -> Result<Self, String> {
        let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(REGION))
            .credentials_provider(aws_sdk_sqs::config::Credentials::new(
                "test",
                "test",
                None,
                None,
                "outboxkit-bench",
            ))
            .endpoint_url(endpoint)
            .load()
            .await;
        let client = aws_sdk_sqs::Client::new(&sdk);
        let side = Self {
            endpoint: endpoint.to_owned(),
            max_events,
            sdk,
            client,
            state: Mutex::new(None),
            resets: Default::default(),
        };
        side.reset().await?;
        Ok(side)
    }

    fn current(&self) -> Option<(String, String)> {
        lock(&self.state)
            .as_ref()
            .map(|s| (s.name.clone(), s.url.clone()))
    }
}

#[async_trait]
impl BrokerSide for SqsSide {
    fn describe(&self) -> String {
        format!(
            "LocalStack {} (SQS API emulator, Python)",
            localstack_version(&self.endpoint)
        )
    }

    fn sink(&self) -> Arc<dyn Sink> {
        lock(&self.state)
            .as_ref()
            .map(|s| s.sink.clone() as Arc<dyn Sink>)
            .expect("the SQS side is reset before use")
    }

    fn relay_toml(&self) -> String {
        let name = self.current().map(|c| c.0).unwrap_or_default();
        format!(
            "[sink]\nkind = \"sqs\"\n\n[sink.sqs]\nqueue = \"{name}\"\nendpoint = \"{}\"\nregion = \"{REGION}\"\n",
            self.endpoint
        )
    }

    fn relay_env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
    }

    fn max_events(&self) -> Option<u64> {
        Some(self.max_events)
    }

    async fn reset(&self) -> Result<(), String> {
        use aws_sdk_sqs::types::QueueAttributeName;
        if let Some((_, url)) = self.current() {
            let _ = self.client.delete_queue().queue_url(url).send().await;
        }
        let n = self
            .resets
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("bench-order-{}-{n}", std::process::id());
        let url = self
            .client
            .create_queue()
            .queue_name(&name)
            .attributes(QueueAttributeName::VisibilityTimeout, "3600")
            .send()
            .await
            .map_err(|e| {
                format!(
                    "creating SQS queue {name} at {}: {}: start LocalStack with scripts/services.sh sqs",
                    self.endpoint,
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            })?
            .queue_url()
            .unwrap_or_default()
            .to_owned();
        let mut config = SqsConfig::new(name.clone());
        config.endpoint = Some(self.endpoint.clone());
        config.region = Some(REGION.to_owned());
        let sink = SqsSink::from_sdk_config(config, &self.sdk).map_err(|e| e.to_string())?;
        *lock(&self.state) = Some(SqsState {
            name,
            url,
            sink: Arc::new(sink),
        });
        Ok(())
    }

    async fn delivered(&self, expected: u64) -> Result<u64, String> {
        use aws_sdk_sqs::types::QueueAttributeName;
        let (_, url) = self.current().unwrap_or_default();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let answer = self
                .client
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .map_err(|e| aws_sdk_sqs::error::DisplayErrorContext(&e).to_string())?;
            let n: u64 = answer
                .attributes()
                .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
                .unwrap_or(0);
            if n >= expected || Instant::now() > deadline {
                return Ok(n);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String> {
        let (_, url) = self.current().unwrap_or_default();
        let (tx, rx) = mpsc::unbounded_channel();
        // Several long-polling receivers; the queue's visibility timeout (1 h) keeps received
        // messages from coming back during the run, so nothing is deleted.
        for _ in 0..4 {
            let (client, url, tx) = (self.client.clone(), url.clone(), tx.clone());
            tokio::spawn(async move {
                while !tx.is_closed() {
                    let Ok(answer) = client
                        .receive_message()
                        .queue_url(&url)
                        .max_number_of_messages(10)
                        .wait_time_seconds(1)
                        .message_attribute_names("event_id")
                        .send()
                        .await
                    else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    let now = Instant::now();
                    for message in answer.messages() {
                        let id = message
                            .message_attributes()
                            .and_then(|a| a.get("event_id"))
                            .and_then(|v| v.string_value())
                            .and_then(|s| Uuid::parse_str(s).ok());
                        if let Some(id) = id {
                            let _ = tx.send((id, now));
                        }
                    }
                }
            });
        }
        Ok(rx)
    }
}

/// LocalStack's version from its health endpoint.
fn localstack_version(endpoint: &str) -> String {
    use std::io::{Read, Write};
    let host = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let answer = (|| -> std::io::Result<String> {
        let mut stream = std::net::TcpStream::connect(&host)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(
            stream,
            "GET /_localstack/health HTTP/1.0\r\nHost: {host}\r\n\r\n"
        )?;
        let mut body = String::new();
        stream.read_to_string(&mut body)?;
        Ok(body)
    })()
    .unwrap_or_default();
    answer
        .split("\"version\":")
        .nth(1)
        .and_then(|v| v.split('"').nth(1))
        .unwrap_or("(version unknown)")
        .to_owned()
}
