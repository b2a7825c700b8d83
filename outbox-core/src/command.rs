//! The name of the command the operator types: `outbox-relay`, or a team's own binary built
//! on `outboxkit_relay::main` (`outbox-mqtt-relay`). Messages that say what to run, such as
//! ``run `outbox-relay migrate` ``, name it, so that the command the operator copies is one
//! their machine has, with the adapters their configuration needs.
//!
//! The binary sets it once, before anything runs; a library that embeds [`Relay`](crate::Relay)
//! without a command line keeps [`DEFAULT`].

use std::sync::OnceLock;

/// The name of the shipped binary.
pub const DEFAULT: &str = "outbox-relay";

static NAME: OnceLock<String> = OnceLock::new();

/// The command's name: what [`set_name`] was given, else [`DEFAULT`].
pub fn name() -> &'static str {
    NAME.get().map_or(DEFAULT, String::as_str)
}

/// Set the command's name for this process. The first call wins: it returns `false` (and
/// changes nothing) when the name was already set.
pub fn set_name(name: impl Into<String>) -> bool {
    NAME.set(name.into()).is_ok()
}

/// A command line to run, as messages quote it: `` `outbox-relay migrate` `` for `migrate`.
pub fn line(arguments: &str) -> String {
    format!("`{} {arguments}`", name())
}
