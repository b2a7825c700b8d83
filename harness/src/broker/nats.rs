//! NATS JetStream: one stream per test capturing `<prefix>.>`, one subject per aggregate type
//! (`<prefix>.<aggregate_type>`), read back by ephemeral pull consumers in stream order.
//! [`PrivateNats`] is a test's own `nats-server` (JetStream on, own port and store directory),
//! which a test may freeze.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer, stream};
use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{sink_tables, BrokerSide};
use crate::delivery::{Committed, Delivered};
use crate::process::{OwnProcess, OwnServer};
use crate::util::{first_line, free_port, scratch_dir};
#[cfg(feature = "sink-suite")]
use outboxkit_core::testkit::sink_suite::ReceivedMessage;

/// NATS for tests: `OUTBOX_TEST_NATS_URL`, default the machine's server (JetStream on).
pub fn nats_url() -> String {
    std::env::var("OUTBOX_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned())
}

/// One message as a JetStream consumer got it.
#[derive(Debug, Clone)]
pub struct NatsMessage {
    pub subject: String,
    pub stream_sequence: u64,
    pub payload: Vec<u8>,
    /// Every header (the first value of each).
    pub headers: HashMap<String, String>,
}

impl NatsMessage {
    /// A header, or "".
    pub fn header(&self, name: &str) -> &str {
        crate::delivery::entry(&self.headers, name)
    }
}

/// The NATS JetStream side.
pub struct NatsSide {
    url: String,
    prefix: String,
    jetstream: jetstream::Context,
    /// Streams the sink suite's `prepare_destination` made, deleted once read back.
    #[cfg(feature = "sink-suite")]
    suite_streams: std::sync::Mutex<Vec<String>>,
}

impl std::fmt::Debug for NatsSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSide")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// A stream name for a subject or prefix: `.`, `*`, `>` and `-` as `_`.
pub fn stream_name(subject: &str) -> String {
    subject.replace(['.', '*', '>', '-'], "_")
}

impl NatsSide {
    /// Subjects `<prefix>.<aggregate_type>` on the test server ([`nats_url`]); fails the test,
    /// saying what to start, when it is unreachable.
    pub async fn open(prefix: &str) -> Self {
        Self::open_at(&nats_url(), prefix).await
    }

    /// The server at `url` (no authentication).
    pub async fn open_at(url: &str, prefix: &str) -> Self {
        Self::open_with(url, prefix, async_nats::ConnectOptions::new()).await
    }

    /// The server at `url`, connecting with `options` (credentials, TLS...).
    pub async fn open_with(url: &str, prefix: &str, options: async_nats::ConnectOptions) -> Self {
        let client = options
            .connection_timeout(Duration::from_secs(5))
            .connect(url)
            .await
            .unwrap_or_else(|e| {
                panic!("NATS at {url} is unreachable ({e}): start nats-server with -js (scripts/services.sh)")
            });
        let mut jetstream = jetstream::new(client);
        jetstream.set_timeout(Duration::from_secs(30));
        Self {
            url: url.to_owned(),
            prefix: prefix.to_owned(),
            jetstream,
            #[cfg(feature = "sink-suite")]
            suite_streams: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The JetStream context, for a test's own requests.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    /// The test's stream: `<prefix>` as a stream name.
    pub fn stream(&self) -> String {
        stream_name(&self.prefix)
    }

    /// Create (or update) stream `name` capturing `subjects`, file storage, a 2 minute
    /// duplicate window, with `max_msg_size` when given. Fails the test when refused.
    pub async fn create_stream(&self, name: &str, subjects: &[String], max_msg_size: Option<i32>) {
        let config = stream::Config {
            name: name.to_owned(),
            subjects: subjects.to_vec(),
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            max_message_size: max_msg_size.unwrap_or(-1),
            ..Default::default()
        };
        self.jetstream
            .create_or_update_stream(config)
            .await
            .unwrap_or_else(|e| panic!("creating stream {name} on NATS at {}: {e}", self.url));
    }

    /// The test's stream (capturing `<prefix>.>`) with this message size limit (`None`: the
    /// server's), made or changed.
    pub async fn limit_message_size(&self, max_msg_size: Option<i32>) {
        self.create_stream(
            &self.stream(),
            &[format!("{}.>", self.prefix)],
            max_msg_size,
        )
        .await;
    }

    /// Delete stream `name` (nothing when it does not exist).
    pub async fn delete_stream(&self, name: &str) {
        let _ = self.jetstream.delete_stream(name).await;
    }

    /// How many messages stream `name` holds (0 when it does not exist).
    pub async fn count(&self, name: &str) -> u64 {
        match self.jetstream.get_stream(name).await {
            Ok(mut stream) => stream.info().await.map(|i| i.state.messages).unwrap_or(0),
            Err(_) => 0,
        }
    }

    /// The messages of stream `name` on `subject` (a filter; `>` for all), in stream order,
    /// once there are `expected` of them or `timeout` passed (then what there is).
    pub async fn messages(
        &self,
        name: &str,
        subject: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<NatsMessage> {
        let stream = self
            .jetstream
            .get_stream(name)
            .await
            .unwrap_or_else(|e| panic!("stream {name} on NATS at {}: {e}", self.url));
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::None,
                filter_subject: subject.to_owned(),
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("a consumer of stream {name}: {e}"));
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let batch = consumer
                .fetch()
                .max_messages(5000)
                .expires(Duration::from_millis(300))
                .messages()
                .await;
            if let Ok(mut batch) = batch {
                while let Some(Ok(message)) = batch.next().await {
                    out.push(to_message(&message));
                }
            }
            if out.len() >= expected || Instant::now() >= deadline {
                return out;
            }
        }
    }
}

fn to_message(message: &jetstream::Message) -> NatsMessage {
    let headers = message
        .headers
        .iter()
        .flat_map(|h| h.iter())
        .filter_map(|(name, values)| {
            let value = values.first()?;
            Some((name.to_string(), value.as_str().to_owned()))
        })
        .collect();
    NatsMessage {
        subject: message.subject.to_string(),
        stream_sequence: message
            .info()
            .map(|i| i.stream_sequence)
            .unwrap_or_default(),
        payload: message.payload.to_vec(),
        headers,
    }
}

fn delivered(message: NatsMessage) -> Delivered {
    Delivered {
        event_id: Uuid::parse_str(message.header("event_id")).unwrap_or_default(),
        aggregate_id: message.header("aggregate_id").to_owned(),
        destination: message.subject.clone(),
        meta: HashMap::from([(
            "stream_sequence".to_owned(),
            message.stream_sequence.to_string(),
        )]),
        payload: message.payload,
        headers: message.headers,
    }
}

#[async_trait]
impl BrokerSide for NatsSide {
    fn name(&self) -> String {
        "NATS JetStream".to_owned()
    }

    /// `nats-server --version` of the machine.
    fn server_version(&self) -> String {
        first_line("nats-server", &["--version"])
    }

    fn sink_toml(&self) -> String {
        sink_tables(
            "nats",
            Some(&self.prefix),
            &format!("url = \"{}\"\n", self.url),
        )
    }

    /// The test's stream, capturing `<prefix>.>`.
    async fn prepare(&self) {
        self.create_stream(&self.stream(), &[format!("{}.>", self.prefix)], None)
            .await;
    }

    fn destination(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}", self.prefix)
    }

    /// The stream in order (which is each subject's order), every message it holds.
    /// Everything the stream holds, read again until every `expected` event is among it or
    /// `timeout` passes (an event the relay is still publishing).
    async fn read_back(&self, expected: &HashSet<Uuid>, timeout: Duration) -> Vec<Delivered> {
        let deadline = Instant::now() + timeout;
        loop {
            let held = self.count(&self.stream()).await as usize;
            let messages: Vec<Delivered> = self
                .messages(&self.stream(), ">", held, Duration::from_secs(60))
                .await
                .into_iter()
                .map(delivered)
                .collect();
            let ids: HashSet<Uuid> = messages.iter().map(|m| m.event_id).collect();
            if expected.is_subset(&ids) || Instant::now() >= deadline {
                return messages;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The stream's message count.
    async fn held(&self, expected: u64, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.count(&self.stream()).await;
            if n >= expected || Instant::now() >= deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A pull consumer of new messages only.
    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        let stream = self
            .jetstream
            .get_stream(self.stream())
            .await
            .unwrap_or_else(|e| panic!("stream {} on NATS at {}: {e}", self.stream(), self.url));
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::New,
                ack_policy: consumer::AckPolicy::None,
                inactive_threshold: Duration::from_secs(60),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("a consumer of stream {}: {e}", self.stream()));
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let Ok(mut messages) = consumer.messages().await else {
                return;
            };
            while let Some(Ok(message)) = messages.next().await {
                let id = message
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("event_id"))
                    .and_then(|v| Uuid::parse_str(v.as_str()).ok());
                if let Some(id) = id {
                    if tx.send((id, Instant::now())).is_err() {
                        return;
                    }
                }
            }
        });
        rx
    }

    /// `Nats-Msg-Id` is the event id; the writer's `traceparent` travels as a header; the
    /// subject is the aggregate type's.
    fn check_messages(&self, delivered: &[Delivered], _committed: &Committed) {
        for m in delivered {
            assert_eq!(m.header("Nats-Msg-Id"), m.event_id.to_string(), "{m:?}");
            assert!(!m.header("traceparent").is_empty(), "{m:?}");
            let aggregate_type = m.header("aggregate_type");
            assert_eq!(m.destination, self.destination(aggregate_type), "{m:?}");
        }
    }

    async fn cleanup(&self) {
        self.delete_stream(&self.stream()).await;
    }
}

