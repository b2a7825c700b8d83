//! Configuration of the Kafka sink (`[sink.kafka]`).
//!
//! A handful of keys belong to the relay (`topic`, `delivery_timeout`, `check_timeout`,
//! `max_batch_len`); every other key is a librdkafka property passed through unchanged
//! (`"bootstrap.servers"`, `"security.protocol"`, `"sasl.password"`...), so TLS, SASL,
//! compression and tuning need no code change. Property values are kept as strings, also when
//! TOML or the environment gives a number or a boolean.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::plugin::refuse_zero_counts;
use outboxkit_core::{DestinationTemplate, Error, Result};
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::topics::check_topic_template;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.kafka";

/// The librdkafka property naming the brokers; required.
pub const BOOTSTRAP_SERVERS: &str = "bootstrap.servers";

/// The relay's own keys in `[sink.kafka]`; every other key is a librdkafka property.
pub const OWN_KEYS: &[&str] = &[
    "topic",
    "delivery_timeout",
    "check_timeout",
    "max_batch_len",
    "format",
    "cloudevents_source",
    "tombstone_on_empty_payload",
    "timestamp",
];

/// Default topic template, as in the article: one topic per aggregate type and event type.
pub const DEFAULT_TOPIC: &str = "{aggregate_type}.{event_type}";

/// librdkafka's default `message.max.bytes`.
const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// Properties the relay sets unless the configuration gives them: durable, ordered,
/// duplicate-free writes (per producer session).
pub const SAFE_DEFAULTS: &[(&str, &str)] = &[
    ("acks", "all"),
    ("enable.idempotence", "true"),
    ("client.id", "outbox-relay"),
];

/// Properties the relay decides itself: setting them is a configuration error that says what
/// to use instead.
const RESERVED: &[(&str, &str)] = &[
    (
        "message.timeout.ms",
        "set sink.kafka.delivery_timeout (a duration such as \"30s\") instead",
    ),
    (
        "delivery.timeout.ms",
        "set sink.kafka.delivery_timeout (a duration such as \"30s\") instead",
    ),
    (
        "transactional.id",
        "the relay does not use Kafka transactions: remove it (the idempotent producer already \
         avoids duplicates from its own retries)",
    ),
];

/// Which time a record carries as its Kafka timestamp (`sink.kafka.timestamp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordTimestamp {
    /// The time the relay hands the record to the producer (librdkafka's default).
    #[default]
    Produce,
    /// The event's `created_at` (the writer's transaction, database clock), in milliseconds:
    /// event time for consumers that window by it (Debezium's `table.field.event.timestamp`).
    CreatedAt,
}

/// Configuration of [`KafkaSink`](crate::KafkaSink).
///
/// `Debug` never shows secrets: the value of every property whose name mentions a password,
/// a secret, a private key or the OAuth bearer configuration is replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct KafkaSinkConfig {
    /// Destination template naming the topic; a row's `destination` overrides it.
    pub topic: String,
    /// How long librdkafka may try to deliver one message (its `message.timeout.ms`); a
    /// `publish` call returns within about this long even when the broker is down.
    pub delivery_timeout: Duration,
    /// How long `check()` waits for the cluster's metadata.
    pub check_timeout: Duration,
    /// Most events in one `publish` call.
    pub max_batch_len: usize,
    /// `raw` (the payload as the value, the event's fields as headers) or `cloudevents`
    /// (CloudEvents 1.0, Kafka protocol binding, binary content mode).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
    /// Send an event whose payload is empty (no bytes, or the JSON `null` in a `json` table) as
    /// a tombstone: a record with the aggregate's key and no value, which a compacted topic
    /// takes as "delete this key" (Debezium's `route.tombstone.on.empty.payload`). Off: such an
    /// event is sent as it is.
    pub tombstone_on_empty_payload: bool,
    /// The records' timestamp: when produced (default) or the event's `created_at`.
    pub timestamp: RecordTimestamp,
    /// librdkafka properties, passed through as they are (values as strings).
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaSinkConfig {
    /// Every key at its default; `bootstrap.servers` is not set (and must be).
    fn default() -> Self {
        Self {
            topic: DEFAULT_TOPIC.to_owned(),
            delivery_timeout: Duration::from_secs(30),
            check_timeout: Duration::from_secs(10),
            max_batch_len: 1000,
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
            tombstone_on_empty_payload: false,
            timestamp: RecordTimestamp::Produce,
            properties: BTreeMap::new(),
        }
    }
}

