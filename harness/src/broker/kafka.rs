//! Kafka (the tansu Kafka-API broker): one topic per aggregate type, `<prefix>.<aggregate_type>`,
//! read back from every partition by a plain consumer; and a private broker a test may freeze.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{sink_tables, BrokerSide, AGGREGATE_TYPES};
use crate::delivery::{Committed, Delivered};
use crate::process::{OwnProcess, OwnServer};
use crate::scenario::TRACEPARENT;
use crate::util::{first_line, free_port, log_troubles, unique};
#[cfg(feature = "sink-suite")]
use outboxkit_core::testkit::sink_suite::ReceivedMessage;

/// The Kafka-API broker for tests: `OUTBOX_TEST_KAFKA_BOOTSTRAP`, default the tansu broker
/// that `scripts/services.sh` starts on 127.0.0.1:9092.
pub fn kafka_bootstrap() -> String {
    std::env::var("OUTBOX_TEST_KAFKA_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:9092".to_owned())
}

/// The log of the test broker that `scripts/services.sh` starts: `OUTBOX_TEST_TANSU_LOG`,
/// default where the script writes it.
pub fn kafka_broker_log() -> PathBuf {
    std::env::var("OUTBOX_TEST_TANSU_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("/var/log/outbox-relay-tansu.log"))
}

/// The Kafka side: topics `<prefix>.order` and `<prefix>.customer`, 6 partitions each unless
/// told otherwise. [`Delivered::aggregate_id`] is the message key; `meta` has `partition` and
/// `offset`.
#[derive(Debug, Clone)]
pub struct KafkaSide {
    bootstrap: String,
    prefix: String,
    partitions: i32,
    configs: Vec<(String, String)>,
}

impl KafkaSide {
    /// Topics `<prefix>.<aggregate_type>` on the test broker ([`kafka_bootstrap`]).
    pub async fn open(prefix: &str) -> Self {
        Self::open_at(&kafka_bootstrap(), prefix).await
    }

    /// The broker at `bootstrap`.
    pub async fn open_at(bootstrap: &str, prefix: &str) -> Self {
        Self {
            bootstrap: bootstrap.to_owned(),
            prefix: prefix.to_owned(),
            partitions: 6,
            configs: Vec::new(),
        }
    }

    /// Create the topics with `partitions` partitions each.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Create the topics with this topic config (`max.message.bytes`...).
    pub fn topic_config(mut self, name: &str, value: &str) -> Self {
        self.configs.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The broker's address.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    fn topics(&self) -> Vec<String> {
        AGGREGATE_TYPES
            .iter()
            .map(|t| self.destination(t))
            .collect()
    }

    fn admin(&self) -> AdminClient<DefaultClientContext> {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()
            .expect("creating the admin client")
    }

    fn admin_options() -> AdminOptions {
        let timeout = Some(Duration::from_secs(15));
        AdminOptions::new()
            .request_timeout(timeout)
            .operation_timeout(timeout)
    }

    /// Create `topics` with the side's partitions and topic configs (ones that exist already
    /// are left as they are), or fail the test saying what to start.
    pub async fn create_topics(&self, topics: &[String]) {
        let bootstrap = &self.bootstrap;
        let admin = self.admin();
        let new_topics: Vec<NewTopic<'_>> = topics
            .iter()
            .map(|name| {
                self.configs.iter().fold(
                    NewTopic::new(name, self.partitions, TopicReplication::Fixed(1)),
                    |topic, (k, v)| topic.set(k, v),
                )
            })
            .collect();
        let results = admin
            .create_topics(new_topics.iter(), &Self::admin_options())
            .await
            .unwrap_or_else(|e| {
                panic!("creating topics on Kafka at {bootstrap} failed ({e}): start it (scripts/services.sh)")
            });
        for result in results {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => panic!("creating topic {topic} on {bootstrap}: {code}"),
            }
        }
    }

    /// Create `topic` (see [`Self::create_topics`]).
    pub async fn create_topic(&self, topic: &str) {
        self.create_topics(&[topic.to_owned()]).await;
    }

    /// Delete `topics` and their messages; ones that do not exist are skipped. A broker that
    /// refuses is reported on stderr and otherwise ignored: cleaning up never fails a test. (A
    /// Kafka-API broker keeps a topic's messages until the topic is deleted; the test broker,
    /// tansu's memory engine, keeps them in memory.)
    pub async fn delete_topics(&self, topics: &[String]) {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let refused: Vec<String> = match self
            .admin()
            .delete_topics(&names, &Self::admin_options())
            .await
        {
            Ok(results) => results
                .into_iter()
                .filter_map(|result| match result {
                    Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => None,
                    Err((topic, code)) => Some(format!("{topic}: {code}")),
                })
                .collect(),
            Err(e) => vec![e.to_string()],
        };
        if !refused.is_empty() {
            eprintln!(
                "deleting topics {names:?} on Kafka at {}: {}",
                self.bootstrap,
                refused.join("; ")
            );
        }
    }

    /// Every message of `topic` from the beginning, as [`KafkaRecord`]s (see
    /// [`BrokerSide::read_back`] for when it stops), partition by partition in offset order.
    pub async fn read_topic(
        &self,
        topic: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<KafkaRecord> {
        self.read_records(vec![topic.to_owned()], expected, timeout)
            .await
    }

    async fn read_records(
        &self,
        topics: Vec<String>,
        expected: usize,
        timeout: Duration,
    ) -> Vec<KafkaRecord> {
        let bootstrap = self.bootstrap.clone();
        tokio::task::spawn_blocking(move || read_topics(&bootstrap, &topics, expected, timeout))
            .await
            .expect("the Kafka reader thread")
    }

    /// Every aggregate's messages in one partition (of its topic); the violations.
    pub fn partition_violations(delivered: &[Delivered]) -> Vec<String> {
        let mut home: HashMap<(&str, &str), &str> = HashMap::new();
        let mut violations = Vec::new();
        for m in delivered {
            let key = (m.destination.as_str(), m.aggregate_id.as_str());
            let partition = *home.entry(key).or_insert(m.meta("partition"));
            if partition != m.meta("partition") {
                violations.push(format!(
                    "aggregate {} of {} in partitions {partition} and {}",
                    key.1,
                    key.0,
                    m.meta("partition")
                ));
            }
        }
        violations
    }
}

#[async_trait]
impl BrokerSide for KafkaSide {
    fn name(&self) -> String {
        "Kafka".to_owned()
    }

    fn sink_toml(&self) -> String {
        sink_tables(
            "kafka",
            Some(&self.prefix),
            &format!("\"bootstrap.servers\" = \"{}\"\n", self.bootstrap),
        )
    }

    /// Create the topics, or fail the test saying what to start.
    async fn prepare(&self) {
        self.create_topics(&self.topics()).await;
    }

    fn destination(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.prefix)
    }

    /// Every message of every partition of both topics from the beginning (partition by
    /// partition in offset order): until `expected.len()` distinct event ids arrived and then
    /// 2 s passed without a message (so late duplicates are seen too), or until `timeout`.
    async fn read_back(&self, expected: &HashSet<Uuid>, timeout: Duration) -> Vec<Delivered> {
        let records = self
            .read_records(self.topics(), expected.len(), timeout)
            .await;
        records.into_iter().map(KafkaRecord::delivered).collect()
    }

    /// The distinct event ids of the topics read from the beginning, until `expected` arrived
    /// and 2 s passed without a message, or until `timeout`.
    async fn held(&self, expected: u64, timeout: Duration) -> u64 {
        let records = self
            .read_records(self.topics(), expected as usize, timeout)
            .await;
        let distinct: HashSet<Uuid> = records.iter().map(KafkaRecord::event_id).collect();
        distinct.len() as u64
    }

    /// A consumer thread with every partition of the topics assigned from the beginning (an
    /// `End` assignment resolves lazily and would miss the first messages: watch topics that
    /// are still empty), fetching with short waits.
    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::{Headers, Message};
        let consumer: BaseConsumer = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .set("group.id", unique("watch"))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "10")
            .set("fetch.error.backoff.ms", "10")
            .set("fetch.queue.backoff.ms", "0")
            .create()
            .expect("creating the watching consumer");
        let mut assignment = rdkafka::TopicPartitionList::new();
        for topic in self.topics() {
            for p in 0..self.partitions {
                assignment
                    .add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
                    .expect("assigning a partition");
            }
        }
        consumer.assign(&assignment).expect("assigning partitions");
        let (tx, rx) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            while !tx.is_closed() {
                let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let now = Instant::now();
                let id = m.headers().and_then(|headers| {
                    headers
                        .iter()
                        .find(|h| h.key == "event_id")
                        .and_then(|h| std::str::from_utf8(h.value?).ok())
                        .and_then(|s| Uuid::parse_str(s).ok())
                });
                if let Some(id) = id {
                    let _ = tx.send((id, now));
                }
            }
            consumer.unassign().ok();
        });
        rx
    }

    /// Gaps in each partition's offsets as read, and a second read by a fresh consumer: a
    /// missing event it finds was on the broker all along.
    async fn look_for_missing(
        &self,
        missing: &HashSet<Uuid>,
        delivered: &[Delivered],
    ) -> Vec<String> {
        let mut offsets: BTreeMap<(&str, &str), Vec<i64>> = BTreeMap::new();
        for m in delivered {
            if let Ok(offset) = m.meta("offset").parse() {
                offsets
                    .entry((m.destination.as_str(), m.meta("partition")))
                    .or_default()
                    .push(offset);
            }
        }
        let mut findings: Vec<String> = offsets
            .into_iter()
            .filter_map(|((topic, partition), mut read)| {
                read.sort_unstable();
                read.dedup();
                let mut gaps = Vec::new();
                let mut next = 0;
                for offset in &read {
                    if *offset > next {
                        gaps.push(format!("{next}..={}", offset - 1));
                    }
                    next = offset + 1;
                }
                (!gaps.is_empty()).then(|| {
                    format!(
                        "{topic} partition {partition}: offsets read up to {}, none at {}",
                        next - 1,
                        gaps.join(", ")
                    )
                })
            })
            .collect();
        if findings.is_empty() {
            findings.push("no gaps in the offsets read of any partition".to_owned());
        }
        let distinct: HashSet<Uuid> = delivered.iter().map(|m| m.event_id).collect();
        let again = self
            .read_records(
                self.topics(),
                distinct.len() + missing.len(),
                Duration::from_secs(15),
            )
            .await;
        let found: Vec<String> = again
            .iter()
            .filter(|r| missing.contains(&r.event_id()))
            .map(|r| {
                format!(
                    "{} at {} partition {} offset {}",
                    r.event_id(),
                    r.topic,
                    r.partition,
                    r.offset
                )
            })
            .collect();
        findings.push(format!(
            "a second read from the beginning got {} messages and {} of the missing: {found:?}",
            again.len(),
            found.len()
        ));
        if self.bootstrap == kafka_bootstrap() {
            findings.push(broker_log_troubles(&kafka_broker_log()));
        }
        findings
    }

    fn check_messages(&self, delivered: &[Delivered], committed: &Committed) {
        let split = Self::partition_violations(delivered);
        assert!(
            split.is_empty(),
            "an aggregate's events are spread over partitions: {:?}",
            &split[..split.len().min(5)]
        );
        let used: HashSet<(&str, &str)> = delivered
            .iter()
            .map(|m| (m.destination.as_str(), m.meta("partition")))
            .collect();
        assert_eq!(
            used.len(),
            AGGREGATE_TYPES.len() * self.partitions as usize,
            "the aggregates spread over every partition of both topics"
        );
        for m in delivered {
            let (_, aggregate) = &committed[&m.event_id];
            assert_eq!(m.header("aggregate_id"), aggregate, "{m:?}");
            assert_eq!(m.header("event_type"), "Changed", "{m:?}");
            assert!(m.headers.contains_key("created_at"), "{m:?}");
            assert_eq!(m.header("traceparent"), TRACEPARENT, "{m:?}");
        }
    }

    async fn cleanup(&self) {
        self.delete_topics(&self.topics()).await;
    }
}

