//! SQS (LocalStack): one queue, standard or FIFO, consumed while the relays publish
//! (`ReceiveMessage`, recorded, then deleted); and a private SQS server a test may freeze.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::config::{Credentials, Region, SharedCredentialsProvider};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, Message, MessageSystemAttributeName, QueueAttributeName,
};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{sink_tables, BrokerSide};
use crate::delivery::{Committed, Delivered};
use crate::process::{OwnProcess, OwnServer};
use crate::scenario::TRACEPARENT;
use crate::util::{free_port, scratch_dir};
#[cfg(feature = "sink-suite")]
use outboxkit_core::testkit::sink_suite::ReceivedMessage;

/// SQS for tests: `OUTBOX_TEST_SQS_ENDPOINT`, default the LocalStack that
/// `scripts/services.sh` starts.
pub fn sqs_endpoint() -> String {
    std::env::var("OUTBOX_TEST_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned())
}

/// The credentials every relay process gets through the standard AWS chain (environment).
pub const AWS_ENV: &[(&str, &str)] = &[
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
];

pub(crate) const REGION: &str = "us-east-1";

/// The SDK settings of the harness's AWS clients (consumer and set-up): the test credentials,
/// short attempts, no retries (the consumer retries by itself).
pub(crate) fn aws_sdk_config(endpoint: &str) -> aws_types::SdkConfig {
    let credentials = Credentials::new("test", "test", None, None, "outboxkit-harness");
    aws_types::SdkConfig::builder()
        .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .endpoint_url(endpoint)
        .timeout_config(
            aws_sdk_sqs::config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(5))
                .build(),
        )
        .retry_config(aws_sdk_sqs::config::retry::RetryConfig::standard().with_max_attempts(1))
        .build()
}

/// The `[sink]` and `[sink.<kind>]` tables of an AWS sink sending to `destination` (under
/// `key`: `queue`, `topic`) on the server at `endpoint`.
pub(crate) fn aws_sink_toml(kind: &str, key: &str, destination: &str, endpoint: &str) -> String {
    sink_tables(
        kind,
        None,
        &format!("{key} = \"{destination}\"\nendpoint = \"{endpoint}\"\nregion = \"{REGION}\"\n"),
    )
}

/// [`AWS_ENV`] as a relay process's environment.
pub(crate) fn aws_relay_env() -> Vec<(String, String)> {
    AWS_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// An SQS client for the consumer and set-up.
fn sqs_client(endpoint: &str) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&aws_sdk_config(endpoint))
}

