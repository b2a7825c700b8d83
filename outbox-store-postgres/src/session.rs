//! A relay's shard session: one dedicated connection holding the shard locks, through which every
//! claim and mark of those shards goes (the fencing).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{ConnectOptions, Connection, PgConnection, Row};
use uuid::Uuid;

use outboxkit_core::{
    ClaimRequest, ClusterView, Error, ErrorKind, Failure, Headers, MarkMode, OutboxEvent, Result,
    ShardSession,
};

use crate::classify::{classify, Target};
use crate::config::TableName;
use crate::sql::{Sql, JOIN_MEMBERS, TRY_LOCK, UNLOCK, UNLOCK_ALL};

/// Prefix of the `application_name` of session connections.
pub(crate) const APPLICATION_PREFIX: &str = "outbox-relay:";

/// Longest `application_name` PostgreSQL keeps.
const MAX_APPLICATION_NAME: usize = 63;

/// How much longer than `statement_timeout` the client waits before giving the session up.
const CLIENT_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// Longest `last_error` stored.
const MAX_ERROR_LEN: usize = 8 * 1024;

/// Advisory lock keys of one table: shard `s` is the lock `(shard_key, s)`; every open session
/// holds `(member_key, its backend pid)`, so that live relays can be counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockKeys {
    pub shard_key: i32,
    pub member_key: i32,
}

