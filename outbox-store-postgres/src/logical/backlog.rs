//! The events read from the log and not yet settled, in commit order, and the log position the
//! slot may be confirmed to: the end of the last transaction whose events, and every earlier
//! transaction's, are all settled (acknowledged by the broker, or recorded as dead).
//!
//! A transaction's events join the backlog as they are read, before its end: the server sends
//! a transaction only once it committed, so they can be published at once, and a transaction
//! of a million events need not be held whole. The slot moves past it only once its end was
//! read and all its events are settled.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use outboxkit_core::{HeldBack, OutboxEvent};

#[derive(Debug)]
struct Entry {
    event: OutboxEvent,
    /// The transaction's sequence number.
    txn: u64,
    /// `Some` once it failed: not claimed again before its time, and its aggregate's later
    /// events wait behind it until it is settled.
    retry: Option<Box<Retry>>,
    /// Acknowledged by the broker, not settled yet (its row is still to be marked): never
    /// claimed again, holds nothing back but the slot.
    acked: bool,
    /// Its transaction committed before this reader started (see
    /// [`Backlog::read_again_until`]).
    read_again: bool,
}

/// A failed event's next try, and what `status` shows of it.
#[derive(Debug)]
struct Retry {
    at: Instant,
    /// `at` by the wall clock.
    next_attempt_at: chrono::DateTime<chrono::Utc>,
    last_error: String,
}

impl Retry {
    /// The retry a failure the last reader recorded (`held`) left: its next try, now if none.
    fn as_left(held: HeldBack) -> Box<Self> {
        let now = chrono::Utc::now();
        let next_attempt_at = held.next_attempt_at.unwrap_or(now);
        // A century at most: an `Instant` that far ahead may not exist.
        let wait = (next_attempt_at - now)
            .to_std()
            .unwrap_or(Duration::ZERO)
            .min(Duration::from_secs(100 * 365 * 24 * 3600));
        Box::new(Self {
            at: Instant::now() + wait,
            next_attempt_at,
            last_error: held.last_error.unwrap_or_default(),
        })
    }
}

/// What the failed events hold back, as polling's `status` counts it from the table: events
/// that failed and are not settled, the aggregates they hold back, and the first
/// [`HeldFigures::listed`] of those (by id) with how many events wait behind each.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HeldFigures {
    pub retrying: i64,
    pub aggregates: i64,
    pub listed: Vec<HeldBack>,
}

#[derive(Debug)]
struct Txn {
    /// Where it ends in the log; `None` while its end is not read yet.
    end_lsn: Option<u64>,
    unsettled: usize,
    /// The server's (32-bit) transaction id.
    xid: u32,
    /// Where its commit stands in the log (from its `Begin`): the transaction's identity.
    final_lsn: u64,
    /// The id of its last event added.
    last_id: i64,
}

/// See the module's documentation.
#[derive(Debug, Default)]
pub(crate) struct Backlog {
    /// Settled entries are `None` until the front is trimmed.
    entries: VecDeque<Option<Entry>>,
    /// The absolute position of `entries[0]`.
    base: u64,
    /// Event id → absolute position.
    positions: HashMap<i64, u64>,
    txns: VecDeque<Txn>,
    /// Sequence number of `txns[0]`.
    first_txn: u64,
    unsettled: usize,
    /// The payload bytes of the unsettled events.
    unsettled_bytes: usize,
    /// Where the slot may be confirmed to.
    confirmable: u64,
    /// The transaction id of the transaction being read (from its `Begin`).
    reading_xid: u32,
    /// Where the log stood when this reader started: the events of a transaction committed
    /// before it are read again, and the last reader may have handled them.
    read_again_until: u64,
    /// Whether the transaction being read committed before `read_again_until`.
    reading_again: bool,
    /// Unsettled events read again.
    read_again: usize,
    /// Events read again so far.
    read_again_read: u64,
    /// Events read again that the last reader had handled: skipped at once (see
    /// [`Self::resuming`]) or found so when claimed ([`Self::skip`]).
    read_again_skipped: u64,
    /// Whether the log was read past `read_again_until`: no more events are read again.
    past_read_again: bool,
    /// The transaction being read (the `final_lsn` of its `Begin`).
    reading_final_lsn: u64,
    /// Message style: where the last reader got to inside a transaction it did not finish
    /// (see [`Self::resuming`]).
    resume: Option<ResumePoint>,
    /// In the transaction being read: events with a lower id were settled by the last reader.
    skip_below: Option<i64>,
    /// Unsettled events that failed (acknowledged since or not): with none, nothing is held
    /// back and [`Self::held_back`] need not look.
    failed: usize,
    /// Message style: the failed events the last reader listed, by id (see [`Self::carrying`]),
    /// until read again.
    carried: HashMap<i64, HeldBack>,
}

