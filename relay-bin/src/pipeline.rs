//! Pipelines: each one outbox table (or a pattern of tables, see [`outboxkit_core::plugin::Discovery`]) relayed to
//! one sink, by its own [`Relay`](outboxkit_core::Relay).
//!
//! A configuration declares them in one of two ways:
//!
//! - `[store]` and `[sink]` at the top level: one pipeline, named `default` (the form every
//!   configuration had before pipelines);
//! - `[pipelines.<name>]` tables, each with its own `store` table, and `relay` and `sink` tables
//!   where it differs from the shared ones. `[pipelines.<name>.relay]` keys replace the shared
//!   `[relay]` keys one by one; `[pipelines.<name>.sink]` replaces the shared `[sink]` whole.
//!
//! Both may be combined: the top-level `[store]` is then the pipeline `default` beside the named
//! ones. Names are metric labels and parts of environment variable names
//! (`OUTBOX_PIPELINES__BILLING__STORE__URL`), hence lowercase.

use std::borrow::Cow;
use std::path::Path;

use figment::providers::Serialized;
use figment::Figment;
use outboxkit_core::{RelayConfig, DEFAULT_PIPELINE};

use crate::settings::{self, ConfigError, Settings, SinkSettings};

/// One pipeline as the configuration declares it, its inheritance applied.
#[derive(Debug, Clone)]
pub struct Pipeline {
    /// `default`, or the `<name>` of `[pipelines.<name>]`.
    pub name: String,
    /// The key of its store table: `store` or `pipelines.<name>.store`.
    pub store_key: String,
    /// Its store's kind.
    pub store_kind: String,
    /// The key of its sink table: `sink` or `pipelines.<name>.sink`.
    pub sink_key: String,
    /// Its sink table.
    pub sink: SinkSettings,
    /// Its engine settings: the shared `[relay]`, with its own keys over them.
    pub relay: RelayConfig,
    /// The keys its own store and sink tables set, as adapters write them (`store.url`,
    /// `sink.kafka`): what [`Pipeline::rekey`] finds inside a message, such as
    /// `refused user "app" (store.url)`. Empty for `default`.
    pub own_keys: Vec<String>,
    /// When `sink.destination` sets the sink's template: the key the sink's messages name it
    /// by, as adapters write it (`sink.sns.topic`), which [`Pipeline::rekey`] writes as
    /// `sink.destination` ([`Registry::name_destinations`](crate::registry::Registry::name_destinations)).
    pub destination_key: Option<String>,
}

/// Longest pipeline name.
const MAX_NAME_LEN: usize = 48;

/// A pipeline name is a metric label value and the `<NAME>` of `OUTBOX_PIPELINES__<NAME>__...`:
/// lowercase ASCII letters, digits and single `_`, starting with a letter.
pub fn check_name(name: &str) -> Result<(), String> {
    let valid = name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.contains("__")
        && !name.ends_with('_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "\"{name}\" is not a valid pipeline name: use lowercase letters, digits and single `_`, \
             starting with a letter, at most {MAX_NAME_LEN} characters (it is the `pipeline` label \
             of the metrics and part of OUTBOX_PIPELINES__<NAME>__* variables)"
        ))
    }
}

