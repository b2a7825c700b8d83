#![doc = include_str!("../README.md")]

mod classify;
pub mod config;
mod enqueue;
mod inbox;
pub mod logical;
mod migrate;
mod session;
mod sql;
mod store;

pub use config::{Postgres, PostgresStoreConfig, TableName};
pub use enqueue::{enqueue, enqueue_many, Outbox};
pub use inbox::Inbox;
pub use logical::session::LogicalSession;
pub use migrate::SCHEMA_VERSION;
pub use outboxkit_store_sql::config::{Capture, CaptureStyle, LogicalSettings};
pub use session::PostgresShardSession;
pub use store::PostgresStore;

/// The sqlx version this crate is built with, for writers' transactions.
pub use sqlx;
