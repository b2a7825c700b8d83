//! Configuration of the NATS JetStream sink (`[sink.nats]`).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::plugin::{
    parse_url_setting, read_setting_file, refuse_unknown_url_options, refuse_zero_durations,
};
use outboxkit_core::redact::redact_url_or_strip;
use outboxkit_core::{DestinationTemplate, Error, Result};
use serde::Deserialize;

use crate::subject;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.nats";

/// Configuration of [`NatsSink`](crate::NatsSink).
///
/// Every key has a default; unknown keys are errors. `Debug` never shows the URL's password,
/// the token or the nkey seed.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NatsConfig {
    /// `nats://[user:password@]host[:port]` or `tls://...`; several servers separated by commas.
    pub url: String,
    /// Destination template naming the subject; a row's `destination` overrides it.
    pub subject: String,
    /// Token authentication. Never logged.
    pub token: Option<String>,
    /// Nkey authentication: the user's nkey seed (`SU...`). Never logged.
    pub nkey: Option<String>,
    /// A `.creds` file (user JWT and nkey seed), as `nsc` writes it.
    pub credentials_file: Option<PathBuf>,
    /// TLS settings.
    pub tls: TlsConfig,
    /// How long connecting (TCP, TLS, `CONNECT`) may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long a publish waits for its `PubAck` (and a JetStream API request for its answer).
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Most events in one `publish` call (all in flight at once).
    pub max_batch_len: usize,
    /// Create the stream at start, or update it to these settings.
    pub declare_stream: Option<StreamDeclaration>,
    /// `raw` (the payload as the message's data, the event's fields and headers as NATS
    /// headers) or `cloudevents` (CloudEvents 1.0, binary content mode: `ce-*` headers).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
}

/// TLS settings (`[sink.nats.tls]`). The server certificate is verified against the system's
/// CA certificates, or, when `ca_file` is set, against that file's as well.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Refuse to talk to a server without TLS (implied by `tls://` URLs).
    pub required: bool,
    /// PEM file of CA certificates to trust.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate (chain) of a client certificate; needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
}

/// `[sink.nats.declare_stream]`: the stream the relay creates (or updates) at start.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamDeclaration {
    /// The stream's name (no `.`, `*`, `>`, spaces or path separators).
    pub name: String,
    /// The subjects it captures (wildcards allowed). Default: the subject template with every
    /// token holding a placeholder as `*` (`{aggregate_type}.{event_type}` → `*.*`). A list,
    /// or one string of comma-separated subjects (how an environment variable gives it).
    #[serde(default, deserialize_with = "list_or_commas")]
    pub subjects: Vec<String>,
    /// `file` or `memory`.
    #[serde(default)]
    pub storage: Storage,
    /// How long the server remembers a `Nats-Msg-Id` to drop a re-publish of it.
    #[serde(default = "default_duplicate_window", with = "humantime_serde")]
    pub duplicate_window: Duration,
    /// Largest message the stream accepts (bytes); larger events are parked as dead.
    #[serde(default)]
    pub max_msg_size: Option<i32>,
}

/// A list of strings, or one string of comma-separated items (environment variables are
/// strings: `OUTBOX_SINK__NATS__DECLARE_STREAM__SUBJECTS=orders.>,billing.>`).
fn list_or_commas<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Vec<String>, D::Error> {
    struct ListOrCommas;

    impl<'de> serde::de::Visitor<'de> for ListOrCommas {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of subjects, or one string of comma-separated subjects")
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> std::result::Result<Self::Value, E> {
            Ok(text
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect())
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut list = Vec::new();
            while let Some(subject) = seq.next_element::<String>()? {
                list.push(subject);
            }
            Ok(list)
        }
    }

    deserializer.deserialize_any(ListOrCommas)
}

fn default_duplicate_window() -> Duration {
    Duration::from_secs(120)
}

