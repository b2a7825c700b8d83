//! Tests of the shipped adapters' settings as the registry reads them: defaults, the
//! environment, `sink.destination`, and errors that name the key and where it was set; and
//! the jail every configuration test of this crate runs in ([`in_jail`]).
//!
//! What every sink's section must do is checked here once, for the sink's own keys and values
//! ([`assert_defaults`], [`with_destination`], [`from_environment`], [`refused_key`],
//! [`refused_from_environment`]); each adapter's module adds its own cases.

// Only compiled for tests (see lib.rs). `Jail` closures return `figment::Result`, whose error is
// large; nothing to do about it here.
#![allow(clippy::result_large_err)]
// Without every sink feature, some of the shared checks below have no users.
#![cfg_attr(
    not(all(
        feature = "sink-kafka",
        feature = "sink-nats",
        feature = "sink-rabbitmq",
        feature = "sink-sns",
        feature = "sink-sqs"
    )),
    allow(dead_code)
)]

use outboxkit_core::SinkConfig;

// Each adapter's module is its tests.
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
pub(crate) fn in_jail(test: impl FnOnce(&mut figment::Jail) -> figment::Result<()>) {
    figment::Jail::expect_with(|jail| {
        jail.clear_env();
        test(jail)
    });
}

/// A configuration with a PostgreSQL `[store]` and `[sink] kind = C::KIND`, ahead of a test's
/// own lines.
fn base<C: SinkConfig>() -> String {
    format!(
        "[store]\nkind = \"postgres\"\nurl = \"postgres://app@db:5432/app\"\n\n\
         [sink]\nkind = \"{}\"\n",
        C::KIND
    )
}

/// [`base`], then `[sink.<section>]` of `C` holding `lines`.
fn with_section<C: SinkConfig>(lines: &str) -> String {
    format!(
        "{}\n[sink.{}]\n{lines}\n",
        base::<C>(),
        outboxkit_core::plugin::sink_section(C::KIND)
    )
}

/// Write `toml` as the jail's `relay.toml` and read `[sink.<kind>]` of it as the registry does
/// for `C`: defaults, `sink.destination`, validation, errors that say where.
fn checked<C: SinkConfig>(jail: &mut figment::Jail, toml: &str) -> outboxkit_core::Result<C> {
    jail.create_file("relay.toml", toml)
        .expect("writing the test configuration");
    crate::registry::sink_config_in_file::<C>(std::path::Path::new("relay.toml"))
}

/// The error [`checked`] gives for `toml`, as text.
fn refused<C: SinkConfig>(jail: &mut figment::Jail, toml: &str) -> String {
    checked::<C>(jail, toml).unwrap_err().to_string()
}

/// Without a `[sink.<section>]`, `C` reads as its defaults.
fn assert_defaults<C: SinkConfig + Default + PartialEq + std::fmt::Debug>(
    jail: &mut figment::Jail,
) {
    assert_eq!(checked::<C>(jail, &base::<C>()).unwrap(), C::default());
}

/// `C` read with `sink.destination = destination`, and `[sink.<section>]` holding `lines` when
/// there are any (to show that the destination wins over the sink's own template key).
fn with_destination<C: SinkConfig>(jail: &mut figment::Jail, destination: &str, lines: &str) -> C {
    let base = format!("{}destination = \"{destination}\"\n", base::<C>());
    let toml = if lines.is_empty() {
        base
    } else {
        format!(
            "{base}[sink.{}]\n{lines}\n",
            outboxkit_core::plugin::sink_section(C::KIND)
        )
    };
    checked::<C>(jail, &toml).unwrap()
}

/// `C` read from [`base`] and the environment `vars` (set in the jail, in order): values of
/// string keys stay strings, numeric keys parse them.
fn from_environment<C: SinkConfig>(jail: &mut figment::Jail, vars: &[(&str, &str)]) -> C {
    for (var, value) in vars {
        jail.set_env(var, value);
    }
    checked::<C>(jail, &base::<C>()).unwrap()
}

/// `[sink.<section>]` with `key = value` (a TOML value) is refused: the error starts with
/// `sink.<section>.<key>: <what>` and ends with the file, `(in relay.toml)`. Returns it.
fn refused_key<C: SinkConfig>(
    jail: &mut figment::Jail,
    key: &str,
    value: &str,
    what: &str,
) -> String {
    let e = refused::<C>(jail, &with_section::<C>(&format!("{key} = {value}")));
    let section = outboxkit_core::plugin::sink_section(C::KIND);
    assert!(
        e.starts_with(&format!("sink.{section}.{key}: {what}")),
        "{e}"
    );
    assert!(e.ends_with("(in relay.toml)"), "{e}");
    e
}

/// With the environment variable `var` set to `value`, `toml` is refused: the error starts with
/// `key: ` and names `var`. Returns it.
fn refused_from_environment<C: SinkConfig>(
    jail: &mut figment::Jail,
    toml: &str,
    (var, value): (&str, &str),
    key: &str,
) -> String {
    jail.set_env(var, value);
    let e = refused::<C>(jail, toml);
    assert!(e.starts_with(&format!("{key}: ")), "{e}");
    assert!(e.contains(var), "{e}");
    e
}
