//! The shard session of `capture = "logical"`: one unit of ownership (shard 0) that is the
//! replication slot. Holding it means reading the slot; the other relays stand by and take it
//! over when it is free, or when its reader stopped reporting for `takeover_after`.
//!
//! Claims hand out the events read from the log, in commit order; marks and failures settle
//! them, and the slot is confirmed up to the last transaction whose events, and all earlier
//! ones', are settled (see [`Backlog`]). No transaction is open while the broker is called.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent, TlsConfig};
use sqlx::postgres::PgConnectOptions;
use sqlx::{Arguments as _, PgConnection};
use uuid::Uuid;

use outboxkit_core::{
    ClaimRequest, ClusterView, Error, ErrorKind, Failure, HeldBack, MarkMode, OutboxEvent,
    PayloadType, Result, ShardSession,
};
use outboxkit_store_sql::classify::connect_within;
use outboxkit_store_sql::config::CaptureStyle;
use outboxkit_store_sql::session::{truncate_error, Fence};
use outboxkit_store_sql::Statement;

use super::backlog::{Backlog, HeldFigures, ResumePoint};
use super::decode::{decode, event_of_message, event_of_row, Change, Relation};
use super::setup::{slot_lag, LogicalNames};
use crate::classify::{classify, Postgres, Target};
use crate::config::TableName;
use crate::session::application_name;
use crate::sql::Sql;

/// How long a claim waits for the log when it has nothing to hand out.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// How soon the reader reports a position it may confirm to the server, and how often it
/// reports that it is alive: a relay killed leaves about this much settled and unconfirmed, to
/// be published again (a report carries 34 bytes; once a second, the next reader published
/// about a second's worth again).
const STATUS_INTERVAL: Duration = Duration::from_millis(100);

/// How long the replication client waits on a silent connection before it looks again.
const WAKEUP_INTERVAL: Duration = Duration::from_secs(1);

/// How long a graceful stop waits for the server to be told the last confirmable position.
const REPORT_WAIT: Duration = Duration::from_secs(2);

/// Messages the replication client reads ahead of the relay, whatever their size: with large
/// payloads, what it holds beyond `store.logical.max_unsettled_bytes` while the relay does not
/// read (1,024 held 128 MiB more of 128 KiB events with the broker out of reach; 256 drains
/// small events as fast, 64 about 10% slower).
const CLIENT_BUFFER: usize = 256;

/// Table style: how long a failure whose row its statement did not find is looked for again.
/// The log can deliver a transaction a moment before it is visible to other sessions (the
/// server sends it once its commit is flushed, and makes it visible right after), so a
/// statement right away can miss the row; past this, the row is taken to be gone already.
const UNMARKED_GRACE: Duration = Duration::from_secs(5);

/// Table style: how long a published row that its mark did not find, and whose transaction
/// is still not visible, is looked for again before it is taken to be gone (with a warning).
/// A committed transaction becomes visible a moment after the log delivers it, unless the
/// server waits for a synchronous standby first.
const INVISIBLE_LIMIT: Duration = Duration::from_secs(60);

/// Message style: at most this many dead rows' `event_id`s (the latest) are kept to skip
/// their events when they are read again after a takeover (see
/// [`LogicalSession::drop_parked`]); 1.6 MiB of ids.
const PARKED_LIMIT: i64 = 100_000;

/// Table style: how often rows a mark missed are marked again.
const UNMARKED_RETRY: Duration = Duration::from_millis(20);

/// How often a reader checks that the publication still publishes its table (table style).
const PUBLICATION_CHECK: Duration = Duration::from_secs(5);

/// Message style: a transaction still unsettled this long after it became the oldest (a large
/// one) gets its [`ResumePoint`] left for the next reader, at most this often.
const RESUME_POINT_INTERVAL: Duration = Duration::from_millis(100);

/// Message style: the held-back aggregates the reader lists for `status` (the first, by id),
/// and how often it counts them again while the failed events stay the same (what waits
/// behind them changes as the log is read).
pub(crate) const HELD_BACK_LISTED: usize = 100;
const HELD_BACK_REFRESH: Duration = Duration::from_secs(1);

/// Of the 32-bit transaction ids in parameter `$n` (as `int8`), those whose commits the
/// statement's snapshot sees: each id is widened against the snapshot's 64-bit `xmax` (an id of
/// a transaction the log delivered is less than 2^31 transactions old: its slot holds the
/// server's xid horizon back); one at or past `xmax` is not seen.
fn visible_xids(n: u8) -> String {
    format!(
        "SELECT x FROM unnest(${n}::int8[]) AS x, \
         (SELECT s, pg_snapshot_xmax(s)::text::int8 AS xmax FROM pg_current_snapshot() AS s) AS n, \
         LATERAL (SELECT n.xmax - 4294967296 + ((x - n.xmax) & 4294967295) AS behind) AS w \
         WHERE CASE WHEN w.behind >= n.xmax - 2147483648 AND w.behind >= 0 \
             THEN pg_visible_in_snapshot(w.behind::text::xid8, n.s) ELSE false END"
    )
}

/// Message style, of the events `(id, event_id, created_at, xid)` in parameters `$1` to `$4`:
/// the `id`s of those a dead row of `table` holds (the same `event_id` and `created_at`) and
/// whose transaction the statement's snapshot sees ([`visible_xids`]). Answered per event,
/// never per `event_id`: a claim can hold the parked event and, with the same `event_id`, its
/// `dead retry` not visible yet or a writer's new event.
fn parked_among(table: &str) -> Statement {
    Statement::from(format!(
        "SELECT c.id FROM unnest($1::int8[], $2::uuid[], $3::timestamptz[], $4::int8[]) \
             AS c(id, event_id, created_at, xid) \
         WHERE EXISTS (SELECT 1 FROM {table} AS d WHERE d.event_id = c.event_id \
                       AND d.created_at = c.created_at AND d.dead_at IS NOT NULL) \
         AND c.xid IN ({})",
        visible_xids(4)
    ))
}

/// `rows` (a query or a statement returning a column `id`), and in the same statement, so with
/// the same snapshot, [`visible_xids`] of parameter `$n`: rows `(id, false)` and `(xid, true)`.
fn with_visible_xids(rows: &str, n: u8) -> String {
    format!(
        "WITH found AS ({rows}) SELECT id, false FROM found \
         UNION ALL SELECT x, true FROM ({}) AS v",
        visible_xids(n)
    )
}

/// `statement` returning its rows' `id` column: alone, as rows `(id, false)`, when it has no
/// transactions to ask about (`asks` false: the first try of a mark, on the hot path), else
/// joined with [`visible_xids`] of parameter `$n` by [`with_visible_xids`].
fn returning_found(statement: &str, id: &str, asks: bool, n: u8) -> Statement {
    Statement::from(if asks {
        with_visible_xids(&format!("{statement} RETURNING {id}"), n)
    } else {
        format!("{statement} RETURNING {id}, false")
    })
}

/// What a statement made by [`with_visible_xids`] returned (`(id, false)` for each row it found
/// or changed, `(xid, true)` for each transaction its snapshot sees).
struct Found {
    rows: HashSet<i64>,
    visible: HashSet<i64>,
}

impl Found {
    fn new(returned: Vec<(i64, bool)>) -> Self {
        let (visible, rows) = returned.into_iter().partition::<Vec<_>, _>(|r| r.1);
        Self {
            rows: rows.into_iter().map(|r| r.0).collect(),
            visible: visible.into_iter().map(|r| r.0).collect(),
        }
    }

    fn has(&self, id: i64) -> bool {
        self.rows.contains(&id)
    }

    /// Row `id` of transaction `xid` is gone: not found, though the statement's snapshot sees
    /// its transaction.
    fn gone(&self, id: i64, xid: Option<u32>) -> bool {
        !self.has(id) && xid.is_some_and(|x| self.visible.contains(&i64::from(x)))
    }
}

