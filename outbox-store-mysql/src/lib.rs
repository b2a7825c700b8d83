#![doc = include_str!("../README.md")]

mod classify;
pub mod config;
mod enqueue;
mod inbox;
mod migrate;
mod session;
mod sql;
mod store;

pub use config::{MySql, MySqlStoreConfig, TableName};
pub use enqueue::{enqueue, enqueue_many, Outbox, MAX_DESTINATION_CHARS, MAX_NAME_CHARS};
pub use inbox::{Inbox, MAX_CONSUMER_CHARS};
pub use migrate::SCHEMA_VERSION;
pub use session::MySqlShardSession;
pub use store::{MySqlStore, ServerInfo};

/// The sqlx version this crate is built with, for writers' transactions.
pub use sqlx;
