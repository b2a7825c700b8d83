//! Topic names: which ones Kafka can have, and creating topics ahead of time for brokers that
//! do not create them on first use (the demo and the tests use it; the relay itself never
//! creates topics).

use std::time::Duration;

use outboxkit_core::{DestinationTemplate, Error, ErrorKind, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::RDKafkaErrorCode;

use crate::classify::{classify, code_kind, describe};
use crate::config::{KafkaSinkConfig, CONFIG_SECTION};

/// Longest topic name Kafka allows.
const MAX_TOPIC_NAME: usize = 249;

/// Why Kafka can have no topic named `name`, if so: Kafka allows 1 to 249 ASCII letters,
/// digits, `.`, `_` and `-`, and neither `.` nor `..` alone (Kafka's `Topic.validate`). A
/// broker asked for such a topic answers that it does not exist, or that it is invalid, so the
/// sink refuses it before sending: the event can never be delivered there.
pub fn check_topic_name(name: &str) -> std::result::Result<(), String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    // Characters before length: a legal name is ASCII, so its length in bytes is in characters.
    let illegal = name.chars().find(|c| !legal(*c));
    match (name, illegal) {
        ("", _) => Err("is empty".to_owned()),
        ("." | "..", _) => Err("cannot be `.` or `..`".to_owned()),
        (_, Some(bad)) => Err(format!(
            "holds {bad:?}: a Kafka topic name may only hold ASCII letters, digits, `.`, `_` \
             and `-`"
        )),
        _ if name.len() > MAX_TOPIC_NAME => Err(format!(
            "is {} characters long; a Kafka topic name has at most {MAX_TOPIC_NAME}",
            name.len()
        )),
        _ => Ok(()),
    }
}

/// Why no topic name a template renders can be a Kafka topic name, if so: its literal parts
/// hold a character Kafka refuses, or are too long on their own.
pub fn check_topic_template(template: &DestinationTemplate) -> std::result::Result<(), String> {
    let shortest = template.with_placeholders_as("");
    if shortest.len() > MAX_TOPIC_NAME {
        return check_topic_name(&shortest);
    }
    check_topic_name(&template.with_placeholders_as("x"))
}

/// A topic to create: name, partitions, replication factor and topic configs
/// (e.g. `("max.message.bytes", "100000")`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i32,
    pub configs: Vec<(String, String)>,
}

impl TopicSpec {
    /// `name` with `partitions` partitions, replication factor 1, no topic configs.
    pub fn new(name: impl Into<String>, partitions: i32) -> Self {
        Self {
            name: name.into(),
            partitions,
            replication_factor: 1,
            configs: Vec::new(),
        }
    }

    /// Set a topic config.
    pub fn config(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.push((name.into(), value.into()));
        self
    }
}

/// Create each topic that does not exist yet, with the connection settings of `config`
/// (bootstrap servers, TLS, SASL...). A topic that already exists is left as it is.
pub async fn ensure_topics(
    config: &KafkaSinkConfig,
    topics: &[TopicSpec],
    timeout: Duration,
) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    let mut client_config = rdkafka::ClientConfig::new();
    for (name, value) in &config.properties {
        // Only the connection settings matter to the admin client; producer-only
        // properties would be refused by it.
        if is_connection_property(name) {
            client_config.set(name, value);
        }
    }
    let admin: AdminClient<DefaultClientContext> = client_config.create().map_err(|e| {
        classify(&e).context(format!("{CONFIG_SECTION}: creating the admin client"))
    })?;
    let new_topics: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            let mut topic = NewTopic::new(
                &t.name,
                t.partitions,
                TopicReplication::Fixed(t.replication_factor),
            );
            for (k, v) in &t.configs {
                topic = topic.set(k, v);
            }
            topic
        })
        .collect();
    let options = AdminOptions::new()
        .request_timeout(Some(timeout))
        .operation_timeout(Some(timeout));
    let results = admin
        .create_topics(new_topics.iter(), &options)
        .await
        .map_err(|e| {
            classify(&e).context(format!(
                "creating topics at {} (within {})",
                config.bootstrap_servers(),
                humantime::format_duration(timeout)
            ))
        })?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                let (kind, _) = code_kind(code);
                let kind = if kind == ErrorKind::Other {
                    ErrorKind::Config
                } else {
                    kind
                };
                return Err(Error::new(
                    kind,
                    format!("creating topic `{name}`: {}", describe(code)),
                ));
            }
        }
    }
    Ok(())
}

/// Properties an admin client needs to reach the cluster: brokers, security, client id,
/// socket and address settings.
fn is_connection_property(name: &str) -> bool {
    const PREFIXES: &[&str] = &[
        "bootstrap.",
        "metadata.broker.list",
        "security.",
        "ssl.",
        "ssl_",
        "sasl.",
        "socket.",
        "broker.address.",
        "client.",
        "enable.ssl.",
        "https.",
        "debug",
        "reconnect.",
        "connections.",
        "api.version.",
        "broker.version.",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_kafka_cannot_have_are_refused() {
        for name in ["orders", "order.Created", "a_b-c.D9", &"t".repeat(249)] {
            assert_eq!(check_topic_name(name), Ok(()), "{name}");
        }
        for (name, why) in [
            ("", "is empty"),
            (".", "cannot be `.` or `..`"),
            ("..", "cannot be `.` or `..`"),
            ("bad/type", "holds '/'"),
            ("order Created", "holds ' '"),
            ("commandé", "holds 'é'"),
            // 260 bytes, 130 characters: the character is what is wrong.
            (&"é".repeat(130), "holds 'é'"),
        ] {
            let e = check_topic_name(name).unwrap_err();
            assert!(e.starts_with(why), "{name}: {e}");
        }
        let e = check_topic_name(&"t".repeat(250)).unwrap_err();
        assert!(e.starts_with("is 250 characters long"), "{e}");
    }

    #[test]
    fn templates_whose_literals_kafka_refuses_are_refused() {
        let template = |text: &str| DestinationTemplate::parse(text).unwrap();
        // A placeholder may render to a legal name or not: that is checked per event.
        for good in [
            "{aggregate_type}.{event_type}",
            "app-{aggregate_id}",
            "{event_type}",
        ] {
            assert_eq!(check_topic_template(&template(good)), Ok(()), "{good}");
        }
        let long = format!("{}{{aggregate_type}}", "t".repeat(250));
        for (bad, why) in [
            ("orders/{aggregate_type}", "holds '/'"),
            ("{{aggregate_type}}", "holds '{'"),
            (long.as_str(), "is 250 characters long"),
        ] {
            let checked = check_topic_template(&template(bad));
            assert!(
                checked.as_ref().is_err_and(|e| e.starts_with(why)),
                "{bad}: {checked:?}"
            );
        }
    }

    #[test]
    fn only_connection_properties_reach_the_admin_client() {
        for name in [
            "bootstrap.servers",
            "security.protocol",
            "ssl.ca.location",
            "sasl.password",
            "client.id",
            "socket.timeout.ms",
            "broker.address.family",
        ] {
            assert!(is_connection_property(name), "{name}");
        }
        for name in [
            "acks",
            "linger.ms",
            "enable.idempotence",
            "compression.type",
        ] {
            assert!(!is_connection_property(name), "{name}");
        }
    }
}