/// The SQS side: queue `<prefix>` (standard) or `<prefix>.fifo`. [`BrokerSide::prepare`]
/// creates it and starts the independent consumer: loops of `ReceiveMessage` recording each
/// message before deleting it (a FIFO queue hands out a group's next message only once the
/// previous one is deleted, so the record keeps each group's order; after a freeze of
/// LocalStack it may not, see [`Self::received_in_queue_order`]), retrying through errors
/// (the server frozen...), until [`BrokerSide::cleanup`]. `headers` are the message
/// attributes; `meta["message_group_id"]` is the FIFO message group and
/// `meta["sequence_number"]` the FIFO queue's sequence number.
#[derive(Debug)]
pub struct SqsSide {
    endpoint: String,
    queue: String,
    attributes: Vec<(QueueAttributeName, String)>,
    json_attribute: Option<String>,
    consumers: usize,
    client: aws_sdk_sqs::Client,
    url: Mutex<String>,
    records: Arc<Mutex<Vec<Delivered>>>,
    errors: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl SqsSide {
    /// A standard queue `<prefix>` on the test server ([`sqs_endpoint`]).
    pub async fn standard(prefix: &str) -> Self {
        Self::new(&sqs_endpoint(), prefix.to_owned())
    }

    /// A standard queue `<prefix>` on the server at `endpoint`.
    pub async fn standard_at(endpoint: &str, prefix: &str) -> Self {
        Self::new(endpoint, prefix.to_owned())
    }

    /// A FIFO queue `<prefix>.fifo` on the test server.
    pub async fn fifo(prefix: &str) -> Self {
        Self::new(&sqs_endpoint(), format!("{prefix}.fifo"))
    }

    /// A FIFO queue `<prefix>.fifo` on the server at `endpoint`.
    pub async fn fifo_at(endpoint: &str, prefix: &str) -> Self {
        Self::new(endpoint, format!("{prefix}.fifo"))
    }

    fn new(endpoint: &str, queue: String) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            queue,
            attributes: Vec::new(),
            json_attribute: None,
            consumers: 4,
            client: sqs_client(endpoint),
            url: Mutex::default(),
            records: Arc::default(),
            errors: Arc::default(),
            stop: Arc::default(),
            tasks: Mutex::default(),
        }
    }

    /// Create the queue with this attribute too.
    pub fn attribute(mut self, name: QueueAttributeName, value: &str) -> Self {
        self.attributes.push((name, value.to_owned()));
        self
    }

    /// Attribute `name` holds further attributes as one JSON object of strings (a sink's
    /// overflow past SQS's 10 message attributes): [`Self::receive_all`] merges them into
    /// [`SqsMessage::attributes`] (ones set directly win).
    pub fn json_attribute(mut self, name: &str) -> Self {
        self.json_attribute = Some(name.to_owned());
        self
    }

    /// Consume with `tasks` concurrent receive loops (4 unless told otherwise; 0: none, the
    /// messages stay in the queue for [`BrokerSide::held`] or [`BrokerSide::watch`]).
    pub fn consumers(mut self, tasks: usize) -> Self {
        self.consumers = tasks;
        self
    }

    fn is_fifo(&self) -> bool {
        self.queue.ends_with(".fifo")
    }

    /// Everything the consumer received so far, in the order it recorded it.
    pub fn received(&self) -> Vec<Delivered> {
        self.records.lock().unwrap().clone()
    }

    /// Everything the consumer received so far, in the order the FIFO queue took it (its
    /// `SequenceNumber`): the order the relay published in. Unlike [`Self::received`] it does not
    /// depend on the order consumers got messages in, which a frozen LocalStack can mix up.
    /// Receives and deletes that timed out during the freeze are all served after the thaw:
    /// a lost receive keeps its messages invisible until the visibility timeout, and a stale
    /// delete that lands while LocalStack's `receive` has taken a group's messages but not yet
    /// marked them in flight unlocks the group, so its next message can go out first.
    pub fn received_in_queue_order(&self) -> Vec<Delivered> {
        let mut delivered = self.received();
        delivered.sort_by_cached_key(|d| {
            let sequence = d.meta.get("sequence_number").map(|s| s.parse::<u128>());
            sequence.and_then(Result::ok).unwrap_or_else(|| {
                panic!(
                    "no numeric SequenceNumber (is queue {} FIFO?): {d:?}",
                    self.queue
                )
            })
        });
        delivered
    }

    /// The distinct event ids received so far.
    pub fn distinct(&self) -> HashSet<Uuid> {
        self.records
            .lock()
            .unwrap()
            .iter()
            .map(|d| d.event_id)
            .collect()
    }

    /// Receive and delete calls that failed (and were retried).
    pub fn consumer_errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Fail the test, saying what to start, when the server does not answer within 20 s.
    pub async fn require_server(&self) {
        let endpoint = &self.endpoint;
        let list = self.client.list_queues().max_results(1).send();
        match tokio::time::timeout(Duration::from_secs(20), list).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!(
                "the SQS server at {endpoint} does not answer ({}): start it with \
                 scripts/services.sh or set OUTBOX_TEST_SQS_ENDPOINT",
                DisplayErrorContext(&e)
            ),
            Err(_) => panic!("the SQS server at {endpoint} did not answer within 20s"),
        }
    }

    /// Create queue `name` (FIFO when it ends in `.fifo`) with these attributes too, or fail
    /// the test saying what to start; its URL.
    pub async fn create_queue(
        &self,
        name: &str,
        attributes: &[(QueueAttributeName, &str)],
    ) -> String {
        let mut request = self.client.create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            request = request.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (key, value) in attributes {
            request = request.attributes(key.clone(), *value);
        }
        match request.send().await {
            Ok(answer) => answer.queue_url().expect("a queue URL").to_owned(),
            Err(e) => panic!(
                "creating SQS queue {name} at {} failed ({}): is the SQS server up? start it \
                 with scripts/services.sh or set OUTBOX_TEST_SQS_ENDPOINT",
                self.endpoint,
                DisplayErrorContext(&e)
            ),
        }
    }

    /// The URL of queue `name`, or `None` when it does not exist (or the lookup failed).
    pub async fn queue_url(&self, name: &str) -> Option<String> {
        let answer = self.client.get_queue_url().queue_name(name).send().await;
        Some(answer.ok()?.queue_url()?.to_owned())
    }

    /// The ARN of the queue at `url` (to subscribe it to an SNS topic).
    pub async fn queue_arn(&self, url: &str) -> String {
        let answer = self
            .client
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .unwrap_or_else(|e| panic!("the ARN of {url}: {}", DisplayErrorContext(&e)));
        answer
            .attributes()
            .and_then(|a| a.get(&QueueAttributeName::QueueArn))
            .cloned()
            .unwrap_or_else(|| panic!("no QueueArn for {url}"))
    }

    /// The URL of the side's queue, once [`BrokerSide::prepare`] created it.
    pub fn url(&self) -> String {
        self.url.lock().unwrap().clone()
    }

    /// The side's queue name.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Delete the queue at `url` (errors ignored).
    pub async fn delete_queue(&self, url: &str) {
        let _ = self.client.delete_queue().queue_url(url).send().await;
    }

    /// Receive (and delete) the messages of the queue at `url`, with every message and system
    /// attribute, until `expected` arrived and a receive came back empty, or `timeout` passed.
    /// Receives at least once, so stray messages are seen even with `expected = 0`. Fails the
    /// test when a receive or delete fails.
    pub async fn receive_all(
        &self,
        url: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<SqsMessage> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .client
                .receive_message()
                .queue_url(url)
                .max_number_of_messages(10)
                .wait_time_seconds(remaining.as_secs().min(1) as i32)
                .visibility_timeout(60)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .unwrap_or_else(|e| panic!("ReceiveMessage on {url}: {}", DisplayErrorContext(&e)));
            let messages = answer.messages();
            let json = self.json_attribute.as_deref();
            out.extend(messages.iter().map(|m| SqsMessage::new(m, json)));
            let handles: Vec<&str> = messages.iter().filter_map(|m| m.receipt_handle()).collect();
            if !handles.is_empty() {
                self.client
                    .delete_message_batch()
                    .queue_url(url)
                    .set_entries(Some(delete_entries(&handles)))
                    .send()
                    .await
                    .unwrap_or_else(|e| {
                        panic!("DeleteMessageBatch on {url}: {}", DisplayErrorContext(&e))
                    });
            }
            let done = messages.is_empty() && out.len() >= expected;
            if done || Instant::now() >= deadline {
                return out;
            }
        }
    }

    /// Wait until the consumer received every one of `expected`.
    pub async fn wait_for_all(&self, expected: &HashSet<Uuid>, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let seen = self.distinct();
            let missing = expected.iter().filter(|id| !seen.contains(id)).count();
            if missing == 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the consumer still misses {missing} of {} committed events after {timeout:?} \
                 ({} receive/delete errors)",
                expected.len(),
                self.consumer_errors()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[async_trait]
impl BrokerSide for SqsSide {
    fn name(&self) -> String {
        format!(
            "SQS {} queue",
            if self.is_fifo() { "FIFO" } else { "standard" }
        )
    }

    fn sink_toml(&self) -> String {
        aws_sink_toml("sqs", "queue", &self.queue, &self.endpoint)
    }

    fn relay_env(&self) -> Vec<(String, String)> {
        aws_relay_env()
    }

    /// Create the queue (or fail the test saying what to start) and start the consumer.
    async fn prepare(&self) {
        let attributes: Vec<(QueueAttributeName, &str)> = self
            .attributes
            .iter()
            .map(|(key, value)| (key.clone(), value.as_str()))
            .collect();
        let url = self.create_queue(&self.queue, &attributes).await;
        *self.url.lock().unwrap() = url.clone();
        let tasks = (0..self.consumers).map(|_| {
            let (client, url, queue, records, errors, stop) = (
                self.client.clone(),
                url.clone(),
                self.queue.clone(),
                self.records.clone(),
                self.errors.clone(),
                self.stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    consume_once(&client, &url, &queue, &records, &errors).await;
                }
            })
        });
        self.tasks.lock().unwrap().extend(tasks);
    }

    fn destination(&self, _aggregate_type: &str) -> String {
        self.queue.clone()
    }

    /// LocalStack's version from its health endpoint.
    fn server_version(&self) -> String {
        format!(
            "LocalStack {} (SQS API emulator, Python)",
            localstack_version(&self.endpoint)
        )
    }

    /// Standard queues promise no order (and several receivers take messages concurrently).
    fn ordered(&self) -> bool {
        self.is_fifo()
    }

    /// Once every one of `expected` arrived, 2 s more (so late duplicates are counted too);
    /// from a FIFO queue in the order the queue took them ([`Self::received_in_queue_order`]:
    /// the relay's order, whatever LocalStack did to the consumers), else as received.
    async fn read_back(&self, expected: &HashSet<Uuid>, timeout: Duration) -> Vec<Delivered> {
        self.wait_for_all(expected, timeout).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        if self.is_fifo() {
            self.received_in_queue_order()
        } else {
            self.received()
        }
    }

    /// `ApproximateNumberOfMessages` + `...NotVisible`, every 500 ms until `expected` or
    /// `timeout` (without consumers: [`SqsSide::consumers`] 0).
    async fn held(&self, expected: u64, timeout: Duration) -> u64 {
        let url = self.url.lock().unwrap().clone();
        let deadline = Instant::now() + timeout;
        loop {
            let answer = self
                .client
                .get_queue_attributes()
                .queue_url(&url)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
                .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .send()
                .await
                .unwrap_or_else(|e| panic!("counting {}: {}", self.queue, DisplayErrorContext(&e)));
            let n: u64 = answer
                .attributes()
                .map(|a| a.values().filter_map(|v| v.parse::<u64>().ok()).sum())
                .unwrap_or(0);
            if n >= expected || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Four long-polling receivers (10 messages, 1 s waits) that delete nothing: give the
    /// queue a long `VisibilityTimeout` so received messages do not come back meanwhile.
    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        let url = self.url.lock().unwrap().clone();
        let (tx, rx) = mpsc::unbounded_channel();
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
        rx
    }

    /// The writer's headers travel as message attributes; on a FIFO queue the message group is
    /// the aggregate (so the order checked is SQS's per-group order).
    fn check_messages(&self, delivered: &[Delivered], committed: &Committed) {
        for m in delivered {
            let (_, aggregate) = &committed[&m.event_id];
            assert_eq!(m.header("traceparent"), TRACEPARENT, "{m:?}");
            if self.is_fifo() {
                assert_eq!(m.meta("message_group_id"), aggregate, "{m:?}");
            }
        }
    }

    /// Stop the consumer and delete the queue.
    async fn cleanup(&self) {
        self.stop.store(true, Ordering::Relaxed);
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap());
        for task in tasks {
            let _ = task.await;
        }
        let url = self.url.lock().unwrap().clone();
        let _ = self.client.delete_queue().queue_url(url).send().await;
    }
}