/// Whether the value of property `name` must never be shown.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "sasl.oauthbearer.config",
        "ssl.key.pem",
        "private",
    ]
    .iter()
    .any(|word| name.contains(word))
}

impl fmt::Debug for KafkaSinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaSinkConfig")
            .field("topic", &self.topic)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("check_timeout", &self.check_timeout)
            .field("max_batch_len", &self.max_batch_len)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .field(
                "tombstone_on_empty_payload",
                &self.tombstone_on_empty_payload,
            )
            .field("timestamp", &self.timestamp)
            .field("properties", &self.redacted_properties())
            .finish()
    }
}

impl KafkaSinkConfig {
    /// A configuration for these brokers (`host:port[,host:port...]`) with every other key at
    /// its default.
    pub fn new(bootstrap_servers: impl Into<String>) -> Self {
        Self::default().property(BOOTSTRAP_SERVERS, bootstrap_servers)
    }

    /// Set a librdkafka property.
    pub fn property(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(name.into(), value.into());
        self
    }

    /// `bootstrap.servers` as configured (empty when missing).
    pub fn bootstrap_servers(&self) -> &str {
        self.properties
            .get(BOOTSTRAP_SERVERS)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// The properties with secret values replaced by `***`, fit for logs.
    pub fn redacted_properties(&self) -> BTreeMap<&str, &str> {
        self.properties
            .iter()
            .map(|(k, v)| {
                let v = if is_secret_property(k) {
                    "***"
                } else {
                    v.as_str()
                };
                (k.as_str(), v)
            })
            .collect()
    }

    /// The producer's largest message (`message.max.bytes`, librdkafka's default 1,000,000).
    pub fn message_max_bytes(&self) -> usize {
        self.properties
            .get("message.max.bytes")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES)
    }

    /// The parsed topic template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.topic)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.topic")))
    }

    /// The CloudEvents mapping (`None` with `format = "raw"`); a `cloudevents_source` that is
    /// not a URI-reference is refused naming `sink.kafka.cloudevents_source`.
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// Check every key without connecting: the relay's own keys, then every property through
    /// librdkafka itself (unknown names and invalid values are refused). Errors name the key
    /// (`sink.kafka."linger.ms": ...`) and never show a secret value.
    pub fn validate(&self) -> Result<()> {
        if let Err(why) = check_topic_template(&self.template()?) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.topic: `{}` {why}",
                self.topic
            )));
        }
        self.cloudevents()?;
        refuse_zero_counts(CONFIG_SECTION, &[("max_batch_len", self.max_batch_len)])?;
        for (key, value) in [
            ("delivery_timeout", self.delivery_timeout),
            ("check_timeout", self.check_timeout),
        ] {
            if value < Duration::from_millis(1) {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.{key}: must be at least 1ms"
                )));
            }
        }
        if self.delivery_timeout > Duration::from_millis(i32::MAX as u64) {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.delivery_timeout: must be at most 24 days"
            )));
        }
        if self.bootstrap_servers().trim().is_empty() {
            return Err(Error::config(format!(
                "{CONFIG_SECTION}.\"{BOOTSTRAP_SERVERS}\": missing required key: the Kafka \
                 brokers as host:port[,host:port...]"
            )));
        }
        for (name, instead) in RESERVED {
            if self.properties.contains_key(*name) {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.\"{name}\": not allowed here: {instead}"
                )));
            }
        }
        // librdkafka checks names and values one by one: an unknown name or a bad value is
        // reported with the key it concerns.
        for (name, value) in &self.properties {
            let mut one = ClientConfig::new();
            one.set(name, value);
            if let Err(e) = one.create_native_config() {
                return Err(Error::config(property_error(name, value, &e)));
            }
        }
        // Then all together (some values are only invalid in combination).
        self.client_config()
            .create_native_config()
            .map_err(|e| Error::config(format!("{CONFIG_SECTION}: {}", describe_conf_error(&e))))?;
        Ok(())
    }

    /// The librdkafka configuration: the relay's safe defaults, the configured properties
    /// (which win), and `message.timeout.ms` from `delivery_timeout`.
    pub fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        for (name, value) in SAFE_DEFAULTS {
            config.set(*name, *value);
        }
        for (name, value) in &self.properties {
            config.set(name, value);
        }
        config.set(
            "message.timeout.ms",
            self.delivery_timeout.as_millis().max(1).to_string(),
        );
        config
    }
}

