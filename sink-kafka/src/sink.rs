//! The [`Sink`] implementation: every event of a batch is handed to librdkafka at once
//! (it batches and pipelines them per partition), then every delivery report is awaited.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::SecondsFormat;
use outboxkit_core::cloudevents::{is_mapped_header, CloudEvents};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};
use rdkafka::client::ClientContext;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer, PurgeConfig};
use tracing::{debug, error, warn};

use crate::classify::{
    classify, classify_code, code_kind, describe, error_code, needs_new_producer,
};
use crate::config::{KafkaSinkConfig, RecordTimestamp, BOOTSTRAP_SERVERS, CONFIG_SECTION};
use crate::topics::check_topic_name;

/// How much longer than `delivery_timeout` a call waits for librdkafka's delivery reports
/// before purging what is left (librdkafka reports every message within about
/// `message.timeout.ms`; this is a safety net).
const DELIVERY_GRACE: Duration = Duration::from_secs(15);

/// After a purge, how long the purged messages' reports may take.
const PURGE_GRACE: Duration = Duration::from_secs(5);

/// How long the metadata probe for the topics of timed-out events may take.
const METADATA_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Most topics probed after one call.
const MAX_TOPICS_EXPLAINED: usize = 4;

/// Header names the relay sets on every message (after the event's own headers, so a
/// consumer reading the last header of a name gets the relay's value).
pub const RELAY_HEADERS: &[&str] = &[
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "created_at",
];

/// What the client context remembers of librdkafka's last error callback: the most telling
/// explanation of a call that timed out ("Connect to ipv4#127.0.0.1:9092 failed: Connection
/// refused", "SASL authentication error: ...").
#[derive(Debug, Default)]
struct ClientState {
    /// The last few distinct errors, oldest first.
    recent: Mutex<Vec<(Instant, Option<RDKafkaErrorCode>, String)>>,
}

/// How many distinct client errors a message quotes.
const RECENT_ERRORS: usize = 3;

impl ClientState {
    fn remember(&self, code: Option<RDKafkaErrorCode>, reason: &str) {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.retain(|(_, _, r)| r != reason);
        recent.push((Instant::now(), code, reason.to_owned()));
        if recent.len() > RECENT_ERRORS {
            recent.remove(0);
        }
    }

    /// The distinct client errors of the last `within`, oldest first.
    fn recent(&self, within: Duration) -> Vec<(Option<RDKafkaErrorCode>, String)> {
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent
            .iter()
            .filter(|(at, _, _)| at.elapsed() <= within)
            .map(|(_, code, reason)| (*code, reason.clone()))
            .collect()
    }
}

/// librdkafka's callbacks, routed to `tracing` (target `librdkafka`), in the span the producer
/// was made in (the pipeline's, in the relay), although librdkafka calls them on its threads.
#[derive(Clone)]
pub struct KafkaContext {
    state: Arc<ClientState>,
    span: tracing::Span,
}

impl fmt::Debug for KafkaContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaContext").finish_non_exhaustive()
    }
}

impl ClientContext for KafkaContext {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        let _span = self.span.enter();
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => error!(target: "librdkafka", facility, "{message}"),
            RDKafkaLogLevel::Warning => warn!(target: "librdkafka", facility, "{message}"),
            // Connection notices and the like: what `debug` shows, not every-day news.
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info | RDKafkaLogLevel::Debug => {
                debug!(target: "librdkafka", facility, "{message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let _span = self.span.enter();
        let code = error_code(&error);
        self.state.remember(code, reason);
        match code {
            Some(RDKafkaErrorCode::Fatal) => {
                error!(target: "librdkafka", error = %error, "Kafka producer fatal error: {reason}")
            }
            _ => match not_kafka(reason) {
                Some(explained) => warn!(target: "librdkafka", error = %error, "{explained}"),
                None => warn!(target: "librdkafka", error = %error, "{reason}"),
            },
        }
    }
}

/// librdkafka's `Invalid response size N (..): increase receive.message.max.bytes`, when the
/// four bytes of N are printable text, rewritten to say what they are: a server that is not
/// Kafka answered (`"AMQP"` is RabbitMQ, `"HTTP"` a web server), and the property to raise is
/// not the fix. A real Kafka response that large (over 500 MB) does not happen to a producer.
fn not_kafka(reason: &str) -> Option<String> {
    const MARK: &str = "Invalid response size ";
    let at = reason.find(MARK)?;
    let digits = &reason[at + MARK.len()..];
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    let size: u32 = digits[..end].parse().ok()?;
    let bytes = size.to_be_bytes();
    if !bytes.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return None;
    }
    let text = String::from_utf8_lossy(&bytes);
    // `sasl_plaintext://host:9092/bootstrap: Receive failed: ...`: the broker's name, less
    // librdkafka's node id.
    let name = reason.split(": ").next().unwrap_or(reason);
    let server = name.rsplit_once('/').map_or(name, |(server, _)| server);
    Some(format!(
        "{server} answered {text:?}, which is not Kafka's protocol: check the host and port in \
         {CONFIG_SECTION}.\"{BOOTSTRAP_SERVERS}\""
    ))
}

