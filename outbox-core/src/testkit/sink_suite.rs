//! Sink conformance suite: the cases every [`Sink`] must pass, against the real broker.
//!
//! A sink crate implements [`SinkHarness`] for its broker (build a sink for a destination
//! template, build one that cannot reach the broker, read back what arrived) and expands
//! [`sink_suite!`](crate::sink_suite) in an integration test:
//!
//! ```text
//! // tests/sink_suite.rs of a sink crate (needs `tokio` with `macros` and `rt-multi-thread`)
//! struct MyHarness { /* broker client for reading back */ }
//!
//! #[async_trait::async_trait]
//! impl outboxkit_core::testkit::sink_suite::SinkHarness for MyHarness { /* ... */ }
//!
//! outboxkit_core::sink_suite!(MyHarness::new().await);
//! ```
//!
//! Every case uses destinations under a fresh random prefix, so cases run in parallel and
//! repeated runs never see each other's messages.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use crate::error::{Error, ErrorKind, Result};
use crate::model::{Headers, OutboxEvent, Outcome, Payload, PayloadType, CONTENT_TYPE_HEADER};
use crate::plugin::SinkConfig;
use crate::sink::{whole_call_failure, Sink};

/// How long a case waits for published messages to be readable.
pub const READ_BACK_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a sink that cannot reach its broker may take to say so.
pub const UNREACHABLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest batch the suite sends, even when a sink accepts more.
pub const MAX_SUITE_BATCH: usize = 1000;

/// The I/O error kinds of a refused, dropped or broken connection: a sink's error table makes
/// each of them (and any other I/O error but a timeout) a retryable
/// [`ErrorKind::Connection`]. For the unit tests of that table.
pub const CONNECTION_IO_ERRORS: [std::io::ErrorKind; 7] = [
    std::io::ErrorKind::ConnectionRefused,
    std::io::ErrorKind::ConnectionReset,
    std::io::ErrorKind::ConnectionAborted,
    std::io::ErrorKind::BrokenPipe,
    std::io::ErrorKind::UnexpectedEof,
    std::io::ErrorKind::NotConnected,
    std::io::ErrorKind::Other,
];

/// Assert that `error`, a sink's classification of a driver error, is of `kind` and retryable
/// or not; returns it for checks of its message. For the unit tests of a sink's error table.
#[track_caller]
pub fn assert_classified(error: Error, kind: ErrorKind, retryable: bool) -> Error {
    assert_eq!(error.kind(), kind, "{error}");
    assert_eq!(error.is_retryable(), retryable, "{error}");
    error
}

/// A sink's settings read from JSON the way serde reads its section, the error as text
/// (`unknown field ...`). For the unit tests of a configuration type.
pub fn from_json<C: DeserializeOwned>(value: serde_json::Value) -> std::result::Result<C, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// One invalid value for [`assert_refused`]: how its error goes on after `sink.<section>.`
/// (the key, `"max_batch_len: "`, maybe with the start of the reason), and the change that
/// makes the base configuration invalid.
pub type Refusal<C> = (&'static str, fn(&mut C));

/// The rule of every sink configuration: [`SinkConfig::validate`] refuses an invalid value
/// with an error that starts with its key, `sink.<section>.<key>` (the section as
/// [`sink_section`](crate::plugin::sink_section) makes it from the kind). Each of `cases`
/// changes a copy of `base`. Returns the errors in the order of `cases`, for further checks of
/// their text. For the unit tests of a configuration type.
#[track_caller]
pub fn assert_refused<C: SinkConfig + Clone>(base: &C, cases: &[Refusal<C>]) -> Vec<String> {
    let section = format!("sink.{}.", crate::plugin::sink_section(C::KIND));
    let mut errors = Vec::with_capacity(cases.len());
    for (expected, change) in cases {
        let mut config = base.clone();
        change(&mut config);
        let expected = format!("{section}{expected}");
        let e = match config.validate() {
            Ok(()) => panic!("{config:?} is accepted; expected an error starting with {expected}"),
            Err(e) => e.to_string(),
        };
        assert!(e.starts_with(&expected), "expected {expected}...: {e}");
        errors.push(e);
    }
    errors
}

/// One message as a consumer of the broker received it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedMessage {
    pub event_id: Uuid,
    pub aggregate_id: String,
    pub event_type: String,
    /// The message body, byte for byte.
    pub payload: Vec<u8>,
    /// The message's headers / attributes / fields other than the above, as the broker
    /// carries them; must include every header of the event (e.g. `traceparent`).
    pub headers: BTreeMap<String, String>,
}

