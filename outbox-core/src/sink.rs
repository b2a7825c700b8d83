//! The `Sink` trait: where events go.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
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
/// returning exactly one [`Outcome`] per event, in order. An `Err` means the call as a whole
/// failed (broker down, credentials refused): nothing is dead-lettered, the engine backs off and
/// tries again later.
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

    /// Check the broker answers (start-up and `/readyz`).
    async fn check(&self) -> Result<()>;

    /// Publish a batch and await every acknowledgement: one outcome per event, in order.
    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>>;
}
