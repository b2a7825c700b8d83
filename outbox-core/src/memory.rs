//! In-memory `Store` and scripted `Sink` used to test the engine's logic without services
//! (feature `testkit`, and the core's own unit tests). They follow the same contracts as the
//! real adapters — shard locks per session, claims in `id` order that skip held-back
//! aggregates, no table before `migrate` — and `MemoryStore` passes the store conformance suite
//! (`outbox-core/tests/memory_store_suite.rs`), but they keep nothing across processes.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{Error, ErrorKind, Result};
use crate::model::{
    BacklogStatus, DeadEvent, DeadFilter, DeadSelection, EventContent, EventFilter, EventRecord,
    EventState, HeldBack, NewEvent, OutboxEvent, Outcome, Pause, Paused, Payload, PayloadType,
    ReplaySelection, ShardOwner,
};
use crate::sink::{Sink, SinkCapabilities};
use crate::store::{ClaimRequest, ClusterView, Failure, MarkMode, ShardSession, Store};

/// One row of the in-memory outbox.
#[derive(Debug, Clone)]
pub struct MemoryRow {
    pub event: OutboxEvent,
    pub published: bool,
    /// When it was published (what purges and `replay` select by).
    pub published_at: Option<DateTime<Utc>>,
    pub dead: bool,
    pub next_attempt_at: Option<Instant>,
    pub last_error: Option<String>,
}

impl MemoryRow {
    /// When it was published, if it is a kept event (published and kept, not dead): what
    /// `replay` and `oldest_kept` select by.
    fn kept_at(&self) -> Option<DateTime<Utc>> {
        self.published_at.filter(|_| self.published && !self.dead)
    }

    /// Whether `filter` names the row (its limit aside).
    fn matches(&self, filter: &EventFilter) -> bool {
        let e = &self.event;
        filter.matches(e.event_id, &e.aggregate_type, &e.aggregate_id)
    }

    /// The row as `find_events` (and, when dead, `dead_list`) gives it, with its payload and
    /// headers when `with_payload`.
    fn record(&self, with_payload: bool) -> EventRecord {
        let published_at = self.published_at.filter(|_| self.published);
        // No clock of its own for a dead row: its creation time stands for when it died.
        let dead_at = (self.dead && !self.published).then_some(self.event.created_at);
        EventRecord {
            id: self.event.id,
            event_id: self.event.event_id,
            aggregate_type: self.event.aggregate_type.clone(),
            aggregate_id: self.event.aggregate_id.clone(),
            event_type: self.event.event_type.clone(),
            destination: self.event.destination.clone(),
            state: EventState::of(published_at, dead_at),
            attempts: self.event.attempts,
            last_error: self.last_error.clone(),
            created_at: self.event.created_at,
            next_attempt_at: self.next_attempt_at.map(wall_clock),
            published_at,
            dead_at,
            content: with_payload.then(|| EventContent {
                payload: self.event.payload.clone(),
                payload_type: self.event.payload_type,
                headers: self.event.headers.clone(),
            }),
        }
    }
}

/// `at` on the wall clock, the same time for the same `at` (the store keeps monotonic instants).
fn wall_clock(at: Instant) -> DateTime<Utc> {
    static ANCHOR: std::sync::OnceLock<(Instant, DateTime<Utc>)> = std::sync::OnceLock::new();
    let (instant, utc) = *ANCHOR.get_or_init(|| (Instant::now(), Utc::now()));
    let offset = |d: Duration| chrono::Duration::from_std(d).unwrap_or_default();
    match at.checked_duration_since(instant) {
        Some(after) => utc + offset(after),
        None => utc - offset(instant.duration_since(at)),
    }
}

#[derive(Debug, Default)]
struct StoreState {
    /// The table exists (`migrate` ran): before, every call but `migrate` fails.
    migrated: bool,
    rows: BTreeMap<i64, MemoryRow>,
    next_id: i64,
    next_session: u64,
    /// shard -> session id
    locks: HashMap<i32, u64>,
    /// session id -> relay id
    sessions: HashMap<u64, String>,
    /// sessions whose "connection" was cut: every call fails with LeaseLost
    broken: HashSet<u64>,
    /// Marks fail, as on a server that became read-only.
    refuse_marks: bool,
    /// Claims panic (a bug in a store).
    panic_claims: bool,
    /// Purges panic.
    panic_purges: bool,
    /// `outbox-relay pause`.
    pause: Option<Pause>,
}