/// What the suite needs from a broker besides the sink under test.
#[async_trait]
pub trait SinkHarness: Send + Sync {
    /// A sink connected to the broker, routing with `destination_template`
    /// (e.g. `suite1a2b3c_{aggregate_type}`).
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink>;

    /// A sink configured for a broker address where nothing answers; building it must not
    /// fail (connect lazily).
    async fn unreachable_sink(&self) -> Box<dyn Sink>;

    /// Everything delivered to `destination`, in broker order, waiting until `expected`
    /// messages arrived or `timeout` passed (then returning what arrived).
    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage>;

    /// Called before anything is published to `destination`, for brokers where a message
    /// sent to a destination nobody listens on is lost (create and bind the queue, create the
    /// topic...). Default: nothing.
    async fn prepare_destination(&self, _destination: &str) {}

    /// Whether what `read_back` returns keeps the order the broker accepted the messages in,
    /// so that the order cases can check it. Default: `true`; `false` for a consumer of a
    /// broker that promises no order (SQS standard queues, SNS standard topics).
    fn keeps_order(&self) -> bool {
        true
    }
}

/// The consumer half of a [`SinkHarness`]: [`SinkHarness::read_back`] and
/// [`SinkHarness::prepare_destination`] for one broker, whatever sink publishes to it. The
/// workspace's test harness (`outboxkit-harness`, feature `sink-suite`) has one per shipped
/// broker; [`ConfigHarness`] pairs one with the sink under test.
#[async_trait]
pub trait SuiteConsumer: Send + Sync {
    /// As [`SinkHarness::read_back`], for destination `to`.
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage>;

    /// As [`SinkHarness::prepare_destination`]. Default: nothing.
    async fn prepare_destination(&self, _to: &str) {}

    /// Called before [`ConfigHarness`] builds and checks a sink routing with `template`, for
    /// brokers where the sink's start-up check needs something in place first (a NATS stream
    /// capturing the template's subjects, as an operator makes it before starting the relay).
    /// Default: nothing.
    async fn prepare_template(&self, _template: &str) {}

    /// As [`SinkHarness::keeps_order`]. Default: `true`.
    fn keeps_order(&self) -> bool {
        true
    }
}

/// A sink's constructor that does no network I/O (`connect_lazy`, `new`...).
type SyncBuild<C> = fn(C) -> Result<<C as SinkConfig>::Sink>;

/// A [`SinkHarness`] made of a sink's configuration and a [`SuiteConsumer`]: `config` reaches
/// the test broker (each case's template replaces its destination), `unreachable` reaches
/// nothing, `build` makes a sink from either without network I/O (`connect_lazy`, `new`...).
/// [`SinkHarness::sink`] builds and then checks the sink (as the relay does), failing the test
/// when the broker does not answer.
pub struct ConfigHarness<C: SinkConfig, R> {
    config: C,
    unreachable: C,
    /// `None`: [`SinkConfig::validate`], then [`SinkConfig::build`].
    build: Option<SyncBuild<C>>,
    consumer: R,
}

impl<C: SinkConfig, R> ConfigHarness<C, R> {
    /// The harness of the sink `build` makes from `config` and `unreachable`, read back by
    /// `consumer`.
    pub fn new(config: C, unreachable: C, build: fn(C) -> Result<C::Sink>, consumer: R) -> Self {
        Self {
            config,
            unreachable,
            build: Some(build),
            consumer,
        }
    }

    /// The harness of the sink the configuration's own [`SinkConfig::build`] makes (after
    /// [`SinkConfig::validate`], as the relay does), for a sink whose `build` connects in the
    /// background rather than before it returns.
    pub fn built_by_config(config: C, unreachable: C, consumer: R) -> Self {
        Self {
            config,
            unreachable,
            build: None,
            consumer,
        }
    }

    /// A sink made from `config`; fails the test when it cannot be made.
    async fn build(&self, config: C) -> C::Sink {
        let built = match self.build {
            Some(build) => build(config),
            None => match config.validate() {
                Ok(()) => config.build().await,
                Err(e) => Err(e),
            },
        };
        built.unwrap_or_else(|e| panic!("{} sink: building it failed: {e}", C::KIND))
    }
}

impl<C: SinkConfig, R> std::fmt::Debug for ConfigHarness<C, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigHarness")
            .field("config", &self.config)
            .field("unreachable", &self.unreachable)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<C, R> SinkHarness for ConfigHarness<C, R>