/// The warnings and errors of the broker's log at `path` (see [`log_troubles`]), or why there
/// are none to show.
fn broker_log_troubles(path: &Path) -> String {
    match std::fs::read_to_string(path) {
        Ok(log) => log_troubles(&format!("the broker (log {})", path.display()), &log),
        Err(e) => format!("the broker's log {} cannot be read: {e}", path.display()),
    }
}

/// (Partition end offsets are not used: tansu 0.6's ListOffsets high watermark lags behind
/// when a produce batch holds several records.)
fn read_topics(
    bootstrap: &str,
    topics: &[String],
    expected: usize,
    timeout: Duration,
) -> Vec<KafkaRecord> {
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
    let mut distinct = HashSet::new();
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
        let headers: Vec<(String, String)> = m
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
        let record = KafkaRecord {
            topic: m.topic().to_owned(),
            partition: m.partition(),
            offset: m.offset(),
            key: m.key().map(<[u8]>::to_vec),
            payload: m.payload().unwrap_or_default().to_vec(),
            tombstone: m.payload().is_none(),
            timestamp: m.timestamp().to_millis(),
            headers,
        };
        distinct.insert(record.event_id());
        out.push(record);
    }
    out
}

/// One Kafka message as a plain consumer read it.
#[derive(Debug, Clone)]
pub struct KafkaRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// The value; empty for a tombstone.
    pub payload: Vec<u8>,
    /// Whether the message has no value at all (a tombstone), not an empty one.
    pub tombstone: bool,
    /// The record's timestamp, in milliseconds since the epoch.
    pub timestamp: Option<i64>,
    /// Headers in message order (names may repeat), values as (lossy) UTF-8.
    pub headers: Vec<(String, String)>,
}

