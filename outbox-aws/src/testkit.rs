//! What the SQS and SNS sinks' tests share (feature `testkit`, for their dev-dependencies):
//! the SDK configuration of the test server, the service errors their error tables classify,
//! publishing a call that must not fail as a whole, the checks of a sink's `from_sdk_config`
//! and batch entries, and the events and checks of the cases both sinks' integration tests run
//! (FIFO, attributes past the limit, CloudEvents, large calls). The messages read back are
//! given as their fields, so that this crate needs no test harness.
//!
//! The cases both integration tests run the same way are written once, as functions taking a
//! [`Fixture`] (make a destination, build the sink for it, read back what arrived, delete it):
//! the SQS tests' fixture makes queues, the SNS tests' makes topics read back through queues
//! subscribed to them. Each test stays a function of its crate calling its case.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::error::ErrorMetadata;
use outboxkit_core::cloudevents::STRUCTURED_CONTENT_TYPE;
use outboxkit_core::testkit::cloudevents::check_structured;
use outboxkit_core::testkit::cloudevents::sample_events;
use outboxkit_core::testkit::sink_suite::{
    assert_all_published, sample_batch, sample_event, unique_prefix,
};
use outboxkit_core::{Error, ErrorKind, OutboxEvent, Outcome, Result, Sink};

use crate::message::PreparedMessage;

/// How long a test waits for the messages it reads back.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// An SDK configuration in `us-east-1` with the dummy credentials `test`/`test` LocalStack
/// accepts.
pub fn sdk_config() -> SdkConfig {
    let credentials = Credentials::new("test", "test", None, None, "outboxkit-tests");
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .build()
}

/// The SDK error of an answer with HTTP `status` and the service error `code` and `message`,
/// as the operation's error type makes it of the error's metadata (`generic`, e.g.
/// `PublishBatchError::generic`): what the tests of a sink's error table classify.
pub fn service_error<E>(
    generic: impl FnOnce(ErrorMetadata) -> E,
    code: &str,
    message: &str,
    status: u16,
) -> SdkError<E, HttpResponse> {
    let meta = ErrorMetadata::builder().code(code).message(message).build();
    let answer = HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty());
    SdkError::service_error(generic(meta), answer)
}

/// Each of `destinations` is refused by `parse` (a sink's parser of destinations) with a
/// permanent [`ErrorKind::Unroutable`] error whose message starts with `what` (e.g.
/// ``SQS queue ` ``): the events routed to a malformed destination are parked at once.
#[track_caller]
pub fn assert_malformed_destinations<T: Debug>(
    parse: impl Fn(&str) -> Result<T>,
    destinations: &[&str],
    what: &str,
) {
    for destination in destinations {
        let e = parse(destination).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unroutable, "{destination}: {e}");
        assert!(!e.is_retryable(), "{destination}");
        assert!(e.message().starts_with(what), "{e}");
    }
}

/// `sink.publish(batch)`, which must not fail as a whole: one outcome per event.
pub async fn publish(sink: &dyn Sink, batch: &[OutboxEvent]) -> Vec<Outcome> {
    let outcomes = sink
        .publish(batch)
        .await
        .unwrap_or_else(|e| panic!("publish failed as a whole: {e}"));
    assert_eq!(outcomes.len(), batch.len());
    outcomes
}

/// The checks of a sink's `from_sdk_config`, which `build` calls with the `region` and
/// `endpoint` keys (every other key at its default): with no region anywhere it is a
/// configuration error naming `{section}.region`; `Debug` shows the region and the endpoint,
/// never the endpoint's user-info.
pub fn assert_region_required_and_user_info_hidden<S: Debug>(
    section: &str,
    build: impl Fn(Option<String>, Option<String>, &SdkConfig) -> Result<S>,
) {
    let sdk = SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .build();
    let e = build(None, None, &sdk).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(
        e.message().starts_with(&format!("{section}.region: ")),
        "{e}"
    );
    let sink = build(
        Some("eu-west-1".into()),
        Some("http://user:pw@127.0.0.1:4566".into()),
        &sdk,
    )
    .unwrap();
    let debug = format!("{sink:?}");
    assert!(
        debug.contains("eu-west-1 at http://127.0.0.1:4566"),
        "{debug}"
    );
    assert!(!debug.contains("pw"), "{debug}");
}

