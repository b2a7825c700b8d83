//! The relay engine.
//!
//! One loop per relay process:
//!
//! 1. hold a [`ShardSession`](crate::store::ShardSession) (a dedicated database connection)
//!    and rebalance shard locks so the live relays share the shards fairly — one owner per
//!    shard (`rebalance`);
//! 2. claim the next pending rows of owned shards in `id` order (a plain read: the shard lock
//!    already makes this relay the only publisher of those rows);
//! 3. publish them — while the next claim runs on the session — sending at most one event per
//!    aggregate per call unless the sink guarantees order within a key, and never sending an
//!    event whose predecessor in the batch failed (`plan`);
//! 4. mark the acknowledged rows and record failures (backoff with jitter, then dead) through
//!    the same session, so a relay that lost a shard can never mark its rows (fencing)
//!    (`worker`).
//!
//! No database transaction is open while the broker is called. A call that failed as a whole
//! (`Err` from the sink, or outcomes that [`whole_call_failure`](crate::whole_call_failure)
//! says fail the call: a broker outage, refused credentials) dead-letters nothing: the engine
//! backs off and tries again.
//!
//! Beside the loop: [`Shutdown`] (`shutdown`), the health behind [`RelayHandle`] (`health`),
//! the backlog-figures and purge loops (`background`), and what a sink call that panics or
//! never answers, or a panic in the loop, ends as (`contain`).

mod background;
mod contain;
mod health;
mod labels;
mod plan;
mod rebalance;
mod shutdown;
mod worker;

use std::sync::Arc;

use tracing::{error, info, Instrument};

pub use health::RelayHandle;
pub use shutdown::{Shutdown, ShutdownTrigger};

use crate::config::RelayConfig;
use crate::error::{Error, Result};
use crate::sink::Sink;
use crate::store::Store;

/// The relay: a store, a sink, settings. Build it, take a [`RelayHandle`], then [`Relay::run`].
#[derive(Debug)]
pub struct Relay {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    relay_id: String,
    /// The `pipeline` label of every metric this relay records.
    pipeline: Arc<str>,
    /// `outbox_publish_batch_seconds` of this pipeline, looked up once.
    publish_duration: metrics::Histogram,
    /// The `destination` label of the per-destination counters.
    destination_labels: labels::DestinationLabels,
    handle: RelayHandle,
    /// What the store's and the sink's errors pass through before they are logged or shown.
    rekey: Rekey,
}

/// A function errors pass through ([`Relay::rekey_errors`]); none by default.
#[derive(Clone, Default)]
struct Rekey(Option<Arc<dyn Fn(Error) -> Error + Send + Sync>>);

impl std::fmt::Debug for Rekey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Rekey(set)"
        } else {
            "Rekey(none)"
        })
    }
}

impl Relay {
    /// A relay from `store` to `sink`. Fails when the settings are invalid.
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        store.check_relay_settings(&config)?;
        let relay_id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        let relay = Self {
            store,
            sink,
            destination_labels: labels::DestinationLabels::new(config.destination_labels),
            config,
            relay_id,
            pipeline: Arc::from(""),
            publish_duration: metrics::Histogram::noop(),
            handle: RelayHandle::default(),
            rekey: Rekey::default(),
        };
        Ok(relay.pipeline(crate::DEFAULT_PIPELINE))
    }

    /// Name the pipeline this relay serves: the `pipeline` label of its metrics (`default`
    /// unless named). A process that relays several outboxes runs one `Relay` per pipeline.
    pub fn pipeline(mut self, name: &str) -> Self {
        let pipeline: Arc<str> = Arc::from(name);
        self.publish_duration = metrics::histogram!(crate::metrics::PUBLISH_DURATION, crate::metrics::PIPELINE => pipeline.clone());
        self.handle = RelayHandle::new(pipeline.clone());
        self.pipeline = pipeline;
        self
    }

    /// Pass every error of the store and of the sink through `rekey` before the relay logs it,
    /// shows it (`/readyz`, the handle's last error) or records it (an event's last error). Adapters name their settings as they
    /// stand in a lone `[store]` and `[sink]` (`store.url`); a binary that reads them from
    /// elsewhere (`[pipelines.billing.store]`) names them as they are set with this.
    pub fn rekey_errors(mut self, rekey: impl Fn(Error) -> Error + Send + Sync + 'static) -> Self {
        self.rekey = Rekey(Some(Arc::new(rekey)));
        self
    }

    /// `e` as this relay shows it ([`Relay::rekey_errors`]).
    pub(crate) fn shown(&self, e: Error) -> Error {
        match &self.rekey.0 {
            Some(rekey) => rekey(e),
            None => e,
        }
    }

    /// This relay's name as other relays and `status` see it.
    pub fn relay_id(&self) -> &str {
        &self.relay_id
    }

    /// Health and counters of this relay.
    pub fn handle(&self) -> RelayHandle {
        self.handle.clone()
    }

    /// Relay until `shutdown` fires, then finish the in-flight batch (within
    /// `relay.shutdown_grace`), mark it, release the shard locks and return.
    ///
    /// Outages of the database or the broker do not end the loop: it backs off and reconnects.
    pub async fn run(self, shutdown: Shutdown) -> Result<()> {
        let relay = Arc::new(self);
        relay.handle.started();
        info!(
            relay_id = %relay.relay_id,
            pipeline = %relay.pipeline,
            store = %relay.store.describe(),
            sink = relay.sink.kind(),
            batch_size = relay.config.batch_size,
            retention = %relay.config.retention,
            "relay starting"
        );

        // In the caller's span (the pipeline's), so their log lines say which pipeline.
        let status_task = tokio::spawn(
            background::status_loop(relay.clone(), shutdown.clone()).in_current_span(),
        );
        let purge_task =
            tokio::spawn(background::purge_loop(relay.clone(), shutdown.clone()).in_current_span());

        let mut worker = worker::Worker::new(&relay);
        let mut shutdown_rx = shutdown.clone();
        let ran = contain::caught(async {
            worker.run(&mut shutdown_rx).await;
            worker.close_session().await;
        })
        .await;
        // After a panic: the session goes with the worker (its connection closes, the server
        // releases its locks).
        drop(worker);

        status_task.abort();
        purge_task.abort();
        relay.handle.stopped();
        if let Err(panic) = ran {
            let e = Error::new(
                crate::ErrorKind::Other,
                format!(
                    "the relay panicked and stopped: {panic} (a bug; its session was dropped, \
                     so other relays take its shards)"
                ),
            );
            relay.handle.store_failed(&e);
            error!(relay_id = %relay.relay_id, error = %e, "relay stopped");
            return Err(e);
        }
        info!(
            relay_id = %relay.relay_id,
            published = relay.handle.published(),
            "relay stopped"
        );
        Ok(())
    }
}

/// The relay id used when `relay.relay_id` is not set: the host name, the process id and a
/// random suffix (a restarted container often gets the same pid).
pub fn default_relay_id() -> String {
    let host = host_name().unwrap_or_else(|| "relay".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}

/// This machine's name: `HOSTNAME`, else `/etc/hostname` (trimmed; `None` when neither gives
/// one).
pub fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

#[cfg(test)]
mod tests;