/// Where a reader got to inside the oldest transaction it has not settled whole: that
/// transaction (the `final_lsn` of its `Begin`), and the id below which its events are all
/// settled. Message style only, where an event's id is its message's position in the log, so
/// ids grow in the order the log holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResumePoint {
    pub final_lsn: u64,
    pub settled_below: i64,
}

impl Backlog {
    /// Start from the slot's confirmed position.
    pub(crate) fn new(confirmed: u64) -> Self {
        Self {
            confirmable: confirmed,
            ..Self::default()
        }
    }

    /// Events read and not settled.
    pub(crate) fn unsettled(&self) -> usize {
        self.unsettled
    }

    /// The payload bytes of the events read and not settled.
    pub(crate) fn unsettled_bytes(&self) -> usize {
        self.unsettled_bytes
    }

    /// The position the slot may be confirmed to.
    pub(crate) fn confirmable(&self) -> u64 {
        self.confirmable
    }

    /// When the first unsettled event in commit order was written (database clock): the
    /// oldest, give or take the moments between writes and their commits.
    pub(crate) fn oldest(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        // Settled entries are trimmed from the front: the first one is unsettled.
        self.entries.front()?.as_ref().map(|e| e.event.created_at)
    }

    /// Where the log stands as the reader starts (the server's insert position): the events
    /// of every transaction committed before it are read again (see [`Self::is_read_again`]).
    pub(crate) fn read_again_until(mut self, lsn: u64) -> Self {
        self.read_again_until = lsn;
        self
    }

    /// Message style: the last reader's [`ResumePoint`]. The events of that transaction below
    /// it are not added again: it settled them (published, or parked as dead).
    pub(crate) fn resuming(mut self, resume: Option<ResumePoint>) -> Self {
        self.resume = resume;
        self
    }

    /// Message style: the failed events the last reader listed for `status` (each held-back
    /// aggregate's first, up to [`HELD_BACK_LISTED`](super::session::HELD_BACK_LISTED)). Read
    /// again, each keeps its attempts, its next try and its last error instead of starting from
    /// none: `relay.max_attempts` counts across readers, as a row's `attempts` does with
    /// polling. An event's id is its position in the log, the same for every reader; one whose
    /// aggregate differs is not taken for it. Until read again they count as failed and are
    /// listed by [`Self::held_back`]. Those not read again by the time every transaction
    /// committed before this reader started was read (see [`Self::read_again_until`]) were
    /// settled by the last reader after it last reported: they are forgotten then. (Positions
    /// alone cannot tell that sooner: transactions come in the order they committed, and a
    /// message of one may stand before a message of another that committed earlier.)
    pub(crate) fn carrying(mut self, listed: Vec<HeldBack>) -> Self {
        self.carried = listed.into_iter().map(|h| (h.id, h)).collect();
        self
    }

    /// Once past what is read again, the carried events not read again were settled.
    fn forget_carried_once_past(&mut self) {
        if self.past_read_again && !self.carried.is_empty() {
            self.carried.clear();
        }
    }

    /// Message style: this reader's [`ResumePoint`], for the next reader. `None` when nothing
    /// of ours is unsettled.
    pub(crate) fn resume_point(&self) -> Option<ResumePoint> {
        let txn = self.txns.front().filter(|t| t.last_id != i64::MIN)?;
        let settled_below = match self.entries.front().and_then(Option::as_ref) {
            Some(first) if first.txn == self.first_txn => first.event.id,
            // All of it settled; it stays only because its end is not read yet.
            _ => txn.last_id.saturating_add(1),
        };
        Some(ResumePoint {
            final_lsn: txn.final_lsn,
            settled_below,
        })
    }

    /// Whether the unsettled event `id` is read again: its transaction committed before the
    /// reader started, so the last reader may have published it or parked it as dead.
    pub(crate) fn is_read_again(&self, id: i64) -> bool {
        self.entry(id).is_some_and(|e| e.read_again)
    }

    /// Whether any unsettled event is read again.
    pub(crate) fn holds_read_again(&self) -> bool {
        self.read_again > 0
    }

    /// Once every event read again is read and settled: how many there were. `None` before,
    /// and when the reader started with nothing to read again.
    pub(crate) fn read_again_done(&self) -> Option<u64> {
        (self.past_read_again && self.read_again == 0 && self.read_again_read > 0)
            .then_some(self.read_again_read)
    }

    /// How many events read again were skipped as handled by the last reader.
    pub(crate) fn read_again_skipped(&self) -> u64 {
        self.read_again_skipped
    }

    /// Events read again that the last reader had handled: settled, never handed out.
    pub(crate) fn skip(&mut self, ids: &[i64]) {
        self.settle(ids);
        self.read_again_skipped += ids.len() as u64;
    }

