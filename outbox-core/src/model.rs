//! The event model: what writers enqueue and what the relay hands to sinks.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::Error;

/// Extra message headers of an event (trace context, tenant...), string to string.
pub type Headers = BTreeMap<String, String>;

/// The reserved header naming an event's content type (e.g. `application/avro`). Sinks send
/// it as the broker's native content type where the broker has one (AMQP `content_type`) and
/// as this header everywhere; without it, an event's content type is its table's
/// [`PayloadType::default_content_type`].
pub const CONTENT_TYPE_HEADER: &str = "content-type";

/// How an outbox table stores payloads, chosen when `migrate` creates it (`store.payload_type`)
/// and read back from the database's catalog when a store opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PayloadType {
    /// A JSON document (PostgreSQL `jsonb`, MySQL `JSON`): the database validates it and
    /// normalizes it (key order, whitespace, number formats), so brokers receive the
    /// database's rendering of the document, not the writer's bytes.
    #[default]
    Json,
    /// Exact UTF-8 text (PostgreSQL `text`, MySQL `LONGTEXT` utf8mb4), delivered byte for
    /// byte: pre-serialized JSON, XML, CSV...
    Text,
    /// Any bytes (PostgreSQL `bytea`, MySQL `LONGBLOB`), delivered byte for byte: Avro,
    /// Protobuf, compressed data...
    Binary,
}

impl PayloadType {
    /// Every payload type, in the order the documentation lists them.
    pub const ALL: [PayloadType; 3] = [PayloadType::Json, PayloadType::Text, PayloadType::Binary];

    /// Its name in settings: `json`, `text` or `binary`.
    pub fn as_str(self) -> &'static str {
        match self {
            PayloadType::Json => "json",
            PayloadType::Text => "text",
            PayloadType::Binary => "binary",
        }
    }

    /// The content type of an event that does not name one in its [`CONTENT_TYPE_HEADER`].
    pub fn default_content_type(self) -> &'static str {
        match self {
            PayloadType::Json => "application/json",
            PayloadType::Text => "text/plain; charset=utf-8",
            PayloadType::Binary => "application/octet-stream",
        }
    }
}

impl std::fmt::Display for PayloadType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PayloadType {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        PayloadType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not a payload type: use json, text or binary"))
    }
}

/// What a writer enqueues as an event's payload: a serialized JSON document, text, or bytes.
/// A `json` or `text` table takes any of them whose bytes are valid UTF-8 (a `json` table also
/// requires a JSON document); a `binary` table takes any.
///
/// `From` conversions: `serde_json::Value` → [`Payload::Json`], `&str`/`String` →
/// [`Payload::Text`], `&[u8]`/`Vec<u8>` → [`Payload::Binary`]; [`Payload::json`] serializes any
/// `serde::Serialize`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Payload {
    /// A JSON document, serialized once, at write time.
    Json(String),
    /// Text, stored as given.
    Text(String),
    /// Bytes, stored as given.
    Binary(Vec<u8>),
}

impl Payload {
    /// `value` serialized as JSON now, at write time.
    pub fn json(value: &impl Serialize) -> Result<Self, Error> {
        serde_json::to_string(value)
            .map(Payload::Json)
            .map_err(|e| {
                Error::new(
                    crate::ErrorKind::InvalidMessage,
                    format!("event payload cannot be serialized as JSON: {e}"),
                )
            })
    }

    /// The payload's bytes, as a `binary` table stores them.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Payload::Json(text) | Payload::Text(text) => text.as_bytes(),
            Payload::Binary(bytes) => bytes,
        }
    }

    /// The payload as text, as a `json` or `text` table stores it; `None` for bytes that are
    /// not valid UTF-8.
    pub fn as_text(&self) -> Option<&str> {
        match self {
            Payload::Json(text) | Payload::Text(text) => Some(text),
            Payload::Binary(bytes) => std::str::from_utf8(bytes).ok(),
        }
    }

    /// The payload as text for a table of type `table_type` named `table`, or the error the
    /// writer gets for bytes that are not UTF-8 (nothing is written).
    pub fn text_for(&self, table: &str, table_type: PayloadType) -> Result<&str, Error> {
        self.as_text().ok_or_else(|| {
            Error::new(
                crate::ErrorKind::InvalidMessage,
                format!(
                    "the payload is not valid UTF-8 and {table} stores `{table_type}` payloads; \
                     write it to a table created with store.payload_type = \"binary\""
                ),
            )
        })
    }
}