/// What a logical store shares with its sessions: names, statements, and the reader's figures
/// for `status` and the metrics.
#[derive(Debug)]
pub(crate) struct LogicalContext {
    pub names: LogicalNames,
    pub table: TableName,
    pub sql: Sql,
    pub target: Target,
    pub options: PgConnectOptions,
    /// The password, for the replication connection (sqlx does not hand it back).
    pub password: Option<String>,
    /// `sslmode`, `sslrootcert`, `sslcert`, `sslkey` of the URL.
    pub tls: TlsConfig,
    /// The URL's `hostaddr`: the address the replication connection goes to, as sqlx's do.
    pub hostaddr: Option<String>,
    pub max_unsettled: usize,
    pub max_unsettled_bytes: usize,
    pub takeover_after: Duration,
    pub connect_timeout: Duration,
    pub session_timeout: Duration,
    pub progress: Progress,
}

/// The active reader's figures, read by `status`.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    /// Whether a session of this process reads the slot.
    pub reading: std::sync::atomic::AtomicBool,
    /// Events read and not settled.
    pub unsettled: AtomicUsize,
    /// Microseconds since the Unix epoch of the oldest unsettled event; 0 when none.
    pub oldest_micros: AtomicI64,
    /// Message style, where no row records a failure: what the failed events hold back.
    pub held: std::sync::Mutex<HeldFigures>,
}

impl Progress {
    /// The last [`HeldFigures`] the reader noted.
    pub fn held(&self) -> HeldFigures {
        self.held_lock().clone()
    }

    fn held_lock(&self) -> std::sync::MutexGuard<'_, HeldFigures> {
        // Only whole values are stored: a panic elsewhere leaves nothing half-written.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The slot's `reader`, or, when the session reads it no more (lost or released), an error:
/// what it had read and not settled is read again by whoever reads the slot next.
fn reading<'r>(reader: &'r mut Option<Reader>, slot: &str) -> Result<&'r mut Reader> {
    reader.as_mut().ok_or_else(|| {
        Error::new(
            ErrorKind::LeaseLost,
            format!("replication slot \"{slot}\" is no longer read by this session"),
        )
    })
}

/// The slot's reader, while this session holds it.
struct Reader {
    client: ReplicationClient,
    backlog: Backlog,
    relations: HashMap<u32, Relation>,
    /// Messages and rows of the transaction being read that cannot be relayed, parked as dead
    /// at its commit.
    malformed: Vec<Malformed>,
    in_transaction: bool,
    confirmed: u64,
    /// Message style: the `event_id`s of the table's dead rows when the reader started, the
    /// events read again that the last reader may have parked (see
    /// [`LogicalSession::drop_parked`]). Empty, as it mostly is, it costs nothing.
    parked: HashSet<Uuid>,
    /// Whether what became of the events read again was said (see [`Reader::caught_up`]).
    caught_up: bool,
    /// Message style: whether the bookkeeping row has room for the [`ResumePoint`], and the
    /// last one left there, with since when the transaction it names is the oldest unsettled.
    resume: Option<LeftResumePoint>,
    /// When [`Progress::held`] was last noted, with how many failed events (`usize::MAX`:
    /// note it at the next confirm, an event failed).
    held_noted: (Instant, usize),
    /// Message style: whether the bookkeeping row has room for what the failed events hold
    /// back (left there as the reader stops, for the next reader to carry on).
    held_room: bool,
}

/// See [`Reader::resume`].
#[derive(Debug, Default)]
struct LeftResumePoint {
    left: Option<ResumePoint>,
    /// The oldest unsettled transaction (its `final_lsn`) and since when it is.
    oldest: Option<(u64, Instant)>,
}

impl Reader {
    /// Take the events `ids` (read again, handled by the last reader) out of `batch` unpublished,
    /// and settle them; returns them.
    fn skip(&mut self, batch: &mut Vec<OutboxEvent>, ids: &[i64]) -> Vec<OutboxEvent> {
        let ids_set: HashSet<i64> = ids.iter().copied().collect();
        let (skipped, kept) = std::mem::take(batch)
            .into_iter()
            .partition(|e| ids_set.contains(&e.id));
        *batch = kept;
        self.backlog.skip(ids);
        skipped
    }

    /// Once every event read again is settled: say, once, how many there were and how many
    /// the last reader had handled (skipped; the others were handed out), and let go of the
    /// dead rows' `event_id`s, which only events read again are checked against.
    fn caught_up(&mut self) {
        if self.caught_up {
            return;
        }
        let Some(read) = self.backlog.read_again_done() else {
            return;
        };
        self.caught_up = true;
        let skipped = self.backlog.read_again_skipped();
        tracing::info!(
            read_again = read,
            skipped,
            handed_out = read.saturating_sub(skipped),
            "caught up with the events read again (committed before this reader started, after \
             the slot's confirmed position): skipped those the last reader had marked or parked \
             as dead (message style: parked as dead), handed out the rest (some may have reached \
             the broker before: at least once)"
        );
        self.parked = HashSet::new();
    }
}

impl fmt::Debug for Reader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reader")
            .field("unsettled", &self.backlog.unsettled())
            .field("confirmed", &Lsn::from_u64(self.confirmed))
            .finish()
    }
}

/// What cannot be relayed: kept as a dead row, with the reason.
#[derive(Debug)]
struct Malformed {
    /// The row's id (table style), when it could be read.
    id: Option<i64>,
    content: Vec<u8>,
    error: String,
}

/// See the module's documentation.
pub struct LogicalSession {
    fence: Fence<PgConnection, Postgres>,
    context: Arc<LogicalContext>,
    payload_type: PayloadType,
    relay_id: String,
    reader: Option<Reader>,
    /// Table style: published rows a mark did not find yet, with when it first missed them.
    unmarked: HashMap<i64, Instant>,
    /// When `unmarked` was last tried.
    unmarked_tried: Instant,
    /// When the publication was last checked (see [`Self::check_published`]).
    publication_checked: Instant,
    /// How the engine asked the rows of `unmarked` to be marked (`relay.retention`).
    unmarked_mode: MarkMode,
}

impl fmt::Debug for LogicalSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fence.debug_session(
            f,
            "LogicalSession",
            &[("slot", &self.context.names.slot), ("reader", &self.reader)],
        )
    }
}

/// The `application_name` of the sessions' own connections, by which they count each other:
/// one per slot (a long slot name is shortened with a hash, not cut, so that two slots whose
/// names begin alike do not count each other's relays).
pub(super) fn members_name(slot: &str) -> String {
    super::setup::fit_name(format!("outbox-relay-logical:{slot}"), slot)
}

impl LogicalSession {
    pub(crate) async fn open(
        context: Arc<LogicalContext>,
        relay_id: &str,
        payload_type: PayloadType,
    ) -> Result<Self> {
        let timeout_ms = context.session_timeout.as_millis().to_string();
        let options = context
            .options
            .clone()
            .application_name(&members_name(&context.names.slot))
            .options([
                ("statement_timeout", timeout_ms.as_str()),
                ("synchronous_commit", "off"),
                ("tcp_keepalives_idle", "10"),
                ("tcp_keepalives_interval", "5"),
                ("tcp_keepalives_count", "3"),
                ("tcp_user_timeout", "25000"),
            ]);
        let target = &context.target;
        let mut conn = connect_within::<Postgres, _>(&options, target, context.connect_timeout)
            .await?
            .map_err(|e| classify(e, target).context("opening a logical capture session"))?;
        crate::classify::refuse_read_only(&mut conn, target).await?;
        let fence = Fence::new(conn, target.clone(), relay_id, 1, context.session_timeout);
        Ok(Self {
            fence,
            payload_type,
            relay_id: relay_id.to_owned(),
            context,
            reader: None,
            unmarked: HashMap::new(),
            unmarked_tried: Instant::now(),
            publication_checked: Instant::now(),
            unmarked_mode: MarkMode::Delete,
        })
    }

