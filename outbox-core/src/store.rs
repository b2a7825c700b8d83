//! The `Store` trait: where the outbox rows live.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::model::{
    BacklogStatus, DeadEvent, DeadFilter, DeadSelection, EventFilter, EventRecord, HeldBack,
    NewEvent, OutboxEvent, Pause, Paused, ReplaySelection, ShardOwner,
};

/// What to do with rows once the broker acknowledged them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MarkMode {
    /// Delete the row.
    Delete,
    /// Set `published_at`; a background purge deletes it after the retention period.
    Keep,
}

/// One claim: the next pending rows of the shards this session owns.
#[derive(Debug, Clone, Copy)]
pub struct ClaimRequest<'a> {
    /// Most rows to return.
    pub limit: usize,
    /// Rows this relay has in flight: never return them.
    pub exclude_ids: &'a [i64],
    /// `on_dead = "hold"`: a dead row keeps holding back the later rows of its aggregate.
    pub dead_holds_aggregate: bool,
}

/// A failed publication to record on a row.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub id: i64,
    /// The error as people should read it (`last_error`).
    pub error: String,
    /// `Some(delay)`: try again after `delay`; `None`: park the row as dead.
    pub retry_in: Option<Duration>,
}

/// What a relay sees of the others through its session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Relays with a live session on this table, this one included.
    pub live_relays: u32,
    /// Shards locked by any relay, this one included.
    pub locked: BTreeSet<i32>,
}

/// A database holding an outbox table.
#[async_trait]
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// The store kind as named in configuration, e.g. `postgres`.
    fn kind(&self) -> &'static str;

    /// Human description for logs: URL with the password redacted, and the table.
    fn describe(&self) -> String;

    /// Create or upgrade the schema. Idempotent; safe with several relays starting at once.
    async fn migrate(&self) -> Result<()>;

    /// Check the database answers, the table exists at the expected schema version and the
    /// user has the privileges relaying needs (an `Unauthorized` error naming the missing
    /// ones otherwise). `run` calls it before relaying, `status` to explain a failure.
    async fn check(&self) -> Result<()>;

    /// Open a dedicated session (its own connection) that holds shard locks. Claims and marks
    /// for a shard go through the session holding its lock: that is the fencing.
    async fn open_session(&self, relay_id: &str) -> Result<Box<dyn ShardSession>>;

    /// Insert events in a transaction of their own (demo, tools, tests). Writers enqueue inside
    /// their business transaction with the store crate's own `enqueue` function.
    async fn insert(&self, events: &[NewEvent]) -> Result<Vec<i64>>;

    /// Delete at most `limit` rows published more than `older_than` ago; returns how many.
    /// The engine calls it every `relay.purge_interval`, also with `retention = "delete"`
    /// (`older_than` zero), to remove the rows an earlier retention period kept.
    async fn purge_published(&self, older_than: Duration, limit: u32) -> Result<u64>;

    /// Backlog figures.
    async fn status(&self) -> Result<BacklogStatus>;

    /// Which relay holds which shard right now.
    async fn shard_owners(&self) -> Result<Vec<ShardOwner>>;

    /// Dead rows, oldest first.
    async fn dead_list(&self, filter: &DeadFilter) -> Result<Vec<DeadEvent>>;

    /// Send dead rows back to pending: `dead_at`, `attempts` and `next_attempt_at` reset, the
    /// row keeps its `id` and so its place in its aggregate's order. Returns how many.
    async fn dead_retry(&self, selection: &DeadSelection) -> Result<u64>;

    /// Delete dead rows for good: the ones given, or every one (of one aggregate). Returns how
    /// many (rows that are not dead are left alone).
    async fn dead_discard(&self, selection: &DeadSelection) -> Result<u64>;

    /// Aggregates held back by a retrying event, the longest-waiting first.
    async fn held_back(&self, limit: u32) -> Result<Vec<HeldBack>>;

    /// The published events that `selection` names and `relay.retention` kept: with `dry_run`
    /// only counted, else sent back to pending (attempts reset, `event_id` unchanged) for the
    /// relay to publish again, each aggregate's in their order. Returns how many. Consumers see
    /// them again, as duplicates of what they had (at least once). A store that keeps no
    /// published events returns an error that says why; this default says the store cannot.
    async fn replay(&self, selection: &ReplaySelection, dry_run: bool) -> Result<u64> {
        let _ = (selection, dry_run);
        Err(Error::new(
            ErrorKind::Other,
            format!(
                "the {} store cannot publish kept events again (its Store::replay is not \
                 written)",
                self.kind()
            ),
        ))
    }

    /// The rows `filter` names, whatever their state (pending, published and kept, dead),
    /// newest first: `outbox-relay events`. A published event whose row was deleted (retention
    /// `"delete"`) is not among them. This default says the store cannot look events up.
    async fn find_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>> {
        let _ = filter;
        Err(Error::new(
            ErrorKind::Other,
            format!(
                "the {} store cannot look events up (its Store::find_events is not written)",
                self.kind()
            ),
        ))
    }

    /// The operator's pause of this table (`outbox-relay pause`), `None` when it is not paused.
    /// Every relay of the table reads it once per `relay.rebalance_interval` and before its
    /// first claim, and claims nothing while it holds. A table migrated before pauses existed
    /// is not paused (its pause table is made by the next `migrate`). This default says never.
    async fn paused(&self) -> Result<Option<Pause>> {
        Ok(None)
    }

    /// Pause this table for every relay (`outbox-relay pause`), by `by` for `reason`; a table
    /// paused already keeps its pause. Nothing is lost: the events wait, in order, and the
    /// rows stay pending. This default says the store cannot.
    async fn pause(&self, by: &str, reason: &str) -> Result<Paused> {
        let _ = (by, reason);
        Err(Error::new(
            ErrorKind::Other,
            format!(
                "the {} store cannot pause a table (its Store::pause is not written)",
                self.kind()
            ),
        ))
    }

    /// Lift this table's pause (`outbox-relay resume`): the pause that held, `None` when the
    /// table was not paused. This default says the store cannot.
    async fn resume(&self) -> Result<Option<Pause>> {
        Err(Error::new(
            ErrorKind::Other,
            format!(
                "the {} store cannot resume a table (its Store::resume is not written)",
                self.kind()
            ),
        ))
    }

    /// When the oldest of the published events `relay.retention` kept was published: how far
    /// back [`replay`](Self::replay) reaches. `None` when none is kept (the default retention
    /// `"delete"`, a purge that took them all, a store that keeps no published events). This
    /// default says none for a store that does not tell.
    async fn oldest_kept(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        Ok(None)
    }

    /// Refuse relay settings this store cannot honour (say `relay.on_dead = "hold"` where the
    /// store cannot hold an aggregate behind a dead event). [`Relay::new`](crate::Relay::new)
    /// calls it. Errors name the key.
    fn check_relay_settings(&self, _relay: &crate::RelayConfig) -> Result<()> {
        Ok(())
    }
}