/// An in-memory outbox shared by every session opened on it.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    shards: u32,
    payload_type: PayloadType,
    state: Arc<Mutex<StoreState>>,
}

impl MemoryStore {
    /// A store with `shards` shards, already migrated.
    pub fn new(shards: u32) -> Self {
        let store = Self::unmigrated(shards);
        store.lock().migrated = true;
        store
    }

    /// A store with `shards` shards whose table does not exist yet: every call but `migrate`
    /// fails with a schema error until `migrate` runs (what the store suite starts from).
    pub fn unmigrated(shards: u32) -> Self {
        Self {
            shards,
            payload_type: PayloadType::Json,
            state: Arc::new(Mutex::new(StoreState {
                next_id: 1,
                ..StoreState::default()
            })),
        }
    }

    /// The same store holding `payload_type` payloads (default `json`): it refuses what such a
    /// database column would refuse (text that is not UTF-8, JSON that does not parse).
    pub fn with_payload_type(mut self, payload_type: PayloadType) -> Self {
        self.payload_type = payload_type;
        self
    }

    /// The payload as this store's table holds it, or the error the database would give.
    fn stored_payload(&self, payload: &Payload) -> Result<Vec<u8>> {
        const TABLE: &str = "the in-memory outbox";
        if self.payload_type == PayloadType::Binary {
            return Ok(payload.as_bytes().to_vec());
        }
        let text = payload.text_for(TABLE, self.payload_type)?;
        if self.payload_type == PayloadType::Json {
            serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidMessage,
                    format!("{TABLE} stores `json` payloads and this one is not JSON: {e}"),
                )
            })?;
        }
        Ok(text.as_bytes().to_vec())
    }

    fn lock(&self) -> MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state, once the table exists.
    fn table(&self) -> Result<MutexGuard<'_, StoreState>> {
        let st = self.lock();
        if !st.migrated {
            return Err(Error::new(
                ErrorKind::Schema,
                "the in-memory outbox table does not exist: run migrate first",
            ));
        }
        Ok(st)
    }

    /// The shard of an aggregate (FNV-1a, like a database hash).
    pub fn shard_of(&self, aggregate_id: &str) -> i32 {
        let mut h: u32 = 0x811c9dc5;
        for b in aggregate_id.bytes() {
            h ^= u32::from(b);
            h = h.wrapping_mul(0x0100_0193);
        }
        (h % self.shards) as i32
    }

    /// A copy of every row.
    pub fn rows(&self) -> Vec<MemoryRow> {
        self.lock().rows.values().cloned().collect()
    }

    /// A copy of one row.
    pub fn row(&self, id: i64) -> Option<MemoryRow> {
        self.lock().rows.get(&id).cloned()
    }

    /// Cut every session's "connection": their locks are gone and later calls fail.
    pub fn break_sessions(&self) {
        let mut st = self.lock();
        let ids: Vec<u64> = st.sessions.keys().copied().collect();
        for id in ids {
            st.broken.insert(id);
            st.sessions.remove(&id);
        }
        st.locks.clear();
    }

    /// Make every mark fail (`true`), as a read-only server would, or work again.
    pub fn refuse_marks(&self, refuse: bool) {
        self.lock().refuse_marks = refuse;
    }

    /// Make every claim panic (`true`), as a store with a bug would, or work again.
    pub fn panic_claims(&self, panic: bool) {
        self.lock().panic_claims = panic;
    }

    /// Make every purge panic (`true`), or work again.
    pub fn panic_purges(&self, panic: bool) {
        self.lock().panic_purges = panic;
    }

    /// Which relay holds each shard.
    pub fn owners(&self) -> BTreeMap<i32, String> {
        let st = self.lock();
        st.locks
            .iter()
            .map(|(shard, sid)| (*shard, st.sessions.get(sid).cloned().unwrap_or_default()))
            .collect()
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn describe(&self) -> String {
        format!("in-memory store ({} shards)", self.shards)
    }

    async fn migrate(&self) -> Result<()> {
        self.lock().migrated = true;
        Ok(())
    }

    async fn check(&self) -> Result<()> {
        self.table().map(drop)
    }

    async fn open_session(&self, relay_id: &str) -> Result<Box<dyn ShardSession>> {
        let mut st = self.table()?;
        st.next_session += 1;
        let id = st.next_session;
        st.sessions.insert(id, relay_id.to_owned());
        Ok(Box::new(MemorySession {
            store: self.clone(),
            id,
            owned: BTreeSet::new(),
        }))
    }

    async fn insert(&self, events: &[NewEvent]) -> Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(events.len());
        // One lock for the whole insert: a transaction of its own.
        let payloads = events
            .iter()
            .map(|e| self.stored_payload(&e.payload))
            .collect::<Result<Vec<_>>>()?;
        let mut st = self.table()?;
        for (e, payload) in events.iter().zip(payloads) {
            let shard = self.shard_of(&e.aggregate_id);
            let id = st.next_id;
            st.next_id += 1;
            let event = OutboxEvent {
                id,
                event_id: e.event_id_or_new(),
                aggregate_type: e.aggregate_type.clone(),
                aggregate_id: e.aggregate_id.clone(),
                event_type: e.event_type.clone(),
                payload,
                payload_type: self.payload_type,
                headers: e.headers.clone(),
                destination: e.destination.clone(),
                created_at: Utc::now(),
                attempts: 0,
                shard,
            };
            st.rows.insert(
                id,
                MemoryRow {
                    event,
                    published: false,
                    published_at: None,
                    dead: false,
                    next_attempt_at: None,
                    last_error: None,
                },
            );
            ids.push(id);
        }
        Ok(ids)
    }

    async fn purge_published(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let mut st = self.table()?;
        if st.panic_purges {
            drop(st);
            panic!("scripted panic in purge");
        }
        let older_than = chrono::Duration::from_std(older_than).unwrap_or(chrono::Duration::MAX);
        let now = Utc::now();
        let victims: Vec<i64> = st
            .rows
            .values()
            .filter(|r| r.published_at.is_some_and(|t| now - t >= older_than))
            .map(|r| r.event.id)
            .take(limit as usize)
            .collect();
        for id in &victims {
            st.rows.remove(id);
        }
        Ok(victims.len() as u64)
    }

    async fn status(&self) -> Result<BacklogStatus> {
        let st = self.table()?;
        let pending: Vec<&MemoryRow> = st
            .rows
            .values()
            .filter(|r| !r.published && !r.dead)
            .collect();
        let retrying: Vec<&&MemoryRow> = pending.iter().filter(|r| r.event.attempts > 0).collect();
        let held: BTreeSet<&str> = retrying
            .iter()
            .map(|r| r.event.aggregate_id.as_str())
            .collect();
        Ok(BacklogStatus {
            pending: pending.len() as i64,
            oldest_pending_age_secs: pending
                .first()
                .map(|r| (Utc::now() - r.event.created_at).num_milliseconds() as f64 / 1000.0)
                .unwrap_or(0.0),
            dead: st.rows.values().filter(|r| r.dead).count() as i64,
            held_back_aggregates: held.len() as i64,
            retrying: retrying.len() as i64,
            slot: None,
        })
    }

    async fn oldest_kept(&self) -> Result<Option<DateTime<Utc>>> {
        let st = self.table()?;
        Ok(st.rows.values().filter_map(MemoryRow::kept_at).min())
    }

    async fn shard_owners(&self) -> Result<Vec<ShardOwner>> {
        drop(self.table()?);
        Ok(self
            .owners()
            .into_iter()
            .map(|(shard, owner)| ShardOwner { shard, owner })
            .collect())
    }

    async fn dead_list(&self, filter: &DeadFilter) -> Result<Vec<DeadEvent>> {
        let st = self.table()?;
        let aggregate = EventFilter {
            aggregate_type: filter.aggregate_type.clone(),
            aggregate_id: filter.aggregate_id.clone(),
            ..EventFilter::default()
        };
        Ok(st
            .rows
            .values()
            .filter(|r| r.dead && !r.published && r.matches(&aggregate))
            .filter_map(|r| r.record(filter.with_payload).into_dead())
            .take(filter.limit.max(1) as usize)
            .collect())
    }

    async fn paused(&self) -> Result<Option<Pause>> {
        Ok(self.table()?.pause.clone())
    }

    async fn pause(&self, by: &str, reason: &str) -> Result<Paused> {
        let mut st = self.table()?;
        if let Some(pause) = &st.pause {
            return Ok(Paused::Already(pause.clone()));
        }
        let pause = Pause {
            since: Utc::now(),
            by: by.to_owned(),
            reason: reason.to_owned(),
        };
        st.pause = Some(pause.clone());
        Ok(Paused::Now(pause))
    }

    async fn resume(&self) -> Result<Option<Pause>> {
        Ok(self.table()?.pause.take())
    }

    async fn find_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>> {
        let st = self.table()?;
        Ok(st
            .rows
            .values()
            .rev()
            .filter(|r| r.matches(filter))
            .take(filter.limit.max(1) as usize)
            .map(|r| r.record(filter.with_payload))
            .collect())
    }

    async fn dead_retry(&self, selection: &DeadSelection) -> Result<u64> {
        let mut st = self.table()?;
        let mut n = 0;
        for row in st.rows.values_mut().filter(|r| r.dead && !r.published) {
            if selection.contains(&row.event) {
                row.dead = false;
                row.event.attempts = 0;
                row.next_attempt_at = None;
                n += 1;
            }
        }
        Ok(n)
    }

    async fn dead_discard(&self, selection: &DeadSelection) -> Result<u64> {
        let mut st = self.table()?;
        let before = st.rows.len();
        st.rows
            .retain(|_, r| !(r.dead && !r.published && selection.contains(&r.event)));
        Ok((before - st.rows.len()) as u64)
    }

    async fn replay(&self, selection: &ReplaySelection, dry_run: bool) -> Result<u64> {
        let mut st = self.table()?;
        let mut n = 0;
        for row in st.rows.values_mut() {
            let Some(published_at) = row.kept_at() else {
                continue;
            };
            if selection.contains(&row.event, published_at) {
                n += 1;
                if !dry_run {
                    row.published = false;
                    row.published_at = None;
                    row.event.attempts = 0;
                    row.next_attempt_at = None;
                    row.last_error = None;
                }
            }
        }
        Ok(n)
    }

    async fn held_back(&self, limit: u32) -> Result<Vec<HeldBack>> {
        let st = self.table()?;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for row in st.rows.values() {
            if row.published || row.dead || row.event.attempts == 0 {
                continue;
            }
            if !seen.insert(row.event.aggregate_id.clone()) {
                continue;
            }
            let waiting = st
                .rows
                .values()
                .filter(|w| {
                    w.event.aggregate_id == row.event.aggregate_id
                        && w.event.id > row.event.id
                        && !w.published
                        && !w.dead
                })
                .count();
            out.push(HeldBack {
                aggregate_type: row.event.aggregate_type.clone(),
                aggregate_id: row.event.aggregate_id.clone(),
                id: row.event.id,
                attempts: row.event.attempts,
                next_attempt_at: row.next_attempt_at.map(wall_clock),
                last_error: row.last_error.clone(),
                waiting_behind: waiting as i64,
            });
            if out.len() >= limit.max(1) as usize {
                break;
            }
        }
        Ok(out)
    }
}