impl KafkaRecord {
    /// The last header of that name (what Java's `lastHeader` gives).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The headers by name (the last of a repeated name wins).
    pub fn header_map(&self) -> BTreeMap<String, String> {
        self.headers.iter().cloned().collect()
    }

    /// The key as text; fails the test when it is not UTF-8.
    pub fn key_text(&self) -> String {
        String::from_utf8(self.key.clone().unwrap_or_default()).expect("key is UTF-8")
    }

    /// The `event_id` header, or the nil UUID.
    pub fn event_id(&self) -> Uuid {
        self.header("event_id")
            .and_then(|s| Uuid::parse_str(s).ok())
            .unwrap_or_default()
    }

    fn delivered(self) -> Delivered {
        Delivered {
            event_id: self.event_id(),
            aggregate_id: String::from_utf8_lossy(&self.key.unwrap_or_default()).into_owned(),
            destination: self.topic,
            payload: self.payload,
            headers: self.headers.into_iter().collect(),
            meta: HashMap::from([
                ("partition".to_owned(), self.partition.to_string()),
                ("offset".to_owned(), self.offset.to_string()),
            ]),
        }
    }
}

/// A private Kafka-API broker (tansu, in-memory) on a free loopback port, for tests that
/// freeze their broker without disturbing the shared one. Its [`Fault`](crate::Fault) is a freeze (SIGSTOP)
/// and a thaw (SIGCONT). Thawed and killed when dropped.
#[derive(Debug)]
pub struct KafkaBrokerProcess {
    pub bootstrap: String,
    process: OwnProcess,
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