type RelayProducer = FutureProducer<KafkaContext>;

/// Publishes outbox events to Kafka topics with an idempotent librdkafka producer.
///
/// Topic from the template (default `{aggregate_type}.{event_type}`) or the row's
/// `destination`; key = `aggregate_id`, so all events of an aggregate land in one partition;
/// value = the payload bytes; headers = the event's own headers, then `event_id`,
/// `event_type`, `aggregate_type`, `aggregate_id`, `created_at`.
///
/// With `format = "cloudevents"` (CloudEvents 1.0, Kafka protocol binding, binary content
/// mode): value = the payload bytes; headers = every attribute but `datacontenttype` as
/// `ce_<name>`, `datacontenttype` as `content-type`, the event's headers that are not
/// attributes, then the relay's headers as above.
///
/// The record's timestamp is the produce time, or with `timestamp = "created_at"` the event's
/// `created_at`.
///
/// With `tombstone_on_empty_payload`, an event whose payload is empty (see
/// [`OutboxEvent::payload_is_empty`]) is a tombstone: the same key and headers (but
/// `content-type`), and no value.
///
/// The producer reconnects by itself. When its idempotence state breaks (fatal error,
/// out-of-order sequence, fenced producer id) the sink drops it and makes a new one before
/// the next call.
pub struct KafkaSink {
    config: KafkaSinkConfig,
    template: DestinationTemplate,
    cloudevents: Option<CloudEvents>,
    client_config: ClientConfig,
    state: Arc<ClientState>,
    producer: Mutex<Arc<RelayProducer>>,
    generation: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One event of a call: decided already, or waiting for its delivery report.
enum Slot {
    Done(Outcome),
    Waiting(String, DeliveryFuture),
}

impl KafkaSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "kafka";