/// A session on a [`MemoryStore`].
#[derive(Debug)]
pub struct MemorySession {
    store: MemoryStore,
    id: u64,
    owned: BTreeSet<i32>,
}

impl MemorySession {
    fn guard(&mut self) -> Result<MutexGuard<'_, StoreState>> {
        let broken = self.store.lock().broken.contains(&self.id);
        if broken {
            self.owned.clear();
            return Err(Error::new(
                ErrorKind::LeaseLost,
                "lost the in-memory session holding shard locks",
            ));
        }
        Ok(self.store.lock())
    }
}

#[async_trait]
impl ShardSession for MemorySession {
    fn shard_count(&self) -> u32 {
        self.store.shards
    }

    fn owned(&self) -> &BTreeSet<i32> {
        &self.owned
    }

    async fn cluster(&mut self) -> Result<ClusterView> {
        let st = self.guard()?;
        Ok(ClusterView {
            live_relays: st.sessions.len() as u32,
            locked: st.locks.keys().copied().collect(),
        })
    }

    async fn try_acquire(&mut self, shard: i32) -> Result<bool> {
        let id = self.id;
        let mut st = self.guard()?;
        let got = match st.locks.get(&shard) {
            Some(holder) => *holder == id,
            None => {
                st.locks.insert(shard, id);
                true
            }
        };
        drop(st);
        if got {
            self.owned.insert(shard);
        }
        Ok(got)
    }