where
    C: SinkConfig + Clone + Sync,
    R: SuiteConsumer,
{
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        let mut config = self.config.clone();
        *config.destination_mut() = destination_template.to_owned();
        self.consumer.prepare_template(destination_template).await;
        let sink = self.build(config).await;
        if let Err(e) = sink.check().await {
            panic!("{} sink: the test broker does not answer: {e}", C::KIND);
        }
        Box::new(sink)
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        Box::new(self.build(self.unreachable.clone()).await)
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        self.consumer
            .read_back(destination, expected, timeout)
            .await
    }

    async fn prepare_destination(&self, destination: &str) {
        self.consumer.prepare_destination(destination).await;
    }

    fn keeps_order(&self) -> bool {
        self.consumer.keeps_order()
    }
}

/// A fresh prefix for a case's destinations: `suite` and 12 hex digits, valid in stream,
/// topic, queue and exchange names.
pub fn unique_prefix() -> String {
    let mut prefix = String::from("suite");
    prefix.push_str(&Uuid::new_v4().simple().to_string()[..12]);
    prefix
}

/// A destination template under a fresh prefix: `suite<hex>_{aggregate_type}`.
pub fn unique_template() -> String {
    format!("{}_{{aggregate_type}}", unique_prefix())
}

/// A test event with a fresh `event_id`, a JSON payload (deliberately not in compact form and
/// with non-ASCII text, so a sink that re-serializes it is caught) and a `traceparent` header.
pub fn sample_event(
    id: i64,
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
) -> OutboxEvent {
    let event_id = Uuid::new_v4();
    let aggregate_id_json =
        serde_json::to_string(aggregate_id).unwrap_or_else(|_| "\"?\"".to_owned());
    let payload = format!(
        "{{\"seq\": {id},  \"aggregate_id\": {aggregate_id_json}, \
         \"note\": \"caf\u{e9} \u{2713}\", \"amount\": 12.50}}"
    );
    let span = Uuid::new_v4().simple().to_string();
    let mut headers = Headers::new();
    headers.insert(
        "traceparent".to_owned(),
        format!("00-{}-{}-01", event_id.simple(), &span[..16]),
    );
    OutboxEvent {
        event_id,
        headers,
        ..OutboxEvent::new(
            id,
            aggregate_type,
            aggregate_id,
            event_type,
            Payload::Json(payload),
        )
    }
}

/// A [`sample_event`] with what a sink must carry unchanged and a careless one would not: a JSON
/// payload with two spaces after a colon, escaped quotes, non-ASCII text and a trailing
/// newline; a `tenant` header whose value holds a space and quotes (`acme "eu"`); and a
/// `created_at` with nanoseconds, 2024-05-01T12:00:00.123456789Z (written by the relay to the
/// microsecond: `2024-05-01T12:00:00.123456Z`).
pub fn awkward_event(
    id: i64,
    aggregate_type: &str,
    aggregate_id: &str,
    event_type: &str,
) -> OutboxEvent {
    use chrono::TimeZone;
    let mut event = sample_event(id, aggregate_type, aggregate_id, event_type);
    event.payload = "{\"total\":  12.50, \"note\": \"caf\u{e9} \\\"quoted\\\" \u{2713}\"}\n".into();
    event
        .headers
        .insert("tenant".to_owned(), "acme \"eu\"".to_owned());
    event.created_at = chrono::Utc
        .with_ymd_and_hms(2024, 5, 1, 12, 0, 0)
        .unwrap()
        .checked_add_signed(chrono::Duration::nanoseconds(123_456_789))
        .unwrap();
    event
}

/// `count` events of one aggregate type spread round-robin over `aggregates` aggregates
/// (`agg-0`, `agg-1`...), ids `first_id..`.
pub fn sample_batch(
    first_id: i64,
    count: usize,
    aggregate_type: &str,
    aggregates: usize,
) -> Vec<OutboxEvent> {
    (0..count)
        .map(|i| {
            let aggregate_id = format!("agg-{}", i % aggregates.max(1));
            sample_event(
                first_id + i as i64,
                aggregate_type,
                &aggregate_id,
                "ItemAdded",
            )
        })
        .collect()
}

/// Publish `batch` and assert one outcome per event, all `Published`.
pub async fn publish_all(sink: &dyn Sink, batch: &[OutboxEvent]) {
    let outcomes = match sink.publish(batch).await {
        Ok(outcomes) => outcomes,
        Err(e) => panic!(
            "{} sink: publishing {} events failed as a whole: {e} ({:?})",
            sink.kind(),
            batch.len(),
            e.kind()
        ),
    };
    assert_eq!(
        outcomes.len(),
        batch.len(),
        "{} sink: one outcome per event",
        sink.kind()
    );
    let failed: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, o)| !o.is_published())
        .take(5)
        .map(|(i, o)| format!("event {i}: {o:?}"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} sink: not every event was published: {}",
        sink.kind(),
        failed.join("; ")
    );
}