impl From<serde_json::Value> for Payload {
    fn from(value: serde_json::Value) -> Self {
        Payload::Json(value.to_string())
    }
}

impl From<&serde_json::Value> for Payload {
    fn from(value: &serde_json::Value) -> Self {
        Payload::Json(value.to_string())
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Self {
        Payload::Text(text)
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Self {
        Payload::Text(text.to_owned())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Self {
        Payload::Binary(bytes)
    }
}

impl From<&[u8]> for Payload {
    fn from(bytes: &[u8]) -> Self {
        Payload::Binary(bytes.to_vec())
    }
}

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
    /// The payload as the table holds it, byte for byte what sinks send (for a `json` table,
    /// the database's rendering of the document).
    pub payload: Vec<u8>,
    /// How the event's table stores payloads.
    pub payload_type: PayloadType,
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
    /// An event as a store hands it to a sink, for a sink's own tests and tools (the relay makes
    /// its events from claimed rows): a fresh UUID v7 `event_id`, the payload's own type, no
    /// headers and no destination, created now, never attempted, shard 0. The fields are public:
    /// set any other value on the result.
    pub fn new(
        id: i64,
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Into<Payload>,
    ) -> Self {
        let (payload, payload_type) = match payload.into() {
            Payload::Json(text) => (text.into_bytes(), PayloadType::Json),
            Payload::Text(text) => (text.into_bytes(), PayloadType::Text),
            Payload::Binary(bytes) => (bytes, PayloadType::Binary),
        };
        Self {
            id,
            event_id: Uuid::now_v7(),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload,
            payload_type,
            headers: Headers::new(),
            destination: None,
            created_at: Utc::now(),
            attempts: 0,
            shard: 0,
        }
    }

    /// Payload bytes as sent to brokers.
    pub fn payload_bytes(&self) -> &[u8] {
        &self.payload
    }

    /// Whether the payload is empty: no bytes, or the JSON `null` in a `json` table (a JSON
    /// column cannot hold zero bytes). What a sink may send as a tombstone or a deletion.
    pub fn payload_is_empty(&self) -> bool {
        self.payload.is_empty()
            || (self.payload_type == PayloadType::Json && self.payload.trim_ascii() == b"null")
    }

    /// The payload as text; `None` when it is not valid UTF-8 (only possible in a `binary`
    /// table).
    pub fn payload_text(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The event's content type: its [`CONTENT_TYPE_HEADER`], else its table's default.
    pub fn content_type(&self) -> &str {
        self.headers
            .get(CONTENT_TYPE_HEADER)
            .map(String::as_str)
            .unwrap_or_else(|| self.payload_type.default_content_type())
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
    pub payload: Payload,
    pub headers: Headers,
    pub destination: Option<String>,
}

impl NewEvent {
    /// An event with empty headers, no destination override and a fresh event id. `payload` is
    /// a `serde_json::Value`, text (`&str`, `String`) or bytes (`&[u8]`, `Vec<u8>`); see
    /// [`Payload`], and [`NewEvent::json`] for any `serde::Serialize`.
    pub fn new(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: impl Into<Payload>,
    ) -> Self {
        Self {
            event_id: None,
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            event_type: event_type.into(),
            payload: payload.into(),
            headers: Headers::new(),
            destination: None,
        }
    }

    /// An event whose payload is `payload` serialized as JSON now.
    pub fn json(
        aggregate_type: impl Into<String>,
        aggregate_id: impl Into<String>,
        event_type: impl Into<String>,
        payload: &impl Serialize,
    ) -> Result<Self, Error> {
        Ok(Self::new(
            aggregate_type,
            aggregate_id,
            event_type,
            Payload::json(payload)?,
        ))
    }

    /// Set the event's content type (the [`CONTENT_TYPE_HEADER`] header), e.g.
    /// `application/vnd.apache.avro+binary`.
    pub fn content_type(self, content_type: impl Into<String>) -> Self {
        self.header(CONTENT_TYPE_HEADER, content_type)
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
    /// With a store that reads the database's log: the replication slot's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<SlotStatus>,
}

/// A replication slot as `status` and the metrics show it (log-based capture).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotStatus {
    /// The slot's name.
    pub name: String,
    /// Bytes of log the server keeps for the slot: written but not yet confirmed by the relay.
    pub lag_bytes: i64,
    /// Age in seconds of the oldest event read from the log and not yet settled, as the relay
    /// reading the slot reported it (within the last minute); `None` when nobody does.
    pub lag_secs: Option<f64>,
    /// Events the reader holds: read from the log, not yet acknowledged or dead (reported as
    /// `lag_secs` is).
    #[serde(default)]
    pub unsettled: Option<i64>,
    /// Who reads the slot now (`relay-a (pid 4242)`); `None` when nobody does.
    pub reader: Option<String>,
    /// The server's `wal_status` of the slot: `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
}

/// Who owns a shard right now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardOwner {
    pub shard: i32,
    /// The owning relay's identity as it registered it, or the session identifier.
    pub owner: String,
}

/// An operator's pause of a table (`outbox-relay pause`): while it holds, no relay claims or
/// publishes the table's events; they wait, in order, for `outbox-relay resume`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// When the pause began (the database's clock).
    pub since: DateTime<Utc>,
    /// Who paused it, as `pause --by` gave it (by default the user and host that ran it).
    pub by: String,
    /// Why, as `pause --reason` gave it; empty when none was given.
    pub reason: String,
}

/// What [`Store::pause`](crate::Store::pause) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paused {
    /// The table is paused now, by this call.
    Now(Pause),
    /// It was paused already: the pause that holds, unchanged.
    Already(Pause),
}

impl Paused {
    /// The pause that holds.
    pub fn pause(&self) -> &Pause {
        match self {
            Self::Now(pause) | Self::Already(pause) => pause,
        }
    }
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
    /// The payload and headers, when the filter asked for them ([`DeadFilter::with_payload`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<EventContent>,
}

/// Which dead rows to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadFilter {
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// Most rows returned (oldest first).
    pub limit: u32,
    /// Also read each row's payload and headers ([`DeadEvent::content`]).
    pub with_payload: bool,
}

