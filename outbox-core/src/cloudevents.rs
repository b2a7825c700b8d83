//! CloudEvents 1.0, opt-in per sink (`format = "cloudevents"`; the default `raw` sends the
//! payload and the event's fields the sink's own way).
//!
//! An outbox event maps to a CloudEvent as:
//!
//! | attribute | value |
//! |---|---|
//! | `specversion` | `1.0` |
//! | `id` | `event_id` |
//! | `source` | the sink's `cloudevents_source` template, rendered (placeholder values percent-encoded) |
//! | `type` | `event_type` |
//! | `subject` | `aggregate_id` (left out when empty) |
//! | `time` | `created_at`, RFC 3339 UTC with microseconds |
//! | `datacontenttype` | the event's content type ([`OutboxEvent::content_type`]) |
//! | extensions | each header whose name is a valid attribute name (`a-z`, `0-9`) and not one of the above, e.g. `traceparent` |
//!
//! Each sink uses its broker's protocol binding: binary content mode (attributes as headers or
//! properties, the payload as the body) where the broker has headers, [`CloudEvents::structured`]
//! (one JSON document) elsewhere.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use chrono::SecondsFormat;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::model::{OutboxEvent, Payload, PayloadType, CONTENT_TYPE_HEADER};
use crate::template::DestinationTemplate;

/// The CloudEvents specification version the relay produces.
pub const SPEC_VERSION: &str = "1.0";

/// The `source` template of a sink that does not set one.
pub const DEFAULT_SOURCE: &str = "/outbox/{aggregate_type}";

/// The content type of a structured-mode message (JSON event format).
pub const STRUCTURED_CONTENT_TYPE: &str = "application/cloudevents+json";

/// Attribute names the specification defines, which headers never take as extensions.
pub const RESERVED_NAMES: [&str; 10] = [
    "specversion",
    "id",
    "source",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
    "data",
    "data_base64",
];

/// How a sink shapes its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The payload as the body, the event's fields the sink's own way (see each sink).
    #[default]
    Raw,
    /// CloudEvents 1.0 in the broker's protocol binding.
    CloudEvents,
}

/// The CloudEvents mapping of one sink: its `source` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    source: DestinationTemplate,
}

impl CloudEvents {
    /// The mapping with `source_template` (placeholders `{aggregate_type}`, `{aggregate_id}`,
    /// `{event_type}`), refused unless it renders to a URI-reference (RFC 3986); errors name
    /// `key`, the setting it came from.
    pub fn new(source_template: &str, key: &str) -> Result<Self> {
        let source = DestinationTemplate::parse(source_template)
            .map_err(|e| Error::config(format!("{key}: {e}")))?;
        let mapping = Self { source };
        let probe = OutboxEvent {
            aggregate_type: "t".into(),
            aggregate_id: "i".into(),
            event_type: "e".into(),
            ..probe_event()
        };
        let rendered = mapping.source(&probe);
        if let Err(why) = check_uri_reference(&rendered) {
            return Err(Error::config(format!(
                "{key} = `{source_template}` does not render to a URI-reference \
                 (e.g. `/orders/{{aggregate_type}}` or `urn:shop:orders`): {why}"
            )));
        }
        Ok(mapping)
    }

    /// The mapping a sink configured with `format` and `source_template` uses: `None` for
    /// [`Format::Raw`]; for [`Format::CloudEvents`], [`CloudEvents::new`] (errors name `key`).
    pub fn for_format(format: Format, source_template: &str, key: &str) -> Result<Option<Self>> {
        match format {
            Format::Raw => Ok(None),
            Format::CloudEvents => Self::new(source_template, key).map(Some),
        }
    }

    /// The mapping of a sink whose settings are in `section` (`sink.kafka`), with its `format`
    /// and `cloudevents_source` keys: [`for_format`](Self::for_format), errors naming
    /// `<section>.cloudevents_source`.
    pub fn for_section(
        format: Format,
        source_template: &str,
        section: &str,
    ) -> Result<Option<Self>> {
        Self::for_format(
            format,
            source_template,
            &format!("{section}.cloudevents_source"),
        )
    }

    /// The event's `source`: the template with its fields percent-encoded.
    pub fn source(&self, event: &OutboxEvent) -> String {
        self.source.render_fields(event, percent_encode)
    }