impl Drop for SqsSide {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// LocalStack's version from its health endpoint, or "(version unknown)".
pub(crate) fn localstack_version(endpoint: &str) -> String {
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

async fn consume_once(
    client: &aws_sdk_sqs::Client,
    url: &str,
    queue: &str,
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
        .message_system_attribute_names(MessageSystemAttributeName::SequenceNumber)
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
    let messages = answer.messages();
    records
        .lock()
        .unwrap()
        .extend(messages.iter().map(|message| {
            let m = SqsMessage::new(message, None);
            Delivered {
                event_id: m
                    .attributes
                    .get("event_id")
                    .and_then(|s| Uuid::parse_str(s).ok())
                    .unwrap_or_default(),
                aggregate_id: m
                    .attributes
                    .get("aggregate_id")
                    .cloned()
                    .unwrap_or_default(),
                destination: queue.to_owned(),
                payload: m.payload(),
                headers: m.attributes.into_iter().collect(),
                meta: [
                    ("message_group_id", m.group_id),
                    ("sequence_number", m.sequence_number),
                ]
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_owned(), value?)))
                .collect(),
            }
        }));
    let handles: Vec<&str> = messages.iter().filter_map(|m| m.receipt_handle()).collect();
    if handles.is_empty() {
        return;
    }
    let entries = delete_entries(&handles);
    // Keep deleting through an outage: an undeleted FIFO message blocks its group.
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

