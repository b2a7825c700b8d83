//! The plugin contract: a store or a sink is one configuration type that implements one trait.
//!
//! The trait gives the kind name (in exactly one place), the settings section (the type itself,
//! deserialized with unknown keys refused), the checks that need no connection, and `build`.
//! The binary's registry does the rest, the same way for every adapter, shipped or not: it reads
//! the section from the configuration file and the `OUTBOX_*` environment, applies
//! `sink.destination`, runs `validate` before anything connects, adds where each key was set to
//! every configuration error, and lists the kind in `--version`.
//!
//! ```no_run
//! use outboxkit_core::{Error, Result, SinkConfig};
//! # use outboxkit_core::{OutboxEvent, Outcome, Sink};
//! # #[derive(Debug)] pub struct LogSink;
//! # #[async_trait::async_trait]
//! # impl Sink for LogSink {
//! #     fn kind(&self) -> &'static str { "log" }
//! #     fn destination(&self, _: &OutboxEvent) -> String { String::new() }
//! #     async fn check(&self) -> Result<()> { Ok(()) }
//! #     async fn publish(&self, b: &[OutboxEvent]) -> Result<Vec<Outcome>> { Ok(vec![]) }
//! # }
//!
//! /// `[sink.log]`
//! #[derive(Debug, serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! pub struct LogConfig {
//!     #[serde(default = "default_prefix")]
//!     pub prefix: String,
//! }
//! fn default_prefix() -> String { "{aggregate_type}".into() }
//!
//! impl SinkConfig for LogConfig {
//!     const KIND: &'static str = "log";
//!     type Sink = LogSink;
//!     fn destination_mut(&mut self) -> &mut String { &mut self.prefix }
//!     fn validate(&self) -> Result<()> {
//!         if self.prefix.is_empty() {
//!             return Err(Error::config("sink.log.prefix: must not be empty"));
//!         }
//!         Ok(())
//!     }
//!     async fn build(self) -> Result<LogSink> { Ok(LogSink) }
//! }
//! ```

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::Store;

/// A sink kind, implemented by its configuration type: `[sink]` with `kind = KIND` selects it,
/// and the type is read from `[sink.<section>]` (see [`sink_section`]).
///
/// Put `#[serde(deny_unknown_fields)]` on the type so that a misspelt key is an error, and give
/// every key that can have one a default, so that an absent section is valid when nothing is
/// required. Error messages start with the full key (`sink.mqtt.url: ...`); the registry then
/// adds where that key was set.
pub trait SinkConfig: DeserializeOwned + fmt::Debug + Send + 'static {
    /// The kind as written in `sink.kind`, e.g. `"redis-streams"`.
    const KIND: &'static str;

    /// The sink `build` returns.
    type Sink: Sink;

    /// The destination template that `sink.destination` replaces (stream, topic, routing key,
    /// topic filter...). The registry checks the template before it calls this.
    fn destination_mut(&mut self) -> &mut String;

    /// The key in `[sink.<section>]` of that template (`"topic"`), when the sink's messages
    /// name it (`sink.sns.topic: no such topic`): where `sink.destination` set the template,
    /// the relay's messages then say `sink.destination`, the key the user wrote.
    const DESTINATION_KEY: Option<&'static str> = None;

    /// Checks that need no connection (URLs, ranges, files that must exist). Runs before the
    /// relay connects to anything. Errors name their key: `sink.<section>.<key>: ...`.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// Connect (or prepare to connect) and return the sink. Called only after `validate`
    /// passed. `run` calls [`Sink::check`] right after.
    fn build(self) -> impl Future<Output = Result<Self::Sink>> + Send;
}