    /// The event's attributes, `(name, value)`, in the order of the table above: the
    /// specification's, then the extensions taken from headers.
    pub fn attributes(&self, event: &OutboxEvent) -> Vec<(String, String)> {
        let mut out = vec![
            ("specversion".to_owned(), SPEC_VERSION.to_owned()),
            ("id".to_owned(), event.event_id.to_string()),
            ("source".to_owned(), self.source(event)),
            ("type".to_owned(), event.event_type.clone()),
        ];
        if !event.aggregate_id.is_empty() {
            out.push(("subject".to_owned(), event.aggregate_id.clone()));
        }
        out.push((
            "time".to_owned(),
            event
                .created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
        ));
        out.push((
            "datacontenttype".to_owned(),
            event.content_type().to_owned(),
        ));
        for (name, value) in &event.headers {
            if is_extension_name(name) {
                out.push((name.clone(), value.clone()));
            }
        }
        out
    }

    /// The attributes of binary content mode, in [`attributes`](Self::attributes) order: every
    /// attribute but `datacontenttype` (which travels as the protocol's own content type, see
    /// [`OutboxEvent::content_type`]), named `prefix` + name (`ce_` for Kafka,
    /// `cloudEvents:` for AMQP).
    pub fn binary_headers(&self, event: &OutboxEvent, prefix: &str) -> Vec<(String, String)> {
        self.attributes(event)
            .into_iter()
            .filter(|(name, _)| name != "datacontenttype")
            .map(|(name, value)| (format!("{prefix}{name}"), value))
            .collect()
    }

    /// The event in structured content mode: one JSON document (JSON event format), with the
    /// payload as `data` — the JSON itself when the content type is JSON and the payload is a
    /// JSON document (embedded byte for byte), a string for other text, `data_base64` for the
    /// payload of a `binary` table.
    pub fn structured(&self, event: &OutboxEvent) -> Vec<u8> {
        let mut out = String::with_capacity(event.payload.len() + 256);
        out.push('{');
        for (i, (name, value)) in self.attributes(event).iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            push_json_string(&mut out, name);
            out.push(':');
            push_json_string(&mut out, value);
        }
        match Data::of(event) {
            Data::Json(json) => {
                out.push_str(",\"data\":");
                out.push_str(json);
            }
            Data::Text(text) => {
                out.push_str(",\"data\":");
                push_json_string(&mut out, text);
            }
            Data::Base64(bytes) => {
                out.push_str(",\"data_base64\":");
                push_json_string(&mut out, &BASE64.encode(bytes));
            }
        }
        out.push('}');
        out.into_bytes()
    }
}

/// How the payload goes into a structured document.
enum Data<'e> {
    Json(&'e str),
    Text(&'e str),
    Base64(&'e [u8]),
}

impl<'e> Data<'e> {
    fn of(event: &'e OutboxEvent) -> Self {
        let text = match event.payload_text() {
            Some(text) if event.payload_type != PayloadType::Binary => text,
            _ => return Data::Base64(&event.payload),
        };
        let is_document = serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok();
        if is_json_content_type(event.content_type()) && is_document {
            Data::Json(text)
        } else {
            Data::Text(text)
        }
    }
}

/// Whether `content_type` is JSON: `application/json`, `text/json` or a `+json` type.
pub fn is_json_content_type(content_type: &str) -> bool {
    let media = content_type.split(';').next().unwrap_or("").trim();
    let media = media.to_ascii_lowercase();
    media == "application/json" || media == "text/json" || media.ends_with("+json")
}

/// Whether a header named `name` is an extension attribute: lower-case ASCII letters and
/// digits only, and not a name the specification defines.
pub fn is_extension_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && !RESERVED_NAMES.contains(&name)
}

/// Whether binary content mode carries the event header `name` as part of the CloudEvent
/// (an extension attribute, or the content type): such a header is not sent again as a
/// header of its own.
pub fn is_mapped_header(name: &str) -> bool {
    name == CONTENT_TYPE_HEADER || is_extension_name(name)
}

/// Why `text` is not a URI-reference (RFC 3986 §4.1), if it is not one.
pub fn check_uri_reference(text: &str) -> std::result::Result<(), String> {
    if text.is_empty() {
        return Err("it is empty".into());
    }
    let bytes = text.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let allowed = b.is_ascii_alphanumeric() || b"-._~:/?#[]@!$&'()*+,;=%".contains(&b);
        if !allowed {
            return Err(format!(
                "`{}` at byte {i} must be percent-encoded",
                text[i..].chars().next().unwrap_or('?')
            ));
        }
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3);
            if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                return Err(format!("`%` at byte {i} is not followed by two hex digits"));
            }
        }
    }
    if text.matches('#').count() > 1 {
        return Err("it has more than one `#`".into());
    }
    // A colon before any `/`, `?` or `#` ends a scheme, which must be a letter followed by
    // letters, digits, `+`, `-`, `.`.
    let first = text.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((scheme, _)) = first.split_once(':') {
        let mut chars = scheme.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid {
            return Err(format!("`{scheme}` is not a URI scheme"));
        }
    }
    let authority_end = text
        .strip_prefix("//")
        .or_else(|| text.split_once("://").map(|(_, rest)| rest))
        .map(|rest| text.len() - rest.len() + rest.find(['/', '?', '#']).unwrap_or(rest.len()));
    if let Some(i) = text.find(['[', ']']) {
        if authority_end.is_none_or(|end| i >= end) {
            return Err("`[` and `]` belong only in a host (an IPv6 address)".into());
        }
    }
    Ok(())
}

