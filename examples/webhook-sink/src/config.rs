//! Configuration of the webhook sink (`[sink.webhook]`).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use outboxkit_core::{DestinationTemplate, Error, Result};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use url::Url;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.webhook";

/// Header names the sink sets itself (or HTTP/1.1 manages): neither `headers` nor an event's
/// headers may set them.
pub const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "idempotency-key",
    "host",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Configuration of [`WebhookSink`](crate::WebhookSink), read from `[sink.webhook]`.
///
/// `url` is required; every other key has a default; unknown keys are errors. `Debug` never
/// shows a URL password, a query value or the value of a header that looks secret.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSinkConfig {
    /// Base URL, `http://` or `https://`, without placeholders: every event is POSTed to this
    /// URL with its destination (the rendered `path`) appended as path segments.
    pub url: String,
    /// Destination template appended to `url` (`{aggregate_type}` → `<url>/order`); a row's
    /// `destination` column and `[sink] destination` override it.
    #[serde(default = "default_path")]
    pub path: String,
    /// How long one request may take, response included.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// How long opening a connection (TCP and TLS) may take.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Extra headers sent with every request (`Authorization`...). Give secrets through the
    /// environment: `OUTBOX_SINK__WEBHOOK__HEADERS__AUTHORIZATION`.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Requests in flight at once within one batch.
    #[serde(default = "default_concurrency")]
    pub concurrency: usize,
    /// Most events in one `publish` call.
    #[serde(default = "default_max_batch_len")]
    pub max_batch_len: usize,
    /// Longest `Retry-After` the sink honours when the whole call was throttled (429/503);
    /// longer values are cut to this.
    #[serde(default = "default_max_retry_after", with = "humantime_serde")]
    pub max_retry_after: Duration,
    /// Payloads larger than this are parked as dead without a request; unset: no limit (the
    /// endpoint's `413` rejects them).
    #[serde(default)]
    pub max_payload_bytes: Option<usize>,
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
fn default_max_retry_after() -> Duration {
    Duration::from_secs(60)
}

impl fmt::Debug for WebhookSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: BTreeMap<&str, &str> = self
            .headers
            .iter()
            .map(|(name, value)| {
                let shown = if looks_secret(name) { "***" } else { value };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("WebhookSinkConfig")
            .field("url", &self.redacted_url())
            .field("path", &self.path)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("headers", &headers)
            .field("concurrency", &self.concurrency)
            .field("max_batch_len", &self.max_batch_len)
            .field("max_retry_after", &self.max_retry_after)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .finish()
    }
}

impl WebhookSinkConfig {
    /// A configuration for the base `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            path: default_path(),
            timeout: default_timeout(),
            connect_timeout: default_connect_timeout(),
            headers: BTreeMap::new(),
            concurrency: default_concurrency(),
            max_batch_len: default_max_batch_len(),
            max_retry_after: default_max_retry_after(),
            max_payload_bytes: None,
        }
    }

    /// The URL with its password and query values replaced by `***`, fit for logs.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Check every key; errors name the key (`sink.webhook.url: ...`).
    pub fn validate(&self) -> Result<()> {
        self.base_url()?;
        self.template()?;
        self.header_map()?;
        for (key, value) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.{key}: must be longer than 0s"
                )));
            }
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.concurrency: must be between 1 and 1024, got {}",
                self.concurrency
            )));
        }
        if self.max_batch_len == 0 {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.max_batch_len: must be at least 1"
            )));
        }
        if self.max_payload_bytes == Some(0) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.max_payload_bytes: must be at least 1 (leave it out for no limit)"
            )));
        }
        Ok(())
    }

    /// The parsed destination template (`path`).
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.path)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.path")))
    }

    /// The parsed base URL.
    pub fn base_url(&self) -> Result<Url> {
        let shown = self.redacted_url();
        if self.url.contains('{') || self.url.contains('}') {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.url: contains a placeholder, but `url` is the fixed base URL: \
                 put the template into {CONFIG_SECTION}.path \
                 (e.g. url = \"https://hooks.example.com/outbox\", path = \"{{aggregate_type}}\")"
            )));
        }
        let url = Url::parse(&self.url).map_err(|e| {
            Error::config(format!(
                "{CONFIG_SECTION}.url: `{shown}` is not a URL: {e} (expected e.g. https://hooks.example.com/outbox)"
            ))
        })?;
        match url.scheme() {
            "http" | "https" => {}
            other => {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.url: unsupported scheme `{other}://` (expected http:// or https://)"
                )))
            }
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.url: `{shown}` has no host"
            )));
        }
        if url.fragment().is_some() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.url: `{shown}` has a #fragment, which is never sent over HTTP; remove it"
            )));
        }
        Ok(url)
    }

    /// `host:port` of the URL, as named in connection errors.
    pub fn host_port(&self) -> String {
        match Url::parse(&self.url) {
            Ok(url) => {
                let host = url.host_str().unwrap_or("localhost");
                match url.port_or_known_default() {
                    Some(port) => format!("{host}:{port}"),
                    None => host.to_owned(),
                }
            }
            Err(_) => self.redacted_url(),
        }
    }

    /// `headers` as HTTP headers; a name that is not a valid header name, a reserved name or a
    /// value with control characters is an error naming the key (never showing the value).
    pub fn header_map(&self) -> Result<HeaderMap> {
        let mut map = HeaderMap::new();
        for (name, value) in &self.headers {
            // The message starts with the table's key (header names hold `-`), so the relay
            // can add where it was set.
            let key = format!("{CONFIG_SECTION}.headers: `{name}`");
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                Error::config(format!(
                    "{key} is not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)"
                ))
            })?;
            if RESERVED_HEADERS.contains(&header.as_str()) {
                return Err(Error::config(format!(
                    "{key} is set by the sink itself and cannot be configured (reserved: {})",
                    RESERVED_HEADERS.join(", ")
                )));
            }
            let mut value = HeaderValue::from_str(value).map_err(|_| {
                Error::config(format!(
                    "{key}: the value is not a valid HTTP header value (no control characters or line breaks)"
                ))
            })?;
            if looks_secret(name) {
                value.set_sensitive(true);
            }
            map.insert(header, value);
        }
        Ok(map)
    }
}

