#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;

pub use config::{RedisStreamsConfig, CONFIG_SECTION};
pub use sink::RedisStreamsSink;