/// The outcomes of a call, one after the other, for assertion messages.
pub fn describe_outcomes(outcomes: &[Outcome]) -> String {
    let texts: Vec<String> = outcomes.iter().map(|o| format!("{o:?}")).collect();
    texts.join("; ")
}

/// Assert that every outcome is `Published`, listing them all when one is not.
pub fn assert_all_published(outcomes: &[Outcome]) {
    assert!(
        outcomes.iter().all(Outcome::is_published),
        "{}",
        describe_outcomes(outcomes)
    );
}

/// Whether `outcome` is a failure of `kind`, retried (`Retry`, with `retried`) or rejected
/// (`Reject`).
fn failed_as(outcome: &Outcome, kind: ErrorKind, retried: bool) -> bool {
    match outcome {
        Outcome::Retry(e) => retried && e.kind() == kind,
        Outcome::Reject(e) => !retried && e.kind() == kind,
        Outcome::Published => false,
    }
}

/// Assert that every outcome is a failure of `kind`, retried (`Retry`, with `retried`) or
/// rejected (`Reject`), listing them all when one is not.
pub fn assert_all_failed(outcomes: &[Outcome], kind: ErrorKind, retried: bool) {
    assert!(
        outcomes.iter().all(|o| failed_as(o, kind, retried)),
        "expected every outcome {} with {kind:?}: {}",
        if retried { "retried" } else { "rejected" },
        describe_outcomes(outcomes)
    );
}

/// Assert that outcome `index` of `outcomes` is a failure of `kind`, retried (`Retry`, with
/// `retried`) or rejected (`Reject`), listing them all when it is not.
#[track_caller]
pub fn assert_failed(outcomes: &[Outcome], index: usize, kind: ErrorKind, retried: bool) {
    assert!(
        failed_as(&outcomes[index], kind, retried),
        "expected outcome {index} {} with {kind:?}: {}",
        if retried { "retried" } else { "rejected" },
        describe_outcomes(outcomes)
    );
}

/// The error a `publish` result fails the whole call with, as the engine decides it: the `Err`
/// itself, or [`whole_call_failure`] of the outcomes; `None` when the outcomes stand event by
/// event.
pub fn whole_call_error(result: &Result<Vec<Outcome>>) -> Option<Error> {
    match result {
        Err(e) => Some(e.clone()),
        Ok(outcomes) => whole_call_failure(outcomes),
    }
}

/// Read back `destination` and assert exactly `sent` arrived: each `event_id` once, same
/// aggregate id, event type, payload bytes, every header of the event. With `check_order`,
/// also that events of one aggregate arrived in `id` order.
pub async fn assert_received(
    harness: &dyn SinkHarness,
    destination: &str,
    sent: &[&OutboxEvent],
    check_order: bool,
) {
    let received = harness
        .read_back(destination, sent.len(), READ_BACK_TIMEOUT)
        .await;
    let by_id: HashMap<Uuid, &OutboxEvent> = sent.iter().map(|e| (e.event_id, *e)).collect();
    let mut seen: HashMap<Uuid, usize> = HashMap::new();
    for message in &received {
        *seen.entry(message.event_id).or_default() += 1;
        let Some(event) = by_id.get(&message.event_id) else {
            panic!("{destination}: unexpected message {message:?}");
        };
        assert_eq!(
            message.aggregate_id, event.aggregate_id,
            "{destination}: aggregate_id"
        );
        assert_eq!(
            message.event_type, event.event_type,
            "{destination}: event_type"
        );
        assert_eq!(
            message.payload,
            event.payload_bytes(),
            "{destination}: payload of {} is not byte for byte what was sent",
            event.event_id
        );
        for (name, value) in &event.headers {
            assert_eq!(
                message.headers.get(name),
                Some(value),
                "{destination}: header `{name}` of {}",
                event.event_id
            );
        }
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "{destination}: delivered more than once: {duplicates:?}"
    );
    let missing: Vec<_> = sent
        .iter()
        .filter(|e| !seen.contains_key(&e.event_id))
        .map(|e| e.id)
        .collect();
    assert!(
        missing.is_empty(),
        "{destination}: {} of {} events never arrived within {READ_BACK_TIMEOUT:?} (ids {missing:?})",
        missing.len(),
        sent.len()
    );
    if check_order {
        let mut last: HashMap<&str, i64> = HashMap::new();
        for message in &received {
            let event = by_id[&message.event_id];
            if let Some(previous) = last.insert(&event.aggregate_id, event.id) {
                assert!(
                    previous < event.id,
                    "{destination}: aggregate {} got event {} after event {}",
                    event.aggregate_id,
                    event.id,
                    previous
                );
            }
        }
    }
}

