//! Configuration of the Redis Streams sink (`[sink.redis_streams]`).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::plugin::{
    parse_url_setting, read_setting_file, refuse_unknown_url_options, refuse_zero_counts,
    refuse_zero_durations,
};
use outboxkit_core::redact::redact_url_or_strip;
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
    /// Password for `AUTH`; overrides the URL's. Never logged.
    pub password: Option<String>,
    /// Destination template naming the stream; a row's `destination` overrides it.
    pub stream: String,
    /// When set, every `XADD` trims the stream to about this many entries (`MAXLEN ~ N`).
    pub maxlen: Option<u64>,
    /// When set, every `XADD` drops the entries Redis added longer ago than this, about
    /// (`MINID ~ <now - max_age>`; Redis 6.2 or later). Not with `maxlen`.
    #[serde(with = "humantime_serde")]
    pub max_age: Option<Duration>,
    /// How long connecting (TCP + handshake) may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one call (a `PING`, a whole pipelined batch) may take.
    #[serde(with = "humantime_serde")]
    pub response_timeout: Duration,
    /// Most events in one `publish` call (one pipeline).
    pub max_batch_len: usize,
    /// TLS settings for `rediss://` URLs.
    pub tls: TlsConfig,
    /// `raw` (the payload and the event's fields as the entry's fields) or `cloudevents`
    /// (CloudEvents 1.0 JSON event format, structured content mode, in the `payload` field).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
}

/// TLS settings (`[sink.redis_streams.tls]`), for `rediss://` URLs only. The server certificate
/// is verified against the system's CA certificates, or, when `ca_file` is set, against the
/// CAs of that file only (instead of the system's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file of the CA certificates to trust instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate (chain) of a client certificate; needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file` (PKCS#8, PKCS#1 or SEC1).
    pub client_key_file: Option<PathBuf>,
}

impl TlsConfig {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for RedisStreamsConfig {
    fn default() -> Self {
        Self {
            url: "redis://127.0.0.1:6379".to_owned(),
            password: None,
            stream: "{aggregate_type}".to_owned(),
            maxlen: None,
            max_age: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(10),
            max_batch_len: 1000,
            tls: TlsConfig::default(),
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
        }
    }
}

impl fmt::Debug for RedisStreamsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsConfig")
            .field("url", &self.redacted_url())
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("stream", &self.stream)
            .field("maxlen", &self.maxlen)
            .field("max_age", &self.max_age)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("max_batch_len", &self.max_batch_len)
            .field("tls", &self.tls)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .finish()
    }
}

