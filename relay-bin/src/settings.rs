//! The configuration file: TOML plus `OUTBOX_` environment overrides (`__` nests), via figment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Toml};
use figment::value::{Dict, Value};
use figment::Figment;
use outboxkit_core::RelayConfig;
use serde::{Deserialize, Serialize};

/// The whole configuration.
///
/// One pipeline (outbox table → broker) is `[store]` and `[sink]` at the top level: the pipeline
/// `default`. Several are `[pipelines.<name>]` tables, each with its own `store`, and `relay`
/// and `sink` when they differ from the shared `[relay]` and `[sink]`
/// (see [`crate::pipeline`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `[store]`: the database holding the outbox table of the pipeline `default`.
    #[serde(default)]
    pub store: Option<StoreSettings>,
    /// `[relay]`: engine settings, shared by every pipeline.
    #[serde(default)]
    pub relay: RelayConfig,
    /// `[sink]`: the broker of the pipeline `default`, and of every pipeline without its own.
    #[serde(default)]
    pub sink: Option<SinkSettings>,
    /// `[pipelines.<name>]`: named pipelines.
    #[serde(default)]
    pub pipelines: BTreeMap<String, PipelineSettings>,
    /// `[server]`: metrics and health endpoints.
    #[serde(default)]
    pub server: ServerSettings,
    /// `[log]`: log output.
    #[serde(default)]
    pub log: LogSettings,
}

/// `[store]`: the kind, and the store's own keys, read by that store's configuration type
/// (`url`, `table`, `shards`... for the SQL stores).
#[derive(Clone, Deserialize)]
pub struct StoreSettings {
    /// `postgres` (or another store compiled in or registered).
    pub kind: String,
    /// The store's own keys.
    #[serde(flatten)]
    pub keys: BTreeMap<String, figment::value::Value>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The store's keys may hold secrets (the URL's password): only the kind is printed.
        f.debug_struct("StoreSettings")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

/// `[sink]`: the kind, an optional destination template that overrides the sink's default,
/// and one sub-table per sink kind (`[sink.redis_streams]`, `[sink.kafka]`...), read by that
/// sink's factory.
#[derive(Debug, Clone, Deserialize)]
pub struct SinkSettings {
    /// `redis-streams` (or another sink compiled in or registered).
    pub kind: String,
    /// Destination template, e.g. `{aggregate_type}.{event_type}`; the sink's own default when unset.
    #[serde(default)]
    pub destination: Option<String>,
    /// The per-kind sub-tables; checked against the registered kinds.
    #[serde(flatten)]
    pub sections: BTreeMap<String, figment::value::Value>,
}

/// `[pipelines.<name>]`: one outbox table and where its events go.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSettings {
    /// `[pipelines.<name>.store]`, as `[store]`.
    pub store: StoreSettings,
    /// `[pipelines.<name>.relay]`: keys that replace the shared `[relay]` ones for this
    /// pipeline (read in [`crate::pipeline`], with the shared keys under them).
    #[serde(default)]
    pub relay: Option<Dict>,
    /// `[pipelines.<name>.sink]`, as `[sink]`; the shared `[sink]` when absent.
    #[serde(default)]
    pub sink: Option<SinkSettings>,
}

/// `[server]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSettings {
    /// Address of `/metrics`, `/healthz` and `/readyz`; empty to serve nothing.
    pub listen: String,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".to_owned(),
        }
    }
}

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter, e.g. `info` or `outboxkit_core=debug,info` (`RUST_LOG` wins).
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

/// A configuration error: one line naming the key, and the file or variable it came from.
///
/// Displays as `invalid configuration: <key>: <what> (in <file>)`; the field holds the part
/// after `invalid configuration: `.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    /// One error per figment error, joined with `; `. `prefix` is the key path the figment was
    /// focused on (`sink.redis_streams`), prepended to every key.
    pub(crate) fn from_figment(
        error: figment::Error,
        figment: &Figment,
        file: Option<&Path>,
        prefix: &str,
    ) -> Self {
        let mut parts = Vec::new();
        for e in error {
            let mut path: Vec<&str> = prefix.split('.').filter(|p| !p.is_empty()).collect();
            let mut own = e.path.iter().map(String::as_str).peekable();
            // A path that starts with the profile name ("default") is not a key of ours.
            if let (Some(first), Some(profile)) = (own.peek(), &e.profile) {
                if *first == profile.as_str() && !figment.contains(first) {
                    own.next();
                }
            }
            path.extend(own);
            let key = path.join(".");
            let text = match &e.kind {
                figment::error::Kind::MissingField(field) if field == "kind" => {
                    let said = missing(&key, field, file);
                    match only_section(figment, &key) {
                        Some(section) => format!(
                            "{said}; for [{key}.{section}] it is kind = \"{}\"",
                            section.replace('_', "-")
                        ),
                        None => said,
                    }
                }
                figment::error::Kind::MissingField(field) => missing(&key, field, file),
                kind => {
                    let what = explain(kind, &key);
                    let origin = match origin(figment, &key, file) {
                        Some(origin) => origin,
                        None => match (&e.metadata, file) {
                            (Some(md), _) if is_env(md) && !key.is_empty() => {
                                format!(" (from environment variable {})", env_var_for(&key))
                            }
                            (Some(md), _) if is_env(md) => {
                                " (from OUTBOX_* environment variables)".to_owned()
                            }
                            (_, Some(file)) => format!(" (in {})", file.display()),
                            (_, None) => String::new(),
                        },
                    };
                    if key.is_empty() {
                        format!("{what}{origin}")
                    } else {
                        format!("{key}: {what}{origin}")
                    }
                }
            };
            parts.push(text);
        }
        ConfigError(parts.join("; "))
    }
}