/// A relay's dedicated database session: shard locks, claims and marks.
///
/// If the underlying connection breaks, every lock is gone with it: each later call fails with
/// [`ErrorKind::LeaseLost`] and the engine opens a new session.
#[async_trait]
pub trait ShardSession: Send + fmt::Debug {
    /// Number of shards of the table (fixed at migration).
    fn shard_count(&self) -> u32;

    /// Whether [`claim`](Self::claim) itself waits a little for new events when it has none
    /// (a session that reads the database's log): the engine then claims again at once instead
    /// of sleeping between claims. `false` (the default) for sessions that poll.
    fn claim_waits(&self) -> bool {
        false
    }

    /// Shards this session holds.
    fn owned(&self) -> &BTreeSet<i32>;

    /// Live relays and locked shards.
    async fn cluster(&mut self) -> Result<ClusterView>;

    /// Try to take `shard`'s lock without waiting; `true` if this session now holds it.
    async fn try_acquire(&mut self, shard: i32) -> Result<bool>;

    /// Give `shard` back.
    async fn release(&mut self, shard: i32) -> Result<()>;

    /// The next pending rows of owned shards, in `id` order: not yet published, not dead, due
    /// (`next_attempt_at` passed), not excluded, and not behind an earlier row of the same
    /// aggregate that is waiting for a retry (or dead, with `dead_holds_aggregate`).
    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>>;

    /// Mark rows as published (delete or set `published_at`). One statement.
    async fn mark_published(&mut self, ids: &[i64], mode: MarkMode) -> Result<()>;

    /// Record failures: `attempts + 1`, `last_error`, and `next_attempt_at` or `dead_at`.
    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()>;

    /// Release every lock and close the connection.
    async fn close(self: Box<Self>) -> Result<()>;
}
