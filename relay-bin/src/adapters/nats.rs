//! `[sink.nats]` as the registry reads it (feature `sink-nats`).

use outboxkit_sink_nats::{NatsConfig, Storage};

use super::*;

#[test]
fn defaults_and_keys_are_read() {
    in_jail(|jail| {
        assert_defaults::<NatsConfig>(jail);
        let config = checked::<NatsConfig>(
            jail,
            &with_section::<NatsConfig>(
                "url = \"nats://a:4222,nats://b:4222\"\n\
                 subject = \"app.{aggregate_type}\"\nrequest_timeout = \"3s\"\n\
                 [sink.nats.declare_stream]\nname = \"APP\"\nstorage = \"memory\"",
            ),
        )
        .unwrap();
        assert_eq!(config.subject, "app.{aggregate_type}");
        assert_eq!(config.request_timeout, std::time::Duration::from_secs(3));
        let stream = config.declare_stream.unwrap();
        assert_eq!(stream.name, "APP");
        assert_eq!(stream.storage, Storage::Memory);
        Ok(())
    });
}

#[test]
fn sink_destination_overrides_the_subject_template() {
    in_jail(|jail| {
        let config: NatsConfig = with_destination(jail, "audit.{event_type}", "subject = \"x\"");
        assert_eq!(config.subject, "audit.{event_type}");
        Ok(())
    });
}

#[test]
fn environment_values_stay_strings_and_secrets_stay_hidden() {
    in_jail(|jail| {
        let config: NatsConfig = from_environment(
            jail,
            &[
                ("OUTBOX_SINK__NATS__TOKEN", "123456"),
                ("OUTBOX_SINK__NATS__MAX_BATCH_LEN", "50"),
            ],
        );
        assert_eq!(config.token.as_deref(), Some("123456"));
        assert_eq!(config.max_batch_len, 50);
        assert!(!format!("{config:?}").contains("123456"));
        Ok(())
    });
}

#[test]
fn the_token_and_the_nkey_come_from_files_and_never_show() {
    // A user seed, valid in form (the one sink-nats tests with).
    const SEED: &str = "SUAMK2FG4MI6UE3ACF3FK3OIQBCEIEZV7NSWFFEW63UXMRLFM2XLAXK4GY";
    in_jail(|jail| {
        jail.create_file("nats-token", "t0ken-from-file\n")?;
        jail.create_file("nats-nkey", &format!("{SEED}\n"))?;
        let toml = with_section::<NatsConfig>("token_file = \"nats-token\"");
        let config = checked::<NatsConfig>(jail, &toml).unwrap();
        assert_eq!(config.token.as_deref(), Some("t0ken-from-file"));
        assert!(!format!("{config:?}").contains("t0ken"));
        let config: NatsConfig =
            from_environment(jail, &[("OUTBOX_SINK__NATS__NKEY_FILE", "nats-nkey")]);
        assert_eq!(config.nkey.as_deref(), Some(SEED));

        let toml = with_section::<NatsConfig>("token = \"inline\"\ntoken_file = \"nats-token\"");
        let e = refused::<NatsConfig>(jail, &toml);
        assert!(
            e.contains("sink.nats.token (in relay.toml) and sink.nats.token_file (in relay.toml)"),
            "{e}"
        );
        Ok(())
    });
}

#[test]
fn errors_name_the_key_and_where_it_was_set() {
    in_jail(|jail| {
        refused_key::<NatsConfig>(jail, "subjet", "\"x\"", "unknown key");
        let e = refused_key::<NatsConfig>(jail, "url", "\"http://relay:s3cr3t@a:4222\"", "");
        assert!(!e.contains("s3cr3t"), "{e}");
        refused_from_environment::<NatsConfig>(
            jail,
            &base::<NatsConfig>(),
            ("OUTBOX_SINK__NATS__SUBJECT", "orders..{event_type}"),
            "sink.nats.subject",
        );
        Ok(())
    });
}
