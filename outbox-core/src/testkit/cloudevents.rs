//! Checks of a sink's CloudEvents output (`format = "cloudevents"`), read back by a test's
//! own consumer: every attribute, and the data byte for byte.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chrono::SecondsFormat;

use crate::model::{OutboxEvent, PayloadType, CONTENT_TYPE_HEADER};
use crate::testkit::sink_suite::sample_event;

/// The content type the `binary` event of [`sample_events`] names.
pub const BINARY_CONTENT_TYPE: &str = "application/vnd.apache.avro+binary";

/// The `cloudevents_source` the checks expect a sink to be configured with.
pub const SOURCE_TEMPLATE: &str = "/shop/{aggregate_type}/{aggregate_id}";

/// The `source` of `event` rendered from [`SOURCE_TEMPLATE`], worked out independently of
/// the mapping (for the ids of [`sample_events`]: spaces and slashes percent-encoded).
pub fn expected_source(event: &OutboxEvent) -> String {
    let encode = |value: &str| value.replace(' ', "%20").replace('/', "%2F");
    format!(
        "/shop/{}/{}",
        encode(&event.aggregate_type),
        encode(&event.aggregate_id)
    )
}

/// A `cloudevents_source` every sink must refuse at start: a space is not allowed in a URI.
pub const BAD_SOURCE: &str = "/orders here";

/// Check that building a sink configured with [`BAD_SOURCE`] failed naming `key` (e.g.
/// `sink.kafka.cloudevents_source`) and saying why.
pub fn assert_bad_source_refused<T>(built: crate::Result<T>, key: &str) {
    let Err(e) = built else {
        panic!("{key} = `{BAD_SOURCE}` was accepted");
    };
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{key} = `{BAD_SOURCE}`")),
        "{text}"
    );
    assert!(text.contains("must be percent-encoded"), "{text}");
}

/// Three events of aggregate type `aggregate_type`, ids from `first_id`: a JSON payload with a
/// `traceparent` header, a `binary` payload of the bytes 0 to 255 with a `content-type`
/// header ([`BINARY_CONTENT_TYPE`]), and a `text` payload.
pub fn sample_events(first_id: i64, aggregate_type: &str) -> Vec<OutboxEvent> {
    let json = sample_event(first_id, aggregate_type, "order 42/a", "OrderPlaced");
    let mut binary = sample_event(first_id + 1, aggregate_type, "43", "OrderPacked");
    binary.payload_type = PayloadType::Binary;
    binary.payload = (0..=255u8).collect();
    binary.headers.clear();
    binary.headers.insert(
        CONTENT_TYPE_HEADER.to_owned(),
        BINARY_CONTENT_TYPE.to_owned(),
    );
    let mut text = sample_event(first_id + 2, aggregate_type, "44", "OrderNoted");
    text.payload_type = PayloadType::Text;
    text.payload = "caf\u{e9} \u{2713} <note/>\n".as_bytes().to_vec();
    text.headers.clear();
    vec![json, binary, text]
}

/// Check the attributes a consumer read (`attributes`: name to value, without any prefix)
/// against `event` (the sink configured with [`SOURCE_TEMPLATE`]): `specversion`, `id`, `source`,
/// `type`, `subject`, `time`, `datacontenttype`, and the `traceparent` extension of an event
/// that has one.
pub fn check_attributes(event: &OutboxEvent, attributes: &BTreeMap<String, String>) {
    let source = expected_source(event);
    let get = |name: &str| {
        attributes
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("event {}: no `{name}` in {attributes:?}", event.id))
    };
    let id = event.event_id.to_string();
    let time = event
        .created_at
        .to_rfc3339_opts(SecondsFormat::Micros, true);
    for (name, expected) in [
        ("specversion", "1.0"),
        ("id", id.as_str()),
        ("source", source.as_str()),
        ("type", event.event_type.as_str()),
        ("subject", event.aggregate_id.as_str()),
        ("time", time.as_str()),
        ("datacontenttype", event.content_type()),
    ] {
        assert_eq!(
            get(name),
            expected,
            "event {}: attribute `{name}`",
            event.id
        );
    }
    match event.headers.get("traceparent") {
        Some(traceparent) => assert_eq!(get("traceparent"), traceparent, "event {}", event.id),
        None => assert!(
            !attributes.contains_key("traceparent"),
            "event {}",
            event.id
        ),
    }
}

/// Check a binary-mode message: its `headers` (or properties) named `prefix` + attribute name
/// (no `datacontenttype` among them: it is `content_type`, the protocol's own), see
/// [`check_attributes`]; and its body, the payload byte for byte.
pub fn check_binary<'h>(
    event: &OutboxEvent,
    headers: impl IntoIterator<Item = (&'h str, &'h str)>,
    prefix: &str,
    content_type: &str,
    body: &[u8],
) {
    let mut attributes: BTreeMap<String, String> = headers
        .into_iter()
        .filter_map(|(name, value)| Some((name.strip_prefix(prefix)?.to_owned(), value.to_owned())))
        .collect();
    assert!(
        !attributes.contains_key("datacontenttype"),
        "event {}: the content type is the protocol's own, not a header: {attributes:?}",
        event.id
    );
    attributes.insert("datacontenttype".to_owned(), content_type.to_owned());
    check_attributes(event, &attributes);
    assert_eq!(
        body, event.payload,
        "event {}: the data, byte for byte",
        event.id
    );
}

/// Check a structured-mode message (`document`, the JSON event format): its attributes, and
/// its data — `data` equal to the JSON document (an `application/json` event) or to the text,
/// `data_base64` decoding to the exact bytes (a `binary` event).
pub fn check_structured(event: &OutboxEvent, document: &[u8]) {
    let parsed: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(document)
        .unwrap_or_else(|e| panic!("event {}: not a JSON object ({e})", event.id));
    let attributes: BTreeMap<String, String> = parsed
        .iter()
        .filter_map(|(name, value)| Some((name.clone(), value.as_str()?.to_owned())))
        .collect();
    check_attributes(event, &attributes);
    match event.payload_type {
        PayloadType::Binary => {
            assert!(parsed.get("data").is_none(), "event {}", event.id);
            let encoded = parsed["data_base64"]
                .as_str()
                .expect("data_base64 is a string");
            let data = BASE64.decode(encoded).expect("data_base64 is base64");
            assert_eq!(data, event.payload, "event {}: data_base64", event.id);
        }
        PayloadType::Json => {
            let expected: serde_json::Value =
                serde_json::from_slice(&event.payload).expect("a JSON payload");
            assert_eq!(parsed["data"], expected, "event {}: data", event.id);
            // Embedded byte for byte, not re-serialized.
            let text = std::str::from_utf8(&event.payload).expect("UTF-8");
            let document = std::str::from_utf8(document).expect("UTF-8 document");
            assert!(
                document.contains(&format!("\"data\":{text}")),
                "event {}: {document}",
                event.id
            );
        }
        PayloadType::Text => {
            let text = std::str::from_utf8(&event.payload).expect("UTF-8");
            assert_eq!(
                parsed["data"].as_str(),
                Some(text),
                "event {}: data",
                event.id
            );
        }
    }
}