/// A batch of 50 events over 5 aggregates is published (50 `Published`, in order) and read
/// back: each event once, payload bytes identical, headers carried; events of one aggregate in
/// order when the sink claims `ordered_per_key` (otherwise see
/// [`per_aggregate_order_across_calls`]).
pub async fn publishes_a_batch_and_reads_it_back(harness: &dyn SinkHarness) {
    publish_and_read_back(harness, &sample_batch(1, 50, "order", 5)).await;
}

/// Publish `batch` (of one destination) in one call with a sink of a fresh template, then read
/// it back with [`assert_received`], in order when the sink claims `ordered_per_key`.
async fn publish_and_read_back(harness: &dyn SinkHarness, batch: &[OutboxEvent]) {
    let sink = harness.sink(&unique_template()).await;
    let destination = sink.destination(&batch[0]);
    harness.prepare_destination(&destination).await;
    publish_all(sink.as_ref(), batch).await;
    let sent: Vec<&OutboxEvent> = batch.iter().collect();
    let ordered = sink.capabilities().ordered_per_key;
    assert_received(harness, &destination, &sent, ordered).await;
}

/// The payloads that only `text` and `binary` tables hold arrive byte for byte: every byte value
/// 0–255 (not valid UTF-8) from a `binary` table, with and without a content type of its own,
/// and JSON no database rendered (key order, spaces, `1.0`, a trailing newline) from a `text`
/// table. An event's `content-type` header arrives like any header.
pub async fn payloads_arrive_byte_for_byte(harness: &dyn SinkHarness) {
    let mut batch = sample_batch(1, 3, "order", 1);
    batch[0].payload = (0..=255u8).collect();
    batch[0].payload_type = PayloadType::Binary;
    batch[1].payload = (0..=255u8).rev().collect();
    batch[1].payload_type = PayloadType::Binary;
    batch[1].headers.insert(
        CONTENT_TYPE_HEADER.to_owned(),
        "application/vnd.apache.avro+binary".to_owned(),
    );
    batch[2].payload = b"{\"z\": 1.0,   \"a\" : [ 1 ,2 ],\"caf\xc3\xa9\": null}\n".to_vec();
    batch[2].payload_type = PayloadType::Text;
    publish_and_read_back(harness, &batch).await;
}

/// Events sent the way the engine sends them to a sink without `ordered_per_key` — one event
/// per aggregate per call, call after call — arrive in order per aggregate.
pub async fn per_aggregate_order_across_calls(harness: &dyn SinkHarness) {
    let template = unique_template();
    let sink = harness.sink(&template).await;
    let batch = sample_batch(1, 20, "order", 5);
    let destination = sink.destination(&batch[0]);
    harness.prepare_destination(&destination).await;
    for wave in batch.chunks(5) {
        publish_all(sink.as_ref(), wave).await;
    }
    let sent: Vec<&OutboxEvent> = batch.iter().collect();
    assert_received(harness, &destination, &sent, harness.keeps_order()).await;
}

/// Events of several aggregate types go to the destinations the template gives them.
pub async fn routes_by_template(harness: &dyn SinkHarness) {
    let template = unique_template();
    let sink = harness.sink(&template).await;
    let mut batch = sample_batch(1, 6, "order", 2);
    batch.extend(sample_batch(7, 4, "invoice", 2));
    let orders = sink.destination(&batch[0]);
    let invoices = sink.destination(&batch[6]);
    assert_ne!(orders, invoices);
    harness.prepare_destination(&orders).await;
    harness.prepare_destination(&invoices).await;
    publish_all(sink.as_ref(), &batch).await;
    let sent_orders: Vec<&OutboxEvent> = batch[..6].iter().collect();
    let sent_invoices: Vec<&OutboxEvent> = batch[6..].iter().collect();
    assert_received(harness, &orders, &sent_orders, false).await;
    assert_received(harness, &invoices, &sent_invoices, false).await;
}

/// An empty batch is `Ok` with no outcomes.
pub async fn empty_batch_returns_no_outcomes(harness: &dyn SinkHarness) {
    let sink = harness.sink(&unique_template()).await;
    let outcomes = sink
        .publish(&[])
        .await
        .unwrap_or_else(|e| panic!("{} sink: empty batch failed: {e}", sink.kind()));
    assert!(
        outcomes.is_empty(),
        "{} sink: outcomes for an empty batch",
        sink.kind()
    );
}