    /// Start it (logging to `dir/tansu.log`) and wait until it answers.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[])
    }

    /// [`Self::start`] with extra `tansu broker` arguments (`--authentication`...).
    pub fn start_with(dir: &Path, args: &[&str]) -> Self {
        Self::start_binary(&Self::binary(), dir, args)
    }

    /// Start the tansu binary `binary` as [`Self::start_with`] does.
    pub fn start_binary(binary: &Path, dir: &Path, args: &[&str]) -> Self {
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = dir.join("tansu.log");
        let file = std::fs::File::create(&log).expect("creating the broker log");
        let mut process = OwnProcess::spawn(
            Command::new(binary)
                .args([
                    "broker",
                    "--listener-url",
                    &url,
                    "--advertised-listener-url",
                    &url,
                ])
                .args(["--storage-engine", "memory://tansu/"])
                .args(args)
                .stdin(Stdio::null())
                .stdout(file.try_clone().expect("cloning the log handle"))
                .stderr(file),
            "the test's Kafka broker (tansu)",
        )
        .logging_to(log);
        process.wait_listening(port, Duration::from_secs(30));
        Self {
            bootstrap: format!("127.0.0.1:{port}"),
            process,
        }
    }

    /// The first line `binary --version` prints.
    pub fn version(binary: &Path) -> String {
        first_line(&binary.to_string_lossy(), &["--version"])
    }
}

