//! `[sink.sns]` as the registry reads it (feature `sink-sns`).

use outboxkit_sink_sns::SnsConfig;

use super::*;

#[test]
fn defaults_keys_and_sink_destination_are_read() {
    in_jail(|jail| {
        assert_defaults::<SnsConfig>(jail);
        let config = checked::<SnsConfig>(
            jail,
            &with_section::<SnsConfig>(
                "topic = \"app-{aggregate_type}.fifo\"\n\
                 topic_arn_prefix = \"arn:aws:sns:eu-west-1:000000000000:\"\n\
                 endpoint = \"http://127.0.0.1:4566\"\nrequest_timeout = \"3s\"",
            ),
        )
        .unwrap();
        assert_eq!(config.topic, "app-{aggregate_type}.fifo");
        assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:4566"));
        assert_eq!(config.request_timeout, std::time::Duration::from_secs(3));
        assert_eq!(
            with_destination::<SnsConfig>(jail, "audit", "").topic,
            "audit"
        );
        Ok(())
    });
}

#[test]
fn environment_values_stay_strings_and_errors_name_the_key() {
    in_jail(|jail| {
        let config: SnsConfig = from_environment(
            jail,
            &[(
                "OUTBOX_SINK__SNS__TOPIC_ARN_PREFIX",
                "arn:aws:sns:us-east-1:000000000000:",
            )],
        );
        assert_eq!(
            config.topic_arn_prefix.as_deref(),
            Some("arn:aws:sns:us-east-1:000000000000:")
        );
        let e = refused_key::<SnsConfig>(jail, "secret_access_key", "\"s3cr3t\"", "unknown key");
        assert!(!e.contains("s3cr3t"), "{e}");
        refused_from_environment::<SnsConfig>(
            jail,
            &base::<SnsConfig>(),
            ("OUTBOX_SINK__SNS__MAX_REQUEST_BYTES", "1048576"),
            "sink.sns.max_request_bytes",
        );
        Ok(())
    });
}
