//! Tests of the shipped adapters' settings as the registry reads them: defaults, the
//! environment, `sink.destination`, and errors that name the key and where it was set.

/// A configuration with a PostgreSQL `[store]` and `[sink] kind = $kind`, ahead of a test's
/// own lines.
#[cfg(test)]
macro_rules! base {
    ($kind:literal) => {
        concat!(
            "[store]\nkind = \"postgres\"\nurl = \"postgres://app@db:5432/app\"\n\n",
            "[sink]\nkind = \"",
            $kind,
            "\"\n"
        )
    };
}

#[cfg(feature = "sink-kafka")]
mod kafka;
#[cfg(feature = "sink-nats")]
mod nats;
#[cfg(feature = "sink-rabbitmq")]
mod rabbitmq;
#[cfg(feature = "sink-sns")]
mod sns;
#[cfg(feature = "sink-sqs")]
mod sqs;

/// Read `file` (written by the test in its figment jail) and `[sink.<kind>]` of it as the
/// registry does for `C`: defaults, `sink.destination`, validation, errors that say where.
#[cfg(test)]
fn read_sink<C: outboxkit_core::SinkConfig>(file: &str) -> outboxkit_core::Result<C> {
    let file = std::path::PathBuf::from(file);
    let config = |e: crate::settings::ConfigError| outboxkit_core::Error::config(e.to_string());
    let (settings, figment) = crate::settings::load(Some(&file)).map_err(config)?;
    let pipelines = crate::pipeline::resolve(&settings, &figment, Some(&file)).map_err(config)?;
    let ctx = crate::registry::FactoryContext {
        pipeline: &pipelines[0],
        figment: &figment,
        file: Some(&file),
    };
    crate::registry::sink_config::<C>(ctx)
}