/// A row's `destination` wins over the template: its events are read back from there and
/// nothing reaches the templated destination.
pub async fn row_destination_overrides_template(harness: &dyn SinkHarness) {
    let prefix = unique_prefix();
    let template = format!("{prefix}_{{aggregate_type}}");
    let sink = harness.sink(&template).await;
    let override_to = format!("{prefix}_override");
    let mut batch = sample_batch(1, 5, "order", 2);
    for event in &mut batch {
        event.destination = Some(override_to.clone());
    }
    assert_eq!(sink.destination(&batch[0]), override_to);
    let templated = format!("{prefix}_order");
    harness.prepare_destination(&override_to).await;
    harness.prepare_destination(&templated).await;
    publish_all(sink.as_ref(), &batch).await;
    let sent: Vec<&OutboxEvent> = batch.iter().collect();
    assert_received(harness, &override_to, &sent, false).await;
    let stray = harness
        .read_back(&templated, 0, Duration::from_millis(500))
        .await;
    assert!(
        stray.is_empty(),
        "{templated}: got {} messages meant for {override_to}",
        stray.len()
    );
}

/// A batch exactly `capabilities().max_batch_len` long (at most [`MAX_SUITE_BATCH`]) is
/// published whole.
pub async fn full_batch_is_published(harness: &dyn SinkHarness) {
    let sink = harness.sink(&unique_template()).await;
    let capabilities = sink.capabilities();
    assert!(
        capabilities.max_batch_len >= 1,
        "max_batch_len must be at least 1"
    );
    let len = capabilities.max_batch_len.min(MAX_SUITE_BATCH);
    let batch = sample_batch(1, len, "order", 10);
    let destination = sink.destination(&batch[0]);
    harness.prepare_destination(&destination).await;
    publish_all(sink.as_ref(), &batch).await;
    let sent: Vec<&OutboxEvent> = batch.iter().collect();
    assert_received(harness, &destination, &sent, false).await;
}

/// `destination()` renders the template (all three placeholders) and honours a row override.
pub async fn destination_renders_template(harness: &dyn SinkHarness) {
    let prefix = unique_prefix();
    let sink = harness
        .sink(&format!(
            "{prefix}_{{aggregate_type}}_{{event_type}}_{{aggregate_id}}"
        ))
        .await;
    let mut event = sample_event(1, "order", "42", "OrderConfirmed");
    assert_eq!(
        sink.destination(&event),
        format!("{prefix}_order_OrderConfirmed_42")
    );
    let sink = harness.sink(&format!("{prefix}_{{aggregate_type}}")).await;
    assert_eq!(sink.destination(&event), format!("{prefix}_order"));
    event.destination = Some(format!("{prefix}_audit"));
    assert_eq!(sink.destination(&event), format!("{prefix}_audit"));
}

/// `outcomes.len() == batch.len()` for every batch size.
pub async fn outcomes_match_batch_length(harness: &dyn SinkHarness) {
    let sink = harness.sink(&unique_template()).await;
    let max = sink.capabilities().max_batch_len;
    let mut next_id = 1;
    let mut sent = Vec::new();
    for len in [1, 2, 3, 7, 16] {
        let len = len.min(max);
        let batch = sample_batch(next_id, len, "order", 3);
        next_id += len as i64;
        if sent.is_empty() {
            harness
                .prepare_destination(&sink.destination(&batch[0]))
                .await;
        }
        publish_all(sink.as_ref(), &batch).await;
        sent.extend(batch);
    }
    let destination = sink.destination(&sent[0]);
    let sent: Vec<&OutboxEvent> = sent.iter().collect();
    assert_received(harness, &destination, &sent, false).await;
}

/// `check()` succeeds when the broker answers.
pub async fn check_succeeds_on_reachable_broker(harness: &dyn SinkHarness) {
    let sink = harness.sink(&unique_template()).await;
    if let Err(e) = sink.check().await {
        panic!(
            "{} sink: check failed against a live broker: {e}",
            sink.kind()
        );
    }
}

/// `check()` fails (within [`UNREACHABLE_TIMEOUT`]) when nothing answers.
pub async fn check_fails_on_unreachable_broker(harness: &dyn SinkHarness) {
    let sink = harness.unreachable_sink().await;
    match tokio::time::timeout(UNREACHABLE_TIMEOUT, sink.check()).await {
        Err(_) => panic!(
            "{} sink: check did not return within {UNREACHABLE_TIMEOUT:?}",
            sink.kind()
        ),
        Ok(Ok(())) => panic!("{} sink: check succeeded with no broker", sink.kind()),
        Ok(Err(_)) => {}
    }
}

