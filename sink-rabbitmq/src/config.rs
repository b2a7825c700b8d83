//! Configuration of the RabbitMQ sink (`[sink.rabbitmq]`).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::ExchangeKind;
use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::plugin::{
    parse_url_setting, read_setting_file, refuse_unknown_url_options, refuse_zero_counts,
    refuse_zero_durations,
};
use outboxkit_core::redact::redact_url_or_strip;
use outboxkit_core::{DestinationTemplate, Error, Result};
use serde::Deserialize;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.rabbitmq";

/// AMQP short strings (exchange names, routing keys, header names, `message_id`, `type`) are
/// at most 255 bytes long.
pub const MAX_SHORT_STRING_BYTES: usize = 255;

/// What happens to a message RabbitMQ returns as unroutable (`basic.return`, only with
/// `mandatory = true`): no queue is bound for its routing key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnroutablePolicy {
    /// Retry with the relay's backoff (a binding may be added meanwhile); after
    /// `relay.max_attempts` failed attempts the event is parked as dead with the error.
    #[default]
    Retry,
    /// Park the event as dead at once, with the error.
    Reject,
}

/// Configuration of [`RabbitMqSink`](crate::RabbitMqSink).
///
/// Every key has a default; unknown keys are errors. `Debug` and
/// [`redacted_url`](Self::redacted_url) never show the password.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RabbitMqConfig {
    /// `amqp://[user[:password]@]host[:port][/vhost][?heartbeat=..&frame_max=..]` or
    /// `amqps://...` (TLS). Without user info: `guest`/`guest`. The vhost is URL-encoded
    /// (`%2f` is `/`, the default).
    pub url: String,
    /// The password, replacing the URL's (which may then leave it out); the URL's user stays,
    /// and a URL without a user logs in as `guest` (lapin's default). Never logged; usually
    /// given as `password_file` (read by the relay at start).
    pub password: Option<String>,
    /// The exchange every event is published to; `""` is the default exchange (routing key =
    /// queue name).
    pub exchange: String,
    /// Destination template giving the routing key; a row's `destination` overrides it.
    pub routing_key: String,
    /// Publish with the `mandatory` flag: a message no queue takes is returned by the broker
    /// and counts as a failure (see `unroutable`) instead of being dropped silently.
    pub mandatory: bool,
    /// What an unroutable (returned) message becomes: `"retry"` or `"reject"`.
    pub unroutable: UnroutablePolicy,
    /// Declare the exchange (`exchange_type`, `exchange_durable`) on every (re)connection.
    pub declare_exchange: bool,
    /// `topic`, `direct`, `fanout`, `headers` or a plugin's type (`x-...`), when declaring.
    pub exchange_type: String,
    /// Whether the declared exchange survives a broker restart.
    pub exchange_durable: bool,
    /// The connection's name in the management UI and `rabbitmqctl list_connections`.
    pub connection_name: String,
    /// How long connecting (TCP, TLS, AMQP handshake, channel, declarations) may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one `publish` call (every message written and confirmed) may take.
    #[serde(with = "humantime_serde")]
    pub confirm_timeout: Duration,
    /// Most events in one `publish` call.
    pub max_batch_len: usize,
    /// Largest payload sent; larger events are parked as dead without a broker call. Keep it
    /// at or below the broker's `max_message_size` (16 MiB by default since RabbitMQ 4.0,
    /// 128 MiB before).
    pub max_message_bytes: usize,
    /// TLS settings for `amqps://` URLs.
    pub tls: TlsConfig,
    /// `raw` (the payload as the body, the event's fields as properties and headers) or
    /// `cloudevents` (CloudEvents 1.0, AMQP protocol binding, binary content mode).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
}

/// TLS settings (`[sink.rabbitmq.tls]`), for `amqps://` URLs only. The server certificate is
/// verified against the system's trust store plus `ca_file`.
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM file of CA certificates to trust in addition to the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate (chain) of a client certificate; needs `client_key_file`.
    pub client_cert_file: Option<PathBuf>,
    /// PEM PKCS#8 private key of `client_cert_file`.
    pub client_key_file: Option<PathBuf>,
    /// PKCS#12 (DER) file holding a client certificate and its key, instead of the PEM pair.
    pub pkcs12_file: Option<PathBuf>,
    /// Password of `pkcs12_file`. Never logged.
    pub pkcs12_password: Option<String>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_file", &self.ca_file)
            .field("client_cert_file", &self.client_cert_file)
            .field("client_key_file", &self.client_key_file)
            .field("pkcs12_file", &self.pkcs12_file)
            .field(
                "pkcs12_password",
                &self.pkcs12_password.as_ref().map(|_| "***"),
            )
            .finish()
    }
}