/// A store kind, implemented by its configuration type: `[store]` with `kind = KIND` selects
/// it, and the type is read from the rest of `[store]`.
///
/// Same conventions as [`SinkConfig`]: `#[serde(deny_unknown_fields)]`, defaults wherever
/// possible, error messages that start with `store.<key>: `.
pub trait StoreConfig: DeserializeOwned + fmt::Debug + Send + 'static {
    /// The kind as written in `store.kind`, e.g. `"postgres"`.
    const KIND: &'static str;

    /// The store `build` returns.
    type Store: Store;

    /// Checks that need no connection. Errors name their key: `store.<key>: ...`.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The outbox table this configuration relays from, as text that two configurations share
    /// when they name the same table of the same database (say `postgres db:5432/app
    /// public.outbox`), without secrets. The binary refuses two pipelines with the same one.
    /// `None` (the default) when the store cannot tell without connecting.
    fn table_identity(&self) -> Option<String> {
        None
    }

    /// Whether this configuration relays `table`, a table another pipeline's pattern found
    /// (its qualified name, and `identity`, its [`table_identity`](Self::table_identity)): the
    /// table it names, or (a pattern) one it matches, on the same database. The binary gives
    /// such a table to one pipeline only. The default compares the identities, which is right
    /// for a store without patterns.
    fn relays_table(&self, table: &str, identity: &str) -> bool {
        let _ = table;
        self.table_identity().as_deref() == Some(identity)
    }

    /// `Some` when this configuration names a pattern of tables (discovery) rather than one
    /// table: the binary then calls [`discover`](Self::discover) every `interval` and runs one
    /// relay per table found, starting new tables' relays and stopping dropped tables' ones.
    /// `None` (the default): one table.
    fn discovery(&self) -> Option<Discovery> {
        None
    }

    /// The tables the pattern matches now, each as its name (`tenant_7.outbox`) and a
    /// configuration of that one table. Called only when [`discovery`](Self::discovery) is
    /// `Some`. Errors as `build`'s (an unreachable server is retried at the next scan).
    fn discover(&self) -> impl Future<Output = Result<Vec<(String, Self)>>> + Send {
        std::future::ready(Ok(Vec::new()))
    }

    /// The SQL [`Store::migrate`] runs to create this configuration's
    /// table at the current schema version, for a database administrator to review and apply
    /// (`outbox-relay migrate --print-sql`), written without connecting. `Ok(None)` (the
    /// default): the store cannot give it; an error when this configuration needs more than
    /// SQL (names its key).
    fn migration_sql(&self) -> Result<Option<String>> {
        Ok(None)
    }

    /// Connect and return the store. Called only after `validate` passed.
    fn build(self) -> impl Future<Output = Result<Self::Store>> + Send;
}

/// How a store configuration that names a pattern of tables is scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Discovery {
    /// How often to look for new and dropped tables.
    pub interval: Duration,
    /// Refuse to start when the pattern matches no table (otherwise a warning).
    pub require_match: bool,
}

/// The settings section of a sink kind: `[sink.<section>]`, the kind with `-` turned into `_`
/// (`redis-streams` → `redis_streams`), since TOML keys and environment variables read better
/// that way (`OUTBOX_SINK__REDIS_STREAMS__URL`).
pub fn sink_section(kind: &str) -> String {
    kind.replace('-', "_")
}

/// The bytes of a file that setting `<section>.<key>` names (a CA certificate, a client key, a
/// credentials file), read by `validate` so that a missing file stops the relay before it
/// connects. The error names the setting: `sink.nats.tls.ca_file: cannot read `/etc/ca.pem`:
/// No such file or directory (os error 2)`.
pub fn read_setting_file(section: &str, key: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::config(format!(
            "{section}.{key}: cannot read `{}`: {e}",
            path.display()
        ))
    })
}