/// Publishing with no broker fails the call as a whole — an `Err`, or outcomes for which
/// [`whole_call_failure`] says so — with a retryable error (connection, timeout, unavailable)
/// within [`UNREACHABLE_TIMEOUT`]; never outcomes the engine would take event by event (and
/// could park good events as dead for).
pub async fn unreachable_publish_is_a_retryable_error(harness: &dyn SinkHarness) {
    let sink = harness.unreachable_sink().await;
    let batch = sample_batch(1, 3, "order", 2);
    let result = match tokio::time::timeout(UNREACHABLE_TIMEOUT, sink.publish(&batch)).await {
        Err(_) => panic!(
            "{} sink: publish did not return within {UNREACHABLE_TIMEOUT:?}",
            sink.kind()
        ),
        Ok(result) => result,
    };
    let describe = describe_outcomes;
    if let Ok(outcomes) = &result {
        assert_eq!(
            outcomes.len(),
            batch.len(),
            "{} sink: one outcome per event",
            sink.kind()
        );
        assert!(
            !outcomes.iter().any(Outcome::is_published),
            "{} sink: events published with no broker: {}",
            sink.kind(),
            describe(outcomes)
        );
    }
    let Some(e) = whole_call_error(&result) else {
        let outcomes = result.as_deref().unwrap_or_default();
        panic!(
            "{} sink: publish with no broker returned outcomes the engine takes event by event \
             (they would be charged attempts, or parked as dead): {}",
            sink.kind(),
            describe(outcomes)
        );
    };
    assert!(e.is_retryable(), "{} sink: not retryable: {e}", sink.kind());
    assert!(
        matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Unavailable
        ),
        "{} sink: unexpected kind {:?}: {e}",
        sink.kind(),
        e.kind()
    );
    if let Ok(outcomes) = &result {
        for outcome in outcomes {
            if let Outcome::Retry(e) | Outcome::Reject(e) = outcome {
                assert!(e.is_retryable(), "{} sink: not retryable: {e}", sink.kind());
            }
        }
    }
}

