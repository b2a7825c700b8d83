//! `[sink.rabbitmq]` as the registry reads it (feature `sink-rabbitmq`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {
    use figment::Jail;

    const BASE: &str = base!("rabbitmq");

    /// `relay.toml` of the jail read as the registry reads `[sink.rabbitmq]`.
    fn read() -> outboxkit_sink_rabbitmq::RabbitMqConfig {
        super::super::read_sink("relay.toml").unwrap()
    }

    /// Load `relay.toml` from the jail and read `[sink.rabbitmq]` as the registry does.
    fn check() -> Result<(), String> {
        super::super::read_sink::<outboxkit_sink_rabbitmq::RabbitMqConfig>("relay.toml")
            .map(drop)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_minimal_section_is_valid() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "relay.toml",
                &format!("{BASE}\n[sink.rabbitmq]\nexchange = \"events\"\n"),
            )?;
            assert_eq!(check(), Ok(()));
            jail.create_file("relay.toml", BASE)?;
            assert_eq!(check(), Ok(()));
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file(
                "relay.toml",
                &format!("{BASE}\n[sink.rabbitmq]\nurl = \"http://mq\"\n"),
            )?;
            let e = check().unwrap_err();
            assert!(e.contains("sink.rabbitmq.url: unsupported scheme"), "{e}");
            assert!(e.contains("relay.toml"), "{e}");

            jail.create_file(
                "relay.toml",
                &format!("{BASE}\n[sink.rabbitmq]\nexchnage = \"events\"\n"),
            )?;
            let e = check().unwrap_err();
            assert!(e.contains("exchnage"), "{e}");

            jail.create_file(
                "relay.toml",
                &format!("{BASE}destination = \"{{aggregate}}\"\n[sink.rabbitmq]\n"),
            )?;
            let e = check().unwrap_err();
            assert!(e.contains("sink.destination"), "{e}");

            jail.create_file(
                "relay.toml",
                &format!(
                    "{BASE}\n[sink.rabbitmq]\nurl = \"amqps://mq\"\n\
                     [sink.rabbitmq.tls]\nca_file = \"/nonexistent/ca.pem\"\n"
                ),
            )?;
            let e = check().unwrap_err();
            assert!(e.contains("sink.rabbitmq.tls.ca_file: cannot read"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn the_password_comes_from_password_file_and_never_shows() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("amqp-password", "s3cr3t-from-file\n")?;
            jail.create_file(
                "relay.toml",
                &format!(
                    "{BASE}\n[sink.rabbitmq]\nurl = \"amqp://relay@mq:5672/%2f\"\n\
                     password_file = \"amqp-password\"\n"
                ),
            )?;
            let config = read();
            assert_eq!(config.password.as_deref(), Some("s3cr3t-from-file"));
            assert_eq!(config.url, "amqp://relay@mq:5672/%2f");
            let debug = format!("{config:?}");
            assert!(
                !debug.contains("s3cr3t") && debug.contains("***"),
                "{debug}"
            );

            // The key and its file together are refused, naming both.
            jail.create_file(
                "relay.toml",
                &format!(
                    "{BASE}\n[sink.rabbitmq]\npassword = \"inline-s3cr3t\"\n\
                     password_file = \"amqp-password\"\n"
                ),
            )?;
            let e = check().unwrap_err();
            assert!(
                e.contains("sink.rabbitmq.password") && e.contains("sink.rabbitmq.password_file"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");

            // And from the environment.
            jail.create_file("relay.toml", BASE)?;
            jail.set_env("OUTBOX_SINK__RABBITMQ__PASSWORD", "env-s3cr3t");
            let config = read();
            assert_eq!(config.password.as_deref(), Some("env-s3cr3t"));
            Ok(())
        });
    }

    #[test]
    fn the_environment_overrides_and_keeps_passwords_as_text() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("relay.toml", BASE)?;
            jail.set_env("OUTBOX_SINK__RABBITMQ__URL", "amqp://relay:007@mq:5672/%2f");
            jail.set_env("OUTBOX_SINK__RABBITMQ__EXCHANGE", "123");
            jail.set_env("OUTBOX_SINK__RABBITMQ__MANDATORY", "false");
            jail.set_env("OUTBOX_SINK__DESTINATION", "app.{aggregate_type}");
            let config = read();
            assert_eq!(config.url, "amqp://relay:007@mq:5672/%2f");
            assert_eq!(config.exchange, "123");
            assert!(!config.mandatory);
            assert_eq!(config.routing_key, "app.{aggregate_type}");
            assert!(!format!("{config:?}").contains("007"));
            Ok(())
        });
    }
}