/// The value `raw` of URL setting `key` (`sink.nats.url`), parsed and checked: one of
/// `schemes`, with a host. Errors name the key and show the value as `shown` (without its
/// password, see [`crate::redact`]); `hint` ends the error of a value that is not a URL at all
/// (`" (expected nats://host:4222)"`, or `""`), then, for a URL with a user-info part, the
/// advice to percent-encode: `sink.nats.url: `nats//a` is not a URL: relative URL without a
/// base (expected ...)`, `sink.nats.url: unsupported scheme `http://` (expected
/// nats:// or tls://)`, `sink.nats.url: `nats://` has no host`.
pub fn parse_url_setting(
    key: &str,
    raw: &str,
    shown: &str,
    schemes: &[&str],
    hint: &str,
) -> Result<url::Url> {
    let url = url::Url::parse(raw).map_err(|e| {
        let reserved = crate::redact::reserved_characters_hint(raw);
        Error::config(format!(
            "{key}: `{shown}` is not a URL: {e}{hint}{reserved}"
        ))
    })?;
    if !schemes.contains(&url.scheme()) {
        let expected: Vec<String> = schemes.iter().map(|s| format!("{s}://")).collect();
        return Err(Error::config(format!(
            "{key}: unsupported scheme `{}://` (expected {})",
            url.scheme(),
            expected.join(" or ")
        )));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::config(format!("{key}: `{shown}` has no host")));
    }
    Ok(url)
}

/// Refuse a zero duration: the first of `durations` (each a key under `section` and its value)
/// that is zero is a configuration error naming it, `sink.nats.connect_timeout: must be longer
/// than 0s`.
pub fn refuse_zero_durations(section: &str, durations: &[(&str, Duration)]) -> Result<()> {
    refuse_first(
        section,
        durations,
        Duration::is_zero,
        "must be longer than 0s",
    )
}

/// Refuse a query option of `url` (the setting `key`) that is not one of `known`, the options
/// its client reads (one ending in `[` stands for every key it starts): a client ignores the
/// others, so a misspelt one would quietly do nothing. The error names the closest known one:
/// `sink.rabbitmq.url: unknown option `heartbeet`: did you mean `heartbeat`?`.
pub fn refuse_unknown_url_options(key: &str, url: &url::Url, known: &[&str]) -> Result<()> {
    let is_known = |option: &str| {
        known
            .iter()
            .any(|k| *k == option || (k.ends_with('[') && option.starts_with(k)))
    };
    let Some((option, _)) = url.query_pairs().find(|(option, _)| !is_known(option)) else {
        return Ok(());
    };
    Err(Error::config(match closest(&option, known) {
        Some(k) => format!("{key}: unknown option `{option}`: did you mean `{k}`?"),
        None if known.is_empty() => format!(
            "{key}: unknown option `{option}`, which would be ignored: remove it (the client \
             reads no option from the URL)"
        ),
        None => {
            let names: Vec<String> = known.iter().map(|k| k.replace('[', "[key]")).collect();
            format!(
                "{key}: unknown option `{option}`, which would be ignored: remove it (the \
                 options the relay takes: {})",
                names.join(", ")
            )
        }
    }))
}

/// The one of `known` closest to `word`, two one-character edits away at most: what a "did you
/// mean" names (`heartbeet` → `heartbeat`).
pub fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(word, k), *k))
        .filter(|(distance, _)| *distance <= 2)
        .min()
        .map(|(_, k)| k)
}

/// How many one-character insertions, deletions and substitutions turn `a` into `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substituted = diagonal + usize::from(ca != *cb);
            diagonal = row[j + 1];
            row[j + 1] = substituted.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

/// Refuse a zero count: the first of `counts` (each a key under `section` and its value) that is
/// zero is a configuration error naming it, `sink.kafka.max_batch_len: must be at least 1`.
pub fn refuse_zero_counts(section: &str, counts: &[(&str, usize)]) -> Result<()> {
    refuse_first(section, counts, |count| *count == 0, "must be at least 1")
}