/// Append `value` percent-encoded: everything but ASCII letters, digits and `-._~`.
fn percent_encode(value: &str, out: &mut String) {
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn push_json_string(out: &mut String, value: &str) {
    out.push_str(&serde_json::to_string(value).unwrap_or_else(|_| "\"\"".to_owned()));
}

fn probe_event() -> OutboxEvent {
    OutboxEvent {
        event_id: uuid::Uuid::nil(),
        created_at: chrono::DateTime::UNIX_EPOCH,
        ..OutboxEvent::new(0, "", "", "", Payload::Json(String::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CONTENT_TYPE_HEADER;

    fn event() -> OutboxEvent {
        let mut e = OutboxEvent {
            event_id: uuid::Uuid::parse_str("0190a4c2-0000-7000-8000-000000000001").unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42/a b".into(),
            event_type: "OrderPlaced".into(),
            payload: br#"{"total": 12.50}"#.to_vec(),
            created_at: chrono::DateTime::parse_from_rfc3339("2024-05-01T12:00:00.123456Z")
                .unwrap()
                .into(),
            ..probe_event()
        };
        e.headers.insert("traceparent".into(), "00-ab-cd-01".into());
        e.headers.insert("Tenant".into(), "acme".into());
        e.headers.insert("tenant-id".into(), "7".into());
        e.headers.insert("type".into(), "spoof".into());
        e
    }

    fn mapping() -> CloudEvents {
        CloudEvents::new(
            "/shop/{aggregate_type}/{aggregate_id}",
            "sink.kafka.cloudevents_source",
        )
        .unwrap()
    }

    #[test]
    fn attributes_follow_the_mapping_and_only_valid_headers_become_extensions() {
        let attributes = mapping().attributes(&event());
        let names: Vec<&str> = attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "specversion",
                "id",
                "source",
                "type",
                "subject",
                "time",
                "datacontenttype",
                "traceparent"
            ]
        );
        let value = |name: &str| &attributes.iter().find(|(n, _)| n == name).unwrap().1;
        assert_eq!(value("specversion"), "1.0");
        assert_eq!(value("id"), "0190a4c2-0000-7000-8000-000000000001");
        assert_eq!(value("source"), "/shop/order/42%2Fa%20b");
        assert_eq!(value("type"), "OrderPlaced");
        assert_eq!(value("subject"), "42/a b");
        assert_eq!(value("time"), "2024-05-01T12:00:00.123456Z");
        assert_eq!(value("datacontenttype"), "application/json");
        for (name, _) in &attributes {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "{name}"
            );
        }
    }

    #[test]
    fn binary_headers_are_the_attributes_but_the_content_type_with_a_prefix() {
        let e = event();
        let headers = mapping().binary_headers(&e, "ce_");
        let names: Vec<&str> = headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "ce_specversion",
                "ce_id",
                "ce_source",
                "ce_type",
                "ce_subject",
                "ce_time",
                "ce_traceparent"
            ]
        );
        assert_eq!(headers[2].1, "/shop/order/42%2Fa%20b");
        assert_eq!(e.content_type(), "application/json");
        assert!(is_mapped_header("traceparent") && is_mapped_header(CONTENT_TYPE_HEADER));
        assert!(!is_mapped_header("Tenant") && !is_mapped_header("type"));
        assert!(CloudEvents::for_format(Format::Raw, "/a b", "k")
            .unwrap()
            .is_none());
        let e = CloudEvents::for_format(Format::CloudEvents, "/a b", "sink.x.cloudevents_source");
        assert!(e
            .unwrap_err()
            .to_string()
            .contains("sink.x.cloudevents_source"));
        assert!(CloudEvents::for_section(Format::Raw, "/a b", "sink.y")
            .unwrap()
            .is_none());
        let e = CloudEvents::for_section(Format::CloudEvents, "/a b", "sink.y").unwrap_err();
        assert!(
            e.to_string().starts_with("sink.y.cloudevents_source"),
            "{e}"
        );
    }

    #[test]
    fn structured_documents_embed_json_carry_text_as_a_string_and_bytes_as_base64() {
        let mut e = event();
        let doc = String::from_utf8(mapping().structured(&e)).unwrap();
        assert!(doc.ends_with(r#","data":{"total": 12.50}}"#), "{doc}");
        let parsed: serde_json::Value = serde_json::from_str(&doc).unwrap();
        assert_eq!(parsed["type"], "OrderPlaced");
        assert_eq!(parsed["traceparent"], "00-ab-cd-01");

        e.payload_type = PayloadType::Text;
        e.payload = b"<order id=\"42\"/>".to_vec();
        e.headers
            .insert(CONTENT_TYPE_HEADER.into(), "application/xml".into());
        let parsed: serde_json::Value = serde_json::from_slice(&mapping().structured(&e)).unwrap();
        assert_eq!(parsed["data"], "<order id=\"42\"/>");
        assert_eq!(parsed["datacontenttype"], "application/xml");

        e.payload_type = PayloadType::Binary;
        e.payload = (0..=255u8).collect();
        e.headers.remove(CONTENT_TYPE_HEADER);
        let parsed: serde_json::Value = serde_json::from_slice(&mapping().structured(&e)).unwrap();
        assert!(parsed.get("data").is_none());
        let data = BASE64
            .decode(parsed["data_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(data, e.payload);
        assert_eq!(parsed["datacontenttype"], "application/octet-stream");
    }

    #[test]
    fn sources_that_are_not_uri_references_are_refused_naming_the_key() {
        for good in [
            DEFAULT_SOURCE,
            "urn:shop:orders",
            "https://shop.example/{event_type}",
            "//[::1]:8080/a",
            "{aggregate_type}",
            "a%20b",
        ] {
            CloudEvents::new(good, "k").unwrap_or_else(|e| panic!("{good}: {e}"));
        }
        for (bad, why) in [
            ("", "is empty"),
            ("/orders here", "` ` at byte 7 must be percent-encoded"),
            ("/caf\u{e9}", "must be percent-encoded"),
            ("a%2", "not followed by two hex digits"),
            ("a#b#c", "more than one `#`"),
            ("1http://x", "`1http` is not a URI scheme"),
            ("/a[0]", "belong only in a host"),
            ("/{nope}", "unknown placeholder"),
        ] {
            let e = CloudEvents::new(bad, "sink.sqs.cloudevents_source").unwrap_err();
            let text = e.to_string();
            assert!(text.contains("sink.sqs.cloudevents_source"), "{text}");
            assert!(text.contains(why), "{bad}: {text}");
        }
    }

    #[test]
    fn json_content_types() {
        for ct in [
            "application/json",
            "application/JSON; charset=utf-8",
            "application/vnd.shop+json",
            "text/json",
        ] {
            assert!(is_json_content_type(ct), "{ct}");
        }
        for ct in [
            "text/plain",
            "application/octet-stream",
            "application/jsonl",
        ] {
            assert!(!is_json_content_type(ct), "{ct}");
        }
    }
}
