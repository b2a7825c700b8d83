//! The [`Sink`]: one `POST` per event, the requests of a batch in flight concurrently.

use std::collections::BTreeMap;
use std::fmt;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use futures_util::stream::{self, StreamExt};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, PayloadType, Result, Sink,
    SinkCapabilities,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde_json::value::RawValue;
use url::Url;

use crate::classify::{status_error, transport_error};
use crate::config::{is_reserved, redact, WebhookSinkConfig};

/// Publishes each event as `POST <url>/<destination>` of a JSON document, with
/// `Idempotency-Key: <event_id>`, the configured headers and the event's own headers. A 2xx
/// answer means published; see [`crate::classify`] for the others.
pub struct WebhookSink {
    config: WebhookSinkConfig,
    base: Url,
    template: DestinationTemplate,
    /// The configured `headers`.
    headers: HeaderMap,
    client: reqwest::Client,
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The request body.
#[derive(serde::Serialize)]
struct Document<'a> {
    event_id: String,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    event_type: &'a str,
    created_at: String,
    headers: &'a BTreeMap<String, String>,
    /// The event's content type (its `content-type` header, else its table's default).
    content_type: &'a str,
    /// A JSON payload (from a `json` table, or a `text` one holding JSON), embedded byte for
    /// byte; other text goes in `payload_text`, bytes in `payload_base64`.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
}

impl WebhookSink {
    /// Check `config` and build the sink; no network I/O (connections open on first use).
    pub fn new(config: WebhookSinkConfig) -> Result<Self> {
        outboxkit_core::SinkConfig::validate(&config)?;
        let (base, template, headers) = config.parts()?;
        let client = reqwest::Client::builder()
            .user_agent(concat!("outbox-relay-webhook/", env!("CARGO_PKG_VERSION")))
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            // A redirected POST may turn into a GET whose 200 would count as published.
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(config.concurrency)
            .build()
            .map_err(|e| {
                Error::config(format!("sink.webhook: cannot build the HTTP client: {e}"))
            })?;
        Ok(Self {
            config,
            base,
            template,
            headers,
            client,
        })
    }

    /// `<url>/<destination>`, each `/`-separated segment percent-encoded. A destination is a
    /// path under `url`: one with a `.` or `..` segment is refused (`Unroutable`).
    fn url_for(&self, destination: &str) -> Result<Url> {
        let segments: Vec<&str> = destination.trim_start_matches('/').split('/').collect();
        let mut url = self.base.clone();
        if segments.iter().any(|s| matches!(*s, "." | "..")) {
            let message = format!(
                "destination `{destination}` is not a path under {}",
                redact(&self.config.url)
            );
            return Err(Error::new(ErrorKind::Unroutable, message));
        }
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        Ok(url)
    }

    /// One event's request: its outcome, never an `Err`.
    async fn deliver(&self, event: &OutboxEvent) -> Outcome {
        let url = match self.url_for(&self.destination(event)) {
            Ok(url) => url,
            Err(e) => return Outcome::from_error(e),
        };
        let request = format!("POST {}", redact(url.as_str()));
        let text = event.payload_text();
        // Embedded only when the JSON is the whole text: RawValue drops surrounding whitespace.
        let json = text
            .and_then(|t| serde_json::from_str::<&RawValue>(t).ok())
            .filter(|raw| Some(raw.get()) == text);
        let (payload, payload_text, payload_base64) = match event.payload_type {
            PayloadType::Json if json.is_none() => {
                let e = Error::new(
                    ErrorKind::InvalidMessage,
                    "the payload is not a JSON document",
                );
                return Outcome::from_error(e.context(request));
            }
            PayloadType::Json | PayloadType::Text if json.is_some() => (json, None, None),
            PayloadType::Text if text.is_some() => (None, text, None),
            _ => (None, None, Some(BASE64.encode(event.payload_bytes()))),
        };
        let document = Document {
            event_id: event.event_id.to_string(),
            aggregate_type: &event.aggregate_type,
            aggregate_id: &event.aggregate_id,
            event_type: &event.event_type,
            created_at: event
                .created_at
                .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            headers: &event.headers,
            content_type: event.content_type(),
            payload,
            payload_text,
            payload_base64,
        };
        let body =
            serde_json::to_string(&document).expect("a document of strings and JSON serializes");
        let sent = self
            .client
            .post(url)
            .headers(self.headers(event))
            .body(body)
            .send()
            .await;
        match sent {
            Err(e) => Outcome::from_error(transport_error(e, &request, &self.config)),
            Ok(response) => {
                let status = response.status();
                // Read (some of) the body: for the error message, and to reuse the connection.
                let body = excerpt(response).await;
                if status.is_success() {
                    return Outcome::Published;
                }
                Outcome::from_error(status_error(status, &request, &body))
            }
        }
    }

    /// The event's headers that are valid in HTTP and not reserved, then the configured ones
    /// (which win), `Content-Type` and `Idempotency-Key`. Every event header is in the body's
    /// `headers` anyway.
    fn headers(&self, event: &OutboxEvent) -> HeaderMap {
        let mut headers: HeaderMap = (event.headers.iter())
            .filter_map(|(name, value)| {
                let name = HeaderName::from_bytes(name.as_bytes()).ok();
                Some((
                    name.filter(|n| !is_reserved(n))?,
                    HeaderValue::from_str(value).ok()?,
                ))
            })
            .collect();
        headers.extend(self.headers.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let key = HeaderValue::from_str(&event.event_id.to_string()).expect("a UUID is valid");
        headers.insert("idempotency-key", key);
        headers
    }
}

/// The start of the response body on one line, for error messages (and the body is read, so
/// the connection can be reused).
async fn excerpt(response: reqwest::Response) -> String {
    let text = response.text().await.unwrap_or_default();
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    line.chars().take(200).collect()
}

#[async_trait]
impl Sink for WebhookSink {
    fn kind(&self) -> &'static str {
        "webhook"
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: None, // the endpoint's 413 says what is too large
            // The requests of a batch race: the engine sends one event per aggregate per call.
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    /// `HEAD <url>`: any HTTP answer, whatever its status, shows the endpoint is there.
    async fn check(&self) -> Result<()> {
        let request = format!("HEAD {}", redact(&self.config.url));
        let head = self
            .client
            .head(self.base.clone())
            .headers(self.headers.clone());
        match head.send().await {
            Ok(_) => Ok(()),
            Err(e) => Err(transport_error(e, &request, &self.config)),
        }
    }

    /// One outcome per event; the engine decides whether they fail the call as a whole.
    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        // The futures are built here, not in a closure of the stream, so the call stays `Send`.
        let requests: Vec<_> = batch.iter().map(|event| self.deliver(event)).collect();
        Ok(stream::iter(requests)
            .buffered(self.config.concurrency)
            .collect()
            .await)
    }
}
