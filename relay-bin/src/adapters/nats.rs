//! `[sink.nats]` as the registry reads it (feature `sink-nats`).

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {

    use outboxkit_sink_nats::{NatsConfig, Storage};

    use super::super::{checked, in_jail, refused};

    const BASE: &str = base!("nats");

    #[test]
    fn defaults_and_keys_are_read() {
        in_jail(|jail| {
            let config = checked::<NatsConfig>(jail, BASE).unwrap();
            assert_eq!(config, NatsConfig::default());
            let config = checked::<NatsConfig>(
                jail,
                &format!(
                    "{BASE}\n[sink.nats]\nurl = \"nats://a:4222,nats://b:4222\"\n\
                     subject = \"app.{{aggregate_type}}\"\nrequest_timeout = \"3s\"\n\
                     [sink.nats.declare_stream]\nname = \"APP\"\nstorage = \"memory\"\n"
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
            let toml = format!(
                "{BASE}destination = \"audit.{{event_type}}\"\n[sink.nats]\nsubject = \"x\"\n"
            );
            let config = checked::<NatsConfig>(jail, &toml).unwrap();
            assert_eq!(config.subject, "audit.{event_type}");
            Ok(())
        });
    }

    #[test]
    fn environment_values_stay_strings_and_secrets_stay_hidden() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_SINK__NATS__TOKEN", "123456");
            jail.set_env("OUTBOX_SINK__NATS__MAX_BATCH_LEN", "50");
            let config = checked::<NatsConfig>(jail, BASE).unwrap();
            assert_eq!(config.token.as_deref(), Some("123456"));
            assert_eq!(config.max_batch_len, 50);
            assert!(!format!("{config:?}").contains("123456"));
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_where_it_was_set() {
        in_jail(|jail| {
            let e = refused::<NatsConfig>(jail, &format!("{BASE}\n[sink.nats]\nsubjet = \"x\"\n"));
            assert!(e.starts_with("sink.nats.subjet: unknown key"), "{e}");
            assert!(e.contains("relay.toml"), "{e}");
            let url = "url = \"http://relay:s3cr3t@a:4222\"";
            let e = refused::<NatsConfig>(jail, &format!("{BASE}\n[sink.nats]\n{url}\n"));
            assert!(e.starts_with("sink.nats.url: "), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
            assert!(e.ends_with("(in relay.toml)"), "{e}");
            jail.set_env("OUTBOX_SINK__NATS__SUBJECT", "orders..{event_type}");
            let e = refused::<NatsConfig>(jail, BASE);
            assert!(e.starts_with("sink.nats.subject: "), "{e}");
            assert!(e.contains("OUTBOX_SINK__NATS__SUBJECT"), "{e}");
            Ok(())
        });
    }
}
