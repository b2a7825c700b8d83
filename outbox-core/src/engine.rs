//! The relay engine.
//!
//! One loop per relay process:
//!
//! 1. hold a [`ShardSession`] (a dedicated database connection) and rebalance shard locks so
//!    the live relays share the shards fairly — one owner per shard;
//! 2. claim the next pending rows of owned shards in `id` order (a plain read: the shard lock
//!    already makes this relay the only publisher of those rows);
//! 3. publish them — while the next claim runs on the session — sending at most one event per
//!    aggregate per call unless the sink guarantees order within a key, and never sending an
//!    event whose predecessor in the batch failed;
//! 4. mark the acknowledged rows and record failures (backoff with jitter, then dead) through
//!    the same session, so a relay that lost a shard can never mark its rows (fencing).
//!
//! No database transaction is open while the broker is called. A call that failed as a whole
//! (`Err` from the sink, or outcomes that [`whole_call_failure`] says fail the call: a broker
//! outage, refused credentials) dead-letters nothing: the engine backs off and tries again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::{OnDead, RelayConfig, Retention};
use crate::error::{Error, ErrorKind, Result};
use crate::metrics as m;
use crate::model::{OutboxEvent, Outcome};
use crate::sink::{whole_call_failure, Sink};
use crate::store::{ClaimRequest, Failure, ShardSession, Store};

/// Fires the shutdown of every [`Shutdown`] cloned from its channel.
#[derive(Debug, Clone)]
pub struct ShutdownTrigger {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownTrigger {
    /// Ask every relay listening on this channel to stop gracefully.
    pub fn trigger(&self) {
        self.tx.send_replace(true);
    }
}

/// The listening side of a shutdown channel.
#[derive(Debug, Clone)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

impl Shutdown {
    /// A new channel: the trigger and its first listener.
    pub fn channel() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger { tx: Arc::new(tx) }, Shutdown { rx })
    }

    /// Whether shutdown was asked for.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }

    /// Wait until shutdown is asked for (forever if the trigger is dropped unused).
    pub async fn wait(&mut self) {
        if self.rx.wait_for(|v| *v).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

#[derive(Debug, Default)]
struct HealthState {
    running: AtomicBool,
    session_ok: AtomicBool,
    sink_ok: AtomicBool,
    shards: AtomicU32,
    published: AtomicU64,
    dead: AtomicU64,
    last_error: Mutex<Option<String>>,
}

/// A cheap, cloneable view of a running relay: health for `/healthz` and `/readyz`, counters.
#[derive(Debug, Clone, Default)]
pub struct RelayHandle {
    state: Arc<HealthState>,
}

impl RelayHandle {
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

    fn set_error(&self, error: Option<String>) {
        *self
            .state
            .last_error
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = error;
    }
}

/// The relay: a store, a sink, settings. Build it, take a [`RelayHandle`], then [`Relay::run`].
#[derive(Debug)]
pub struct Relay {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
    config: RelayConfig,
    relay_id: String,
    handle: RelayHandle,
}

impl Relay {
    /// A relay from `store` to `sink`. Fails when the settings are invalid.
    pub fn new(store: Arc<dyn Store>, sink: Arc<dyn Sink>, config: RelayConfig) -> Result<Self> {
        config.validate()?;
        let relay_id = config.relay_id.clone().unwrap_or_else(default_relay_id);
        Ok(Self {
            store,
            sink,
            config,
            relay_id,
            handle: RelayHandle::default(),
        })
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
        relay.handle.state.running.store(true, Ordering::Relaxed);
        relay.handle.state.sink_ok.store(true, Ordering::Relaxed);
        info!(
            relay_id = %relay.relay_id,
            store = %relay.store.describe(),
            sink = relay.sink.kind(),
            batch_size = relay.config.batch_size,
            retention = %relay.config.retention,
            "relay starting"
        );

        let status_task = tokio::spawn(status_loop(relay.clone(), shutdown.clone()));
        let purge_task = match relay.config.retention {
            Retention::Keep(keep) => Some(tokio::spawn(purge_loop(
                relay.clone(),
                keep,
                shutdown.clone(),
            ))),
            Retention::Delete => None,
        };

        let mut worker = Worker::new(&relay);
        let mut shutdown_rx = shutdown.clone();
        worker.run(&mut shutdown_rx).await;
        worker.close_session().await;

        status_task.abort();
        if let Some(t) = purge_task {
            t.abort();
        }
        relay.handle.state.running.store(false, Ordering::Relaxed);
        metrics::gauge!(m::SHARDS_OWNED).set(0.0);
        info!(
            relay_id = %relay.relay_id,
            published = relay.handle.published(),
            "relay stopped"
        );
        Ok(())
    }
}

fn default_relay_id() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "relay".to_owned());
    format!("{host}-{}-{:04x}", std::process::id(), fastrand::u16(..))
}