    async fn release(&mut self, shard: i32) -> Result<()> {
        let id = self.id;
        let mut st = self.guard()?;
        if st.locks.get(&shard) == Some(&id) {
            st.locks.remove(&shard);
        }
        drop(st);
        self.owned.remove(&shard);
        Ok(())
    }

    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>> {
        let owned = self.owned.clone();
        let st = self.guard()?;
        if st.panic_claims {
            drop(st);
            panic!("scripted panic in claim");
        }
        let now = Instant::now();
        let exclude: HashSet<i64> = request.exclude_ids.iter().copied().collect();
        // Aggregates with an earlier row waiting for a retry (or dead, when it holds).
        let mut blocked: HashSet<&str> = HashSet::new();
        let mut out = Vec::new();
        for row in st.rows.values() {
            if out.len() >= request.limit {
                break;
            }
            let agg = row.event.aggregate_id.as_str();
            if row.published || !owned.contains(&row.event.shard) {
                continue;
            }
            let blocking = row.event.attempts > 0 && (!row.dead || request.dead_holds_aggregate);
            if row.dead {
                if blocking {
                    blocked.insert(agg);
                }
                continue;
            }
            let held = blocked.contains(agg);
            if blocking {
                blocked.insert(agg);
            }
            if held
                || exclude.contains(&row.event.id)
                || row.next_attempt_at.is_some_and(|t| t > now)
            {
                continue;
            }
            out.push(row.event.clone());
        }
        Ok(out)
    }

