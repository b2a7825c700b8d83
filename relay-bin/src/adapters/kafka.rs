//! `[sink.kafka]` as the registry reads it (feature `sink-kafka`): the sink's own keys
//! (`topic`, `delivery_timeout`, `check_timeout`, `max_batch_len`) and any librdkafka
//! property as a quoted key (`"bootstrap.servers" = "..."`), or from the environment with
//! `__` for every dot (`OUTBOX_SINK__KAFKA__SASL__PASSWORD`).

#[cfg(test)]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
mod tests {

    use outboxkit_sink_kafka::KafkaSinkConfig;

    use super::super::{checked, in_jail, refused};

    const BASE: &str = base!("kafka");

    #[test]
    fn properties_pass_through_as_strings_and_the_environment_wins() {
        in_jail(|jail| {
            let toml = format!(
                "{BASE}\n[sink.kafka]\n\"bootstrap.servers\" = \"file:9092\"\n\
                 \"linger.ms\" = 20\n\"enable.idempotence\" = true\n\
                 delivery_timeout = \"45s\"\nmax_batch_len = 300\n\
                 \"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"PLAIN\"\n\
                 \"sasl.username\" = \"relay\"\n"
            );
            jail.set_env(
                "OUTBOX_SINK__KAFKA__BOOTSTRAP__SERVERS",
                "env1:9092,env2:9092",
            );
            jail.set_env("OUTBOX_SINK__KAFKA__SASL__PASSWORD", "007");
            jail.set_env("OUTBOX_SINK__KAFKA__MAX_BATCH_LEN", "250");
            let config = checked::<KafkaSinkConfig>(jail, &toml).unwrap();
            assert_eq!(config.bootstrap_servers(), "env1:9092,env2:9092");
            assert_eq!(config.properties["linger.ms"], "20");
            assert_eq!(config.properties["enable.idempotence"], "true");
            assert_eq!(config.properties["sasl.password"], "007");
            assert_eq!(config.max_batch_len, 250);
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
            let toml = format!(
                "{BASE}destination = \"app.{{aggregate_type}}\"\n\
                 [sink.kafka]\n\"bootstrap.servers\" = \"k:9092\"\ntopic = \"ignored\"\n"
            );
            assert_eq!(
                checked::<KafkaSinkConfig>(jail, &toml).unwrap().topic,
                "app.{aggregate_type}"
            );
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_where_it_was_set() {
        in_jail(|jail| {
            let e = refused::<KafkaSinkConfig>(jail, BASE);
            assert!(
                e.starts_with("sink.kafka.\"bootstrap.servers\": missing required key")
                    && e.contains("OUTBOX_SINK__KAFKA__BOOTSTRAP__SERVERS"),
                "{e}"
            );

            let servers = "[sink.kafka]\n\"bootstrap.servers\" = \"k:9092\"";
            let e =
                refused::<KafkaSinkConfig>(jail, &format!("{BASE}\n{servers}\n\"lingr.ms\" = 5\n"));
            assert!(
                e.starts_with("sink.kafka.\"lingr.ms\": No such configuration property")
                    && e.ends_with("(in relay.toml)"),
                "{e}"
            );

            let toml = format!("{BASE}\n{servers}\n");
            jail.set_env("OUTBOX_SINK__KAFKA__ACKS", "most");
            let e = refused::<KafkaSinkConfig>(jail, &toml);
            assert!(
                e.starts_with("sink.kafka.\"acks\": Invalid value")
                    && e.ends_with("(from environment variable OUTBOX_SINK__KAFKA__ACKS)"),
                "{e}"
            );

            jail.set_env("OUTBOX_SINK__KAFKA__ACKS", "all");
            jail.set_env("OUTBOX_SINK__KAFKA__DELIVERY_TIMEOUT", "soon");
            let e = refused::<KafkaSinkConfig>(jail, &toml);
            assert!(
                e.starts_with("sink.kafka.delivery_timeout")
                    && e.contains("OUTBOX_SINK__KAFKA__DELIVERY_TIMEOUT"),
                "{e}"
            );
            Ok(())
        });
    }
}