impl RedisStreamsConfig {
    /// The CloudEvents mapping (`None` with `format = "raw"`); a `cloudevents_source` that is
    /// not a URI-reference is refused naming `sink.redis_streams.cloudevents_source`.
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// A configuration for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// The URL with its password replaced by `***`, fit for logs.
    pub fn redacted_url(&self) -> String {
        redact_url_or_strip(&self.url)
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
        self.cloudevents()?;
        let url = self.parse_url()?;
        self.validate_tls(&url)?;
        self.template()?;
        if self.maxlen == Some(0) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.maxlen: must be at least 1 (leave it out to never trim)"
            )));
        }
        match self.max_age {
            Some(age) if age < Duration::from_millis(1) => {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.max_age: must be at least 1ms (leave it out to never trim)"
                )));
            }
            Some(_) if self.maxlen.is_some() => {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.max_age and {CONFIG_SECTION}.maxlen: set one or neither \
                     (an XADD trims by entries or by age, not both)"
                )));
            }
            _ => {}
        }
        refuse_zero_counts(CONFIG_SECTION, &[("max_batch_len", self.max_batch_len)])?;
        refuse_zero_durations(
            CONFIG_SECTION,
            &[
                ("connect_timeout", self.connect_timeout),
                ("response_timeout", self.response_timeout),
            ],
        )?;
        Ok(())
    }

    fn validate_tls(&self, url: &url::Url) -> Result<()> {
        let tls = &self.tls;
        if !tls.is_empty() && url.scheme() != "rediss" {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls: TLS settings are only used with rediss:// URLs, and \
                 {CONFIG_SECTION}.url is `{}`: use rediss:// in {CONFIG_SECTION}.url or remove \
                 {CONFIG_SECTION}.tls",
                self.redacted_url()
            )));
        }
        if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls.client_cert_file and {CONFIG_SECTION}.tls.client_key_file \
                 go together: set both or neither"
            )));
        }
        Ok(())
    }

    /// The certificates read from the files named under `tls` (`None` for a `redis://` URL);
    /// errors name the key and the file.
    pub fn tls_certificates(&self) -> Result<Option<redis::TlsCertificates>> {
        if self.parse_url()?.scheme() != "rediss" {
            return Ok(None);
        }
        let tls = &self.tls;
        let root_cert = match &tls.ca_file {
            Some(path) => {
                let pem = read_setting_file(CONFIG_SECTION, "tls.ca_file", path)?;
                if !pem
                    .windows(PEM_CERTIFICATE.len())
                    .any(|w| w == PEM_CERTIFICATE.as_bytes())
                {
                    return Err(Error::config(format!(
                        "{CONFIG_SECTION}.tls.ca_file: `{}` holds no PEM certificate",
                        path.display()
                    )));
                }
                Some(pem)
            }
            None => None,
        };
        let client_tls = match (&tls.client_cert_file, &tls.client_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read_setting_file(CONFIG_SECTION, "tls.client_cert_file", cert)?,
                client_key: read_setting_file(CONFIG_SECTION, "tls.client_key_file", key)?,
            }),
            _ => None,
        };
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// The parsed stream template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.stream)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.stream")))
    }

    pub(crate) fn parse_url(&self) -> Result<url::Url> {
        let key = format!("{CONFIG_SECTION}.url");
        let url = parse_url_setting(
            &key,
            &self.url,
            &self.redacted_url(),
            &["redis", "rediss"],
            "",
        )?;
        // What redis-rs reads of the query; it ignores any other.
        refuse_unknown_url_options(&key, &url, &["protocol", "db", "user", "pass"])?;
        Ok(url)
    }
}

const PEM_CERTIFICATE: &str = "-----BEGIN CERTIFICATE-----";

