//! `[sink.kafka]` as the registry reads it (feature `sink-kafka`): the sink's own keys
//! (`topic`, `delivery_timeout`, `tombstone_on_empty_payload`...) and any librdkafka
//! property as a quoted key (`"bootstrap.servers" = "..."`), or from the environment with
//! `__` for every dot (`OUTBOX_SINK__KAFKA__SASL__PASSWORD`).

use outboxkit_sink_kafka::KafkaSinkConfig;

use super::*;

/// The one key the Kafka sink requires.
const SERVERS: &str = "\"bootstrap.servers\" = \"k:9092\"";

#[test]
fn properties_pass_through_as_strings_and_the_environment_wins() {
    in_jail(|jail| {
        let toml = with_section::<KafkaSinkConfig>(
            "\"bootstrap.servers\" = \"file:9092\"\n\
             \"linger.ms\" = 20\n\"enable.idempotence\" = true\n\
             delivery_timeout = \"45s\"\nmax_batch_len = 300\n\
             \"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\
             \"sasl.username\" = \"relay\"",
        );
        jail.set_env(
            "OUTBOX_SINK__KAFKA__BOOTSTRAP__SERVERS",
            "env1:9092,env2:9092",
        );
        jail.set_env("OUTBOX_SINK__KAFKA__SASL__PASSWORD", "007");
        jail.set_env("OUTBOX_SINK__KAFKA__MAX_BATCH_LEN", "250");
        jail.set_env("OUTBOX_SINK__KAFKA__TOMBSTONE_ON_EMPTY_PAYLOAD", "true");
        jail.set_env("OUTBOX_SINK__KAFKA__TIMESTAMP", "created_at");
        let config = checked::<KafkaSinkConfig>(jail, &toml).unwrap();
        assert_eq!(config.bootstrap_servers(), "env1:9092,env2:9092");
        assert_eq!(config.properties["linger.ms"], "20");
        assert_eq!(config.properties["enable.idempotence"], "true");
        assert_eq!(config.properties["sasl.password"], "007");
        assert_eq!(config.max_batch_len, 250);
        assert!(config.tombstone_on_empty_payload);
        assert!(!config.properties.contains_key("tombstone_on_empty_payload"));
        assert_eq!(
            config.timestamp,
            outboxkit_sink_kafka::RecordTimestamp::CreatedAt
        );
        assert_eq!(config.delivery_timeout, std::time::Duration::from_secs(45));
        assert_eq!(config.topic, "{aggregate_type}.{event_type}");
        let debug = format!("{config:?}");
        assert!(!debug.contains("007"), "{debug}");
        Ok(())
    });
}

#[test]
fn sink_destination_overrides_the_topic() {
    in_jail(|jail| {
        let config: KafkaSinkConfig = with_destination(
            jail,
            "app.{aggregate_type}",
            &format!("{SERVERS}\ntopic = \"ignored\""),
        );
        assert_eq!(config.topic, "app.{aggregate_type}");
        Ok(())
    });
}

#[test]
fn errors_name_the_key_and_where_it_was_set() {
    in_jail(|jail| {
        let e = refused::<KafkaSinkConfig>(jail, &base::<KafkaSinkConfig>());
        assert!(
            e.starts_with("sink.kafka.\"bootstrap.servers\": missing required key")
                && e.ends_with("(in relay.toml, or set OUTBOX_SINK__KAFKA__BOOTSTRAP__SERVERS)"),
            "{e}"
        );

        let toml = with_section::<KafkaSinkConfig>(&format!("{SERVERS}\n\"lingr.ms\" = 5"));
        let e = refused::<KafkaSinkConfig>(jail, &toml);
        assert!(
            e.starts_with("sink.kafka.\"lingr.ms\": No such configuration property")
                && e.ends_with("(in relay.toml)"),
            "{e}"
        );

        for (key, value, expected) in [
            ("tombstone_on_empty_payload", "\"maybe\"", "a boolean"),
            (
                "timestamp",
                "\"commit\"",
                "expected one of: produce, created_at",
            ),
        ] {
            let toml = with_section::<KafkaSinkConfig>(&format!("{SERVERS}\n{key} = {value}"));
            let e = refused::<KafkaSinkConfig>(jail, &toml);
            assert!(
                e.starts_with(&format!("sink.kafka.{key}: "))
                    && e.contains(expected)
                    && e.ends_with("(in relay.toml)"),
                "{e}"
            );
        }

        let toml = with_section::<KafkaSinkConfig>(SERVERS);
        let acks = ("OUTBOX_SINK__KAFKA__ACKS", "most");
        let e =
            refused_from_environment::<KafkaSinkConfig>(jail, &toml, acks, "sink.kafka.\"acks\"");
        assert!(
            e.starts_with("sink.kafka.\"acks\": Invalid value")
                && e.ends_with("(from environment variable OUTBOX_SINK__KAFKA__ACKS)"),
            "{e}"
        );

        jail.set_env("OUTBOX_SINK__KAFKA__ACKS", "all");
        let timeout = ("OUTBOX_SINK__KAFKA__DELIVERY_TIMEOUT", "soon");
        refused_from_environment::<KafkaSinkConfig>(
            jail,
            &toml,
            timeout,
            "sink.kafka.delivery_timeout",
        );
        Ok(())
    });
}
