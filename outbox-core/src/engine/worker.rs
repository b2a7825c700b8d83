//! The worker loop: hold a session, rebalance, claim, publish while the session marks the
//! previous batch and claims the next, then record what became of each event.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use chrono::Utc;
use tracing::{debug, info, warn};

use super::contain::{sink_call, store_call, Limit};
use super::plan::{publish_batch, Disposition, PublishReport};
use super::rebalance::{acquire_offset, rebalance};
use super::shutdown::Shutdown;
use super::Relay;
use crate::config::{OnDead, RelayConfig, FIRST_CLAIM};
use crate::error::{Error, Result};
use crate::metrics as m;
use crate::model::{OutboxEvent, Pause};
use crate::store::{ClaimRequest, Failure, ShardSession};

/// Exponential backoff for whole-call failures (database or broker unreachable).
fn outage_backoff(failures: u32) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << failures.min(6));
    let capped = base.min(Duration::from_secs(5));
    capped / 2 + (capped / 2).mul_f64(fastrand::f64())
}

fn claim_request<'e>(
    config: &RelayConfig,
    limit: usize,
    exclude_ids: &'e [i64],
) -> ClaimRequest<'e> {
    ClaimRequest {
        limit,
        exclude_ids,
        dead_holds_aggregate: config.on_dead == OnDead::Hold,
    }
}

/// The limit of the claim after `batch`: as many rows as `relay.batch_bytes` holds at the
/// batch's mean payload size, at least 1 and at most `relay.batch_size` (and one second's worth
/// under `relay.max_events_per_second`); `current` after an
/// empty claim.
pub(super) fn next_claim_limit(
    config: &RelayConfig,
    batch: &[OutboxEvent],
    current: usize,
) -> usize {
    if batch.is_empty() {
        return current;
    }
    let bytes: usize = batch.iter().map(|e| e.payload.len()).sum();
    let mean = (bytes / batch.len()).max(1);
    (config.batch_bytes / mean).clamp(1, config.claim_cap())
}

/// Under `relay.max_events_per_second`, how long to wait at `now` before publishing `events`
/// more: each batch takes `events / rate` seconds from when the one before it could start
/// (`paced_until`, moved on here), so the time publishing took counts and the pace holds on
/// average. `None`: no wait (no limit, or the pace is behind).
pub(super) fn pace(
    config: &RelayConfig,
    paced_until: &mut Instant,
    events: usize,
    now: Instant,
) -> Option<Duration> {
    config.max_events_per_second?;
    let start = (*paced_until).max(now);
    *paced_until = start + config.pace(events);
    (start > now).then(|| start - now)
}

/// The operator's pause of the table (`outbox-relay pause`), as the worker last read it.
#[derive(Debug, Default)]
struct PauseState {
    /// `Some` while the pause holds: nothing is claimed.
    pause: Option<Pause>,
    /// The last read failed (said once, until a read succeeds again).
    unreadable: bool,
}

impl PauseState {
    /// Read it again, saying so when it changed (and on the relay's handle). When it
    /// cannot be read, it stays as it was: the claim that follows meets a database that does
    /// not answer anyway, and a pause the relay's user may not read is warned about (once)
    /// rather than taken for one.
    async fn read(&mut self, relay: &Relay) {
        let now = match store_call("reading whether the table is paused", relay.store.paused())
            .await
        {
            Ok(now) => now,
            Err(e) => {
                metrics::counter!(m::ERRORS, m::PIPELINE => relay.pipeline.clone(), "stage" => "status")
                    .increment(1);
                if !std::mem::replace(&mut self.unreadable, true) {
                    let e = relay.shown(e);
                    warn!(error = %e, "cannot read whether the table is paused (`{} pause`); relaying as before", crate::command::name());
                }
                return;
            }
        };
        self.unreadable = false;
        match (self.pause.as_ref(), now.as_ref()) {
            (None, Some(pause)) => info!(
                since = %pause.since,
                by = %pause.by,
                reason = %pause.reason,
                "paused by an operator: claiming and publishing nothing until `{} resume`",
                crate::command::name()
            ),
            (Some(_), None) => info!("the pause is lifted: relaying again"),
            _ => {}
        }
        relay.handle.paused(now.is_some());
        self.pause = now;
    }
}