    /// A transaction begins: `xid` is the server's id for it, `final_lsn` where its commit
    /// stands in the log. (A commit at the very position the reader started at may be a new
    /// one: it is taken as read again, which costs one check and skips nothing it must not.)
    pub(crate) fn begin(&mut self, xid: u32, final_lsn: u64) {
        self.reading_xid = xid;
        self.reading_final_lsn = final_lsn;
        self.reading_again = final_lsn <= self.read_again_until;
        self.past_read_again |= !self.reading_again;
        self.forget_carried_once_past();
        self.skip_below = self
            .resume
            .filter(|r| r.final_lsn == final_lsn)
            .map(|r| r.settled_below);
    }

    /// The next event of the transaction being read, in the order written. `false`: not
    /// added, the last reader settled it (see [`Self::resuming`]).
    pub(crate) fn add(&mut self, mut event: OutboxEvent) -> bool {
        self.read_again_read += u64::from(self.reading_again);
        if self.skip_below.is_some_and(|below| event.id < below) {
            self.read_again_skipped += 1;
            return false;
        }
        let retry = self.carry(&mut event);
        self.failed += usize::from(retry.is_some());
        if self.txns.back().is_none_or(|t| t.end_lsn.is_some()) {
            self.txns.push_back(Txn {
                end_lsn: None,
                unsettled: 0,
                xid: self.reading_xid,
                final_lsn: self.reading_final_lsn,
                last_id: i64::MIN,
            });
        }
        let txn = self.first_txn + self.txns.len() as u64 - 1;
        if let Some(open) = self.txns.back_mut() {
            open.unsettled += 1;
            open.last_id = event.id;
        }
        let position = self.base + self.entries.len() as u64;
        self.positions.insert(event.id, position);
        self.unsettled_bytes += event.payload.len();
        self.unsettled += 1;
        self.read_again += usize::from(self.reading_again);
        self.entries.push_back(Some(Entry {
            event,
            txn,
            retry,
            acked: false,
            read_again: self.reading_again,
        }));
        true
    }

    /// `event`'s retry as the last reader left it (see [`Self::carrying`]), its attempts set.
    fn carry(&mut self, event: &mut OutboxEvent) -> Option<Box<Retry>> {
        if self.carried.is_empty() {
            return None;
        }
        let carried = self.carried.remove(&event.id).filter(|c| {
            c.aggregate_id == event.aggregate_id && c.aggregate_type == event.aggregate_type
        })?;
        event.attempts = carried.attempts;
        Some(Retry::as_left(carried))
    }

    /// Table style: the row of the unsettled event `id`, read again, records failures the last
    /// reader recorded (`held`: its attempts, next try and last error). The event keeps them,
    /// as a carried one does in message style (see [`Self::carrying`]), unless it failed again
    /// since it was read. See [`Self::recheck`].
    pub(crate) fn recorded_failures(&mut self, held: HeldBack) {
        let Some(entry) = self.entry_mut(held.id) else {
            return;
        };
        if entry.retry.is_some() {
            return;
        }
        entry.event.attempts = held.attempts;
        entry.retry = Some(Retry::as_left(held));
        self.failed += 1;
    }

    /// `batch`, claimed in commit order, as [`Self::claim`] hands it out now that some of its
    /// events may have been found failed ([`Self::recorded_failures`]): an event waiting for
    /// its next try and the events after a failed one of their aggregate are taken out (they
    /// stay unsettled, for a later claim), the others keep their attempts.
    pub(crate) fn recheck(&self, batch: &mut Vec<OutboxEvent>, now: Instant) {
        let mut held: HashSet<String> = HashSet::new();
        batch.retain_mut(|event| {
            if held.contains(&event.aggregate_id) {
                return false;
            }
            let Some(entry) = self.entry(event.id) else {
                return true;
            };
            let Some(retry) = &entry.retry else {
                return true;
            };
            held.insert(event.aggregate_id.clone());
            event.attempts = entry.event.attempts;
            retry.at <= now
        });
    }

    /// The transaction being read ends at `end_lsn` (having added no event when it wrote
    /// nothing of ours).
    pub(crate) fn commit(&mut self, end_lsn: u64) {
        match self.txns.back_mut() {
            Some(open) if open.end_lsn.is_none() => open.end_lsn = Some(end_lsn),
            None => self.confirmable = self.confirmable.max(end_lsn),
            Some(_) => self.txns.push_back(Txn {
                end_lsn: Some(end_lsn),
                unsettled: 0,
                xid: self.reading_xid,
                final_lsn: self.reading_final_lsn,
                last_id: i64::MIN,
            }),
        }
        self.trim();
    }

