//! sqlx errors → relay errors, for what every SQL server shares: I/O, TLS, protocol, pool and
//! configuration errors, decoding errors. A [`Dialect`] classifies its server's own errors.
//!
//! | sqlx error | kind | retryable |
//! |---|---|---|
//! | TLS handshake refused (certificate not trusted, wrong host, expired, alert) | `Config` | no |
//! | I/O, other TLS, protocol, crashed worker, pool timed out / closed | `Connection` | yes |
//! | server error | [`Dialect::database_error`] | |
//! | sqlx configuration error | `Config` | no |
//! | anything else | `Other` | no |

use std::io;
use std::time::Duration;

use sqlx::error::DatabaseError;

use outboxkit_core::{Error, ErrorKind, Result};

use crate::format_duration;

/// What differs between SQL servers in error messages, and the classification of the server's
/// own errors.
pub trait Dialect: Send + Sync + 'static {
    /// The server as messages name it: `PostgreSQL`, `MySQL`.
    const PRODUCT: &'static str;
    /// The URL option that sets TLS, named when TLS fails (`sslmode`).
    const TLS_OPTION: &'static str;
    /// Its values, as the documentation writes them (the driver takes any case).
    const TLS_MODES: &'static [&'static str];
    /// The URL option naming the CA file that verifies the server (`sslrootcert`).
    const CA_OPTION: &'static str;
    /// The URL options of a client certificate (`sslcert and sslkey`).
    const CLIENT_CERT_OPTIONS: &'static str;
    /// What may be unreachable when the pool gives no connection: `database`, `server`.
    const UNREACHABLE: &'static str;

    /// The relay's error for an error the server sent (`sqlx::Error::Database`).
    fn database_error(error: Box<dyn DatabaseError>, target: &Target) -> Error;
}

/// What error messages name: where the database is and which table was used.
#[derive(Debug, Clone, Default)]
pub struct Target {
    /// `host:port` (or socket path).
    pub endpoint: Option<String>,
    pub database: Option<String>,
    pub user: Option<String>,
    /// The table as configured or resolved (`public.outbox`).
    pub table: String,
    /// The CA file the URL names ([`Dialect::CA_OPTION`]), if any.
    pub ca_file: Option<String>,
    /// The TLS mode the URL sets ([`Dialect::TLS_OPTION`]), if it sets one: connection errors
    /// then say it (`store.url, sslmode=verify-full`).
    pub tls_mode: Option<String>,
    /// Whether `store.password` (or `password_file`) gave the password, not the URL: refused
    /// credentials then name that key too.
    pub password_key: bool,
    /// The server as errors name it once a connection told (`MariaDB` for a `mysql` store);
    /// [`Dialect::PRODUCT`] until then.
    pub product: Option<&'static str>,
    /// The URL option that sets the name the server's certificate must hold, when the URL
    /// sets it apart from its host (MySQL's `tls-sni-servername`): a certificate for another
    /// name is then blamed on it, not on the host.
    pub tls_name_option: Option<&'static str>,
}

impl Target {
    /// A target that knows only its table (an inbox table, before any connection).
    pub fn table(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            ..Self::default()
        }
    }

    /// The keys that gave the user and the password, for refused credentials: `store.url`, or
    /// `store.url, store.password` when the password came from its own key.
    pub fn credentials_key(&self) -> &'static str {
        if self.password_key {
            "store.url, store.password"
        } else {
            "store.url"
        }
    }

    /// `store.url`, with the URL's TLS mode when it sets one: `store.url, sslmode=require`.
    pub fn url_key<D: Dialect>(&self) -> String {
        match &self.tls_mode {
            Some(mode) => format!("store.url, {}={mode}", D::TLS_OPTION),
            None => "store.url".to_owned(),
        }
    }

    /// `PostgreSQL at host:port`, or the bare product when the endpoint is unknown.
    pub fn at<D: Dialect>(&self) -> String {
        let product = self.product::<D>();
        match &self.endpoint {
            Some(endpoint) => format!("{product} at {endpoint}"),
            None => product.to_owned(),
        }
    }

    /// The server as errors name it: [`product`](Self::product) once known, else
    /// [`Dialect::PRODUCT`].
    pub fn product<D: Dialect>(&self) -> &'static str {
        self.product.unwrap_or(D::PRODUCT)
    }
}

