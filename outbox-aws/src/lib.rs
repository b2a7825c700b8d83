#![doc = include_str!("../README.md")]

pub mod batch;
pub mod classify;
pub mod client;
pub mod message;
pub mod sink;
#[cfg(feature = "testkit")]
pub mod testkit;