/// `kind = "redis-streams"`, settings in `[sink.redis_streams]`.
impl outboxkit_core::SinkConfig for RedisStreamsConfig {
    const KIND: &'static str = crate::RedisStreamsSink::KIND;
    type Sink = crate::RedisStreamsSink;
    const DESTINATION_KEY: Option<&'static str> = Some("stream");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.stream
    }

    fn validate(&self) -> Result<()> {
        RedisStreamsConfig::validate(self).and_then(|()| self.tls_certificates().map(drop))
    }

    async fn build(self) -> Result<Self::Sink> {
        crate::RedisStreamsSink::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    #[test]
    fn defaults() {
        let config: RedisStreamsConfig = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, RedisStreamsConfig::default());
        assert_eq!(config.url, "redis://127.0.0.1:6379");
        assert_eq!(config.stream, "{aggregate_type}");
        assert_eq!(config.maxlen, None);
        assert_eq!(config.max_age, None);
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.response_timeout, Duration::from_secs(10));
        assert_eq!(config.max_batch_len, 1000);
        config.validate().unwrap();
    }

    #[test]
    fn human_durations_and_all_keys() {
        let config: RedisStreamsConfig = from_json(serde_json::json!({
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
        let config: RedisStreamsConfig =
            from_json(serde_json::json!({ "max_age": "7days 12h" })).unwrap();
        assert_eq!(
            config.max_age,
            Some(Duration::from_secs(7 * 86_400 + 12 * 3_600))
        );
        config.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e =
            from_json::<RedisStreamsConfig>(serde_json::json!({ "stream_name": "x" })).unwrap_err();
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
        assert_refused(
            &RedisStreamsConfig::default(),
            &[
                ("url: unsupported scheme", |c| {
                    c.url = "http://cache:6379".into()
                }),
                ("url", |c| c.url = "cache:6379".into()),
                (
                    "url: unknown option `protocl`: did you mean `protocol`?",
                    |c| c.url = "redis://cache:6379/?protocl=resp3".into(),
                ),
                ("stream: ", |c| c.stream = "{aggregate}".into()),
                ("maxlen", |c| c.maxlen = Some(0)),
                ("max_age: must be at least 1ms", |c| {
                    c.max_age = Some(Duration::from_micros(999))
                }),
                (
                    "max_age and sink.redis_streams.maxlen: set one or neither",
                    |c| {
                        c.max_age = Some(Duration::from_secs(60));
                        c.maxlen = Some(1000);
                    },
                ),
                ("max_batch_len", |c| c.max_batch_len = 0),
                ("response_timeout", |c| c.response_timeout = Duration::ZERO),
            ],
        );
    }

    #[test]
    fn tls_and_password_keys() {
        let config: RedisStreamsConfig = from_json(serde_json::json!({
            "url": "rediss://relay@cache:6380",
            "password": "s3cr3t",
            "tls": {
                "ca_file": "/etc/relay/ca.pem",
                "client_cert_file": "/etc/relay/client.pem",
                "client_key_file": "/etc/relay/client.key",
            },
        }))
        .unwrap();
        assert_eq!(config.password.as_deref(), Some("s3cr3t"));
        assert_eq!(config.tls.ca_file, Some(PathBuf::from("/etc/relay/ca.pem")));
        assert_eq!(
            config.tls.client_key_file,
            Some(PathBuf::from("/etc/relay/client.key"))
        );
        config.validate().unwrap();
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("password: Some(\"***\")"), "{debug}");
        assert!(debug.contains("/etc/relay/ca.pem"), "{debug}");
        let e = from_json::<RedisStreamsConfig>(serde_json::json!({ "tls": { "verify": false } }))
            .unwrap_err();
        assert!(e.contains("unknown field `verify`"), "{e}");
    }

    #[test]
    fn tls_settings_are_checked() {
        let with = |url: &str, tls: TlsConfig| {
            RedisStreamsConfig {
                tls,
                ..RedisStreamsConfig::new(url)
            }
            .validate()
            .map_err(|e| e.to_string())
        };
        let ca = TlsConfig {
            ca_file: Some("/etc/relay/ca.pem".into()),
            ..TlsConfig::default()
        };
        let e = with("redis://:pw@cache", ca.clone()).unwrap_err();
        assert!(e.starts_with("sink.redis_streams.tls: "), "{e}");
        assert!(e.contains("sink.redis_streams.url"), "{e}");
        assert!(e.contains("`redis://:***@cache`"), "{e}");
        with("rediss://cache", ca).unwrap();
        let e = with(
            "rediss://cache",
            TlsConfig {
                client_cert_file: Some("/etc/relay/client.pem".into()),
                ..TlsConfig::default()
            },
        )
        .unwrap_err();
        assert!(
            e.starts_with(
                "sink.redis_streams.tls.client_cert_file and sink.redis_streams.tls.client_key_file"
            ),
            "{e}"
        );
    }

    #[test]
    fn tls_files_are_read_and_errors_name_the_key() {
        let dir = std::env::temp_dir().join(format!("outbox-redis-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let pem = dir.join("ca.pem");
        std::fs::write(
            &pem,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let config = |tls: TlsConfig| RedisStreamsConfig {
            tls,
            ..RedisStreamsConfig::new("rediss://cache")
        };
        let e = config(TlsConfig {
            ca_file: Some(dir.join("missing.pem")),
            ..TlsConfig::default()
        })
        .tls_certificates()
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("sink.redis_streams.tls.ca_file: cannot read"),
            "{e}"
        );
        assert!(e.contains("missing.pem"), "{e}");
        let e = config(TlsConfig {
            ca_file: Some(not_pem.clone()),
            ..TlsConfig::default()
        })
        .tls_certificates()
        .unwrap_err()
        .to_string();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        let e = config(TlsConfig {
            ca_file: Some(pem.clone()),
            client_cert_file: Some(pem.clone()),
            client_key_file: Some(dir.join("missing.key")),
        })
        .tls_certificates()
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("sink.redis_streams.tls.client_key_file: cannot read"),
            "{e}"
        );
        let certificates = config(TlsConfig {
            ca_file: Some(pem.clone()),
            ..TlsConfig::default()
        })
        .tls_certificates()
        .unwrap()
        .expect("rediss:// has certificates");
        assert!(certificates.root_cert.is_some() && certificates.client_tls.is_none());
        assert!(RedisStreamsConfig::new("redis://cache")
            .tls_certificates()
            .unwrap()
            .is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