/// `error` made temporary (retryable) or permanent.
pub fn with_retryability(error: Error, retryable: bool) -> Error {
    if retryable {
        error.temporary()
    } else {
        error.permanent()
    }
}

fn describe_io(error: &io::Error) -> String {
    let text = match error.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused",
        io::ErrorKind::ConnectionReset => "connection reset",
        io::ErrorKind::ConnectionAborted => "connection aborted",
        io::ErrorKind::BrokenPipe => "connection closed (broken pipe)",
        io::ErrorKind::UnexpectedEof => "connection closed by the server",
        io::ErrorKind::TimedOut => "timed out",
        io::ErrorKind::NotFound => "not found",
        io::ErrorKind::PermissionDenied => "permission denied",
        _ => return error.to_string(),
    };
    text.to_owned()
}

/// Map a sqlx error to the relay's error. Messages name the server or table and say what to do.
pub fn classify<D: Dialect>(error: sqlx::Error, target: &Target) -> Error {
    let at = target.at::<D>();
    let table = &target.table;
    if let Some(tls) = tls_error(&error) {
        return certificate_error::<D>(tls, target);
    }
    match error {
        sqlx::Error::Io(e) => Error::new(
            ErrorKind::Connection,
            format!(
                "cannot reach {at} ({}): {}",
                target.url_key::<D>(),
                describe_io(&e)
            ),
        ),
        sqlx::Error::Tls(e) => {
            // The mode the URL asks for, or the option that would set it.
            let key = match &target.tls_mode {
                Some(_) => target.url_key::<D>(),
                None => format!("store.url, {}", D::TLS_OPTION),
            };
            let e = e.to_string();
            let advice = if e.contains("does not support TLS") {
                format!(
                    " — enable TLS on the server, or lower {} in store.url",
                    D::TLS_OPTION
                )
            } else {
                String::new()
            };
            Error::new(
                ErrorKind::Connection,
                format!("TLS with {at} failed ({key}): {e}{advice}"),
            )
        }
        sqlx::Error::Protocol(e) => Error::new(
            ErrorKind::Connection,
            format!("the connection to {at} broke: {e}"),
        ),
        sqlx::Error::WorkerCrashed => Error::new(
            ErrorKind::Connection,
            format!("the connection to {at} broke (its background worker stopped)"),
        ),
        sqlx::Error::PoolTimedOut => Error::new(
            ErrorKind::Connection,
            format!(
                "no connection to {at} could be had within store.connect_timeout: the {} \
                 is unreachable or every connection of the pool (store.pool_size) is busy",
                D::UNREACHABLE
            ),
        ),
        sqlx::Error::PoolClosed => Error::new(
            ErrorKind::Connection,
            format!("the connection pool to {at} was closed"),
        ),
        sqlx::Error::Configuration(e) => Error::config(format!("store.url: {e}")),
        sqlx::Error::Database(e) => D::database_error(e, target),
        other => Error::new(
            ErrorKind::Other,
            format!("unexpected answer from {at} about table {table}: {other}"),
        )
        .permanent(),
    }
}

/// [`classify`] for a call on a pool of at most `max` connections that holds `size` now: a
/// pool that timed out says which of its two causes it was. sqlx keeps retrying a connection
/// the server refuses (down, starting up, at its own connection limit) until
/// `store.connect_timeout`, so the pool then holds fewer than `max`; when every one of its
/// connections was in use, it holds `max`.
pub fn classify_pooled<D: Dialect>(
    error: sqlx::Error,
    target: &Target,
    size: u32,
    max: u32,
) -> Error {
    if !matches!(error, sqlx::Error::PoolTimedOut) {
        return classify::<D>(error, target);
    }
    let at = target.at::<D>();
    let message = if size < max {
        format!(
            "cannot reach {at} ({}): it refused every connection for store.connect_timeout (the \
             {} is down, starting up, or at its own connection limit)",
            target.url_key::<D>(),
            D::UNREACHABLE
        )
    } else {
        format!(
            "no connection to {at} within store.connect_timeout: all {max} connections of the \
             pool (store.pool_size) were in use"
        )
    };
    Error::new(ErrorKind::Connection, message)
}

