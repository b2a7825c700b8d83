//! The `Sink` trait: where events go.

use std::fmt;

use async_trait::async_trait;

use crate::error::{Error, ErrorKind, Result};
use crate::model::{OutboxEvent, Outcome};

/// What a sink can take in one call; the engine splits and checks batches by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SinkCapabilities {
    /// Most events in one `publish` call.
    pub max_batch_len: usize,
    /// Largest payload the broker accepts, if the sink knows it; larger events are rejected
    /// (parked as dead) without a broker call.
    pub max_payload_bytes: Option<usize>,
    /// `true` when a failed event of a batch guarantees that no later event of the same
    /// `aggregate_id` in that batch was delivered (e.g. Kafka's idempotent producer per
    /// partition). When `false` the engine sends at most one event per aggregate per call, in
    /// waves, so a retry can never let a later event overtake an earlier one.
    pub ordered_per_key: bool,
}

impl Default for SinkCapabilities {
    fn default() -> Self {
        Self {
            max_batch_len: 1000,
            max_payload_bytes: None,
            ordered_per_key: false,
        }
    }
}

/// A broker adapter. Implement this trait (and register a factory in the binary) to add a
/// broker the project does not ship.
///
/// `publish` sends the whole batch pipelined/concurrently and awaits every acknowledgement,
/// returning exactly one [`Outcome`] per event, in order, each failure carrying an [`Error`]
/// whose [`ErrorKind`] the sink classified. The sink does not decide whether the call failed as
/// a whole: the engine does, from those kinds, with [`whole_call_failure`] (a wrong setting or
/// refused credentials anywhere in the call, or a broker that failed every event of the call
/// as unreachable, slow or overloaded). Then nothing is dead-lettered and no attempt is
/// charged: the engine backs off and sends the events again later. Otherwise each failed event
/// is retried or parked on its own.
///
/// Return `Err` only when the sink cannot tell per event what happened (the connection
/// dropped before any answer, a call-wide timeout with unknown acknowledgements...): the
/// engine treats every `Err` as a failure of the whole call.
///
/// A panic in `publish` or `check` is a bug, and the engine contains it: the call fails as a
/// whole (`the <kind> sink panicked in publish: <message> ...`), so the relay backs off and
/// tries again, and loses and dead-letters nothing. The sink must stay usable after one: no
/// lock poisoned for good, no state left half-changed. A `publish` call that has not answered
/// within `relay.publish_timeout` (90 s) is dropped and fails as a whole too: bound your
/// broker calls with timeouts of your own, well below it, and keep the sink usable after a
/// call is dropped mid-way.
#[async_trait]
pub trait Sink: Send + Sync + fmt::Debug + 'static {
    /// The sink kind as named in configuration, e.g. `redis-streams`.
    fn kind(&self) -> &'static str;

    /// Batch and message limits.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities::default()
    }

    /// Where `event` goes (stream, topic, queue...) — the row's `destination` or the rendered
    /// template. Used for routing and for metrics labels.
    fn destination(&self, event: &OutboxEvent) -> String;

    /// Check the broker answers (start-up and `/readyz`; and, after a relay gave its shards
    /// back because every publish failed for `relay.hand_over_after`, whether to take shards
    /// again). Reach the broker: a check that always passes makes such a relay take shards
    /// back at once.
    async fn check(&self) -> Result<()>;

    /// Publish a batch and await every acknowledgement: one outcome per event, in order
    /// (see the trait's documentation for when to return `Err`).
    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>>;
}

/// The rule by which the engine decides, from the outcomes of one `publish` call, whether the
/// call failed as a whole. Returns the error to report when it did, `None` when each failed
/// event is to be retried or parked on its own:
///
/// 1. a failed outcome (`Retry` or `Reject`) of kind [`ErrorKind::Unauthorized`] or
///    [`ErrorKind::Config`] fails the call, whatever the other outcomes (a setting or a
///    credential is wrong: every event would fail the same way) — the first such error;
/// 2. otherwise, when no event of the call was `Published` and every failure is of kind
///    [`ErrorKind::Connection`], [`ErrorKind::Timeout`] or [`ErrorKind::Unavailable`], the
///    call fails (the broker is down or overloaded) — the first failure's error;
/// 3. otherwise (no failure; some event published; or a failure of another kind, which is
///    about its event) the outcomes stand event by event.
///
/// When the call failed as a whole the engine keeps the `Published` outcomes, charges no
/// attempt to the failed events, dead-letters none of them and backs off.
pub fn whole_call_failure(outcomes: &[Outcome]) -> Option<Error> {
    let mut failures = outcomes.iter().filter_map(|outcome| match outcome {
        Outcome::Published => None,
        Outcome::Retry(error) | Outcome::Reject(error) => Some(error),
    });
    if let Some(error) = failures
        .clone()
        .find(|e| matches!(e.kind(), ErrorKind::Unauthorized | ErrorKind::Config))
    {
        return Some(error.clone());
    }
    let first = failures.next()?;
    let broker_down = |e: &Error| {
        matches!(
            e.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Unavailable
        )
    };
    let none_published = !outcomes.iter().any(Outcome::is_published);
    (none_published && broker_down(first) && failures.all(broker_down)).then(|| first.clone())
}
