#![doc = include_str!("../README.md")]

pub mod cloudevents;
pub mod command;
pub mod config;
pub mod engine;
pub mod error;
#[cfg(any(test, feature = "testkit"))]
pub mod memory;
pub mod metrics;
pub mod model;
pub mod plugin;
pub mod redact;
pub mod sink;
pub mod store;
pub mod template;
#[cfg(feature = "testkit")]
pub mod testkit;
#[cfg(feature = "tls")]
pub mod tls;

pub use config::{OnDead, RelayConfig, Retention};

/// The name of the pipeline of a configuration that declares only one (`[store]` and `[sink]`
/// at the top level), and of a [`Relay`] that was not given one.
pub const DEFAULT_PIPELINE: &str = "default";

pub use engine::{default_relay_id, Relay, RelayHandle, Shutdown, ShutdownTrigger};
pub use error::{BoxError, Error, ErrorKind, Result};
pub use model::{
    BacklogStatus, DeadEvent, DeadFilter, DeadSelection, EventContent, EventFilter, EventRecord,
    EventState, Headers, HeldBack, NewEvent, OutboxEvent, Outcome, Pause, Paused, Payload,
    PayloadType, ReplaySelection, ShardOwner, SlotStatus, CONTENT_TYPE_HEADER,
};
pub use plugin::{Discovery, SinkConfig, StoreConfig};
pub use sink::{whole_call_failure, Sink, SinkCapabilities};
pub use store::{ClaimRequest, ClusterView, Failure, MarkMode, ShardSession, Store};
pub use template::DestinationTemplate;