/// The sink conformance suite's consumer: a destination is a subject;
/// `prepare_destination` creates a stream for it unless one captures it, `read_back` reads
/// the subject from its stream and deletes the streams it made once all arrived.
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for NatsSide {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let Ok(name) = self.jetstream.stream_by_subject(to).await else {
            return Vec::new();
        };
        let messages = self.messages(&name, to, expected, wait).await;
        if messages.len() >= expected {
            let made = self.suite_streams.lock().unwrap().contains(&name);
            if made {
                self.delete_stream(&name).await;
            }
        }
        let received = |m: NatsMessage| {
            let mut headers: std::collections::BTreeMap<String, String> =
                m.headers.into_iter().collect();
            let mut take = |name| headers.remove(name).expect(name);
            ReceivedMessage {
                event_id: Uuid::parse_str(&take("event_id")).expect("event_id is a UUID"),
                aggregate_id: take("aggregate_id"),
                event_type: take("event_type"),
                payload: m.payload,
                headers,
            }
        };
        messages.into_iter().map(received).collect()
    }

    async fn prepare_destination(&self, to: &str) {
        if self.jetstream.stream_by_subject(to).await.is_ok() {
            return;
        }
        let name = stream_name(to);
        self.create_stream(&name, &[to.to_owned()], None).await;
        self.suite_streams.lock().unwrap().push(name);
    }
}