    /// Validate `config` and create the producer without waiting for the network
    /// (librdkafka connects in the background; errors surface from [`Sink::check`] and
    /// [`Sink::publish`]). Must be called within a Tokio runtime.
    pub fn new(config: KafkaSinkConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let client_config = config.client_config();
        let state = Arc::new(ClientState::default());
        let producer = create_producer(&client_config, &state, &config)?;
        Ok(Self {
            config,
            template,
            cloudevents,
            client_config,
            state,
            producer: Mutex::new(Arc::new(producer)),
            generation: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// [`new`](Self::new), then [`check`](Sink::check): fails fast with one line naming the
    /// brokers and the key, e.g. `cannot reach Kafka at 127.0.0.1:9099
    /// (sink.kafka."bootstrap.servers"): ...`.
    pub async fn connect(config: KafkaSinkConfig) -> Result<Self> {
        let sink = Self::new(config)?;
        sink.check().await?;
        Ok(sink)
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &KafkaSinkConfig {
        &self.config
    }

    /// How many times the producer was recreated after a fatal error or a broken
    /// idempotence state.
    pub fn producer_generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn producer(&self) -> Arc<RelayProducer> {
        self.producer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replace the producer `used` by a new one (unless another call already did). The old
    /// one is dropped off the async threads: dropping purges and flushes it.
    fn renew_producer(&self, used: &Arc<RelayProducer>, why: &str) {
        let fresh = match create_producer(&self.client_config, &self.state, &self.config) {
            Ok(p) => Arc::new(p),
            Err(e) => {
                error!(error = %e, "cannot recreate the Kafka producer; keeping the old one");
                return;
            }
        };
        let old = {
            let mut guard = self.producer.lock().unwrap_or_else(|p| p.into_inner());
            if !Arc::ptr_eq(&guard, used) {
                return;
            }
            std::mem::replace(&mut *guard, fresh)
        };
        let generation = self
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        warn!(
            generation,
            reason = why,
            "recreated the Kafka producer (new producer id); the failed events will be sent again"
        );
        tokio::task::spawn_blocking(move || drop(old));
    }

    fn servers(&self) -> &str {
        self.config.bootstrap_servers()
    }

    /// ` (client errors: ...)` when librdkafka reported some during this call.
    fn last_client_error(&self, since: Instant) -> String {
        let recent = self.state.recent(since.elapsed() + Duration::from_secs(1));
        if recent.is_empty() {
            return String::new();
        }
        let reasons: Vec<String> = recent
            .into_iter()
            .map(|(_, reason)| not_kafka(&reason).unwrap_or(reason))
            .collect();
        format!(" (client errors: {})", reasons.join("; "))
    }

    /// Whether librdkafka reported refused credentials (a failed SASL handshake...) since
    /// `since`.
    fn credentials_refused(&self, since: Instant) -> bool {
        let recent = self.state.recent(since.elapsed() + Duration::from_secs(1));
        recent
            .iter()
            .any(|(code, _)| code.is_some_and(|c| code_kind(c).0 == ErrorKind::Unauthorized))
    }

    /// The kind to report for a call that timed out: what the client errors say (refused
    /// credentials) when they do, else `fallback`.
    fn timeout_kind(&self, since: Instant, fallback: ErrorKind) -> ErrorKind {
        if self.credentials_refused(since) {
            ErrorKind::Unauthorized
        } else {
            fallback
        }
    }

    /// The message's headers: in raw format the event's own headers; with CloudEvents the
    /// attributes (`ce_<name>`, `content-type`) and the event's headers that are not
    /// attributes. Then the relay's headers.
    /// A tombstone carries no data, hence no `content-type` header.
    fn headers(
        event: &OutboxEvent,
        cloudevents: Option<&CloudEvents>,
        tombstone: bool,
    ) -> OwnedHeaders {
        let event_id = event.event_id.to_string();
        let created_at = event
            .created_at
            .to_rfc3339_opts(SecondsFormat::Micros, true);
        // Borrowed names and values: no copy per header on the publish path.
        let attributes = cloudevents.map(|ce| ce.binary_headers(event, "ce_"));
        let mut own: Vec<(&str, &str)> = Vec::with_capacity(event.headers.len());
        if let Some(attributes) = &attributes {
            own.extend(attributes.iter().map(|(n, v)| (n.as_str(), v.as_str())));
            if !tombstone {
                own.push(("content-type", event.content_type()));
            }
        }
        for (name, value) in &event.headers {
            if cloudevents.is_none() || !is_mapped_header(name) {
                own.push((name.as_str(), value.as_str()));
            }
        }
        let mut headers = OwnedHeaders::new_with_capacity(own.len() + RELAY_HEADERS.len());
        for (key, value) in own.into_iter().chain([
            ("event_id", event_id.as_str()),
            ("event_type", event.event_type.as_str()),
            ("aggregate_type", event.aggregate_type.as_str()),
            ("aggregate_id", event.aggregate_id.as_str()),
            ("created_at", created_at.as_str()),
        ]) {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        headers
    }

    /// The error of an event librdkafka refused to queue.
    /// `headers_size`: the bytes of the message's header names and values.
    fn enqueue_error(
        &self,
        error: &KafkaError,
        event: &OutboxEvent,
        headers_size: usize,
        topic: &str,
    ) -> Error {
        let classified = classify(error);
        match error_code(error) {
            Some(RDKafkaErrorCode::MessageSizeTooLarge) => {
                let size = event.payload.len() + event.aggregate_id.len() + headers_size;
                classified.context(format!(
                    "event of about {size} bytes (payload {} bytes) is larger than the \
                     producer's message.max.bytes ({} bytes) for topic `{topic}`; to send it, \
                     raise {CONFIG_SECTION}.\"message.max.bytes\" and the topic's \
                     max.message.bytes",
                    event.payload.len(),
                    self.config.message_max_bytes()
                ))
            }
            Some(RDKafkaErrorCode::QueueFull) => classified.context(format!(
                "queueing for topic `{topic}` (the producer's queue is full: \
                 queue.buffering.max.messages / queue.buffering.max.kbytes)"
            )),
            // librdkafka refuses at once what it has learnt (by a failed delivery) to be a
            // missing topic: the same advice as the delivery report's.
            Some(RDKafkaErrorCode::UnknownTopicOrPartition | RDKafkaErrorCode::UnknownTopic) => {
                classified.context(missing_topic(topic))
            }
            _ => classified.context(format!("queueing for topic `{topic}`")),
        }
    }

    /// The error of a message whose delivery report says it failed.
    fn delivery_error(&self, error: &KafkaError, topic: &str) -> Error {
        let classified = classify(error);
        match error_code(error) {
            Some(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge) => {
                classified.context(format!(
                    "the broker refused the message to topic `{topic}` as too large (the \
                     topic's max.message.bytes or the broker's message.max.bytes)"
                ))
            }
            Some(
                RDKafkaErrorCode::UnknownTopicOrPartition
                | RDKafkaErrorCode::UnknownTopic
                | RDKafkaErrorCode::UnknownPartition,
            ) => classified.context(missing_topic(topic)),
            Some(RDKafkaErrorCode::MessageTimedOut) => classified.context(format!(
                "no acknowledgement for topic `{topic}` within {} ({CONFIG_SECTION}.delivery_timeout)",
                humantime::format_duration(self.config.delivery_timeout)
            )),
            _ => classified.context(format!("delivering to topic `{topic}`")),
        }
    }

    /// Await every waiting slot: up to `delivery_timeout` + a grace period, then purge what
    /// is left and collect the purge reports.
    async fn await_reports(
        &self,
        producer: &Arc<RelayProducer>,
        slots: Vec<Slot>,
        started: Instant,
    ) -> Reports {
        let deadline =
            tokio::time::Instant::from_std(started) + self.config.delivery_timeout + DELIVERY_GRACE;
        let mut outcomes = Vec::with_capacity(slots.len());
        let mut purged = false;
        let mut broken_state = None;
        let mut timed_out = Vec::new();
        for slot in slots {
            let (topic, mut future) = match slot {
                Slot::Done(outcome) => {
                    outcomes.push(outcome);
                    continue;
                }
                Slot::Waiting(topic, future) => (topic, future),
            };
            let report = match tokio::time::timeout_at(deadline, &mut future).await {
                Ok(report) => Some(report),
                Err(_) => {
                    if !purged {
                        purged = true;
                        warn!(
                            delivery_timeout = ?self.config.delivery_timeout,
                            "Kafka delivery reports are late; purging the producer's queue"
                        );
                        let p = producer.clone();
                        let _ = tokio::task::spawn_blocking(move || {
                            p.purge(PurgeConfig::default().queue().inflight())
                        })
                        .await;
                    }
                    tokio::time::timeout(PURGE_GRACE, &mut future).await.ok()
                }
            };
            outcomes.push(match report {
                Some(Ok(Ok(_delivery))) => Outcome::Published,
                Some(Ok(Err((error, _message)))) => {
                    broken_state =
                        broken_state.or(error_code(&error).filter(|c| needs_new_producer(*c)));
                    if error_code(&error) == Some(RDKafkaErrorCode::MessageTimedOut) {
                        timed_out.push((outcomes.len(), topic.clone()));
                    }
                    Outcome::from_error(self.delivery_error(&error, &topic))
                }
                Some(Err(_canceled)) => Outcome::from_error(
                    classify(&KafkaError::Canceled)
                        .context(format!("delivering to topic `{topic}`")),
                ),
                None => Outcome::Retry(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "delivering to topic `{topic}`: no delivery report within {} \
                         ({CONFIG_SECTION}.delivery_timeout plus {}s)",
                        humantime::format_duration(self.config.delivery_timeout),
                        DELIVERY_GRACE.as_secs()
                    ),
                )),
            });
        }
        Reports {
            outcomes,
            broken_state,
            timed_out,
        }
    }
}

/// The outcomes of a call's delivery reports, and whether one of them says the producer's
/// idempotence state is broken.
struct Reports {
    outcomes: Vec<Outcome>,
    broken_state: Option<RDKafkaErrorCode>,
    /// Events whose delivery timed out: (index, topic).
    timed_out: Vec<(usize, String)>,
}

impl KafkaSink {
    /// A message that times out may be one for a topic that does not exist (a broker that
    /// does not create topics on first use may never say so). Ask the cluster about the
    /// topics of timed-out events (briefly; a broker that is down does not answer) and turn
    /// their timeouts into "does not exist" retries, which name the topic and what to do.
    async fn explain_missing_topics(
        &self,
        producer: &Arc<RelayProducer>,
        outcomes: &mut [Outcome],
        timed_out: &[(usize, String)],
    ) {
        let mut topics: Vec<String> = timed_out.iter().map(|(_, t)| t.clone()).collect();
        topics.sort();
        topics.dedup();
        topics.truncate(MAX_TOPICS_EXPLAINED);
        if topics.is_empty() {
            return;
        }
        let producer = producer.clone();
        let missing = tokio::task::spawn_blocking(move || {
            let mut missing = HashSet::new();
            for topic in topics {
                let Ok(metadata) = producer
                    .client()
                    .fetch_metadata(Some(&topic), METADATA_PROBE_TIMEOUT)
                else {
                    // The broker does not answer: the timeouts say it all.
                    break;
                };
                let absent = metadata
                    .topics()
                    .iter()
                    .find(|t| t.name() == topic)
                    .is_none_or(|t| t.error().is_some() || t.partitions().is_empty());
                if absent {
                    missing.insert(topic);
                }
            }
            missing
        })
        .await
        .unwrap_or_default();
        for (index, topic) in timed_out {
            if missing.contains(topic) {
                outcomes[*index] = Outcome::Retry(
                    Error::new(ErrorKind::Unroutable, missing_topic(topic)).temporary(),
                );
            }
        }
    }

    /// `check`'s error for the fixed topic `topic`, which the cluster's metadata lists with the
    /// error `code`, or without partitions (`None`). A topic that does not exist is a
    /// configuration error naming the key, as an SNS topic or an SQS queue that does not.
    fn topic_unusable(&self, topic: &str, code: Option<RDKafkaErrorCode>) -> Error {
        use RDKafkaErrorCode as C;
        let at = format!("on Kafka at {}", self.servers());
        match code {
            None | Some(C::UnknownTopicOrPartition | C::UnknownTopic) => Error::config(format!(
                "{CONFIG_SECTION}.topic: topic `{topic}` does not exist {at} and the broker did \
                 not create it: create it (or enable auto.create.topics.enable on the broker)"
            )),
            Some(code) => {
                classify_code(code).context(format!("{CONFIG_SECTION}.topic: topic `{topic}` {at}"))
            }
        }
    }
}

/// What an event for a topic the broker does not have (and did not create) says.
fn missing_topic(topic: &str) -> String {
    format!(
        "topic `{topic}` does not exist and the broker did not create it: create it (or enable \
         auto.create.topics.enable on the broker); the event is retried"
    )
}

/// The bytes of the header names and values of a message.
fn headers_size(headers: &OwnedHeaders) -> usize {
    use rdkafka::message::Headers;
    headers
        .iter()
        .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
        .sum()
}

fn create_producer(
    client_config: &ClientConfig,
    state: &Arc<ClientState>,
    config: &KafkaSinkConfig,
) -> Result<RelayProducer> {
    let context = KafkaContext {
        state: state.clone(),
        span: tracing::Span::current(),
    };
    client_config
        .create_with_context::<_, RelayProducer>(context)
        .map_err(|e| {
            let mut text = classify(&e).full_message();
            for (name, value) in &config.properties {
                if crate::config::is_secret_property(name) && !value.is_empty() {
                    text = text.replace(value.as_str(), "***");
                }
            }
            Error::config(producer_refused(config, &text))
        })
}

/// librdkafka's refusal of a combination of properties (`` `acks` must be set to `all` when
/// `enable.idempotence` is true ``), under the key of the first property it names that the
/// configuration sets (so that the error says where it was set), with the relay's defaults it
/// names that the configuration does not set.
fn producer_refused(config: &KafkaSinkConfig, text: &str) -> String {
    let named = |name: &str| text.contains(&format!("`{name}`"));
    let key = match config.properties.keys().find(|name| named(name)) {
        Some(name) => format!("{CONFIG_SECTION}.\"{name}\""),
        None => CONFIG_SECTION.to_owned(),
    };
    let defaults: Vec<String> = crate::config::SAFE_DEFAULTS
        .iter()
        .filter(|(name, _)| named(name) && !config.properties.contains_key(*name))
        .map(|(name, value)| format!("\"{name}\" = \"{value}\""))
        .collect();
    if defaults.is_empty() {
        format!("{key}: {text}")
    } else {
        format!(
            "{key}: {text} (the relay sets {} unless {CONFIG_SECTION} sets it)",
            defaults.join(" and ")
        )
    }
}

#[async_trait]
impl Sink for KafkaSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            // librdkafka checks message.max.bytes itself (payload, key and headers together)
            // and the sink turns its refusal into a Reject with the numbers in it.
            max_payload_bytes: None,
            // librdkafka keeps produce order per partition, but a message that times out in
            // its queue leaves a gap while later messages of the partition still go out
            // (librdkafka INTRODUCTION.md, "Message timeout considerations"): a failed event
            // does not guarantee that no later event of its key was delivered. So the engine
            // sends one event per aggregate per call.
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    async fn check(&self) -> Result<()> {
        let producer = self.producer();
        if let Some((code, reason)) = producer.client().fatal_error() {
            self.renew_producer(&producer, &reason);
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the Kafka producer hit a fatal error and was recreated: {} {reason}",
                    describe(code)
                ),
            ));
        }
        let started = Instant::now();
        let timeout = self.config.check_timeout;
        // A fixed topic (a template without placeholders) is looked up: a broker that does not
        // create topics on first use would otherwise take every event and time each one out.
        let topic = self.template.fixed().map(str::to_owned);
        let fetch = {
            let (producer, topic) = (producer.clone(), topic.clone());
            tokio::task::spawn_blocking(move || {
                let metadata = producer
                    .client()
                    .fetch_metadata(topic.as_deref(), timeout)?;
                // Why the topic cannot be used: `Some(error code)`, or `Some(None)` when it is
                // not listed or has no partitions.
                let absent = topic.as_deref().and_then(|name| {
                    match metadata.topics().iter().find(|t| t.name() == name) {
                        Some(t) => match t.error() {
                            Some(code) => Some(Some(code.into())),
                            None => t.partitions().is_empty().then_some(None),
                        },
                        None => Some(None),
                    }
                });
                Ok::<_, KafkaError>((metadata.brokers().len(), absent))
            })
        };
        let fetched = fetch
            .await
            .map_err(|e| Error::new(ErrorKind::Other, format!("fetching Kafka metadata: {e}")))?;
        let reach = |kind: ErrorKind, reason: String| {
            Error::new(
                kind,
                format!(
                    "cannot reach Kafka at {} ({CONFIG_SECTION}.\"{BOOTSTRAP_SERVERS}\"): {reason}",
                    self.servers()
                ),
            )
        };
        match fetched {
            Ok((0, _)) => Err(reach(
                ErrorKind::Unavailable,
                "the cluster's metadata lists no broker".to_owned(),
            )),
            Ok((_, None)) => Ok(()),
            Ok((_, Some(code))) => Err(self.topic_unusable(topic.as_deref().unwrap_or(""), code)),
            Err(e) => {
                let classified = classify(&e);
                let kind = self.timeout_kind(started, classified.kind());
                let reason = format!(
                    "no metadata within {} ({CONFIG_SECTION}.check_timeout): {}{}",
                    humantime::format_duration(timeout),
                    classified.message(),
                    self.last_client_error(started)
                );
                Err(reach(kind, reason))
            }
        }
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let started = Instant::now();
        let producer = self.producer();

        // Hand every event to librdkafka without waiting: it batches them per partition.
        let mut slots = Vec::with_capacity(batch.len());
        let mut broken_state = None;
        let mut failed_keys: HashSet<&str> = HashSet::new();
        for event in batch {
            let topic = self.destination(event);
            if failed_keys.contains(event.aggregate_id.as_str()) {
                // Never let a later event of an aggregate go out when an earlier one of this
                // call could not even be queued.
                slots.push(Slot::Done(Outcome::Retry(Error::new(
                    ErrorKind::Other,
                    format!(
                        "not sent to topic `{topic}`: an earlier event of aggregate `{}` in \
                         the same batch failed",
                        event.aggregate_id
                    ),
                ))));
                continue;
            }
            if let Err(why) = check_topic_name(&topic) {
                // No broker will ever take it: dead at once, not after every retry.
                failed_keys.insert(event.aggregate_id.as_str());
                let error = Error::new(ErrorKind::Unroutable, format!("topic `{topic}` {why}"));
                slots.push(Slot::Done(Outcome::from_error(error.permanent())));
                continue;
            }
            let tombstone = self.config.tombstone_on_empty_payload && event.payload_is_empty();
            let headers = Self::headers(event, self.cloudevents.as_ref(), tombstone);
            let headers_size = headers_size(&headers);
            let record: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(&topic)
                .key(event.aggregate_id.as_bytes())
                .headers(headers);
            // A tombstone has no value at all (not an empty one): what compaction deletes by.
            let record = if tombstone {
                record
            } else {
                record.payload(event.payload_bytes())
            };
            let record = match self.config.timestamp {
                RecordTimestamp::Produce => record,
                RecordTimestamp::CreatedAt => record.timestamp(event.created_at.timestamp_millis()),
            };
            match producer.send_result(record) {
                Ok(future) => slots.push(Slot::Waiting(topic, future)),
                Err((error, _record)) => {
                    failed_keys.insert(event.aggregate_id.as_str());
                    broken_state =
                        broken_state.or(error_code(&error).filter(|c| needs_new_producer(*c)));
                    let error = self.enqueue_error(&error, event, headers_size, &topic);
                    debug!(id = event.id, error = %error, "Kafka producer refused to queue an event");
                    slots.push(Slot::Done(Outcome::from_error(error)));
                }
            }
        }

        let reports = self.await_reports(&producer, slots, started).await;
        let mut outcomes = reports.outcomes;
        self.explain_missing_topics(&producer, &mut outcomes, &reports.timed_out)
            .await;

        // A broken producer (fatal error, idempotence state) is replaced before the next
        // call; the events of this call are retried.
        if let Some((code, reason)) = producer.client().fatal_error() {
            self.renew_producer(&producer, &reason);
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "publishing to Kafka at {}: the producer hit a fatal error and was \
                     recreated: {} {reason}",
                    self.servers(),
                    describe(code)
                ),
            ));
        }
        if let Some(code) = broken_state.or(reports.broken_state) {
            self.renew_producer(&producer, &describe(code));
        }

        // Whether the call failed as a whole is the engine's decision, from the outcomes'
        // kinds; the sink only keeps its producer healthy and says what it saw.
        if let Some(refused) = outcomes.iter().find_map(|o| match o {
            Outcome::Retry(e) | Outcome::Reject(e) if e.kind() == ErrorKind::Unauthorized => {
                Some(e.message().to_owned())
            }
            _ => None,
        }) {
            // librdkafka remembers a refused topic until its next metadata refresh (minutes);
            // a fresh producer sees fixed permissions on the next call.
            self.renew_producer(&producer, &refused);
        }
        self.explain_broker_side_failures(&mut outcomes, started);
        Ok(outcomes)
    }
}