    /// The server's id of the transaction that wrote the unsettled event `id`.
    fn xid_of(&self, id: i64) -> Option<u32> {
        self.reader.as_ref()?.backlog.xid_of(id)
    }

    /// The distinct transactions that wrote these unsettled events, for [`visible_xids`].
    fn xids_of(&self, ids: impl Iterator<Item = i64>) -> Vec<i64> {
        let xids: HashSet<u32> = ids.filter_map(|id| self.xid_of(id)).collect();
        xids.into_iter().map(i64::from).collect()
    }

    /// Table style: mark `ids` (published), and the rows earlier marks missed; settle what was
    /// marked, and what is gone already.
    ///
    /// A row a mark misses is either not visible yet (the log can deliver a transaction a moment
    /// before other sessions see it: the server sends it once its commit is flushed, and makes
    /// it visible right after) or gone: marked by the relay that read it first, before a
    /// takeover. The next mark tells the two apart: in the same statement, so with the same
    /// snapshot, it asks which of the missed rows' transactions are visible. A row whose
    /// transaction is visible and that the mark still does not find is gone, and settled at
    /// once; the others are looked for again, for up to [`INVISIBLE_LIMIT`].
    async fn mark_rows(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        let mark = match mode {
            MarkMode::Delete => &self.context.sql.mark_delete,
            MarkMode::Keep => &self.context.sql.mark_keep,
        };
        let now = Instant::now();
        let mut all: Vec<i64> = ids.to_vec();
        all.extend(self.unmarked.keys().copied());
        let xids = self.xids_of(self.unmarked.keys().copied());
        let statement = returning_found(mark, "id", !xids.is_empty(), 2);
        let returned = self
            .fence
            .run("marking rows published", async |conn| {
                let query = sqlx::query_as(&statement).bind(&all);
                let query = if xids.is_empty() {
                    query
                } else {
                    query.bind(&xids)
                };
                query.fetch_all(conn).await
            })
            .await?;
        self.unmarked_tried = now;
        self.unmarked_mode = mode;
        let found = Found::new(returned);
        let mut first_missed = std::mem::take(&mut self.unmarked);
        let mut settled = Vec::with_capacity(all.len());
        for id in all {
            let missed_since = first_missed.remove(&id);
            if found.has(id) {
                settled.push(id);
                continue;
            }
            let Some(since) = missed_since else {
                self.unmarked.entry(id).or_insert(now);
                continue;
            };
            let xid = self.xid_of(id);
            if found.gone(id, xid) {
                tracing::debug!(id, "published row not found to mark: marked already");
                settled.push(id);
            } else if now.duration_since(since) >= INVISIBLE_LIMIT {
                tracing::warn!(
                    id,
                    xid,
                    "published row still not found to mark after {}: taken as marked already \
                     (if its transaction becomes visible later, the row stays in the table)",
                    outboxkit_store_sql::format_duration(INVISIBLE_LIMIT)
                );
                settled.push(id);
            } else {
                self.unmarked.insert(id, since);
            }
        }
        if let Some(reader) = self.reader.as_mut() {
            for id in self.unmarked.keys() {
                reader.backlog.acknowledge(*id);
            }
            reader.backlog.settle(&settled);
        }
        Ok(())
    }

    /// Table style, after the reader starts: drop from `batch` (and settle) the events whose
    /// rows are gone or no longer pending, marked or parked as dead by the relay that read them
    /// first, before a takeover (the slot is confirmed behind what its reader settled). Without
    /// it a takeover publishes again everything that reader did since its last confirmation,
    /// and a transaction of a million events whole. A row not found is gone only when the same
    /// statement sees its transaction (see [`Self::mark_rows`]). Only the events read again
    /// are checked, every one of them: those of transactions committed before this reader
    /// started ([`Backlog::is_read_again`]); the rest of the log is new to this relay. (The
    /// check once ended at the first claim that found nothing gone: a claim of events the last
    /// reader had held back, behind a retry of their aggregate, ended it, and the events after
    /// them that it had published or parked as dead were published again.)
    async fn drop_gone(&mut self, batch: &mut Vec<OutboxEvent>) -> Result<()> {
        let Some(reader) = self.reader.as_ref() else {
            return Ok(());
        };
        let ids: Vec<i64> = batch
            .iter()
            .map(|e| e.id)
            .filter(|id| reader.backlog.is_read_again(*id))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let xids = self.xids_of(ids.iter().copied());
        let pending = format!(
            "SELECT id FROM {} WHERE id = ANY($1::int8[]) \
             AND published_at IS NULL AND dead_at IS NULL",
            self.context.table.quoted()
        );
        let statement = Statement::from(with_visible_xids(&pending, 2));
        let returned = self
            .fence
            .run("checking the rows of events read again", async |conn| {
                sqlx::query_as(&statement)
                    .bind(&ids)
                    .bind(&xids)
                    .fetch_all(conn)
                    .await
            })
            .await?;
        let found = Found::new(returned);
        let (gone, pending): (Vec<i64>, Vec<i64>) = ids
            .into_iter()
            .partition(|id| found.gone(*id, self.xid_of(*id)));
        let Some(reader) = self.reader.as_mut() else {
            return Ok(());
        };
        if !gone.is_empty() {
            tracing::debug!(
                count = gone.len(),
                "events read again whose rows were marked already: not published again"
            );
            reader.skip(batch, &gone);
        }
        let pending: Vec<i64> = pending.into_iter().filter(|id| found.has(*id)).collect();
        self.keep_recorded_failures(batch, &pending).await
    }