/// A FIFO message with one attribute (`event_id` = `x`), group `42` and deduplication id `x`,
/// for the tests of a sink's batch entries.
pub fn fifo_message() -> PreparedMessage {
    PreparedMessage {
        body: "{}".into(),
        attributes: vec![("event_id".into(), "x".into())],
        group_id: Some("42".into()),
        deduplication_id: Some("x".into()),
        size: 2,
    }
}

/// An event with more headers than the message attributes left for them (see
/// [`crate::message`]): eight plain ones, one with a name no attribute may have (`bad:name`) and
/// one with an empty value, besides its `traceparent`.
pub fn event_past_the_attribute_limit() -> OutboxEvent {
    let mut event = sample_event(1, "order", "42", "OrderPlaced");
    for i in 0..8 {
        event
            .headers
            .insert(format!("x-h{i}"), format!("value {i}"));
    }
    event.headers.insert("bad:name".into(), "kept".into());
    event.headers.insert("empty".into(), String::new());
    event
}

/// The checks of the message of [`event_past_the_attribute_limit`] read back, given as its
/// attributes (the `headers` JSON attribute merged in) and how many it had on the wire: the
/// limit of 10 fully used, every header there.
pub fn assert_headers_arrived(
    event: &OutboxEvent,
    attributes: &BTreeMap<String, String>,
    attribute_count: usize,
) {
    assert_eq!(attribute_count, 10, "the limit, fully used");
    for (name, value) in &event.headers {
        assert_eq!(attributes.get(name), Some(value), "header {name}");
    }
    assert_eq!(attributes["event_type"], event.event_type);
}

/// The checks of messages read back in structured content mode (`format = "cloudevents"`),
/// each given as its body, its attributes and how many it had on the wire: for each of
/// `events`, the message whose `event_id` attribute is the event's has the event's fields and
/// `content_type` as attributes, no others (no header attributes, no `body_encoding`), and the
/// event as a JSON event format document as body.
pub fn assert_structured_messages<'a>(
    events: &[OutboxEvent],
    received: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, String>, usize)>,
) {
    let received: Vec<_> = received.into_iter().collect();
    for event in events {
        let id = event.event_id.to_string();
        let (body, attributes, attribute_count) = received
            .iter()
            .find(|(_, attributes, _)| attributes["event_id"] == id)
            .unwrap_or_else(|| panic!("no message of event {id}"));
        let names: Vec<&str> = attributes.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "aggregate_id",
                "aggregate_type",
                "content_type",
                "event_id",
                "event_type"
            ]
        );
        assert_eq!(*attribute_count, 5);
        assert_eq!(attributes["content_type"], STRUCTURED_CONTENT_TYPE);
        assert_eq!(attributes["aggregate_id"], event.aggregate_id);
        assert_eq!(attributes["event_type"], event.event_type);
        check_structured(event, body.as_bytes());
    }
}

/// 60 events of 60 KiB, one aggregate each: 3.6 MiB, far beyond one request (10 entries,
/// 256 KiB).
pub fn large_batch() -> Vec<OutboxEvent> {
    let mut batch = sample_batch(1, 60, "order", 60);
    for event in &mut batch {
        event.payload = format!("{{\"blob\": \"{}\"}}", "y".repeat(60 * 1024)).into_bytes();
    }
    batch
}

/// Publish the events of the FIFO case with `sink`: 40 events of 4 aggregates in one call (the
/// sink sends them in waves), then 20 more the engine's way, one event per aggregate per call.
/// The events, in order.
pub async fn publish_fifo_case(sink: &dyn Sink) -> Vec<OutboxEvent> {
    let batch = sample_batch(1, 40, "order", 4);
    assert_all_published(&publish(sink, &batch).await);
    let more = sample_batch(41, 20, "order", 4);
    for wave in more.chunks(4) {
        assert_all_published(&publish(sink, wave).await);
    }
    batch.into_iter().chain(more).collect()
}