/// `store.url: missing required key (in FILE, or set OUTBOX_STORE__URL)`; a missing top-level
/// table reads `store: missing required table [store] (in FILE)`.
pub(crate) fn missing(parent: &str, field: &str, file: Option<&Path>) -> String {
    let key = if parent.is_empty() {
        field.to_owned()
    } else {
        format!("{parent}.{field}")
    };
    let in_file = file.map(|f| format!("in {}", f.display()));
    if parent.is_empty() && matches!(field, "store" | "sink") {
        return match in_file {
            Some(in_file) => format!("{key}: missing required table [{key}] ({in_file})"),
            None => format!(
                "{key}: missing required table [{key}] (no configuration file given, see --config)"
            ),
        };
    }
    let var = env_var_for(&key);
    match in_file {
        Some(in_file) => format!("{key}: missing required key ({in_file}, or set {var})"),
        None => format!("{key}: missing required key (set it in the --config file or with {var})"),
    }
}

/// The one settings section of a `[sink]` table (`redis_streams` for `[sink.redis_streams]`),
/// which says the kind a table without `kind` is meant to have; none when it has several.
fn only_section(figment: &Figment, table: &str) -> Option<String> {
    if table != "sink" && !table.ends_with(".sink") {
        return None;
    }
    let dict = figment.find_value(table).ok()?.into_dict()?;
    let mut sections = dict
        .into_iter()
        .filter(|(_, value)| value.as_dict().is_some());
    match (sections.next(), sections.next()) {
        (Some((section, _)), None) => Some(section),
        _ => None,
    }
}

/// What is wrong with the value at `key` (`relay.batch_sise`), in words.
fn explain(kind: &figment::error::Kind, key: &str) -> String {
    use figment::error::Kind;
    let last_key = key.rsplit('.').next().filter(|k| !k.is_empty());
    match kind {
        Kind::UnknownField(field, expected) => {
            let parent = key.strip_suffix(field.as_str()).unwrap_or_default();
            unknown_key(parent.trim_end_matches('.'), field, expected)
        }
        Kind::InvalidType(actual, expected) | Kind::InvalidValue(actual, expected) => {
            // The duration parser's own reason ("time unit needed...") does not reach us.
            let expected = match expected.as_str() {
                "a duration" => "a duration such as \"500ms\", \"30s\", \"5m\" or \"7d\"",
                other => other,
            };
            format!("expected {expected}, found {actual}")
        }
        Kind::UnknownVariant(v, expected) => {
            let meant = outboxkit_core::plugin::closest(v, expected)
                .map(|meant| format!(": did you mean `{meant}`?"))
                .unwrap_or_default();
            format!(
                "unknown value `{v}` (expected one of: {}){meant}",
                expected.join(", ")
            )
        }
        Kind::Message(message) => {
            let message = one_line(message);
            // Custom messages often name their key already (`retention: expected ...`).
            match last_key.and_then(|k| message.strip_prefix(&format!("{k}: "))) {
                Some(rest) => rest.to_owned(),
                None => message,
            }
        }
        other => one_line(&other.to_string()),
    }
}

/// `unknown key (expected one of: ...)` for `field` of the table at `parent`, and the key meant
/// when one is close: a misspelling (`batch_sise` → `batch_size`), or a nested key written with
/// one `_` where the environment wants `__` (`OUTBOX_STORE_URL` reads as the key `store_url`:
/// `store.url`, `OUTBOX_STORE__URL`).
pub(crate) fn unknown_key(parent: &str, field: &str, expected: &[&str]) -> String {
    let listed = format!("unknown key (expected one of: {})", expected.join(", "));
    if let Some(meant) = outboxkit_core::plugin::closest(field, expected) {
        return format!("{listed}: did you mean `{meant}`?");
    }
    // The longest known key that `field` starts with, followed by `_` and more.
    let nested = expected
        .iter()
        .filter_map(|k| {
            let rest = field.strip_prefix(k)?.strip_prefix('_')?;
            (!rest.is_empty()).then_some((k, rest))
        })
        .max_by_key(|(k, _)| k.len());
    match nested {
        Some((table, rest)) => {
            let meant = match parent {
                "" => format!("{table}.{rest}"),
                parent => format!("{parent}.{table}.{rest}"),
            };
            format!(
                "{listed}: did you mean `{meant}`? (environment variables separate keys with \
                 `__`: {})",
                env_var_for(&meant)
            )
        }
        None => listed,
    }
}

