//! `[sink.sqs]` as the registry reads it (feature `sink-sqs`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {

    use outboxkit_sink_sqs::SqsConfig;

    use super::super::{checked, in_jail, refused};

    const BASE: &str = base!("sqs");

    #[test]
    fn defaults_and_keys_are_read() {
        in_jail(|jail| {
            let config = checked::<SqsConfig>(jail, BASE).unwrap();
            assert_eq!(config, SqsConfig::default());
            let config = checked::<SqsConfig>(
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
        in_jail(|jail| {
            let toml = format!("{BASE}destination = \"audit.fifo\"\n[sink.sqs]\nqueue = \"x\"\n");
            let config = checked::<SqsConfig>(jail, &toml).unwrap();
            assert_eq!(config.queue, "audit.fifo");
            Ok(())
        });
    }

    #[test]
    fn environment_values_stay_strings() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_SINK__SQS__QUEUE_OWNER_ACCOUNT_ID", "000000000000");
            jail.set_env("OUTBOX_SINK__SQS__MAX_BATCH_LEN", "50");
            let config = checked::<SqsConfig>(jail, BASE).unwrap();
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
        in_jail(|jail| {
            let e = refused::<SqsConfig>(jail, &format!("{BASE}\n[sink.sqs]\nendpont = \"x\"\n"));
            assert!(e.starts_with("sink.sqs.endpont: unknown key"), "{e}");
            assert!(e.contains("relay.toml"), "{e}");
            // Credentials are not keys: they come from the AWS chain.
            let secret = "secret_access_key = \"s3cr3t\"";
            let e = refused::<SqsConfig>(jail, &format!("{BASE}\n[sink.sqs]\n{secret}\n"));
            assert!(
                e.starts_with("sink.sqs.secret_access_key: unknown key"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");
            let endpoint = "endpoint = \"127.0.0.1:4566\"";
            let e = refused::<SqsConfig>(jail, &format!("{BASE}\n[sink.sqs]\n{endpoint}\n"));
            assert!(e.starts_with("sink.sqs.endpoint: "), "{e}");
            assert!(e.ends_with("(in relay.toml)"), "{e}");
            jail.set_env("OUTBOX_SINK__SQS__MAX_REQUEST_BYTES", "5000000");
            let e = refused::<SqsConfig>(jail, BASE);
            assert!(e.starts_with("sink.sqs.max_request_bytes: "), "{e}");
            assert!(e.contains("OUTBOX_SINK__SQS__MAX_REQUEST_BYTES"), "{e}");
            Ok(())
        });
    }
}