/// Where a declared stream keeps its messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    #[default]
    File,
    Memory,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: "nats://127.0.0.1:4222".to_owned(),
            subject: "{aggregate_type}.{event_type}".to_owned(),
            token: None,
            nkey: None,
            credentials_file: None,
            tls: TlsConfig::default(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            max_batch_len: 1000,
            declare_stream: None,
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
        }
    }
}

impl fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hidden = |s: &Option<String>| s.as_ref().map(|_| "***");
        f.debug_struct("NatsConfig")
            .field("url", &self.redacted_url())
            .field("subject", &self.subject)
            .field("token", &hidden(&self.token))
            .field("nkey", &hidden(&self.nkey))
            .field("credentials_file", &self.credentials_file)
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_batch_len", &self.max_batch_len)
            .field("declare_stream", &self.declare_stream)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .finish()
    }
}

impl NatsConfig {
    /// A configuration for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ..Self::default()
        }
    }

    /// The CloudEvents mapping (`None` with `format = "raw"`).
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// The URL(s) with every password replaced by `***`, fit for logs.
    pub fn redacted_url(&self) -> String {
        let servers: Vec<String> = self
            .url
            .split(',')
            .map(|raw| redact_url_or_strip(raw.trim()))
            .collect();
        servers.join(",")
    }

    /// The parsed subject template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.subject)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.subject")))
    }

    /// The servers of `url`, parsed; errors name the key and never show a password.
    pub fn servers(&self) -> Result<Vec<url::Url>> {
        let mut servers = Vec::new();
        let key = format!("{CONFIG_SECTION}.url");
        for raw in self.url.split(',').map(str::trim) {
            let server = parse_url_setting(
                &key,
                raw,
                &redact_url_or_strip(raw),
                &["nats", "tls"],
                " (expected nats://host:4222 or tls://host:4222, comma-separated)",
            )?;
            // async-nats reads nothing of the query.
            refuse_unknown_url_options(&key, &server, &[])?;
            servers.push(server);
        }
        Ok(servers)
    }

    /// Check every key; errors name the key (`sink.nats.url: ...`) and show no secret.
    pub fn validate(&self) -> Result<()> {
        self.cloudevents()?;
        self.servers()?;
        let template = self.template()?;
        if let Err(reason) = subject::check_template(&template) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.subject: `{}` {reason}",
                self.subject
            )));
        }
        let methods = [
            self.token.is_some(),
            self.nkey.is_some(),
            self.credentials_file.is_some(),
        ];
        if methods.iter().filter(|set| **set).count() > 1 {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.token, {CONFIG_SECTION}.nkey and {CONFIG_SECTION}.credentials_file \
                 are different ways to authenticate: set one of them"
            )));
        }
        if self.token.as_deref().is_some_and(str::is_empty) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.token: must not be empty"
            )));
        }
        if let Some(seed) = &self.nkey {
            if !seed.starts_with('S') || seed.len() < 50 {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.nkey: not an nkey seed (a seed starts with `S`, e.g. SUA...; \
                     the value is not shown)"
                )));
            }
        }
        if let Some(path) = &self.credentials_file {
            read_setting_file(CONFIG_SECTION, "credentials_file", path)?;
        }
        let tls = &self.tls;
        if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls.client_cert_file and {CONFIG_SECTION}.tls.client_key_file \
                 go together: set both or neither"
            )));
        }
        for (key, path) in [
            ("tls.ca_file", &tls.ca_file),
            ("tls.client_cert_file", &tls.client_cert_file),
            ("tls.client_key_file", &tls.client_key_file),
        ] {
            if let Some(path) = path {
                read_setting_file(CONFIG_SECTION, key, path)?;
            }
        }
        if self.max_batch_len == 0 || self.max_batch_len > 10_000 {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.max_batch_len: must be between 1 and 10000, got {}",
                self.max_batch_len
            )));
        }
        refuse_zero_durations(
            CONFIG_SECTION,
            &[
                ("connect_timeout", self.connect_timeout),
                ("request_timeout", self.request_timeout),
            ],
        )?;
        if let Some(stream) = &self.declare_stream {
            stream.validate()?;
        }
        Ok(())
    }

    /// Whether the connection uses TLS for sure (a `tls://` server, or `tls.required`).
    pub fn tls_required(&self) -> bool {
        self.tls.required
            || self
                .url
                .split(',')
                .any(|s| s.trim_start().starts_with("tls://"))
    }
}