/// One SQS message as the consumer received it.
#[derive(Debug, Clone)]
pub struct SqsMessage {
    pub body: String,
    /// The message attributes with string values (with those of the side's JSON attribute
    /// merged in, see [`SqsSide::json_attribute`]).
    pub attributes: BTreeMap<String, String>,
    /// How many message attributes the message had on the wire.
    pub attribute_count: usize,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    /// The FIFO queue's `SequenceNumber` of the message: the order in which the queue took it.
    pub sequence_number: Option<String>,
}

impl SqsMessage {
    fn new(message: &Message, json_attribute: Option<&str>) -> Self {
        let wire = message.message_attributes();
        let mut attributes: BTreeMap<String, String> = wire
            .into_iter()
            .flatten()
            .filter_map(|(k, v)| Some((k.clone(), v.string_value()?.to_owned())))
            .collect();
        if let Some(json) = json_attribute.and_then(|name| attributes.remove(name)) {
            let extra: BTreeMap<String, String> = serde_json::from_str(&json)
                .expect("the JSON attribute is a JSON object of strings");
            for (name, value) in extra {
                attributes.entry(name).or_insert(value);
            }
        }
        let system = |name| message.attributes()?.get(&name).cloned();
        Self {
            body: message.body().unwrap_or_default().to_owned(),
            attributes,
            attribute_count: wire.map_or(0, HashMap::len),
            group_id: system(MessageSystemAttributeName::MessageGroupId),
            deduplication_id: system(MessageSystemAttributeName::MessageDeduplicationId),
            sequence_number: system(MessageSystemAttributeName::SequenceNumber),
        }
    }

