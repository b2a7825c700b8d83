//! `store.capture = "logical"`: the relay reads committed events from PostgreSQL's log through
//! a replication slot (pgoutput), instead of claiming rows of the table.
//!
//! - Table style: writers insert rows as with polling; the slot's publication carries the
//!   table's inserts; the relay deletes (or marks) the rows once published, so `status`,
//!   `dead` and retention work as with polling.
//! - Message style: writers call the table's emit function (`<table>_emit`), which writes a
//!   transactional logical message (`pg_logical_emit_message`); no row per event. Dead events
//!   become dead rows of the outbox table.
//!
//! It plugs into the engine as a [`ShardSession`](outboxkit_core::ShardSession) of one shard,
//! the slot (see `session`): the engine claims, publishes, marks and records failures exactly
//! as with polling.

mod backlog;
mod decode;
pub(crate) mod session;
pub(crate) mod setup;

use pgwire_replication::TlsConfig;
use sqlx::postgres::PgConnectOptions;
use sqlx::PgConnection;

use outboxkit_core::{DeadSelection, Error, ErrorKind, PayloadType, Result};
use outboxkit_store_sql::config::{url_option, CaptureStyle};

pub(crate) use backlog::HeldFigures;
pub(crate) use setup::with_recorded;
pub use setup::{LogicalNames, SlotLag};

/// The replication connection's TLS, from the URL's `sslmode`, `sslrootcert`, `sslcert` and
/// `sslkey` (as sqlx reads them for the other connections).
pub(crate) fn tls_of_url(url: &str) -> Result<TlsConfig> {
    let mode = url_option(url, "sslmode").unwrap_or_else(|| "prefer".to_owned());
    let ca = url_option(url, "sslrootcert").map(std::path::PathBuf::from);
    let tls = match mode.as_str() {
        "disable" => TlsConfig::disabled(),
        "allow" | "prefer" => {
            let mut tls = TlsConfig::disabled();
            tls.mode = pgwire_replication::SslMode::Prefer;
            tls
        }
        "require" => TlsConfig::require(),
        "verify-ca" => TlsConfig::verify_ca(ca),
        "verify-full" => TlsConfig::verify_full(ca),
        other => {
            return Err(Error::config(format!(
                "store.url: sslmode={other} is not one the replication connection knows \
                 (disable, prefer, require, verify-ca, verify-full)"
            )))
        }
    };
    Ok(
        match (url_option(url, "sslcert"), url_option(url, "sslkey")) {
            (Some(cert), Some(key)) => tls.with_client_cert(cert, key),
            _ => tls,
        },
    )
}

/// Where the replication connection goes, and its TLS: the URL's `hostaddr` when it has one
/// (and no Unix socket), with `host` then only the name TLS checks and sends — how sqlx (0.9,
/// as libpq) connects the store's other connections; else the host or socket directory.
pub(crate) fn replication_address(
    options: &PgConnectOptions,
    hostaddr: Option<&str>,
    tls: &TlsConfig,
) -> (String, TlsConfig) {
    match hostaddr {
        Some(address) if options.get_socket().is_none() => (
            address.to_owned(),
            tls.clone().with_sni_hostname(options.get_host()),
        ),
        _ => (crate::config::host(options), tls.clone()),
    }
}

/// The password of `store.url` or `store.password`, for the replication connection.
pub(crate) fn password_of(url: &str, password: Option<&str>) -> Option<String> {
    if let Some(password) = password {
        return Some(password.to_owned());
    }
    let url = url::Url::parse(url).ok()?;
    url.password()
        .map(|p| {
            percent_encoding::percent_decode_str(p)
                .decode_utf8_lossy()
                .into_owned()
        })
        .or_else(|| url_option(url.as_str(), "password"))
}