/// The pipelines of `settings`, in name order, each checked: a valid name, a store, a sink (its
/// own or the shared one), and its relay settings read and validated. Errors name the key and
/// where it was set.
pub fn resolve(
    settings: &Settings,
    figment: &Figment,
    file: Option<&Path>,
) -> Result<Vec<Pipeline>, ConfigError> {
    let locate = |message: String| ConfigError(settings::locate(&message, figment, file));
    let mut pipelines = Vec::new();
    if let Some(store) = &settings.store {
        if settings.pipelines.contains_key(DEFAULT_PIPELINE) {
            return Err(locate(format!(
                "pipelines.{DEFAULT_PIPELINE}: the top-level [store] is the pipeline \
                 `{DEFAULT_PIPELINE}` already: rename one of them"
            )));
        }
        let sink = settings
            .sink
            .clone()
            .ok_or_else(|| ConfigError(settings::missing("", "sink", file)))?;
        pipelines.push(Pipeline {
            name: DEFAULT_PIPELINE.to_owned(),
            store_key: "store".to_owned(),
            store_kind: store.kind.clone(),
            sink_key: "sink".to_owned(),
            sink,
            relay: settings.relay.clone(),
            own_keys: Vec::new(),
            destination_key: None,
        });
    } else if settings.pipelines.is_empty() {
        return Err(ConfigError(settings::missing("", "store", file)));
    }
    for (name, declared) in &settings.pipelines {
        let key = format!("pipelines.{name}");
        check_name(name).map_err(|e| locate(format!("{key}: {e}")))?;
        let (sink_key, sink) = match (&declared.sink, &settings.sink) {
            (Some(own), _) => (format!("{key}.sink"), own.clone()),
            (None, Some(shared)) => ("sink".to_owned(), shared.clone()),
            (None, None) => {
                return Err(ConfigError(format!(
                    "{key}.sink: missing required table: give the pipeline a [{key}.sink], or \
                     give every pipeline one with a shared [sink]{}",
                    file.map(|f| format!(" (in {})", f.display()))
                        .unwrap_or_default()
                )))
            }
        };
        let relay = match &declared.relay {
            Some(own) if !own.is_empty() => relay_settings(figment, file, &key, own)?,
            _ => settings.relay.clone(),
        };
        let own_keys = own_keys(figment, &key, declared.sink.is_some(), &sink.kind);
        pipelines.push(Pipeline {
            name: name.clone(),
            store_key: format!("{key}.store"),
            store_kind: declared.store.kind.clone(),
            sink_key,
            sink,
            relay,
            own_keys,
            destination_key: None,
        });
    }
    Ok(pipelines)
}

/// The keys the pipeline `key` (`pipelines.billing`) sets in its store table, and in its sink
/// table when it has its own, written as for the top-level tables (`store.url`,
/// `sink.destination`), with its sink kind's section (`sink.redis_streams`) set or not.
fn own_keys(figment: &Figment, key: &str, own_sink: bool, sink_kind: &str) -> Vec<String> {
    let keys_at = |table: &str| {
        figment
            .find_value(&format!("{key}.{table}"))
            .ok()
            .and_then(|value| value.into_dict())
            .map(|dict| {
                dict.into_keys()
                    .map(|k| format!("{table}.{k}"))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let mut keys = keys_at("store");
    if own_sink {
        keys.extend(keys_at("sink"));
        keys.push(format!("sink.{}", sink_kind.replace('-', "_")));
    }
    keys
}

/// `message` with every `key` that stands as a key of its own (not inside a longer name such as
/// `pipelines.billing.store.url` or `store.urls`) written as `real`.
fn replace_key(message: &str, key: &str, real: &str) -> String {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '"');
    let mut out = String::with_capacity(message.len());
    let mut copied = 0;
    for (at, _) in message.match_indices(key) {
        let before = message[..at].chars().next_back();
        let after = message[at + key.len()..].chars().next();
        let alone = !before.is_some_and(part_of_name)
            && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        if alone && at >= copied {
            out.push_str(&message[copied..at]);
            out.push_str(real);
            copied = at + key.len();
        }
    }
    out.push_str(&message[copied..]);
    out
}

/// The shared `[relay]` keys with the pipeline's own over them, read and validated; errors
/// name the pipeline's key (`pipelines.billing.relay.batch_size: ...`).
fn relay_settings(
    figment: &Figment,
    file: Option<&Path>,
    pipeline_key: &str,
    own: &figment::value::Dict,
) -> Result<RelayConfig, ConfigError> {
    let key = format!("{pipeline_key}.relay");
    let mut merged = figment
        .find_value("relay")
        .ok()
        .and_then(|value| value.into_dict())
        .unwrap_or_default();
    merged.extend(own.clone());
    let relay: RelayConfig = Figment::from(Serialized::defaults(merged))
        .extract_lossy()
        .map_err(|e| ConfigError::from_figment(e, figment, file, &key))?;
    relay.validate().map_err(|e| {
        // `relay.batch_size: ...`: the pipeline's key when it set it, else the shared one.
        let message = e.message();
        let message = match message.strip_prefix("relay.") {
            Some(rest) if own.keys().any(|k| rest.starts_with(&format!("{k}:"))) => {
                format!("{key}.{rest}")
            }
            _ => message.to_owned(),
        };
        ConfigError(settings::locate(&message, figment, file))
    })?;
    Ok(relay)
}

/// The pipelines a command works on: all of them, or the one `--pipeline` names.
pub fn select<'a>(
    pipelines: &'a [Pipeline],
    wanted: Option<&str>,
) -> Result<Vec<&'a Pipeline>, String> {
    match wanted {
        None => Ok(pipelines.iter().collect()),
        Some(name) => match pipelines.iter().find(|p| p.name == name) {
            Some(p) => Ok(vec![p]),
            None => Err(format!(
                "--pipeline {name}: no such pipeline (configured: {})",
                names(pipelines)
            )),
        },
    }
}