impl KafkaSink {
    /// Events that failed because of the broker (unreachable, too slow, overloaded) say what
    /// librdkafka's client errors said during the call ("Connect to ... failed: Connection
    /// refused", "SASL authentication error..."); when those errors are refused credentials,
    /// the events failed for that reason: `Unauthorized`.
    fn explain_broker_side_failures(&self, outcomes: &mut [Outcome], started: Instant) {
        let broker_side = |e: &Error| {
            matches!(
                e.kind(),
                ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Unavailable
            )
        };
        let any = outcomes
            .iter()
            .any(|o| matches!(o, Outcome::Retry(e) | Outcome::Reject(e) if broker_side(e)));
        if !any {
            return;
        }
        let client_errors = self.last_client_error(started);
        let refused = self.credentials_refused(started);
        if client_errors.is_empty() && !refused {
            return;
        }
        for outcome in outcomes.iter_mut() {
            let (Outcome::Retry(e) | Outcome::Reject(e)) = outcome else {
                continue;
            };
            if !broker_side(e) {
                continue;
            }
            let text = format!("{}{client_errors}", e.full_message());
            *e = if refused {
                Error::new(ErrorKind::Unauthorized, text).permanent()
            } else if e.is_retryable() {
                Error::new(e.kind(), text).temporary()
            } else {
                Error::new(e.kind(), text).permanent()
            };
            if refused {
                *outcome = Outcome::from_error(e.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A combination librdkafka refuses when it creates the producer is reported under the key
    /// the configuration set (`OUTBOX_SINK__KAFKA__ACKS=1` is then named as where it came
    /// from), with the relay's default it conflicts with.
    #[tokio::test]
    async fn a_refused_combination_names_the_property_set_and_the_default() {
        let config = KafkaSinkConfig::new("127.0.0.1:9").property("acks", "1");
        config
            .validate()
            .expect("each property is valid on its own");
        let e = KafkaSink::new(config).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(
            e.message(),
            "sink.kafka.\"acks\": cannot create the Kafka producer: `acks` must be set to `all` \
             when `enable.idempotence` is true (the relay sets \"enable.idempotence\" = \"true\" \
             unless sink.kafka sets it)"
        );
    }

    /// A server that is not Kafka answers librdkafka's first request with its own protocol;
    /// librdkafka reads the first four bytes as a response size and says to raise
    /// `receive.message.max.bytes`. The message says which server answered what instead.
    #[test]
    fn a_server_that_is_not_kafka_is_named_not_the_size_property() {
        let rabbitmq = "127.0.0.1:5672/bootstrap: Receive failed: Invalid response size \
                        1095586128 (0..100000000): increase receive.message.max.bytes (after 1ms \
                        in state APIVERSION_QUERY)";
        assert_eq!(
            not_kafka(rabbitmq).as_deref(),
            Some(
                "127.0.0.1:5672 answered \"AMQP\", which is not Kafka's protocol: check the host \
                 and port in sink.kafka.\"bootstrap.servers\""
            )
        );
        let http = "broker:8080/1: Receive failed: Invalid response size 1213486160 (0..100000000)";
        assert!(not_kafka(http)
            .unwrap()
            .starts_with("broker:8080 answered \"HTTP\""));
        let sasl = "sasl_plaintext://broker:9092/bootstrap: Receive failed: Invalid response \
                    size 1213486160 (0..100000000)";
        assert!(not_kafka(sasl)
            .unwrap()
            .starts_with("sasl_plaintext://broker:9092 answered \"HTTP\""));
        // A size that is a size (a real response above the limit), and other errors: as they are.
        let large = "broker:9092/1: Receive failed: Invalid response size 104857600 \
                     (0..100000000): increase receive.message.max.bytes";
        assert_eq!(not_kafka(large), None);
        assert_eq!(not_kafka("1/1 brokers are down"), None);
    }

    /// The same through a sink: a web server where the brokers should be.
    #[tokio::test]
    async fn a_sink_pointed_at_a_web_server_says_so() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut socket, _)) = listener.accept().await {
                let mut request = [0u8; 64];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        let mut config = KafkaSinkConfig::new(address.clone());
        config.check_timeout = Duration::from_secs(3);
        let e = KafkaSink::connect(config).await.unwrap_err();
        assert!(
            e.message().contains(&format!(
                "{address} answered \"HTTP\", which is not Kafka's protocol: check the host and \
                 port in sink.kafka.\"bootstrap.servers\""
            )),
            "{e}"
        );
        assert!(
            !e.message().contains("increase receive.message.max.bytes"),
            "{e}"
        );
    }

    #[test]
    fn client_errors_are_remembered_distinct_and_few() {
        let state = ClientState::default();
        state.remember(
            Some(RDKafkaErrorCode::BrokerTransportFailure),
            "connect refused",
        );
        state.remember(
            Some(RDKafkaErrorCode::AllBrokersDown),
            "1/1 brokers are down",
        );
        state.remember(
            Some(RDKafkaErrorCode::BrokerTransportFailure),
            "connect refused",
        );
        let recent = state.recent(Duration::from_secs(60));
        let reasons: Vec<&str> = recent.iter().map(|(_, r)| r.as_str()).collect();
        assert_eq!(reasons, ["1/1 brokers are down", "connect refused"]);
        for i in 0..5 {
            state.remember(None, &format!("error {i}"));
        }
        assert_eq!(state.recent(Duration::from_secs(60)).len(), RECENT_ERRORS);
        assert!(state.recent(Duration::ZERO).is_empty());
    }

    #[test]
    fn headers_are_the_events_then_the_relays() {
        use rdkafka::message::Headers;
        let mut event =
            outboxkit_core::testkit::sink_suite::sample_event(1, "order", "42", "Placed");
        event.headers.insert("tenant".into(), "acme".into());
        let headers = KafkaSink::headers(&event, None, false);
        let names: Vec<&str> = headers.iter().map(|h| h.key).collect();
        let mut expected = vec!["tenant", "traceparent"];
        expected.extend(RELAY_HEADERS);
        assert_eq!(names, expected);
    }

    #[test]
    fn cloudevents_headers_are_the_attributes_then_the_other_headers_then_the_relays() {
        use outboxkit_core::cloudevents::Format;
        use rdkafka::message::Headers;
        let mut event =
            outboxkit_core::testkit::sink_suite::sample_event(1, "order", "42", "Placed");
        event.headers.insert("Tenant".into(), "acme".into());
        event
            .headers
            .insert("content-type".into(), "application/avro".into());
        let ce = CloudEvents::for_format(Format::CloudEvents, "/shop", "k")
            .unwrap()
            .unwrap();
        let headers = KafkaSink::headers(&event, Some(&ce), false);
        let mut names: Vec<&str> = headers.iter().map(|h| h.key).collect();
        let attributes = ce.binary_headers(&event, "ce_");
        assert_eq!(attributes.len(), 7, "up to ce_traceparent");
        let mut expected: Vec<&str> = attributes.iter().map(|(n, _)| n.as_str()).collect();
        expected.extend(["content-type", "Tenant"]);
        expected.extend(RELAY_HEADERS);
        assert_eq!(names, expected);
        assert_eq!(headers.get(7).value, Some(&b"application/avro"[..]));
        let expected: usize = names.iter().map(|n| n.len()).sum::<usize>()
            + headers
                .iter()
                .map(|h| h.value.unwrap().len())
                .sum::<usize>();
        assert_eq!(headers_size(&headers), expected);
        // A tombstone has no data: the same headers but `content-type`.
        let tombstone = KafkaSink::headers(&event, Some(&ce), true);
        let tombstone: Vec<&str> = tombstone.iter().map(|h| h.key).collect();
        names.retain(|n| *n != "content-type");
        assert_eq!(tombstone, names);
    }
}
