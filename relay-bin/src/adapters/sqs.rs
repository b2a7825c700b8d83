//! `[sink.sqs]` as the registry reads it (feature `sink-sqs`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {

    use figment::Jail;

    const BASE: &str = base!("sqs");

    /// Load `relay.toml` (written by the test) and run the `[sink.sqs]` check on it.
    fn checked(
        jail: &mut Jail,
        toml: &str,
    ) -> outboxkit_core::Result<outboxkit_sink_sqs::SqsConfig> {
        jail.create_file("relay.toml", toml)
            .expect("writing the test configuration");
        super::super::read_sink("relay.toml")
    }

    #[test]
    fn defaults_and_keys_are_read() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let config = checked(jail, BASE).unwrap();
            assert_eq!(config, outboxkit_sink_sqs::SqsConfig::default());
            let config = checked(
                jail,
                &format!(
                    "{BASE}\n[sink.sqs]\nqueue = \"app-{{aggregate_type}}.fifo\"\n\
                     endpoint = \"http://127.0.0.1:4566\"\nregion = \"eu-west-1\"\n\
                     fair_queue_group = true\nrequest_timeout = \"3s\"\n"
                ),
            )
            .unwrap();
            assert_eq!(config.queue, "app-{aggregate_type}.fifo");
            assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
            assert_eq!(config.region.as_deref(), Some("eu-west-1"));
            assert!(config.fair_queue_group);
            assert_eq!(config.request_timeout, std::time::Duration::from_secs(3));
            Ok(())
        });
    }

    #[test]
    fn sink_destination_overrides_the_queue_template() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let toml = BASE.replace(
                "kind = \"sqs\"",
                "kind = \"sqs\"\ndestination = \"audit.fifo\"",
            );
            let config = checked(jail, &format!("{toml}\n[sink.sqs]\nqueue = \"x\"\n")).unwrap();
            assert_eq!(config.queue, "audit.fifo");
            Ok(())
        });
    }

    #[test]
    fn environment_values_stay_strings() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.set_env("OUTBOX_SINK__SQS__QUEUE_OWNER_ACCOUNT_ID", "000000000000");
            jail.set_env("OUTBOX_SINK__SQS__MAX_BATCH_LEN", "50");
            let config = checked(jail, BASE).unwrap();
            assert_eq!(
                config.queue_owner_account_id.as_deref(),
                Some("000000000000")
            );
            assert_eq!(config.max_batch_len, 50);
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_where_it_was_set() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            let e = checked(jail, &format!("{BASE}\n[sink.sqs]\nendpont = \"x\"\n"))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with("sink.sqs.endpont: unknown key"), "{e}");
            assert!(e.contains("relay.toml"), "{e}");
            // Credentials are not keys: they come from the AWS chain.
            let e = checked(
                jail,
                &format!("{BASE}\n[sink.sqs]\nsecret_access_key = \"s3cr3t\"\n"),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.starts_with("sink.sqs.secret_access_key: unknown key"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");
            let e = checked(
                jail,
                &format!("{BASE}\n[sink.sqs]\nendpoint = \"127.0.0.1:4566\"\n"),
            )
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("sink.sqs.endpoint: "), "{e}");
            assert!(e.ends_with("(in relay.toml)"), "{e}");
            jail.set_env("OUTBOX_SINK__SQS__MAX_REQUEST_BYTES", "5000000");
            let e = checked(jail, BASE).unwrap_err().to_string();
            assert!(e.starts_with("sink.sqs.max_request_bytes: "), "{e}");
            assert!(e.contains("OUTBOX_SINK__SQS__MAX_REQUEST_BYTES"), "{e}");
            Ok(())
        });
    }
}