/// The pipelines' names, comma-separated.
pub fn names(pipelines: &[Pipeline]) -> String {
    pipelines
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Pipeline {
    /// A message about this pipeline's keys, as adapters write them (`store.table: ...`,
    /// `PostgreSQL at db:5432 refused user "app" (store.url)`), with the keys they really have
    /// (`pipelines.billing.store.table: ...`): the key it starts with, and the keys the
    /// pipeline sets wherever they stand; first, where `sink.destination` set the sink's
    /// template, the sink's own key for it ([`destination_key`](Self::destination_key)).
    pub fn rekey(&self, message: &str) -> String {
        let message = match &self.destination_key {
            Some(key) => Cow::Owned(replace_key(message, key, "sink.destination")),
            None => Cow::Borrowed(message),
        };
        let mut message = self.rekey_start(&message);
        for key in &self.own_keys {
            let (written, rest) = key.split_once('.').unwrap_or((key, ""));
            let real = if written == "store" {
                &self.store_key
            } else {
                &self.sink_key
            };
            if written != real.as_str() {
                message = replace_key(&message, key, &format!("{real}.{rest}"));
            }
        }
        message
    }

    /// Whether [`rekey`](Self::rekey) can change a message of this pipeline.
    pub fn rekeys(&self) -> bool {
        !self.own_keys.is_empty() || self.destination_key.is_some()
    }

    /// An error of this pipeline's store or sink, of any kind, with its keys [rekeyed](Self::rekey).
    pub fn rekey_error(&self, e: outboxkit_core::Error) -> outboxkit_core::Error {
        let message = e.full_message();
        let rekeyed = self.rekey(&message);
        if rekeyed == message {
            return e;
        }
        let out = outboxkit_core::Error::new(e.kind(), rekeyed);
        if e.is_retryable() {
            out.temporary()
        } else {
            out.permanent()
        }
    }

    fn rekey_start(&self, message: &str) -> String {
        for (written, real) in [("store", &self.store_key), ("sink", &self.sink_key)] {
            if written == real.as_str() {
                continue;
            }
            if let Some(rest) = message.strip_prefix(written) {
                if rest.starts_with(['.', ':', ' ']) {
                    return format!("{real}{rest}");
                }
            }
        }
        message.to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::result_large_err)]
mod tests {
    use std::time::Duration;

    use figment::Jail;

    use crate::adapters::in_jail;

    use super::*;

    fn pipelines(jail: &mut Jail, toml: &str) -> Result<Vec<Pipeline>, String> {
        jail.create_file("relay.toml", toml).unwrap();
        let file = Path::new("relay.toml");
        let (settings, figment) = settings::load(Some(file)).map_err(|e| e.to_string())?;
        resolve(&settings, &figment, Some(file)).map_err(|e| e.to_string())
    }

    const THREE: &str = r#"
        [relay]
        batch_size = 50
        backoff_max = "10s"

        [sink]
        kind = "redis-streams"

        [pipelines.billing.store]
        kind = "postgres"
        url = "postgres://app@db/app"
        table = "billing.outbox"

        [pipelines.orders.store]
        kind = "postgres"
        url = "postgres://app@db/app"
        table = "orders.outbox"
        [pipelines.orders.relay]
        batch_size = 500

        [pipelines.stock.store]
        kind = "mysql"
        url = "mysql://root@db/stock"
        [pipelines.stock.sink]
        kind = "kafka"
        destination = "stock.{event_type}"
    "#;

    #[test]
    fn one_top_level_store_is_the_pipeline_default() {
        in_jail(|jail| {
            let all = pipelines(
                jail,
                "[store]\nkind = \"postgres\"\nurl = \"postgres://db/app\"\n[sink]\nkind = \"redis-streams\"\n",
            )
            .unwrap();
            assert_eq!(all.len(), 1);
            let p = &all[0];
            assert_eq!(
                (p.name.as_str(), p.store_key.as_str(), p.sink_key.as_str()),
                ("default", "store", "sink")
            );
            assert_eq!(p.relay, RelayConfig::default());
            assert_eq!(p.rekey("store.table: bad"), "store.table: bad");
            Ok(())
        });
    }

    /// Where `sink.destination` sets the template, the sink's own key for it (`sink.kafka.topic`,
    /// which the registry knows from the kind) is written as the pipeline's `sink.destination`.
    #[cfg(feature = "sink-kafka")]
    #[test]
    fn the_sinks_own_template_key_is_named_as_sink_destination() {
        in_jail(|jail| {
            let mut all = pipelines(jail, THREE).unwrap();
            crate::registry::Registry::builtin().name_destinations(&mut all);
            let [billing, _, stock] = &all[..] else {
                unreachable!()
            };
            assert_eq!(stock.destination_key.as_deref(), Some("sink.kafka.topic"));
            assert_eq!(
                stock.rekey(
                    "sink.kafka.topic: no topic `stock.x` (create it, or fix sink.kafka.topic)"
                ),
                "pipelines.stock.sink.destination: no topic `stock.x` (create it, or fix \
                 pipelines.stock.sink.destination)"
            );
            assert!(stock.rekeys());
            // The shared sink sets no destination: its own key stays.
            assert_eq!(billing.destination_key, None);
            assert_eq!(
                billing.rekey("sink.redis_streams.stream: x"),
                "sink.redis_streams.stream: x"
            );
            Ok(())
        });
    }

    #[test]
    fn named_pipelines_inherit_relay_keys_and_the_sink() {
        in_jail(|jail| {
            let all = pipelines(jail, THREE).unwrap();
            let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
            assert_eq!(names, ["billing", "orders", "stock"]);
            let [billing, orders, stock] = &all[..] else {
                unreachable!()
            };
            assert_eq!(billing.relay.batch_size, 50);
            assert_eq!(orders.relay.batch_size, 500, "its own key wins");
            assert_eq!(
                orders.relay.backoff_max,
                Duration::from_secs(10),
                "the shared keys stay under it"
            );
            assert_eq!(
                (billing.sink_key.as_str(), billing.sink.kind.as_str()),
                ("sink", "redis-streams")
            );
            assert_eq!(
                (stock.sink_key.as_str(), stock.sink.kind.as_str()),
                ("pipelines.stock.sink", "kafka")
            );
            assert_eq!(
                stock.sink.destination.as_deref(),
                Some("stock.{event_type}")
            );
            assert_eq!(stock.store_kind, "mysql");
            assert_eq!(
                stock.rekey("store.table: bad"),
                "pipelines.stock.store.table: bad"
            );
            assert_eq!(
                stock.rekey("sink.kafka.acks: bad"),
                "pipelines.stock.sink.kafka.acks: bad"
            );
            assert_eq!(
                billing.rekey("sink.kafka.acks: bad"),
                "sink.kafka.acks: bad",
                "the shared sink keeps its key"
            );
            assert_eq!(billing.rekey("storefront: x"), "storefront: x");
            // Keys the pipeline sets are rekeyed wherever a message names them (a refused
            // login names `store.url` in its middle), never a name that only looks like one.
            assert_eq!(
                billing.rekey("PostgreSQL at db:5432 refused user \"app\" (store.url): no"),
                "PostgreSQL at db:5432 refused user \"app\" (pipelines.billing.store.url): no"
            );
            assert_eq!(
                billing
                    .rekey("the certificate is for db.test (the host of store.url, store.table)"),
                "the certificate is for db.test (the host of pipelines.billing.store.url, \
                 pipelines.billing.store.table)"
            );
            assert_eq!(
                stock.rekey("cannot reach Kafka at k:9092 (sink.kafka.\"bootstrap.servers\"): x"),
                "cannot reach Kafka at k:9092 (pipelines.stock.sink.kafka.\"bootstrap.servers\"): x"
            );
            assert_eq!(
                stock.rekey("no topic for sink.destination `stock.{event_type}`"),
                "no topic for pipelines.stock.sink.destination `stock.{event_type}`"
            );
            for untouched in [
                // Not a key this pipeline sets: a table in schema `store`, a longer name.
                "table store.orders does not exist (store.password)",
                "see store.urls, mystore.url, pipelines.billing.store.url",
                // The shared sink keeps its key.
                "cannot reach Redis at r:6379 (sink.redis_streams.url)",
            ] {
                assert_eq!(billing.rekey(untouched), untouched);
            }
            Ok(())
        });
    }

    #[test]
    fn the_environment_reaches_every_pipelines_keys() {
        in_jail(|jail| {
            jail.set_env("OUTBOX_PIPELINES__ORDERS__RELAY__BATCH_SIZE", "7");
            jail.set_env("OUTBOX_PIPELINES__BILLING__STORE__TABLE", "ledger.outbox");
            jail.set_env("OUTBOX_PIPELINES__BILLING__SINK__KIND", "rabbitmq");
            let all = pipelines(jail, THREE).unwrap();
            assert_eq!(all[1].relay.batch_size, 7);
            assert_eq!(all[0].sink.kind, "rabbitmq");
            assert_eq!(all[0].sink_key, "pipelines.billing.sink");
            let file = Path::new("relay.toml");
            let (_, figment) = settings::load(Some(file)).unwrap();
            let store: outboxkit_store_postgres::PostgresStoreConfig =
                settings::store_section_at(&figment, &all[0].store_key, Some(file)).unwrap();
            assert_eq!(store.table, "ledger.outbox");
            // A pipeline of the environment alone.
            jail.set_env("OUTBOX_PIPELINES__AUDIT__STORE__KIND", "postgres");
            let all = pipelines(jail, THREE).unwrap();
            assert_eq!(all[0].name, "audit");
            Ok(())
        });
    }

    #[test]
    fn bad_pipelines_are_refused_naming_the_key() {
        in_jail(|jail| {
            for bad in ["a__b", "9lives", "trailing_", "with-dash"] {
                assert!(check_name(bad).is_err(), "{bad}");
            }
            for good in ["a", "billing", "tenant_42", "eu_west_1"] {
                check_name(good).unwrap();
            }

            // Each configuration, and the start of its error.
            for (toml, start) in [
                (
                    "[pipelines.Billing.store]\nkind = \"postgres\"\n[sink]\nkind = \"x\"\n",
                    "invalid configuration: pipelines.Billing: \"Billing\" is not a valid pipeline name",
                ),
                (
                    "[sink]\nkind = \"x\"\n[pipelines.billing.relay]\nbatch_sise = 3\n\
                     [pipelines.billing.store]\nkind = \"postgres\"\n",
                    "invalid configuration: pipelines.billing.relay.batch_sise: unknown key",
                ),
                (
                    "[sink]\nkind = \"x\"\n[pipelines.billing]\nstor = 1\n",
                    "invalid configuration: pipelines.billing.stor: unknown key",
                ),
                (
                    "[store]\nkind = \"postgres\"\n[sink]\nkind = \"x\"\n\
                     [pipelines.default.store]\nkind = \"postgres\"\n",
                    "invalid configuration: pipelines.default: the top-level [store] is the pipeline `default` already",
                ),
            ] {
                let e = pipelines(jail, toml).unwrap_err();
                assert!(e.starts_with(start), "{e}");
            }

            // Each configuration, and its whole error.
            for (toml, error) in [
                (
                    "[pipelines.billing.store]\nkind = \"postgres\"\n",
                    "invalid configuration: pipelines.billing.sink: missing required table: give the \
                     pipeline a [pipelines.billing.sink], or give every pipeline one with a shared \
                     [sink] (in relay.toml)",
                ),
                (
                    "[sink]\nkind = \"x\"\n[pipelines.billing]\nrelay = { batch_size = 0 }\n\
                     [pipelines.billing.store]\nkind = \"postgres\"\n",
                    "invalid configuration: pipelines.billing.relay.batch_size: must be between 1 and \
                     100000, got 0 (in relay.toml)",
                ),
                (
                    "[relay]\nbatch_size = 5\n",
                    "invalid configuration: store: missing required table [store] (in relay.toml)",
                ),
            ] {
                assert_eq!(pipelines(jail, toml).unwrap_err(), error);
            }
            Ok(())
        });
    }

    #[test]
    fn select_finds_one_or_names_the_configured_ones() {
        in_jail(|jail| {
            let all = pipelines(jail, THREE).unwrap();
            assert_eq!(select(&all, None).unwrap().len(), 3);
            assert_eq!(select(&all, Some("orders")).unwrap()[0].name, "orders");
            assert_eq!(
                select(&all, Some("nope")).unwrap_err(),
                "--pipeline nope: no such pipeline (configured: billing, orders, stock)"
            );
            Ok(())
        });
    }
}
