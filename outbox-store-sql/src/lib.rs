#![doc = include_str!("../README.md")]

pub mod classify;
pub mod config;
pub mod migrate;
pub mod rows;
pub mod session;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use classify::{classify, Dialect, Target};
pub use config::{NameRules, QualifiedName};
pub use session::Fence;

/// `1m 30s` style, as the settings are written.
pub fn format_duration(duration: std::time::Duration) -> String {
    humantime::format_duration(duration).to_string()
}