/// The checks of the messages of [`publish_fifo_case`] read back from a FIFO queue or topic,
/// each given as its body, its attributes, its group id and its deduplication id: one message
/// per event, each with the event's aggregate as group id, its event id as deduplication id,
/// its payload as body, its aggregate type and `traceparent` header as attributes; per
/// aggregate, its 15 events in order.
pub fn assert_fifo_messages<'a>(
    events: &[OutboxEvent],
    received: impl IntoIterator<
        Item = (
            &'a str,
            &'a BTreeMap<String, String>,
            Option<&'a str>,
            Option<&'a str>,
        ),
    >,
) {
    let received: Vec<_> = received.into_iter().collect();
    assert_eq!(received.len(), events.len());
    let by_id: HashMap<String, &OutboxEvent> =
        events.iter().map(|e| (e.event_id.to_string(), e)).collect();
    let mut order: HashMap<&str, Vec<i64>> = HashMap::new();
    for (body, attributes, group_id, deduplication_id) in received {
        let event = by_id[&attributes["event_id"]];
        assert_eq!(group_id, Some(event.aggregate_id.as_str()));
        assert_eq!(deduplication_id, Some(event.event_id.to_string().as_str()));
        assert_eq!(body.as_bytes(), event.payload_bytes());
        assert_eq!(attributes["aggregate_type"], event.aggregate_type);
        assert_eq!(attributes["traceparent"], event.headers["traceparent"]);
        order.entry(&event.aggregate_id).or_default().push(event.id);
    }
    for (aggregate, ids) in order {
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(ids, sorted, "aggregate {aggregate} out of order");
        assert_eq!(ids.len(), 15);
    }
}

/// A message read back (from the SQS sink's queue, or from the queue subscribed with raw
/// message delivery to the SNS sink's topic) as the shared cases look at it: its body, its
/// attributes (the sink's overflow attribute merged in), how many attributes it had on the
/// wire, its group id and its deduplication id.
pub type Fields<'a> = (
    &'a str,
    &'a BTreeMap<String, String>,
    usize,
    Option<&'a str>,
    Option<&'a str>,
);

/// What the shared cases need of a sink's integration tests: destinations on the test server,
/// the sink under test, and what arrived.
#[async_trait]
pub trait Fixture: Sync {
    /// The sink under test.
    type Sink: Sink;
    /// What a made destination is known by, to read it back and delete it.
    type Destination: Send + Sync;
    /// A message read back.
    type Message: Send;

    /// Make destination `name` (FIFO when it ends in `.fifo`), or fail the test.
    async fn create(&self, name: &str) -> Self::Destination;

    /// Make destination `name` refusing messages past 256 KiB, or fail the test.
    async fn create_capped(&self, name: &str) -> Self::Destination;

    /// A sink on the test server routing with `route`.
    fn sink(&self, route: &str) -> Self::Sink;

    /// The same in structured content mode (`format = "cloudevents"`, `cloudevents_source` the
    /// [`SOURCE_TEMPLATE`](outboxkit_core::testkit::cloudevents::SOURCE_TEMPLATE)).
    fn cloudevents_sink(&self, route: &str) -> Self::Sink;

    /// What arrived at `destination`, waiting until `expected` messages did or
    /// [`READ_TIMEOUT`] passed.
    async fn receive(&self, destination: &Self::Destination, expected: usize)
        -> Vec<Self::Message>;

    /// The fields of `message`.
    fn fields(message: &Self::Message) -> Fields<'_>;

    /// Delete `destination` (errors ignored).
    async fn delete(&self, destination: Self::Destination);
}

/// The FIFO case: [`publish_fifo_case`] to a new FIFO destination, checked by
/// [`assert_fifo_messages`].
pub async fn fifo_messages_in_order<F: Fixture>(fixture: &F) {
    let name = format!("{}.fifo", unique_prefix());
    let destination = fixture.create(&name).await;
    let all = publish_fifo_case(&fixture.sink(&name)).await;
    let received = fixture.receive(&destination, all.len()).await;
    let fields = received.iter().map(F::fields);
    let fields = fields.map(|(body, attributes, _, group, deduplication)| {
        (body, attributes, group, deduplication)
    });
    assert_fifo_messages(&all, fields);
    fixture.delete(destination).await;
}

/// Six events to a destination refusing messages past 256 KiB, the third with a payload of
/// `payload_len` bytes: that one is rejected (`check_refusal` is given the destination's name
/// and the error), the five others arrive.
pub async fn oversized_event_rejected<F: Fixture>(
    fixture: &F,
    payload_len: usize,
    check_refusal: impl Fn(&str, &Error),
) {
    let name = unique_prefix();
    let destination = fixture.create_capped(&name).await;
    let mut batch = sample_batch(1, 6, "order", 6);
    batch[2].payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(payload_len)).into_bytes();
    let outcomes = publish(&fixture.sink(&name), &batch).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            match outcome {
                Outcome::Reject(e) => check_refusal(&name, e),
                other => panic!("the oversized event: {other:?}"),
            }
        } else {
            assert!(outcome.is_published(), "event {i}: {outcome:?}");
        }
    }
    assert_eq!(fixture.receive(&destination, 5).await.len(), 5);
    fixture.delete(destination).await;
}