/// An event's row as `outbox-relay events` shows it, whatever its state: where a support
/// question ("did order 42's event go out?") is answered without SQL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub id: i64,
    pub event_id: Uuid,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub event_type: String,
    /// The row's own destination, when it overrides the sink's template.
    pub destination: Option<String>,
    pub state: EventState,
    /// Failed attempts (reset by `dead retry` and `replay`).
    pub attempts: i32,
    /// The broker's (or the relay's) last error.
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    /// After a failed attempt: not claimed again before this.
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub published_at: Option<DateTime<Utc>>,
    pub dead_at: Option<DateTime<Utc>>,
    /// The payload and headers, when the filter asked for them
    /// ([`EventFilter::with_payload`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<EventContent>,
}

/// What a row holds for the broker: its payload byte for byte as a sink gets it (for a `json`
/// table, the database's rendering of the document) and the writer's headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventContent {
    pub payload: Vec<u8>,
    pub payload_type: PayloadType,
    pub headers: Headers,
}

impl EventRecord {
    /// The event as the dead list shows it; `None` unless it is dead.
    pub fn into_dead(self) -> Option<DeadEvent> {
        if self.state != EventState::Dead {
            return None;
        }
        Some(DeadEvent {
            id: self.id,
            event_id: self.event_id,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            event_type: self.event_type,
            attempts: self.attempts,
            last_error: self.last_error,
            created_at: self.created_at,
            dead_at: self.dead_at?,
            content: self.content,
        })
    }
}

/// Where an event stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EventState {
    /// Not published yet (waiting, or retrying after a failure).
    Pending,
    /// The broker acknowledged it.
    Published,
    /// Parked after its last attempt failed (`outbox-relay dead ...`).
    Dead,
}

