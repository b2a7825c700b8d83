//! Configuration of the Redis Streams sink (`[sink.redis_streams]`).

use std::fmt;
use std::time::Duration;

use outboxkit_core::{DestinationTemplate, Error, Result};
use serde::Deserialize;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.redis_streams";

/// Configuration of [`RedisStreamsSink`](crate::RedisStreamsSink).
///
/// Every key has a default; unknown keys are errors. `Debug` and
/// [`redacted_url`](Self::redacted_url) never show the password.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisStreamsConfig {
    /// `redis://[user][:password@]host[:port][/db]` (or `rediss://` for TLS).
    pub url: String,
    /// Destination template naming the stream; a row's `destination` overrides it.
    pub stream: String,
    /// When set, every `XADD` trims the stream to about this many entries (`MAXLEN ~ N`).
    pub maxlen: Option<u64>,
    /// How long connecting (TCP + handshake) may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one call (a `PING`, a whole pipelined batch) may take.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Most events in one `publish` call (one pipeline).
    pub max_batch_len: usize,
}

impl Default for RedisStreamsConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            stream: "{aggregate_type}".to_owned(),
            maxlen: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            max_batch_len: 1000,
        }
    }
}

impl fmt::Debug for RedisStreamsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsConfig")
            .field("url", &self.redacted_url())
            .field("stream", &self.stream)
            .field("maxlen", &self.maxlen)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_batch_len", &self.max_batch_len)
            .finish()
    }
}

impl RedisStreamsConfig {
    /// A configuration for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// The URL with its password replaced by `***`, fit for logs.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// `host:port` of the URL, as named in connection errors.
    pub fn host_port(&self) -> String {
        match url::Url::parse(&self.url) {
            Ok(url) => {
                let host = url.host_str().unwrap_or("localhost");
                let port = url.port().unwrap_or(6379);
                format!("{host}:{port}")
            }
            Err(_) => self.redacted_url(),
        }
    }

    /// Check every key; errors name the key (`sink.redis_streams.url: ...`).
    pub fn validate(&self) -> Result<()> {
        self.parse_url()?;
        self.template()?;
        if self.maxlen == Some(0) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.maxlen: must be at least 1 (leave it out to never trim)"
            )));
        }
        if self.max_batch_len == 0 {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.max_batch_len: must be at least 1"
            )));
        }
        for (key, value) in [
            ("connect_timeout", self.connect_timeout),
            ("response_timeout", self.response_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.{key}: must be longer than 0s"
                )));
            }
        }
        Ok(())
    }

    /// The parsed stream template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.stream)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.stream")))
    }

    pub(crate) fn parse_url(&self) -> Result<url::Url> {
        let url = url::Url::parse(&self.url).map_err(|e| {
            Error::config(format!(
                "{CONFIG_SECTION}.url: `{}` is not a URL: {e}",
                self.redacted_url()
            ))
        })?;
        match url.scheme() {
            "redis" | "rediss" => {}
            other => {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.url: unsupported scheme `{other}://` \
                     (expected redis:// or rediss://)"
                )))
            }
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.url: `{}` has no host",
                self.redacted_url()
            )));
        }
        Ok(url)
    }
}

/// Replace the password of a URL by `***`; on unparsable input, drop the whole user-info part.
fn redact_url(raw: &str) -> String {
    outboxkit_core::redact::redact_url(raw)
        .unwrap_or_else(|| outboxkit_core::redact::strip_userinfo(raw))
}

/// `kind = "redis-streams"`, settings in `[sink.redis_streams]`.
impl outboxkit_core::SinkConfig for RedisStreamsConfig {
    const KIND: &'static str = crate::RedisStreamsSink::KIND;
    type Sink = crate::RedisStreamsSink;

    fn destination_mut(&mut self) -> &mut String {
        &mut self.stream
    }

    fn validate(&self) -> Result<()> {
        RedisStreamsConfig::validate(self)
    }

    async fn build(self) -> Result<Self::Sink> {
        crate::RedisStreamsSink::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_json(value: serde_json::Value) -> std::result::Result<RedisStreamsConfig, String> {
        serde_json::from_value(value).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults() {
        let config = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, RedisStreamsConfig::default());
        assert_eq!(config.url, "redis://127.0.0.1:6379");
        assert_eq!(config.stream, "{aggregate_type}");
        assert_eq!(config.maxlen, None);
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.response_timeout, Duration::from_secs(10));
        assert_eq!(config.max_batch_len, 1000);
        config.validate().unwrap();
    }

    #[test]
    fn human_durations_and_all_keys() {
        let config = from_json(serde_json::json!({
            "url": "rediss://cache:6380/2",
            "stream": "app.{aggregate_type}",
            "maxlen": 100_000,
            "connect_timeout": "1500ms",
            "response_timeout": "1m",
            "max_batch_len": 200,
        }))
        .unwrap();
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.response_timeout, Duration::from_secs(60));
        assert_eq!(config.maxlen, Some(100_000));
        assert_eq!(config.max_batch_len, 200);
        config.validate().unwrap();
        assert_eq!(config.host_port(), "cache:6380");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = from_json(serde_json::json!({ "stream_name": "x" })).unwrap_err();
        assert!(e.contains("unknown field `stream_name`"), "{e}");
    }

    #[test]
    fn password_never_shows() {
        let config = RedisStreamsConfig::new("redis://relay:s3cr3t@cache:6379/0");
        assert_eq!(config.redacted_url(), "redis://relay:***@cache:6379/0");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("redis://relay:***@cache:6379/0"), "{debug}");
        let config = RedisStreamsConfig::new("redis://:s3cr3t@cache");
        assert!(!config.redacted_url().contains("s3cr3t"));
        let config = RedisStreamsConfig::new("not a url:s3cr3t@cache");
        assert!(!config.redacted_url().contains("s3cr3t"));
        let config = RedisStreamsConfig::new("redis://cache:6379");
        assert_eq!(config.redacted_url(), "redis://cache:6379");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let bad = |config: RedisStreamsConfig| config.validate().unwrap_err().to_string();
        let e = bad(RedisStreamsConfig::new("http://cache:6379"));
        assert!(
            e.starts_with("sink.redis_streams.url: unsupported scheme"),
            "{e}"
        );
        let e = bad(RedisStreamsConfig::new("cache:6379"));
        assert!(e.starts_with("sink.redis_streams.url"), "{e}");
        let e = bad(RedisStreamsConfig {
            stream: "{aggregate}".into(),
            ..Default::default()
        });
        assert!(e.starts_with("sink.redis_streams.stream: "), "{e}");
        let e = bad(RedisStreamsConfig {
            maxlen: Some(0),
            ..Default::default()
        });
        assert!(e.starts_with("sink.redis_streams.maxlen"), "{e}");
        let e = bad(RedisStreamsConfig {
            max_batch_len: 0,
            ..Default::default()
        });
        assert!(e.starts_with("sink.redis_streams.max_batch_len"), "{e}");
        let e = bad(RedisStreamsConfig {
            response_timeout: Duration::ZERO,
            ..Default::default()
        });
        assert!(e.starts_with("sink.redis_streams.response_timeout"), "{e}");
    }
}
