//! Adapters by kind. Every store and sink, shipped or a third party's, registers the same way:
//! from its configuration type ([`StoreConfig`] / [`SinkConfig`]). The registry reads the
//! section of each pipeline, applies `sink.destination`, runs the adapter's checks before
//! anything connects, says which key of which pipeline a configuration error is about and where
//! it was set, and lists the kinds in `--version`.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use figment::Figment;
use outboxkit_core::{plugin, Discovery, StoreConfig};
use outboxkit_core::{DestinationTemplate, Error, ErrorKind, Result, Sink, SinkConfig, Store};

use crate::pipeline::Pipeline;
use crate::settings;

/// What reading an adapter's settings needs: the pipeline (where its store and sink tables
/// are), the figment (to read sections with key paths in errors) and the config file's path
/// (for messages).
#[derive(Debug, Clone, Copy)]
pub struct FactoryContext<'a> {
    pub pipeline: &'a Pipeline,
    pub figment: &'a Figment,
    pub file: Option<&'a PathBuf>,
}

impl FactoryContext<'_> {
    fn file(&self) -> Option<&Path> {
        self.file.map(PathBuf::as_path)
    }

    /// An error with the pipeline's keys (adapters write `store.table: ...`), and for a
    /// configuration error where it was set.
    fn locate(&self, e: Error) -> Error {
        if e.kind() != ErrorKind::Config {
            return self.pipeline.rekey_error(e);
        }
        let message = self.pipeline.rekey(&e.full_message());
        Error::config(settings::locate(&message, self.figment, self.file()))
    }
}

/// A boxed future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

type Check = fn(FactoryContext<'_>) -> Result<()>;
type Identity = fn(FactoryContext<'_>) -> Result<Option<String>>;
/// For each (table, identity): whether the pipeline relays it ([`StoreConfig::relays_table`]),
/// its section read once.
type RelaysTables = fn(FactoryContext<'_>, &[(&str, Option<&str>)]) -> Result<Vec<bool>>;
type DiscoveryOf = fn(FactoryContext<'_>) -> Result<Option<Discovery>>;
type MigrationSql = fn(FactoryContext<'_>) -> Result<Option<String>>;
type Discover = for<'a> fn(FactoryContext<'a>) -> BoxFuture<'a, Result<Vec<DiscoveredTable>>>;

/// A table a pattern `store.table` matched, ready to be connected as a store of its own.
pub struct DiscoveredTable {
    /// Its qualified name: `tenant_7.outbox`.
    pub table: String,
    /// Its [`StoreConfig::table_identity`], to find the pipelines that relay it.
    identity: Option<String>,
    build: BuildDiscovered,
}

/// What a scan of a pattern pipeline found.
#[derive(Debug, Default)]
pub struct Discovered {
    /// The tables the pipeline relays.
    pub tables: Vec<DiscoveredTable>,
    /// Tables its pattern matches that belong to another pipeline (see
    /// [`Registry::discover`]).
    pub elsewhere: Vec<Claimed>,
}

/// A table that a pattern matches and another pipeline relays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Its qualified name.
    pub table: String,
    /// The pipeline that relays it.
    pub pipeline: String,
    /// Whether that pipeline found it with a pattern too.
    pub by_pattern: bool,
}

impl Claimed {
    /// How `--pipeline` names the table where it is relayed: `orders`, or `tenants/t7.outbox`.
    pub fn label(&self) -> String {
        match self.by_pattern {
            true => format!("{}/{}", self.pipeline, self.table),
            false => self.pipeline.clone(),
        }
    }
}

/// Connects a discovered table's store, once.
type BuildDiscovered = Box<dyn FnOnce() -> BoxFuture<'static, Result<Arc<dyn Store>>> + Send>;

impl std::fmt::Debug for DiscoveredTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveredTable")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl DiscoveredTable {
    /// Connect the table's store (its errors name the pipeline's keys).
    pub async fn build(self) -> Result<Arc<dyn Store>> {
        (self.build)().await
    }
}
type BuildStore = for<'a> fn(FactoryContext<'a>) -> BoxFuture<'a, Result<Arc<dyn Store>>>;
type BuildSink = for<'a> fn(FactoryContext<'a>) -> BoxFuture<'a, Result<Arc<dyn Sink>>>;