/// Whether a header (or query parameter) name suggests its value is a secret.
pub fn looks_secret(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    matches!(name.as_str(), "cookie" | "set-cookie")
        || [
            "auth",
            "token",
            "secret",
            "key",
            "password",
            "passwd",
            "signature",
            "credential",
            "session",
        ]
        .iter()
        .any(|word| name.contains(word))
}

/// Replace a URL's password and every query value by `***`; on unparsable input, drop the
/// user-info part and the query.
pub fn redact_url(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(url) => redact_parsed(&url),
        Err(_) => {
            let without_query = raw.split(['?', '#']).next().unwrap_or_default();
            match (without_query.find("://"), without_query.rfind('@')) {
                (Some(scheme_end), Some(at)) if at > scheme_end => format!(
                    "{}***@{}",
                    &without_query[..scheme_end + 3],
                    &without_query[at + 1..]
                ),
                (None, Some(at)) => format!("***@{}", &without_query[at + 1..]),
                _ => without_query.to_owned(),
            }
        }
    }
}

/// [`redact_url`] for a parsed URL.
pub fn redact_parsed(url: &Url) -> String {
    let mut url = url.clone();
    if url.password().is_some() {
        let _ = url.set_password(Some("***"));
    }
    if url.query().is_some() {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, _)| (k.into_owned(), "***".to_owned()))
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.set_fragment(None);
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json(value: serde_json::Value) -> std::result::Result<WebhookSinkConfig, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let config = from_json(serde_json::json!({ "url": "http://127.0.0.1:8080" })).unwrap();
        assert_eq!(config, WebhookSinkConfig::new("http://127.0.0.1:8080"));
        assert_eq!(config.path, "{aggregate_type}");
        assert_eq!(config.timeout, Duration::from_secs(10));
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert!(config.headers.is_empty());
        assert_eq!(config.concurrency, 16);
        assert_eq!(config.max_batch_len, 500);
        assert_eq!(config.max_retry_after, Duration::from_secs(60));
        assert_eq!(config.max_payload_bytes, None);
        config.validate().unwrap();
        assert_eq!(config.host_port(), "127.0.0.1:8080");
    }

    #[test]
    fn url_is_required_and_unknown_keys_are_errors() {
        let e = from_json(serde_json::json!({})).unwrap_err();
        assert!(e.contains("missing field `url`"), "{e}");
        let e = from_json(serde_json::json!({ "url": "http://h", "ulr": "x" })).unwrap_err();
        assert!(e.contains("unknown field `ulr`"), "{e}");
    }

    #[test]
    fn all_keys_and_human_durations() {
        let config = from_json(serde_json::json!({
            "url": "https://hooks.example.com/outbox",
            "path": "{aggregate_type}/{event_type}",
            "timeout": "2s",
            "connect_timeout": "500ms",
            "headers": { "Authorization": "Bearer t0k3n", "X-Tenant": "acme" },
            "concurrency": 4,
            "max_batch_len": 50,
            "max_retry_after": "5m",
            "max_payload_bytes": 1_048_576,
        }))
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.timeout, Duration::from_secs(2));
        assert_eq!(config.connect_timeout, Duration::from_millis(500));
        assert_eq!(config.max_retry_after, Duration::from_secs(300));
        assert_eq!(config.host_port(), "hooks.example.com:443");
        let headers = config.header_map().unwrap();
        assert_eq!(headers["authorization"], "Bearer t0k3n");
        assert!(headers["authorization"].is_sensitive());
        assert_eq!(headers["x-tenant"], "acme");
        assert!(!headers["x-tenant"].is_sensitive());
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let mut config =
            WebhookSinkConfig::new("https://relay:pa55w0rd@hooks.example.com/in?code=s3cr3t&v=2");
        config
            .headers
            .insert("Authorization".into(), "Bearer t0k3n".into());
        config.headers.insert("X-Api-Key".into(), "k3y".into());
        config.headers.insert("X-Tenant".into(), "acme".into());
        let debug = format!("{config:?}");
        for secret in ["pa55w0rd", "s3cr3t", "t0k3n", "k3y"] {
            assert!(!debug.contains(secret), "{secret} in {debug}");
        }
        assert!(
            debug.contains("https://relay:***@hooks.example.com/in?code=***&v=***"),
            "{debug}"
        );
        assert!(debug.contains("\"X-Tenant\": \"acme\""), "{debug}");
        assert_eq!(
            redact_url("not a url://u:s3cr3t@h/x?token=s3cr3t"),
            "not a url://***@h/x"
        );
        assert_eq!(
            redact_url("http://hooks.example.com/in"),
            "http://hooks.example.com/in"
        );
    }

    #[test]
    fn invalid_values_name_the_key() {
        let bad = |config: WebhookSinkConfig| config.validate().unwrap_err().to_string();
        let e = bad(WebhookSinkConfig::new("ftp://hooks.example.com"));
        assert!(
            e.starts_with("sink.webhook.url: unsupported scheme `ftp://`"),
            "{e}"
        );
        let e = bad(WebhookSinkConfig::new("hooks.example.com/in"));
        assert!(e.starts_with("sink.webhook.url: "), "{e}");
        let e = bad(WebhookSinkConfig::new("http://h/events/{aggregate_type}"));
        assert!(
            e.starts_with("sink.webhook.url: ") && e.contains("sink.webhook.path"),
            "{e}"
        );
        let e = bad(WebhookSinkConfig::new("http://h/in#part"));
        assert!(e.contains("#fragment"), "{e}");
        let e = bad(WebhookSinkConfig {
            path: "{aggregate}".into(),
            ..WebhookSinkConfig::new("http://h")
        });
        assert!(e.starts_with("sink.webhook.path: "), "{e}");
        let e = bad(WebhookSinkConfig {
            timeout: Duration::ZERO,
            ..WebhookSinkConfig::new("http://h")
        });
        assert!(e.starts_with("sink.webhook.timeout: "), "{e}");
        let e = bad(WebhookSinkConfig {
            concurrency: 0,
            ..WebhookSinkConfig::new("http://h")
        });
        assert!(e.starts_with("sink.webhook.concurrency: "), "{e}");
        let e = bad(WebhookSinkConfig {
            max_batch_len: 0,
            ..WebhookSinkConfig::new("http://h")
        });
        assert!(e.starts_with("sink.webhook.max_batch_len: "), "{e}");
        let e = bad(WebhookSinkConfig {
            max_payload_bytes: Some(0),
            ..WebhookSinkConfig::new("http://h")
        });
        assert!(e.starts_with("sink.webhook.max_payload_bytes: "), "{e}");
    }

    #[test]
    fn bad_headers_name_the_key_but_not_the_value() {
        let with_header = |name: &str, value: &str| {
            let mut config = WebhookSinkConfig::new("http://h");
            config.headers.insert(name.into(), value.into());
            config.validate().unwrap_err().to_string()
        };
        let e = with_header("Content-Type", "text/plain");
        assert!(
            e.starts_with("sink.webhook.headers: `Content-Type` is set by the sink itself"),
            "{e}"
        );
        let e = with_header("Idempotency-Key", "x");
        assert!(e.contains("reserved"), "{e}");
        let e = with_header("Bad Name", "x");
        assert!(
            e.starts_with("sink.webhook.headers: `Bad Name` is not a valid HTTP header name"),
            "{e}"
        );
        let e = with_header("Authorization", "Bearer s3cr3t\r\nX-Evil: 1");
        assert!(
            e.starts_with("sink.webhook.headers: `Authorization`: the value is not a valid"),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn secret_looking_names() {
        for name in [
            "Authorization",
            "Proxy-Authorization",
            "X-Api-Key",
            "X-Auth-Token",
            "Cookie",
            "X-Hub-Signature",
            "client_secret",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["X-Tenant", "User-Agent", "traceparent", "Accept"] {
            assert!(!looks_secret(name), "{name}");
        }
    }
}
