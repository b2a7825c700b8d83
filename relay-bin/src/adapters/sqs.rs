//! `[sink.sqs]` as the registry reads it (feature `sink-sqs`).

use outboxkit_sink_sqs::SqsConfig;

use super::*;

#[test]
fn defaults_and_keys_are_read() {
    in_jail(|jail| {
        assert_defaults::<SqsConfig>(jail);
        let config = checked::<SqsConfig>(
            jail,
            &with_section::<SqsConfig>(
                "queue = \"app-{aggregate_type}.fifo\"\n\
                 endpoint = \"http://127.0.0.1:4566\"\nregion = \"eu-west-1\"\n\
                 fair_queue_group = true\nrequest_timeout = \"3s\"",
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
        let config: SqsConfig = with_destination(jail, "audit.fifo", "queue = \"x\"");
        assert_eq!(config.queue, "audit.fifo");
        Ok(())
    });
}

#[test]
fn environment_values_stay_strings() {
    in_jail(|jail| {
        let config: SqsConfig = from_environment(
            jail,
            &[
                ("OUTBOX_SINK__SQS__QUEUE_OWNER_ACCOUNT_ID", "000000000000"),
                ("OUTBOX_SINK__SQS__MAX_BATCH_LEN", "50"),
            ],
        );
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
        refused_key::<SqsConfig>(jail, "endpont", "\"x\"", "unknown key");
        // Credentials are not keys: they come from the AWS chain.
        let e = refused_key::<SqsConfig>(jail, "secret_access_key", "\"s3cr3t\"", "unknown key");
        assert!(!e.contains("s3cr3t"), "{e}");
        refused_key::<SqsConfig>(jail, "endpoint", "\"127.0.0.1:4566\"", "");
        refused_from_environment::<SqsConfig>(
            jail,
            &base::<SqsConfig>(),
            ("OUTBOX_SINK__SQS__MAX_REQUEST_BYTES", "5000000"),
            "sink.sqs.max_request_bytes",
        );
        Ok(())
    });
}