/// An open session and what only exists while it is open: losing the session drops the
/// prefetched batch and the unmarked rows with it.
#[derive(Debug)]
struct OpenSession {
    session: Box<dyn ShardSession>,
    /// The next batch, claimed while the previous one was being published.
    prefetched: Vec<OutboxEvent>,
    /// Rows acknowledged by the broker, to mark while the next batch is being published.
    unmarked: Vec<i64>,
    /// The session marked rows, or found none to claim: it works, not just opens. Until then
    /// the worker keeps counting database failures, so that a session that opens and claims
    /// but cannot mark (a read-only server, a privilege revoked) is reopened after a growing
    /// backoff rather than at once, publishing the same rows again each time.
    proven: bool,
}

/// What the session did while the broker worked on a batch.
#[derive(Debug)]
struct Pipelined {
    /// `None`: shutdown's grace period ran out with the publish still in flight.
    report: Option<PublishReport>,
    /// The next batch (`None` when not prefetched), or the error that ended the session.
    next: Result<Option<Vec<OutboxEvent>>>,
}

impl OpenSession {
    fn new(session: Box<dyn ShardSession>) -> Self {
        Self {
            session,
            prefetched: Vec::new(),
            unmarked: Vec::new(),
            proven: false,
        }
    }

    /// Mark what the broker acknowledged and is not marked yet. On error those rows stay
    /// pending: they will be published again (at least once).
    async fn flush(&mut self, relay: &Relay) -> Result<()> {
        if self.unmarked.is_empty() {
            return Ok(());
        }
        let marks = std::mem::take(&mut self.unmarked);
        self.session
            .mark_published(&marks, relay.config.retention.mark_mode())
            .await?;
        relay.handle.marked(marks.len());
        self.proven = true;
        Ok(())
    }

    /// Publish `batch` while the session marks the previous batch's acknowledged rows and —
    /// when the batch was full and no shutdown is asked for — claims the next batch (excluding
    /// this one's rows): the database and the broker work in parallel.
    /// `next_limit`: `None` claims nothing (the batch was not full), else the claim's limit.
    async fn pipeline(
        &mut self,
        relay: &Relay,
        batch: &[OutboxEvent],
        next_limit: Option<usize>,
        shutdown: &Shutdown,
    ) -> Pipelined {
        let config = &relay.config;
        let exclude: Vec<i64> = batch.iter().map(|e| e.id).collect();
        let prefetch = next_limit.is_some() && !shutdown.is_triggered();
        let request = claim_request(config, next_limit.unwrap_or(0), &exclude);
        let marks = std::mem::take(&mut self.unmarked);
        let mode = config.retention.mark_mode();
        let session = &mut self.session;

        let mut grace = shutdown.clone();
        let grace_period = config.shutdown_grace;
        let publish = async {
            tokio::select! {
                report = publish_batch(relay.sink.as_ref(), batch, config.publish_timeout, &relay.publish_duration) => Some(report),
                _ = async { grace.wait().await; tokio::time::sleep(grace_period).await } => None,
            }
        };
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
        if next.is_ok() && !marks.is_empty() {
            relay.handle.marked(marks.len());
            self.proven = true;
        }
        Pipelined { report, next }
    }
}

/// The relay's one worker: at most one session at a time, and its pace.
#[derive(Debug)]
pub(super) struct Worker<'a> {
    relay: &'a Relay,
    /// `None` until a session is open, and from a database error to the next session.
    open: Option<OpenSession>,
    poll: Duration,
    store_failures: u32,
    sink_failures: u32,
    /// Since when every publish call has failed as a whole (`None` while the broker answers).
    sink_failing_since: Option<Instant>,
    /// The shards were given back after `relay.hand_over_after` of broker failures: no session
    /// until the broker answers a check.
    handed_over: bool,
    next_rebalance: Instant,
    acquire_offset: u32,
    /// When the last claim at the top of the loop started (partial batches wait for
    /// `poll_interval_min` from there).
    last_claim: Instant,
    /// The limit of the next claim ([`next_claim_limit`]); [`FIRST_CLAIM`] rows at most first.
    claim_limit: usize,
    /// Under `relay.max_events_per_second`: when the batches published so far may have taken
    /// at that pace; the next publish waits until then.
    paced_until: Instant,
    /// The operator's pause of the table, read at each rebalance.
    paused: PauseState,
}