/// Fold a multi-line message into one line. TOML syntax errors (a header line, a snippet of
/// the file with a caret, then the reason) become `TOML syntax error at line L, column C: reason`.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.len() <= 1 {
        return lines.first().copied().unwrap_or_default().to_owned();
    }
    match lines.iter().rposition(|l| l.contains('|')) {
        Some(snippet_end) if snippet_end + 1 < lines.len() => {
            let head = lines[0].replace("TOML parse error", "TOML syntax error");
            format!("{head}: {}", lines[snippet_end + 1..].join(", "))
        }
        _ => lines.join(" "),
    }
}

const ENV_PREFIX: &str = "OUTBOX_";
const ENV_SOURCE: &str = "`OUTBOX_` environment variable(s)";

fn is_env(md: &figment::Metadata) -> bool {
    md.name == ENV_SOURCE
}

/// The environment variable that sets `key`: `store.url` → `OUTBOX_STORE__URL`.
pub fn env_var_for(key: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        key.replace('.', "__").to_ascii_uppercase()
    )
}

/// Where a value was set.
pub(crate) enum SetIn {
    /// This `OUTBOX_` environment variable.
    Variable(String),
    /// This configuration file.
    File(String),
}

/// Where the value at `key`, whose provider `md` names, was set; `None` for a value neither
/// the file nor the environment gave.
pub(crate) fn set_in(md: &figment::Metadata, key: &str, file: Option<&Path>) -> Option<SetIn> {
    if is_env(md) {
        return Some(SetIn::Variable(env_var_for(key)));
    }
    match (file, &md.source) {
        (Some(file), _) => Some(SetIn::File(file.display().to_string())),
        (None, Some(figment::Source::File(path))) => Some(SetIn::File(path.display().to_string())),
        _ => None,
    }
}

/// Where the value at `key` was set, as a message suffix: ` (in FILE)` or
/// ` (from environment variable OUTBOX_...)`; `None` when the key has no value there.
pub(crate) fn origin(figment: &Figment, key: &str, file: Option<&Path>) -> Option<String> {
    if key.is_empty() {
        return None;
    }
    Some(match set_in(figment.find_metadata(key)?, key, file)? {
        SetIn::Variable(var) => format!(" (from environment variable {var})"),
        SetIn::File(file) => format!(" (in {file})"),
    })
}

/// Append where the key a message starts with was set (`relay.batch_size: must be ...` →
/// `... (from environment variable OUTBOX_RELAY__BATCH_SIZE)`). Messages that do not start
/// with a key of the figment come back unchanged.
pub fn locate(message: &str, figment: &Figment, file: Option<&Path>) -> String {
    let key: String = message
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        .collect();
    let rest = &message[key.len()..];
    // A quoted last segment is a pass-through property with dots of its own
    // (`sink.kafka."linger.ms": ...`), set as `OUTBOX_SINK__KAFKA__LINGER__MS`.
    if let Some((name, _)) = rest.strip_prefix('"').and_then(|r| r.split_once('"')) {
        if !key.ends_with('.') {
            return message.to_owned();
        }
        let var = env_var_for(&format!("{key}{name}"));
        // Where to set it, in the key's own pipeline (`OUTBOX_PIPELINES__B__SINK__KAFKA__...`).
        if message.contains("missing required key") {
            return match file {
                Some(file) => format!("{message} (in {}, or set {var})", file.display()),
                None => format!("{message} (set it in the --config file or with {var})"),
            };
        }
        if std::env::var_os(&var).is_some() {
            return format!("{message} (from environment variable {var})");
        }
        return match file {
            Some(file) => format!("{message} (in {})", file.display()),
            None => message.to_owned(),
        };
    }
    let follows = rest.chars().next();
    if !key.contains('.') || !matches!(follows, Some(':' | ' ')) {
        return message.to_owned();
    }
    match origin(figment, &key, file) {
        Some(origin) => format!("{message}{origin}"),
        None => message.to_owned(),
    }
}

/// `OUTBOX_*` environment variables (`__` nests, `OUTBOX_TEST_*` ignored). Unlike figment's
/// `Env`, values stay strings: `OUTBOX_STORE__TABLE=123` or a password `007` reach a `String`
/// key unchanged, and numeric keys still accept them because [`load`] extracts leniently.
struct EnvOverrides;

impl figment::Provider for EnvOverrides {
    fn metadata(&self) -> figment::Metadata {
        figment::Metadata::named(ENV_SOURCE)
            .interpolater(|_: &figment::Profile, keys: &[&str]| env_var_for(&keys.join(".")))
    }

    fn data(&self) -> Result<figment::value::Map<figment::Profile, Dict>, figment::Error> {
        let env = Env::prefixed(ENV_PREFIX)
            .filter(|key| !key.as_str().to_ascii_lowercase().starts_with("test_"))
            .split("__");
        let mut dict = Dict::new();
        for (key, value) in env.iter() {
            let path: Vec<&str> = key.as_str().split('.').collect();
            insert(&mut dict, &path, Value::from(value));
        }
        Ok(figment::Profile::Default.collect(dict))
    }
}