/// [`classify_pooled`] with the state of `pool` now.
pub fn classify_on_pool<D: Dialect, DB: sqlx::Database>(
    error: sqlx::Error,
    target: &Target,
    pool: &sqlx::Pool<DB>,
) -> Error {
    let max = pool.options().get_max_connections();
    classify_pooled::<D>(error, target, pool.size(), max)
}

/// The TLS library's error inside a sqlx error (a failed handshake comes as I/O or TLS).
fn tls_error(error: &sqlx::Error) -> Option<&rustls::Error> {
    match error {
        sqlx::Error::Io(e) => outboxkit_core::tls::rustls_error(e),
        sqlx::Error::Tls(e) => outboxkit_core::tls::rustls_error(e.as_ref()),
        _ => None,
    }
}

/// A failed TLS handshake: a configuration error at start (never retried as if the server were
/// down), saying what the server presented and which URL option to fix.
fn certificate_error<D: Dialect>(error: &rustls::Error, target: &Target) -> Error {
    let at = target.at::<D>();
    let ca_key = format!("store.url's {}", D::CA_OPTION);
    let ca_setting = format!("{} in store.url", D::CA_OPTION);
    let tls_key = format!("store.url, {}", D::TLS_OPTION);
    let client_cert = format!("store.url: {}", D::CLIENT_CERT_OPTIONS);
    outboxkit_core::tls::certificate_error(
        error,
        &outboxkit_core::tls::TlsSettings {
            at: &at,
            url_key: "store.url",
            tls_key: &tls_key,
            ca_key: &ca_key,
            ca_setting: &ca_setting,
            ca_file: target.ca_file.as_deref(),
            client_cert: &client_cert,
            name_option: target.tls_name_option,
        },
    )
}

/// Connect within `connect_timeout`. `Err` when the server gave no answer in time
/// ([`no_answer_within`]); else the driver's outcome, for the caller to classify.
pub async fn connect_within<D: Dialect, O: sqlx::ConnectOptions>(
    options: &O,
    target: &Target,
    connect_timeout: Duration,
) -> Result<std::result::Result<O::Connection, sqlx::Error>>
where
    O::Connection: Sized,
{
    tokio::time::timeout(connect_timeout, options.connect())
        .await
        .map_err(|_| no_answer_within::<D>(target, connect_timeout))
}

/// Connect within `connect_timeout`; a refusal is classified as `D`'s error about `target`.
pub async fn connect<D: Dialect, O: sqlx::ConnectOptions>(
    options: &O,
    target: &Target,
    connect_timeout: Duration,
) -> Result<O::Connection>
where
    O::Connection: Sized,
{
    connect_within::<D, O>(options, target, connect_timeout)
        .await?
        .map_err(|e| classify::<D>(e, target))
}

/// Every table `statement` lists, as (schema or database, table), read on one short
/// connection with `options`: what a store's [`SqlStore::list_tables`](crate::SqlStore::list_tables)
/// returns.
pub async fn list_tables<D, O, DB>(
    options: &O,
    target: &Target,
    connect_timeout: Duration,
    statement: impl sqlx::SqlSafeStr,
) -> Result<Vec<(String, String)>>
where
    D: Dialect,
    O: sqlx::ConnectOptions,
    O::Connection: sqlx::Connection<Database = DB> + Sized,
    DB: sqlx::Database,
    for<'c> &'c mut O::Connection: sqlx::Executor<'c, Database = DB>,
    DB::Arguments: sqlx::IntoArguments<DB>,
    for<'r> (String, String): sqlx::FromRow<'r, DB::Row> + Send + Unpin,
{
    use sqlx::Connection;
    let mut conn = connect::<D, O>(options, target, connect_timeout).await?;
    let tables = sqlx::query_as(statement)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| classify::<D>(e, target))?;
    if let Err(e) = conn.close().await {
        tracing::debug!("closing the discovery connection: {e}");
    }
    Ok(tables)
}

/// The server takes no writes (`why`: what said so). The relay must not claim there: it would
/// publish rows it can never mark (or, as a user allowed to write on a read-only replica, mark
/// them on the replica), again at every session. Retryable: after a failover the address in
/// store.url may lead to the new primary.
pub fn read_only<D: Dialect>(target: &Target, why: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "{} is read-only ({why}): the relay marks and deletes rows of table {}, so it needs \
             the primary; point store.url at it (a replica's or a reader endpoint's address \
             will not do)",
            target.at::<D>(),
            target.table
        ),
    )
}

