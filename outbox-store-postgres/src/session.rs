//! A relay's shard session: one dedicated connection holding the shard locks, through which every
//! claim and mark of those shards goes (the fencing).

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgConnectOptions, PgRow};
use sqlx::{Arguments, PgConnection, Row};
use uuid::Uuid;

use outboxkit_core::{
    ClaimRequest, ClusterView, Error, ErrorKind, Failure, MarkMode, OutboxEvent, PayloadType,
    Result, ShardSession,
};

use outboxkit_store_sql::classify::connect_within;
use outboxkit_store_sql::rows::RowColumns;
use outboxkit_store_sql::session::{idle_session_limit, parse_headers, truncate_error, Fence};

use crate::classify::{classify, Postgres, Target};
use crate::config::TableName;
use crate::sql::{Sql, JOIN_MEMBERS, SESSION_SETTINGS, TRY_LOCK, UNLOCK, UNLOCK_ALL};

/// Prefix of the `application_name` of session connections.
pub(crate) const APPLICATION_PREFIX: &str = "outbox-relay:";

/// Longest `application_name` PostgreSQL keeps.
const MAX_APPLICATION_NAME: usize = 63;

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
    fence: Fence<PgConnection, Postgres>,
    context: Arc<SessionContext>,
    /// The table's, read from the catalog as the session opened.
    payload_type: PayloadType,
    backend_pid: i32,
}

impl fmt::Debug for PostgresShardSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fence.debug_session(
            f,
            "PostgresShardSession",
            &[("backend_pid", &self.backend_pid)],
        )
    }
}

impl PostgresShardSession {
    /// Connect a dedicated connection and join the table's relays.
    pub(crate) async fn open(
        options: &PgConnectOptions,
        context: Arc<SessionContext>,
        relay_id: &str,
        shard_count: u32,
        payload_type: PayloadType,
        connect_timeout: Duration,
        session_timeout: Duration,
    ) -> Result<Self> {
        let options = options
            .clone()
            .application_name(&application_name(relay_id));
        let target = &context.target;
        let mut conn = connect_within::<Postgres, _>(&options, target, connect_timeout)
            .await?
            .map_err(|e| classify(e, target).context("opening a shard session"))?;
        crate::classify::refuse_read_only(&mut conn, target).await?;
        let timeout_ms = session_timeout.as_millis().to_string();
        let idle_ms = idle_session_limit(session_timeout).as_millis().to_string();
        sqlx::query(SESSION_SETTINGS)
            .bind(timeout_ms)
            .bind(idle_ms)
            .execute(&mut conn)
            .await
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
            fence: Fence::new(
                conn,
                context.target.clone(),
                relay_id,
                shard_count,
                session_timeout,
            ),
            context,
            payload_type,
            backend_pid,
        })
    }

    /// The server process id of this session's connection (`pg_stat_activity.pid`).
    pub fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    /// Whether the connection was lost: the session owns nothing and every call fails.
    pub fn is_poisoned(&self) -> bool {
        self.fence.is_poisoned()
    }

    /// Run a lock statement (`TRY_LOCK`, `UNLOCK`) on the advisory lock of `shard`.
    async fn lock(&mut self, statement: &'static str, shard: i32, action: &str) -> Result<bool> {
        let key = self.context.keys.shard_key;
        self.fence
            .run(action, async |conn| {
                sqlx::query_scalar::<_, bool>(statement)
                    .bind(key)
                    .bind(shard)
                    .fetch_one(conn)
                    .await
            })
            .await
    }
}

