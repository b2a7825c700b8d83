//! The [`Sink`] implementation: one `POST` per event, a batch's requests in flight concurrently.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{SecondsFormat, Utc};
use futures_util::stream::{self, StreamExt};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use url::Url;

use crate::classify::{
    classify_status, classify_transport, decide, parse_retry_after, Answer, Attempt,
};
use crate::config::{
    redact_parsed, redact_url, WebhookSinkConfig, CONFIG_SECTION, RESERVED_HEADERS,
};

/// How much of an error response's body goes into the event's `last_error`.
const BODY_EXCERPT_CHARS: usize = 200;

/// How much of a 2xx response's body is read (so the connection can be reused) before it is
/// dropped.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024;

/// Publishes each outbox event as one HTTP `POST` of a JSON document.
///
/// Request: `POST <url>/<destination>` with `Content-Type: application/json`,
/// `Idempotency-Key: <event_id>`, the configured `headers` and the event's own headers (e.g.
/// `traceparent`); body: see [`WebhookSink::document`]. A 2xx answer means published; see
/// [`classify`](crate::classify) for every other answer.
pub struct WebhookSink {
    config: WebhookSinkConfig,
    base: Url,
    template: DestinationTemplate,
    /// Names set by `headers`: an event's header never overrides them.
    static_headers: HeaderMap,
    client: reqwest::Client,
    /// Set when a whole call was throttled with `Retry-After`: no request before then.
    paused_until: Mutex<Option<Instant>>,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The JSON document POSTed for one event.
#[derive(Serialize)]
struct Document<'a> {
    event_id: String,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    event_type: &'a str,
    created_at: String,
    headers: &'a BTreeMap<String, String>,
    payload: &'a RawValue,
}