impl<'a> Worker<'a> {
    pub(super) fn new(relay: &'a Relay) -> Self {
        Self {
            relay,
            open: None,
            poll: relay.config.poll_interval_min,
            store_failures: 0,
            sink_failures: 0,
            sink_failing_since: None,
            handed_over: false,
            next_rebalance: Instant::now(),
            acquire_offset: acquire_offset(&relay.relay_id),
            last_claim: Instant::now(),
            claim_limit: relay.config.claim_cap().min(FIRST_CLAIM),
            paced_until: Instant::now(),
            paused: PauseState::default(),
        }
    }

    /// Relay until shutdown (then return with the session still open, for
    /// [`close_session`](Self::close_session)) or until shutdown's grace period ran out
    /// mid-publish.
    pub(super) async fn run(&mut self, shutdown: &mut Shutdown) {
        let relay = self.relay;
        let config = &relay.config;
        while !shutdown.is_triggered() {
            let open = match self.open.as_mut() {
                Some(open) => open,
                None => {
                    if self.handed_over && !self.broker_answers(shutdown).await {
                        continue;
                    }
                    // After a database failure, whatever the stage: back off before the next
                    // session (a lost session's rows would be claimed and published again).
                    if self.store_failures > 0 {
                        shutdown.pause(outage_backoff(self.store_failures)).await;
                        if shutdown.is_triggered() {
                            break;
                        }
                    }
                    match relay.store.open_session(&relay.relay_id).await {
                        Ok(session) => {
                            info!(relay_id = %relay.relay_id, shards = session.shard_count(), "database session open");
                            self.next_rebalance = Instant::now();
                            relay.handle.session_opened();
                            self.open.insert(OpenSession::new(session))
                        }
                        Err(e) => {
                            self.store_failed("session", e);
                            continue;
                        }
                    }
                }
            };
            if open.proven {
                self.store_failures = 0;
            }

            if Instant::now() >= self.next_rebalance {
                if let Err(e) = open.flush(relay).await {
                    self.lose_session("mark", e).await;
                    continue;
                }
                self.paused.read(relay).await;
                match rebalance(open.session.as_mut(), self.acquire_offset).await {
                    Ok(released) => {
                        let owned = open.session.owned();
                        if released > 0 {
                            open.prefetched.retain(|e| owned.contains(&e.shard));
                        }
                        relay.handle.owns(owned.len() as u32);
                    }
                    Err(e) => {
                        self.lose_session("rebalance", e).await;
                        continue;
                    }
                }
                self.next_rebalance = Instant::now() + config.rebalance_interval;
            }

            if self.paused.pause.is_some() {
                // Paused by an operator: what the broker acknowledged is marked, nothing more
                // is claimed (a batch claimed before is dropped: its rows stay pending), and
                // the shards stay held, until a rebalance reads that the pause is lifted.
                open.prefetched.clear();
                if let Err(e) = open.flush(relay).await {
                    self.lose_session("mark", e).await;
                    continue;
                }
                let until_rebalance = self
                    .next_rebalance
                    .saturating_duration_since(Instant::now());
                shutdown
                    .pause(until_rebalance.max(Duration::from_millis(1)))
                    .await;
                continue;
            }

            let batch = if open.prefetched.is_empty() {
                // Rows still unmarked would be claimed again: mark them first.
                if let Err(e) = open.flush(relay).await {
                    self.lose_session("mark", e).await;
                    continue;
                }
                self.last_claim = Instant::now();
                match open
                    .session
                    .claim(&claim_request(config, self.claim_limit, &[]))
                    .await
                {
                    Ok(batch) => batch,
                    Err(e) => {
                        self.lose_session("claim", e).await;
                        continue;
                    }
                }
            } else {
                std::mem::take(&mut open.prefetched)
            };

            if batch.is_empty() {
                open.proven = true;
                match open.flush(relay).await {
                    Err(e) => self.lose_session("mark", e).await,
                    Ok(()) if open.session.claim_waits() && !open.session.owned().is_empty() => {
                        // The claim waited for the log already.
                        continue;
                    }
                    Ok(()) => {}
                }
                let until_rebalance = self
                    .next_rebalance
                    .saturating_duration_since(Instant::now());
                shutdown
                    .pause(self.poll.min(until_rebalance).max(Duration::from_millis(1)))
                    .await;
                self.poll = (self.poll * 2).min(config.poll_interval_max);
                continue;
            }
            self.poll = config.poll_interval_min;
            // Full: as many rows as the claim asked for (the prefetched batch was claimed with
            // the limit set after the batch before it, which is still `claim_limit`).
            let partial = batch.len() < self.claim_limit;
            self.claim_limit = next_claim_limit(config, &batch, self.claim_limit);
            let next_limit = (!partial).then_some(self.claim_limit);

            if let Some(wait) = pace(config, &mut self.paced_until, batch.len(), Instant::now()) {
                // Rows acknowledged before are marked first.
                if let Err(e) = open.flush(relay).await {
                    self.lose_session("mark", e).await;
                    continue;
                }
                shutdown.pause(wait).await;
                metrics::histogram!(m::PACE_WAIT, m::PIPELINE => relay.pipeline.clone())
                    .record(wait.as_secs_f64());
                if shutdown.is_triggered() {
                    break;
                }
            }
            let pipelined = open.pipeline(relay, &batch, next_limit, shutdown).await;
            if !self.settle(&batch, pipelined).await {
                break;
            }
            self.hand_over_if_due().await;
            if self.sink_failures > 0 {
                shutdown.pause(outage_backoff(self.sink_failures)).await;
            } else if partial && self.open.as_ref().is_none_or(|o| o.prefetched.is_empty()) {
                // The backlog is drained and rows trickle in: claim every poll_interval_min
                // rather than at once, so a claim carries the rows of that interval instead of
                // one or two. Fewer, fuller rounds cost the database (and so the writers
                // sharing it) far less per event; the wait adds at most poll_interval_min to
                // an event's latency.
                self.flush_marks().await;
                let next = self.last_claim + config.poll_interval_min;
                let wait = next.saturating_duration_since(Instant::now());
                if !wait.is_zero() {
                    shutdown.pause(wait).await;
                }
            }
        }
    }

