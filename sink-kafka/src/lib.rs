#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;
mod topics;

pub use config::{
    is_secret_property, KafkaSinkConfig, RecordTimestamp, BOOTSTRAP_SERVERS, CONFIG_SECTION,
    DEFAULT_TOPIC, OWN_KEYS, SAFE_DEFAULTS,
};
pub use sink::{KafkaContext, KafkaSink, RELAY_HEADERS};
pub use topics::{ensure_topics, TopicSpec};
