//! How an outbox event becomes an SQS or SNS message: body, message attributes, group and
//! deduplication ids, and the size the service counts for it. SQS and SNS share the rules
//! below (an SNS message delivered raw to an SQS queue keeps its attributes, so SQS's limit of
//! 10 applies to it too).
//!
//! SQS and SNS allow 10 message attributes per message. The event's own fields take up to four
//! (`event_id`, `event_type`, `aggregate_type`, `aggregate_id`), leaving six for headers:
//!
//! - up to six headers, each a valid attribute (name of `A-Z a-z 0-9 _ - .`, not starting with
//!   `AWS.`/`Amazon.`, value non-empty and of XML characters), travel as one `String`
//!   attribute each;
//! - otherwise the first five such headers in name order travel as attributes and **every
//!   other header** travels in one more attribute, `headers`, a JSON object of strings. A
//!   consumer reads the attributes, then merges `headers` when present. Nothing is dropped.
//!
//! SQS and SNS bodies must be text. Payloads of `json` and `text` tables are the body as they are;
//! payloads of `binary` tables are the body base64-encoded (RFC 4648, with padding), and the
//! message has one more attribute, `body_encoding` = `base64`, leaving five for headers.
//!
//! With `format = "cloudevents"` (CloudEvents 1.0, JSON event format, structured content mode)
//! the body is the event as one JSON document — always text (a `binary` payload is its
//! `data_base64`), so there is no `body_encoding` — and the attributes are the event's fields
//! and `content_type` = `application/cloudevents+json`. Headers whose names are CloudEvents
//! attribute names (such as `traceparent`) travel inside the document as extensions; the
//! others (`tenant-id`, `Tenant`...) as attributes, as in raw format, so none is lost.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use outboxkit_core::cloudevents::{is_mapped_header, CloudEvents, STRUCTURED_CONTENT_TYPE};
use outboxkit_core::{OutboxEvent, PayloadType};
use sha2::{Digest, Sha256};

/// Most message attributes SQS (and SNS) accepts on one message.
pub const MAX_ATTRIBUTES: usize = 10;

/// The attribute carrying headers that could not be attributes of their own (JSON object).
pub const OVERFLOW_ATTRIBUTE: &str = "headers";

/// Attribute names the sink sets from the event's fields.
pub const EVENT_ATTRIBUTES: [&str; 4] =
    ["event_id", "event_type", "aggregate_type", "aggregate_id"];

/// The attribute saying the body is the payload base64-encoded (`binary` tables).
pub const BODY_ENCODING_ATTRIBUTE: &str = "body_encoding";

/// The attribute naming the body's content type with CloudEvents (`application/cloudevents+json`).
pub const CONTENT_TYPE_ATTRIBUTE: &str = "content_type";

/// The data type name of string attributes, counted in the message size.
pub const STRING_TYPE: &str = "String";

/// Longest `MessageGroupId` SQS and SNS accept.
const MAX_GROUP_ID: usize = 128;

/// One event as a message, ready to be put into a `SendMessageBatch` (SQS) or
/// `PublishBatch` (SNS) request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedMessage {
    pub body: String,
    /// `(name, value)` of every `String` attribute, at most [`MAX_ATTRIBUTES`].
    pub attributes: Vec<(String, String)>,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    /// Bytes SQS and SNS count against their size limit: body plus attribute names, types and
    /// values.
    pub size: usize,
}