/// A test's own `nats-server`: JetStream on, a free port of 127.0.0.1, its own store
/// directory, and the extra arguments the test gives (`--user`/`--pass`, `--tls`...). It can be
/// frozen ([`Fault`](crate::Fault): SIGSTOP, by its own pid only). Dropping it always thaws and kills it.
#[derive(Debug)]
pub struct PrivateNats {
    process: OwnProcess,
    port: u16,
    dir: PathBuf,
}

impl PrivateNats {
    /// Start it (files under the scratch directory `name`) and wait until it listens.
    pub fn start(name: &str, extra: &[String]) -> Self {
        let port = free_port();
        let dir = scratch_dir(name).join("nats-server");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating the server's directory");
        let log = dir.join("server.log");
        // setpriv execs nats-server: the child's pid is the server's.
        let mut process = OwnProcess::spawn(
            Command::new("setpriv")
                .args(["--pdeathsig", "KILL", "--"])
                .arg(nats_server())
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(dir.join("store"))
                .arg("-l")
                .arg(&log)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "the test's nats-server",
        )
        .logging_to(log)
        .owning(dir.clone());
        process.wait_listening(port, Duration::from_secs(20));
        Self { process, port, dir }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's directory, for a test's configuration files.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The server's log (for failure messages).
    pub fn log(&self) -> String {
        self.process.log()
    }
}

impl OwnServer for PrivateNats {
    fn process(&self) -> &OwnProcess {
        &self.process
    }
}

fn nats_server() -> PathBuf {
    for dir in ["/usr/sbin", "/usr/local/bin", "/usr/bin"] {
        let path = std::path::Path::new(dir).join("nats-server");
        if path.exists() {
            return path;
        }
    }
    panic!(
        "nats-server is required for this test and was not found: install it (scripts/services.sh)"
    )
}
