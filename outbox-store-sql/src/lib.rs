#![doc = include_str!("../README.md")]

pub mod classify;
pub mod config;
pub mod enqueue;
pub mod inbox;
pub mod migrate;
pub mod pause;
pub mod payload;
pub mod privileges;
pub mod replay;
pub mod rows;
pub mod session;
pub mod statement;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use classify::{classify, Dialect, Target};
pub use config::{NameRules, QualifiedName, SqlStore, SqlStoreConfig, TableName, TableRules};
pub use replay::REPLAY_BATCH;
pub use session::Fence;
pub use statement::Statement;

/// Make ring the process's default TLS crypto provider unless one is set (each store calls
/// it before connecting; see `outboxkit_core::tls`).
pub use outboxkit_core::tls::install_ring_provider as ensure_crypto_provider;

/// `1m 30s` style, as the settings are written.
pub fn format_duration(duration: std::time::Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A server whose own errors are all permanent `Other` errors, for the tests.
#[cfg(test)]
struct SomeSql;

#[cfg(test)]
impl Dialect for SomeSql {
    const PRODUCT: &'static str = "SomeSQL";
    const TLS_OPTION: &'static str = "tls";
    const TLS_MODES: &'static [&'static str] = &["off", "on"];
    const CA_OPTION: &'static str = "tls-ca";
    const CLIENT_CERT_OPTIONS: &'static str = "tls-cert and tls-key";
    const UNREACHABLE: &'static str = "server";

    fn database_error(
        error: Box<dyn sqlx::error::DatabaseError>,
        _: &Target,
    ) -> outboxkit_core::Error {
        outboxkit_core::Error::new(outboxkit_core::ErrorKind::Other, error.message().to_owned())
            .permanent()
    }
}