/// `sink.kafka."name": what librdkafka said`, with the value hidden for secret properties.
fn property_error(name: &str, value: &str, error: &KafkaError) -> String {
    let mut text = describe_conf_error(error);
    if is_secret_property(name) && !value.is_empty() {
        text = text.replace(value, "***");
    }
    let hint = if text.contains("No such configuration property") {
        format!(
            " (the relay's own keys are {}; every other key must be a librdkafka property, \
             see librdkafka's CONFIGURATION.md)",
            OWN_KEYS.join(", ")
        )
    } else {
        String::new()
    };
    format!("{CONFIG_SECTION}.\"{name}\": {text}{hint}")
}

fn describe_conf_error(error: &KafkaError) -> String {
    match error {
        KafkaError::ClientConfig(_, description, _, _) => description.clone(),
        other => other.to_string(),
    }
}

// ---- Deserialization ----------------------------------------------------------------------

/// A property value as TOML or the environment gives it: a scalar, or a table whose keys
/// continue the dotted name (`[sink.kafka.ssl] "ca.location" = ...`, or the nesting that
/// `OUTBOX_SINK__KAFKA__SASL__PASSWORD` produces).
enum PropertyValue {
    Scalar(String),
    Table(Vec<(String, PropertyValue)>),
}

impl<'de> Deserialize<'de> for PropertyValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PropertyValue;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a number or a boolean (a librdkafka property value)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_i128<E: de::Error>(self, v: i128) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_u128<E: de::Error>(self, v: u128) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_char<E: de::Error>(self, v: char) -> Result<PropertyValue, E> {
                Ok(PropertyValue::Scalar(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PropertyValue, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    entries.push((key, map.next_value::<PropertyValue>()?));
                }
                Ok(PropertyValue::Table(entries))
            }
        }
        d.deserialize_any(V)
    }
}

impl PropertyValue {
    /// Flatten into `(dotted name, value, nesting depth)`.
    fn flatten(self, name: String, depth: usize, out: &mut Vec<(String, String, usize)>) {
        match self {
            PropertyValue::Scalar(value) => out.push((name, value, depth)),
            PropertyValue::Table(entries) => {
                for (key, value) in entries {
                    value.flatten(format!("{name}.{key}"), depth + 1, out);
                }
            }
        }
    }
}

/// A duration as a human string (`"30s"`, `"1500ms"`).
struct HumanDuration(Duration);

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        humantime_serde::deserialize(d).map(HumanDuration)
    }
}