    /// Table style, after [`Self::drop_gone`]: the pending rows of events read again (`ids`)
    /// may record failures the last reader recorded. Those events keep them (attempts, next
    /// try, last error: `relay.max_attempts` counts across readers as it does with polling,
    /// and the next try waits), and `batch` is handed out as a claim that knew them would:
    /// without an event waiting for its next try, nor the events after a failed one of their
    /// aggregate (see [`Backlog::recheck`]).
    async fn keep_recorded_failures(
        &mut self,
        batch: &mut Vec<OutboxEvent>,
        ids: &[i64],
    ) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let statement = Statement::from(format!(
            "SELECT id, aggregate_type, aggregate_id, attempts, next_attempt_at, last_error \
             FROM {} WHERE id = ANY($1::int8[]) AND attempts > 0 \
             AND published_at IS NULL AND dead_at IS NULL",
            self.context.table.quoted()
        ));
        type Recorded = (
            i64,
            String,
            String,
            i32,
            Option<DateTime<Utc>>,
            Option<String>,
        );
        let recorded: Vec<Recorded> = self
            .fence
            .run(
                "reading the failures recorded for events read again",
                async |conn| sqlx::query_as(&statement).bind(ids).fetch_all(conn).await,
            )
            .await?;
        let Some(reader) = self.reader.as_mut().filter(|_| !recorded.is_empty()) else {
            return Ok(());
        };
        for (id, aggregate_type, aggregate_id, attempts, next_attempt_at, last_error) in recorded {
            reader.backlog.recorded_failures(HeldBack {
                aggregate_type,
                aggregate_id,
                id,
                attempts,
                next_attempt_at,
                last_error,
                waiting_behind: 0,
            });
        }
        reader.backlog.recheck(batch, Instant::now());
        Ok(())
    }

    /// Message style, after the reader starts: drop from `batch` (and settle) the events the
    /// last reader parked as dead, read again because the slot is confirmed behind what that
    /// reader settled. Without it they are published again, if the broker takes them by then,
    /// while their dead rows stay for `dead retry` to publish them once more. Only events read
    /// again whose `event_id` had a dead row when this reader started are asked about, in one
    /// statement: dropped when a dead row holds the same event (`event_id` and `created_at`)
    /// and the statement's snapshot sees the event's transaction. `dead retry` deletes the row
    /// in the transaction that writes the event again, so the retried event, once visible,
    /// finds no row, and is not dropped while it is not visible (see [`visible_xids`]).
    async fn drop_parked(&mut self, batch: &mut Vec<OutboxEvent>) -> Result<()> {
        let Some(reader) = self.reader.as_ref() else {
            return Ok(());
        };
        let mut ids = Vec::new();
        let mut event_ids = Vec::new();
        let mut created = Vec::new();
        let mut xids = Vec::new();
        let read_again = batch
            .iter()
            .filter(|e| reader.backlog.is_read_again(e.id) && reader.parked.contains(&e.event_id));
        for event in read_again {
            if let Some(xid) = reader.backlog.xid_of(event.id) {
                ids.push(event.id);
                event_ids.push(event.event_id);
                created.push(event.created_at);
                xids.push(i64::from(xid));
            }
        }
        if ids.is_empty() {
            return Ok(());
        }
        let statement = parked_among(&self.context.table.quoted());
        let dropped: Vec<i64> = self
            .fence
            .run(
                "checking the events read again for dead rows",
                async |conn| {
                    sqlx::query_scalar(&statement)
                        .bind(&ids)
                        .bind(&event_ids)
                        .bind(&created)
                        .bind(&xids)
                        .fetch_all(conn)
                        .await
                },
            )
            .await?;
        let Some(reader) = self.reader.as_mut() else {
            return Ok(());
        };
        if dropped.is_empty() {
            return Ok(());
        }
        tracing::info!(
            count = dropped.len(),
            "events read again that the last reader parked as dead: left to `dead retry`, not \
             published again"
        );
        for event in reader.skip(batch, &dropped) {
            reader.parked.remove(&event.event_id);
        }
        Ok(())
    }

    /// Message style: the `event_id`s of the dead rows, the latest [`PARKED_LIMIT`].
    async fn parked_event_ids(&mut self) -> Result<HashSet<Uuid>> {
        let statement = Statement::from(format!(
            "SELECT event_id FROM {} WHERE dead_at IS NOT NULL AND event_id IS NOT NULL \
             ORDER BY id DESC LIMIT {PARKED_LIMIT}",
            self.context.table.quoted()
        ));
        let ids: Vec<Uuid> = self
            .fence
            .run("reading the dead rows' event ids", async |conn| {
                sqlx::query_scalar(&statement).fetch_all(conn).await
            })
            .await?;
        Ok(ids.into_iter().collect())
    }

    /// Table style: fail (permanently, kind `Schema`) when the publication no longer publishes
    /// every insert of the table (see [`super::setup::publication_fault`]): what it leaves out
    /// would not be read, and nothing would say so. Checked when a reader starts and every
    /// [`PUBLICATION_CHECK`] while it reads.
    async fn check_published(&mut self) -> Result<()> {
        self.publication_checked = Instant::now();
        let context = Arc::clone(&self.context);
        if context.names.style != CaptureStyle::Table {
            return Ok(());
        }
        let (names, table) = (&context.names, &context.table);
        let fault = self
            .fence
            .run("checking the publication", async |conn| {
                super::setup::publication_fault(conn, names, table).await
            })
            .await?;
        fault.map_or(Ok(()), Err)
    }

    /// Message style: once the oldest unsettled transaction has been so for
    /// [`RESUME_POINT_INTERVAL`] (a large one), leave in the bookkeeping row, at most that
    /// often, how far into it this reader settled, so that the next reader after a crash
    /// publishes again only the rest of it rather than all of it (the slot cannot be confirmed
    /// inside a transaction). `now`: whatever the interval (a graceful stop).
    async fn leave_resume_point(&mut self, now: bool) -> Result<()> {
        let Some(reader) = self.reader.as_mut() else {
            return Ok(());
        };
        let point = reader.backlog.resume_point();
        let Some(resume) = reader.resume.as_mut() else {
            return Ok(());
        };
        let Some(point) = point else {
            resume.oldest = None;
            return Ok(());
        };
        let at = Instant::now();
        let since = match resume.oldest {
            Some((lsn, since)) if lsn == point.final_lsn => since,
            _ if now => at,
            _ => {
                resume.oldest = Some((point.final_lsn, at));
                return Ok(());
            }
        };
        let due = now || at.duration_since(since) >= RESUME_POINT_INTERVAL;
        if !due || resume.left == Some(point) {
            return Ok(());
        }
        resume.left = Some(point);
        resume.oldest = Some((point.final_lsn, at));
        let table = &self.context.table;
        self.fence
            .run("leaving where this reader got to", async |conn| {
                super::setup::leave_resume_point(conn, table, point).await
            })
            .await
    }

    /// Message style, as the reader stops: leave what its failed events hold back in the
    /// bookkeeping row, as it is now, for the next reader to carry on their attempts.
    async fn leave_held_back(&mut self) -> Result<()> {
        let Some(reader) = self.reader.as_ref().filter(|r| r.held_room) else {
            return Ok(());
        };
        let held = reader.backlog.held_back(HELD_BACK_LISTED);
        let table = &self.context.table;
        self.fence
            .run("leaving what the failed events hold back", async |conn| {
                super::setup::leave_held_back(conn, table, &held).await
            })
            .await
    }

    /// Start reading the slot from its confirmed position; `false` when another session
    /// started first.
    async fn start_reader(&mut self) -> Result<bool> {
        let context = Arc::clone(&self.context);
        let names = &context.names;
        let slot = names.slot.clone();
        let lag = self
            .fence
            .run("reading the replication slot", async |conn| {
                slot_lag(conn, &slot).await
            })
            .await?;
        let Some(lag) = lag else {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "replication slot \"{}\" does not exist (any more): stop the relays and \
                     follow the runbook ({})",
                    names.slot,
                    super::setup::RUNBOOK
                ),
            )
            .permanent());
        };
        if lag.wal_status.as_deref() == Some("lost") {
            return Err(Error::new(
                ErrorKind::Schema,
                format!(
                    "replication slot \"{}\" was invalidated by the server (wal_status = lost: \
                     the log it needed was removed, see max_slot_wal_keep_size); follow the \
                     runbook ({})",
                    names.slot,
                    super::setup::RUNBOOK
                ),
            )
            .permanent());
        }
        if lag.active {
            return Ok(false);
        }
        self.check_published().await?;
        // Where the slot is confirmed to, and where the log stands now: every transaction the
        // last reader can have handled committed before it.
        let (confirmed, now): (String, String) = self
            .fence
            .run("reading the replication slot", async |conn| {
                sqlx::query_as(
                    "SELECT coalesce(confirmed_flush_lsn, '0/0')::text, \
                     pg_current_wal_insert_lsn()::text FROM pg_replication_slots \
                     WHERE slot_name = $1",
                )
                .bind(&slot)
                .fetch_one(conn)
                .await
            })
            .await?;
        let confirmed = Lsn::parse(&confirmed).map(|l| l.as_u64()).unwrap_or(0);
        let now = Lsn::parse(&now).map(|l| l.as_u64()).unwrap_or(u64::MAX);
        let (parked, resume, carried) = match context.names.style {
            CaptureStyle::Message => {
                let table = &context.table;
                let resume = self
                    .fence
                    .run("reading where the last reader got to", async |conn| {
                        super::setup::left_resume_point(conn, table).await
                    })
                    .await?;
                if resume.is_none() {
                    tracing::info!(
                        %table,
                        "the capture bookkeeping row has no room for where a reader got to inside \
                         a transaction (set up by an older migrate): run migrate again, or a \
                         reader after a crash publishes again all of a transaction it read in part"
                    );
                }
                let held_room = self
                    .fence
                    .run("reading the capture bookkeeping", async |conn| {
                        super::setup::has_held_columns(conn, table).await
                    })
                    .await?;
                let carried = if held_room {
                    self.fence
                        .run("reading the retries the last reader left", async |conn| {
                            super::setup::left_held_back(conn, table).await
                        })
                        .await?
                } else {
                    tracing::info!(
                        %table,
                        "the capture bookkeeping row has no room for the events held back behind \
                         a retry (set up by an older migrate): run migrate again, or status run \
                         outside this relay shows no retries (this relay's metrics count them) \
                         and a failed event's attempts start from 0 with each reader"
                    );
                    Vec::new()
                };
                if !carried.is_empty() {
                    tracing::info!(
                        %table,
                        events = carried.len(),
                        "carrying on the attempts of the failed events the last reader listed"
                    );
                }
                let carried = held_room.then_some(carried);
                (self.parked_event_ids().await?, resume, carried)
            }
            CaptureStyle::Table => (HashSet::new(), None, None),
        };
        // Message style, with room in the bookkeeping row for what failed events hold back.
        let held_room = carried.is_some();
        let options = &context.options;
        let (host, tls) =
            super::replication_address(options, context.hostaddr.as_deref(), &context.tls);
        let config = ReplicationConfig::new(
            host,
            options.get_username(),
            context.password.clone().unwrap_or_default(),
            options.get_database().unwrap_or(options.get_username()),
            &names.slot,
            names.publication.as_str(),
        )
        .with_port(options.get_port())
        .with_tls(tls)
        .with_start_lsn(Lsn::from_u64(confirmed))
        .with_binary(true)
        .with_status_interval(STATUS_INTERVAL)
        .with_wakeup_interval(WAKEUP_INTERVAL)
        .with_buffer_size(CLIENT_BUFFER)
        .with_application_name(application_name(&self.relay_id));
        let mut client = ReplicationClient::connect(config)
            .await
            .map_err(|e| replication_error(&e, &context.target))?;
        let started = tokio::time::timeout(context.connect_timeout, client.wait_started()).await;
        match started {
            Ok(Ok(())) => {}
            Ok(Err(e)) if server_code(&e) == Some(OBJECT_IN_USE) => return Ok(false),
            Ok(Err(e)) => return Err(replication_error(&e, &context.target)),
            Err(_) => {
                client.abort();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "starting to read replication slot \"{}\" took longer than \
                         store.connect_timeout ({})",
                        names.slot,
                        outboxkit_store_sql::format_duration(context.connect_timeout)
                    ),
                ));
            }
        }
        tracing::info!(slot = %names.slot, position = %Lsn::from_u64(confirmed), "reading the replication slot");
        self.reader = Some(Reader {
            client,
            backlog: Backlog::new(confirmed)
                .read_again_until(now)
                .resuming(resume.flatten())
                .carrying(carried.unwrap_or_default()),
            relations: HashMap::new(),
            malformed: Vec::new(),
            in_transaction: false,
            confirmed,
            parked,
            caught_up: false,
            resume: resume.map(|_| LeftResumePoint::default()),
            held_noted: (Instant::now(), 0),
            held_room,
        });
        Ok(true)
    }

    /// Read what the log has ready (without waiting, or up to `wait` for the first message),
    /// up to `max_unsettled` events or `max_unsettled_bytes` of payload held, in the middle of
    /// a transaction too. Ends the reader on a stream error.
    async fn pump(&mut self, wait: Duration) -> Result<()> {
        let (max, max_bytes) = (self.context.max_unsettled, self.context.max_unsettled_bytes);
        let mut waited = false;
        loop {
            let Some(reader) = self.reader.as_mut() else {
                return Ok(());
            };
            if reader.backlog.unsettled() >= max || reader.backlog.unsettled_bytes() >= max_bytes {
                return Ok(());
            }
            let budget = if waited || wait.is_zero() {
                Duration::ZERO
            } else {
                wait
            };
            let next = if budget.is_zero() {
                match tokio::time::timeout(Duration::ZERO, reader.client.recv()).await {
                    Ok(next) => next,
                    Err(_) if reader.in_transaction => {
                        // The rest of the transaction is on its way.
                        match tokio::time::timeout(self.context.session_timeout, reader.client.recv()).await {
                            Ok(next) => next,
                            Err(_) => return Err(self.lose_reader("no message within store.session_timeout in the middle of a transaction")),
                        }
                    }
                    Err(_) => return Ok(()),
                }
            } else {
                waited = true;
                match tokio::time::timeout(budget, reader.client.recv()).await {
                    Ok(next) => next,
                    Err(_) => return Ok(()),
                }
            };
            let event = match next {
                Ok(Some(event)) => event,
                Ok(None) => return Err(self.lose_reader("the server ended replication")),
                Err(e) => {
                    let error = replication_error(&e, &self.context.target);
                    return Err(self.lose_reader(&error.full_message()));
                }
            };
            self.apply(event).await?;
        }
    }

    async fn apply(&mut self, event: ReplicationEvent) -> Result<()> {
        let payload_type = self.payload_type;
        let context = Arc::clone(&self.context);
        let reader = reading(&mut self.reader, &context.names.slot)?;
        match event {
            ReplicationEvent::Begin { xid, final_lsn, .. } => {
                reader.in_transaction = true;
                reader.backlog.begin(xid, final_lsn.as_u64());
            }
            ReplicationEvent::XLogData { data, .. } => match decode(&data, &reader.relations) {
                Ok(Change::Relation(oid, relation)) => {
                    reader.relations.insert(oid, relation);
                }
                Ok(Change::Insert(oid, values)) => {
                    let ours = reader.relations.get(&oid).is_some_and(|r| {
                        r.schema == context.table.qualifier().unwrap_or("public")
                            && r.name == context.table.name()
                    });
                    if ours && context.names.style == CaptureStyle::Table {
                        match event_of_row(&values, payload_type) {
                            Ok(event) => {
                                reader.backlog.add(event);
                            }
                            Err(error) => {
                                let id = values
                                    .iter()
                                    .find(|(n, _, _)| n == "id")
                                    .and_then(|(_, v, _)| v.as_deref())
                                    .and_then(|b| <[u8; 8]>::try_from(b).ok())
                                    .map(i64::from_be_bytes);
                                reader.malformed.push(Malformed {
                                    id,
                                    content: Vec::new(),
                                    error: format!("the inserted row cannot be read: {error}"),
                                });
                            }
                        }
                    }
                }
                Ok(Change::Other) => {}
                Err(error) => {
                    return Err(
                        self.lose_reader(&format!("a message of the log cannot be read: {error}"))
                    );
                }
            },
            ReplicationEvent::Message {
                transactional,
                lsn,
                prefix,
                content,
            } => {
                if prefix == context.names.prefix && context.names.style == CaptureStyle::Message {
                    let id = lsn.as_u64() as i64;
                    let parsed = event_of_message(id, &content, payload_type);
                    match parsed {
                        Ok(event) if transactional => {
                            reader.backlog.add(event);
                        }
                        Ok(_) => {
                            // Outside any transaction: parked now, it is in none to settle.
                            let malformed = Malformed {
                                id: None,
                                content: content.to_vec(),
                                error: "a message written outside a transaction \
                                        (pg_logical_emit_message(false, ...)): write events with \
                                        the emit function inside the writer's transaction"
                                    .to_owned(),
                            };
                            self.park_malformed(std::slice::from_ref(&malformed))
                                .await?;
                        }
                        Err(error) => reader.malformed.push(Malformed {
                            id: None,
                            content: content.to_vec(),
                            error: format!("the message cannot be read: {error}"),
                        }),
                    }
                }
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                reader.in_transaction = false;
                let malformed = std::mem::take(&mut reader.malformed);
                if !malformed.is_empty() {
                    self.park_malformed(&malformed).await?;
                }
                let reader = reading(&mut self.reader, &context.names.slot)?;
                reader.backlog.commit(end_lsn.as_u64());
                self.confirm();
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                if !reader.in_transaction {
                    reader.backlog.idle_at(wal_end.as_u64());
                    self.confirm();
                }
            }
            ReplicationEvent::StoppedAt { .. } => {}
        }
        Ok(())
    }

    /// Tell the server how far the slot may move, and `status` what is held.
    fn confirm(&mut self) {
        let Some(reader) = self.reader.as_mut() else {
            return;
        };
        let confirmable = reader.backlog.confirmable();
        if confirmable > reader.confirmed {
            reader.client.update_applied_lsn(Lsn::from_u64(confirmable));
            reader.confirmed = confirmable;
        }
        let progress = &self.context.progress;
        progress.reading.store(true, Ordering::Relaxed);
        progress
            .unsettled
            .store(reader.backlog.unsettled(), Ordering::Relaxed);
        progress.oldest_micros.store(
            reader.backlog.oldest().map_or(0, |t| t.timestamp_micros()),
            Ordering::Relaxed,
        );
        // At once when the failed events change; while they stay, now and then.
        let failed = reader.backlog.failed();
        let (noted_at, noted) = reader.held_noted;
        if failed != noted || (failed > 0 && noted_at.elapsed() >= HELD_BACK_REFRESH) {
            *progress.held_lock() = reader.backlog.held_back(HELD_BACK_LISTED);
            reader.held_noted = (Instant::now(), failed);
        }
    }

    /// Before a graceful stop: wait until the server has been told the last confirmable
    /// position, which the client reports once per [`STATUS_INTERVAL`], so that whoever reads
    /// the slot next starts after what this session settled instead of publishing it again. A
    /// crash still leaves the last tenth of a second or so to be read again (at-least-once).
    async fn report_confirmed(&mut self) {
        self.confirm();
        let Some(reader) = self.reader.as_ref() else {
            return;
        };
        let metrics = reader.client.metrics();
        let deadline = Instant::now() + REPORT_WAIT;
        while metrics.last_applied_lsn().as_u64() < reader.confirmed
            && reader.client.is_running()
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stop reading (the slot is free again for whoever takes it next).
    fn stop_reader(&mut self) {
        if let Some(mut reader) = self.reader.take() {
            reader.client.stop();
            reader.client.abort();
        }
        // Whoever reads the slot next reads their events again, and marks them.
        self.unmarked.clear();
        self.fence.released(0);
        self.context
            .progress
            .reading
            .store(false, Ordering::Relaxed);
        self.context.progress.unsettled.store(0, Ordering::Relaxed);
        self.context
            .progress
            .oldest_micros
            .store(0, Ordering::Relaxed);
        *self.context.progress.held_lock() = HeldFigures::default();
    }

    /// The stream failed: stop reading; the events read and not settled are read again by
    /// whoever reads the slot next.
    fn lose_reader(&mut self, why: &str) -> Error {
        tracing::warn!(slot = %self.context.names.slot, "stopped reading the replication slot: {why}");
        self.stop_reader();
        Error::new(
            ErrorKind::LeaseLost,
            format!(
                "reading replication slot \"{}\" stopped: {why}",
                self.context.names.slot
            ),
        )
    }

    /// Keep what cannot be relayed as dead rows, so nothing is lost.
    async fn park_malformed(&mut self, malformed: &[Malformed]) -> Result<()> {
        for m in malformed {
            tracing::warn!(slot = %self.context.names.slot, error = %m.error, "an event cannot be relayed; parked as dead");
            match m.id {
                Some(id) => {
                    let failure = Failure {
                        id,
                        error: m.error.clone(),
                        retry_in: None,
                    };
                    self.record_rows(std::slice::from_ref(&failure)).await?;
                }
                None => {
                    let payload: Vec<u8> = match self.payload_type {
                        PayloadType::Binary => m.content.clone(),
                        PayloadType::Text => String::from_utf8_lossy(&m.content)
                            .into_owned()
                            .into_bytes(),
                        PayloadType::Json => serde_json::json!({
                            "content": String::from_utf8_lossy(&m.content)
                        })
                        .to_string()
                        .into_bytes(),
                    };
                    let event = OutboxEvent::new(
                        0,
                        "outbox-relay",
                        self.context.names.prefix.clone(),
                        "malformed-message",
                        payload,
                    );
                    let mut event = event;
                    event.payload_type = self.payload_type;
                    self.insert_dead(&event, &m.error).await?;
                }
            }
        }
        Ok(())
    }

    /// Table style: record failures on the rows, as polling does. A row the statement misses
    /// is looked for again, as marks do (see [`Self::mark_rows`]), until its transaction is
    /// visible, for up to [`UNMARKED_GRACE`]: failures are rare, and a rejected event's row is
    /// often recorded within a moment of its commit.
    async fn record_rows(&mut self, failures: &[Failure]) -> Result<()> {
        let record = &self.context.sql.record_failures;
        let started = Instant::now();
        let mut left: Vec<Failure> = failures.to_vec();
        let mut xids: Vec<i64> = Vec::new();
        loop {
            let statement = returning_found(record, "o.id", !xids.is_empty(), 4);
            let returned = self
                .fence
                .run("recording failures", async |conn| {
                    let mut arguments = crate::session::failure_arguments(&left)?;
                    if !xids.is_empty() {
                        arguments.add(&xids).map_err(sqlx::Error::Encode)?;
                    }
                    sqlx::query_as_with(&statement, arguments)
                        .fetch_all(conn)
                        .await
                })
                .await?;
            let found = Found::new(returned);
            left.retain(|f| !found.has(f.id) && !found.gone(f.id, self.xid_of(f.id)));
            if left.is_empty() || started.elapsed() >= UNMARKED_GRACE {
                return Ok(());
            }
            xids = self.xids_of(left.iter().map(|f| f.id));
            tokio::time::sleep(UNMARKED_RETRY).await;
        }
    }

    /// Message style: a dead event becomes a dead row of the outbox table (once: a second
    /// reading of the same message after a crash adds nothing).
    async fn insert_dead(&mut self, event: &OutboxEvent, error: &str) -> Result<()> {
        let payload = match self.payload_type {
            PayloadType::Json => "$5::text::jsonb",
            PayloadType::Text => "$5::text",
            PayloadType::Binary => "$5::bytea",
        };
        let statement = Statement::from(format!(
            "INSERT INTO {} (event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
             destination, created_at, attempts, last_error, dead_at) \
             VALUES ($1, $2, $3, $4, {payload}, $6::text::jsonb, $7, $8, $9, $10, now()) \
             ON CONFLICT (event_id) DO NOTHING",
            self.context.table.quoted()
        ));
        let headers = serde_json::to_string(&event.headers).unwrap_or_else(|_| "{}".to_owned());
        let payload_type = self.payload_type;
        let error = truncate_error(error).to_owned();
        self.fence
            .run("parking a dead event", async |conn| {
                let query = sqlx::query(&statement)
                    .bind(event.event_id)
                    .bind(&event.aggregate_type)
                    .bind(&event.aggregate_id)
                    .bind(&event.event_type);
                let query = match payload_type {
                    PayloadType::Binary => query.bind(event.payload.clone()),
                    _ => query.bind(String::from_utf8_lossy(&event.payload).into_owned()),
                };
                query
                    .bind(headers)
                    .bind(event.destination.as_deref())
                    .bind(event.created_at)
                    .bind(event.attempts + 1)
                    .bind(error)
                    .execute(conn)
                    .await
            })
            .await?;
        Ok(())
    }
}

