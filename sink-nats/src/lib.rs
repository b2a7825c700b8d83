#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;
pub mod subject;

pub use config::{NatsConfig, Storage, StreamDeclaration, TlsConfig, CONFIG_SECTION};
pub use sink::{NatsSink, EVENT_HEADERS, MSG_ID_HEADER};