impl WebhookSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "webhook";

    /// Validate `config` and build the sink. No network I/O: connections open on first use,
    /// and [`Sink::check`] tells whether the endpoint answers.
    pub fn new(config: WebhookSinkConfig) -> Result<Self> {
        config.validate()?;
        let base = config.base_url()?;
        let template = config.template()?;
        let static_headers = config.header_map()?;
        let mut default_headers = static_headers.clone();
        if !default_headers.contains_key(header::USER_AGENT) {
            default_headers.insert(
                header::USER_AGENT,
                HeaderValue::from_static(concat!(
                    "outbox-relay-webhook/",
                    env!("CARGO_PKG_VERSION")
                )),
            );
        }
        let client = reqwest::Client::builder()
            .default_headers(default_headers)
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            // A redirected POST may turn into a GET whose 200 would count as published.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(config.concurrency)
            .build()
            .map_err(|e| {
                Error::config(format!(
                    "{CONFIG_SECTION}: cannot build the HTTP client: {}",
                    e.without_url()
                ))
            })?;
        Ok(Self {
            config,
            base,
            template,
            static_headers,
            client,
            paused_until: Mutex::new(None),
        })
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &WebhookSinkConfig {
        &self.config
    }

    /// The URL an event with `destination` is POSTed to: the base `url` with the destination's
    /// `/`-separated segments appended, each percent-encoded. A destination is always a path
    /// under `url` — never another host: one holding `://`, or a `.` or `..` segment, is refused.
    pub fn url_for(&self, destination: &str) -> Result<Url> {
        let refuse = |why: &str| {
            Error::new(
                ErrorKind::Unroutable,
                format!(
                    "destination `{destination}` {why}: a destination is a path under \
                     {CONFIG_SECTION}.url ({})",
                    redact_parsed(&self.base)
                ),
            )
            .permanent()
        };
        if destination.contains("://") {
            return Err(refuse("is a URL, not a path"));
        }
        let relative = destination.trim_start_matches('/');
        let mut url = self.base.clone();
        if relative.is_empty() {
            return Ok(url);
        }
        let segments: Vec<&str> = relative.split('/').collect();
        if segments.iter().any(|s| matches!(*s, "." | "..")) {
            return Err(refuse("has a `.` or `..` segment"));
        }
        match url.path_segments_mut() {
            Ok(mut path) => {
                path.pop_if_empty().extend(segments);
            }
            Err(()) => return Err(refuse("cannot be appended to this base URL")),
        }
        Ok(url)
    }

    /// The request body for `event`:
    ///
    /// ```json
    /// {"event_id":"0190…","aggregate_type":"order","aggregate_id":"42","event_type":"OrderConfirmed",
    ///  "created_at":"2024-05-01T12:00:00.123456Z","headers":{"traceparent":"00-…"},"payload":{…}}
    /// ```
    ///
    /// `payload` is the writer's JSON embedded as is, byte for byte — not re-serialized, not a
    /// string. A payload that is not JSON is refused (`InvalidMessage`).
    pub fn document(event: &OutboxEvent) -> Result<String> {
        let payload: &RawValue = serde_json::from_str(&event.payload).map_err(|e| {
            Error::new(
                ErrorKind::InvalidMessage,
                format!("the payload is not a JSON document ({e}); it cannot be embedded in the request body"),
            )
            .permanent()
        })?;
        let document = Document {
            event_id: event.event_id.to_string(),
            aggregate_type: &event.aggregate_type,
            aggregate_id: &event.aggregate_id,
            event_type: &event.event_type,
            created_at: event
                .created_at
                .to_rfc3339_opts(SecondsFormat::Micros, true),
            headers: &event.headers,
            payload,
        };
        serde_json::to_string(&document).map_err(|e| {
            Error::new(ErrorKind::InvalidMessage, "the event cannot be serialized")
                .with_source(e)
                .permanent()
        })
    }

    /// The per-request headers: `Content-Type`, `Idempotency-Key` and the event's headers that
    /// can be HTTP headers. An event header whose name is reserved, set by `headers`, or that
    /// is not valid in HTTP is left out of the HTTP headers (it is still in the body's
    /// `headers`).
    pub fn request_headers(&self, event: &OutboxEvent) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(event.headers.len() + 2);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let key = HeaderValue::from_str(&event.event_id.to_string())
            .unwrap_or_else(|_| HeaderValue::from_static("invalid"));
        headers.insert(HeaderName::from_static("idempotency-key"), key);
        for (name, value) in &event.headers {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                tracing::debug!(event_id = %event.event_id, header = %name,
                    "event header is not a valid HTTP header: sent in the body only");
                continue;
            };
            if RESERVED_HEADERS.contains(&name.as_str()) || self.static_headers.contains_key(&name)
            {
                tracing::debug!(event_id = %event.event_id, header = %name,
                    "event header is reserved or configured: sent in the body only");
                continue;
            }
            headers.append(name, value);
        }
        headers
    }

    /// POST one event; never fails as a whole: every failure is the event's [`Attempt`].
    async fn deliver(&self, event: &OutboxEvent) -> Attempt {
        let destination = self.destination(event);
        let url = match self.url_for(&destination) {
            Ok(url) => url,
            Err(e) => return Attempt::failed(e),
        };
        let request = format!("POST {}", redact_parsed(&url));
        let body = match Self::document(event) {
            Ok(body) => body,
            Err(e) => return Attempt::failed(e.context(&request)),
        };
        let sent = self
            .client
            .post(url)
            .headers(self.request_headers(event))
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(e) => return Attempt::failed(classify_transport(e, &request, &self.config)),
        };
        let status = response.status();
        if status.is_success() {
            // The status is the acknowledgement; the body only matters to reuse the connection.
            let _ = read_body(response, DRAIN_LIMIT_BYTES).await;
            return Attempt::published();
        }
        let retry_after = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, Utc::now()));
        let location = response
            .headers()
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(redact_url);
        let body = read_body(response, BODY_EXCERPT_CHARS * 4).await;
        let answer = Answer {
            status,
            retry_after,
            location,
            body_excerpt: excerpt(&body),
        };
        match classify_status(&answer, &request) {
            None => Attempt::published(),
            Some(error) => {
                tracing::debug!(event_id = %event.event_id, error = %error, "event not published");
                Attempt {
                    result: Err(error),
                    retry_after,
                }
            }
        }
    }

    /// Time left of a pause asked for by `Retry-After`.
    fn paused_for(&self) -> Option<Duration> {
        let guard = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        let until = (*guard)?;
        let now = Instant::now();
        (until > now).then(|| until - now)
    }

    fn pause(&self, wait: Duration) {
        let wait = wait.min(self.config.max_retry_after);
        if wait.is_zero() {
            return;
        }
        let mut guard = self.paused_until.lock().unwrap_or_else(|e| e.into_inner());
        *guard = Some(Instant::now() + wait);
    }
}