impl OwnServer for KafkaBrokerProcess {
    fn process(&self) -> &OwnProcess {
        &self.process
    }
}

/// The sink conformance suite's consumer: [`SuiteConsumer::prepare_destination`] creates the
/// topic (with the side's partitions); `read_back` reads every partition of it. The key must be
/// the aggregate id; the event id, aggregate id and event type are headers.
///
/// [`SuiteConsumer::prepare_destination`]: outboxkit_core::testkit::sink_suite::SuiteConsumer::prepare_destination
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for KafkaSide {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let received = |m: KafkaRecord| {
            let aggregate_id = m.header("aggregate_id").expect("aggregate_id header");
            assert_eq!(m.key_text(), aggregate_id, "key = aggregate_id");
            ReceivedMessage {
                event_id: Uuid::parse_str(m.header("event_id").expect("event_id header"))
                    .expect("event_id is a UUID"),
                aggregate_id: aggregate_id.to_owned(),
                event_type: m
                    .header("event_type")
                    .expect("event_type header")
                    .to_owned(),
                headers: m.header_map(),
                payload: m.payload,
            }
        };
        self.read_topic(to, expected, wait)
            .await
            .into_iter()
            .map(received)
            .collect()
    }

    async fn prepare_destination(&self, to: &str) {
        self.create_topic(to).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_log_gives_its_last_warnings_and_errors_without_colours() {
        let dir = std::env::temp_dir().join(unique("tansu-log"));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("tansu.log");
        let mut text = String::from("tansu broker 0.6.0\n");
        for i in 0..12 {
            text.push_str(&format!(
                "2026-12-02T14:00:00Z \u{1b}[33m WARN\u{1b}[0m produce: storage_api={i}\n"
            ));
        }
        text.push_str("2026-12-02T14:00:01Z \u{1b}[31mERROR\u{1b}[0m fetch: error\n");
        std::fs::write(&log, text).unwrap();
        let troubles = broker_log_troubles(&log);
        assert!(
            troubles.contains("logged 13 warnings and errors"),
            "{troubles}"
        );
        assert!(!troubles.contains("storage_api=2\n"), "{troubles}");
        assert!(
            troubles.contains("Z  WARN produce: storage_api=3\n"),
            "{troubles}"
        );
        assert!(troubles.ends_with("Z ERROR fetch: error"), "{troubles}");
        assert!(!troubles.contains('\u{1b}'), "{troubles}");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(broker_log_troubles(&log).contains("cannot be read"));
    }
}
