#![doc = include_str!("../README.md")]

pub mod classify;
mod config;
mod sink;
mod topic;

pub use config::{SnsConfig, CONFIG_SECTION, SNS_MAX_REQUEST_BYTES};
pub use outboxkit_aws::message::{CONTENT_TYPE_ATTRIBUTE, EVENT_ATTRIBUTES, OVERFLOW_ATTRIBUTE};
pub use sink::SnsSink;
pub use topic::is_fifo_name;