    /// A whole transaction: its events, then its end.
    #[cfg(test)]
    fn push(&mut self, events: Vec<OutboxEvent>, end_lsn: u64) {
        for event in events {
            self.add(event);
        }
        self.commit(end_lsn);
    }

    /// The server reports it has sent everything up to `wal_end`: with nothing unsettled, the
    /// slot may be confirmed there (so that other databases' traffic does not hold the log).
    /// (The server sends the position it has processed the log to: past `read_again_until`,
    /// every transaction committed before it was read.)
    pub(crate) fn idle_at(&mut self, wal_end: u64) {
        if self.txns.is_empty() {
            self.confirmable = self.confirmable.max(wal_end);
            self.past_read_again |= wal_end >= self.read_again_until;
            self.forget_carried_once_past();
        }
    }

    /// Up to `limit` events to publish, in commit order: not `excluded` (in flight), not
    /// waiting for a retry, and not behind an earlier event of their aggregate that failed and
    /// is not settled.
    pub(crate) fn claim(
        &self,
        limit: usize,
        excluded: &HashSet<i64>,
        now: Instant,
    ) -> Vec<OutboxEvent> {
        let mut held: HashSet<&str> = HashSet::new();
        let mut out = Vec::new();
        for entry in self.entries.iter().flatten() {
            if out.len() >= limit {
                break;
            }
            if entry.acked {
                continue;
            }
            let aggregate = entry.event.aggregate_id.as_str();
            if held.contains(aggregate) {
                continue;
            }
            if let Some(retry) = &entry.retry {
                held.insert(aggregate);
                if retry.at > now {
                    continue;
                }
            }
            if !excluded.contains(&entry.event.id) {
                out.push(entry.event.clone());
            }
        }
        out
    }

    /// `id` failed with `error`: try again after `delay`; its aggregate waits.
    pub(crate) fn retry(&mut self, id: i64, delay: Duration, now: Instant, error: &str) {
        let Some(entry) = self.entry_mut(id) else {
            return;
        };
        let first = entry.retry.is_none();
        entry.event.attempts += 1;
        entry.retry = Some(Box::new(Retry {
            at: now + delay,
            next_attempt_at: chrono::Duration::from_std(delay)
                .ok()
                .and_then(|d| chrono::Utc::now().checked_add_signed(d))
                .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
            last_error: error.to_owned(),
        }));
        self.failed += usize::from(first);
    }

    /// Unsettled events that failed, those the last reader listed and this one did not read
    /// yet among them.
    pub(crate) fn failed(&self) -> usize {
        self.failed + self.carried.len()
    }

    /// What the failed events hold back, listing at most `limit` held-back aggregates: each
    /// one's first failed event, how many unsettled events of it come after that one, in id
    /// order (as polling's `status` lists rows that wait for a retry).
    pub(crate) fn held_back(&self, limit: usize) -> HeldFigures {
        let mut figures = HeldFigures::default();
        if self.failed() == 0 {
            return figures;
        }
        // Each held-back aggregate's first failed entry, and how many wait behind it.
        let mut held: HashMap<&str, (&Entry, i64)> = HashMap::new();
        for entry in self.entries.iter().flatten().filter(|e| !e.acked) {
            let aggregate = entry.event.aggregate_id.as_str();
            figures.retrying += i64::from(entry.retry.is_some());
            if let Some((_, waiting)) = held.get_mut(aggregate) {
                *waiting += 1;
            } else if entry.retry.is_some() {
                held.insert(aggregate, (entry, 0));
            }
        }
        // The last reader's failed events not read again yet (see `carrying`): nothing read
        // waits behind them. (One per aggregate: the last reader listed each one's first.)
        let carried: Vec<&HeldBack> = self.carried.values().collect();
        figures.retrying += carried.len() as i64;
        let carried: Vec<&HeldBack> = carried
            .into_iter()
            .filter(|h| !held.contains_key(h.aggregate_id.as_str()))
            .collect();
        figures.aggregates = (held.len() + carried.len()) as i64;
        let mut first: Vec<(&Entry, i64)> = held.into_values().collect();
        first.sort_unstable_by_key(|(entry, _)| entry.event.id);
        let listed = first
            .into_iter()
            .take(limit)
            .filter_map(|(entry, waiting)| {
                let (event, retry) = (&entry.event, entry.retry.as_deref()?);
                Some(HeldBack {
                    aggregate_type: event.aggregate_type.clone(),
                    aggregate_id: event.aggregate_id.clone(),
                    id: event.id,
                    attempts: event.attempts,
                    next_attempt_at: Some(retry.next_attempt_at),
                    last_error: Some(retry.last_error.clone()),
                    waiting_behind: waiting,
                })
            });
        let carried = carried.into_iter().map(|h| HeldBack {
            waiting_behind: 0,
            ..h.clone()
        });
        let mut listed: Vec<HeldBack> = listed.chain(carried).collect();
        listed.sort_unstable_by_key(|h| h.id);
        listed.truncate(limit);
        figures.listed = listed;
        figures
    }

