#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod queue;
mod sink;

pub use config::{
    SqsConfig, CONFIG_SECTION, DEFAULT_MAX_REQUEST_BYTES, MAX_ENTRIES_PER_REQUEST,
    SQS_MAX_REQUEST_BYTES,
};
pub use outboxkit_aws::message::{
    group_id, CONTENT_TYPE_ATTRIBUTE, EVENT_ATTRIBUTES, MAX_ATTRIBUTES, OVERFLOW_ATTRIBUTE,
};
pub use queue::is_fifo_name;
pub use sink::SqsSink;