impl TlsConfig {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl Default for RabbitMqConfig {
    fn default() -> Self {
        Self {
            url: "amqp://127.0.0.1:5672/%2f".to_owned(),
            password: None,
            exchange: String::new(),
            routing_key: "{aggregate_type}.{event_type}".to_owned(),
            mandatory: true,
            unroutable: UnroutablePolicy::Retry,
            declare_exchange: false,
            exchange_type: "topic".to_owned(),
            exchange_durable: true,
            connection_name: "outbox-relay".to_owned(),
            connect_timeout: Duration::from_secs(10),
            confirm_timeout: Duration::from_secs(30),
            max_batch_len: 1000,
            max_message_bytes: 16 * 1024 * 1024,
            tls: TlsConfig::default(),
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
        }
    }
}

impl fmt::Debug for RabbitMqConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqConfig")
            .field("url", &self.redacted_url())
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key)
            .field("mandatory", &self.mandatory)
            .field("unroutable", &self.unroutable)
            .field("declare_exchange", &self.declare_exchange)
            .field("exchange_type", &self.exchange_type)
            .field("exchange_durable", &self.exchange_durable)
            .field("connection_name", &self.connection_name)
            .field("connect_timeout", &self.connect_timeout)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("max_batch_len", &self.max_batch_len)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("tls", &self.tls)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .finish()
    }
}