    /// `id` was acknowledged by the broker but cannot be settled yet: never hand it out again.
    pub(crate) fn acknowledge(&mut self, id: i64) {
        if let Some(entry) = self.entry_mut(id) {
            entry.acked = true;
        }
    }

    /// The event `id`, if unsettled.
    pub(crate) fn get(&self, id: i64) -> Option<&OutboxEvent> {
        self.entry(id).map(|e| &e.event)
    }

    /// The server's id of the transaction that wrote the unsettled event `id`.
    pub(crate) fn xid_of(&self, id: i64) -> Option<u32> {
        let entry = self.entry(id)?;
        Some(self.txns[(entry.txn - self.first_txn) as usize].xid)
    }

    fn entry(&self, id: i64) -> Option<&Entry> {
        let position = *self.positions.get(&id)?;
        self.entries.get((position - self.base) as usize)?.as_ref()
    }

    fn entry_mut(&mut self, id: i64) -> Option<&mut Entry> {
        let position = *self.positions.get(&id)?;
        self.entries
            .get_mut((position - self.base) as usize)?
            .as_mut()
    }

    /// These events are acknowledged or recorded as dead: they no longer hold the slot.
    pub(crate) fn settle(&mut self, ids: &[i64]) {
        for id in ids {
            let Some(position) = self.positions.remove(id) else {
                continue;
            };
            let Some(entry) = self.entries[(position - self.base) as usize].take() else {
                continue;
            };
            self.unsettled -= 1;
            self.failed -= usize::from(entry.retry.is_some());
            self.unsettled_bytes -= entry.event.payload.len();
            self.read_again -= usize::from(entry.read_again);
            self.txns[(entry.txn - self.first_txn) as usize].unsettled -= 1;
        }
        self.trim();
    }

