//! `[sink.sns]` as the registry reads it (feature `sink-sns`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {

    use figment::Jail;
    use outboxkit_sink_sns::SnsConfig;

    const BASE: &str = base!("sns");

    /// Load `relay.toml` (written by the test) and run the `[sink.sns]` check on it.
    fn checked(jail: &mut Jail, toml: &str) -> outboxkit_core::Result<SnsConfig> {
        jail.create_file("relay.toml", toml)
            .expect("writing the test configuration");
        super::super::read_sink("relay.toml")
    }

    #[test]
    fn defaults_keys_and_sink_destination_are_read() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            assert_eq!(checked(jail, BASE).unwrap(), SnsConfig::default());
            let config = checked(
                jail,
                &format!(
                    "{BASE}\n[sink.sns]\ntopic = \"app-{{aggregate_type}}.fifo\"\n\
                     topic_arn_prefix = \"arn:aws:sns:eu-west-1:000000000000:\"\n\
                     endpoint = \"http://127.0.0.1:4566\"\nrequest_timeout = \"3s\"\n"
                ),
            )
            .unwrap();
            assert_eq!(config.topic, "app-{aggregate_type}.fifo");
            assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
            assert_eq!(config.request_timeout, std::time::Duration::from_secs(3));
            let toml = BASE.replace("kind = \"sns\"", "kind = \"sns\"\ndestination = \"audit\"");
            assert_eq!(checked(jail, &toml).unwrap().topic, "audit");
            Ok(())
        });
    }

    #[test]
    fn environment_values_stay_strings_and_errors_name_the_key() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env(
                "OUTBOX_SINK__SNS__TOPIC_ARN_PREFIX",
                "arn:aws:sns:us-east-1:000000000000:",
            );
            let config = checked(jail, BASE).unwrap();
            assert_eq!(
                config.topic_arn_prefix.as_deref(),
                Some("arn:aws:sns:us-east-1:000000000000:")
            );
            let e = checked(
                jail,
                &format!("{BASE}\n[sink.sns]\nsecret_access_key = \"s3cr3t\"\n"),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with("sink.sns.secret_access_key: unknown key"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");
            jail.set_env("OUTBOX_SINK__SNS__MAX_REQUEST_BYTES", "1048576");
            let e = checked(jail, BASE).unwrap_err().to_string();
            assert!(e.starts_with("sink.sns.max_request_bytes: "), "{e}");
            assert!(e.contains("OUTBOX_SINK__SNS__MAX_REQUEST_BYTES"), "{e}");
            Ok(())
        });
    }
}