/// What became of one event of a claimed batch.
#[derive(Debug)]
enum Disposition {
    Published,
    Failed(Outcome),
    /// Not sent: an earlier event of its aggregate failed, or the call failed as a whole.
    NotSent,
}

#[derive(Debug)]
struct PublishReport {
    dispositions: Vec<Disposition>,
    /// The call failed as a whole (`Err` from the sink, or [`whole_call_failure`] of its
    /// outcomes): nothing dead-lettered for it.
    call_error: Option<Error>,
}

/// Publish a claimed batch in rounds that never let a later event of an aggregate go out
/// before (or alongside, unless the sink keeps key order) an earlier one.
async fn publish_batch(sink: &dyn Sink, batch: &[OutboxEvent]) -> PublishReport {
    let caps = sink.capabilities();
    let max_len = caps.max_batch_len.max(1);
    let mut decided: Vec<Option<Disposition>> = (0..batch.len()).map(|_| None).collect();
    let mut blocked: HashSet<&str> = HashSet::new();

    if let Some(max) = caps.max_payload_bytes {
        for (i, event) in batch.iter().enumerate() {
            if event.payload.len() > max {
                decided[i] = Some(Disposition::Failed(Outcome::Reject(Error::new(
                    ErrorKind::MessageTooLarge,
                    format!(
                        "payload of {} bytes is larger than the {} sink accepts ({max} bytes)",
                        event.payload.len(),
                        sink.kind()
                    ),
                ))));
            }
        }
    }

    let mut call_error = None;
    let mut round: Vec<usize> = Vec::with_capacity(batch.len().min(max_len));
    let mut in_round: HashSet<&str> = HashSet::new();
    loop {
        round.clear();
        in_round.clear();
        for (i, event) in batch.iter().enumerate() {
            let agg = event.aggregate_id.as_str();
            match &decided[i] {
                Some(Disposition::Published) => continue,
                Some(_) => {
                    blocked.insert(agg);
                    continue;
                }
                None => {}
            }
            if blocked.contains(agg) {
                decided[i] = Some(Disposition::NotSent);
                continue;
            }
            if !caps.ordered_per_key && !in_round.insert(agg) {
                continue;
            }
            round.push(i);
            if round.len() == max_len {
                break;
            }
        }
        if round.is_empty() {
            break;
        }
        let contiguous = round.last().map(|l| l - round[0] + 1) == Some(round.len());
        let owned: Vec<OutboxEvent>;
        let events: &[OutboxEvent] = if contiguous {
            &batch[round[0]..=round[round.len() - 1]]
        } else {
            owned = round.iter().map(|&i| batch[i].clone()).collect();
            &owned
        };
        let started = Instant::now();
        let result = sink.publish(events).await;
        metrics::histogram!(m::PUBLISH_DURATION).record(started.elapsed().as_secs_f64());
        match result {
            Ok(outcomes) if outcomes.len() == events.len() => {
                // The one place that decides whether the call failed as a whole: then the
                // acknowledged events stay published, the failed ones count as not sent (no
                // attempt charged, nothing dead-lettered) and the rounds stop, as for `Err`.
                let whole_call = whole_call_failure(&outcomes);
                for (k, outcome) in outcomes.into_iter().enumerate() {
                    let i = round[k];
                    decided[i] = Some(match outcome {
                        Outcome::Published => Disposition::Published,
                        _ if whole_call.is_some() => Disposition::NotSent,
                        other => {
                            blocked.insert(batch[i].aggregate_id.as_str());
                            Disposition::Failed(other)
                        }
                    });
                }
                if let Some(e) = whole_call {
                    call_error = Some(e);
                    break;
                }
            }
            Ok(outcomes) => {
                call_error = Some(Error::new(
                    ErrorKind::Other,
                    format!(
                        "the {} sink returned {} outcomes for {} events (a bug in the sink); \
                         the batch will be sent again",
                        sink.kind(),
                        outcomes.len(),
                        events.len()
                    ),
                ));
                break;
            }
            Err(e) => {
                call_error = Some(e);
                break;
            }
        }
    }
    PublishReport {
        dispositions: decided
            .into_iter()
            .map(|d| d.unwrap_or(Disposition::NotSent))
            .collect(),
        call_error,
    }
}