    /// The payload the body carries: the body itself, or the body base64-decoded when the
    /// `body_encoding` attribute says `base64` (payloads of `binary` tables).
    pub fn payload(&self) -> Vec<u8> {
        match self.attributes.get("body_encoding").map(String::as_str) {
            Some("base64") => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(&self.body)
                    .unwrap_or_else(|e| panic!("body_encoding = base64, but {e}: {self:?}"))
            }
            Some(other) => panic!("unknown body_encoding `{other}`: {self:?}"),
            None => self.body.clone().into_bytes(),
        }
    }

    /// Its body, attributes, attribute count, group id and deduplication id, borrowed: a
    /// message as the shared cases of the AWS sinks' tests look at it (`Fields` of
    /// `outboxkit_aws::testkit`).
    pub fn fields(
        &self,
    ) -> (
        &str,
        &BTreeMap<String, String>,
        usize,
        Option<&str>,
        Option<&str>,
    ) {
        let group_id = self.group_id.as_deref();
        let deduplication_id = self.deduplication_id.as_deref();
        let (body, attributes, count) = (&self.body, &self.attributes, self.attribute_count);
        (body, attributes, count, group_id, deduplication_id)
    }

    /// The attribute `name`; fails the test when the message has none.
    pub fn attribute(&self, name: &str) -> &str {
        self.attributes
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("message has no attribute `{name}`: {self:?}"))
    }
}

fn delete_entries(handles: &[&str]) -> Vec<DeleteMessageBatchRequestEntry> {
    let entry = |(i, handle): (usize, &&str)| {
        DeleteMessageBatchRequestEntry::builder()
            .id(format!("d{i}"))
            .receipt_handle(*handle)
            .build()
            .expect("a delete entry")
    };
    handles.iter().enumerate().map(entry).collect()
}

