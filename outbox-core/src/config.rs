//! The engine's settings (`[relay]` in the configuration file).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, Result};
use crate::store::MarkMode;

/// What happens to published rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Retention {
    /// Delete each row once the broker acknowledged it (and, in the background, the rows an
    /// earlier retention period kept).
    #[default]
    Delete,
    /// Keep published rows this long (audit), then purge them in small background batches.
    Keep(Duration),
}

impl Retention {
    /// How the engine marks acknowledged rows.
    pub fn mark_mode(self) -> MarkMode {
        match self {
            Retention::Delete => MarkMode::Delete,
            Retention::Keep(_) => MarkMode::Keep,
        }
    }
}

impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Retention::Delete => f.write_str("delete"),
            Retention::Keep(d) => write!(f, "{}", humantime::format_duration(*d)),
        }
    }
}

impl std::str::FromStr for Retention {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        if s.trim().eq_ignore_ascii_case("delete") {
            return Ok(Retention::Delete);
        }
        humantime::parse_duration(s.trim())
            .map(Retention::Keep)
            .map_err(|e| {
                Error::config(format!(
                    "retention: expected \"delete\" or a duration such as \"7d\", got \"{s}\" ({e})"
                ))
            })
    }
}

impl Serialize for Retention {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse()
            .map_err(|e: Error| serde::de::Error::custom(e.message().to_owned()))
    }
}

/// Whether a dead event keeps holding back the later events of its aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDead {
    /// The aggregate flows on; the dead event waits in `dead list`.
    #[default]
    Skip,
    /// The aggregate stops until an operator retries or discards the dead event.
    Hold,
}

/// Most rows the first claim of a relay asks for: it measures the payloads before a claim of
/// `relay.batch_size` rows could bring gigabytes of them.
pub const FIRST_CLAIM: usize = 16;

/// Engine settings. Durations are human strings (`"500ms"`, `"7d"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelayConfig {
    /// Most rows claimed (and published) per round.
    pub batch_size: usize,
    /// Payload bytes a claim aims at: after each claim the next one asks for as many rows as
    /// this holds at that claim's mean payload size (at least 1, at most `batch_size`), and the
    /// first claim asks for at most [`FIRST_CLAIM`] rows. It bounds the memory large payloads
    /// take, for which `batch_size` rows would be gigabytes.
    pub batch_bytes: usize,
    /// Failed attempts before an event is parked as dead.
    pub max_attempts: u32,
    /// `"delete"` or a duration to keep published rows.
    pub retention: Retention,
    /// Whether a dead event holds its aggregate back.
    pub on_dead: OnDead,
    /// First retry delay of an event; doubles with each attempt, with jitter.
    #[serde(with = "humantime_serde")]
    pub backoff_initial: Duration,
    /// Longest retry delay.
    #[serde(with = "humantime_serde")]
    pub backoff_max: Duration,
    /// Poll interval while rows flow.
    #[serde(with = "humantime_serde")]
    pub poll_interval_min: Duration,
    /// Poll interval reached when idle (the interval doubles on each empty poll).
    #[serde(with = "humantime_serde")]
    pub poll_interval_max: Duration,
    /// How often shard ownership is rebalanced between relays.
    #[serde(with = "humantime_serde")]
    pub rebalance_interval: Duration,
    /// How often backlog figures are refreshed for metrics.
    #[serde(with = "humantime_serde")]
    pub status_interval: Duration,
    /// How often published rows past retention are purged (with `Delete`: the rows an earlier
    /// retention period kept).
    #[serde(with = "humantime_serde")]
    pub purge_interval: Duration,
    /// Rows deleted per purge statement.
    pub purge_batch_size: u32,
    /// On SIGTERM, time allowed to finish in-flight publishes before giving up.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// A relay whose broker calls have failed as a whole for this long gives its shards back,
    /// for relays that can reach the broker, and takes shards again once its broker answers a
    /// check. Zero: it keeps them however long the broker fails.
    #[serde(with = "humantime_serde")]
    pub hand_over_after: Duration,
    /// Longest a sink's `publish` call may take: past it the engine gives the call up as a
    /// whole (its events stay pending and are sent again), so a sink that never answers (a
    /// third party's without timeouts of its own) cannot stall the relay. The shipped sinks
    /// time out on their own well before. Keep it below the server's limit for a silent shard
    /// session (4 × `store.session_timeout`, at least 2 minutes), past which the call's
    /// acknowledgements could not be marked anyway.
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
    /// Most destinations counted under a `destination` label of their own by the
    /// per-destination counters; events to further destinations are counted under
    /// `destination="(other)"`. It bounds the memory the metrics take, and the `/metrics`
    /// page, when a template holds `{aggregate_id}`. Zero: every event under `(other)`.
    pub destination_labels: usize,
    /// Most events a relay publishes per second from one table (`None`: as fast as the
    /// broker takes them): after a long outage, a backlog drains at this pace rather than all
    /// at once onto consumers. Claims ask for at most this many rows, so a burst is one
    /// second's worth at most. Per relay process: three relays on a table publish up to three
    /// times as many.
    pub max_events_per_second: Option<u32>,
    /// This relay's name in `status` (defaults to host name and process id).
    pub relay_id: Option<String>,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            batch_bytes: 8 << 20,
            max_attempts: 12,
            retention: Retention::Delete,
            on_dead: OnDead::Skip,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(300),
            poll_interval_min: Duration::from_millis(5),
            poll_interval_max: Duration::from_millis(100),
            rebalance_interval: Duration::from_secs(1),
            status_interval: Duration::from_secs(5),
            purge_interval: Duration::from_secs(10),
            purge_batch_size: 1000,
            shutdown_grace: Duration::from_secs(20),
            hand_over_after: Duration::from_secs(60),
            publish_timeout: Duration::from_secs(90),
            destination_labels: 1000,
            max_events_per_second: None,
            relay_id: None,
        }
    }
}

