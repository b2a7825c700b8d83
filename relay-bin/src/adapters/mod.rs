//! Tests of the shipped adapters' settings as the registry reads them: defaults, the
//! environment, `sink.destination`, and errors that name the key and where it was set; and
//! the jail every configuration test of this crate runs in ([`in_jail`]).

// Without a sink feature with a module here, only `in_jail` has users.
#![cfg_attr(
    not(any(
        feature = "sink-kafka",
        feature = "sink-nats",
        feature = "sink-rabbitmq",
        feature = "sink-sns",
        feature = "sink-sqs"
    )),
    allow(unused_macros, dead_code)
)]

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

/// Run `test` in a figment jail (its own working directory; the environment restored after)
/// whose environment starts empty, as every configuration test of this crate does.
#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
pub(crate) fn in_jail(test: impl FnOnce(&mut figment::Jail) -> figment::Result<()>) {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        test(jail)
    });
}

/// Write `toml` as the jail's `relay.toml` and read `[sink.<kind>]` of it as the registry does
/// for `C`: defaults, `sink.destination`, validation, errors that say where.
#[cfg(test)]
fn checked<C: outboxkit_core::SinkConfig>(
    jail: &mut figment::Jail,
    toml: &str,
) -> outboxkit_core::Result<C> {
    jail.create_file("relay.toml", toml)
        .expect("writing the test configuration");
    crate::registry::sink_config_in_file::<C>(std::path::Path::new("relay.toml"))
}

/// The error [`checked`] gives for `toml`, as text.
#[cfg(test)]
fn refused<C: outboxkit_core::SinkConfig>(jail: &mut figment::Jail, toml: &str) -> String {
    checked::<C>(jail, toml).unwrap_err().to_string()
}
