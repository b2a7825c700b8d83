//! `[sink.webhook]`: the settings type, which is also the plugin (`SinkConfig`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use outboxkit_core::plugin::{parse_url_setting, refuse_zero_counts, refuse_zero_durations};
use outboxkit_core::{DestinationTemplate, Error, Result, SinkConfig};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use url::Url;

use crate::WebhookSink;

/// Header names the sink sets itself or HTTP/1.1 manages: neither `headers` nor an event's
/// headers may set them.
pub const RESERVED_HEADERS: &str = "content-type, content-length, idempotency-key, host, \
    transfer-encoding, connection, keep-alive, proxy-connection, te, trailer, upgrade, expect";

/// Whether `name` (lowercase, as a `HeaderName` is) is one of [`RESERVED_HEADERS`].
pub fn is_reserved(name: &HeaderName) -> bool {
    RESERVED_HEADERS.split(", ").any(|r| r == name.as_str())
}

/// `[sink.webhook]`. `url` is required, every other key has a default, unknown keys are
/// errors. `Debug` shows no URL password, no query value and no header value.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSinkConfig {
    /// Base URL (`http://` or `https://`, no placeholders); each event is POSTed to
    /// `<url>/<destination>`.
    pub url: String,
    /// Destination template appended to `url`; `[sink] destination` and a row's `destination`
    /// override it.
    #[serde(default = "default_path")]
    pub path: String,
    /// How long one request may take, answer included.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// How long opening a connection (TCP and TLS) may take.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Headers sent with every request (secrets through the environment:
    /// `OUTBOX_SINK__WEBHOOK__HEADERS__AUTHORIZATION`).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Requests in flight at once within one batch.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Most events in one `publish` call.
    #[serde(default = "default_max_batch_len")]
    pub max_batch_len: usize,
}

fn default_path() -> String {
    "{aggregate_type}".to_owned()
}
fn default_timeout() -> Duration {
    Duration::from_secs(10)
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_concurrency() -> usize {
    16
}
fn default_max_batch_len() -> usize {
    500
}

impl SinkConfig for WebhookSinkConfig {
    const KIND: &'static str = "webhook";
    type Sink = WebhookSink;

    fn destination_mut(&mut self) -> &mut String {
        &mut self.path
    }

    fn validate(&self) -> Result<()> {
        self.parts()?;
        refuse_zero_durations(
            "sink.webhook",
            &[
                ("timeout", self.timeout),
                ("connect_timeout", self.connect_timeout),
            ],
        )?;
        if !(1..=1024).contains(&self.concurrency) {
            return Err(Error::config(format!(
                "sink.webhook.concurrency: must be between 1 and 1024, got {}",
                self.concurrency
            )));
        }
        refuse_zero_counts("sink.webhook", &[("max_batch_len", self.max_batch_len)])
    }

    async fn build(self) -> Result<WebhookSink> {
        WebhookSink::new(self)
    }
}

impl WebhookSinkConfig {
    /// `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            path: default_path(),
            timeout: default_timeout(),
            connect_timeout: default_connect_timeout(),
            headers: BTreeMap::new(),
            concurrency: default_concurrency(),
            max_batch_len: default_max_batch_len(),
        }
    }

    /// The base URL, the destination template and the configured headers, parsed; errors name
    /// their key and never show a header value.
    pub(crate) fn parts(&self) -> Result<(Url, DestinationTemplate, HeaderMap)> {
        let err = |what: String| Err(Error::config(format!("sink.webhook.url: {what}")));
        if self.url.contains(['{', '}']) {
            return err(
                "contains a placeholder, but `url` is the fixed base URL: put the template \
                 into sink.webhook.path (e.g. path = \"{aggregate_type}\")"
                    .into(),
            );
        }
        let url = parse_url_setting(
            "sink.webhook.url",
            &self.url,
            &redact(&self.url),
            &["http", "https"],
            "",
        )?;
        let template =
            DestinationTemplate::parse(&self.path).map_err(|e| e.context("sink.webhook.path"))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let bad = |what: &str| Error::config(format!("sink.webhook.headers: `{name}` {what}"));
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad("is not a valid HTTP header name"))?;
            if is_reserved(&name) {
                return Err(bad(&format!(
                    "is set by the sink itself and cannot be configured (reserved: {})",
                    RESERVED_HEADERS
                )));
            }
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| bad("has a value that is not valid in HTTP (control characters?)"))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        Ok((url, template, headers))
    }
}

impl fmt::Debug for WebhookSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<_, _> = self.headers.keys().map(|name| (name, "***")).collect();
        f.debug_struct("WebhookSinkConfig")
            .field("url", &redact(&self.url))
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("headers", &headers)
            .field("concurrency", &self.concurrency)
            .field("max_batch_len", &self.max_batch_len)
            .finish()
    }
}

/// `raw` with its password and every query value replaced by `***` (webhook URLs often carry
/// a token in the query); what is not a URL loses its user info and query.
pub fn redact(raw: &str) -> String {
    let Ok(mut url) = Url::parse(raw) else {
        let without_query = raw.split(['?', '#']).next().unwrap_or_default();
        return outboxkit_core::redact::strip_userinfo(without_query);
    };
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    if url.query().is_some() {
        let keys: Vec<String> = url.query_pairs().map(|(k, _)| k.into_owned()).collect();
        url.query_pairs_mut()
            .clear()
            .extend_pairs(keys.iter().map(|k| (k, "***")));
    }
    url.set_fragment(None);
    url.to_string()
}