impl<'de> Deserialize<'de> for KafkaSinkConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KafkaSinkConfig;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a table of the Kafka sink's settings and librdkafka properties")
            }
            fn visit_unit<E: de::Error>(self) -> Result<KafkaSinkConfig, E> {
                Ok(KafkaSinkConfig::default())
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<KafkaSinkConfig, A::Error> {
                let mut config = KafkaSinkConfig::default();
                let mut flat: Vec<(String, String, usize)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "topic" => config.topic = map.next_value()?,
                        "delivery_timeout" => {
                            config.delivery_timeout = map.next_value::<HumanDuration>()?.0;
                        }
                        "check_timeout" => {
                            config.check_timeout = map.next_value::<HumanDuration>()?.0;
                        }
                        "max_batch_len" => config.max_batch_len = map.next_value()?,
                        "format" => config.format = map.next_value()?,
                        "cloudevents_source" => config.cloudevents_source = map.next_value()?,
                        "tombstone_on_empty_payload" => {
                            config.tombstone_on_empty_payload = map.next_value()?;
                        }
                        "timestamp" => config.timestamp = map.next_value()?,
                        _ => {
                            map.next_value::<PropertyValue>()?
                                .flatten(key, 0, &mut flat);
                        }
                    }
                }
                // The same property spelled twice (`"bootstrap.servers"` in the file and
                // OUTBOX_SINK__KAFKA__BOOTSTRAP__SERVERS, which nests): the more nested
                // spelling wins — that is the environment's, and the environment wins over
                // the file.
                flat.sort_by_key(|(_, _, depth)| *depth);
                for (name, value, _) in flat {
                    config.properties.insert(name, value);
                }
                Ok(config)
            }
        }
        d.deserialize_map(V)
    }
}

