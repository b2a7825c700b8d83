//! `[sink.rabbitmq]` as the registry reads it (feature `sink-rabbitmq`).

use outboxkit_sink_rabbitmq::RabbitMqConfig;

use super::*;

#[test]
fn a_minimal_section_is_valid() {
    in_jail(|jail| {
        checked::<RabbitMqConfig>(
            jail,
            &with_section::<RabbitMqConfig>("exchange = \"events\""),
        )
        .unwrap();
        checked::<RabbitMqConfig>(jail, &base::<RabbitMqConfig>()).unwrap();
        Ok(())
    });
}

#[test]
fn errors_name_the_key_and_the_file() {
    in_jail(|jail| {
        refused_key::<RabbitMqConfig>(jail, "url", "\"http://mq\"", "unsupported scheme");
        refused_key::<RabbitMqConfig>(jail, "exchnage", "\"events\"", "unknown key");

        let toml = format!(
            "{}destination = \"{{aggregate}}\"\n[sink.rabbitmq]\n",
            base::<RabbitMqConfig>()
        );
        let e = refused::<RabbitMqConfig>(jail, &toml);
        assert!(e.contains("sink.destination"), "{e}");

        let toml = with_section::<RabbitMqConfig>(
            "url = \"amqps://mq\"\n[sink.rabbitmq.tls]\nca_file = \"/nonexistent/ca.pem\"",
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
        let toml = with_section::<RabbitMqConfig>(
            "url = \"amqp://relay@mq:5672/%2f\"\npassword_file = \"amqp-password\"",
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
        let toml = with_section::<RabbitMqConfig>(
            "password = \"inline-s3cr3t\"\npassword_file = \"amqp-password\"",
        );
        let e = refused::<RabbitMqConfig>(jail, &toml);
        assert!(
            e.contains("sink.rabbitmq.password") && e.contains("sink.rabbitmq.password_file"),
            "{e}"
        );
        assert!(!e.contains("s3cr3t"), "{e}");

        // And from the environment.
        let config: RabbitMqConfig =
            from_environment(jail, &[("OUTBOX_SINK__RABBITMQ__PASSWORD", "env-s3cr3t")]);
        assert_eq!(config.password.as_deref(), Some("env-s3cr3t"));
        Ok(())
    });
}

#[test]
fn the_environment_overrides_and_keeps_passwords_as_text() {
    in_jail(|jail| {
        let config: RabbitMqConfig = from_environment(
            jail,
            &[
                ("OUTBOX_SINK__RABBITMQ__URL", "amqp://relay:007@mq:5672/%2f"),
                ("OUTBOX_SINK__RABBITMQ__EXCHANGE", "123"),
                ("OUTBOX_SINK__RABBITMQ__MANDATORY", "false"),
                ("OUTBOX_SINK__DESTINATION", "app.{aggregate_type}"),
            ],
        );
        assert_eq!(config.url, "amqp://relay:007@mq:5672/%2f");
        assert_eq!(config.exchange, "123");
        assert!(!config.mandatory);
        assert_eq!(config.routing_key, "app.{aggregate_type}");
        assert!(!format!("{config:?}").contains("007"));
        Ok(())
    });
}