    fn trim(&mut self) {
        while let Some(None) = self.entries.front() {
            self.entries.pop_front();
            self.base += 1;
        }
        while let Some(txn) = self.txns.front() {
            let Some(end_lsn) = txn.end_lsn.filter(|_| txn.unsettled == 0) else {
                break;
            };
            self.confirmable = self.confirmable.max(end_lsn);
            self.txns.pop_front();
            self.first_txn += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64, aggregate: &str) -> OutboxEvent {
        OutboxEvent::new(id, "order", aggregate, "E", "{}")
    }

    fn ids(events: &[OutboxEvent]) -> Vec<i64> {
        events.iter().map(|e| e.id).collect()
    }

    #[test]
    fn the_slot_moves_only_past_settled_transactions_in_commit_order() {
        let mut b = Backlog::new(100);
        // Ids need not follow commit order: the log's order is the order.
        b.push(vec![event(9, "a"), event(3, "b")], 200);
        b.push(vec![event(5, "a")], 300);
        b.push(vec![], 350);
        b.push(vec![event(1, "c")], 400);
        let now = Instant::now();
        assert_eq!(ids(&b.claim(10, &HashSet::new(), now)), [9, 3, 5, 1]);
        assert_eq!(b.unsettled(), 4);

        b.settle(&[5, 1]);
        assert_eq!(b.confirmable(), 100, "the first transaction is not settled");
        b.settle(&[9]);
        assert_eq!(b.confirmable(), 100);
        b.settle(&[3, 3, 77]);
        assert_eq!(b.confirmable(), 400, "every transaction settled");
        assert_eq!(b.unsettled(), 0);
        assert_eq!(b.unsettled_bytes(), 0);
        b.idle_at(450);
        assert_eq!(b.confirmable(), 450);
        b.push(vec![], 500);
        assert_eq!(b.confirmable(), 500, "nothing of ours, nothing pending");
    }

    #[test]
    fn events_of_transactions_committed_before_the_reader_started_are_read_again() {
        let mut b = Backlog::new(100).read_again_until(500);
        b.begin(1, 300);
        b.add(event(1, "a"));
        b.add(event(2, "a"));
        b.commit(320);
        // A commit at the very position the reader started at: taken as read again.
        b.begin(2, 500);
        b.add(event(3, "b"));
        b.commit(520);
        b.begin(3, 501);
        b.add(event(4, "c"));
        b.commit(540);
        let read_again: Vec<bool> = (1..=4).map(|id| b.is_read_again(id)).collect();
        assert_eq!(read_again, [true, true, true, false]);
        assert!(b.holds_read_again());
        b.settle(&[1, 3, 4]);
        assert!(b.holds_read_again(), "event 2 is still unsettled");
        b.settle(&[2]);
        assert!(!b.holds_read_again());
        assert!(!b.is_read_again(2), "a settled event is not asked about");

        assert_eq!(
            b.read_again_done(),
            Some(3),
            "read past the start, all settled"
        );

        let mut idle = Backlog::new(100).read_again_until(500);
        idle.begin(5, 300);
        idle.add(event(6, "e"));
        idle.commit(320);
        idle.settle(&[6]);
        assert_eq!(
            idle.read_again_done(),
            None,
            "the log may hold more from before"
        );
        idle.idle_at(499);
        assert_eq!(idle.read_again_done(), None);
        idle.idle_at(500);
        assert_eq!(
            idle.read_again_done(),
            Some(1),
            "the server has sent all before"
        );

        let mut fresh = Backlog::new(100);
        fresh.begin(4, 50);
        fresh.add(event(5, "d"));
        assert!(
            !fresh.holds_read_again(),
            "nothing is read again unless told where"
        );
        fresh.commit(60);
        fresh.idle_at(70);
        assert_eq!(fresh.read_again_done(), None, "nothing was read again");
    }

    #[test]
    fn a_reader_resumes_inside_the_transaction_the_last_one_did_not_finish() {
        let ids = |b: &Backlog| ids(&b.claim(10, &HashSet::new(), Instant::now()));
        // The last reader: one transaction read in part (ids are log positions, message style).
        let mut last = Backlog::new(0);
        last.begin(1, 1000);
        for id in [110, 120, 130, 140] {
            last.add(event(id, "a"));
        }
        let at = |settled_below| ResumePoint {
            final_lsn: 1000,
            settled_below,
        };
        assert_eq!(last.resume_point(), Some(at(110)), "nothing settled yet");
        last.settle(&[110, 120, 140]);
        assert_eq!(last.resume_point(), Some(at(130)), "130 is not settled");
        last.settle(&[130]);
        assert_eq!(
            last.resume_point(),
            Some(at(141)),
            "all it read is settled, its end is not read yet"
        );
        last.add(event(150, "a"));
        last.add(event(160, "a"));
        last.settle(&[160]);
        let point = last.resume_point();
        assert_eq!(point, Some(at(150)));

        // The next reader skips what the last one settled below that point, in that
        // transaction only; 160, settled above it, is published again (at least once).
        let mut next = Backlog::new(0).resuming(point);
        next.begin(7, 900);
        assert!(next.add(event(100, "z")), "another transaction");
        next.commit(950);
        next.begin(1, 1000);
        let added = [110, 120, 130, 140, 150, 160].map(|id| next.add(event(id, "a")));
        assert_eq!(added, [false, false, false, false, true, true]);
        assert_eq!(next.read_again_skipped(), 4, "counted as skipped");
        next.commit(1100);
        assert_eq!(ids(&next), [100, 150, 160]);
        next.settle(&[100, 150, 160]);
        assert_eq!(next.confirmable(), 1100);
        assert_eq!(next.resume_point(), None, "nothing unsettled");

        let mut whole = Backlog::new(0).resuming(Some(at(2000)));
        whole.begin(1, 1000);
        let added = [110, 120].map(|id| whole.add(event(id, "a")));
        assert_eq!(added, [false, false], "settled whole by the last reader");
        whole.commit(1100);
        assert_eq!(whole.confirmable(), 1100, "nothing of it left to settle");
        whole.begin(2, 3000);
        assert!(
            whole.add(event(1500, "b")),
            "not the transaction the point names"
        );
    }

    #[test]
    fn a_failed_event_holds_its_aggregate_and_the_slot() {
        let mut b = Backlog::new(0);
        b.push(vec![event(1, "a"), event(2, "b")], 10);
        b.push(vec![event(3, "a"), event(4, "b")], 20);
        let now = Instant::now();
        b.retry(1, Duration::from_secs(5), now, "refused");
        let excluded: HashSet<i64> = [2].into();
        assert_eq!(
            ids(&b.claim(10, &excluded, now)),
            [4],
            "a waits, 2 is in flight"
        );
        b.settle(&[2, 4]);
        assert_eq!(b.confirmable(), 0, "1 is not settled");
        let later = now + Duration::from_secs(6);
        assert_eq!(ids(&b.claim(10, &HashSet::new(), later)), [1], "due, alone");
        assert_eq!(b.get(1).unwrap().attempts, 1);
        b.settle(&[1]);
        assert_eq!(ids(&b.claim(10, &HashSet::new(), later)), [3]);
        assert_eq!(b.confirmable(), 10);
        b.settle(&[3]);
        assert_eq!(b.confirmable(), 20);
        assert!(b.oldest().is_none());
    }

    #[test]
    fn a_failed_event_the_last_reader_listed_keeps_its_attempts_and_next_try() {
        let carried = |id: i64, aggregate: &str, attempts: i32, in_secs: i64| HeldBack {
            aggregate_type: "order".to_owned(),
            aggregate_id: aggregate.to_owned(),
            id,
            attempts,
            next_attempt_at: Some(chrono::Utc::now() + chrono::Duration::seconds(in_secs)),
            last_error: Some(format!("{aggregate} refused")),
            waiting_behind: 1,
        };
        let mut b = Backlog::new(0).read_again_until(25).carrying(vec![
            carried(1, "a", 4, 3600),
            carried(2, "b", 2, -5),
            // Another event at that position (its aggregate differs): not taken for it.
            carried(3, "x", 9, 3600),
            // Never read again: the last reader settled them after it reported.
            carried(5, "y", 1, 60),
            carried(20, "w", 1, 60),
        ]);
        // Listed before they are read again: failed, nothing waiting behind.
        let figures = b.held_back(20);
        let listed: Vec<(i64, i64)> = figures
            .listed
            .iter()
            .map(|h| (h.id, h.waiting_behind))
            .collect();
        assert_eq!(listed, [(1, 0), (2, 0), (3, 0), (5, 0), (20, 0)]);
        assert_eq!(
            (figures.retrying, figures.aggregates, b.failed()),
            (5, 5, 5)
        );
        b.begin(1, 10);
        b.push(
            vec![
                event(1, "a"),
                event(2, "b"),
                event(3, "c"),
                event(4, "a"),
                event(6, "d"),
            ],
            12,
        );
        assert_eq!(b.failed(), 4, "1 and 2 read again, 5 and 20 not yet");
        let listed: Vec<i64> = b.held_back(20).listed.iter().map(|h| h.id).collect();
        assert_eq!(listed, [1, 2, 5, 20]);
        // A transaction committed after the reader started: the others were settled.
        b.begin(2, 30);
        assert_eq!(b.failed(), 2);
        let now = Instant::now();
        // 1 waits an hour, and 4 behind it; 2's time has come; 3 and 6 never failed.
        let claimed = b.claim(10, &HashSet::new(), now);
        assert_eq!(ids(&claimed), [2, 3, 6]);
        let attempts: Vec<i32> = claimed.iter().map(|e| e.attempts).collect();
        assert_eq!(attempts, [2, 0, 0]);
        let figures = b.held_back(20);
        assert_eq!((figures.retrying, figures.aggregates), (2, 2));
        let first = &figures.listed[0];
        assert_eq!((first.id, first.attempts, first.waiting_behind), (1, 4, 1));
        assert_eq!(first.last_error.as_deref(), Some("a refused"));
        let wait = first.next_attempt_at.expect("a next try") - chrono::Utc::now();
        assert!(wait > chrono::Duration::minutes(59), "{wait}");
        let later = now + Duration::from_secs(3601);
        assert_eq!(ids(&b.claim(10, &HashSet::new(), later)), [1, 2, 3, 6]);
        // Its next failure counts on from there; settling forgets it.
        b.retry(2, Duration::from_secs(60), now, "b refused again");
        assert_eq!(b.get(2).map(|e| e.attempts), Some(3));
        b.settle(&[1, 2]);
        assert_eq!(b.failed(), 0);
    }

    #[test]
    fn held_back_counts_and_lists_what_failed_events_hold_back_as_polling_does() {
        let mut b = Backlog::new(0);
        let (a, bb, c) = (
            |id| event(id, "a"),
            |id| event(id, "b"),
            |id| event(id, "c"),
        );
        b.push(vec![a(1), bb(2), a(3), c(4)], 10);
        b.push(vec![a(5), bb(6), c(7)], 20);
        assert_eq!(b.held_back(20), HeldFigures::default(), "nothing failed");
        let now = Instant::now();
        let before = chrono::Utc::now();
        b.retry(2, Duration::from_secs(60), now, "b refused");
        b.retry(1, Duration::from_secs(3600), now, "a refused");
        b.retry(1, Duration::from_secs(3600), now, "a refused again");
        // In flight with 1, and failed too: it counts, and waits behind 1.
        b.retry(5, Duration::from_secs(60), now, "a's second refused");
        b.acknowledge(7);
        let after = chrono::Utc::now();
        // Each held-back aggregate's first failed event: id, aggregate, attempts, last error,
        // how many wait behind it.
        let seen = |figures: &HeldFigures| -> Vec<String> {
            let line = |h: &HeldBack| {
                let error = h.last_error.as_deref().unwrap_or("-");
                let (id, agg, n, behind) = (h.id, &h.aggregate_id, h.attempts, h.waiting_behind);
                format!("{id} {agg} x{n} {error}; +{behind}")
            };
            figures.listed.iter().map(line).collect()
        };
        let figures = b.held_back(20);
        assert_eq!(
            (figures.retrying, figures.aggregates, b.failed()),
            (3, 2, 3)
        );
        assert_eq!(
            seen(&figures),
            ["1 a x2 a refused again; +2", "2 b x1 b refused; +1"],
            "in id order; 7 is acknowledged"
        );
        let next = figures.listed[0].next_attempt_at.expect("a next attempt");
        let hour = chrono::Duration::hours(1);
        assert!(next >= before + hour && next <= after + hour, "{next}");
        assert_eq!(figures.listed[0].aggregate_type, "order");
        assert_eq!(seen(&b.held_back(1)), ["1 a x2 a refused again; +2"]);

        b.settle(&[1]);
        let figures = b.held_back(20);
        assert_eq!((figures.retrying, figures.aggregates), (2, 2));
        assert_eq!(
            seen(&figures),
            ["2 b x1 b refused; +1", "5 a x1 a's second refused; +0"],
            "a is held by 5 now; 3 went before it"
        );
        b.settle(&[2, 5]);
        assert_eq!((b.failed(), b.held_back(20)), (0, HeldFigures::default()));
    }

    #[test]
    fn an_acknowledged_event_is_not_handed_out_again_and_holds_only_the_slot() {
        let mut b = Backlog::new(0);
        b.push(vec![event(1, "a"), event(2, "a")], 10);
        b.acknowledge(1);
        assert_eq!(ids(&b.claim(10, &HashSet::new(), Instant::now())), [2]);
        b.settle(&[2]);
        assert_eq!(b.confirmable(), 0, "1 is acknowledged, not settled");
        b.settle(&[1]);
        assert_eq!(b.confirmable(), 10);
    }

    #[test]
    fn unsettled_bytes_count_the_payloads_until_they_are_settled() {
        let sized = |id: i64, bytes: usize| {
            let mut e = event(id, &id.to_string());
            e.payload = vec![b'x'; bytes];
            e
        };
        let mut b = Backlog::new(0);
        b.push(vec![sized(1, 1000), sized(2, 24)], 10);
        b.push(vec![sized(3, 500)], 20);
        assert_eq!(b.unsettled_bytes(), 1524);
        b.retry(3, Duration::from_secs(1), Instant::now(), "refused");
        b.acknowledge(1);
        assert_eq!(
            b.unsettled_bytes(),
            1524,
            "acknowledged or failed, still held"
        );
        b.settle(&[1, 1, 99]);
        assert_eq!(b.unsettled_bytes(), 524);
        b.settle(&[2, 3]);
        assert_eq!((b.unsettled(), b.unsettled_bytes()), (0, 0));
    }

    #[test]
    fn a_transaction_is_handed_out_as_it_is_read_and_confirmed_once_it_ended() {
        let mut b = Backlog::new(0);
        b.push(vec![event(1, "a")], 10);
        b.add(event(2, "a"));
        b.add(event(3, "b"));
        let now = Instant::now();
        assert_eq!(ids(&b.claim(10, &HashSet::new(), now)), [1, 2, 3]);
        b.settle(&[1, 2, 3]);
        assert_eq!(
            b.confirmable(),
            10,
            "the second transaction's end is not read yet"
        );
        assert_eq!(b.unsettled(), 0);
        b.add(event(4, "b"));
        b.commit(20);
        assert_eq!(b.confirmable(), 10, "4 is not settled");
        b.settle(&[4]);
        assert_eq!(b.confirmable(), 20);
        b.commit(30);
        assert_eq!(b.confirmable(), 30, "nothing of ours, nothing pending");
        b.add(event(5, "c"));
        b.commit(40);
        b.commit(50);
        b.settle(&[5]);
        assert_eq!(
            b.confirmable(),
            50,
            "an empty transaction behind a settled one"
        );
    }

    #[test]
    fn each_event_knows_the_transaction_that_wrote_it() {
        let mut b = Backlog::new(0);
        b.begin(700, 9);
        b.push(vec![event(1, "a"), event(2, "b")], 10);
        b.begin(702, 14);
        b.commit(15);
        b.begin(u32::MAX, 20);
        b.add(event(3, "a"));
        assert_eq!(
            [1, 2, 3, 4].map(|id| b.xid_of(id)),
            [Some(700), Some(700), Some(u32::MAX), None]
        );
        b.settle(&[1]);
        assert_eq!((b.xid_of(1), b.xid_of(2)), (None, Some(700)));
    }

    #[test]
    fn claims_respect_the_limit() {
        let mut b = Backlog::new(0);
        b.push((1..=50).map(|i| event(i, &i.to_string())).collect(), 10);
        assert_eq!(b.claim(7, &HashSet::new(), Instant::now()).len(), 7);
        assert!(b.oldest().is_some());
    }
}