/// `kind = "kafka"`, settings in `[sink.kafka]`: the sink's own keys and any librdkafka
/// property as a quoted key (`"bootstrap.servers" = "..."`), or from the environment with `__`
/// for every dot (`OUTBOX_SINK__KAFKA__SASL__PASSWORD`).
impl outboxkit_core::SinkConfig for KafkaSinkConfig {
    const KIND: &'static str = crate::KafkaSink::KIND;
    type Sink = crate::KafkaSink;
    const DESTINATION_KEY: Option<&'static str> = Some("topic");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.topic
    }

    fn validate(&self) -> Result<()> {
        KafkaSinkConfig::validate(self)
    }

    /// Connects in the background; `run` checks the brokers right after building.
    async fn build(self) -> Result<Self::Sink> {
        crate::KafkaSink::new(self)
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    #[test]
    fn defaults() {
        let config: KafkaSinkConfig =
            from_json(serde_json::json!({ "bootstrap.servers": "k1:9092" })).unwrap();
        assert_eq!(config.topic, "{aggregate_type}.{event_type}");
        assert_eq!(config.delivery_timeout, Duration::from_secs(30));
        assert_eq!(config.check_timeout, Duration::from_secs(10));
        assert_eq!(config.max_batch_len, 1000);
        assert_eq!(config.bootstrap_servers(), "k1:9092");
        assert_eq!(config, KafkaSinkConfig::new("k1:9092"));
        config.validate().unwrap();
        let client = config.client_config();
        assert_eq!(client.get("acks"), Some("all"));
        assert_eq!(client.get("enable.idempotence"), Some("true"));
        assert_eq!(client.get("message.timeout.ms"), Some("30000"));
        assert_eq!(client.get("bootstrap.servers"), Some("k1:9092"));
        assert_eq!(config.message_max_bytes(), 1_000_000);
    }

    #[test]
    fn own_keys_and_properties_with_any_scalar_type() {
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "topic": "app.{aggregate_type}",
            "delivery_timeout": "1m",
            "check_timeout": "1500ms",
            "max_batch_len": 200,
            "bootstrap.servers": "k1:9092,k2:9092",
            "linger.ms": 20,
            "enable.idempotence": true,
            "batch.num.messages": "5000",
            "sticky.partitioning.linger.ms": 0.0,
            "compression.type": "zstd",
        }))
        .unwrap();
        assert_eq!(config.topic, "app.{aggregate_type}");
        assert_eq!(config.delivery_timeout, Duration::from_secs(60));
        assert_eq!(config.check_timeout, Duration::from_millis(1500));
        assert_eq!(config.max_batch_len, 200);
        assert_eq!(config.properties["linger.ms"], "20");
        assert_eq!(config.properties["enable.idempotence"], "true");
        assert_eq!(config.properties["batch.num.messages"], "5000");
        assert_eq!(config.properties["sticky.partitioning.linger.ms"], "0");
        config.validate().unwrap();
        assert_eq!(
            config.client_config().get("message.timeout.ms"),
            Some("60000")
        );
        assert_eq!(config.client_config().get("compression.type"), Some("zstd"));
    }

    #[test]
    fn configured_properties_win_over_the_safe_defaults() {
        let config = KafkaSinkConfig::new("k:9092")
            .property("client.id", "billing-relay")
            .property("enable.idempotence", "false")
            .property("acks", "1");
        config.validate().unwrap();
        let client = config.client_config();
        assert_eq!(client.get("client.id"), Some("billing-relay"));
        assert_eq!(client.get("acks"), Some("1"));
    }

    #[test]
    fn nested_tables_continue_the_dotted_name_and_nested_wins() {
        // What TOML `[sink.kafka.ssl] "ca.location" = ...` or the environment's nesting give.
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "bootstrap.servers": "from-file:9092",
            "bootstrap": { "servers": "from-env:9092" },
            "ssl": { "ca.location": "/etc/ca.pem" },
            "sasl": { "password": "007" },
        }))
        .unwrap();
        assert_eq!(config.bootstrap_servers(), "from-env:9092");
        assert_eq!(config.properties["ssl.ca.location"], "/etc/ca.pem");
        assert_eq!(
            config.properties["sasl.password"], "007",
            "kept as a string"
        );
    }

    #[test]
    fn arrays_are_refused_with_what_is_expected() {
        let e = from_json::<KafkaSinkConfig>(
            serde_json::json!({ "bootstrap.servers": ["a:1", "b:2"] }),
        )
        .unwrap_err();
        assert!(e.contains("a string, a number or a boolean"), "{e}");
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let config = KafkaSinkConfig::new("k:9092")
            .property("security.protocol", "SASL_SSL")
            .property("sasl.mechanisms", "SCRAM-SHA-512")
            .property("sasl.username", "relay")
            .property("sasl.password", "s3cr3t-sasl")
            .property("ssl.key.password", "s3cr3t-key")
            .property("ssl.keystore.password", "s3cr3t-keystore")
            .property("ssl.key.pem", "-----BEGIN PRIVATE KEY----- s3cr3t-pem")
            .property("sasl.oauthbearer.client.secret", "s3cr3t-oauth")
            .property("sasl.oauthbearer.config", "principal=x s3cr3t-conf");
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("\"sasl.password\": \"***\""), "{debug}");
        assert!(debug.contains("\"sasl.username\": \"relay\""), "{debug}");
        assert!(debug.contains("SCRAM-SHA-512"), "{debug}");
        assert!(is_secret_property("SASL.PASSWORD"));
        assert!(!is_secret_property("bootstrap.servers"));
    }

    #[test]
    fn invalid_values_name_the_key() {
        fn set(config: &mut KafkaSinkConfig, name: &str, value: &str) {
            config.properties.insert(name.to_owned(), value.to_owned());
        }
        let errors = assert_refused(
            &KafkaSinkConfig::new("k:9092"),
            &[
                ("\"bootstrap.servers\": missing required key", |c| {
                    *c = KafkaSinkConfig::default()
                }),
                ("\"linger.mss\": No such configuration property", |c| {
                    set(c, "linger.mss", "5")
                }),
                ("\"acks\": Invalid value", |c| set(c, "acks", "most")),
                ("\"compression.type\"", |c| {
                    set(c, "compression.type", "brotli")
                }),
                ("\"message.timeout.ms\": not allowed here", |c| {
                    set(c, "message.timeout.ms", "5000")
                }),
                ("\"transactional.id\"", |c| set(c, "transactional.id", "x")),
                ("topic: ", |c| c.topic = "{aggregate}".into()),
                ("topic: `orders/{aggregate_type}` holds '/'", |c| {
                    c.topic = "orders/{aggregate_type}".into()
                }),
                ("max_batch_len", |c| c.max_batch_len = 0),
                ("delivery_timeout", |c| c.delivery_timeout = Duration::ZERO),
            ],
        );
        for (case, hint) in [
            (0, "missing required key: the Kafka brokers as host:port"),
            (1, "topic, delivery_timeout"),
            (4, "delivery_timeout"),
            (7, "a Kafka topic name may only hold ASCII letters"),
        ] {
            assert!(errors[case].contains(hint), "{}", errors[case]);
        }
    }

    #[test]
    fn a_refused_secret_value_is_not_echoed() {
        // sasl.mechanisms takes a closed set of values; pretend it held a secret by checking
        // the redaction helper directly with a secret-looking property name.
        let err = KafkaError::ClientConfig(
            rdkafka::types::RDKafkaConfRes::RD_KAFKA_CONF_INVALID,
            "Invalid value \"hunter2\" for configuration property \"ssl.key.password\"".into(),
            "ssl.key.password".into(),
            "hunter2".into(),
        );
        let text = property_error("ssl.key.password", "hunter2", &err);
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.starts_with("sink.kafka.\"ssl.key.password\": Invalid value \"***\""));
    }

    #[test]
    fn format_and_cloudevents_source() {
        let config: KafkaSinkConfig =
            from_json(serde_json::json!({ "bootstrap.servers": "k:9092" })).unwrap();
        assert_eq!(config.format, Format::Raw);
        assert_eq!(config.cloudevents_source, DEFAULT_SOURCE);
        assert!(config.cloudevents().unwrap().is_none());
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "format": "cloudevents",
            "cloudevents_source": "urn:shop:{aggregate_type}",
        }))
        .unwrap();
        assert_eq!(config.format, Format::CloudEvents);
        config.validate().unwrap();
        assert!(config.cloudevents().unwrap().is_some());
        assert!(!config.properties.contains_key("format"));
        let e = from_json::<KafkaSinkConfig>(
            serde_json::json!({ "bootstrap.servers": "k:9092", "format": "xml" }),
        )
        .unwrap_err();
        assert!(e.contains("raw") && e.contains("cloudevents"), "{e}");
    }

    #[test]
    fn tombstone_on_empty_payload_is_an_own_key_and_off_by_default() {
        let config: KafkaSinkConfig =
            from_json(serde_json::json!({ "bootstrap.servers": "k:9092" })).unwrap();
        assert!(!config.tombstone_on_empty_payload);
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "tombstone_on_empty_payload": true,
        }))
        .unwrap();
        assert!(config.tombstone_on_empty_payload);
        assert!(!config.properties.contains_key("tombstone_on_empty_payload"));
        config.validate().unwrap();
        assert!(format!("{config:?}").contains("tombstone_on_empty_payload: true"));
        let e = from_json::<KafkaSinkConfig>(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "tombstone_on_empty_payload": "yes",
        }))
        .unwrap_err();
        assert!(e.contains("a boolean"), "{e}");
    }

    #[test]
    fn timestamp_is_produce_time_unless_created_at_is_asked() {
        let config: KafkaSinkConfig =
            from_json(serde_json::json!({ "bootstrap.servers": "k:9092" })).unwrap();
        assert_eq!(config.timestamp, RecordTimestamp::Produce);
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "timestamp": "created_at",
        }))
        .unwrap();
        assert_eq!(config.timestamp, RecordTimestamp::CreatedAt);
        assert!(!config.properties.contains_key("timestamp"));
        config.validate().unwrap();
        let e = from_json::<KafkaSinkConfig>(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "timestamp": "commit",
        }))
        .unwrap_err();
        assert!(e.contains("produce") && e.contains("created_at"), "{e}");
    }

    #[test]
    fn unknown_key_typos_of_own_keys_are_reported_as_properties() {
        let config: KafkaSinkConfig = from_json(serde_json::json!({
            "bootstrap.servers": "k:9092",
            "delivery_timout": "5s",
        }))
        .unwrap();
        let e = config.validate().unwrap_err().to_string();
        assert!(
            e.starts_with("sink.kafka.\"delivery_timout\": No such configuration property"),
            "{e}"
        );
    }
}