    async fn mark_published(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        let mut st = self.guard()?;
        if st.refuse_marks {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "the in-memory outbox is read-only",
            ));
        }
        for id in ids {
            match mode {
                MarkMode::Delete => {
                    st.rows.remove(id);
                }
                MarkMode::Keep => {
                    if let Some(row) = st.rows.get_mut(id) {
                        row.published = true;
                        row.published_at = Some(Utc::now());
                    }
                }
            }
        }
        Ok(())
    }

    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()> {
        let mut st = self.guard()?;
        for f in failures {
            if let Some(row) = st.rows.get_mut(&f.id) {
                row.event.attempts += 1;
                row.last_error = Some(f.error.clone());
                match f.retry_in {
                    Some(d) => row.next_attempt_at = Some(Instant::now() + d),
                    None => row.dead = true,
                }
            }
        }
        Ok(())
    }

    async fn close(self: Box<Self>) -> Result<()> {
        let mut st = self.store.lock();
        st.locks.retain(|_, sid| *sid != self.id);
        st.sessions.remove(&self.id);
        Ok(())
    }
}

impl Drop for MemorySession {
    fn drop(&mut self) {
        // Like a closed connection: locks go with the session.
        let mut st = self.store.lock();
        let id = self.id;
        st.locks.retain(|_, sid| *sid != id);
        st.sessions.remove(&id);
    }
}

/// What the scripted sink does with one event id.
#[derive(Debug, Clone)]
pub enum Script {
    /// Fail this many times with a retryable error about the event (kind `Other`), then
    /// publish.
    RetryTimes(u32),
    /// Always fail with a retryable error about the event (kind `Other`).
    AlwaysRetry,
    /// Reject (permanent, kind `InvalidMessage`).
    Reject,
    /// Fail this many times with an error of this kind (`Retry` or `Reject` by the kind's
    /// default retryability), then publish.
    FailTimes(u32, ErrorKind),
    /// Panic in the calls that carry it this many times (a bug in a sink), then publish.
    PanicTimes(u32),
    /// Never answer the calls that carry it this many times (a sink without timeouts of its
    /// own), then publish.
    HangTimes(u32),
}

#[derive(Debug, Default)]
struct SinkState {
    delivered: Vec<OutboxEvent>,
    scripts: HashMap<uuid::Uuid, Script>,
    calls: u64,
    /// Whole calls fail while this is set (broker down).
    down: bool,
    attempts: HashMap<uuid::Uuid, u32>,
}