/// Build the message of `event`, with a `MessageGroupId` (the aggregate's [`group_id`]) when
/// `with_group_id` and a `MessageDeduplicationId` (the `event_id`) when `with_deduplication_id`
/// (FIFO queues and topics: both), in raw format or, with `cloudevents`, as a structured
/// CloudEvent.
pub fn prepare(
    event: &OutboxEvent,
    with_group_id: bool,
    with_deduplication_id: bool,
    cloudevents: Option<&CloudEvents>,
) -> PreparedMessage {
    let event_id = event.event_id.to_string();
    let mut attributes: Vec<(String, String)> = Vec::with_capacity(MAX_ATTRIBUTES);
    for (name, value) in [
        ("event_id", event_id.as_str()),
        ("event_type", event.event_type.as_str()),
        ("aggregate_type", event.aggregate_type.as_str()),
        ("aggregate_id", event.aggregate_id.as_str()),
    ] {
        // SQS and SNS refuse empty attribute values: an empty field is an absent attribute.
        if !value.is_empty() {
            attributes.push((name.to_owned(), value.to_owned()));
        }
    }
    let body = match cloudevents {
        // The headers are in the document (as extension attributes).
        Some(cloudevents) => {
            attributes.push((
                CONTENT_TYPE_ATTRIBUTE.to_owned(),
                STRUCTURED_CONTENT_TYPE.to_owned(),
            ));
            let unmapped = event.headers.iter().filter(|(n, _)| !is_mapped_header(n));
            push_headers(unmapped.collect(), &mut attributes);
            String::from_utf8(cloudevents.structured(event))
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        }
        None => {
            let body = raw_body(event, &mut attributes);
            push_headers(event.headers.iter().collect(), &mut attributes);
            body
        }
    };
    let size = body.len()
        + attributes
            .iter()
            .map(|(n, v)| n.len() + STRING_TYPE.len() + v.len())
            .sum::<usize>();
    let group_id = with_group_id.then(|| group_id(&event.aggregate_id));
    PreparedMessage {
        body,
        attributes,
        group_id,
        deduplication_id: with_deduplication_id.then_some(event_id),
        size,
    }
}

/// The raw format's body: the payload as text, or base64 (with the attribute saying so).
fn raw_body(event: &OutboxEvent, attributes: &mut Vec<(String, String)>) -> String {
    match event.payload_text() {
        Some(text) if event.payload_type != PayloadType::Binary => text.to_owned(),
        // Bytes (or, never from a `json` or `text` table, text that is not UTF-8).
        _ => {
            attributes.push((BODY_ENCODING_ATTRIBUTE.to_owned(), "base64".to_owned()));
            BASE64.encode(event.payload_bytes())
        }
    }
}

/// The raw format's headers: attributes of their own while they fit, else partly in the
/// `headers` attribute.
fn push_headers(headers: Vec<(&String, &String)>, attributes: &mut Vec<(String, String)>) {
    let free = MAX_ATTRIBUTES - attributes.len();
    let (own, overflow): (Vec<_>, Vec<_>) = headers
        .into_iter()
        .partition(|(name, value)| is_attribute_name(name) && is_attribute_value(value));
    if overflow.is_empty() && own.len() <= free {
        for (name, value) in own {
            attributes.push((name.clone(), value.clone()));
        }
    } else {
        let mut rest: BTreeMap<&str, &str> = BTreeMap::new();
        for (i, (name, value)) in own.into_iter().enumerate() {
            if i + 1 < free {
                attributes.push((name.clone(), value.clone()));
            } else {
                rest.insert(name, value);
            }
        }
        for (name, value) in overflow {
            rest.insert(name, value);
        }
        let json = serde_json::to_string(&rest).unwrap_or_else(|_| "{}".to_owned());
        attributes.push((OVERFLOW_ATTRIBUTE.to_owned(), json));
    }
}

/// The `MessageGroupId` of an aggregate: the `aggregate_id` itself when SQS and SNS accept it (1 to
/// 128 printable ASCII characters), otherwise `sha256-` and the hex SHA-256 of it — still one
/// group per aggregate, so the order per aggregate holds.
pub fn group_id(aggregate_id: &str) -> String {
    let valid = !aggregate_id.is_empty()
        && aggregate_id.len() <= MAX_GROUP_ID
        && aggregate_id.bytes().all(|b| b.is_ascii_graphic());
    if valid {
        return aggregate_id.to_owned();
    }
    let digest = Sha256::digest(aggregate_id.as_bytes());
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256-");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// Whether SQS and SNS accept `name` as a message attribute name of ours.
fn is_attribute_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        && !name.starts_with('.')
        && !name.ends_with('.')
        && !name.contains("..")
        && !lower.starts_with("aws.")
        && !lower.starts_with("amazon.")
        && name != OVERFLOW_ATTRIBUTE
        && name != BODY_ENCODING_ATTRIBUTE
        && !EVENT_ATTRIBUTES.contains(&name)
}

