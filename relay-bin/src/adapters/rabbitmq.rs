//! `[sink.rabbitmq]` as the registry reads it (feature `sink-rabbitmq`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {
    use outboxkit_sink_rabbitmq::RabbitMqConfig;

    use super::super::{checked, in_jail, refused};

    const BASE: &str = base!("rabbitmq");

    #[test]
    fn a_minimal_section_is_valid() {
        in_jail(|jail| {
            let toml = format!("{BASE}\n[sink.rabbitmq]\nexchange = \"events\"\n");
            checked::<RabbitMqConfig>(jail, &toml).unwrap();
            checked::<RabbitMqConfig>(jail, BASE).unwrap();
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        in_jail(|jail| {
            let toml = format!("{BASE}\n[sink.rabbitmq]\nurl = \"http://mq\"\n");
            let e = refused::<RabbitMqConfig>(jail, &toml);
            assert!(e.contains("sink.rabbitmq.url: unsupported scheme"), "{e}");
            assert!(e.contains("relay.toml"), "{e}");

            let toml = format!("{BASE}\n[sink.rabbitmq]\nexchnage = \"events\"\n");
            let e = refused::<RabbitMqConfig>(jail, &toml);
            assert!(e.contains("exchnage"), "{e}");

            let toml = format!("{BASE}destination = \"{{aggregate}}\"\n[sink.rabbitmq]\n");
            let e = refused::<RabbitMqConfig>(jail, &toml);
            assert!(e.contains("sink.destination"), "{e}");

            let toml = format!(
                "{BASE}\n[sink.rabbitmq]\nurl = \"amqps://mq\"\n\
                 [sink.rabbitmq.tls]\nca_file = \"/nonexistent/ca.pem\"\n"
            );
            let e = refused::<RabbitMqConfig>(jail, &toml);
            assert!(e.contains("sink.rabbitmq.tls.ca_file: cannot read"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn the_password_comes_from_password_file_and_never_shows() {
        in_jail(|jail| {
            jail.create_file("amqp-password", "s3cr3t-from-file\n")?;
            let toml = format!(
                "{BASE}\n[sink.rabbitmq]\nurl = \"amqp://relay@mq:5672/%2f\"\n\
                 password_file = \"amqp-password\"\n"
            );
            let config = checked::<RabbitMqConfig>(jail, &toml).unwrap();
            assert_eq!(config.password.as_deref(), Some("s3cr3t-from-file"));
            assert_eq!(config.url, "amqp://relay@mq:5672/%2f");
            let debug = format!("{config:?}");
            assert!(
                !debug.contains("s3cr3t") && debug.contains("***"),
                "{debug}"
            );

            // The key and its file together are refused, naming both.
            let toml = format!(
                "{BASE}\n[sink.rabbitmq]\npassword = \"inline-s3cr3t\"\n\
                 password_file = \"amqp-password\"\n"
            );
            let e = refused::<RabbitMqConfig>(jail, &toml);
            assert!(
                e.contains("sink.rabbitmq.password") && e.contains("sink.rabbitmq.password_file"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");

            // And from the environment.
            jail.set_env("OUTBOX_SINK__RABBITMQ__PASSWORD", "env-s3cr3t");
            let config = checked::<RabbitMqConfig>(jail, BASE).unwrap();
            assert_eq!(config.password.as_deref(), Some("env-s3cr3t"));
            Ok(())
        });
    }

    #[test]
    fn the_environment_overrides_and_keeps_passwords_as_text() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_SINK__RABBITMQ__URL", "amqp://relay:007@mq:5672/%2f");
            jail.set_env("OUTBOX_SINK__RABBITMQ__EXCHANGE", "123");
            jail.set_env("OUTBOX_SINK__RABBITMQ__MANDATORY", "false");
            jail.set_env("OUTBOX_SINK__DESTINATION", "app.{aggregate_type}");
            let config = checked::<RabbitMqConfig>(jail, BASE).unwrap();
            assert_eq!(config.url, "amqp://relay:007@mq:5672/%2f");
            assert_eq!(config.exchange, "123");
            assert!(!config.mandatory);
            assert_eq!(config.routing_key, "app.{aggregate_type}");
            assert!(!format!("{config:?}").contains("007"));
            Ok(())
        });
    }
}