/// A sink that records what it "delivered", with scripted per-event failures, whole-call
/// outages and a per-call delay.
#[derive(Debug, Clone)]
pub struct ScriptedSink {
    state: Arc<Mutex<SinkState>>,
    delay: Duration,
    capabilities: SinkCapabilities,
}

impl Default for ScriptedSink {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedSink {
    /// A sink that publishes everything immediately.
    pub fn new() -> Self {
        Self {
            state: Arc::default(),
            delay: Duration::ZERO,
            capabilities: SinkCapabilities {
                max_batch_len: 100,
                max_payload_bytes: Some(1024 * 1024),
                ordered_per_key: false,
            },
        }
    }

    /// Each publish call takes this long.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Override the capabilities.
    pub fn with_capabilities(mut self, capabilities: SinkCapabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    fn lock(&self) -> MutexGuard<'_, SinkState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Script the fate of one event.
    pub fn script(&self, event_id: uuid::Uuid, script: Script) {
        self.lock().scripts.insert(event_id, script);
    }

    /// Broker down (`true`) or up.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Every event delivered, in delivery order (duplicates included).
    pub fn delivered(&self) -> Vec<OutboxEvent> {
        self.lock().delivered.clone()
    }

    /// How many publish calls were made.
    pub fn calls(&self) -> u64 {
        self.lock().calls
    }

    /// Whether this call never answers (an event of `batch` has [`Script::HangTimes`] left):
    /// then it counts as an attempt of every event in it.
    fn hangs(&self, batch: &[OutboxEvent]) -> bool {
        let mut st = self.lock();
        let hangs = batch.iter().any(|e| match st.scripts.get(&e.event_id) {
            Some(Script::HangTimes(k)) => st.attempts.get(&e.event_id).copied().unwrap_or(0) < *k,
            _ => false,
        });
        if hangs {
            for event in batch {
                *st.attempts.entry(event.event_id).or_default() += 1;
            }
        }
        hangs
    }

    /// Attempts seen for an event id.
    pub fn attempts(&self, event_id: uuid::Uuid) -> u32 {
        self.lock().attempts.get(&event_id).copied().unwrap_or(0)
    }
}

#[async_trait]
impl Sink for ScriptedSink {
    fn kind(&self) -> &'static str {
        "scripted"
    }

    fn capabilities(&self) -> SinkCapabilities {
        self.capabilities
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        event
            .destination
            .clone()
            .unwrap_or_else(|| event.aggregate_type.clone())
    }

    async fn check(&self) -> Result<()> {
        if self.lock().down {
            return Err(Error::new(ErrorKind::Connection, "scripted broker is down"));
        }
        Ok(())
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        self.lock().calls += 1;
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if self.hangs(batch) {
            return std::future::pending().await;
        }
        let mut st = self.lock();
        if st.down {
            return Err(Error::new(ErrorKind::Connection, "scripted broker is down"));
        }
        let mut outcomes = Vec::with_capacity(batch.len());
        for event in batch {
            let n = {
                let a = st.attempts.entry(event.event_id).or_default();
                *a += 1;
                *a
            };
            match st.scripts.get(&event.event_id) {
                Some(Script::PanicTimes(k)) if n <= *k => {
                    let k = *k;
                    drop(st);
                    panic!("scripted panic {n}/{k}");
                }
                _ => {}
            }
            let outcome = match st.scripts.get(&event.event_id) {
                Some(Script::RetryTimes(k)) if n <= *k => Outcome::Retry(Error::new(
                    ErrorKind::Other,
                    format!("scripted retry {n}/{k}"),
                )),
                Some(Script::AlwaysRetry) => {
                    Outcome::Retry(Error::new(ErrorKind::Other, "scripted: always retry"))
                }
                Some(Script::FailTimes(k, kind)) if n <= *k => Outcome::from_error(Error::new(
                    *kind,
                    format!("scripted {kind} failure {n}/{k}"),
                )),
                Some(Script::Reject) => {
                    Outcome::Reject(Error::new(ErrorKind::InvalidMessage, "scripted: rejected"))
                }
                _ => Outcome::Published,
            };
            if outcome.is_published() {
                st.delivered.push(event.clone());
            }
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }
}