fn insert(dict: &mut Dict, path: &[&str], value: Value) {
    match path {
        [] => {}
        [last] => {
            dict.insert((*last).to_owned(), value);
        }
        [first, rest @ ..] => {
            let entry = dict
                .entry((*first).to_owned())
                .or_insert_with(|| Value::from(Dict::new()));
            if !matches!(entry, Value::Dict(..)) {
                *entry = Value::from(Dict::new());
            }
            if let Value::Dict(_, inner) = entry {
                insert(inner, rest, value);
            }
        }
    }
}

/// Build the figment: the TOML file (when given), then `OUTBOX_*` environment variables.
///
/// Variables named `OUTBOX_TEST_*` are left to the test suite and ignored here. Extract with
/// `extract_lossy` so that numbers given through the environment (kept as strings) are read.
pub fn figment(file: Option<&Path>) -> Figment {
    let mut figment = Figment::new();
    if let Some(file) = file {
        figment = figment.merge(Toml::file_exact(file));
    }
    figment.merge(EnvOverrides)
}

/// Load and check the settings.
pub fn load(file: Option<&Path>) -> Result<(Settings, Figment), ConfigError> {
    if let Some(path) = file {
        if !path.is_file() {
            let what = if path.exists() {
                "is not a file"
            } else {
                "does not exist"
            };
            return Err(ConfigError(format!(
                "configuration file {} {what} (given with --config)",
                path.display()
            )));
        }
    }
    let figment = figment(file);
    let settings: Settings = figment
        .extract_lossy()
        .map_err(|e| ConfigError::from_figment(e, &figment, file, ""))?;
    settings
        .relay
        .validate()
        .map_err(|e| ConfigError(locate(e.message(), &figment, file)))?;
    Ok((settings, figment))
}

/// The keys that hold secrets. Each also takes the form `<key>_file`: the path of a file whose
/// content (without a final line break) is the value, read at start, as Kubernetes mounts
/// secrets. Anywhere in `[store]` and `[sink.*]`, for every store and sink, also a third
/// party's: `store.password_file`, `sink.redis_streams.password_file`,
/// `sink.rabbitmq.password_file`, `sink.rabbitmq.tls.pkcs12_password_file`,
/// `sink.kafka."sasl.password_file"`, `sink.nats.token_file`, `sink.nats.nkey_file`.
pub const SECRET_KEYS: &[&str] = &[
    "password",
    "pkcs12_password",
    "token",
    "nkey",
    "sasl.username",
    "sasl.password",
    "ssl.key.password",
    "ssl.keystore.password",
    "sasl.oauthbearer.client.secret",
];

/// Replace every `<secret>_file` key of `dict` (and of its sub-tables) by `<secret>` with the
/// file's content. Both forms set at once is an error naming both keys; so is a file that
/// cannot be read or is empty. The content is never part of a message.
fn resolve_secret_files(
    dict: &mut Dict,
    prefix: &str,
    figment: &Figment,
    file: Option<&Path>,
) -> Result<(), ConfigError> {
    let names: Vec<String> = dict.keys().cloned().collect();
    for name in names {
        let key = format!("{prefix}.{name}");
        if let Some(Value::Dict(_, inner)) = dict.get_mut(&name) {
            resolve_secret_files(inner, &key, figment, file)?;
            continue;
        }
        let Some(secret) = name.strip_suffix("_file") else {
            continue;
        };
        if !SECRET_KEYS.contains(&secret) {
            continue;
        }
        let at = |key: &str| origin(figment, key, file).unwrap_or_default();
        if dict.contains_key(secret) {
            let plain = format!("{prefix}.{secret}");
            return Err(ConfigError(format!(
                "{plain}{} and {key}{} are both set: keep one",
                at(&plain),
                at(&key)
            )));
        }
        let Some(path) = dict.get(&name).and_then(Value::as_str).map(str::to_owned) else {
            return Err(ConfigError(format!(
                "{key}: expected the path of a file holding {secret}{}",
                at(&key)
            )));
        };
        let content = std::fs::read_to_string(&path)
            .map_err(|e| ConfigError(format!("{key}: cannot read {path}: {e}{}", at(&key))))?;
        let value = content
            .strip_suffix('\n')
            .map(|v| v.strip_suffix('\r').unwrap_or(v))
            .unwrap_or(&content);
        if value.is_empty() {
            return Err(ConfigError(format!("{key}: {path} is empty{}", at(&key))));
        }
        dict.remove(&name);
        dict.insert(secret.to_owned(), Value::from(value.to_owned()));
    }
    Ok(())
}

/// Extract a sink's own sub-table (`sink.<section>`); an absent table deserializes from
/// nothing, so a sink whose keys all have defaults needs none. Errors name the whole key
/// (`sink.redis_streams.url: ...`).
pub fn sink_section<T>(
    figment: &Figment,
    section: &str,
    file: Option<&Path>,
) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned,
{
    section_at(figment, &format!("sink.{section}"), file)
}

