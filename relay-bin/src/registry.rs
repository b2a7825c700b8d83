//! Adapters by kind: each store and sink registers a factory; the binary picks one at run time.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;

use figment::Figment;
use outboxkit_core::{Error, ErrorKind, Result, Sink, Store};

use crate::settings::{Settings, StoreSettings};

/// What a factory gets: the whole configuration, the figment (to read its own section with
/// key paths in errors) and the config file's path (for messages).
#[derive(Debug, Clone, Copy)]
pub struct FactoryContext<'a> {
    pub settings: &'a Settings,
    pub figment: &'a Figment,
    pub file: Option<&'a PathBuf>,
}

/// A boxed future, as factories return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Builds a store from `[store]`.
pub type StoreFactory =
    Arc<dyn for<'a> Fn(&'a StoreSettings) -> BoxFuture<'a, Result<Arc<dyn Store>>> + Send + Sync>;

/// Builds a sink from `[sink]` and its own `[sink.<section>]`.
pub type SinkFactory =
    Arc<dyn for<'a> Fn(FactoryContext<'a>) -> BoxFuture<'a, Result<Arc<dyn Sink>>> + Send + Sync>;

/// Checks a sink's own settings without connecting to anything.
pub type SinkCheck = Arc<dyn for<'a> Fn(FactoryContext<'a>) -> Result<()> + Send + Sync>;

#[derive(Clone)]
struct SinkEntry {
    section: String,
    factory: SinkFactory,
}

/// Every store kind the project ships, with the cargo feature that compiles it in.
pub const SHIPPED_STORES: &[(&str, &str)] =
    &[("postgres", "store-postgres"), ("mysql", "store-mysql")];

/// Every sink kind the project ships, with the cargo feature that compiles it in.
pub const SHIPPED_SINKS: &[(&str, &str)] = &[
    ("kafka", "sink-kafka"),
    ("rabbitmq", "sink-rabbitmq"),
    ("sqs", "sink-sqs"),
    ("redis-streams", "sink-redis-streams"),
];

/// The registry of store and sink factories.
#[derive(Clone, Default)]
pub struct Registry {
    stores: BTreeMap<String, StoreFactory>,
    sinks: BTreeMap<String, SinkEntry>,
    sink_checks: BTreeMap<String, SinkCheck>,
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

    /// Every adapter compiled into this binary.
    pub fn builtin() -> Self {
        #[allow(unused_mut)]
        let mut registry = Self::empty();
        crate::adapters::register_builtin(&mut registry);
        registry
    }

