//! `kind = "rabbitmq"` (feature `sink-rabbitmq`).

use std::sync::Arc;

use crate::registry::{BoxFuture, Registry};

/// `[sink.rabbitmq]` with `sink.destination` applied (it becomes the routing key template),
/// checked, TLS files readable; errors name the key and where it was set.
fn rabbitmq_config(
    ctx: crate::registry::FactoryContext<'_>,
) -> outboxkit_core::Result<outboxkit_sink_rabbitmq::RabbitMqConfig> {
    use crate::settings::{locate, sink_section};
    use outboxkit_core::Error;

    let file = ctx.file.map(|p| p.as_path());
    let mut config: outboxkit_sink_rabbitmq::RabbitMqConfig =
        sink_section(ctx.figment, "rabbitmq", file).map_err(|e| Error::config(e.0))?;
    if let Some(destination) = &ctx.settings.sink.destination {
        outboxkit_core::DestinationTemplate::parse(destination).map_err(|e| {
            let e = e.context("sink.destination");
            Error::config(locate(e.message(), ctx.figment, file))
        })?;
        config.routing_key = destination.clone();
    }
    config
        .validate()
        .and_then(|()| config.tls_config().map(drop))
        .map_err(|e| Error::config(locate(e.message(), ctx.figment, file)))?;
    Ok(config)
}

fn rabbitmq(
    ctx: crate::registry::FactoryContext<'_>,
) -> BoxFuture<'_, outboxkit_core::Result<Arc<dyn outboxkit_core::Sink>>> {
    Box::pin(async move {
        let config = rabbitmq_config(ctx)?;
        let sink = outboxkit_sink_rabbitmq::RabbitMqSink::connect(config).await?;
        Ok(Arc::new(sink) as Arc<dyn outboxkit_core::Sink>)
    })
}

/// Register `kind = "rabbitmq"` (settings in `[sink.rabbitmq]`).
pub fn register(registry: &mut Registry) {
    registry.register_sink("rabbitmq", rabbitmq);
    registry.register_sink_check("rabbitmq", |ctx| rabbitmq_config(ctx).map(drop));
}

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {
    use std::path::PathBuf;

    use figment::Jail;

    use crate::registry::{FactoryContext, Registry};

    const BASE: &str = r#"
[store]
kind = "postgres"
url = "postgres://localhost/app"

[sink]
kind = "rabbitmq"
"#;

    /// Load `relay.toml` from the jail and run the registered configuration check.
    fn check() -> Result<(), String> {
        let path = PathBuf::from("relay.toml");
        let (settings, figment) =
            crate::settings::load(Some(path.as_path())).map_err(|e| e.to_string())?;
        let mut registry = Registry::empty();
        // A stand-in store, so that these tests need no store feature.
        registry.register_store("postgres", |_| {
            Box::pin(async { Err(outboxkit_core::Error::config("not used by these tests")) })
        });
        super::register(&mut registry);
        let ctx = FactoryContext {
            settings: &settings,
            figment: &figment,
            file: Some(&path),
        };
        registry.check_config(ctx).map_err(|e| e.to_string())
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
    fn the_environment_overrides_and_keeps_passwords_as_text() {
        Jail::expect_with(|jail| {
            jail.clear_env();
            jail.create_file("relay.toml", BASE)?;
            jail.set_env("OUTBOX_SINK__RABBITMQ__URL", "amqp://relay:007@mq:5672/%2f");
            jail.set_env("OUTBOX_SINK__RABBITMQ__EXCHANGE", "123");
            jail.set_env("OUTBOX_SINK__RABBITMQ__MANDATORY", "false");
            jail.set_env("OUTBOX_SINK__DESTINATION", "app.{aggregate_type}");
            let path = PathBuf::from("relay.toml");
            let (settings, figment) = crate::settings::load(Some(path.as_path())).unwrap();
            let ctx = FactoryContext {
                settings: &settings,
                figment: &figment,
                file: Some(&path),
            };
            let config = super::rabbitmq_config(ctx).unwrap();
            assert_eq!(config.url, "amqp://relay:007@mq:5672/%2f");
            assert_eq!(config.exchange, "123");
            assert!(!config.mandatory);
            assert_eq!(config.routing_key, "app.{aggregate_type}");
            assert!(!format!("{config:?}").contains("007"));
            Ok(())
        });
    }
}