    /// After a batch's publish: the session's side first, then what became of each event, then
    /// the broker's health. Returns `false` when shutdown's grace period ran out mid-publish.
    async fn settle(&mut self, batch: &[OutboxEvent], pipelined: Pipelined) -> bool {
        let relay = self.relay;
        let next = match pipelined.next {
            Ok(next) => next,
            Err(e) => {
                // Marks not made: those events will be published again (at least once).
                self.lose_session("mark", e).await;
                None
            }
        };
        let Some(report) = pipelined.report else {
            warn!(
                events = batch.len(),
                grace = ?relay.config.shutdown_grace,
                "shutdown grace period over with a publish still in flight; its events stay pending and will be published again"
            );
            return false;
        };

        let blocked = self.apply(batch, report.dispositions).await;

        if let Some(e) = report.call_error {
            let e = relay.shown(e);
            self.sink_failures += 1;
            self.sink_failing_since.get_or_insert_with(Instant::now);
            relay.handle.sink_failed(&e);
            metrics::counter!(m::ERRORS, m::PIPELINE => relay.pipeline.clone(), "stage" => "publish")
                .increment(1);
            warn!(
                sink = relay.sink.kind(),
                kind = %e.kind(),
                failures = self.sink_failures,
                error = %e,
                "publishing failed as a whole; nothing is dead-lettered, retrying after a backoff"
            );
            // The next batch may hold later events of the aggregates that were not sent: it
            // is dropped, and claimed again after the backoff.
            return true;
        }
        if self.sink_failures > 0 {
            info!(sink = relay.sink.kind(), "broker is answering again");
        }
        self.sink_failures = 0;
        self.sink_failing_since = None;
        relay.handle.sink_answered();
        if let (Some(open), Some(mut next)) = (self.open.as_mut(), next) {
            next.retain(|e| !blocked.contains(e.aggregate_id.as_str()));
            open.prefetched = next;
        }
        true
    }

    /// Once every publish call has failed as a whole for `relay.hand_over_after`, give the
    /// shards back: relays that can reach the broker take them over at their next rebalance
    /// (if none can, nothing is published either way).
    async fn hand_over_if_due(&mut self) {
        let after = self.relay.config.hand_over_after;
        let Some(since) = self.sink_failing_since else {
            return;
        };
        if after.is_zero() || since.elapsed() < after || self.open.is_none() {
            return;
        }
        warn!(
            sink = self.relay.sink.kind(),
            failing_for = ?since.elapsed(),
            hand_over_after = ?after,
            "the broker has failed every call for relay.hand_over_after: giving this relay's \
             shards back to relays that can reach it; taking shards again once it answers a check"
        );
        metrics::counter!(m::HAND_OVERS, m::PIPELINE => self.relay.pipeline.clone()).increment(1);
        self.close_session().await;
        self.handed_over = true;
    }