impl RelayConfig {
    /// Check values that serde cannot: each error names its key under `relay.`.
    pub fn validate(&self) -> Result<()> {
        if self.batch_size == 0 || self.batch_size > 100_000 {
            return Err(Error::config(format!(
                "relay.batch_size: must be between 1 and 100000, got {}",
                self.batch_size
            )));
        }
        if self.batch_bytes == 0 {
            return Err(Error::config("relay.batch_bytes: must be at least 1"));
        }
        if self.max_attempts == 0 {
            return Err(Error::config("relay.max_attempts: must be at least 1"));
        }
        if self.backoff_initial > self.backoff_max {
            return Err(Error::config(
                "relay.backoff_initial: must not be longer than relay.backoff_max",
            ));
        }
        if self.poll_interval_min.is_zero() || self.poll_interval_min > self.poll_interval_max {
            return Err(Error::config(
                "relay.poll_interval_min: must be above 0 and not longer than relay.poll_interval_max",
            ));
        }
        if self.max_events_per_second == Some(0) {
            return Err(Error::config(
                "relay.max_events_per_second: must be at least 1 (leave it out for no limit)",
            ));
        }
        if self.purge_batch_size == 0 {
            return Err(Error::config("relay.purge_batch_size: must be at least 1"));
        }
        // A zero period would run its loop without pause: thousands of database calls a second
        // from an idle relay.
        crate::plugin::refuse_zero_durations(
            "relay",
            &[
                ("rebalance_interval", self.rebalance_interval),
                ("status_interval", self.status_interval),
                ("purge_interval", self.purge_interval),
                ("publish_timeout", self.publish_timeout),
            ],
        )
    }

    /// Most rows one claim asks for: `batch_size`, and no more than one second's worth under
    /// `max_events_per_second`.
    pub fn claim_cap(&self) -> usize {
        match self.max_events_per_second {
            Some(rate) => self.batch_size.min(rate as usize).max(1),
            None => self.batch_size,
        }
    }

    /// How long publishing `events` takes at `max_events_per_second` (zero without it).
    pub fn pace(&self, events: usize) -> Duration {
        match self.max_events_per_second {
            Some(rate) if rate > 0 => Duration::from_secs_f64(events as f64 / f64::from(rate)),
            _ => Duration::ZERO,
        }
    }

    /// Retry delay after `attempts` failures (1 = first failure): exponential, capped, with
    /// full jitter in the upper half so that retries of many events spread out.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exp = attempts.saturating_sub(1).min(30);
        let base = self
            .backoff_initial
            .saturating_mul(1u32 << exp)
            .min(self.backoff_max);
        let half = base / 2;
        half + half.mul_f64(fastrand::f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_parses_delete_and_durations() {
        assert_eq!("delete".parse::<Retention>().unwrap(), Retention::Delete);
        assert_eq!(
            "7d".parse::<Retention>().unwrap(),
            Retention::Keep(Duration::from_secs(7 * 86400))
        );
        let e = "forever".parse::<Retention>().unwrap_err();
        assert!(e.message().contains("retention"), "{e}");
    }

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let c = RelayConfig {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            ..RelayConfig::default()
        };
        for _ in 0..100 {
            let b1 = c.backoff(1);
            assert!(b1 >= Duration::from_millis(50) && b1 <= Duration::from_millis(100));
            let b4 = c.backoff(4);
            assert!(b4 >= Duration::from_millis(400) && b4 <= Duration::from_millis(800));
            let b40 = c.backoff(40);
            assert!(b40 >= Duration::from_secs(5) && b40 <= Duration::from_secs(10));
        }
    }

    #[test]
    fn max_events_per_second_is_at_least_one() {
        let c = RelayConfig {
            max_events_per_second: Some(0),
            ..RelayConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().message(),
            "relay.max_events_per_second: must be at least 1 (leave it out for no limit)"
        );
        let c = RelayConfig {
            max_events_per_second: Some(1),
            ..RelayConfig::default()
        };
        assert!(c.validate().is_ok());
    }

    #[test]
    fn validate_names_the_key() {
        let c = RelayConfig {
            batch_size: 0,
            ..RelayConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .message()
            .starts_with("relay.batch_size"));
    }

    #[test]
    fn the_periods_of_the_loops_must_be_above_zero() {
        type Set = fn(&mut RelayConfig);
        let cases: [(&str, Set); 4] = [
            ("relay.rebalance_interval", |c| {
                c.rebalance_interval = Duration::ZERO
            }),
            ("relay.status_interval", |c| {
                c.status_interval = Duration::ZERO
            }),
            ("relay.purge_interval", |c| {
                c.purge_interval = Duration::ZERO
            }),
            ("relay.publish_timeout", |c| {
                c.publish_timeout = Duration::ZERO
            }),
        ];
        for (key, set) in cases {
            let mut c = RelayConfig::default();
            set(&mut c);
            let e = c.validate().unwrap_err();
            assert_eq!(e.message(), format!("{key}: must be longer than 0s"));
        }
        // Zero grace is allowed: a SIGTERM then stops at once, leaving the batch in flight pending.
        RelayConfig {
            shutdown_grace: Duration::ZERO,
            ..RelayConfig::default()
        }
        .validate()
        .unwrap();
    }
}