impl LockKeys {
    /// Stable keys derived from the qualified table name (FNV-1a, 31 bits so they are
    /// non-negative and read back unchanged from `pg_locks`).
    pub fn for_table(table: &TableName) -> Self {
        let mut hash: u32 = 0x811c_9dc5;
        for byte in format!("outbox-relay:{table}").bytes() {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
        let shard_key = (hash & 0x7fff_ffff) as i32;
        Self {
            shard_key,
            member_key: shard_key ^ 1,
        }
    }
}

/// What a session shares with its store.
#[derive(Debug)]
pub(crate) struct SessionContext {
    pub sql: Sql,
    pub keys: LockKeys,
    pub target: Target,
}

/// `application_name` of a relay's session, cut to what PostgreSQL keeps.
pub(crate) fn application_name(relay_id: &str) -> String {
    let mut name = format!("{APPLICATION_PREFIX}{relay_id}");
    if name.len() > MAX_APPLICATION_NAME {
        let mut end = MAX_APPLICATION_NAME;
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        name.truncate(end);
    }
    name
}

/// A shard session on PostgreSQL: see [`ShardSession`].
///
/// Once its connection failed (I/O error, terminated backend, no answer within
/// `store.session_timeout`) the session is poisoned: its locks are gone with the connection, it
/// owns nothing, and every call fails with [`ErrorKind::LeaseLost`].
pub struct PostgresShardSession {
    conn: Option<PgConnection>,
    context: Arc<SessionContext>,
    relay_id: String,
    backend_pid: i32,
    shard_count: u32,
    owned: BTreeSet<i32>,
    timeout: Duration,
    poisoned: Option<String>,
}

impl fmt::Debug for PostgresShardSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresShardSession")
            .field("table", &self.context.target.table)
            .field("relay_id", &self.relay_id)
            .field("backend_pid", &self.backend_pid)
            .field("shard_count", &self.shard_count)
            .field("owned", &self.owned)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl PostgresShardSession {
    /// Connect a dedicated connection and join the table's relays.
    pub(crate) async fn open(
        options: &PgConnectOptions,
        context: Arc<SessionContext>,
        relay_id: &str,
        shard_count: u32,
        connect_timeout: Duration,
        session_timeout: Duration,
    ) -> Result<Self> {
        let timeout_ms = session_timeout.as_millis().to_string();
        let options = options
            .clone()
            .application_name(&application_name(relay_id))
            // The server drops the session (and its locks) soon after this client vanishes,
            // instead of after the kernel's two-hour keepalive.
            // The session only claims and marks through the partial indexes. A queue table's
            // statistics are often stale (analyzed while nearly empty, then a burst arrives); the
            // planner could then pick a nested-loop anti-join over sequential scans — quadratic
            // in the backlog (seen: 9 s per claim at 15,000 pending rows). Ruling out sequential
            // scans, bitmap scans and sorts on this connection keeps every claim an ordered
            // walk of the pending index whatever the statistics say.
            .options([
                ("enable_seqscan", "off"),
                ("enable_bitmapscan", "off"),
                ("enable_sort", "off"),
                // A mark that is lost in a database crash only makes its events be published
                // again (at least once still holds), so marks need not wait for the WAL flush.
                // Writers' transactions are untouched: this applies to this connection only.
                ("synchronous_commit", "off"),
                ("statement_timeout", timeout_ms.as_str()),
                ("tcp_keepalives_idle", "10"),
                ("tcp_keepalives_interval", "5"),
                ("tcp_keepalives_count", "3"),
            ]);
        let target = &context.target;
        let mut conn = tokio::time::timeout(connect_timeout, options.connect())
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Connection,
                    format!(
                        "cannot reach PostgreSQL at {} (store.url): no answer within {} \
                         (store.connect_timeout)",
                        target.endpoint.as_deref().unwrap_or("?"),
                        humantime_serde::re::humantime::format_duration(connect_timeout)
                    ),
                )
            })?
            .map_err(|e| classify(e, target).context("opening a shard session"))?;
        let (joined, backend_pid): (bool, i32) = sqlx::query_as(JOIN_MEMBERS)
            .bind(context.keys.member_key)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| classify(e, target).context("opening a shard session"))?;
        if !joined {
            return Err(Error::new(
                ErrorKind::Other,
                "opening a shard session: could not take the membership lock of this backend",
            ));
        }
        tracing::debug!(table = %target.table, relay_id, backend_pid, "shard session opened");
        Ok(Self {
            conn: Some(conn),
            context,
            relay_id: relay_id.to_owned(),
            backend_pid,
            shard_count,
            owned: BTreeSet::new(),
            // The server's statement_timeout fires first and leaves a usable session; this one is
            // for a server that does not answer at all.
            timeout: session_timeout + CLIENT_TIMEOUT_MARGIN,
            poisoned: None,
        })
    }

    /// The server process id of this session's connection (`pg_stat_activity.pid`).
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Whether the connection was lost: the session owns nothing and every call fails.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    fn lease_lost(&self) -> Error {
        Error::new(
            ErrorKind::LeaseLost,
            format!(
                "lost the PostgreSQL session holding shard locks: {}",
                self.poisoned.as_deref().unwrap_or("session closed")
            ),
        )
    }

    /// The session's connection, its statements and the timeout of a call; `LeaseLost` once
    /// poisoned. Run the statement, then hand its outcome to [`Self::settle`].
    fn connection(&mut self) -> Result<(&mut PgConnection, &SessionContext, Duration)> {
        match self.conn.as_mut() {
            Some(conn) => Ok((conn, &self.context, self.timeout)),
            None => Err(Error::new(
                ErrorKind::LeaseLost,
                format!(
                    "lost the PostgreSQL session holding shard locks: {}",
                    self.poisoned.as_deref().unwrap_or("session closed")
                ),
            )),
        }
    }

    /// Classify the outcome of a statement; a broken connection or no answer in time poisons the
    /// session.
    fn settle<T>(
        &mut self,
        outcome: std::result::Result<
            std::result::Result<T, sqlx::Error>,
            tokio::time::error::Elapsed,
        >,
        action: &str,
    ) -> Result<T> {
        let error = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => classify(e, &self.context.target).context(action),
            Err(_) => {
                let reason = format!(
                    "no answer while {action} within {} (store.session_timeout + 1s)",
                    humantime_serde::re::humantime::format_duration(self.timeout)
                );
                return Err(self.poison(reason));
            }
        };
        if error.kind() == ErrorKind::Connection {
            return Err(self.poison(error.full_message()));
        }
        Err(error)
    }

    /// The connection is unusable: drop it (the server releases its locks) and own nothing.
    fn poison(&mut self, reason: String) -> Error {
        tracing::warn!(
            table = %self.context.target.table,
            relay_id = %self.relay_id,
            shards = self.owned.len(),
            "shard session lost: {reason}"
        );
        self.poisoned = Some(reason);
        self.conn = None;
        self.owned.clear();
        self.lease_lost()
    }

    fn check_shard(&self, shard: i32) -> Result<()> {
        if shard < 0 || i64::from(shard) >= i64::from(self.shard_count) {
            return Err(Error::new(
                ErrorKind::Other,
                format!(
                    "shard {shard} does not exist: table {} has shards 0 to {}",
                    self.context.target.table,
                    i64::from(self.shard_count) - 1
                ),
            )
            .permanent());
        }
        Ok(())
    }
}