/// The error of a connection attempt that got no answer within `store.connect_timeout`.
pub fn no_answer_within<D: Dialect>(target: &Target, connect_timeout: Duration) -> Error {
    Error::new(
        ErrorKind::Connection,
        format!(
            "cannot reach {} at {} ({}): no answer within {} (store.connect_timeout)",
            target.product::<D>(),
            target.endpoint.as_deref().unwrap_or("?"),
            target.url_key::<D>(),
            format_duration(connect_timeout)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::SomeSql as Plain;

    fn target() -> Target {
        Target {
            endpoint: Some("db:1234".to_owned()),
            ..Target::table("app.outbox")
        }
    }

    #[test]
    fn messages_name_the_product_and_the_endpoint() {
        assert_eq!(Target::table("t").at::<Plain>(), "SomeSQL");
        let e = classify::<Plain>(
            sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset)),
            &target(),
        );
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert_eq!(
            e.message(),
            "cannot reach SomeSQL at db:1234 (store.url): connection reset"
        );
        // A URL that sets a TLS mode: connection errors say it.
        let tls = Target {
            tls_mode: Some("require".to_owned()),
            ..target()
        };
        let e = classify::<Plain>(
            sqlx::Error::Io(io::Error::from(io::ErrorKind::ConnectionReset)),
            &tls,
        );
        assert_eq!(
            e.message(),
            "cannot reach SomeSQL at db:1234 (store.url, tls=require): connection reset"
        );
        let e = no_answer_within::<Plain>(&tls, Duration::from_secs(1));
        assert!(
            e.message().contains("(store.url, tls=require): no answer"),
            "{e}"
        );
        let e = classify::<Plain>(sqlx::Error::Tls("bad".into()), &target());
        assert_eq!(
            e.message(),
            "TLS with SomeSQL at db:1234 failed (store.url, tls): bad"
        );
        // A server without TLS, where the URL requires it: the mode, and what to change.
        let e = classify::<Plain>(sqlx::Error::Tls("server does not support TLS".into()), &tls);
        assert_eq!(
            e.message(),
            "TLS with SomeSQL at db:1234 failed (store.url, tls=require): server does not \
             support TLS — enable TLS on the server, or lower tls in store.url"
        );
        let e = classify::<Plain>(sqlx::Error::PoolTimedOut, &target());
        assert!(
            e.message().contains(": the server is unreachable or"),
            "{e}"
        );
        let refused = classify_pooled::<Plain>(sqlx::Error::PoolTimedOut, &target(), 0, 4);
        assert_eq!(
            refused.message(),
            "cannot reach SomeSQL at db:1234 (store.url): it refused every connection for \
             store.connect_timeout (the server is down, starting up, or at its own connection \
             limit)"
        );
        let busy = classify_pooled::<Plain>(sqlx::Error::PoolTimedOut, &target(), 4, 4);
        assert!(
            busy.message()
                .ends_with("all 4 connections of the pool (store.pool_size) were in use"),
            "{busy}"
        );
        assert!(refused.is_retryable() && busy.is_retryable());
        let other = classify_pooled::<Plain>(sqlx::Error::PoolClosed, &target(), 0, 4);
        assert_eq!(
            other.message(),
            classify::<Plain>(sqlx::Error::PoolClosed, &target()).message()
        );
        let e = classify::<Plain>(sqlx::Error::RowNotFound, &target());
        assert!(!e.is_retryable() && e.message().contains("table app.outbox"));
    }

    #[test]
    fn a_connection_without_answer_names_the_timeout() {
        let e = no_answer_within::<Plain>(&target(), Duration::from_millis(1500));
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert_eq!(
            e.message(),
            "cannot reach SomeSQL at db:1234 (store.url): no answer within 1s 500ms \
             (store.connect_timeout)"
        );
    }

    #[test]
    fn retryability_is_set_either_way() {
        let e = || Error::new(ErrorKind::Other, "x");
        assert!(with_retryability(e(), true).is_retryable());
        assert!(!with_retryability(e().temporary(), false).is_retryable());
    }
}