impl RabbitMqConfig {
    /// The CloudEvents mapping (`None` with `format = "raw"`); a `cloudevents_source` that is
    /// not a URI-reference is refused naming `sink.rabbitmq.cloudevents_source`.
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// A configuration for `url` and `exchange` with every other key at its default.
    pub fn new(url: impl Into<String>, exchange: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            exchange: exchange.into(),
            ..Self::default()
        }
    }

    /// The URL with its password replaced by `***`, fit for logs.
    pub fn redacted_url(&self) -> String {
        redact_url_or_strip(&self.url)
    }

    /// The keys the login comes from, for error messages: `sink.rabbitmq.url`, and
    /// `sink.rabbitmq.password` when that is set.
    pub fn credential_keys(&self) -> String {
        if self.password.is_some() {
            format!("{CONFIG_SECTION}.url, {CONFIG_SECTION}.password")
        } else {
            format!("{CONFIG_SECTION}.url")
        }
    }

    /// `host:port` of the URL, as named in connection errors.
    pub fn host_port(&self) -> String {
        match self.amqp_uri() {
            Ok(uri) => {
                let host = &uri.authority.host;
                if host.contains(':') {
                    format!("[{host}]:{}", uri.authority.port)
                } else {
                    format!("{host}:{}", uri.authority.port)
                }
            }
            Err(_) => self.redacted_url(),
        }
    }

    /// The exchange as people read it: `"orders"`, or `(default exchange)` for `""`.
    pub fn exchange_display(&self) -> String {
        if self.exchange.is_empty() {
            "(AMQP default exchange)".to_owned()
        } else {
            format!("`{}`", self.exchange)
        }
    }

    /// Check every key without touching the network or the file system; errors name the key
    /// (`sink.rabbitmq.url: ...`).
    pub fn validate(&self) -> Result<()> {
        self.cloudevents()?;
        let uri = self.amqp_uri()?;
        if self.password.as_deref() == Some("") {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.password: must not be empty (RabbitMQ refuses blank \
                 passwords); leave it out to use the password of {CONFIG_SECTION}.url"
            )));
        }
        self.template()?;
        if self.exchange.len() > MAX_SHORT_STRING_BYTES {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.exchange: at most {MAX_SHORT_STRING_BYTES} bytes, got {}",
                self.exchange.len()
            )));
        }
        if self.declare_exchange {
            if self.exchange.is_empty() {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.declare_exchange: the default exchange (exchange = \"\") \
                     cannot be declared; set {CONFIG_SECTION}.exchange or turn declare_exchange off"
                )));
            }
            if self.exchange.starts_with("amq.") {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.declare_exchange: `{}` is a reserved name (amq.*), which \
                     only the broker declares; turn declare_exchange off to use it",
                    self.exchange
                )));
            }
            if self.exchange_type.trim().is_empty() {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.exchange_type: must not be empty \
                     (topic, direct, fanout, headers or a plugin's type)"
                )));
            }
        }
        if self.connection_name.len() > 1024 {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.connection_name: at most 1024 bytes"
            )));
        }
        refuse_zero_counts(
            CONFIG_SECTION,
            &[
                ("max_batch_len", self.max_batch_len),
                ("max_message_bytes", self.max_message_bytes),
            ],
        )?;
        refuse_zero_durations(
            CONFIG_SECTION,
            &[
                ("connect_timeout", self.connect_timeout),
                ("confirm_timeout", self.confirm_timeout),
            ],
        )?;
        self.validate_tls(&uri)
    }

    fn validate_tls(&self, uri: &AMQPUri) -> Result<()> {
        let tls = &self.tls;
        if tls.is_empty() {
            return Ok(());
        }
        if uri.scheme != AMQPScheme::AMQPS {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls: TLS settings are only used with amqps:// URLs, \
                 but {CONFIG_SECTION}.url is `{}`",
                self.redacted_url()
            )));
        }
        if tls.client_cert_file.is_some() != tls.client_key_file.is_some() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls.client_cert_file and {CONFIG_SECTION}.tls.client_key_file \
                 go together: set both or neither"
            )));
        }
        if tls.client_cert_file.is_some() && tls.pkcs12_file.is_some() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls.pkcs12_file: give the client identity either as a PEM pair \
                 (client_cert_file, client_key_file) or as a PKCS#12 file, not both"
            )));
        }
        if tls.pkcs12_password.is_some() && tls.pkcs12_file.is_none() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.tls.pkcs12_password: set without {CONFIG_SECTION}.tls.pkcs12_file"
            )));
        }
        Ok(())
    }

    /// The parsed routing key template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.routing_key)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.routing_key")))
    }

    /// The exchange type to declare.
    pub fn exchange_kind(&self) -> ExchangeKind {
        match self.exchange_type.trim().to_ascii_lowercase().as_str() {
            "topic" => ExchangeKind::Topic,
            "direct" => ExchangeKind::Direct,
            "fanout" => ExchangeKind::Fanout,
            "headers" => ExchangeKind::Headers,
            _ => ExchangeKind::Custom(self.exchange_type.trim().to_owned()),
        }
    }

    /// The URL parsed for lapin. The host is taken from the URL as written (IP addresses
    /// included); `password`, when set, replaces the URL's. The password is kept but never
    /// printed.
    pub(crate) fn amqp_uri(&self) -> Result<AMQPUri> {
        let url = parse_url_setting(
            &format!("{CONFIG_SECTION}.url"),
            &self.url,
            &self.redacted_url(),
            &["amqp", "amqps"],
            " (expected amqp://user:password@host:5672/vhost)",
        )?;
        // What lapin reads of the query; it ignores any other.
        refuse_unknown_url_options(
            &format!("{CONFIG_SECTION}.url"),
            &url,
            &[
                "heartbeat",
                "frame_max",
                "channel_max",
                "connection_timeout",
                "auth_mechanism",
            ],
        )?;
        // The host as lapin takes it: an IPv6 address without its brackets.
        let host = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            _ => url.host_str().unwrap_or_default().to_owned(),
        };
        let mut uri: AMQPUri = self.url.parse().map_err(|e: String| {
            // lapin's message may quote the URL: never show it, password and all.
            let reason = if e.contains(&self.url) {
                "invalid query parameter or encoding".to_owned()
            } else {
                e
            };
            Error::config(format!(
                "{CONFIG_SECTION}.url: `{}`: {reason} (query parameters: heartbeat, frame_max, \
                 channel_max, connection_timeout, auth_mechanism)",
                self.redacted_url()
            ))
        })?;
        uri.authority.host = host;
        if let Some(password) = &self.password {
            uri.authority.userinfo.password.clone_from(password);
        }
        Ok(uri)
    }

    /// TLS material read from the files named under `tls`; errors name the key and file.
    pub fn tls_config(&self) -> Result<OwnedTLSConfig> {
        let tls = &self.tls;
        let mut out = OwnedTLSConfig::default();
        if let Some(path) = &tls.ca_file {
            let pem = read_setting_file(CONFIG_SECTION, "tls.ca_file", path)?;
            let pem = String::from_utf8(pem).map_err(|_| {
                Error::config(format!(
                    "{CONFIG_SECTION}.tls.ca_file: `{}` is not a PEM (text) file",
                    path.display()
                ))
            })?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.tls.ca_file: `{}` holds no PEM certificate",
                    path.display()
                )));
            }
            out.cert_chain = Some(pem);
        }
        if let (Some(cert), Some(key)) = (&tls.client_cert_file, &tls.client_key_file) {
            out.identity = Some(OwnedIdentity::PKCS8 {
                pem: read_setting_file(CONFIG_SECTION, "tls.client_cert_file", cert)?,
                key: read_setting_file(CONFIG_SECTION, "tls.client_key_file", key)?,
            });
        }
        if let Some(path) = &tls.pkcs12_file {
            out.identity = Some(OwnedIdentity::PKCS12 {
                der: read_setting_file(CONFIG_SECTION, "tls.pkcs12_file", path)?,
                password: tls.pkcs12_password.clone().unwrap_or_default(),
            });
        }
        Ok(out)
    }
}

