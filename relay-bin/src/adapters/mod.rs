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
    crate::registry::sink_config_in_file::<C>(std::path::Path::new(file))
}
