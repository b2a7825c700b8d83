//! `[sink.sns]` as the registry reads it (feature `sink-sns`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {

    use outboxkit_sink_sns::SnsConfig;

    use super::super::{checked, in_jail, refused};

    const BASE: &str = base!("sns");

    #[test]
    fn defaults_keys_and_sink_destination_are_read() {
        in_jail(|jail| {
            assert_eq!(
                checked::<SnsConfig>(jail, BASE).unwrap(),
                SnsConfig::default()
            );
            let config = checked::<SnsConfig>(
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
            let toml = format!("{BASE}destination = \"audit\"\n");
            assert_eq!(checked::<SnsConfig>(jail, &toml).unwrap().topic, "audit");
            Ok(())
        });
    }

    #[test]
    fn environment_values_stay_strings_and_errors_name_the_key() {
        in_jail(|jail| {
            jail.set_env(
                "OUTBOX_SINK__SNS__TOPIC_ARN_PREFIX",
                "arn:aws:sns:us-east-1:000000000000:",
            );
            let config = checked::<SnsConfig>(jail, BASE).unwrap();
            assert_eq!(
                config.topic_arn_prefix.as_deref(),
                Some("arn:aws:sns:us-east-1:000000000000:")
            );
            let secret = "secret_access_key = \"s3cr3t\"";
            let e = refused::<SnsConfig>(jail, &format!("{BASE}\n[sink.sns]\n{secret}\n"));
            assert!(
                e.starts_with("sink.sns.secret_access_key: unknown key"),
                "{e}"
            );
            assert!(!e.contains("s3cr3t"), "{e}");
            jail.set_env("OUTBOX_SINK__SNS__MAX_REQUEST_BYTES", "1048576");
            let e = refused::<SnsConfig>(jail, BASE);
            assert!(e.starts_with("sink.sns.max_request_bytes: "), "{e}");
            assert!(e.contains("OUTBOX_SINK__SNS__MAX_REQUEST_BYTES"), "{e}");
            Ok(())
        });
    }
}