#[derive(Clone, Copy)]
struct StoreEntry {
    check: Check,
    identity: Identity,
    relays_tables: RelaysTables,
    discovery: DiscoveryOf,
    discover: Discover,
    migration_sql: MigrationSql,
    build: BuildStore,
}

#[derive(Clone, Copy)]
struct SinkEntry {
    check: Check,
    build: BuildSink,
    /// [`SinkConfig::DESTINATION_KEY`].
    destination_key: Option<&'static str>,
}

/// The cargo features of `outboxkit-relay` that compile an adapter in. A kind's feature is
/// `store-<kind>` or `sink-<kind>`, so an error can say which one to build with.
pub const ADAPTER_FEATURES: &[&str] = &[
    "store-postgres",
    "store-mysql",
    "sink-kafka",
    "sink-rabbitmq",
    "sink-redis-streams",
    "sink-sqs",
    "sink-sns",
    "sink-nats",
];

/// The registry of store and sink kinds.
#[derive(Clone, Default)]
pub struct Registry {
    stores: BTreeMap<&'static str, StoreEntry>,
    sinks: BTreeMap<&'static str, SinkEntry>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("stores", &self.store_kinds())
            .field("sinks", &self.sink_kinds())
            .finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every adapter compiled into this binary (by its cargo feature).
    pub fn builtin() -> Self {
        #[allow(unused_mut)]
        let mut registry = Self::empty();
        #[cfg(feature = "store-postgres")]
        registry.store::<outboxkit_store_postgres::PostgresStoreConfig>();
        #[cfg(feature = "store-mysql")]
        registry.store::<outboxkit_store_mysql::MySqlStoreConfig>();
        #[cfg(feature = "sink-kafka")]
        registry.sink::<outboxkit_sink_kafka::KafkaSinkConfig>();
        #[cfg(feature = "sink-rabbitmq")]
        registry.sink::<outboxkit_sink_rabbitmq::RabbitMqConfig>();
        #[cfg(feature = "sink-redis-streams")]
        registry.sink::<outboxkit_sink_redis_streams::RedisStreamsConfig>();
        #[cfg(feature = "sink-sqs")]
        registry.sink::<outboxkit_sink_sqs::SqsConfig>();
        #[cfg(feature = "sink-sns")]
        registry.sink::<outboxkit_sink_sns::SnsConfig>();
        #[cfg(feature = "sink-nats")]
        registry.sink::<outboxkit_sink_nats::NatsConfig>();
        registry
    }

    /// Register a store kind: `[store]` with `kind = C::KIND`, read into `C`.
    pub fn store<C: StoreConfig>(&mut self) -> &mut Self {
        self.stores.insert(
            C::KIND,
            StoreEntry {
                check: |ctx| store_config::<C>(ctx).map(drop),
                identity: |ctx| store_config::<C>(ctx).map(|c| c.table_identity()),
                relays_tables: |ctx, tables| {
                    let config = store_config::<C>(ctx)?;
                    Ok(tables
                        .iter()
                        .map(|(table, identity)| {
                            identity.is_some_and(|identity| config.relays_table(table, identity))
                        })
                        .collect())
                },
                discovery: |ctx| store_config::<C>(ctx).map(|c| c.discovery()),
                discover: discover_tables::<C>,
                migration_sql: |ctx| {
                    let config = store_config::<C>(ctx)?;
                    config.migration_sql().map_err(|e| ctx.locate(e))
                },
                build: build_store::<C>,
            },
        );
        self
    }