    /// Register a store kind.
    pub fn register_store<F>(&mut self, kind: &str, factory: F) -> &mut Self
    where
        F: for<'a> Fn(&'a StoreSettings) -> BoxFuture<'a, Result<Arc<dyn Store>>>
            + Send
            + Sync
            + 'static,
    {
        self.stores.insert(kind.to_owned(), Arc::new(factory));
        self
    }

    /// Register a sink kind; its settings live in `[sink.<section>]` (the kind with `-` turned
    /// into `_` is the convention, e.g. `redis-streams` → `[sink.redis_streams]`).
    pub fn register_sink<F>(&mut self, kind: &str, factory: F) -> &mut Self
    where
        F: for<'a> Fn(FactoryContext<'a>) -> BoxFuture<'a, Result<Arc<dyn Sink>>>
            + Send
            + Sync
            + 'static,
    {
        self.sinks.insert(
            kind.to_owned(),
            SinkEntry {
                section: kind.replace('-', "_"),
                factory: Arc::new(factory),
            },
        );
        self
    }

    /// Register a check of a sink kind's settings (`[sink.<section>]`) that runs before the
    /// relay connects to anything, so that a typo there is reported as a configuration error
    /// even when the store or the broker is down. Optional: without it, the sink's settings are
    /// checked when its factory runs.
    pub fn register_sink_check<F>(&mut self, kind: &str, check: F) -> &mut Self
    where
        F: for<'a> Fn(FactoryContext<'a>) -> Result<()> + Send + Sync + 'static,
    {
        self.sink_checks.insert(kind.to_owned(), Arc::new(check));
        self
    }

    /// Store kinds registered.
    pub fn store_kinds(&self) -> Vec<&str> {
        self.stores.keys().map(String::as_str).collect()
    }

    /// Sink kinds registered.
    pub fn sink_kinds(&self) -> Vec<&str> {
        self.sinks.keys().map(String::as_str).collect()
    }

    fn unknown_kind(key: &str, kind: &str, known: Vec<&str>, shipped: &[(&str, &str)]) -> Error {
        if let Some((_, feature)) = shipped.iter().find(|(k, _)| *k == kind) {
            return Error::config(format!(
                "{key} = \"{kind}\" is not compiled into this binary: rebuild with `--features {feature}` \
                 (compiled in: {})",
                known.join(", ")
            ));
        }
        Error::config(format!(
            "{key} = \"{kind}\" is not a known kind (known: {})",
            known.join(", ")
        ))
    }

    /// Check `[sink]` sub-tables name registered kinds (catches typos like `[sink.redis]`).
    pub fn check_sink_sections(&self, settings: &Settings) -> Result<()> {
        let known: Vec<String> = self.sinks.values().map(|e| e.section.clone()).collect();
        let shipped: Vec<String> = SHIPPED_SINKS
            .iter()
            .map(|(k, _)| k.replace('-', "_"))
            .collect();
        for key in settings.sink.sections.keys() {
            if !known.contains(key) && !shipped.contains(key) {
                let mut expected = vec!["kind".to_owned(), "destination".to_owned()];
                expected.extend(known.iter().cloned());
                return Err(Error::config(format!(
                    "sink.{key}: unknown key (expected one of: {})",
                    expected.join(", ")
                )));
            }
        }
        Ok(())
    }

    /// Build the configured store.
    pub async fn build_store(&self, settings: &StoreSettings) -> Result<Arc<dyn Store>> {
        let factory = self.stores.get(&settings.kind).ok_or_else(|| {
            Self::unknown_kind(
                "store.kind",
                &settings.kind,
                self.store_kinds(),
                SHIPPED_STORES,
            )
        })?;
        factory(settings).await
    }

    /// Build the configured sink.
    pub async fn build_sink(&self, ctx: FactoryContext<'_>) -> Result<Arc<dyn Sink>> {
        let kind = &ctx.settings.sink.kind;
        let entry = self.sinks.get(kind).ok_or_else(|| {
            Self::unknown_kind("sink.kind", kind, self.sink_kinds(), SHIPPED_SINKS)
        })?;
        (entry.factory)(ctx).await
    }

    /// Check both kinds exist before connecting to anything.
    pub fn check_kinds(&self, settings: &Settings) -> Result<()> {
        if !self.stores.contains_key(&settings.store.kind) {
            return Err(Self::unknown_kind(
                "store.kind",
                &settings.store.kind,
                self.store_kinds(),
                SHIPPED_STORES,
            ));
        }
        if !self.sinks.contains_key(&settings.sink.kind) {
            return Err(Self::unknown_kind(
                "sink.kind",
                &settings.sink.kind,
                self.sink_kinds(),
                SHIPPED_SINKS,
            ));
        }
        self.check_sink_sections(settings)
    }

    /// Check the whole configuration before connecting: both kinds exist, the `[sink]`
    /// sub-tables are known, and the sink's own check (if registered) passes. Errors say where
    /// the key was set (`(in FILE)` or `(from environment variable OUTBOX_...)`).
    pub fn check_config(&self, ctx: FactoryContext<'_>) -> Result<()> {
        let file = ctx.file.map(PathBuf::as_path);
        self.check_kinds(ctx.settings)
            .map_err(|e| locate(e, ctx.figment, file))?;
        match self.sink_checks.get(&ctx.settings.sink.kind) {
            Some(check) => check(ctx),
            None => Ok(()),
        }
    }
}

/// Add where the key a configuration error starts with was set.
fn locate(e: Error, figment: &Figment, file: Option<&Path>) -> Error {
    if e.kind() != ErrorKind::Config {
        return e;
    }
    Error::config(crate::settings::locate(&e.full_message(), figment, file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_kind_that_is_not_registered_names_its_feature() {
        let registry = Registry::empty();
        let e = Registry::unknown_kind("sink.kind", "kafka", registry.sink_kinds(), SHIPPED_SINKS);
        assert!(e.message().contains("--features sink-kafka"), "{e}");
        let e = Registry::unknown_kind(
            "store.kind",
            "mysql",
            registry.store_kinds(),
            SHIPPED_STORES,
        );
        assert!(e.message().contains("--features store-mysql"), "{e}");
        let e = Registry::unknown_kind(
            "sink.kind",
            "carrier-pigeon",
            vec!["redis-streams"],
            SHIPPED_SINKS,
        );
        assert!(
            e.message()
                .contains("is not a known kind (known: redis-streams)"),
            "{e}"
        );
    }
}
