#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;

pub use config::{
    RabbitMqConfig, TlsConfig, UnroutablePolicy, CONFIG_SECTION, MAX_SHORT_STRING_BYTES,
};
pub use sink::RabbitMqSink;