/// SQLSTATE `object_in_use`: the slot is being read by another session (`replication slot
/// "…" is active for PID …`).
const OBJECT_IN_USE: &str = "55006";

/// The SQLSTATE of an error the server sent on the replication connection. The client gives
/// the server's message with the code after it (`… (SQLSTATE 55006)`), and the message is in
/// the language of the server's `lc_messages` (`Replikations-Slot »…« ist aktiv für PID …`):
/// the code is what to decide by.
fn server_code(error: &pgwire_replication::PgWireError) -> Option<&str> {
    let pgwire_replication::PgWireError::Server(message) = error else {
        return None;
    };
    let (_, code) = message.strip_suffix(')')?.rsplit_once("(SQLSTATE ")?;
    (code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(code)
}

/// The relay's error for an error of the replication connection.
fn replication_error(error: &pgwire_replication::PgWireError, target: &Target) -> Error {
    use pgwire_replication::PgWireError as E;
    let endpoint = target.endpoint.as_deref().unwrap_or("the server");
    let credentials = ": check store.url's user and password, and that pg_hba.conf allows \
                       replication connections for it";
    let (kind, hint) = match (error, server_code(error)) {
        (E::Io(_) | E::Task(_), _) => (ErrorKind::Connection, ""),
        (E::Auth(_), _) => (ErrorKind::Unauthorized, credentials),
        (E::Tls(_), _) => (
            ErrorKind::Connection,
            ": check store.url's sslmode and sslrootcert",
        ),
        // undefined_object (the slot or the publication), invalid_catalog_name (the database).
        (_, Some("42704" | "3D000")) => (ErrorKind::Schema, ""),
        // No pg_hba.conf entry, a wrong password, no REPLICATION attribute.
        (_, Some(code)) if code.starts_with("28") => (ErrorKind::Unauthorized, credentials),
        (_, Some("42501")) => (
            ErrorKind::Unauthorized,
            ": the user of store.url needs the REPLICATION attribute (ALTER ROLE … REPLICATION)",
        ),
        _ => (ErrorKind::Connection, ""),
    };
    Error::new(
        kind,
        format!("replication connection to {endpoint}: {error}{hint}"),
    )
}

#[async_trait]
impl ShardSession for LogicalSession {
    fn shard_count(&self) -> u32 {
        1
    }

    fn owned(&self) -> &BTreeSet<i32> {
        self.fence.owned()
    }

    fn claim_waits(&self) -> bool {
        true
    }

    /// Sessions of this slot, and whether the slot is read. A reader that stopped reporting for
    /// `takeover_after` is ended, so that this relay can take the slot over.
    async fn cluster(&mut self) -> Result<ClusterView> {
        let slot = self.context.names.slot.clone();
        let members = members_name(&slot);
        let (live, lag) = self
            .fence
            .run("reading the relays of the slot", async |conn| {
                let live: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(&members)
                .fetch_one(&mut *conn)
                .await?;
                Ok((live, slot_lag(&mut *conn, &slot).await?))
            })
            .await?;
        if let Some(reader) = self.reader.as_ref() {
            if reader.client.is_running() {
                return Ok(ClusterView {
                    live_relays: live.max(1) as u32,
                    locked: BTreeSet::from([0]),
                });
            }
            return Err(self.lose_reader("the replication connection ended"));
        }
        let mut locked = BTreeSet::new();
        if let Some(lag) = lag.filter(|l| l.active) {
            let silent = lag
                .reply_age_secs
                .is_some_and(|age| age > self.context.takeover_after.as_secs_f64());
            match lag.active_pid {
                Some(pid) if silent => {
                    tracing::warn!(
                        slot = %slot,
                        pid,
                        silent_for_secs = lag.reply_age_secs.unwrap_or_default(),
                        "the reader of the replication slot stopped reporting for longer than store.logical.takeover_after: ending its connection to take the slot over"
                    );
                    self.fence
                        .run("ending a silent reader", async |conn| {
                            sqlx::query("SELECT pg_terminate_backend($1)")
                                .bind(pid)
                                .execute(conn)
                                .await
                        })
                        .await?;
                }
                _ => {
                    locked.insert(0);
                }
            }
        }
        Ok(ClusterView {
            live_relays: live.max(1) as u32,
            locked,
        })
    }

    async fn try_acquire(&mut self, shard: i32) -> Result<bool> {
        self.fence.check_shard(shard)?;
        if self.reader.is_some() {
            return Ok(true);
        }
        if self.start_reader().await? {
            self.fence.acquired(0);
            return Ok(true);
        }
        Ok(false)
    }

    async fn release(&mut self, shard: i32) -> Result<()> {
        self.fence.check_shard(shard)?;
        self.stop_reader();
        Ok(())
    }

    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>> {
        self.fence.ensure_live()?;
        if request.dead_holds_aggregate {
            return Err(Error::config(
                "relay.on_dead = \"hold\" is not available with store.capture = \"logical\"",
            )
            .permanent());
        }
        if self.reader.is_none() {
            return Ok(Vec::new());
        }
        if self.publication_checked.elapsed() >= PUBLICATION_CHECK {
            self.check_published().await?;
        }
        if !self.unmarked.is_empty() && self.unmarked_tried.elapsed() >= UNMARKED_RETRY {
            // Rows a mark missed, marked as the engine asked then.
            self.mark_rows(&[], self.unmarked_mode).await?;
        }
        let excluded: HashSet<i64> = request.exclude_ids.iter().copied().collect();
        let started = Instant::now();
        loop {
            self.pump(Duration::ZERO).await?;
            let reader = reading(&mut self.reader, &self.context.names.slot)?;
            let mut batch = reader
                .backlog
                .claim(request.limit, &excluded, Instant::now());
            if batch.is_empty() {
                self.pump(IDLE_WAIT).await?;
                let reader = reading(&mut self.reader, &self.context.names.slot)?;
                batch = reader
                    .backlog
                    .claim(request.limit, &excluded, Instant::now());
            }
            if !batch.is_empty() {
                let reader = self.reader.as_ref();
                if reader.is_some_and(|r| r.backlog.holds_read_again()) {
                    match self.context.names.style {
                        CaptureStyle::Table => self.drop_gone(&mut batch).await?,
                        CaptureStyle::Message if reader.is_some_and(|r| !r.parked.is_empty()) => {
                            self.drop_parked(&mut batch).await?
                        }
                        CaptureStyle::Message => {}
                    }
                }
                if batch.is_empty() && started.elapsed() < IDLE_WAIT {
                    // All of it was handled already: on to what follows.
                    continue;
                }
            }
            if let Some(reader) = self.reader.as_mut() {
                reader.caught_up();
            }
            self.leave_resume_point(false).await?;
            self.confirm();
            return Ok(batch);
        }
    }

    async fn mark_published(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        self.fence.ensure_live()?;
        if ids.is_empty() {
            return Ok(());
        }
        if self.context.names.style == CaptureStyle::Table {
            self.mark_rows(ids, mode).await?;
        } else if let Some(reader) = self.reader.as_mut() {
            reader.backlog.settle(ids);
        }
        self.confirm();
        Ok(())
    }

    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()> {
        self.fence.ensure_live()?;
        if failures.is_empty() {
            return Ok(());
        }
        if self.context.names.style == CaptureStyle::Table {
            self.record_rows(failures).await?;
        } else {
            for failure in failures.iter().filter(|f| f.retry_in.is_none()) {
                let event = self
                    .reader
                    .as_ref()
                    .and_then(|r| r.backlog.get(failure.id))
                    .cloned();
                if let Some(event) = event {
                    self.insert_dead(&event, &failure.error).await?;
                }
            }
        }
        let now = Instant::now();
        if let Some(reader) = self.reader.as_mut() {
            // What they hold back changed (attempts, next tries): noted at the next confirm.
            reader.held_noted.1 = usize::MAX;
            let mut dead = Vec::new();
            for failure in failures {
                match failure.retry_in {
                    Some(delay) => {
                        let error = truncate_error(&failure.error);
                        reader.backlog.retry(failure.id, delay, now, error)
                    }
                    None => dead.push(failure.id),
                }
            }
            reader.backlog.settle(&dead);
        }
        self.confirm();
        Ok(())
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        // A stop inside a large transaction: the next reader starts where this one got to.
        if let Err(e) = self.leave_resume_point(true).await {
            tracing::debug!(error = %e, "could not leave where this reader got to");
        }
        self.report_confirmed().await;
        if let Err(e) = self.leave_held_back().await {
            tracing::debug!(error = %e, "could not leave what the failed events hold back");
        }
        self.stop_reader();
        let fence = self.fence;
        fence.close(Ok(())).await
    }
}

#[cfg(test)]
mod tests {
    use sqlx::{Connection, PgConnection};

    use outboxkit_core::ErrorKind;
    use pgwire_replication::PgWireError;

    use super::{
        parked_among, reading, replication_error, server_code, visible_xids, Target, OBJECT_IN_USE,
    };

    /// A session whose reader is gone fails its call (its shard lost: the engine opens
    /// another), where it used to rely on an `expect`.
    #[test]
    fn a_session_without_its_reader_fails_instead_of_panicking() {
        let Err(e) = reading(&mut None, "outbox_slot") else {
            panic!("no reader, yet a reader");
        };
        assert_eq!(e.kind(), ErrorKind::LeaseLost);
        assert_eq!(
            e.message(),
            "replication slot \"outbox_slot\" is no longer read by this session"
        );
    }

    /// Events read again are checked against the dead rows one by one: with the same
    /// `event_id`, only the parked event itself (same `created_at`, transaction visible) is
    /// dropped, not a writer's new event nor a `dead retry` whose transaction is not visible yet.
    #[tokio::test]
    async fn only_the_parked_event_itself_is_dropped() {
        let mut conn = connect().await;
        let mut writer = connect().await;
        sqlx::query(
            "CREATE TEMP TABLE parked (id bigserial, event_id uuid, created_at timestamptz, \
             dead_at timestamptz)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let (x, y) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
        let at: chrono::DateTime<chrono::Utc> = "2026-12-06T08:00:00.123456Z".parse().unwrap();
        let later = at + chrono::Duration::seconds(5);
        sqlx::query("INSERT INTO parked (event_id, created_at, dead_at) VALUES ($1, $2, now())")
            .bind(x)
            .bind(at)
            .execute(&mut conn)
            .await
            .unwrap();
        let mut committed = writer.begin().await.unwrap();
        let (_, done) = xid(&mut committed).await;
        committed.commit().await.unwrap();
        let mut open = writer.begin().await.unwrap();
        let (_, in_progress) = xid(&mut open).await;

        // 1: the parked event; 2: a new event of the writer's with its event_id; 3: its
        // `dead retry`, not visible yet; 4: another event.
        let dropped: Vec<i64> = sqlx::query_scalar(parked_among("parked"))
            .bind([1_i64, 2, 3, 4])
            .bind([x, x, x, y])
            .bind([at, later, at, at])
            .bind([done, done, in_progress, done])
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert_eq!(dropped, [1]);
        open.rollback().await.unwrap();
    }

    /// The server's errors are told apart by their SQLSTATE, never by their text: a server
    /// with `lc_messages = 'de_DE.UTF-8'` writes them in German (the messages below are what
    /// PostgreSQL 15 sends, in both languages: its German catalogue's texts).
    #[test]
    fn server_errors_are_told_apart_by_their_code_in_any_language() {
        let server = |m: &str| PgWireError::Server(m.to_owned());
        for busy in [
            "replication slot \"outbox_x\" is active for PID 4242 (SQLSTATE 55006)",
            "Replikations-Slot »outbox_x« ist aktiv für PID 15156 (SQLSTATE 55006)",
        ] {
            assert_eq!(server_code(&server(busy)), Some(OBJECT_IN_USE), "{busy}");
        }
        assert_eq!(server_code(&server("no code given")), None);
        assert_eq!(server_code(&server("odd (SQLSTATE 5500)")), None);
        assert_eq!(
            server_code(&PgWireError::Protocol("x (SQLSTATE 55006)".into())),
            None
        );

        let target = Target {
            endpoint: Some("db:5432".into()),
            ..Target::default()
        };
        let kind = |m: &str| replication_error(&server(m), &target).kind();
        for missing in [
            "replication slot \"nope\" does not exist (SQLSTATE 42704)",
            "Replikations-Slot »nope« existiert nicht (SQLSTATE 42704)",
            "Publikation »outbox_x« existiert nicht (SQLSTATE 42704)",
        ] {
            assert_eq!(kind(missing), ErrorKind::Schema, "{missing}");
        }
        let refused = replication_error(
            &server(
                "kein pg_hba.conf-Eintrag für Replikationsverbindung von Host »10.0.0.7«, \
                 Benutzer »relay«, keine Verschlüsselung (SQLSTATE 28000)",
            ),
            &target,
        );
        assert_eq!(refused.kind(), ErrorKind::Unauthorized);
        assert!(
            refused.message().contains("replication connections"),
            "{refused}"
        );
        let no_role = replication_error(
            &server("must be superuser or replication role to start walsender (SQLSTATE 42501)"),
            &target,
        );
        assert_eq!(no_role.kind(), ErrorKind::Unauthorized);
        assert!(
            no_role.message().contains("REPLICATION attribute"),
            "{no_role}"
        );
        assert_eq!(
            kind("Replikations-Slot »s« ist aktiv für PID 1 (SQLSTATE 55006)"),
            ErrorKind::Connection
        );
    }

    async fn connect() -> PgConnection {
        let url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        PgConnection::connect(&url)
            .await
            .expect("PostgreSQL is required for this test (OUTBOX_TEST_POSTGRES_URL)")
    }

    /// A transaction's 64-bit id and its low 32 bits, as the log's `Begin` gives them.
    async fn xid(conn: &mut PgConnection) -> (i64, i64) {
        let full: i64 = sqlx::query_scalar("SELECT pg_current_xact_id()::text::int8")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        (full, full & 0xFFFF_FFFF)
    }

    async fn visible(conn: &mut PgConnection, xids: &[i64]) -> Vec<i64> {
        let mut seen: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(visible_xids(1)))
            .bind(xids)
            .fetch_all(conn)
            .await
            .unwrap();
        seen.sort();
        seen
    }

    /// The test a mark uses to tell a row not visible yet from a row gone: committed
    /// transactions are seen, one in progress or not begun yet is not, whatever the epoch.
    #[tokio::test]
    async fn the_snapshot_sees_committed_transactions_only() {
        let mut conn = connect().await;
        let mut writer = connect().await;

        let mut committed = writer.begin().await.unwrap();
        let (_, done) = xid(&mut committed).await;
        committed.commit().await.unwrap();

        let mut open = writer.begin().await.unwrap();
        let (full, in_progress) = xid(&mut open).await;
        // Not begun yet: ids ahead of the open one's, one of them past the next wrap of 2^32.
        // (Far enough ahead that other tests' transactions meanwhile do not reach them.)
        let future = (full + (1 << 20)) & 0xFFFF_FFFF;
        let half_way_round = (full + (1 << 31) - (1 << 20)) & 0xFFFF_FFFF;

        let mut all = vec![done, in_progress, future, half_way_round];
        if full < 1 << 31 {
            // On a server younger than 2^31 transactions: an id that would widen to before the
            // first one.
            all.push(0xFFFF_FFFB);
        }
        assert_eq!(visible(&mut conn, &all).await, [done]);
        open.commit().await.unwrap();
        let mut expected = vec![done, in_progress];
        expected.sort();
        assert_eq!(visible(&mut conn, &all).await, expected);
    }
}