fn decode_event(row: &PgRow) -> std::result::Result<OutboxEvent, sqlx::Error> {
    let headers: String = row.try_get(6)?;
    Ok(OutboxEvent {
        id: row.try_get(0)?,
        event_id: row.try_get::<Uuid, _>(1)?,
        aggregate_type: row.try_get(2)?,
        aggregate_id: row.try_get(3)?,
        event_type: row.try_get(4)?,
        payload: row.try_get(5)?,
        headers: parse_headers(&headers).map_err(|e| sqlx::Error::ColumnDecode {
            index: "headers".to_owned(),
            source: e.into(),
        })?,
        destination: row.try_get(7)?,
        created_at: row.try_get::<DateTime<Utc>, _>(8)?,
        attempts: row.try_get(9)?,
        shard: row.try_get(10)?,
    })
}

/// Headers are a JSON object; values that are not strings become their JSON text.
pub(crate) fn parse_headers(text: &str) -> std::result::Result<Headers, serde_json::Error> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    Ok(object
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(s) => (name, s),
            other => (name, other.to_string()),
        })
        .collect())
}

fn truncate_error(text: &str) -> &str {
    if text.len() <= MAX_ERROR_LEN {
        return text;
    }
    let mut end = MAX_ERROR_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[async_trait]
impl ShardSession for PostgresShardSession {
    fn shard_count(&self) -> u32 {
        self.shard_count
    }

    fn owned(&self) -> &BTreeSet<i32> {
        &self.owned
    }

    async fn cluster(&mut self) -> Result<ClusterView> {
        let keys = self.context.keys;
        let (conn, ctx, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(
            timeout,
            sqlx::query_as::<_, (i64, i64)>(&ctx.sql.cluster)
                .bind(i64::from(keys.shard_key))
                .bind(i64::from(keys.member_key))
                .fetch_all(conn),
        )
        .await;
        let rows = self.settle(outcome, "reading the relays' locks")?;
        let mut relays = BTreeSet::new();
        let mut view = ClusterView::default();
        for (key, value) in rows {
            if key == i64::from(keys.member_key) {
                relays.insert(value);
            } else if let Ok(shard) = i32::try_from(value) {
                view.locked.insert(shard);
            }
        }
        view.live_relays = u32::try_from(relays.len()).unwrap_or(u32::MAX);
        Ok(view)
    }

    async fn try_acquire(&mut self, shard: i32) -> Result<bool> {
        if self.poisoned.is_some() {
            return Err(self.lease_lost());
        }
        self.check_shard(shard)?;
        if self.owned.contains(&shard) {
            // Advisory locks stack: never take one twice, one release must free it.
            return Ok(true);
        }
        let key = self.context.keys.shard_key;
        let (conn, _, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(
            timeout,
            sqlx::query_scalar::<_, bool>(TRY_LOCK)
                .bind(key)
                .bind(shard)
                .fetch_one(conn),
        )
        .await;
        let acquired = self.settle(outcome, "taking a shard lock")?;
        if acquired {
            self.owned.insert(shard);
        }
        Ok(acquired)
    }

    async fn release(&mut self, shard: i32) -> Result<()> {
        if self.poisoned.is_some() {
            return Err(self.lease_lost());
        }
        if !self.owned.contains(&shard) {
            return Ok(());
        }
        let key = self.context.keys.shard_key;
        let (conn, _, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(
            timeout,
            sqlx::query_scalar::<_, bool>(UNLOCK)
                .bind(key)
                .bind(shard)
                .fetch_one(conn),
        )
        .await;
        let released = self.settle(outcome, "releasing a shard lock")?;
        self.owned.remove(&shard);
        if !released {
            tracing::warn!(shard, "released a shard lock this session did not hold");
        }
        Ok(())
    }

    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>> {
        if self.poisoned.is_some() {
            return Err(self.lease_lost());
        }
        if self.owned.is_empty() || request.limit == 0 {
            return Ok(Vec::new());
        }
        let shards: Vec<i16> = self
            .owned
            .iter()
            .filter_map(|&s| i16::try_from(s).ok())
            .collect();
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let (conn, ctx, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(
            timeout,
            sqlx::query(&ctx.sql.claim)
                .bind(&shards)
                .bind(request.exclude_ids)
                .bind(request.dead_holds_aggregate)
                .bind(limit)
                .fetch_all(conn),
        )
        .await;
        let rows = self.settle(outcome, "claiming rows")?;
        rows.iter()
            .map(decode_event)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| classify(e, &self.context.target).context("claiming rows"))
    }

    async fn mark_published(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        if self.poisoned.is_some() {
            return Err(self.lease_lost());
        }
        if ids.is_empty() {
            return Ok(());
        }
        let (conn, ctx, timeout) = self.connection()?;
        let sql = match mode {
            MarkMode::Delete => &ctx.sql.mark_delete,
            MarkMode::Keep => &ctx.sql.mark_keep,
        };
        let outcome = tokio::time::timeout(timeout, sqlx::query(sql).bind(ids).execute(conn)).await;
        self.settle(outcome, "marking rows published")?;
        Ok(())
    }

    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()> {
        if self.poisoned.is_some() {
            return Err(self.lease_lost());
        }
        if failures.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
        let errors: Vec<&str> = failures.iter().map(|f| truncate_error(&f.error)).collect();
        let delays: Vec<Option<i64>> = failures
            .iter()
            .map(|f| {
                f.retry_in
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            })
            .collect();
        let (conn, ctx, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(
            timeout,
            sqlx::query(&ctx.sql.record_failures)
                .bind(&ids)
                .bind(&errors)
                .bind(&delays)
                .execute(conn),
        )
        .await;
        self.settle(outcome, "recording failures")?;
        Ok(())
    }

    async fn close(mut self: Box<Self>) -> Result<()> {
        if self.poisoned.is_some() {
            return Ok(());
        }
        // Unlock explicitly: the backend may take a moment to exit after the connection closes,
        // and other relays should see the shards free as soon as this returns.
        let unlocked = match self.connection() {
            Ok((conn, _, timeout)) => {
                let outcome =
                    tokio::time::timeout(timeout, sqlx::query(UNLOCK_ALL).execute(conn)).await;
                self.settle(outcome, "releasing shard locks")
            }
            Err(e) => Err(e),
        };
        self.owned.clear();
        if let Some(conn) = self.conn.take() {
            if let Err(e) = conn.close().await {
                tracing::debug!("closing a shard session: {e}");
            }
        }
        match unlocked {
            Ok(_) => Ok(()),
            // The connection is gone, and the locks with it.
            Err(e) if e.kind() == ErrorKind::LeaseLost => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable_non_negative_and_distinct() {
        let a = LockKeys::for_table(&TableName::parse("public.outbox").unwrap());
        assert_eq!(
            a,
            LockKeys::for_table(&TableName::parse("public.outbox").unwrap())
        );
        assert!(a.shard_key >= 0 && a.member_key >= 0);
        assert_ne!(a.shard_key, a.member_key);
        let b = LockKeys::for_table(&TableName::parse("app.outbox").unwrap());
        assert_ne!(a.shard_key, b.shard_key);
    }

    #[test]
    fn application_name_is_cut_to_63_bytes_on_a_char_boundary() {
        assert_eq!(application_name("relay-a"), "outbox-relay:relay-a");
        let long = application_name(&"é".repeat(40));
        assert!(long.len() <= 63 && long.starts_with("outbox-relay:é"));
    }

    #[test]
    fn headers_keep_strings_and_stringify_other_values() {
        let h = parse_headers(r#"{"a": "x", "n": 1, "o": {"k": true}, "z": null}"#).unwrap();
        assert_eq!(h["a"], "x");
        assert_eq!(h["n"], "1");
        assert_eq!(h["o"], r#"{"k":true}"#);
        assert_eq!(h["z"], "null");
        assert!(parse_headers("[1]").is_err());
    }

    #[test]
    fn long_errors_are_truncated_on_a_char_boundary() {
        let text = "é".repeat(MAX_ERROR_LEN);
        let cut = truncate_error(&text);
        assert!(cut.len() <= MAX_ERROR_LEN && text.starts_with(cut));
        assert_eq!(truncate_error("short"), "short");
    }
}