/// Extract the table at `key` (`sink.kafka`, `pipelines.billing.sink.kafka`) as a sink's
/// section; see [`sink_section`].
pub fn section_at<T>(figment: &Figment, key: &str, file: Option<&Path>) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned,
{
    let key = key.to_owned();
    if let Ok(value) = figment.find_value(&key) {
        if value.as_dict().is_none() {
            return Err(ConfigError(format!(
                "{key}: expected a table, found {}{}",
                value.to_actual(),
                origin(figment, &key, file).unwrap_or_default()
            )));
        }
    }
    let mut keys = figment
        .find_value(&key)
        .ok()
        .and_then(|value| value.into_dict())
        .unwrap_or_default();
    resolve_secret_files(&mut keys, &key, figment, file)?;
    Figment::from(figment::providers::Serialized::defaults(keys))
        .extract_lossy::<T>()
        .map_err(|e| ConfigError::from_figment(e, figment, file, &key))
}

/// Extract a store's settings: `[store]` without `kind`. Errors name the whole key
/// (`store.table: ...`) and where it was set.
pub fn store_section<T>(figment: &Figment, file: Option<&Path>) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned,
{
    store_section_at(figment, "store", file)
}

/// Extract the store table at `key` (`store`, `pipelines.billing.store`) without `kind`; see
/// [`store_section`].
pub fn store_section_at<T>(
    figment: &Figment,
    key: &str,
    file: Option<&Path>,
) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned,
{
    let mut keys = figment
        .find_value(key)
        .ok()
        .and_then(|value| value.into_dict())
        .unwrap_or_default();
    keys.remove("kind");
    resolve_secret_files(&mut keys, key, figment, file)?;
    Figment::from(figment::providers::Serialized::defaults(keys))
        .extract_lossy::<T>()
        .map_err(|e| ConfigError::from_figment(e, figment, file, key))
}

/// The config file's path for messages.
pub fn describe_file(file: Option<&PathBuf>) -> String {
    file.map(|f| f.display().to_string())
        .unwrap_or_else(|| "(no file)".to_owned())
}

#[cfg(test)]
// `Jail` closures return `figment::Result`, whose error is large; nothing to do about it here.
#[allow(clippy::result_large_err)]
mod tests {
    use std::time::Duration;

    use super::*;
    use figment::Jail;

    use crate::adapters::in_jail;

    const MINIMAL: &str = r#"
        [store]
        kind = "postgres"
        url = "postgres://app@db:5432/app"

        [sink]
        kind = "redis-streams"
    "#;