    /// Register a sink kind: `[sink]` with `kind = C::KIND`, its settings read into `C` from
    /// `[sink.<section>]` (see [`plugin::sink_section`]).
    pub fn sink<C: SinkConfig>(&mut self) -> &mut Self {
        self.sinks.insert(
            C::KIND,
            SinkEntry {
                check: |ctx| sink_config::<C>(ctx).map(drop),
                build: build_sink::<C>,
                destination_key: C::DESTINATION_KEY,
            },
        );
        self
    }

    /// For each pipeline whose sink table sets `destination`: the key its sink kind's messages
    /// name the template by (`sink.sns.topic`), so that [`Pipeline::rekey`] says
    /// `sink.destination` instead.
    pub fn name_destinations(&self, pipelines: &mut [Pipeline]) {
        for pipeline in pipelines {
            if pipeline.sink.destination.is_none() {
                continue;
            }
            let Some(entry) = self.sinks.get(pipeline.sink.kind.as_str()) else {
                continue;
            };
            pipeline.destination_key = entry
                .destination_key
                .map(|key| format!("sink.{}.{key}", plugin::sink_section(&pipeline.sink.kind)));
        }
    }

    /// Store kinds registered.
    pub fn store_kinds(&self) -> Vec<&'static str> {
        self.stores.keys().copied().collect()
    }

    /// Sink kinds registered.
    pub fn sink_kinds(&self) -> Vec<&'static str> {
        self.sinks.keys().copied().collect()
    }

    /// `key` (`sink.kind`, `pipelines.billing.store.kind`) names no registered kind. The
    /// error names the feature that compiles a shipped kind in, and the kind meant when `kind`
    /// differs from one only by case or `_` for `-` (the settings section's spelling:
    /// `redis_streams` for `redis-streams`).
    fn unknown_kind(key: &str, kind: &str, known: Vec<&str>) -> Error {
        // `store` or `sink`: the segment before `.kind`.
        let adapter = key.rsplit('.').nth(1).unwrap_or_default();
        let spelled = kind.to_ascii_lowercase().replace('_', "-");
        let feature = format!("{adapter}-{spelled}");
        if known.contains(&spelled.as_str()) {
            return Error::config(format!(
                "{key} = \"{kind}\" is not a known kind: did you mean \"{spelled}\"? (known: {})",
                known.join(", ")
            ));
        }
        if ADAPTER_FEATURES.contains(&feature.as_str()) {
            let respell = match spelled != kind {
                true => format!(", and write \"{spelled}\""),
                false => String::new(),
            };
            return Error::config(format!(
                "{key} = \"{kind}\" is not compiled into this binary: rebuild with `--features {feature}`{respell} \
                 (compiled in: {})",
                known.join(", ")
            ));
        }
        // A kind misspelled or cut short (`postgresql`, `redis`), or another name of one
        // (`mariadb`), said first.
        let shipped: Vec<&str> = ADAPTER_FEATURES
            .iter()
            .filter_map(|f| f.strip_prefix(adapter)?.strip_prefix('-'))
            .collect();
        let meant = match spelled.as_str() {
            "mariadb" => Some("mysql"),
            "postgresql" | "pg" => Some("postgres"),
            _ => outboxkit_core::plugin::closest(&spelled, &shipped).or_else(|| {
                let mut started = shipped.iter().filter(|k| k.starts_with(&spelled));
                match (started.next(), started.next()) {
                    (Some(only), None) => Some(*only),
                    _ => None,
                }
            }),
        };
        let meant = match meant {
            Some(meant) if known.contains(&meant) => {
                format!("did you mean \"{meant}\"? Otherwise, ")
            }
            Some(meant) => format!(
                "did you mean \"{meant}\" (rebuild with `--features {adapter}-{meant}`)? \
                 Otherwise, "
            ),
            None => String::new(),
        };
        // A kind of the team's own, and the binary started is one that does not register it
        // (the stock image's, say).
        Error::config(format!(
            "{key} = \"{kind}\" is not a known kind of {} (known: {}): {meant}a kind of your \
             own runs in your own binary, which registers it with `registry.{adapter}::<…>()`",
            outboxkit_core::command::name(),
            known.join(", ")
        ))
    }

    fn store_entry(&self, pipeline: &Pipeline) -> Result<StoreEntry> {
        let kind = pipeline.store_kind.as_str();
        self.stores.get(kind).copied().ok_or_else(|| {
            Self::unknown_kind(
                &format!("{}.kind", pipeline.store_key),
                kind,
                self.store_kinds(),
            )
        })
    }

    fn sink_entry(&self, pipeline: &Pipeline) -> Result<SinkEntry> {
        let kind = pipeline.sink.kind.as_str();
        self.sinks.get(kind).copied().ok_or_else(|| {
            Self::unknown_kind(
                &format!("{}.kind", pipeline.sink_key),
                kind,
                self.sink_kinds(),
            )
        })
    }

    /// `[sink]` sub-tables must belong to a registered or shipped kind (catches typos like
    /// `[sink.redis]`).
    fn check_sink_sections(&self, pipeline: &Pipeline) -> Result<()> {
        let known: Vec<String> = self
            .sinks
            .keys()
            .map(|kind| plugin::sink_section(kind))
            .collect();
        let shipped: Vec<String> = ADAPTER_FEATURES
            .iter()
            .filter_map(|f| f.strip_prefix("sink-"))
            .map(plugin::sink_section)
            .collect();
        for key in pipeline.sink.sections.keys() {
            if !known.contains(key) && !shipped.contains(key) {
                let mut expected = vec!["kind", "destination"];
                expected.extend(known.iter().map(String::as_str));
                return Err(Error::config(format!(
                    "{}.{key}: {}",
                    pipeline.sink_key,
                    crate::settings::unknown_key(&pipeline.sink_key, key, &expected)
                )));
            }
        }
        Ok(())
    }

    /// Check the whole configuration before connecting: both kinds are registered, the `[sink]`
    /// sub-tables are known, and both adapters' sections read and validate. Errors say where
    /// the key was set (`(in FILE)` or `(from environment variable OUTBOX_...)`).
    pub fn check_config(&self, ctx: FactoryContext<'_>) -> Result<()> {
        let store = self.store_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        let sink = self.sink_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        self.check_sink_sections(ctx.pipeline)
            .map_err(|e| ctx.locate(e))?;
        (store.check)(ctx)?;
        (sink.check)(ctx)
    }

    /// Refuse two pipelines on the same outbox table (as far as their stores can tell before
    /// connecting): both would relay every event, and their relays would fight over the shards
    /// with different sinks.
    pub fn check_distinct_tables<'a>(
        &self,
        pipelines: &'a [Pipeline],
        context: impl Fn(&'a Pipeline) -> FactoryContext<'a>,
    ) -> Result<()> {
        let mut seen: BTreeMap<String, &Pipeline> = BTreeMap::new();
        for pipeline in pipelines {
            let ctx = context(pipeline);
            let entry = self.store_entry(pipeline).map_err(|e| ctx.locate(e))?;
            let Some(identity) = (entry.identity)(ctx)? else {
                continue;
            };
            if let Some(first) = seen.get(&identity) {
                return Err(Error::config(format!(
                    "{} and {}: pipelines `{}` and `{}` both relay the table {identity}: give \
                     each its own table",
                    first.store_key, pipeline.store_key, first.name, pipeline.name
                )));
            }
            seen.insert(identity, pipeline);
        }
        Ok(())
    }

    /// `Some` when the pipeline's store names a pattern of tables (discovery).
    pub fn discovery(&self, ctx: FactoryContext<'_>) -> Result<Option<Discovery>> {
        let entry = self.store_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        (entry.discovery)(ctx)
    }

    /// The SQL that `migrate` runs to create the pipeline's table, written without connecting
    /// (see [`StoreConfig::migration_sql`]); `None` when its store kind cannot give it.
    pub fn migration_sql(&self, ctx: FactoryContext<'_>) -> Result<Option<String>> {
        let entry = self.store_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        (entry.migration_sql)(ctx)
    }

    /// The tables the pipeline's pattern matches now, each given to one pipeline of
    /// `pipelines` (the configuration's, with `context` to read each): a table that a
    /// pipeline names in its own `store.table` is that pipeline's; one that only patterns
    /// match is the first such pipeline's (in the configuration's order: `default`, then by
    /// name). Otherwise two relays with different sinks would share the table's events.
    pub async fn discover<'a>(
        &self,
        pipeline: &'a Pipeline,
        pipelines: &'a [Pipeline],
        context: impl Fn(&'a Pipeline) -> FactoryContext<'a>,
    ) -> Result<Discovered> {
        let ctx = context(pipeline);
        let entry = self.store_entry(pipeline).map_err(|e| ctx.locate(e))?;
        let found = (entry.discover)(ctx).await?;
        let identified: Vec<(&str, Option<&str>)> = found
            .iter()
            .map(|t| (t.table.as_str(), t.identity.as_deref()))
            .collect();
        // Per pipeline (those that name one table first, then the patterns): which of the
        // found tables it relays.
        let mut claimants = Vec::new();
        for other in pipelines {
            let ctx = context(other);
            let entry = self.store_entry(other).map_err(|e| ctx.locate(e))?;
            let pattern = (entry.discovery)(ctx)?.is_some();
            let relays = (entry.relays_tables)(ctx, &identified)?;
            claimants.push((pattern, other, relays));
        }
        claimants.sort_by_key(|(pattern, _, _)| *pattern);
        let owners: Vec<Option<(&Pipeline, bool)>> = (0..found.len())
            .map(|i| {
                claimants
                    .iter()
                    .find(|(_, _, relays)| relays[i])
                    .map(|(pattern, other, _)| (*other, *pattern))
            })
            .collect();
        let mut discovered = Discovered::default();
        for (table, owner) in found.into_iter().zip(owners) {
            match owner {
                Some((other, by_pattern)) if other.name != pipeline.name => {
                    discovered.elsewhere.push(Claimed {
                        table: table.table,
                        pipeline: other.name.clone(),
                        by_pattern,
                    });
                }
                _ => discovered.tables.push(table),
            }
        }
        Ok(discovered)
    }

    /// Read, check and build the configured store.
    pub async fn build_store(&self, ctx: FactoryContext<'_>) -> Result<Arc<dyn Store>> {
        let entry = self.store_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        (entry.build)(ctx).await
    }

    /// Read, check and build the configured sink.
    pub async fn build_sink(&self, ctx: FactoryContext<'_>) -> Result<Arc<dyn Sink>> {
        let entry = self.sink_entry(ctx.pipeline).map_err(|e| ctx.locate(e))?;
        (entry.build)(ctx).await
    }
}

