#![doc = include_str!("../README.md")]

pub mod classify;
pub mod config;
pub mod migrate;
pub mod rows;
pub mod session;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use classify::{classify, Dialect, Target};
pub use config::{NameRules, QualifiedName, SqlStore, SqlStoreConfig};
pub use session::Fence;

/// Make ring the process's default TLS crypto provider, unless one is installed already.
///
/// sqlx hands ring to rustls itself for the handshake, but checking a server against the
/// system's CA certificates asks rustls for the process default, and rustls has none when a
/// build enables two providers (ring here, aws-lc-rs through other crates such as an AWS or
/// AMQP client): it would panic. Each store calls this before connecting.
pub fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing one is fine: there is one now.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

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
