//! Shared by the Kafka integration tests: the test broker's address, topic creation and an
//! independent reader (a plain rdkafka consumer reading every partition of a topic).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outboxkit_sink_kafka::{ensure_topics, KafkaSink, KafkaSinkConfig, TopicSpec};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// Partitions of the topics the tests create.
pub const PARTITIONS: i32 = 3;

/// `OUTBOX_TEST_KAFKA_BOOTSTRAP`, default `127.0.0.1:9092` (the tansu broker that
/// `scripts/services.sh` starts).
pub fn bootstrap() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// A sink configuration for the test broker.
pub fn config(topic_template: &str) -> KafkaSinkConfig {
    KafkaSinkConfig {
        topic: topic_template.to_owned(),
        ..KafkaSinkConfig::new(bootstrap())
    }
}

/// A connected sink; fails the test (naming what to start) when the broker is unreachable.
pub async fn connect(config: KafkaSinkConfig) -> KafkaSink {
    KafkaSink::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "Kafka at {} is unreachable ({e}): start it with scripts/services.sh \
             (or set OUTBOX_TEST_KAFKA_BOOTSTRAP)",
            bootstrap()
        )
    })
}

/// A fresh name prefix for one test's topics.
pub fn unique_prefix() -> String {
    outboxkit_core::testkit::sink_suite::unique_prefix()
}

/// Create `topic` with [`PARTITIONS`] partitions (and the given topic configs).
pub async fn create_topic(topic: &str, configs: &[(&str, &str)]) {
    create_topic_on(&bootstrap(), topic, configs).await;
}

/// [`create_topic`] on the broker at `bootstrap`.
pub async fn create_topic_on(bootstrap: &str, topic: &str, configs: &[(&str, &str)]) {
    let mut spec = TopicSpec::new(topic, PARTITIONS);
    for (k, v) in configs {
        spec = spec.config(*k, *v);
    }
    ensure_topics(
        &KafkaSinkConfig::new(bootstrap),
        &[spec],
        Duration::from_secs(10),
    )
    .await
    .unwrap_or_else(|e| panic!("creating topic {topic} on {bootstrap}: {e}"));
}

/// One consumed message.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// Headers in message order (names may repeat).
    pub headers: Vec<(String, String)>,
}

impl Consumed {
    /// The last header of that name (what Java's `lastHeader` gives).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn header_map(&self) -> BTreeMap<String, String> {
        self.headers.iter().cloned().collect()
    }

    pub fn key_text(&self) -> String {
        String::from_utf8(self.key.clone().unwrap_or_default()).expect("key is UTF-8")
    }
}

/// Every message of every partition of `topic`, from the beginning, waiting until
/// `expected` arrived (and then until the topic is quiet for a second) or `timeout` passed.
/// Messages of one partition are in partition order.
pub async fn read_topic(topic: &str, expected: usize, timeout: Duration) -> Vec<Consumed> {
    read_topic_on(&bootstrap(), topic, expected, timeout).await
}

/// [`read_topic`] on the broker at `bootstrap`.
pub async fn read_topic_on(
    bootstrap: &str,
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    read_topic_with(bootstrap, &[], topic, expected, timeout).await
}

/// [`read_topic_on`] with extra client properties (SASL...).
pub async fn read_topic_with(
    bootstrap: &str,
    properties: &[(&str, &str)],
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let (bootstrap, topic) = (bootstrap.to_owned(), topic.to_owned());
    let properties: Vec<(String, String)> = properties
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    tokio::task::spawn_blocking(move || {
        read_topic_blocking(&bootstrap, &properties, &topic, expected, timeout)
    })
    .await
    .expect("reader thread")
}

fn read_topic_blocking(
    bootstrap: &str,
    properties: &[(String, String)],
    topic: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Consumed> {
    let deadline = Instant::now() + timeout;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("reader-{}", unique_prefix()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false");
    for (k, v) in properties {
        config.set(k, v);
    }
    let consumer: BaseConsumer = config.create().expect("creating the test consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("metadata of {topic} from {bootstrap}: {e}"));
    let partitions = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map(|t| t.partitions().len())
        .unwrap_or(0);
    if partitions == 0 {
        return Vec::new();
    }
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions as i32 {
        assignment
            .add_partition_offset(topic, p, Offset::Beginning)
            .expect("partition offset");
    }
    consumer.assign(&assignment).expect("assigning partitions");
    // Once `expected` messages arrived, go on until the topic has been quiet for a moment,
    // so that extra messages (duplicates) are seen too.
    const QUIET: Duration = Duration::from_millis(1000);
    let mut out = Vec::new();
    let mut last_message = Instant::now();
    loop {
        if expected > 0 && out.len() >= expected && last_message.elapsed() >= QUIET {
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_message = Instant::now();
                let headers = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|header| {
                                (
                                    header.key.to_owned(),
                                    String::from_utf8_lossy(header.value.unwrap_or_default())
                                        .into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                out.push(Consumed {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().unwrap_or_default().to_vec(),
                    headers,
                });
            }
            Some(Err(e)) => panic!("consuming {topic}: {e}"),
            None => {}
        }
    }
    out
}

/// A private Kafka-API broker (tansu, in-memory) on a free loopback port, for tests that
/// freeze their broker without disturbing the shared one. Killed when dropped.
pub struct PrivateBroker {
    pub bootstrap: String,
    child: std::process::Child,
}

impl PrivateBroker {
    /// Start `OUTBOX_TEST_TANSU_BIN` (default where `scripts/services.sh` installs tansu)
    /// and wait until it listens.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start) with extra `tansu broker` arguments.
    pub fn start_with(args: &[&str]) -> Self {
        let binary = std::env::var("OUTBOX_TEST_TANSU_BIN")
            .unwrap_or_else(|_| "/opt/outbox-relay/tansu/bin/tansu".to_owned());
        assert!(
            std::path::Path::new(&binary).exists(),
            "{binary} does not exist: install the Kafka-API broker with scripts/services.sh \
             (or set OUTBOX_TEST_TANSU_BIN)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let url = format!("tcp://127.0.0.1:{port}");
        let child = std::process::Command::new(&binary)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("starting tansu");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "tansu did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            bootstrap: format!("127.0.0.1:{port}"),
            child,
        }
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill {signal} failed");
    }

    /// SIGSTOP: the broker stops answering, forgetting nothing.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn thaw(&self) {
        self.signal("-CONT");
    }
}

impl Drop for PrivateBroker {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg("-CONT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