/// `kind = "rabbitmq"`, settings in `[sink.rabbitmq]`; `sink.destination` is the routing key
/// template.
impl outboxkit_core::SinkConfig for RabbitMqConfig {
    const KIND: &'static str = crate::RabbitMqSink::KIND;
    type Sink = crate::RabbitMqSink;
    const DESTINATION_KEY: Option<&'static str> = Some("routing_key");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.routing_key
    }

    fn validate(&self) -> Result<()> {
        RabbitMqConfig::validate(self).and_then(|()| self.tls_config().map(drop))
    }

    async fn build(self) -> Result<Self::Sink> {
        crate::RabbitMqSink::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    #[test]
    fn defaults() {
        let config: RabbitMqConfig = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, RabbitMqConfig::default());
        assert_eq!(config.url, "amqp://127.0.0.1:5672/%2f");
        assert_eq!(config.password, None);
        assert_eq!(config.exchange, "");
        assert_eq!(config.routing_key, "{aggregate_type}.{event_type}");
        assert!(config.mandatory);
        assert_eq!(config.unroutable, UnroutablePolicy::Retry);
        assert!(!config.declare_exchange);
        assert_eq!(config.exchange_type, "topic");
        assert!(config.exchange_durable);
        assert_eq!(config.connection_name, "outbox-relay");
        assert_eq!(config.connect_timeout, Duration::from_secs(10));
        assert_eq!(config.confirm_timeout, Duration::from_secs(30));
        assert_eq!(config.max_batch_len, 1000);
        assert_eq!(config.max_message_bytes, 16 * 1024 * 1024);
        assert_eq!(config.tls, TlsConfig::default());
        config.validate().unwrap();
        let uri = config.amqp_uri().unwrap();
        assert_eq!(uri.authority.host, "127.0.0.1");
        assert_eq!(uri.authority.port, 5672);
        assert_eq!(uri.vhost, "/");
        assert_eq!(uri.authority.userinfo.username, "guest");
    }

    #[test]
    fn human_durations_and_all_keys() {
        let config: RabbitMqConfig = from_json(serde_json::json!({
            "url": "amqps://relay:pw@mq.example.com/prod?heartbeat=20",
            "exchange": "events",
            "routing_key": "app.{aggregate_type}",
            "mandatory": false,
            "unroutable": "reject",
            "declare_exchange": true,
            "exchange_type": "direct",
            "exchange_durable": false,
            "connection_name": "billing-relay",
            "connect_timeout": "1500ms",
            "confirm_timeout": "1m",
            "max_batch_len": 200,
            "max_message_bytes": 1024,
            "tls": { "ca_file": "/etc/ssl/ca.pem" },
        }))
        .unwrap();
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.confirm_timeout, Duration::from_secs(60));
        assert_eq!(config.unroutable, UnroutablePolicy::Reject);
        assert_eq!(config.exchange_kind(), ExchangeKind::Direct);
        assert_eq!(config.tls.ca_file, Some(PathBuf::from("/etc/ssl/ca.pem")));
        config.validate().unwrap();
        assert_eq!(config.host_port(), "mq.example.com:5671");
        let uri = config.amqp_uri().unwrap();
        assert_eq!(uri.vhost, "prod");
        assert_eq!(uri.query.heartbeat, Some(20));
        assert_eq!(uri.authority.userinfo.username, "relay");
    }

    #[test]
    fn ip_hosts_are_kept() {
        // lapin's own parser only keeps domain names; the sink must keep IP addresses.
        let config = RabbitMqConfig::new("amqp://u:p@10.1.2.3:5673/%2f", "x");
        assert_eq!(config.amqp_uri().unwrap().authority.host, "10.1.2.3");
        assert_eq!(config.host_port(), "10.1.2.3:5673");
        let config = RabbitMqConfig::new("amqp://[::1]:5672", "x");
        assert_eq!(config.amqp_uri().unwrap().authority.host, "::1");
        assert_eq!(config.host_port(), "[::1]:5672");
    }

    #[test]
    fn exchange_types() {
        let kind = |t: &str| {
            RabbitMqConfig {
                exchange_type: t.into(),
                ..Default::default()
            }
            .exchange_kind()
        };
        assert_eq!(kind("topic"), ExchangeKind::Topic);
        assert_eq!(kind("Fanout"), ExchangeKind::Fanout);
        assert_eq!(kind("headers"), ExchangeKind::Headers);
        assert_eq!(
            kind("x-consistent-hash"),
            ExchangeKind::Custom("x-consistent-hash".into())
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e =
            from_json::<RabbitMqConfig>(serde_json::json!({ "exchange_name": "x" })).unwrap_err();
        assert!(e.contains("unknown field `exchange_name`"), "{e}");
        let e = from_json::<RabbitMqConfig>(serde_json::json!({ "tls": { "verify": false } }))
            .unwrap_err();
        assert!(e.contains("unknown field `verify`"), "{e}");
        let e =
            from_json::<RabbitMqConfig>(serde_json::json!({ "unroutable": "drop" })).unwrap_err();
        assert!(e.contains("unknown variant `drop`"), "{e}");
    }

    #[test]
    fn password_never_shows() {
        let config = RabbitMqConfig {
            tls: TlsConfig {
                pkcs12_file: Some("/etc/id.p12".into()),
                pkcs12_password: Some("p12s3cr3t".into()),
                ..Default::default()
            },
            ..RabbitMqConfig::new("amqps://relay:s3cr3t@mq:5671/%2f", "events")
        };
        assert_eq!(config.redacted_url(), "amqps://relay:***@mq:5671/%2f");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("amqps://relay:***@mq:5671/%2f"), "{debug}");
        let config = RabbitMqConfig::new("not a url:s3cr3t@mq", "");
        assert!(!config.redacted_url().contains("s3cr3t"));
        let e = config.validate().unwrap_err().to_string();
        assert!(!e.contains("s3cr3t"), "{e}");
        let config = RabbitMqConfig::new("amqp://u:s3cr3t@mq/%2f?heartbeat=abc", "");
        let e = config.validate().unwrap_err().to_string();
        assert!(e.starts_with("sink.rabbitmq.url: "), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        assert_eq!(
            RabbitMqConfig::new("amqp://mq:5672", "").redacted_url(),
            "amqp://mq:5672"
        );
    }

    #[test]
    fn the_password_key_replaces_the_urls_and_never_shows() {
        // The URL's user stays; the URL's password, if any, is replaced.
        let config: RabbitMqConfig = from_json(serde_json::json!({
            "url": "amqp://relay:in-url@mq:5672/%2f",
            "password": "s3cr3t-key",
        }))
        .unwrap();
        assert_eq!(config.password.as_deref(), Some("s3cr3t-key"));
        config.validate().unwrap();
        let uri = config.amqp_uri().unwrap();
        assert_eq!(uri.authority.userinfo.username, "relay");
        assert_eq!(uri.authority.userinfo.password, "s3cr3t-key");
        assert_eq!(
            config.credential_keys(),
            "sink.rabbitmq.url, sink.rabbitmq.password"
        );
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t-key"), "{debug}");
        assert!(!debug.contains("in-url"), "{debug}");
        assert!(debug.contains("password: Some(\"***\")"), "{debug}");

        // A URL with a user and no password; without a user, lapin logs in as `guest`, now
        // with this password.
        for (url, user) in [("amqp://relay@mq/%2f", "relay"), ("amqp://mq/%2f", "guest")] {
            let config = RabbitMqConfig {
                password: Some("s3cr3t-key".into()),
                ..RabbitMqConfig::new(url, "")
            };
            let uri = config.amqp_uri().unwrap();
            assert_eq!(uri.authority.userinfo.username, user);
            assert_eq!(uri.authority.userinfo.password, "s3cr3t-key");
            assert_eq!(config.redacted_url(), url);
        }

        // Without the key: the URL's password, or lapin's default `guest`.
        let config = RabbitMqConfig::new("amqp://relay:in-url@mq/%2f", "");
        assert_eq!(
            config.amqp_uri().unwrap().authority.userinfo.password,
            "in-url"
        );
        assert_eq!(config.credential_keys(), "sink.rabbitmq.url");
        assert!(format!("{config:?}").contains("password: None"));
        let config = RabbitMqConfig::new("amqp://relay@mq/%2f", "");
        assert_eq!(
            config.amqp_uri().unwrap().authority.userinfo.password,
            "guest"
        );

        // Non-string values are refused by serde, an empty one by validation.
        let e = from_json::<RabbitMqConfig>(serde_json::json!({ "password": 123 })).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        assert_refused(
            &RabbitMqConfig::default(),
            &[("password: must not be empty", |c| {
                c.password = Some(String::new())
            })],
        );
    }

    #[test]
    fn invalid_values_name_the_key() {
        let errors = assert_refused(
            &RabbitMqConfig::default(),
            &[
                ("url: unsupported scheme", |c| {
                    *c = RabbitMqConfig::new("http://mq:5672", "x")
                }),
                ("url", |c| *c = RabbitMqConfig::new("mq:5672", "x")),
                (
                    "url: unknown option `heartbeet`: did you mean `heartbeat`?",
                    |c| *c = RabbitMqConfig::new("amqp://mq/%2f?heartbeet=10", "x"),
                ),
                ("routing_key: ", |c| c.routing_key = "{aggregate}".into()),
                ("exchange: ", |c| c.exchange = "x".repeat(256)),
                ("declare_exchange: ", |c| c.declare_exchange = true),
                ("declare_exchange: ", |c| {
                    *c = RabbitMqConfig::new("amqp://mq", "amq.topic");
                    c.declare_exchange = true;
                }),
                ("max_batch_len", |c| c.max_batch_len = 0),
                ("max_message_bytes", |c| c.max_message_bytes = 0),
                ("confirm_timeout", |c| c.confirm_timeout = Duration::ZERO),
            ],
        );
        assert!(errors[6].contains("reserved"), "{}", errors[6]);
    }

    #[test]
    fn tls_settings_are_checked() {
        let base = RabbitMqConfig::new("amqps://mq", "x");
        let errors = assert_refused(
            &base,
            &[
                ("tls: ", |c| {
                    c.url = "amqp://mq".into();
                    c.tls.ca_file = Some("/ca.pem".into());
                }),
                ("tls.client_cert_file", |c| {
                    c.tls.client_cert_file = Some("/c.pem".into())
                }),
                ("tls.pkcs12_file", |c| {
                    c.tls.client_cert_file = Some("/c.pem".into());
                    c.tls.client_key_file = Some("/k.pem".into());
                    c.tls.pkcs12_file = Some("/id.p12".into());
                }),
                ("tls.pkcs12_password", |c| {
                    c.tls.pkcs12_password = Some("pw".into())
                }),
            ],
        );
        assert!(errors[1].contains("go together"), "{}", errors[1]);
        // Files are read later (`tls_config`): with amqps://, a CA file is accepted here.
        let ca = RabbitMqConfig {
            tls: TlsConfig {
                ca_file: Some("/ca.pem".into()),
                ..Default::default()
            },
            ..base
        };
        ca.validate().unwrap();
    }

    #[test]
    fn tls_files_are_read_and_errors_name_the_key() {
        let dir = std::env::temp_dir().join(format!("outbox-rabbitmq-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let not_pem = dir.join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        let config = |tls: TlsConfig| RabbitMqConfig {
            tls,
            ..RabbitMqConfig::new("amqps://mq", "x")
        };
        let loaded = config(TlsConfig {
            ca_file: Some(ca.clone()),
            ..Default::default()
        })
        .tls_config()
        .unwrap();
        assert!(loaded.cert_chain.unwrap().contains("BEGIN CERTIFICATE"));
        let e = config(TlsConfig {
            ca_file: Some(not_pem),
            ..Default::default()
        })
        .tls_config()
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("sink.rabbitmq.tls.ca_file: "), "{e}");
        let e = config(TlsConfig {
            pkcs12_file: Some(dir.join("missing.p12")),
            pkcs12_password: Some("pw".into()),
            ..Default::default()
        })
        .tls_config()
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("sink.rabbitmq.tls.pkcs12_file: cannot read"),
            "{e}"
        );
        assert!(e.contains("missing.p12"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
