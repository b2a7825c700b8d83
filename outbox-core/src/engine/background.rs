//! The background loops beside the worker: backlog figures for metrics, and the retention
//! purge. Both stop at shutdown (and are aborted when the worker is done). A panic in the
//! store's call is one failed round, as an error would be: the loop goes on.

use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info, warn};

use super::contain::store_call;
use super::shutdown::Shutdown;
use super::Relay;
use crate::config::Retention;
use crate::metrics as m;

/// Refresh the backlog gauges every `relay.status_interval`, and with a `relay.retention` that
/// keeps published rows the age of the oldest kept one.
pub(super) async fn status_loop(relay: Arc<Relay>, mut shutdown: Shutdown) {
    loop {
        let pipeline = relay.pipeline.clone();
        let backlog = status_read(&relay, "reading backlog figures", relay.store.status());
        if let Some(s) = backlog.await {
            metrics::gauge!(m::PENDING, m::PIPELINE => pipeline.clone()).set(s.pending as f64);
            metrics::gauge!(m::OLDEST_PENDING_AGE, m::PIPELINE => pipeline.clone())
                .set(s.oldest_pending_age_secs);
            metrics::gauge!(m::DEAD, m::PIPELINE => pipeline.clone()).set(s.dead as f64);
            metrics::gauge!(m::HELD_BACK_AGGREGATES, m::PIPELINE => pipeline.clone())
                .set(s.held_back_aggregates as f64);
            if let Some(slot) = s.slot {
                metrics::gauge!(m::SLOT_LAG_BYTES, m::PIPELINE => pipeline.clone(), "slot" => slot.name.clone())
                    .set(slot.lag_bytes as f64);
                if let Some(secs) = slot.lag_secs {
                    metrics::gauge!(m::SLOT_LAG_SECONDS, m::PIPELINE => pipeline.clone(), "slot" => slot.name)
                        .set(secs);
                }
            }
        }
        // The age of the oldest kept event (0 when none): a purge that fails or falls behind
        // shows as an age past the retention.
        if matches!(relay.config.retention, Retention::Keep(_)) {
            let oldest = status_read(
                &relay,
                "reading the oldest kept event",
                relay.store.oldest_kept(),
            );
            if let Some(oldest) = oldest.await {
                let age = oldest.map_or(0.0, |at| {
                    (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1e3
                });
                metrics::gauge!(m::OLDEST_KEPT_AGE, m::PIPELINE => pipeline).set(age);
            }
        }
        shutdown.pause(relay.config.status_interval).await;
        if shutdown.is_triggered() {
            return;
        }
    }
}

/// `call`'s answer, or `None` after counting its failure under stage `status` and logging it
/// (at debug: the worker says already when the database cannot be reached).
async fn status_read<T>(
    relay: &Relay,
    what: &str,
    call: impl std::future::Future<Output = crate::Result<T>>,
) -> Option<T> {
    match store_call(what, call).await {
        Ok(answer) => Some(answer),
        Err(e) => {
            metrics::counter!(m::ERRORS, m::PIPELINE => relay.pipeline.clone(), "stage" => "status")
                .increment(1);
            let e = relay.shown(e);
            debug!(error = %e, "{what} failed");
            None
        }
    }
}

/// Every `relay.purge_interval`, delete the rows published more than `relay.retention` ago, in
/// statements of `relay.purge_batch_size` rows. With `retention = "delete"` no row is kept, but
/// the loop still runs: it deletes the rows an earlier retention period kept, which would
/// otherwise stay in the table for good once the setting is turned off.
pub(super) async fn purge_loop(relay: Arc<Relay>, mut shutdown: Shutdown) {
    let limit = relay.config.purge_batch_size;
    // With "delete", only what an earlier retention kept: the rows published before now.
    let (keep, leftovers_only) = match relay.config.retention {
        Retention::Keep(keep) => (keep, false),
        Retention::Delete => (Duration::ZERO, true),
    };
    loop {
        shutdown.pause(relay.config.purge_interval).await;
        if shutdown.is_triggered() {
            return;
        }
        let mut purged = 0;
        loop {
            let purge = relay.store.purge_published(keep, limit);
            match store_call("purging published rows", purge).await {
                Ok(n) => {
                    metrics::counter!(m::PURGED, m::PIPELINE => relay.pipeline.clone())
                        .increment(n);
                    purged += n;
                    if n < u64::from(limit) || shutdown.is_triggered() {
                        break;
                    }
                }
                Err(e) => {
                    metrics::counter!(m::ERRORS, m::PIPELINE => relay.pipeline.clone(), "stage" => "purge")
                        .increment(1);
                    let e = relay.shown(e);
                    // With "delete" only leftovers are purged: the worker says already that
                    // the table cannot be reached, once is enough.
                    if leftovers_only {
                        debug!(error = %e, "purging published rows failed; trying again later");
                    } else {
                        warn!(error = %e, "purging published rows failed; trying again later");
                    }
                    break;
                }
            }
        }
        if purged > 0 && leftovers_only {
            info!(
                purged,
                "deleted published rows that an earlier relay.retention kept \
                 (relay.retention is \"delete\" now)"
            );
        } else if purged > 0 {
            debug!(purged, "purged published rows past retention");
        }
    }
}