impl EventState {
    /// The state a row's `published_at` and `dead_at` say: published wins, as every query of
    /// dead rows asks for `published_at IS NULL`.
    pub fn of(published_at: Option<DateTime<Utc>>, dead_at: Option<DateTime<Utc>>) -> Self {
        match (published_at, dead_at) {
            (Some(_), _) => EventState::Published,
            (None, Some(_)) => EventState::Dead,
            (None, None) => EventState::Pending,
        }
    }
}

/// Which events to find, whatever their state: all of the filters given hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub event_id: Option<Uuid>,
    pub aggregate_type: Option<String>,
    pub aggregate_id: Option<String>,
    /// Most rows returned (newest first).
    pub limit: u32,
    /// Also read each row's payload and headers ([`EventRecord::content`]); without it they
    /// are `None`, and large payloads are not read.
    pub with_payload: bool,
}

impl EventFilter {
    /// Whether `event` passes the filter.
    pub fn matches(&self, event_id: Uuid, aggregate_type: &str, aggregate_id: &str) -> bool {
        self.event_id.is_none_or(|id| id == event_id)
            && self
                .aggregate_type
                .as_deref()
                .is_none_or(|t| t == aggregate_type)
            && self
                .aggregate_id
                .as_deref()
                .is_none_or(|a| a == aggregate_id)
    }
}

/// Which dead rows to send back to pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeadSelection {
    /// These row ids (rows that are not dead are left alone).
    Ids(Vec<i64>),
    /// Every dead row, optionally of one aggregate.
    All { aggregate_id: Option<String> },
}

impl DeadSelection {
    /// Whether `event` (a dead one) is selected.
    pub fn contains(&self, event: &OutboxEvent) -> bool {
        match self {
            Self::Ids(ids) => ids.contains(&event.id),
            Self::All { aggregate_id } => aggregate_id
                .as_ref()
                .is_none_or(|a| *a == event.aggregate_id),
        }
    }
}

/// Published events that `relay.retention` kept, to publish again (`outbox-relay replay`):
/// those published in `[published_since, published_until)`, optionally of one aggregate type
/// or aggregate. Dead events are never among them (`dead retry` is theirs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplaySelection {
    /// Published at or after this time.
    pub published_since: DateTime<Utc>,
    /// Published before this time; `None`: up to when the replay starts (what it sends back
    /// and the relays publish again meanwhile is not selected again).
    pub published_until: Option<DateTime<Utc>>,
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate.
    pub aggregate_id: Option<String>,
}

impl ReplaySelection {
    /// Every kept event published at or after `since`.
    pub fn since(since: DateTime<Utc>) -> Self {
        Self {
            published_since: since,
            published_until: None,
            aggregate_type: None,
            aggregate_id: None,
        }
    }

    /// Whether `event`, published at `published_at`, is selected.
    pub fn contains(&self, event: &OutboxEvent, published_at: DateTime<Utc>) -> bool {
        published_at >= self.published_since
            && self
                .published_until
                .is_none_or(|until| published_at < until)
            && self
                .aggregate_type
                .as_ref()
                .is_none_or(|t| *t == event.aggregate_type)
            && self
                .aggregate_id
                .as_ref()
                .is_none_or(|a| *a == event.aggregate_id)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_payload_is_no_bytes_or_a_json_null() {
        let event = |payload: Payload| OutboxEvent::new(1, "order", "42", "Deleted", payload);
        assert!(event(Payload::Text(String::new())).payload_is_empty());
        assert!(event(Payload::Binary(Vec::new())).payload_is_empty());
        assert!(event(Payload::Json("null".to_owned())).payload_is_empty());
        assert!(event(Payload::Json(" null\n".to_owned())).payload_is_empty());
        // `null` is a word of text and four bytes of binary, not an empty payload.
        assert!(!event(Payload::Text("null".to_owned())).payload_is_empty());
        assert!(!event(Payload::Binary(b"null".to_vec())).payload_is_empty());
        for json in ["{}", "\"\"", "[]", "0", "false"] {
            assert!(
                !event(Payload::Json(json.to_owned())).payload_is_empty(),
                "{json}"
            );
        }
        assert!(!event(Payload::Binary(vec![0])).payload_is_empty());
    }
}