    /// A sink section as a sink crate would declare it.
    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields, default)]
    struct Section {
        url: String,
        password: String,
        maxlen: Option<u64>,
    }

    impl Default for Section {
        fn default() -> Self {
            Self {
                url: "redis://127.0.0.1:6379".to_owned(),
                password: String::new(),
                maxlen: None,
            }
        }
    }

    /// A section with a required key.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Strict {
        url: String,
    }

    /// `[store]` as the PostgreSQL store reads it.
    fn pg(figment: &Figment) -> outboxkit_store_postgres::PostgresStoreConfig {
        store_section(figment, None).unwrap()
    }

    fn load_err(file: Option<&str>) -> String {
        load(file.map(Path::new)).unwrap_err().to_string()
    }

    /// The jail's `relay.toml`, as [`load`] reads it.
    fn reload() -> (Settings, Figment) {
        load(Some(Path::new("relay.toml"))).unwrap()
    }

    /// Write `toml` as the jail's `relay.toml`, then [`reload`] it.
    fn load_toml(jail: &mut Jail, toml: &str) -> (Settings, Figment) {
        jail.create_file("relay.toml", toml)
            .expect("writing the test configuration");
        reload()
    }

    /// The error reading `[sink.redis_streams]` of the loaded `relay.toml` as `T`.
    fn redis_err<T: serde::de::DeserializeOwned + std::fmt::Debug>(figment: &Figment) -> String {
        sink_section::<T>(figment, "redis_streams", Some(Path::new("relay.toml")))
            .unwrap_err()
            .to_string()
    }

    /// The error reading `[store]` of the loaded `relay.toml` as the PostgreSQL store does.
    fn pg_err(figment: &Figment) -> String {
        store_section::<outboxkit_store_postgres::PostgresStoreConfig>(
            figment,
            Some(Path::new("relay.toml")),
        )
        .unwrap_err()
        .to_string()
    }

    /// An unknown key names the key meant when one is close: a misspelling, or a nested key
    /// written with one `_` (an environment variable that wanted `__`).
    #[test]
    fn an_unknown_key_names_the_key_meant() {
        let relay = ["batch_size", "poll_interval", "max_attempts"];
        assert_eq!(
            unknown_key("relay", "batch_sise", &relay),
            "unknown key (expected one of: batch_size, poll_interval, max_attempts): did you \
             mean `batch_size`?"
        );
        let top = ["store", "relay", "sink", "pipelines"];
        assert!(
            unknown_key("", "store_url", &top).ends_with(
                ": did you mean `store.url`? (environment variables separate keys with `__`: \
                 OUTBOX_STORE__URL)"
            ),
            "{}",
            unknown_key("", "store_url", &top)
        );
        let sink = ["kind", "destination", "redis", "redis_streams"];
        assert!(
            unknown_key("sink", "redis_streams_max_age", &sink).ends_with(
                "did you mean `sink.redis_streams.max_age`? (environment variables \
                        separate keys with `__`: OUTBOX_SINK__REDIS_STREAMS__MAX_AGE)"
            )
        );
        assert_eq!(
            unknown_key("relay", "frobnicate", &relay),
            "unknown key (expected one of: batch_size, poll_interval, max_attempts)"
        );
    }

    #[test]
    fn defaults_fill_in() {
        in_jail(|jail| {
            let (s, figment) = load_toml(jail, MINIMAL);
            assert_eq!(s.store.as_ref().unwrap().kind, "postgres");
            let store = pg(&figment);
            assert_eq!(store.table, "outbox");
            assert_eq!(store.shards, 64);
            assert_eq!(store.pool_size, 4);
            assert_eq!(store.connect_timeout, Duration::from_secs(5));
            assert_eq!(store.session_timeout, Duration::from_secs(30));
            assert_eq!(s.relay, RelayConfig::default());
            assert_eq!(s.sink.as_ref().unwrap().kind, "redis-streams");
            assert_eq!(s.sink.as_ref().unwrap().destination, None);
            assert!(s.sink.as_ref().unwrap().sections.is_empty());
            assert_eq!(s.server, ServerSettings::default());
            assert_eq!(s.server.listen, "127.0.0.1:9464");
            assert_eq!(s.log, LogSettings::default());
            Ok(())
        });
    }

    #[test]
    fn human_durations_and_retention_are_read() {
        in_jail(|jail| {
            let relay = "[relay]\nbackoff_initial = \"250ms\"\nretention = \"7d\"";
            let (s, _) = load_toml(jail, &format!("{MINIMAL}\n{relay}\n"));
            assert_eq!(s.relay.backoff_initial, Duration::from_millis(250));
            assert_eq!(
                s.relay.retention,
                outboxkit_core::Retention::Keep(Duration::from_secs(7 * 86_400))
            );
            Ok(())
        });
    }

    #[test]
    fn env_overrides_nest_with_double_underscore() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_STORE__URL", "postgres://app:pw@other:6432/app");
            jail.set_env("OUTBOX_RELAY__BATCH_SIZE", "20");
            jail.set_env("OUTBOX_STORE__SHARDS", "8");
            jail.set_env("OUTBOX_SINK__REDIS_STREAMS__URL", "redis://cache:6380/2");
            jail.set_env("OUTBOX_SINK__REDIS_STREAMS__MAXLEN", "1000");
            let (s, figment) = load_toml(jail, &format!("{MINIMAL}\n[relay]\nbatch_size = 10\n"));
            assert_eq!(pg(&figment).url, "postgres://app:pw@other:6432/app");
            assert_eq!(s.relay.batch_size, 20, "the environment beats the file");
            assert_eq!(pg(&figment).shards, 8);
            let section: Section = sink_section(&figment, "redis_streams", None).unwrap();
            assert_eq!(section.url, "redis://cache:6380/2");
            assert_eq!(section.maxlen, Some(1000));
            // Without any file, the environment alone is a configuration.
            jail.set_env("OUTBOX_STORE__KIND", "postgres");
            jail.set_env("OUTBOX_SINK__KIND", "redis-streams");
            let (s, figment) = load(None).unwrap();
            assert_eq!(pg(&figment).url, "postgres://app:pw@other:6432/app");
            assert_eq!(s.sink.as_ref().unwrap().kind, "redis-streams");
            Ok(())
        });
    }

    /// Decision: environment values stay strings; string keys get them unchanged (`123`,
    /// `007`), numeric keys parse them. Invalid table names are refused later by the store
    /// (`store.table: "123" is not a valid table name`).
    #[test]
    fn ids_and_passwords_stay_strings() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_STORE__TABLE", "123");
            jail.set_env("OUTBOX_RELAY__RELAY_ID", "007");
            jail.set_env("OUTBOX_SINK__DESTINATION", "1e3");
            jail.set_env("OUTBOX_SINK__REDIS_STREAMS__PASSWORD", "0042");
            let (s, figment) = load_toml(jail, MINIMAL);
            assert_eq!(pg(&figment).table, "123");
            assert_eq!(s.relay.relay_id.as_deref(), Some("007"));
            assert_eq!(s.sink.as_ref().unwrap().destination.as_deref(), Some("1e3"));
            let section: Section = sink_section(&figment, "redis_streams", None).unwrap();
            assert_eq!(section.password, "0042");

            jail.set_env("OUTBOX_STORE__URL", "12345");
            let (_, figment) = reload();
            assert_eq!(pg(&figment).url, "12345");
            Ok(())
        });
    }

    #[test]
    fn outbox_test_variables_are_ignored() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_TEST_DATABASE_URL", "postgres://elsewhere/db");
            jail.set_env("OUTBOX_TEST__NESTED", "1");
            jail.set_env("outbox_test_lowercase", "1");
            let (_, figment) = load_toml(jail, MINIMAL);
            assert_eq!(pg(&figment).url, "postgres://app@db:5432/app");
            Ok(())
        });
    }

    #[test]
    fn errors_name_the_key_and_the_file() {
        in_jail(|jail| {
            jail.create_file(
                "relay.toml",
                &format!("{MINIMAL}\n[relay]\nbatch_sise = 1\n"),
            )?;
            let e = load_err(Some("relay.toml"));
            assert!(
                e.starts_with("invalid configuration: relay.batch_sise: unknown key (expected one of: batch_size,"),
                "{e}"
            );
            assert!(e.ends_with("(in relay.toml)"), "{e}");
            assert!(!e.contains("default"), "no profile name in the key: {e}");

            // `load` reads the kind; the store's own keys are its configuration type's.
            let (_, figment) =
                load_toml(jail, "[store]\nkind = \"postgres\"\n[sink]\nkind = \"x\"\n");
            assert_eq!(
                pg_err(&figment),
                "invalid configuration: store.url: missing required key (in relay.toml, or set OUTBOX_STORE__URL)"
            );
            let (settings, figment) = load_toml(jail, "[sink]\nkind = \"x\"\n");
            assert_eq!(
                crate::pipeline::resolve(&settings, &figment, Some(Path::new("relay.toml")))
                    .unwrap_err()
                    .to_string(),
                "invalid configuration: store: missing required table [store] (in relay.toml)"
            );
            jail.create_file(
                "relay.toml",
                &format!("{MINIMAL}\n[relay]\nretention = \"forever\"\n"),
            )?;
            let e = load_err(Some("relay.toml"));
            assert!(
                e.starts_with(
                    "invalid configuration: relay.retention: expected \"delete\" or a duration"
                ),
                "the key is named once: {e}"
            );
            jail.create_file("relay.toml", "[store\nurl = \"postgres://u:s3cr3t@h/db\"\n")?;
            let e = load_err(Some("relay.toml"));
            assert!(
                e.starts_with("invalid configuration: TOML syntax error at line 1"),
                "{e}"
            );
            assert!(e.ends_with("(in relay.toml)") && !e.contains('\n'), "{e}");
            assert!(!e.contains("s3cr3t"), "{e}");
            // A sink table whose one settings section says which kind it is meant to be.
            jail.create_file(
                "relay.toml",
                "[store]\nkind = \"postgres\"\n[sink.redis_streams]\nurl = \"redis://r\"\n",
            )?;
            assert_eq!(
                load_err(Some("relay.toml")),
                "invalid configuration: sink.kind: missing required key (in relay.toml, or set \
                 OUTBOX_SINK__KIND); for [sink.redis_streams] it is kind = \"redis-streams\""
            );
            assert_eq!(
                load_err(Some("missing.toml")),
                "invalid configuration: configuration file missing.toml does not exist (given with --config)"
            );
            Ok(())
        });
    }

    #[test]
    fn env_errors_name_the_variable() {
        in_jail(|jail| {
            jail.create_file("relay.toml", MINIMAL)?;
            jail.set_env("OUTBOX_RELAY__BATCH_SIZE", "0");
            assert_eq!(
                load_err(Some("relay.toml")),
                "invalid configuration: relay.batch_size: must be between 1 and 100000, got 0 \
                 (from environment variable OUTBOX_RELAY__BATCH_SIZE)"
            );
            jail.set_env("OUTBOX_RELAY__BATCH_SIZE", "many");
            assert_eq!(
                load_err(Some("relay.toml")),
                "invalid configuration: relay.batch_size: expected usize, found string \"many\" \
                 (from environment variable OUTBOX_RELAY__BATCH_SIZE)"
            );
            jail.set_env("OUTBOX_RELAY__BATCH_SIZE", "5");
            jail.set_env("OUTBOX_STORE__TABEL", "x");
            let e = pg_err(&reload().1);
            assert!(
                e.starts_with("invalid configuration: store.tabel: unknown key")
                    && e.ends_with("(from environment variable OUTBOX_STORE__TABEL)"),
                "{e}"
            );
            Ok(())
        });
    }

    #[test]
    fn sink_section_errors_carry_the_section_prefix() {
        in_jail(|jail| {
            let file = Path::new("relay.toml");
            let section = "[sink.redis_streams]\nulr = \"redis://x\"";
            let (_, figment) = load_toml(jail, &format!("{MINIMAL}\n{section}\n"));
            let e = redis_err::<Section>(&figment);
            assert!(
                e.starts_with("invalid configuration: sink.redis_streams.ulr: unknown key (expected one of: url, password, maxlen)"),
                "{e}"
            );
            assert!(e.ends_with("(in relay.toml)"), "{e}");

            // An absent section deserializes from nothing: defaults, or the missing key named.
            let (_, figment) = load_toml(jail, MINIMAL);
            let section: Section = sink_section(&figment, "redis_streams", Some(file)).unwrap();
            assert_eq!(section, Section::default());
            let e = redis_err::<Strict>(&figment);
            assert_eq!(
                e,
                "invalid configuration: sink.redis_streams.url: missing required key \
                 (in relay.toml, or set OUTBOX_SINK__REDIS_STREAMS__URL)"
            );

            let (_, figment) = load_toml(jail, &format!("{MINIMAL}\nredis_streams = 5\n"));
            let e = redis_err::<Section>(&figment);
            assert!(
                e.starts_with("invalid configuration: sink.redis_streams: expected a table"),
                "{e}"
            );

            jail.set_env("OUTBOX_SINK__REDIS_STREAMS__MAXLEN", "lots");
            let (_, figment) = load_toml(jail, MINIMAL);
            let e = redis_err::<Section>(&figment);
            assert_eq!(
                e,
                "invalid configuration: sink.redis_streams.maxlen: expected u64, found string \"lots\" \
                 (from environment variable OUTBOX_SINK__REDIS_STREAMS__MAXLEN)"
            );
            Ok(())
        });
    }

    #[test]
    fn locate_names_file_or_variable_and_leaves_other_messages() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_STORE__TABLE", "Bad");
            let file = Path::new("relay.toml");
            let (_, figment) = load_toml(jail, MINIMAL);
            assert_eq!(
                locate("store.table: bad", &figment, Some(file)),
                "store.table: bad (from environment variable OUTBOX_STORE__TABLE)"
            );
            assert_eq!(
                locate("sink.kind = \"x\" is unknown", &figment, Some(file)),
                "sink.kind = \"x\" is unknown (in relay.toml)"
            );
            // Keys at their default were set nowhere; other messages stay as they are.
            assert_eq!(
                locate("store.shards: bad", &figment, Some(file)),
                "store.shards: bad"
            );
            assert_eq!(
                locate("cannot reach db", &figment, Some(file)),
                "cannot reach db"
            );
            Ok(())
        });
    }

    /// `[store]` with `extra` lines, then the sinks' tables `sinks`.
    fn with_store(extra: &str, sinks: &str) -> String {
        format!(
            "[store]\nkind = \"postgres\"\nurl = \"postgres://app@db:5432/app\"\n{extra}\n\
             [sink]\nkind = \"redis-streams\"\n{sinks}"
        )
    }

    #[test]
    fn secret_files_are_read_at_start_and_never_shown() {
        in_jail(|jail| {
            jail.create_file("db-password", "s3cr3t-from-file\n")?;
            jail.create_file("p12-password", "p12-s3cr3t")?;
            let toml = with_store(
                "password_file = \"db-password\"",
                "[sink.rabbitmq]\nurl = \"amqps://h\"\n[sink.rabbitmq.tls]\nca_file = \"ca.pem\"\n\
                 pkcs12_password_file = \"p12-password\"\n\
                 [sink.kafka]\n\"sasl.password_file\" = \"p12-password\"\n",
            );
            let (_, figment) = load_toml(jail, &toml);
            let store = pg(&figment);
            assert_eq!(store.password.as_deref(), Some("s3cr3t-from-file"));
            let debug = format!("{store:?}");
            assert!(
                !debug.contains("s3cr3t") && debug.contains("***"),
                "{debug}"
            );

            // Nested tables too; keys that merely end in `_file` (a CA path) stay as they are.
            let rabbit: serde_json::Value = sink_section(&figment, "rabbitmq", None).unwrap();
            assert_eq!(rabbit["tls"]["pkcs12_password"], "p12-s3cr3t");
            assert_eq!(rabbit["tls"]["ca_file"], "ca.pem");
            assert!(rabbit["tls"].get("pkcs12_password_file").is_none());
            let kafka: serde_json::Value = sink_section(&figment, "kafka", None).unwrap();
            assert_eq!(kafka["sasl.password"], "p12-s3cr3t");
            Ok(())
        });
    }

    #[test]
    fn a_secret_and_its_file_together_or_an_unreadable_file_are_refused() {
        in_jail(|jail| {
            jail.create_file("empty", "")?;
            let mut store_err = |extra: &str| pg_err(&load_toml(jail, &with_store(extra, "")).1);
            let e = store_err("password = \"inline-s3cr3t\"\npassword_file = \"empty\"\n");
            assert!(
                e.contains("store.password (in relay.toml) and store.password_file (in relay.toml) are both set"),
                "{e}"
            );
            assert!(!e.contains("inline-s3cr3t"), "{e}");
            let e = store_err("password_file = \"/nonexistent/pw\"\n");
            assert!(
                e.contains("store.password_file: cannot read /nonexistent/pw"),
                "{e}"
            );
            let e = store_err("password_file = \"empty\"\n");
            assert!(e.contains("store.password_file: empty is empty"), "{e}");
            let e = store_err("password_file = 3\n");
            assert!(
                e.contains("store.password_file: expected the path of a file"),
                "{e}"
            );
            Ok(())
        });
    }

    #[test]
    fn settings_and_store_config_debug_hide_passwords() {
        let store = StoreSettings {
            kind: "postgres".into(),
            keys: [(
                "url".to_owned(),
                Value::from("postgres://app:s3cr3t@db/app"),
            )]
            .into(),
        };
        let debug = format!("{store:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        let config =
            outboxkit_store_postgres::PostgresStoreConfig::new("postgres://app:s3cr3t@db/app");
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("s3cr3t") && debug.contains("***"),
            "{debug}"
        );
    }

    #[test]
    fn one_line_folds_toml_snippets() {
        let toml_error = "TOML parse error at line 1, column 7\n  |\n1 | [store\n  |       ^\ninvalid table header\nexpected `.`, `]`\n";
        assert_eq!(
            one_line(toml_error),
            "TOML syntax error at line 1, column 7: invalid table header, expected `.`, `]`"
        );
        assert_eq!(one_line("a\n b\n"), "a b");
        assert_eq!(one_line("single"), "single");
    }
}