/// Whether SQS and SNS accept `value` as a `String` attribute value: non-empty, XML characters only.
fn is_attribute_value(value: &str) -> bool {
    !value.is_empty()
        && value.chars().all(|c| {
            matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use uuid::Uuid;

    fn event(headers: &[(&str, &str)]) -> OutboxEvent {
        OutboxEvent {
            id: 7,
            event_id: Uuid::parse_str("0190a4c2-0000-7000-8000-000000000001").unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderPlaced".into(),
            payload: r#"{"total": 12.5}"#.into(),
            payload_type: PayloadType::Json,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            destination: None,
            created_at: Utc::now(),
            attempts: 0,
            shard: 0,
        }
    }

    fn names(message: &PreparedMessage) -> Vec<&str> {
        message.attributes.iter().map(|(n, _)| n.as_str()).collect()
    }

    #[test]
    fn fields_and_a_few_headers_are_attributes() {
        let message = prepare(&event(&[("traceparent", "00-abc-01")]), false, false, None);
        assert_eq!(
            names(&message),
            [
                "event_id",
                "event_type",
                "aggregate_type",
                "aggregate_id",
                "traceparent"
            ]
        );
        assert_eq!(
            message.attributes[0].1,
            "0190a4c2-0000-7000-8000-000000000001"
        );
        assert_eq!(message.body, r#"{"total": 12.5}"#);
        assert_eq!(message.group_id, None);
        assert_eq!(message.deduplication_id, None);
        let expected_size = message.body.len()
            + message
                .attributes
                .iter()
                .map(|(n, v)| n.len() + 6 + v.len())
                .sum::<usize>();
        assert_eq!(message.size, expected_size);
    }

    #[test]
    fn fifo_messages_get_group_and_deduplication_ids() {
        let message = prepare(&event(&[]), true, true, None);
        assert_eq!(message.group_id.as_deref(), Some("42"));
        assert_eq!(
            message.deduplication_id.as_deref(),
            Some("0190a4c2-0000-7000-8000-000000000001")
        );
        let fair = prepare(&event(&[]), true, false, None);
        assert_eq!(fair.group_id.as_deref(), Some("42"));
        assert_eq!(fair.deduplication_id, None);
    }

    #[test]
    fn six_headers_fit_seven_overflow_into_headers_json() {
        let six: Vec<(String, String)> = (1..=6)
            .map(|i| (format!("h{i}"), format!("v{i}")))
            .collect();
        let six_refs: Vec<(&str, &str)> =
            six.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let message = prepare(&event(&six_refs), false, false, None);
        assert_eq!(message.attributes.len(), 10);
        assert!(!names(&message).contains(&OVERFLOW_ATTRIBUTE));

        let seven: Vec<(String, String)> = (1..=7)
            .map(|i| (format!("h{i}"), format!("v{i}")))
            .collect();
        let seven_refs: Vec<(&str, &str)> = seven
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let message = prepare(&event(&seven_refs), false, false, None);
        assert_eq!(message.attributes.len(), 10);
        assert_eq!(
            &names(&message)[4..],
            ["h1", "h2", "h3", "h4", "h5", OVERFLOW_ATTRIBUTE]
        );
        let json: BTreeMap<String, String> =
            serde_json::from_str(&message.attributes[9].1).unwrap();
        assert_eq!(json.len(), 2);
        assert_eq!(json["h6"], "v6");
        assert_eq!(json["h7"], "v7");
    }

    #[test]
    fn headers_sqs_refuses_as_attributes_travel_in_headers_json() {
        let message = prepare(
            &event(&[
                ("traceparent", "00-abc-01"),
                ("x:colon", "1"),
                ("empty", ""),
                ("AWS.TraceHeader", "t"),
                ("control", "a\u{1}b"),
                ("event_id", "spoofed"),
                ("headers", "x"),
            ]),
            false,
            false,
            None,
        );
        assert_eq!(&names(&message)[4..], ["traceparent", OVERFLOW_ATTRIBUTE]);
        let json: BTreeMap<String, String> =
            serde_json::from_str(&message.attributes[5].1).unwrap();
        assert_eq!(json.len(), 6);
        assert_eq!(json["x:colon"], "1");
        assert_eq!(json["empty"], "");
        assert_eq!(json["control"], "a\u{1}b");
        assert_eq!(json["event_id"], "spoofed");
        // The event's own event_id attribute is not overwritten.
        assert_eq!(
            message.attributes[0].1,
            "0190a4c2-0000-7000-8000-000000000001"
        );
    }

    #[test]
    fn binary_payloads_are_base64_bodies_with_an_attribute_saying_so() {
        let mut e = event(&[]);
        e.payload = (0..=255u8).collect();
        e.payload_type = PayloadType::Binary;
        let message = prepare(&e, false, false, None);
        assert_eq!(BASE64.decode(&message.body).unwrap(), e.payload);
        assert!(message
            .attributes
            .contains(&(BODY_ENCODING_ATTRIBUTE.to_owned(), "base64".to_owned())));
        assert_eq!(message.size, message.body.len() + attributes_size(&message));

        // Text, even of a binary table, still goes base64: consumers of a binary table
        // decode every body. Text and JSON tables send their text as it is.
        e.payload = b"plain".to_vec();
        assert_eq!(prepare(&e, false, false, None).body, "cGxhaW4=");
        e.payload_type = PayloadType::Text;
        let text = prepare(&e, false, false, None);
        assert_eq!(text.body, "plain");
        assert!(!names(&text).contains(&BODY_ENCODING_ATTRIBUTE));

        // Taking a slot, the encoding leaves five for headers before they overflow.
        e.payload_type = PayloadType::Binary;
        let six: Vec<(String, String)> = (1..=6)
            .map(|i| (format!("h{i}"), format!("v{i}")))
            .collect();
        e.headers = six.into_iter().collect();
        let message = prepare(&e, false, false, None);
        assert_eq!(message.attributes.len(), MAX_ATTRIBUTES);
        assert!(names(&message).contains(&OVERFLOW_ATTRIBUTE));
    }

    fn attributes_size(message: &PreparedMessage) -> usize {
        message
            .attributes
            .iter()
            .map(|(n, v)| n.len() + STRING_TYPE.len() + v.len())
            .sum()
    }

    #[test]
    fn cloudevents_bodies_are_the_document_and_only_unmapped_headers_are_attributes() {
        use outboxkit_core::cloudevents::Format;
        let ce = CloudEvents::for_format(Format::CloudEvents, "/shop", "k")
            .unwrap()
            .unwrap();
        let six: Vec<(String, String)> = (1..=8)
            .map(|i| (format!("h{i}"), format!("v{i}")))
            .collect();
        let mut e = event(&[]);
        e.headers = six.into_iter().collect();
        e.payload = (0..=255u8).collect();
        e.payload_type = PayloadType::Binary;
        let message = prepare(&e, true, true, Some(&ce));
        assert_eq!(
            names(&message),
            [&EVENT_ATTRIBUTES[..], &[CONTENT_TYPE_ATTRIBUTE]].concat()
        );
        assert_eq!(message.attributes[4].1, "application/cloudevents+json");
        assert_eq!(message.body.as_bytes(), ce.structured(&e));
        let parsed: serde_json::Value = serde_json::from_str(&message.body).unwrap();
        assert_eq!(parsed["h8"], "v8");
        assert_eq!(message.size, message.body.len() + attributes_size(&message));
        assert_eq!(message.group_id.as_deref(), Some("42"));

        // Headers that are not extension names stay attributes (or overflow): none is lost.
        e.headers.insert("tenant-id".into(), "acme".into());
        e.headers.insert("Region".into(), "eu".into());
        let message = prepare(&e, true, true, Some(&ce));
        let attribute = |name: &str| message.attributes.iter().find(|(n, _)| n == name);
        assert_eq!(attribute("tenant-id").unwrap().1, "acme");
        assert_eq!(attribute("Region").unwrap().1, "eu");
        assert!(
            attribute("h8").is_none(),
            "an extension, in the document only"
        );
    }

    #[test]
    fn empty_fields_are_left_out() {
        let mut e = event(&[]);
        e.event_type.clear();
        let message = prepare(&e, false, false, None);
        assert_eq!(
            names(&message),
            ["event_id", "aggregate_type", "aggregate_id"]
        );
    }

    #[test]
    fn group_ids_sqs_refuses_are_hashed_per_aggregate() {
        assert_eq!(group_id("order-42"), "order-42");
        assert_eq!(group_id("a/b:c!"), "a/b:c!");
        for odd in ["with space", "caf\u{e9}", "", &"x".repeat(129)] {
            let g = group_id(odd);
            assert!(g.starts_with("sha256-"), "{g}");
            assert_eq!(g.len(), 7 + 64);
            assert_eq!(g, group_id(odd), "stable");
        }
        assert_ne!(group_id("with space"), group_id("with  space"));
    }
}