/// `dead retry` with logical capture: the dead rows leave the table and their events are
/// written again (a new row, or a new message) with the same `event_id` and `created_at`, in
/// one transaction, in `id` order: they come back through the log, after the events their
/// aggregates committed meanwhile. The event's fields go from row to row (or message) inside
/// the server, so the payload is the one the writer wrote, byte for byte.
pub(crate) async fn retry_dead(
    conn: &mut PgConnection,
    store: &crate::PostgresStore,
    names: &LogicalNames,
    payload_type: PayloadType,
    selection: &DeadSelection,
) -> std::result::Result<u64, Error> {
    let table = store.table().quoted();
    let (ids, aggregate): (Option<Vec<i64>>, Option<String>) = match selection {
        DeadSelection::Ids(ids) => (Some(ids.clone()), None),
        DeadSelection::All { aggregate_id } => (None, aggregate_id.clone()),
    };
    let dead = "dead_at IS NOT NULL AND published_at IS NULL \
                AND ($1::int8[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR aggregate_id = $2)";
    let retried = match names.style {
        CaptureStyle::Table => sqlx::query(crate::sql::written_again(&table, dead))
            .bind(ids)
            .bind(aggregate)
            .execute(&mut *conn)
            .await
            .map_err(|e| store.classify(e))?
            .rows_affected(),
        CaptureStyle::Message => {
            // One message per row, written in id order (the order of their aggregates).
            let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT id FROM {table} WHERE {dead} ORDER BY id FOR UPDATE"
            )))
            .bind(ids)
            .bind(aggregate)
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| store.classify(e))?;
            let re_emit = setup::re_emit_dead_row(names, store.table(), payload_type);
            for id in &ids {
                sqlx::query(&re_emit)
                    .bind(id)
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(|e| store.classify(e))?;
            }
            ids.len() as u64
        }
    };
    Ok(retried)
}

/// `replay` with logical capture is refused in message style, which keeps no published events
/// (writers emit messages; only dead events become rows). Table style writes the kept rows
/// again (`Sql::replay_rewrite`), so the log carries them, after what their aggregates committed
/// since.
pub(crate) fn refuse_replay(names: &LogicalNames, table: &crate::TableName) -> Result<()> {
    if names.style != CaptureStyle::Message {
        return Ok(());
    }
    // Not a configuration error: the configuration is fine, the request cannot be met.
    Err(Error::new(
        ErrorKind::Other,
        format!(
            "{table} is captured from the log in message style (store.logical.style), which \
             keeps no published events: writers emit messages and only dead events become \
             rows, so there is nothing to publish again"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replication_connection_takes_the_urls_tls_and_password() {
        assert_eq!(
            password_of("postgres://u:p%40ss@h/db", None).as_deref(),
            Some("p@ss")
        );
        assert_eq!(
            password_of("postgres://u:x@h/db", Some("file")).as_deref(),
            Some("file")
        );
        assert_eq!(password_of("postgres://u@h/db", None), None);
        assert!(!tls_of_url("postgres://h/db").unwrap().mode.requires_tls());
        let tls = tls_of_url("postgres://h/db?sslmode=verify-full&sslrootcert=/ca.pem").unwrap();
        assert!(tls.mode.verifies_hostname());
        assert!(tls_of_url("postgres://h/db?sslmode=bogus").is_err());
    }

    #[test]
    fn the_replication_connection_goes_to_hostaddr_and_names_host_for_tls() {
        let tls = tls_of_url("postgres://h/db?sslmode=verify-full").unwrap();
        let at = |url: &str| {
            let options: PgConnectOptions = url.parse().unwrap();
            let hostaddr = outboxkit_store_sql::config::url_option(url, "hostaddr");
            let (host, tls) = replication_address(&options, hostaddr.as_deref(), &tls);
            (host, tls.sni_hostname)
        };
        assert_eq!(
            at("postgres://db.internal/app"),
            ("db.internal".to_owned(), None)
        );
        assert_eq!(
            at("postgres://db.internal/app?hostaddr=10.0.0.5"),
            ("10.0.0.5".to_owned(), Some("db.internal".to_owned()))
        );
        // A socket wins over hostaddr, as in sqlx.
        assert_eq!(
            at("postgres://u@db.internal/app?host=/run/postgresql&hostaddr=10.0.0.5"),
            ("/run/postgresql".to_owned(), None)
        );
    }
}