/// Up to `limit` bytes of the body; errors end the read.
async fn read_body(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < limit {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(limit);
    body
}

/// The start of a response body on one line, for error messages.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out = String::new();
    let mut chars = 0;
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        for c in word.chars().filter(|c| !c.is_control()) {
            if chars == BODY_EXCERPT_CHARS {
                out.push('…');
                return out;
            }
            out.push(c);
            chars += 1;
        }
    }
    out
}

#[async_trait]
impl Sink for WebhookSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: self.config.max_payload_bytes,
            // Requests of a batch race each other: the engine sends one event per aggregate
            // per call.
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    /// `HEAD <url>`: any HTTP answer, whatever its status, shows the endpoint is reachable.
    async fn check(&self) -> Result<()> {
        let request = format!("HEAD {}", redact_parsed(&self.base));
        match self.client.head(self.base.clone()).send().await {
            Ok(response) => {
                tracing::debug!(status = %response.status(), "{request}: the webhook answers");
                Ok(())
            }
            Err(e) => Err(classify_transport(e, &request, &self.config)),
        }
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(left) = self.paused_for() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "the webhook at {} asked to wait (Retry-After): {} left before the next request",
                    self.config.host_port(),
                    humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
                ),
            ));
        }
        // Futures built up front (not in a closure of the stream), so the call stays `Send`.
        let requests: Vec<_> = batch.iter().map(|event| self.deliver(event)).collect();
        let attempts: Vec<Attempt> = stream::iter(requests)
            .buffered(self.config.concurrency)
            .collect()
            .await;
        let decision = decide(attempts);
        if let Some(wait) = decision.pause {
            self.pause(wait);
        }
        decision.outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use outboxkit_core::Headers;

    fn sink(url: &str, path: &str) -> WebhookSink {
        WebhookSink::new(WebhookSinkConfig {
            path: path.to_owned(),
            ..WebhookSinkConfig::new(url)
        })
        .unwrap()
    }

    fn event(payload: &str) -> OutboxEvent {
        let mut headers = Headers::new();
        headers.insert("traceparent".into(), "00-abc-def-01".into());
        OutboxEvent {
            id: 7,
            event_id: "0190f0b4-6c1a-7cc2-9a43-1c2d3e4f5a6b".parse().unwrap(),
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "OrderConfirmed".into(),
            payload: payload.to_owned(),
            headers,
            destination: None,
            created_at: Utc
                .with_ymd_and_hms(2024, 5, 1, 12, 0, 0)
                .unwrap()
                .checked_add_signed(chrono::Duration::microseconds(123_456))
                .unwrap(),
            attempts: 0,
            shard: 3,
        }
    }

    #[test]
    fn document_embeds_the_payload_verbatim() {
        let payload = "{\"total\":  12.50, \"note\": \"caf\u{e9} \u{2713}\"}";
        let body = WebhookSink::document(&event(payload)).unwrap();
        assert_eq!(
            body,
            format!(
                "{{\"event_id\":\"0190f0b4-6c1a-7cc2-9a43-1c2d3e4f5a6b\",\"aggregate_type\":\"order\",\
                 \"aggregate_id\":\"42\",\"event_type\":\"OrderConfirmed\",\
                 \"created_at\":\"2024-05-01T12:00:00.123456Z\",\
                 \"headers\":{{\"traceparent\":\"00-abc-def-01\"}},\"payload\":{payload}}}"
            )
        );
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed["payload"]["total"], 12.5);
    }

    #[test]
    fn payload_that_is_not_json_is_rejected() {
        for payload in ["", "not json", "{\"a\": 1", "{} {}"] {
            let e = WebhookSink::document(&event(payload)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{payload:?}");
            assert!(!e.is_retryable());
        }
    }

    #[test]
    fn urls_append_the_destination_under_the_base() {
        let s = sink("http://127.0.0.1:8080/hooks", "{aggregate_type}");
        assert_eq!(
            s.url_for("order").unwrap().as_str(),
            "http://127.0.0.1:8080/hooks/order"
        );
        assert_eq!(
            s.url_for("/a/b c?d#e").unwrap().as_str(),
            "http://127.0.0.1:8080/hooks/a/b%20c%3Fd%23e"
        );
        let s = sink("https://h.example.com/hooks/?sig=1", "{aggregate_type}");
        assert_eq!(
            s.url_for("order").unwrap().as_str(),
            "https://h.example.com/hooks/order?sig=1"
        );
        let s = sink("http://h", "{aggregate_type}");
        assert_eq!(s.url_for("order").unwrap().as_str(), "http://h/order");
        assert_eq!(s.url_for("").unwrap().as_str(), "http://h/");
    }

    #[test]
    fn destinations_never_leave_the_base_url() {
        let s = sink("http://h/hooks?token=s3cr3t", "{aggregate_type}");
        for bad in ["../admin", "a/./b", "a/..", "http://evil.example.com/x"] {
            let e = s.url_for(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unroutable, "{bad}");
            assert!(!e.is_retryable());
            assert!(e.message().contains("sink.webhook.url"), "{e}");
            assert!(!e.message().contains("s3cr3t"), "{e}");
        }
    }

    #[test]
    fn request_headers_carry_idempotency_key_and_event_headers() {
        let mut config = WebhookSinkConfig::new("http://h");
        config
            .headers
            .insert("Authorization".into(), "Bearer x".into());
        let s = WebhookSink::new(config).unwrap();
        let mut e = event("{}");
        e.headers.insert("tenant".into(), "acme".into());
        e.headers.insert("Content-Type".into(), "text/plain".into());
        e.headers
            .insert("authorization".into(), "Bearer forged".into());
        e.headers.insert("bad name".into(), "x".into());
        e.headers.insert("multi".into(), "line\nbreak".into());
        let h = s.request_headers(&e);
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h["idempotency-key"], "0190f0b4-6c1a-7cc2-9a43-1c2d3e4f5a6b");
        assert_eq!(h["traceparent"], "00-abc-def-01");
        assert_eq!(h["tenant"], "acme");
        assert_eq!(h.get_all("content-type").iter().count(), 1);
        assert!(
            !h.contains_key("authorization"),
            "the configured one is sent by the client"
        );
        assert!(!h.contains_key("multi"));
        assert_eq!(h.len(), 4, "{h:?}");
    }

    #[test]
    fn excerpts_are_one_bounded_line() {
        assert_eq!(
            excerpt(b"{\"error\":\n  \"bad\"}\r\n"),
            "{\"error\": \"bad\"}"
        );
        let long = "x".repeat(500);
        let e = excerpt(long.as_bytes());
        assert_eq!(e.chars().count(), BODY_EXCERPT_CHARS + 1);
        assert!(e.ends_with('…'));
        assert_eq!(excerpt(b""), "");
    }

    #[test]
    fn debug_hides_secrets() {
        let mut config = WebhookSinkConfig::new("https://u:pa55@h/in?code=c0de");
        config
            .headers
            .insert("Authorization".into(), "Bearer t0k3n".into());
        let debug = format!("{:?}", WebhookSink::new(config).unwrap());
        for secret in ["pa55", "c0de", "t0k3n"] {
            assert!(!debug.contains(secret), "{debug}");
        }
    }
}
