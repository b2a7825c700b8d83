#![doc = include_str!("../README.md")]

pub mod batch;
pub mod classify;
pub mod client;
pub mod message;