fn build_store<C: StoreConfig>(ctx: FactoryContext<'_>) -> BoxFuture<'_, Result<Arc<dyn Store>>> {
    Box::pin(async move {
        let config = store_config::<C>(ctx)?;
        let store = config.build().await.map_err(|e| ctx.locate(e))?;
        Ok(Arc::new(store) as Arc<dyn Store>)
    })
}

fn discover_tables<C: StoreConfig>(
    ctx: FactoryContext<'_>,
) -> BoxFuture<'_, Result<Vec<DiscoveredTable>>> {
    Box::pin(async move {
        let config = store_config::<C>(ctx)?;
        let found = config.discover().await.map_err(|e| ctx.locate(e))?;
        Ok(found
            .into_iter()
            .map(|(table, config)| {
                let pipeline = ctx.pipeline.clone();
                let identity = config.table_identity();
                let build = move || -> BoxFuture<'static, Result<Arc<dyn Store>>> {
                    Box::pin(async move {
                        let store = config.build().await.map_err(|e| pipeline.rekey_error(e))?;
                        Ok(Arc::new(store) as Arc<dyn Store>)
                    })
                };
                DiscoveredTable {
                    table,
                    identity,
                    build: Box::new(build),
                }
            })
            .collect())
    })
}

fn build_sink<C: SinkConfig>(ctx: FactoryContext<'_>) -> BoxFuture<'_, Result<Arc<dyn Sink>>> {
    Box::pin(async move {
        let config = sink_config::<C>(ctx)?;
        tracing::debug!(?config, kind = C::KIND, "sink configuration");
        let sink = config.build().await.map_err(|e| ctx.locate(e))?;
        Ok(Arc::new(sink) as Arc<dyn Sink>)
    })
}

/// The sink section of the first pipeline of the configuration file `file` (the pipeline
/// `default` of a file with a top-level `[store]`), read into `C` exactly as `run` reads it:
/// defaults, the `OUTBOX_*` environment, `sink.destination`, validation, errors that say where
/// the key was set. For a sink crate's tests.
pub fn sink_config_in_file<C: SinkConfig>(file: &Path) -> Result<C> {
    let invalid = |e: settings::ConfigError| Error::config(e.to_string());
    let (settings, figment) = settings::load(Some(file)).map_err(invalid)?;
    let pipelines = crate::pipeline::resolve(&settings, &figment, Some(file)).map_err(invalid)?;
    let file = file.to_path_buf();
    sink_config::<C>(FactoryContext {
        pipeline: &pipelines[0],
        figment: &figment,
        file: Some(&file),
    })
}

/// `[store]` without `kind`, read into `C` and validated; errors name the key and where it was
/// set.
pub fn store_config<C: StoreConfig>(ctx: FactoryContext<'_>) -> Result<C> {
    let config: C = settings::store_section_at(ctx.figment, &ctx.pipeline.store_key, ctx.file())
        .map_err(|e| Error::config(e.0))?;
    config.validate().map_err(|e| ctx.locate(e))?;
    Ok(config)
}

/// `[sink.<section>]` read into `C`, with `sink.destination` applied, validated; errors name
/// the key and where it was set.
pub fn sink_config<C: SinkConfig>(ctx: FactoryContext<'_>) -> Result<C> {
    let section = format!(
        "{}.{}",
        ctx.pipeline.sink_key,
        plugin::sink_section(C::KIND)
    );
    let read = || -> Result<C> {
        settings::section_at(ctx.figment, &section, ctx.file()).map_err(|e| Error::config(e.0))
    };
    let mut config = read()?;
    let Some(destination) = &ctx.pipeline.sink.destination else {
        config.validate().map_err(|e| ctx.locate(e))?;
        return Ok(config);
    };
    DestinationTemplate::parse(destination)
        .map_err(|e| ctx.locate(e.context(format!("{}.destination", ctx.pipeline.sink_key))))?;
    *config.destination_mut() = destination.clone();
    if let Err(e) = config.validate() {
        // The sink checks its template under its own key (`sink.nats.subject: ...`), which
        // the user may never have written. When the section passes without the destination,
        // the destination is what it refused: say `sink.destination` and where that was set.
        let own_template_passes = read().is_ok_and(|own| own.validate().is_ok());
        let e = if own_template_passes && e.kind() == ErrorKind::Config {
            destination_refused::<C>(&e)
        } else {
            e
        };
        return Err(ctx.locate(e));
    }
    Ok(config)
}

/// A sink's refusal of its template, `sink.<section>.<key>: why`, when the template was
/// `sink.destination`: `sink.destination: why`.
fn destination_refused<C: SinkConfig>(e: &Error) -> Error {
    let message = e.full_message();
    let own_section = format!("sink.{}.", plugin::sink_section(C::KIND));
    let why = message
        .strip_prefix(&own_section)
        .and_then(|rest| rest.split_once(": "))
        .filter(|(key, _)| !key.contains(' '))
        .map_or(message.as_str(), |(_, why)| why);
    Error::config(format!("sink.destination: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_kind_that_is_not_registered_names_its_feature() {
        let registry = Registry::empty();
        let e = Registry::unknown_kind("sink.kind", "kafka", registry.sink_kinds());
        assert!(e.message().contains("--features sink-kafka"), "{e}");
        let e = Registry::unknown_kind("store.kind", "mysql", registry.store_kinds());
        assert!(e.message().contains("--features store-mysql"), "{e}");
        let e = Registry::unknown_kind("sink.kind", "carrier-pigeon", vec!["redis-streams"]);
        assert!(
            e.message().contains(
                "is not a known kind of outbox-relay (known: redis-streams): a kind of your own \
                 runs in your own binary, which registers it with `registry.sink::<…>()`"
            ),
            "{e}"
        );
        // In a pipeline of its own too (the key used to lead to a feature `pipelines-kafka`).
        let e = Registry::unknown_kind("pipelines.billing.sink.kind", "kafka", vec![]);
        assert!(e.message().contains("--features sink-kafka"), "{e}");
    }

    /// The settings section's spelling (`[sink.redis_streams]`) as the kind, or another case.
    #[test]
    fn a_kind_spelled_like_its_section_names_the_kind_meant() {
        let e =
            Registry::unknown_kind("sink.kind", "redis_streams", vec!["kafka", "redis-streams"]);
        assert_eq!(
            e.message(),
            "sink.kind = \"redis_streams\" is not a known kind: did you mean \"redis-streams\"? \
             (known: kafka, redis-streams)"
        );
        let e = Registry::unknown_kind("store.kind", "PostgreS", vec!["postgres"]);
        assert!(e.message().contains("did you mean \"postgres\"?"), "{e}");
        let e = Registry::unknown_kind("sink.kind", "Redis_Streams", vec!["kafka"]);
        let rebuild = "rebuild with `--features sink-redis-streams`, and write \"redis-streams\"";
        assert!(e.message().contains(rebuild), "{e}");
    }

    /// A kind misspelled, cut short or named otherwise: the shipped kind meant, and the feature
    /// when it is not compiled in.
    #[test]
    fn a_kind_close_to_a_shipped_one_names_it() {
        let known = vec!["postgres", "redis-streams"];
        for (key, kind, meant) in [
            (
                "sink.kind",
                "redis",
                "did you mean \"redis-streams\"? Otherwise, a kind of",
            ),
            (
                "sink.kind",
                "rabbit",
                "did you mean \"rabbitmq\" (rebuild with `--features sink-rabbitmq`)?",
            ),
            (
                "store.kind",
                "postgresql",
                "did you mean \"postgres\"? Otherwise,",
            ),
            (
                "store.kind",
                "mariadb",
                "did you mean \"mysql\" (rebuild with `--features store-mysql`)?",
            ),
            (
                "pipelines.b.sink.kind",
                "nast",
                "did you mean \"nats\" (rebuild with `--features sink-nats`)?",
            ),
        ] {
            let e = Registry::unknown_kind(key, kind, known.clone());
            assert!(e.message().contains(meant), "{kind}: {e}");
            assert!(
                e.message().contains("(known: postgres, redis-streams)"),
                "{e}"
            );
        }
        // Nothing close: no guess.
        let e = Registry::unknown_kind("sink.kind", "pigeon", known);
        assert!(!e.message().contains("did you mean"), "{e}");
    }

    #[test]
    fn every_compiled_in_kind_has_its_feature_listed() {
        let registry = Registry::builtin();
        for kind in registry.store_kinds() {
            let feature = format!("store-{kind}");
            assert!(ADAPTER_FEATURES.contains(&feature.as_str()), "{feature}");
        }
        for kind in registry.sink_kinds() {
            let feature = format!("sink-{kind}");
            assert!(ADAPTER_FEATURES.contains(&feature.as_str()), "{feature}");
        }
    }
}