    /// After a hand-over: whether the broker answers a check now (then the worker opens a
    /// session and competes for shards again), after the outage backoff.
    async fn broker_answers(&mut self, shutdown: &mut Shutdown) -> bool {
        let relay = self.relay;
        shutdown.pause(outage_backoff(self.sink_failures)).await;
        if shutdown.is_triggered() {
            return false;
        }
        let limit = Limit {
            limit: Duration::from_secs(30),
            set_by: "the limit of a check after a hand-over",
            then: "the relay checks again after the backoff",
        };
        let checked = sink_call(relay.sink.kind(), "check", &limit, relay.sink.check()).await;
        match checked {
            Ok(()) => {
                info!(
                    sink = relay.sink.kind(),
                    "the broker answers a check again: taking shards again"
                );
                self.handed_over = false;
                self.sink_failing_since = None;
                // Ready again now, not at the next publish: the relays that kept their shards
                // may have drained everything meanwhile.
                relay.handle.sink_answered();
                true
            }
            Err(e) => {
                let e = relay.shown(e);
                self.sink_failures = self.sink_failures.saturating_add(1);
                relay.handle.sink_failed(&e);
                debug!(sink = relay.sink.kind(), error = %e, "the broker still fails its check");
                false
            }
        }
    }

    /// Queue acknowledged rows for marking and record failures, on the session. Returns the
    /// aggregates that must not move on in the prefetched batch.
    async fn apply(
        &mut self,
        batch: &[OutboxEvent],
        dispositions: Vec<Disposition>,
    ) -> HashSet<String> {
        let relay = self.relay;
        let Assessment {
            published,
            failures,
            dead,
            blocked,
        } = assess(relay, batch, dispositions);

        // No session (marking the previous batch failed): nothing is recorded; acknowledged
        // rows will be published again and failed ones tried again.
        let Some(open) = self.open.as_mut() else {
            return blocked;
        };
        if !published.is_empty() {
            count_published(relay, batch, &published);
            // Marked with the next claim (or before idling): acknowledged but unmarked rows are
            // at worst published again.
            open.unmarked.extend_from_slice(&published);
        }
        if !failures.is_empty() {
            if let Err(e) = open.session.record_failures(&failures).await {
                self.lose_session("mark", e).await;
                return blocked;
            }
            relay.handle.parked_dead(dead);
            open.proven = true;
        }
        blocked
    }

    /// Mark what the broker acknowledged and is not marked yet (before idling or
    /// rebalancing); drop the session if that fails.
    async fn flush_marks(&mut self) {
        let Some(open) = self.open.as_mut() else {
            return;
        };
        if let Err(e) = open.flush(self.relay).await {
            self.lose_session("mark", e).await;
        }
    }

    fn store_failed(&mut self, stage: &'static str, e: Error) {
        let e = self.relay.shown(e);
        self.store_failures += 1;
        metrics::counter!(m::ERRORS, m::PIPELINE => self.relay.pipeline.clone(), "stage" => stage)
            .increment(1);
        warn!(
            store = %self.relay.store.describe(),
            stage,
            kind = %e.kind(),
            failures = self.store_failures,
            error = %e,
            "database call failed; reconnecting after a backoff"
        );
        self.relay.handle.store_failed(&e);
    }

    /// Drop the session (and with it every shard lock) after an error.
    async fn lose_session(&mut self, stage: &'static str, e: Error) {
        self.store_failed(stage, e);
        if let Some(open) = self.open.as_mut() {
            // Acknowledged but not marked: they will be published again (at least once).
            open.unmarked.clear();
        }
        self.close_session().await;
    }

