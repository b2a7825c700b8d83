#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;
mod tls;

pub use config::{RedisStreamsConfig, TlsConfig, CONFIG_SECTION};
pub use sink::RedisStreamsSink;