/// Exponential backoff for whole-call failures (database or broker unreachable).
fn outage_backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << failures.min(6));
    let capped = base.min(Duration::from_secs(5));
    capped / 2 + (capped / 2).mul_f64(fastrand::f64())
}

struct Worker<'a> {
    relay: &'a Relay,
    session: Option<Box<dyn ShardSession>>,
    /// The next batch, claimed while the previous one was being published.
    prefetched: Vec<OutboxEvent>,
    /// Rows acknowledged by the broker, to mark while the next batch is being published.
    unmarked: Vec<i64>,
    poll: Duration,
    store_failures: u32,
    sink_failures: u32,
    next_rebalance: Instant,
    acquire_offset: u32,
    /// When the last claim at the top of the loop started (partial batches wait for
    /// `poll_interval_min` from there).
    last_claim: Instant,
}

impl<'a> Worker<'a> {
    fn new(relay: &'a Relay) -> Self {
        let acquire_offset = relay
            .relay_id
            .bytes()
            .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
        Self {
            relay,
            session: None,
            prefetched: Vec::new(),
            unmarked: Vec::new(),
            poll: relay.config.poll_interval_min,
            store_failures: 0,
            sink_failures: 0,
            next_rebalance: Instant::now(),
            acquire_offset,
            last_claim: Instant::now(),
        }
    }