/// A LocalStack (SQS and SNS; or, where only the fallback is installed, a moto) server of the
/// test's own,
/// on a free port, in its own process group. Its [`Fault`](crate::Fault) is a freeze (SIGSTOP of its pid:
/// it keeps its queues and messages but answers nothing) and a thaw. Dropping it always thaws
/// it and kills its group, so a failing test never leaves a frozen server behind.
#[derive(Debug)]
pub struct OwnSqsServer {
    process: OwnProcess,
    pub endpoint: String,
}

impl OwnSqsServer {
    /// Start it (files under the scratch directory `name`) and wait until it answers.
    pub async fn start(name: &str) -> Self {
        let port = free_port();
        let dir = scratch_dir(name).join("sqs-server");
        std::fs::create_dir_all(dir.join("fs")).expect("creating the server's directory");
        let log = std::fs::File::create(dir.join("server.log")).expect("creating the server log");
        let localstack = std::env::var("OUTBOX_TEST_LOCALSTACK_PYTHON")
            .unwrap_or_else(|_| "/opt/outbox-relay/localstack-venv/bin/python".to_owned());
        let moto = "/opt/outbox-relay/moto-venv/bin/moto_server";
        let mut command = if Path::new(&localstack).exists() {
            let mut c = Command::new(&localstack);
            c.args(["-m", "localstack.runtime.main"])
                .env("GATEWAY_SERVER", "hypercorn")
                .env("GATEWAY_LISTEN", format!("127.0.0.1:{port}"))
                .env("SERVICES", "sqs,sns")
                .env("PERSISTENCE", "0")
                .env("LOCALSTACK_TELEMETRY_DISABLED", "1")
                .env("SKIP_SSL_CERT_DOWNLOAD", "1")
                .env("DNS_ADDRESS", "0")
                .env("SQS_ENDPOINT_STRATEGY", "path")
                .env("LOCALSTACK_HOST", format!("127.0.0.1:{port}"))
                .env("LOCALSTACK_VOLUME_DIR", &dir)
                .env("FILESYSTEM_ROOT", dir.join("fs"));
            c
        } else if Path::new(moto).exists() {
            let mut c = Command::new(moto);
            c.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
            c
        } else {
            panic!(
                "no SQS server installed at {localstack} (nor {moto}): run scripts/services.sh, \
                 or set OUTBOX_TEST_LOCALSTACK_PYTHON"
            );
        };
        let process = OwnProcess::spawn_group(
            command
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("cloning the log handle"))
                .stderr(log),
            "the test's SQS server",
        )
        .logging_to(dir.join("server.log"));
        let server = Self {
            process,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let client = sqs_client(&server.endpoint);
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if client.list_queues().send().await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the test's own SQS server did not answer on {} within 90s; log:\n{}",
                server.endpoint,
                server.process.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        server
    }
}

impl OwnServer for OwnSqsServer {
    fn process(&self) -> &OwnProcess {
        &self.process
    }
}

/// The sink conformance suite's consumer: a destination is a queue name;
/// [`SuiteConsumer::prepare_destination`] creates the queue, `read_back` receives (and deletes)
/// its messages and deletes the queue once all arrived. The event id, aggregate id and event
/// type are message attributes.
///
/// [`SuiteConsumer::prepare_destination`]: outboxkit_core::testkit::sink_suite::SuiteConsumer::prepare_destination
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for SqsSide {
    /// Standard queues promise no order.
    fn keeps_order(&self) -> bool {
        self.ordered()
    }

    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let Some(url) = self.queue_url(to).await else {
            return Vec::new();
        };
        let received = self.receive_all(&url, expected, wait).await;
        if received.len() >= expected {
            self.delete_queue(&url).await;
        }
        let message = |m: SqsMessage| {
            let payload = m.payload();
            let mut headers = m.attributes;
            headers.remove("body_encoding");
            let mut take = |name| headers.remove(name).expect(name);
            ReceivedMessage {
                event_id: Uuid::parse_str(&take("event_id")).expect("event_id is a UUID"),
                aggregate_id: take("aggregate_id"),
                event_type: take("event_type"),
                payload,
                headers,
            }
        };
        received.into_iter().map(message).collect()
    }

    async fn prepare_destination(&self, to: &str) {
        self.create_queue(to, &[]).await;
    }
}
