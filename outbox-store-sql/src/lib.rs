#![doc = include_str!("../README.md")]

pub mod classify;
pub mod config;
pub mod enqueue;
pub mod inbox;
pub mod migrate;
pub mod payload;
pub mod privileges;
pub mod rows;
pub mod session;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use classify::{classify, Dialect, Target};
pub use config::{NameRules, QualifiedName, SqlStore, SqlStoreConfig, TableName, TableRules};
pub use session::Fence;

/// Make ring the process's default TLS crypto provider unless one is set (each store calls
/// it before connecting; see `outboxkit_core::tls`).
pub use outboxkit_core::tls::install_ring_provider as ensure_crypto_provider;

/// Most kept events one statement of `Store::replay` sends back to pending: a replay of days of
/// events goes in transactions of this many rows, in id order, so that it holds no lock and
/// leaves no dead tuples for long, and the relays publish the first ones while the rest follow.
pub const REPLAY_BATCH: i64 = 10_000;

/// Run `batch` (one statement of at most [`REPLAY_BATCH`] rows, returning how many it changed)
/// until one changes fewer; the total.
pub async fn in_replay_batches<F, Fut, E>(mut batch: F) -> Result<u64, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<u64, E>>,
{
    let mut total = 0;
    loop {
        let n = batch().await?;
        total += n;
        if n < REPLAY_BATCH as u64 {
            return Ok(total);
        }
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