impl StreamDeclaration {
    fn validate(&self) -> Result<()> {
        let key = format!("{CONFIG_SECTION}.declare_stream");
        let bad_name = self.name.is_empty()
            || self
                .name
                .chars()
                .any(|c| matches!(c, '.' | '*' | '>' | '/' | '\\') || c.is_whitespace());
        if bad_name {
            return Err(Error::config(format!(
                "{key}.name: `{}` is not a stream name (not empty; no `.`, `*`, `>`, `/`, `\\` \
                 or spaces)",
                self.name
            )));
        }
        for subject in &self.subjects {
            if let Err(reason) = subject::check_filter(subject) {
                return Err(Error::config(format!(
                    "{key}.subjects: `{subject}` {reason}"
                )));
            }
        }
        refuse_zero_durations(&key, &[("duplicate_window", self.duplicate_window)])?;
        if self.max_msg_size.is_some_and(|size| size < 1) {
            return Err(Error::config(format!(
                "{key}.max_msg_size: must be at least 1 (leave it out for the server's limit)"
            )));
        }
        Ok(())
    }
}

/// `kind = "nats"`, settings in `[sink.nats]`; `sink.destination` is the subject template.
impl outboxkit_core::SinkConfig for NatsConfig {
    const KIND: &'static str = crate::NatsSink::KIND;
    type Sink = crate::NatsSink;
    const DESTINATION_KEY: Option<&'static str> = Some("subject");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.subject
    }

    fn validate(&self) -> Result<()> {
        NatsConfig::validate(self)
    }

    /// No connection yet: `run` checks the sink (server, credentials, stream) right after.
    async fn build(self) -> Result<Self::Sink> {
        crate::NatsSink::connect_lazy(self)
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    const SEED: &str = "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY";

    #[test]
    fn defaults() {
        let config: NatsConfig = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, NatsConfig::default());
        assert_eq!(config.url, "nats://127.0.0.1:4222");
        assert_eq!(config.subject, "{aggregate_type}.{event_type}");
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert_eq!(config.max_batch_len, 1000);
        assert_eq!(config.declare_stream, None);
        config.validate().unwrap();
    }

    #[test]
    fn all_keys_and_human_durations() {
        let config: NatsConfig = from_json(serde_json::json!({
            "url": "nats://a:4222, nats://b:4223",
            "subject": "app.{aggregate_type}.{aggregate_id}",
            "nkey": SEED,
            "tls": { "required": true },
            "connect_timeout": "1500ms",
            "request_timeout": "1m",
            "max_batch_len": 200,
            "declare_stream": {
                "name": "OUTBOX",
                "subjects": ["app.>"],
                "storage": "memory",
                "duplicate_window": "10m",
                "max_msg_size": 65536,
            },
            "format": "cloudevents",
        }))
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.servers().unwrap().len(), 2);
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        let stream = config.declare_stream.as_ref().unwrap();
        assert_eq!(stream.storage, Storage::Memory);
        assert_eq!(stream.duplicate_window, Duration::from_secs(600));
        assert_eq!(stream.max_msg_size, Some(65536));
        assert!(config.tls_required());
        let stream: StreamDeclaration =
            serde_json::from_value(serde_json::json!({ "name": "S" })).unwrap();
        assert_eq!(stream.storage, Storage::File);
        assert_eq!(stream.duplicate_window, Duration::from_secs(120));
        assert!(stream.subjects.is_empty());
        // From an environment variable the subjects come as one comma-separated string.
        let stream: StreamDeclaration = serde_json::from_value(
            serde_json::json!({ "name": "S", "subjects": "orders.>, billing.>" }),
        )
        .unwrap();
        assert_eq!(stream.subjects, ["orders.>", "billing.>"]);
        let e = serde_json::from_value::<StreamDeclaration>(
            serde_json::json!({ "name": "S", "subjects": 5 }),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("expected a list of subjects, or one string of comma-separated subjects"),
            "{e}"
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = from_json::<NatsConfig>(serde_json::json!({ "stream": "x" })).unwrap_err();
        assert!(e.contains("unknown field `stream`"), "{e}");
        let e = from_json::<NatsConfig>(
            serde_json::json!({ "declare_stream": { "name": "S", "replicas": 3 } }),
        )
        .unwrap_err();
        assert!(e.contains("unknown field `replicas`"), "{e}");
    }

    #[test]
    fn secrets_never_show() {
        let config = NatsConfig {
            token: Some("t0ken-s3cr3t".into()),
            ..NatsConfig::new("nats://relay:pa55-s3cr3t@a:4222,nats://b:4222")
        };
        let debug = format!("{config:?}");
        for secret in ["t0ken-s3cr3t", "pa55-s3cr3t"] {
            assert!(!debug.contains(secret), "{debug}");
        }
        assert!(
            debug.contains("nats://relay:***@a:4222,nats://b:4222"),
            "{debug}"
        );
        assert!(debug.contains("token: Some(\"***\")"), "{debug}");
        let config = NatsConfig {
            nkey: Some(SEED.into()),
            ..NatsConfig::default()
        };
        assert!(!format!("{config:?}").contains(SEED));
        let config = NatsConfig {
            nkey: Some("SUshort-s3cr3t".into()),
            ..NatsConfig::default()
        };
        let e = config.validate().unwrap_err().to_string();
        assert!(e.starts_with("sink.nats.nkey: "), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let e = NatsConfig::new("http://relay:pa55-s3cr3t@a:4222")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(!e.contains("pa55-s3cr3t"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        fn stream(name: &str, subjects: &[&str]) -> Option<StreamDeclaration> {
            Some(StreamDeclaration {
                name: name.into(),
                subjects: subjects.iter().map(|s| s.to_string()).collect(),
                storage: Storage::File,
                duplicate_window: Duration::from_secs(1),
                max_msg_size: None,
            })
        }
        let errors = assert_refused(
            &NatsConfig::default(),
            &[
                ("url: unsupported scheme", |c| {
                    c.url = "http://a:4222".into()
                }),
                ("url: ", |c| c.url = "nats://a:4222,".into()),
                (
                    "url: unknown option `tls_required`, which would be ignored",
                    |c| c.url = "nats://a:4222,nats://b:4222?tls_required=true".into(),
                ),
                ("token, ", |c| {
                    c.token = Some("t".into());
                    c.nkey = Some(SEED.into());
                }),
                (
                    "credentials_file: cannot read `/nonexistent/relay.creds`",
                    |c| c.credentials_file = Some("/nonexistent/relay.creds".into()),
                ),
                ("tls.client_cert_file and", |c| {
                    c.tls.client_cert_file = Some("/etc/relay/client.pem".into())
                }),
                ("max_batch_len", |c| c.max_batch_len = 0),
                ("request_timeout", |c| c.request_timeout = Duration::ZERO),
                ("declare_stream.name: ", |c| {
                    c.declare_stream = stream("a.b", &[])
                }),
                ("declare_stream.subjects: ", |c| {
                    c.declare_stream = stream("S", &["a..b"])
                }),
            ],
        );
        assert!(errors[3].contains("set one of them"), "{}", errors[3]);
        for subject in [
            "{aggregate}",
            "orders..{event_type}",
            "a b.{event_type}",
            "orders.>",
        ] {
            let config = NatsConfig {
                subject: subject.into(),
                ..Default::default()
            };
            let e = config.validate().unwrap_err().to_string();
            assert!(e.starts_with("sink.nats.subject: "), "{subject}: {e}");
        }
        let config = NatsConfig {
            declare_stream: stream("S", &["a.*", "b.>"]),
            ..Default::default()
        };
        config.validate().unwrap();
    }
}