/// Routing `<prefix>_{aggregate_type}` where only the `order` destination exists: the
/// `invoice` events are retried as unroutable, naming the destination and saying each of
/// `missing` (what the server answered, what to do), while the `order` events publish; once
/// the destination exists, the retry goes through (a failed lookup is not cached).
pub async fn missing_destination_retried<F: Fixture>(fixture: &F, missing: &[&str]) {
    let prefix = unique_prefix();
    let orders = format!("{prefix}_order");
    let invoices = format!("{prefix}_invoice");
    let orders_destination = fixture.create(&orders).await;
    let sink = fixture.sink(&format!("{prefix}_{{aggregate_type}}"));
    let mut batch = sample_batch(1, 4, "order", 4);
    batch.extend(sample_batch(5, 3, "invoice", 3));
    let outcomes = publish(&sink, &batch).await;
    assert_all_published(&outcomes[..4]);
    for outcome in &outcomes[4..] {
        match outcome {
            Outcome::Retry(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                let text = e.full_message();
                assert!(text.contains(&format!("`{invoices}`")), "{text}");
                for words in missing {
                    assert!(text.contains(words), "{text}");
                }
            }
            other => panic!("{other:?}"),
        }
    }
    let invoices_destination = fixture.create(&invoices).await;
    assert_all_published(&publish(&sink, &batch[4..]).await);
    assert_eq!(fixture.receive(&invoices_destination, 3).await.len(), 3);
    assert_eq!(fixture.receive(&orders_destination, 4).await.len(), 4);
    fixture.delete(orders_destination).await;
    fixture.delete(invoices_destination).await;
}

/// [`event_past_the_attribute_limit`] published and read back, checked by
/// [`assert_headers_arrived`].
pub async fn headers_past_the_limit_arrive<F: Fixture>(fixture: &F) {
    let name = unique_prefix();
    let destination = fixture.create(&name).await;
    let event = event_past_the_attribute_limit();
    assert_all_published(&publish(&fixture.sink(&name), std::slice::from_ref(&event)).await);
    let received = fixture.receive(&destination, 1).await;
    assert_eq!(received.len(), 1);
    let (_, attributes, attribute_count, _, _) = F::fields(&received[0]);
    assert_headers_arrived(&event, attributes, attribute_count);
    fixture.delete(destination).await;
}

/// The sample CloudEvents events published in structured content mode and read back, checked
/// by [`assert_structured_messages`].
pub async fn cloudevents_structured<F: Fixture>(fixture: &F) {
    let name = unique_prefix();
    let destination = fixture.create(&name).await;
    let events = sample_events(1, "order");
    assert_all_published(&publish(&fixture.cloudevents_sink(&name), &events).await);
    let received = fixture.receive(&destination, 3).await;
    fixture.delete(destination).await;
    assert_eq!(received.len(), 3);
    let fields = received.iter().map(F::fields);
    let fields = fields.map(|(body, attributes, count, _, _)| (body, attributes, count));
    assert_structured_messages(&events, fields);
}

/// [`large_batch`] published in one call: all 60 arrive.
pub async fn large_calls_split<F: Fixture>(fixture: &F) {
    let name = unique_prefix();
    let destination = fixture.create(&name).await;
    assert_all_published(&publish(&fixture.sink(&name), &large_batch()).await);
    assert_eq!(fixture.receive(&destination, 60).await.len(), 60);
    fixture.delete(destination).await;
}

/// Two events `malform` gives destinations the sink cannot use, published by a sink routing
/// with `{aggregate_type}`: both rejected as unroutable, before any request, the error starting
/// with `what` (e.g. ``SQS queue ` ``).
pub async fn malformed_destinations_rejected<F: Fixture>(
    fixture: &F,
    malform: impl FnOnce(&mut [OutboxEvent]),
    what: &str,
) {
    let sink = fixture.sink("{aggregate_type}");
    let mut batch = sample_batch(1, 2, "order", 2);
    malform(&mut batch);
    for outcome in &publish(&sink, &batch).await {
        match outcome {
            Outcome::Reject(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                assert!(e.message().starts_with(what), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}
