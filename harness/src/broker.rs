//! Broker sides: a broker with one test's destinations, and an independent consumer of them.
//!
//! A side uses the broker's own client crate (redis, rdkafka, lapin, aws-sdk-sqs), never our
//! sink crates: what it reads back is what any consumer would see.

#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "redis-streams")]
pub mod private_redis;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis-streams")]
pub mod redis;
#[cfg(feature = "sns")]
pub mod sns;
#[cfg(feature = "sqs")]
pub mod sqs;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::mpsc::UnboundedReceiver;
use uuid::Uuid;

use crate::delivery::{Committed, Delivered};

/// The aggregate types the scenario's writers use (see [`crate::aggregate_type`]); a side
/// prepares a destination for each where its destinations depend on the type.
pub const AGGREGATE_TYPES: [&str; 2] = ["order", "customer"];

/// The relay's `[sink]` table for a sink of kind `kind` — with `sink.destination =
/// "<prefix>.{aggregate_type}"` when `prefix` is given (the sides' destinations by aggregate
/// type) — then the sink's own table (`[sink.<kind with - as _>]`) with the lines `settings`:
/// what [`BrokerSide::sink_toml`] returns.
#[cfg(any(
    feature = "redis-streams",
    feature = "kafka",
    feature = "rabbitmq",
    feature = "sqs",
    feature = "nats"
))]
pub(crate) fn sink_tables(kind: &str, prefix: Option<&str>, settings: &str) -> String {
    let destination = prefix
        .map(|prefix| format!("destination = \"{prefix}.{{aggregate_type}}\"\n"))
        .unwrap_or_default();
    format!(
        "[sink]\nkind = \"{kind}\"\n{destination}\n[sink.{}]\n{settings}",
        outboxkit_core::plugin::sink_section(kind)
    )
}

/// One broker and one test's destinations on it.
#[async_trait]
pub trait BrokerSide: Send + Sync + std::fmt::Debug {
    /// The broker, for messages ("Redis Streams", "Kafka"...).
    fn name(&self) -> String;
    /// The broker's server and version, for reports (its name where the side cannot tell).
    fn server_version(&self) -> String {
        self.name()
    }
    /// The `[sink]` table and the sink's own table of the relay's configuration, the latter last
    /// (a test's extra sink lines follow it), ending with a new line.
    fn sink_toml(&self) -> String;
    /// Environment a relay process and the CLI need (credentials...).
    fn relay_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Create the destinations (topics, queues and their bindings...), and start what must
    /// consume while the relays publish. Fails the test, saying what to start, when the broker
    /// is unreachable.
    async fn prepare(&self);
    /// Where the consumer reads the events of `aggregate_type`: a stream, topic or queue.
    fn destination(&self, aggregate_type: &str) -> String;
    /// Whether the destination keeps the publish order of an aggregate's first deliveries
    /// (not so a standard SQS queue).
    fn ordered(&self) -> bool {
        true
    }
    /// Read back what was delivered, as an independent consumer: after waiting (up to
    /// `timeout`) for `expected` where the side has to wait for messages at all, in the order
    /// the consumer got them per destination (per partition on Kafka).
    async fn read_back(&self, expected: &HashSet<Uuid>, timeout: Duration) -> Vec<Delivered>;
    /// How many messages the destinations hold, for a bulk check where reading each back would
    /// be slow: the broker's own count (stream lengths, queue depths, SQS's approximate counts;
    /// on Kafka the distinct event ids read from the beginning). Waits up to `timeout` for
    /// `expected` where the count may lag behind.
    async fn held(&self, expected: u64, timeout: Duration) -> u64;
    /// A live consumer from now on: the event id and arrival time of each message delivered
    /// (it takes them off queues but deletes nothing), until the receiver is dropped.
    async fn watch(&self) -> UnboundedReceiver<(Uuid, Instant)>;
    /// What the broker can tell about events the consumer did not read back (`missing`) when
    /// `delivered` is what it did read, for the failure message: a second read, gaps in the
    /// broker's own numbering... Nothing by default.
    async fn look_for_missing(
        &self,
        missing: &HashSet<Uuid>,
        delivered: &[Delivered],
    ) -> Vec<String> {
        let _ = (missing, delivered);
        Vec::new()
    }
    /// The broker's own checks of the scenario's messages (routing keys, keys and partitions,
    /// headers...), beyond the scenario's; `committed` are the scenario's events.
    fn check_messages(&self, delivered: &[Delivered], committed: &Committed);
    /// Delete what [`Self::prepare`] created, and stop its consumers.
    async fn cleanup(&self);
}

#[cfg(all(
    test,
    any(
        feature = "redis-streams",
        feature = "kafka",
        feature = "rabbitmq",
        feature = "sqs",
        feature = "nats"
    )
))]
mod tests {
    use super::sink_tables;

    #[test]
    fn the_sink_tables_have_the_kind_the_destination_and_the_own_table_last() {
        assert_eq!(
            sink_tables("redis-streams", Some("t"), "url = \"u\"\n"),
            "[sink]\nkind = \"redis-streams\"\ndestination = \"t.{aggregate_type}\"\n\n\
             [sink.redis_streams]\nurl = \"u\"\n"
        );
        assert_eq!(
            sink_tables("sqs", None, "queue = \"q\"\n"),
            "[sink]\nkind = \"sqs\"\n\n[sink.sqs]\nqueue = \"q\"\n"
        );
    }
}