/// Generates one `#[tokio::test]` per case of the sink conformance suite, in a module
/// `sink_conformance`. `$harness` is evaluated in each test (it may `.await`) and must give a
/// value implementing [`SinkHarness`](crate::testkit::sink_suite::SinkHarness). The calling
/// crate needs `tokio` with the `macros` and `rt-multi-thread` features.
#[macro_export]
macro_rules! sink_suite {
    ($harness:expr) => {
        $crate::sink_suite!(@cases $harness;
            publishes_a_batch_and_reads_it_back,
            payloads_arrive_byte_for_byte,
            per_aggregate_order_across_calls,
            routes_by_template,
            empty_batch_returns_no_outcomes,
            row_destination_overrides_template,
            full_batch_is_published,
            destination_renders_template,
            outcomes_match_batch_length,
            check_succeeds_on_reachable_broker,
            check_fails_on_unreachable_broker,
            unreachable_publish_is_a_retryable_error,
        );
    };
    (@cases $harness:expr; $($case:ident),+ $(,)?) => {
        mod sink_conformance {
            #[allow(unused_imports)]
            use super::*;
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let harness = $harness;
                    $crate::testkit::sink_suite::$case(&harness).await;
                }
            )+
        }
    };
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::memory::ScriptedSink;

    /// A configuration of the scripted sink that is valid or not.
    #[derive(Debug, Clone, serde::Deserialize)]
    struct ScriptedConfig {
        destination: String,
        valid: bool,
    }

    impl SinkConfig for ScriptedConfig {
        const KIND: &'static str = "scripted";
        type Sink = ScriptedSink;

        fn destination_mut(&mut self) -> &mut String {
            &mut self.destination
        }

        fn validate(&self) -> Result<()> {
            match self.valid {
                true => Ok(()),
                false => Err(Error::config("sink.scripted.valid: is false")),
            }
        }

        async fn build(self) -> Result<ScriptedSink> {
            Ok(ScriptedSink::new())
        }
    }

    fn config(valid: bool) -> ScriptedConfig {
        ScriptedConfig {
            destination: String::new(),
            valid,
        }
    }

    /// Remembers the templates it prepared.
    #[derive(Default)]
    struct Prepared(Mutex<Vec<String>>);

    #[async_trait]
    impl SuiteConsumer for Prepared {
        async fn read_back(&self, _: &str, _: usize, _: Duration) -> Vec<ReceivedMessage> {
            Vec::new()
        }

        async fn prepare_template(&self, template: &str) {
            self.0.lock().unwrap().push(template.to_owned());
        }
    }

    #[tokio::test]
    async fn the_template_is_prepared_before_the_sink_is_built_by_its_config() {
        let harness =
            ConfigHarness::built_by_config(config(true), config(true), Prepared::default());
        let sink = harness.sink("suite_{aggregate_type}").await;
        assert_eq!(sink.kind(), "scripted");
        assert_eq!(harness.unreachable_sink().await.kind(), "scripted");
        assert_eq!(
            *harness.consumer.0.lock().unwrap(),
            ["suite_{aggregate_type}"]
        );
    }

    #[tokio::test]
    #[should_panic(expected = "scripted sink: building it failed: sink.scripted.valid: is false")]
    async fn a_sink_built_by_its_config_is_validated_first() {
        let harness =
            ConfigHarness::built_by_config(config(true), config(false), Prepared::default());
        harness.unreachable_sink().await;
    }

    #[test]
    fn one_outcome_is_checked_for_its_kind_and_whether_it_is_retried() {
        let outcomes = [
            Outcome::Published,
            Outcome::Retry(Error::new(ErrorKind::Unavailable, "busy")),
            Outcome::Reject(Error::new(ErrorKind::Unroutable, "nowhere")),
        ];
        assert_failed(&outcomes, 1, ErrorKind::Unavailable, true);
        assert_failed(&outcomes, 2, ErrorKind::Unroutable, false);
        for (index, kind, retried) in [
            (0, ErrorKind::Unavailable, true),
            (1, ErrorKind::Unavailable, false),
            (1, ErrorKind::Connection, true),
            (2, ErrorKind::Unroutable, true),
        ] {
            let failed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                assert_failed(&outcomes, index, kind, retried);
            }));
            assert!(failed.is_err(), "outcome {index} as {kind:?}, {retried}");
        }
    }

    #[test]
    fn classified_errors_are_returned_for_more_checks() {
        let e = assert_classified(Error::config("bad"), ErrorKind::Config, false);
        assert_eq!(e.message(), "bad");
        let e = Error::new(ErrorKind::Unroutable, "no queue").temporary();
        assert_classified(e, ErrorKind::Unroutable, true);
    }

    #[test]
    #[should_panic(expected = "no queue")]
    fn a_misclassified_error_fails_the_test() {
        assert_classified(
            Error::new(ErrorKind::Unroutable, "no queue"),
            ErrorKind::Unroutable,
            true,
        );
    }

    #[test]
    fn refused_values_name_their_key_and_settings_read_from_json() {
        let errors = assert_refused(&config(true), &[("valid: ", |c| c.valid = false)]);
        assert_eq!(errors, ["sink.scripted.valid: is false"]);
        let read: ScriptedConfig =
            from_json(serde_json::json!({ "destination": "d", "valid": true })).unwrap();
        assert!(read.valid);
        let e = from_json::<ScriptedConfig>(serde_json::json!({ "valid": true })).unwrap_err();
        assert!(e.contains("missing field `destination`"), "{e}");
    }

    #[test]
    #[should_panic(expected = "expected sink.scripted.destination")]
    fn a_refusal_naming_another_key_fails_the_test() {
        assert_refused(&config(true), &[("destination", |c| c.valid = false)]);
    }

    #[test]
    #[should_panic(expected = "is accepted")]
    fn an_accepted_value_fails_the_test() {
        assert_refused(&config(true), &[("valid", |c| c.valid = true)]);
    }

    #[test]
    fn an_awkward_event_keeps_its_payload_header_and_nanoseconds() {
        let event = awkward_event(1, "order", "42", "OrderConfirmed");
        assert_eq!(
            event.payload_bytes(),
            "{\"total\":  12.50, \"note\": \"caf\u{e9} \\\"quoted\\\" \u{2713}\"}\n".as_bytes()
        );
        assert_eq!(event.headers["tenant"], "acme \"eu\"");
        assert!(event.headers.contains_key("traceparent"));
        assert_eq!(
            event
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Nanos, true),
            "2024-05-01T12:00:00.123456789Z"
        );
    }

    #[test]
    fn connection_io_errors_leave_out_timeouts() {
        assert!(!CONNECTION_IO_ERRORS.contains(&std::io::ErrorKind::TimedOut));
    }
}