    /// Mark what is left, release every lock and close the connection.
    pub(super) async fn close_session(&mut self) {
        if let Some(mut open) = self.open.take() {
            if let Err(e) = open.flush(self.relay).await {
                self.store_failed("mark", e);
            }
            let owned = open.session.owned().len();
            match tokio::time::timeout(Duration::from_secs(5), open.session.close()).await {
                Ok(Ok(())) => debug!(released = owned, "database session closed"),
                Ok(Err(e)) => {
                    debug!(error = %e, "closing the database session failed; its locks go with the connection")
                }
                Err(_) => debug!(
                    "closing the database session timed out; its locks go with the connection"
                ),
            }
        }
        self.relay.handle.owns(0);
    }
}

/// What became of a batch, as the session records it.
#[derive(Debug, Default)]
struct Assessment {
    /// Rows the broker acknowledged.
    published: Vec<i64>,
    /// Failures to record: retry later, or dead.
    failures: Vec<Failure>,
    /// How many of the failures park their event as dead.
    dead: u64,
    /// Aggregates with an event failed or not sent.
    blocked: HashSet<String>,
}

/// Turn dispositions into rows to mark and failures to record (backoff, or dead after
/// `max_attempts` or a rejection), with their metrics and logs.
fn assess(relay: &Relay, batch: &[OutboxEvent], dispositions: Vec<Disposition>) -> Assessment {
    let config = &relay.config;
    let sink_kind = relay.sink.kind();
    let pipeline = &relay.pipeline;
    let commit_to_ack = metrics::histogram!(m::COMMIT_TO_ACK, m::PIPELINE => pipeline.clone());
    let now = Utc::now();
    let mut assessment = Assessment {
        published: Vec::with_capacity(batch.len()),
        ..Assessment::default()
    };
    for (event, disposition) in batch.iter().zip(dispositions) {
        let attempts = u32::try_from(event.attempts).unwrap_or(0) + 1;
        let (error, retry_in) = match disposition {
            Disposition::Published => {
                assessment.published.push(event.id);
                let latency = (now - event.created_at).num_microseconds().unwrap_or(0);
                commit_to_ack.record(latency.max(0) as f64 / 1e6);
                continue;
            }
            Disposition::NotSent => {
                assessment.blocked.insert(event.aggregate_id.clone());
                continue;
            }
            Disposition::Retry(e) if attempts < config.max_attempts => {
                (e, Some(config.backoff(attempts)))
            }
            Disposition::Retry(e) => (
                e.context(format!("gave up after {attempts} attempts")),
                None,
            ),
            Disposition::Reject(e) => (e, None),
        };
        let error = relay.shown(error);
        assessment.blocked.insert(event.aggregate_id.clone());
        let destination = relay.sink.destination(event);
        let label = relay.destination_labels.label(destination.clone());
        let kind = error.kind().as_str();
        match retry_in {
            Some(delay) => {
                metrics::counter!(m::EVENTS_RETRIED, m::PIPELINE => pipeline.clone(), "sink" => sink_kind, "destination" => label, "error" => kind).increment(1);
                warn!(id = event.id, event_id = %event.event_id, aggregate_id = %event.aggregate_id, destination = %destination, attempts, retry_in = ?delay, error = %error, "event failed; its aggregate waits for the retry");
            }
            None => {
                assessment.dead += 1;
                metrics::counter!(m::EVENTS_DEAD, m::PIPELINE => pipeline.clone(), "sink" => sink_kind, "destination" => label, "error" => kind).increment(1);
                warn!(id = event.id, event_id = %event.event_id, aggregate_id = %event.aggregate_id, destination = %destination, attempts, error = %error, "event parked as dead");
            }
        }
        assessment.failures.push(Failure {
            id: event.id,
            error: error.full_message(),
            retry_in,
        });
    }
    assessment
}

fn count_published(relay: &Relay, batch: &[OutboxEvent], published: &[i64]) {
    let sink_kind = relay.sink.kind();
    let published: HashSet<i64> = published.iter().copied().collect();
    // A template with `{aggregate_id}` gives a batch as many destinations as events.
    let mut per_destination: HashMap<String, u64> = HashMap::new();
    for event in batch.iter().filter(|e| published.contains(&e.id)) {
        *per_destination
            .entry(relay.sink.destination(event))
            .or_default() += 1;
    }
    for (destination, n) in per_destination {
        let label = relay.destination_labels.label(destination);
        metrics::counter!(m::EVENTS_PUBLISHED, m::PIPELINE => relay.pipeline.clone(), "sink" => sink_kind, "destination" => label)
            .increment(n);
    }
}
