//! The relay's health and counters: [`RelayHandle`] reads them, and the engine changes them
//! only through the few methods below (the state itself is private to this module).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::Error;
use crate::metrics as m;

#[derive(Debug, Default)]
struct HealthState {
    /// The `pipeline` label of the relay's metrics.
    pipeline: Arc<str>,
    running: AtomicBool,
    session_ok: AtomicBool,
    sink_ok: AtomicBool,
    shards: AtomicU32,
    /// An operator's pause holds the table (as last read).
    paused: AtomicBool,
    published: AtomicU64,
    dead: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A cheap, cloneable view of a running relay: health for `/healthz` and `/readyz`, counters.
#[derive(Debug, Clone)]
pub struct RelayHandle {
    state: Arc<HealthState>,
}

impl Default for RelayHandle {
    /// The handle of pipeline `default`.
    fn default() -> Self {
        Self::new(crate::DEFAULT_PIPELINE.into())
    }
}

impl RelayHandle {
    pub(super) fn new(pipeline: Arc<str>) -> Self {
        Self {
            state: Arc::new(HealthState {
                pipeline,
                ..HealthState::default()
            }),
        }
    }

    /// The pipeline this relay serves (the `pipeline` label of its metrics).
    pub fn pipeline(&self) -> &str {
        &self.state.pipeline
    }

    /// The engine loop is running.
    pub fn is_alive(&self) -> bool {
        self.state.running.load(Ordering::Relaxed)
    }

    /// Running, holding a database session, and the broker's last answer was not a failure.
    pub fn is_ready(&self) -> bool {
        self.is_alive()
            && self.state.session_ok.load(Ordering::Relaxed)
            && self.state.sink_ok.load(Ordering::Relaxed)
    }

    /// Shards this relay owns now.
    pub fn shards_owned(&self) -> u32 {
        self.state.shards.load(Ordering::Relaxed)
    }

    /// An operator's pause (`outbox-relay pause`) holds the table, as this relay last read it:
    /// it claims and publishes nothing.
    pub fn is_paused(&self) -> bool {
        self.state.paused.load(Ordering::Relaxed)
    }

    /// Events this relay got acknowledged (and marked) since it started.
    pub fn published(&self) -> u64 {
        self.state.published.load(Ordering::Relaxed)
    }

    /// Events this relay parked as dead since it started.
    pub fn dead(&self) -> u64 {
        self.state.dead.load(Ordering::Relaxed)
    }

    /// The last whole-call error (database or broker), if the relay is not ready.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    // --- The engine's side: every change of the state above. ---

    /// The engine loop starts; the broker counts as answering until a call fails.
    pub(super) fn started(&self) {
        self.state.running.store(true, Ordering::Relaxed);
        self.state.sink_ok.store(true, Ordering::Relaxed);
    }

    /// The engine loop has ended (its session is closed).
    pub(super) fn stopped(&self) {
        self.state.running.store(false, Ordering::Relaxed);
        metrics::gauge!(m::SHARDS_OWNED, m::PIPELINE => self.state.pipeline.clone()).set(0.0);
    }

    /// A database session is open.
    pub(super) fn session_opened(&self) {
        self.state.session_ok.store(true, Ordering::Relaxed);
    }

    /// A database call failed as a whole: not ready until a session is open again.
    pub(super) fn store_failed(&self, error: &Error) {
        self.set_error(Some(error.full_message()));
        self.state.session_ok.store(false, Ordering::Relaxed);
    }

    /// A publish call did not fail as a whole. The last error is cleared only while the
    /// database side is fine too.
    pub(super) fn sink_answered(&self) {
        self.state.sink_ok.store(true, Ordering::Relaxed);
        if self.state.session_ok.load(Ordering::Relaxed) {
            self.set_error(None);
        }
    }

    /// A publish call failed as a whole: not ready until the broker answers again.
    pub(super) fn sink_failed(&self, error: &Error) {
        self.state.sink_ok.store(false, Ordering::Relaxed);
        self.set_error(Some(error.full_message()));
    }

    /// This relay owns `shards` shards now (also the `outbox_shards_owned` gauge).
    pub(super) fn owns(&self, shards: u32) {
        self.state.shards.store(shards, Ordering::Relaxed);
        metrics::gauge!(m::SHARDS_OWNED, m::PIPELINE => self.state.pipeline.clone())
            .set(f64::from(shards));
    }

    /// The table is paused by an operator, or not (also the `outbox_paused` gauge).
    pub(super) fn paused(&self, paused: bool) {
        self.state.paused.store(paused, Ordering::Relaxed);
        metrics::gauge!(m::PAUSED, m::PIPELINE => self.state.pipeline.clone()).set(if paused {
            1.0
        } else {
            0.0
        });
    }

    /// `n` acknowledged rows were marked.
    pub(super) fn marked(&self, n: usize) {
        if n > 0 {
            self.state.published.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// `n` events were parked as dead.
    pub(super) fn parked_dead(&self, n: u64) {
        self.state.dead.fetch_add(n, Ordering::Relaxed);
    }

    fn set_error(&self, error: Option<String>) {
        *self
            .state
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = error;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn ready_needs_running_a_session_and_an_answering_broker() {
        let handle = RelayHandle::default();
        assert!(!handle.is_alive() && !handle.is_ready());
        handle.started();
        assert!(handle.is_alive());
        assert!(!handle.is_ready(), "no session yet");
        handle.session_opened();
        assert!(handle.is_ready());
        handle.sink_failed(&Error::new(ErrorKind::Connection, "broker down"));
        assert!(!handle.is_ready());
        assert!(handle.last_error().unwrap().contains("broker down"));
        handle.sink_answered();
        assert!(handle.is_ready());
        assert_eq!(handle.last_error(), None);
        handle.stopped();
        assert!(!handle.is_alive() && !handle.is_ready());
    }

    #[test]
    fn a_broker_answer_keeps_the_database_error_while_the_session_is_down() {
        let handle = RelayHandle::default();
        handle.started();
        handle.session_opened();
        handle.store_failed(&Error::new(ErrorKind::LeaseLost, "session lost"));
        handle.sink_answered();
        assert!(!handle.is_ready());
        assert!(handle.last_error().unwrap().contains("session lost"));
        handle.session_opened();
        handle.sink_answered();
        assert!(handle.is_ready());
        assert_eq!(handle.last_error(), None);
    }

    #[test]
    fn counters_add_up_and_shards_are_set() {
        let handle = RelayHandle::default();
        let clone = handle.clone();
        handle.marked(0);
        handle.marked(3);
        handle.marked(2);
        handle.parked_dead(1);
        handle.owns(5);
        assert_eq!(clone.published(), 5);
        assert_eq!(clone.dead(), 1);
        assert_eq!(clone.shards_owned(), 5);
        handle.owns(0);
        assert_eq!(clone.shards_owned(), 0);
        assert!(!clone.is_paused());
        handle.paused(true);
        assert!(clone.is_paused() && clone.is_alive() == handle.is_alive());
        handle.paused(false);
        assert!(!clone.is_paused());
    }
}
