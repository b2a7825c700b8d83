//! The event model: what writers enqueue and what the relay hands to sinks.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::Error;

/// Extra message headers of an event (trace context, tenant...), string to string.
pub type Headers = BTreeMap<String, String>;

/// One committed outbox row, as claimed by the relay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutboxEvent {
    /// Monotonic row id: publication order.
    pub id: i64,
    /// Stable identity, sent as message id / deduplication id.
    pub event_id: Uuid,
    /// E.g. `order`.
    pub aggregate_type: String,
    /// Partition / group / ordering key.
    pub aggregate_id: String,
    /// E.g. `OrderConfirmed`.
    pub event_type: String,
    /// The JSON document the writer serialized, as text, byte for byte what sinks send.
    pub payload: String,
    /// Extra headers given by the writer.
    pub headers: Headers,
    /// Per-row override of the sink's destination template.
    pub destination: Option<String>,
    /// When the row was written (database clock).
    pub created_at: DateTime<Utc>,
    /// Failed publication attempts so far.
    pub attempts: i32,
    /// Ownership unit, derived from `aggregate_id` by the database.
    pub shard: i32,
}

impl OutboxEvent {
    /// Payload bytes as sent to brokers.
    pub fn payload_bytes(&self) -> &[u8] {
        self.payload.as_bytes()
    }
}

/// An event a writer enqueues inside its own transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewEvent {
    /// Defaults to a fresh UUID v7 when `None`.
    pub event_id: Option<Uuid>,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// Serialized now, at write time — never re-read business state later.
    pub payload: serde_json::Value,
    pub headers: Headers,
    pub destination: Option<String>,
}

impl NewEvent {
    /// An event with empty headers, no destination override and a fresh event id.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: serde_json::Value,
    ) -> Self {
        Self {
            event_id: None,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            headers: Headers::new(),
            destination: None,
        }
    }

    /// Set a header (e.g. `traceparent`).
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// Route this event to `destination` instead of the sink's template.
    pub fn destination(mut self, destination: impl Into<String>) -> Self {
        self.destination = Some(destination.into());
        self
    }

    /// Use this event id (for idempotent re-enqueue) instead of a fresh one.
    pub fn event_id(mut self, event_id: Uuid) -> Self {
        self.event_id = Some(event_id);
        self
    }

    /// The event id to store: the given one or a new time-ordered UUID.
    pub fn event_id_or_new(&self) -> Uuid {
        self.event_id.unwrap_or_else(Uuid::now_v7)
    }
}

/// What happened to one event of a batch handed to a sink.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The broker acknowledged it.
    Published,
    /// It failed but may succeed later: back off, then try again.
    Retry(Error),
    /// It will never succeed as it is (too large, invalid, unroutable): park it as dead.
    Reject(Error),
}

impl Outcome {
    /// Turn a per-message error into an outcome by its retryability.
    pub fn from_error(error: Error) -> Self {
        if error.is_retryable() {
            Outcome::Retry(error)
        } else {
            Outcome::Reject(error)
        }
    }

    /// Whether the broker acknowledged the event.
    pub fn is_published(&self) -> bool {
        matches!(self, Outcome::Published)
    }
}

/// Figures about the backlog, for `status` and metrics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BacklogStatus {
    /// Rows not yet published and not dead.
    pub pending: i64,
    /// Age in seconds of the oldest pending row (0 when none).
    pub oldest_pending_age_secs: f64,
    /// Rows parked as dead.
    pub dead: i64,
    /// Aggregates whose next event is waiting for a retry.
    pub held_back_aggregates: i64,
    /// Pending rows that have failed at least once.
    pub retrying: i64,
}

/// Who owns a shard right now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardOwner {
    pub shard: i32,
    /// The owning relay's identity as it registered it, or the session identifier.
    pub owner: String,
}

/// A row parked as dead, as `outbox-relay dead list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadEvent {
    pub id: i64,
    pub event_id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// Failed attempts before it was parked.
    pub attempts: i32,
    /// The broker's (or the relay's) last error.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub dead_at: DateTime<Utc>,
}

/// Which dead rows to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// Most rows returned (oldest first).
    pub limit: u32,
}

/// Which dead rows to send back to pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadSelection {
    /// These row ids (rows that are not dead are left alone).
    Ids(Vec<i64>),
    /// Every dead row, optionally of one aggregate.
    All { aggregate_id: Option<String> },
}

/// An aggregate whose next event waits for a retry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeldBack {
    pub aggregate_type: String,
    pub aggregate_id: String,
    /// The waiting event's row id.
    pub id: i64,
    pub attempts: i32,
    /// When it will be tried again (`None`: now).
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    /// Later events of the aggregate waiting behind it.
    pub waiting_behind: i64,
}
