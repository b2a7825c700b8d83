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
//! the slot (see [`session`]): the engine claims, publishes, marks and records failures exactly
//! as with polling.

mod backlog;
mod decode;
pub(crate) mod session;
pub(crate) mod setup;

use chrono::{DateTime, Utc};
use pgwire_replication::TlsConfig;
use sqlx::PgConnection;

use outboxkit_core::{DeadSelection, Error, ErrorKind, PayloadType, ReplaySelection, Result};
use outboxkit_store_sql::config::{url_option, CaptureStyle};
use outboxkit_store_sql::REPLAY_BATCH;

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
        CaptureStyle::Table => {
            // ORDER BY id: the new rows' identities follow the old rows' order.
            let columns = "event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
                           destination, created_at";
            sqlx::query(&format!(
                "WITH gone AS (DELETE FROM {table} WHERE {dead} RETURNING id, {columns}) \
                 INSERT INTO {table} ({columns}) SELECT {columns} FROM gone ORDER BY id"
            ))
            .bind(ids)
            .bind(aggregate)
            .execute(&mut *conn)
            .await
            .map_err(|e| store.classify(e))?
            .rows_affected()
        }
        CaptureStyle::Message => {
            // One message per row, written in id order (the order of their aggregates).
            let ids: Vec<i64> = sqlx::query_scalar(&format!(
                "SELECT id FROM {table} WHERE {dead} ORDER BY id FOR UPDATE"
            ))
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

/// `replay` with logical capture. Table style: the kept rows the selection names leave the table
/// and are written again (same `event_id`, `created_at`, payload), pending, in one statement and
/// in `id` order, so the log carries them again, after what their aggregates committed since.
/// Message style keeps no published events (only dead ones are rows): an error says so, also
/// for a dry run.
pub(crate) async fn replay(
    conn: &mut PgConnection,
    store: &crate::PostgresStore,
    names: &LogicalNames,
    selection: &ReplaySelection,
    dry_run: bool,
) -> std::result::Result<u64, Error> {
    let table = store.table().quoted();
    if names.style == CaptureStyle::Message {
        // Not a configuration error: the configuration is fine, the request cannot be met.
        let why = format!(
            "{} is captured from the log in message style (store.logical.style), which keeps no \
             published events: writers emit messages and only dead events become rows, so there \
             is nothing to publish again",
            store.table()
        );
        return Err(Error::new(ErrorKind::Other, why));
    }
    let columns = "event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
                   destination, created_at";
    let replayed = crate::sql::REPLAYED;
    let dry_run_count = format!("SELECT count(*) FROM {table} WHERE {replayed}");
    let write_again = format!(
        "WITH gone AS (DELETE FROM {table} WHERE id IN \
                         (SELECT id FROM {table} WHERE {replayed} ORDER BY id LIMIT $5) \
                       RETURNING id, {columns}), \
              again AS (INSERT INTO {table} ({columns}) \
                        SELECT {columns} FROM gone ORDER BY id RETURNING 1) \
         SELECT count(*) FROM again"
    );
    // An open window ends when the replay starts, by the database's clock: the events it
    // writes again are published again meanwhile, and must not be selected again.
    let until: DateTime<Utc> = match selection.published_until {
        Some(until) => until,
        None => sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store.classify(e))?,
    };
    // A batch at a time, first ids first: a row written again is pending, so no longer selected.
    let mut total = 0;
    loop {
        let mut query = sqlx::query_scalar::<_, i64>(if dry_run {
            &dry_run_count
        } else {
            &write_again
        })
        .bind(selection.published_since)
        .bind(until)
        .bind(selection.aggregate_type.as_deref())
        .bind(selection.aggregate_id.as_deref());
        if !dry_run {
            query = query.bind(REPLAY_BATCH);
        }
        let n = query
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store.classify(e))?
            .max(0) as u64;
        total += n;
        if dry_run || n < REPLAY_BATCH as u64 {
            return Ok(total);
        }
    }
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
}