/// The first of `values` (each a key under `section` and its value) that is `bad`, refused as a
/// configuration error naming it: `<section>.<key>: <reason>`.
fn refuse_first<T>(
    section: &str,
    values: &[(&str, T)],
    bad: impl Fn(&T) -> bool,
    reason: &str,
) -> Result<()> {
    match values.iter().find(|(_, value)| bad(value)) {
        Some((key, _)) => Err(Error::config(format!("{section}.{key}: {reason}"))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_options_a_client_would_ignore_are_refused_with_the_closest_one() {
        let known = ["sslmode", "sslrootcert", "options["];
        let check = |url: &str| {
            refuse_unknown_url_options("store.url", &url::Url::parse(url).unwrap(), &known)
        };
        check("postgres://db/app?sslmode=require&options[search_path]=app").unwrap();
        check("postgres://db/app").unwrap();
        let e = check("postgres://db/app?sslmode=require&ssl-mode=require").unwrap_err();
        assert_eq!(
            e.message(),
            "store.url: unknown option `ssl-mode`: did you mean `sslmode`?"
        );
        let e = check("postgres://db/app?target_session_attrs=any").unwrap_err();
        assert_eq!(
            e.message(),
            "store.url: unknown option `target_session_attrs`, which would be ignored: remove it \
             (the options the relay takes: sslmode, sslrootcert, options[key])"
        );
        assert_eq!(edit_distance("sslmod", "sslmode"), 1);
        assert_eq!(edit_distance("heartbeet", "heartbeat"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[test]
    fn sections_use_underscores() {
        assert_eq!(sink_section("redis-streams"), "redis_streams");
        assert_eq!(sink_section("kafka"), "kafka");
    }

    #[test]
    fn the_first_zero_duration_is_refused() {
        let second = Duration::from_secs(1);
        refuse_zero_durations("sink.x", &[("a", second), ("b", second)]).unwrap();
        refuse_zero_durations("sink.x", &[]).unwrap();
        let e = refuse_zero_durations(
            "sink.x",
            &[("a", second), ("b", Duration::ZERO), ("c", Duration::ZERO)],
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        assert_eq!(e.message(), "sink.x.b: must be longer than 0s");
    }

    #[test]
    fn the_first_zero_count_is_refused() {
        refuse_zero_counts("sink.x", &[("a", 1), ("b", 2)]).unwrap();
        let e = refuse_zero_counts("sink.x", &[("a", 1), ("b", 0), ("c", 0)]).unwrap_err();
        let expected = (crate::ErrorKind::Config, "sink.x.b: must be at least 1");
        assert_eq!((e.kind(), e.message()), expected);
    }

    #[test]
    fn url_settings_are_parsed_and_errors_name_the_key() {
        let parse = |raw: &str| {
            parse_url_setting(
                "sink.x.url",
                raw,
                "shown",
                &["x", "xs"],
                " (expected x://host)",
            )
            .map_err(|e| e.message().to_owned())
        };
        assert_eq!(parse("xs://h:1/p").unwrap().port(), Some(1));
        for (raw, error) in [
            ("h:1", "unsupported scheme `h://` (expected x:// or xs://)"),
            (
                "no url",
                "`shown` is not a URL: relative URL without a base (expected x://host)",
            ),
            ("x://", "`shown` has no host"),
            ("x:opaque", "`shown` has no host"),
        ] {
            assert_eq!(parse(raw).unwrap_err(), format!("sink.x.url: {error}"));
        }
    }

    #[test]
    fn an_unreadable_setting_file_names_the_setting() {
        let missing = std::env::temp_dir().join("outboxkit-no-such-dir/ca.pem");
        let e = read_setting_file("sink.nats", "tls.ca_file", &missing).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Config);
        let expected = format!(
            "sink.nats.tls.ca_file: cannot read `{}`: ",
            missing.display()
        );
        assert!(e.message().starts_with(&expected), "{e}");
        let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let bytes = read_setting_file("sink.nats", "tls.ca_file", &here).unwrap();
        assert_eq!(bytes, std::fs::read(&here).unwrap());
    }
}
