//! The configuration file: TOML plus `OUTBOX_` environment overrides (`__` nests), via figment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use outbox_core::RelayConfig;
use serde::{Deserialize, Serialize};

/// The whole configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// `[store]`: the database holding the outbox table.
    pub store: StoreSettings,
    /// `[relay]`: engine settings.
    #[serde(default)]
    pub relay: RelayConfig,
    /// `[sink]`: the broker.
    pub sink: SinkSettings,
    /// `[server]`: metrics and health endpoints.
    #[serde(default)]
    pub server: ServerSettings,
    /// `[log]`: log output.
    #[serde(default)]
    pub log: LogSettings,
}

/// `[store]`: the keys every SQL store shares.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// `postgres` (or another store compiled in).
    pub kind: String,
    /// Connection URL; prefer giving the password through `OUTBOX_STORE__URL`.
    pub url: String,
    /// Outbox table, optionally `schema.table`.
    #[serde(default = "default_table")]
    pub table: String,
    /// Shards created by `migrate` (fixed afterwards).
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// Pool connections for migrations, status and purge.
    #[serde(default = "default_pool_size")]
    pub pool_size: u32,
    /// Longest wait for a connection.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest one call on the relay's dedicated session may take.
    #[serde(default = "default_session_timeout", with = "humantime_serde")]
    pub session_timeout: Duration,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("kind", &self.kind)
            .field("url", &redact_url(&self.url))
            .field("table", &self.table)
            .field("shards", &self.shards)
            .field("pool_size", &self.pool_size)
            .finish_non_exhaustive()
    }
}

fn default_table() -> String {
    "outbox".to_owned()
}
fn default_shards() -> u32 {
    64
}
fn default_pool_size() -> u32 {
    4
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_session_timeout() -> Duration {
    Duration::from_secs(30)
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
    /// A tracing filter, e.g. `info` or `outbox_core=debug,info` (`RUST_LOG` wins).
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
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl ConfigError {
    fn from_figment(error: figment::Error, file: Option<&Path>) -> Self {
        let mut lines = Vec::new();
        for e in error {
            let key = e
                .path
                .iter()
                .filter(|p| p.as_str() != "default")
                .cloned()
                .collect::<Vec<_>>()
                .join(".");
            let source = match (&e.metadata, file) {
                (Some(md), _) if md.name.contains("environment") => {
                    let var = md
                        .interpolate(&e.profile.clone().unwrap_or_default(), &e.path)
                        .to_uppercase();
                    format!(" (from environment variable {var})")
                }
                (_, Some(file)) => format!(" (in {})", file.display()),
                (_, None) => String::new(),
            };
            let what = explain(&e.kind);
            if key.is_empty() {
                lines.push(format!("{what}{source}"));
            } else {
                lines.push(format!("{key}: {what}{source}"));
            }
        }
        ConfigError(format!("invalid configuration: {}", lines.join("; ")))
    }
}

fn explain(kind: &figment::error::Kind) -> String {
    use figment::error::Kind;
    match kind {
        Kind::MissingField(f) => format!("missing required key `{f}`"),
        Kind::UnknownField(f, expected) => {
            format!("unknown key `{f}` (expected one of: {})", expected.join(", "))
        }
        Kind::InvalidType(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::InvalidValue(actual, expected) => format!("expected {expected}, found {actual}"),
        Kind::UnknownVariant(v, expected) => {
            format!("unknown value `{v}` (expected one of: {})", expected.join(", "))
        }
        other => other.to_string(),
    }
}

/// Build the figment: the TOML file (when given), then `OUTBOX_*` environment variables.
///
/// Variables named `OUTBOX_TEST_*` are left to the test suite and ignored here.
pub fn figment(file: Option<&Path>) -> Figment {
    let mut figment = Figment::new();
    if let Some(file) = file {
        figment = figment.merge(Toml::file_exact(file));
    }
    figment.merge(
        Env::prefixed("OUTBOX_")
            .split("__")
            .filter(|key| !key.as_str().starts_with("test_")),
    )
}

/// Load and check the settings.
pub fn load(file: Option<&Path>) -> Result<(Settings, Figment), ConfigError> {
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError(format!(
                "configuration file {} does not exist (given with --config)",
                path.display()
            )));
        }
    }
    let figment = figment(file);
    let settings: Settings = figment
        .extract()
        .map_err(|e| ConfigError::from_figment(e, file))?;
    settings
        .relay
        .validate()
        .map_err(|e| ConfigError(format!("invalid configuration: {}", e.message())))?;
    if settings.store.url.trim().is_empty() {
        return Err(ConfigError(
            "invalid configuration: store.url: must not be empty".to_owned(),
        ));
    }
    Ok((settings, figment))
}

/// Extract a sink's own sub-table (`sink.<section>`); an absent table deserializes from
/// nothing, so a sink whose keys all have defaults needs none.
pub fn sink_section<T>(figment: &Figment, section: &str, file: Option<&Path>) -> Result<T, ConfigError>
where
    T: serde::de::DeserializeOwned,
{
    let key = format!("sink.{section}");
    let result = if figment.contains(&key) {
        figment.extract_inner::<T>(&key)
    } else {
        Figment::from(Serialized::defaults(figment::value::Dict::new()))
            .extract::<T>()
            .map_err(|mut e| {
                e.path.splice(0..0, ["sink".to_owned(), section.to_owned()]);
                e
            })
    };
    result.map_err(|e| ConfigError::from_figment(e, file))
}

/// Replace the password of a URL by `***` for logs and errors.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("***"));
            }
            url.to_string()
        }
        Err(_) => match raw.find('@') {
            Some(at) => format!("***{}", &raw[at..]),
            None => raw.to_owned(),
        },
    }
}

/// The config file's path for messages.
pub fn describe_file(file: Option<&PathBuf>) -> String {
    file.map(|f| f.display().to_string())
        .unwrap_or_else(|| "(no file)".to_owned())
}
