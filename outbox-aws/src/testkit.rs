//! What the SQS and SNS sinks' tests share (feature `testkit`, for their dev-dependencies):
//! the SDK configuration of the test server, publishing a call that must not fail as a whole,
//! the checks of a sink's `from_sdk_config` and batch entries, and the events and checks of the
//! cases both sinks' integration tests run (FIFO, attributes past the limit, CloudEvents,
//! large calls). The messages read back are given as their fields, so that this crate needs no
//! test harness.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::provider::SharedCredentialsProvider;
use aws_credential_types::Credentials;
use outboxkit_core::cloudevents::STRUCTURED_CONTENT_TYPE;
use outboxkit_core::testkit::cloudevents::check_structured;
use outboxkit_core::testkit::sink_suite::{assert_all_published, sample_batch, sample_event};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Result, Sink};

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