fn decode_event(
    row: &PgRow,
    payload_type: PayloadType,
) -> std::result::Result<OutboxEvent, sqlx::Error> {
    let headers: String = row.try_get(6)?;
    Ok(OutboxEvent {
        id: row.try_get(0)?,
        event_id: row.try_get::<Uuid, _>(1)?,
        aggregate_type: row.try_get(2)?,
        aggregate_id: row.try_get(3)?,
        event_type: row.try_get(4)?,
        payload: Postgres::payload(row, 5, payload_type)?,
        payload_type,
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

/// The arguments of `Sql::record_failures`, three arrays: ids, errors (cut to size), delays in
/// milliseconds (`None`: dead).
pub(crate) fn failure_arguments(
    failures: &[Failure],
) -> std::result::Result<PgArguments, sqlx::Error> {
    let ids: Vec<i64> = failures.iter().map(|f| f.id).collect();
    let errors: Vec<&str> = failures.iter().map(|f| truncate_error(&f.error)).collect();
    let delays: Vec<Option<i64>> = failures
        .iter()
        .map(|f| {
            f.retry_in
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        })
        .collect();
    let mut arguments = PgArguments::default();
    arguments.add(ids).map_err(sqlx::Error::Encode)?;
    arguments.add(errors).map_err(sqlx::Error::Encode)?;
    arguments.add(delays).map_err(sqlx::Error::Encode)?;
    Ok(arguments)
}

#[async_trait]
impl ShardSession for PostgresShardSession {
    fn shard_count(&self) -> u32 {
        self.fence.shard_count()
    }

    fn owned(&self) -> &BTreeSet<i32> {
        self.fence.owned()
    }

    async fn cluster(&mut self) -> Result<ClusterView> {
        let keys = self.context.keys;
        let statement = &self.context.sql.cluster;
        let rows = self
            .fence
            .run("reading the relays' locks", async |conn| {
                sqlx::query_as::<_, (i64, i64)>(statement)
                    .bind(i64::from(keys.shard_key))
                    .bind(i64::from(keys.member_key))
                    .fetch_all(conn)
                    .await
            })
            .await?;
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
        if !self.fence.needs_lock(shard)? {
            // Advisory locks stack: never take one twice, one release must free it.
            return Ok(true);
        }
        let acquired = self.lock(TRY_LOCK, shard, "taking a shard lock").await?;
        if acquired {
            self.fence.acquired(shard);
        }
        Ok(acquired)
    }

    async fn release(&mut self, shard: i32) -> Result<()> {
        if !self.fence.holds_lock(shard)? {
            return Ok(());
        }
        let released = self.lock(UNLOCK, shard, "releasing a shard lock").await?;
        self.fence.released(shard);
        if !released {
            tracing::warn!(shard, "released a shard lock this session did not hold");
        }
        Ok(())
    }

    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>> {
        if !self.fence.may_claim(request.limit)? {
            return Ok(Vec::new());
        }
        let shards: Vec<i16> = self
            .fence
            .owned()
            .iter()
            .filter_map(|&s| i16::try_from(s).ok())
            .collect();
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let statement = self.context.sql.claim(self.payload_type);
        let rows = self
            .fence
            .run("claiming rows", async |conn| {
                sqlx::query(statement)
                    .bind(&shards)
                    .bind(request.exclude_ids)
                    .bind(request.dead_holds_aggregate)
                    .bind(limit)
                    .fetch_all(conn)
                    .await
            })
            .await?;
        let payload_type = self.payload_type;
        self.fence.decode(
            &rows,
            |row| decode_event(row, payload_type),
            "claiming rows",
        )
    }

    async fn mark_published(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        self.fence.ensure_live()?;
        if ids.is_empty() {
            return Ok(());
        }
        let sql = match mode {
            MarkMode::Delete => &self.context.sql.mark_delete,
            MarkMode::Keep => &self.context.sql.mark_keep,
        };
        self.fence
            .run("marking rows published", async |conn| {
                sqlx::query(sql).bind(ids).execute(conn).await
            })
            .await?;
        Ok(())
    }

    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()> {
        self.fence.ensure_live()?;
        if failures.is_empty() {
            return Ok(());
        }
        // Attempts, the error, and the next attempt or `dead_at`.
        let statement = &self.context.sql.record_failures;
        self.fence
            .run("recording failures", async |conn| {
                let arguments = failure_arguments(failures)?;
                sqlx::query_with(statement, arguments).execute(conn).await
            })
            .await?;
        Ok(())
    }

    async fn close(self: Box<Self>) -> Result<()> {
        // Unlock explicitly: the backend may take a moment to exit after the connection closes,
        // and other relays should see the shards free as soon as this returns.
        self.fence
            .leave(async |conn| sqlx::query(UNLOCK_ALL).execute(conn).await)
            .await
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
}