    fn claim_request<'e>(&self, exclude_ids: &'e [i64]) -> ClaimRequest<'e> {
        ClaimRequest {
            limit: self.relay.config.batch_size,
            exclude_ids,
            dead_holds_aggregate: self.relay.config.on_dead == OnDead::Hold,
        }
    }

    async fn pause(shutdown: &mut Shutdown, duration: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = shutdown.wait() => {}
        }
    }

    async fn run(&mut self, shutdown: &mut Shutdown) {
        let handle = &self.relay.handle;
        while !shutdown.is_triggered() {
            if self.session.is_none() {
                match self.relay.store.open_session(&self.relay.relay_id).await {
                    Ok(session) => {
                        info!(relay_id = %self.relay.relay_id, shards = session.shard_count(), "database session open");
                        self.session = Some(session);
                        self.store_failures = 0;
                        self.next_rebalance = Instant::now();
                        handle.state.session_ok.store(true, Ordering::Relaxed);
                    }
                    Err(e) => {
                        self.store_failed("session", e);
                        Self::pause(shutdown, outage_backoff(self.store_failures)).await;
                        continue;
                    }
                }
            }

            if Instant::now() >= self.next_rebalance {
                self.flush_marks().await;
                if self.session.is_none() {
                    continue;
                }
                if let Err(e) = self.rebalance().await {
                    self.lose_session("rebalance", e).await;
                    Self::pause(shutdown, outage_backoff(self.store_failures)).await;
                    continue;
                }
                self.next_rebalance = Instant::now() + self.relay.config.rebalance_interval;
            }

            let batch = if self.prefetched.is_empty() {
                // Rows still unmarked would be claimed again: mark them first.
                self.flush_marks().await;
                if self.session.is_none() {
                    continue;
                }
                let request = self.claim_request(&[]);
                self.last_claim = Instant::now();
                let session = self.session.as_mut().expect("session is open");
                match session.claim(&request).await {
                    Ok(batch) => batch,
                    Err(e) => {
                        self.lose_session("claim", e).await;
                        Self::pause(shutdown, outage_backoff(self.store_failures)).await;
                        continue;
                    }
                }
            } else {
                std::mem::take(&mut self.prefetched)
            };

            if batch.is_empty() {
                self.flush_marks().await;
                let until_rebalance = self
                    .next_rebalance
                    .saturating_duration_since(Instant::now());
                Self::pause(
                    shutdown,
                    self.poll.min(until_rebalance).max(Duration::from_millis(1)),
                )
                .await;
                self.poll = (self.poll * 2).min(self.relay.config.poll_interval_max);
                continue;
            }
            self.poll = self.relay.config.poll_interval_min;
            let partial = batch.len() < self.relay.config.batch_size;

            if !self.process(batch, shutdown).await {
                break;
            }
            if self.sink_failures > 0 {
                Self::pause(shutdown, outage_backoff(self.sink_failures)).await;
            } else if partial && self.prefetched.is_empty() {
                // The backlog is drained and rows trickle in: claim every poll_interval_min
                // rather than at once, so a claim carries the rows of that interval instead of
                // one or two. Fewer, fuller rounds cost the database (and so the writers
                // sharing it) far less per event; the wait adds at most poll_interval_min to
                // an event's latency.
                self.flush_marks().await;
                let next = self.last_claim + self.relay.config.poll_interval_min;
                let wait = next.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    Self::pause(shutdown, wait).await;
                }
            }
        }
    }

    /// Publish one batch (overlapping the next claim), then mark and record. Returns `false`
    /// when shutdown's grace period ran out mid-publish.
    async fn process(&mut self, batch: Vec<OutboxEvent>, shutdown: &mut Shutdown) -> bool {
        let relay = self.relay;
        let exclude: Vec<i64> = batch.iter().map(|e| e.id).collect();
        let prefetch = batch.len() >= relay.config.batch_size && !shutdown.is_triggered();
        let request = self.claim_request(&exclude);
        let marks = std::mem::take(&mut self.unmarked);
        let mode = relay.config.retention.mark_mode();
        let session = self.session.as_mut().expect("session is open");

        let mut grace = shutdown.clone();
        let grace_period = relay.config.shutdown_grace;
        let publish = async {
            tokio::select! {
                report = publish_batch(relay.sink.as_ref(), &batch) => Some(report),
                _ = async { grace.wait().await; tokio::time::sleep(grace_period).await } => None,
            }
        };
        // While the broker works on this batch, the session marks the previous one and claims
        // the next (excluding this one's rows): the database and the broker work in parallel.
        let database = async {
            if !marks.is_empty() {
                session.mark_published(&marks, mode).await?;
            }
            if prefetch {
                session.claim(&request).await.map(Some)
            } else {
                Ok(None)
            }
        };
        let (report, next) = tokio::join!(publish, database);
        let next = match next {
            Ok(next) => {
                self.count_marked(marks.len());
                next
            }
            Err(e) => {
                // Marks not made: those events will be published again (at least once).
                self.lose_session("mark", e).await;
                None
            }
        };
        let Some(report) = report else {
            warn!(
                events = batch.len(),
                grace = ?grace_period,
                "shutdown grace period over with a publish still in flight; its events stay pending and will be published again"
            );
            return false;
        };

        let blocked = self.apply(&batch, report.dispositions).await;

        match report.call_error {
            None => {
                if self.sink_failures > 0 {
                    info!(sink = relay.sink.kind(), "broker is answering again");
                }
                self.sink_failures = 0;
                relay.handle.state.sink_ok.store(true, Ordering::Relaxed);
                if self.session.is_some() {
                    relay.handle.set_error(None);
                }
            }
            Some(e) => {
                self.sink_failures += 1;
                relay.handle.state.sink_ok.store(false, Ordering::Relaxed);
                metrics::counter!(m::ERRORS, "stage" => "publish").increment(1);
                warn!(
                    sink = relay.sink.kind(),
                    kind = %e.kind(),
                    failures = self.sink_failures,
                    error = %e,
                    "publishing failed as a whole; nothing is dead-lettered, retrying after a backoff"
                );
                relay.handle.set_error(Some(e.full_message()));
                // The next batch may hold later events of the aggregates that were not sent.
                self.prefetched.clear();
                return true;
            }
        }

        if let Some(mut next) = next.filter(|_| self.session.is_some()) {
            next.retain(|e| !blocked.contains(e.aggregate_id.as_str()));
            self.prefetched = next;
        }
        true
    }

    fn count_marked(&self, n: usize) {
        if n > 0 {
            self.relay
                .handle
                .state
                .published
                .fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// Mark what the broker acknowledged and is not marked yet (before idling, rebalancing or
    /// closing the session).
    async fn flush_marks(&mut self) {
        if self.unmarked.is_empty() {
            return;
        }
        let Some(session) = self.session.as_mut() else {
            self.unmarked.clear();
            return;
        };
        let marks = std::mem::take(&mut self.unmarked);
        match session
            .mark_published(&marks, self.relay.config.retention.mark_mode())
            .await
        {
            Ok(()) => self.count_marked(marks.len()),
            Err(e) => self.lose_session("mark", e).await,
        }
    }

    /// Mark acknowledged rows, record failures, count. Returns the aggregates that must not
    /// move on in the prefetched batch.
    async fn apply(
        &mut self,
        batch: &[OutboxEvent],
        dispositions: Vec<Disposition>,
    ) -> HashSet<String> {
        let relay = self.relay;
        let config = &relay.config;
        let sink_kind = relay.sink.kind();
        let mut published = Vec::with_capacity(batch.len());
        let mut failures = Vec::new();
        let mut blocked = HashSet::new();
        let now = Utc::now();
        let mut dead_now = 0u64;

        for (event, disposition) in batch.iter().zip(dispositions) {
            match disposition {
                Disposition::Published => {
                    published.push(event.id);
                    let latency = (now - event.created_at).num_microseconds().unwrap_or(0);
                    metrics::histogram!(m::COMMIT_TO_ACK).record(latency.max(0) as f64 / 1e6);
                }
                Disposition::NotSent => {
                    blocked.insert(event.aggregate_id.clone());
                }
                Disposition::Failed(outcome) => {
                    blocked.insert(event.aggregate_id.clone());
                    let attempts = u32::try_from(event.attempts).unwrap_or(0) + 1;
                    let (error, retry_in) = match outcome {
                        Outcome::Retry(e) if attempts < config.max_attempts => {
                            (e, Some(config.backoff(attempts)))
                        }
                        Outcome::Retry(e) => (
                            e.context(format!("gave up after {attempts} attempts")),
                            None,
                        ),
                        Outcome::Reject(e) => (e, None),
                        Outcome::Published => unreachable!("published is not a failure"),
                    };
                    let destination = relay.sink.destination(event);
                    let kind = error.kind().as_str();
                    match retry_in {
                        Some(delay) => {
                            metrics::counter!(m::EVENTS_RETRIED, "sink" => sink_kind, "destination" => destination.clone(), "error" => kind).increment(1);
                            warn!(id = event.id, event_id = %event.event_id, aggregate_id = %event.aggregate_id, destination = %destination, attempts, retry_in = ?delay, error = %error, "event failed; its aggregate waits for the retry");
                        }
                        None => {
                            dead_now += 1;
                            metrics::counter!(m::EVENTS_DEAD, "sink" => sink_kind, "destination" => destination.clone(), "error" => kind).increment(1);
                            warn!(id = event.id, event_id = %event.event_id, aggregate_id = %event.aggregate_id, destination = %destination, attempts, error = %error, "event parked as dead");
                        }
                    }
                    failures.push(Failure {
                        id: event.id,
                        error: error.full_message(),
                        retry_in,
                    });
                }
            }
        }

        let Some(session) = self.session.as_mut() else {
            return blocked;
        };
        if !published.is_empty() {
            count_published(relay, batch, &published);
            // Marked with the next claim (or before idling): acknowledged but unmarked rows are
            // at worst published again.
            self.unmarked.extend_from_slice(&published);
        }
        if !failures.is_empty() {
            if let Err(e) = session.record_failures(&failures).await {
                self.lose_session("mark", e).await;
                return blocked;
            }
            relay
                .handle
                .state
                .dead
                .fetch_add(dead_now, Ordering::Relaxed);
        }
        self.store_failures = 0;
        blocked
    }

    /// Spread the shards fairly over the live relays: take free ones up to our share, give
    /// back what is above it.
    async fn rebalance(&mut self) -> Result<()> {
        let session = self.session.as_mut().expect("session is open");
        let view = session.cluster().await?;
        let total = session.shard_count();
        let target = total.div_ceil(view.live_relays.max(1)) as usize;
        let owned = session.owned().len();
        if owned > target {
            let excess: Vec<i32> = session
                .owned()
                .iter()
                .rev()
                .take(owned - target)
                .copied()
                .collect();
            for shard in &excess {
                session.release(*shard).await?;
            }
            let still = session.owned().clone();
            self.prefetched.retain(|e| still.contains(&e.shard));
            info!(
                released = excess.len(),
                owned = still.len(),
                relays = view.live_relays,
                "gave shards back to other relays"
            );
        } else if owned < target && total > 0 {
            let mut got = 0;
            for i in 0..total {
                if session.owned().len() >= target {
                    break;
                }
                let shard = ((self.acquire_offset.wrapping_add(i)) % total) as i32;
                if view.locked.contains(&shard) {
                    continue;
                }
                if session.try_acquire(shard).await? {
                    got += 1;
                }
            }
            if got > 0 {
                info!(
                    acquired = got,
                    owned = session.owned().len(),
                    relays = view.live_relays,
                    "took over free shards"
                );
            }
        }
        let owned = session.owned().len() as u32;
        self.relay
            .handle
            .state
            .shards
            .store(owned, Ordering::Relaxed);
        metrics::gauge!(m::SHARDS_OWNED).set(f64::from(owned));
        Ok(())
    }

    fn store_failed(&mut self, stage: &'static str, e: Error) {
        self.store_failures += 1;
        metrics::counter!(m::ERRORS, "stage" => stage).increment(1);
        warn!(
            store = %self.relay.store.describe(),
            stage,
            kind = %e.kind(),
            failures = self.store_failures,
            error = %e,
            "database call failed; reconnecting after a backoff"
        );
        self.relay.handle.set_error(Some(e.full_message()));
        self.relay
            .handle
            .state
            .session_ok
            .store(false, Ordering::Relaxed);
    }

    /// Drop the session (and with it every shard lock) after an error.
    async fn lose_session(&mut self, stage: &'static str, e: Error) {
        self.store_failed(stage, e);
        self.prefetched.clear();
        // Acknowledged but not marked: they will be published again (at least once).
        self.unmarked.clear();
        self.close_session().await;
    }

    /// Mark what is left, release every lock and close the connection.
    async fn close_session(&mut self) {
        if let (Some(session), false) = (self.session.as_mut(), self.unmarked.is_empty()) {
            let marks = std::mem::take(&mut self.unmarked);
            match session
                .mark_published(&marks, self.relay.config.retention.mark_mode())
                .await
            {
                Ok(()) => self.count_marked(marks.len()),
                Err(e) => self.store_failed("mark", e),
            }
        }
        self.unmarked.clear();
        self.prefetched.clear();
        if let Some(session) = self.session.take() {
            let owned = session.owned().len();
            match tokio::time::timeout(Duration::from_secs(5), session.close()).await {
                Ok(Ok(())) => debug!(released = owned, "database session closed"),
                Ok(Err(e)) => {
                    debug!(error = %e, "closing the database session failed; its locks go with the connection")
                }
                Err(_) => debug!(
                    "closing the database session timed out; its locks go with the connection"
                ),
            }
        }
        self.relay.handle.state.shards.store(0, Ordering::Relaxed);
        metrics::gauge!(m::SHARDS_OWNED).set(0.0);
    }
}

fn count_published(relay: &Relay, batch: &[OutboxEvent], published: &[i64]) {
    let sink_kind = relay.sink.kind();
    let published: HashSet<i64> = published.iter().copied().collect();
    let mut per_destination: Vec<(String, u64)> = Vec::new();
    for event in batch.iter().filter(|e| published.contains(&e.id)) {
        let destination = relay.sink.destination(event);
        match per_destination.iter_mut().find(|(d, _)| *d == destination) {
            Some((_, n)) => *n += 1,
            None => per_destination.push((destination, 1)),
        }
    }
    for (destination, n) in per_destination {
        metrics::counter!(m::EVENTS_PUBLISHED, "sink" => sink_kind, "destination" => destination)
            .increment(n);
    }
}

async fn status_loop(relay: Arc<Relay>, mut shutdown: Shutdown) {
    loop {
        match relay.store.status().await {
            Ok(s) => {
                metrics::gauge!(m::PENDING).set(s.pending as f64);
                metrics::gauge!(m::OLDEST_PENDING_AGE).set(s.oldest_pending_age_secs);
                metrics::gauge!(m::DEAD).set(s.dead as f64);
                metrics::gauge!(m::HELD_BACK_AGGREGATES).set(s.held_back_aggregates as f64);
            }
            Err(e) => {
                metrics::counter!(m::ERRORS, "stage" => "status").increment(1);
                debug!(error = %e, "reading backlog figures failed");
            }
        }
        Worker::pause(&mut shutdown, relay.config.status_interval).await;
        if shutdown.is_triggered() {
            return;
        }
    }
}

async fn purge_loop(relay: Arc<Relay>, keep: Duration, mut shutdown: Shutdown) {
    let limit = relay.config.purge_batch_size;
    loop {
        Worker::pause(&mut shutdown, relay.config.purge_interval).await;
        if shutdown.is_triggered() {
            return;
        }
        loop {
            match relay.store.purge_published(keep, limit).await {
                Ok(n) => {
                    metrics::counter!(m::PURGED).increment(n);
                    if n > 0 {
                        debug!(purged = n, "purged published rows past retention");
                    }
                    if n < u64::from(limit) || shutdown.is_triggered() {
                        break;
                    }
                }
                Err(e) => {
                    metrics::counter!(m::ERRORS, "stage" => "purge").increment(1);
                    warn!(error = %e, "purging published rows failed; trying again later");
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
