//! Metric names (Prometheus) recorded by the engine through the `metrics` facade. The binary
//! installs the exporter; a library user may install any recorder.
//!
//! Every metric carries the label [`PIPELINE`]: the name of the pipeline (outbox table and
//! sink) the relay serves, `default` for a configuration of one pipeline.

/// The label every metric carries: the pipeline's name.
pub const PIPELINE: &str = "pipeline";

/// Counter: events acknowledged by the broker. Labels: `sink`, `destination`.
pub const EVENTS_PUBLISHED: &str = "outbox_events_published_total";
/// Counter: failed attempts that will be retried. Labels: `sink`, `destination`, `error`.
pub const EVENTS_RETRIED: &str = "outbox_events_retried_total";
/// Counter: events parked as dead. Labels: `sink`, `destination`, `error`.
pub const EVENTS_DEAD: &str = "outbox_events_dead_total";
/// Gauge: rows pending (not published, not dead).
pub const PENDING: &str = "outbox_pending_events";
/// Gauge: age in seconds of the oldest pending row — the SLO metric.
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Gauge: rows parked as dead.
pub const DEAD: &str = "outbox_dead_events";
/// Gauge, while `relay.retention` keeps published rows: age in seconds of the oldest kept event
/// by its `published_at` — how far back `replay` reaches; 0 when none is kept. Not recorded
/// with `retention = "delete"`.
pub const OLDEST_KEPT_AGE: &str = "outbox_oldest_kept_age_seconds";
/// Gauge: aggregates whose next event waits for a retry.
pub const HELD_BACK_AGGREGATES: &str = "outbox_held_back_aggregates";
/// Histogram: seconds from the row's `created_at` to the broker's acknowledgement.
pub const COMMIT_TO_ACK: &str = "outbox_commit_to_ack_seconds";
/// Histogram: seconds one `publish` call took.
pub const PUBLISH_DURATION: &str = "outbox_publish_batch_seconds";
/// Gauge: shards this relay owns.
pub const SHARDS_OWNED: &str = "outbox_shards_owned";
/// Counter: whole-call failures. Label `stage`: `session`, `rebalance`, `claim`, `publish`, `mark`,
/// `status`, `purge`.
pub const ERRORS: &str = "outbox_relay_errors_total";
/// Counter: times this relay gave its shards back because every publish call failed for
/// `relay.hand_over_after`.
pub const HAND_OVERS: &str = "outbox_hand_overs_total";
/// Histogram, under `relay.max_events_per_second`: seconds a batch waited to keep to that
/// pace (its `_sum` is the time waited). Rising while `outbox_pending_events` grows: the pace,
/// not the broker, holds the backlog back.
pub const PACE_WAIT: &str = "outbox_pace_wait_seconds";
/// Gauge: 1 while an operator's pause (`outbox-relay pause`) holds the table, as this relay
/// last read it; 0 otherwise. Recorded by every relay.
pub const PAUSED: &str = "outbox_paused";
/// Counter: published rows deleted by the retention purge.
pub const PURGED: &str = "outbox_purged_total";
/// Gauge, recorded by the binary for a pipeline whose `store.table` is a pattern: the tables
/// it matched, by `state`: `relaying`, `unmigrated` (found but not migrated: not relayed until
/// `migrate` runs on it), `failing` (cannot be connected now; tried again at the next scan).
pub const DISCOVERED_TABLES: &str = "outbox_discovered_tables";

/// Gauge, with log-based capture: bytes of log the database keeps for the relay's replication
/// slot (written, not yet confirmed). Label `slot`.
pub const SLOT_LAG_BYTES: &str = "outbox_slot_lag_bytes";
/// Gauge, with log-based capture, recorded by the relay reading the slot: age in seconds of the
/// oldest event read from the log and not yet acknowledged (0 when none). Label `slot`.
pub const SLOT_LAG_SECONDS: &str = "outbox_slot_lag_seconds";

/// Buckets for the latency histograms, in seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Every metric name, for exporters that pre-register them.
pub const ALL: &[&str] = &[
    EVENTS_PUBLISHED,
    EVENTS_RETRIED,
    EVENTS_DEAD,
    PENDING,
    OLDEST_PENDING_AGE,
    DEAD,
    OLDEST_KEPT_AGE,
    HELD_BACK_AGGREGATES,
    COMMIT_TO_ACK,
    PUBLISH_DURATION,
    SHARDS_OWNED,
    ERRORS,
    HAND_OVERS,
    PACE_WAIT,
    PAUSED,
    PURGED,
    DISCOVERED_TABLES,
    SLOT_LAG_BYTES,
    SLOT_LAG_SECONDS,
];
