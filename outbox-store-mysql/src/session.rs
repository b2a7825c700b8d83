//! A relay's shard session: one dedicated connection holding the shard locks (`GET_LOCK`),
//! through which every claim and mark of those shards goes (the fencing).

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::NaiveDateTime;
use sqlx::mysql::{MySqlConnectOptions, MySqlRow};
use sqlx::{Executor, MySqlConnection, Row};
use uuid::Uuid;

use outboxkit_core::{
    ClaimRequest, ClusterView, Error, ErrorKind, Failure, MarkMode, OutboxEvent, PayloadType,
    Result, ShardSession,
};

use outboxkit_store_sql::classify::connect_within;
use outboxkit_store_sql::rows::RowColumns;
use outboxkit_store_sql::session::{parse_headers, truncate_error, Fence, CLIENT_TIMEOUT_MARGIN};
use outboxkit_store_sql::Statement;

use crate::classify::{classify, MySql, Target};
use crate::config::TableName;
use crate::sql::{self, Sql, MAX_LIST, TRY_LOCK, UNLOCK, UNLOCK_ALL};

/// Membership slots per table: each session holds one (a named lock), so that live relays can
/// be counted with `IS_USED_LOCK` and named through `outbox_relay_members`.
pub(crate) const MEMBER_SLOTS: u16 = 128;

/// Longest name of a MySQL named lock.
const MAX_LOCK_NAME: usize = 64;

/// Longest `relay_id` stored in `outbox_relay_members`.
const MAX_RELAY_ID_CHARS: usize = 255;

/// Failures recorded per statement.
const FAILURES_PER_STATEMENT: usize = 1024;

/// Longest retry delay stored (ten years): `next_attempt_at` must stay a valid DATETIME.
const MAX_DELAY_MS: i64 = 10 * 366 * 24 * 3600 * 1000;

/// Named locks of one table. Named locks are server-wide, so the names carry the database and
/// the table: `outbox:<database>.<table>:<shard>` for shards and `outbox:<database>.<table>:r<slot>`
/// for membership slots — or, when that would be longer than MySQL's 64 characters (or the
/// database name has other characters than lowercase letters, digits and `_`), the same with a
/// 64-bit hash of `<database>.<table>` instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockNames {
    prefix: String,
}

impl LockNames {
    pub fn for_table(table: &TableName) -> Self {
        let database = table.qualifier().unwrap_or_default();
        let qualified = format!("{database}.{}", table.name());
        let plain = database
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        // The longest suffix: ":1023" or ":r127".
        let prefix = format!("outbox:{qualified}:");
        if plain && !database.is_empty() && prefix.len() + 5 <= MAX_LOCK_NAME {
            return Self { prefix };
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in qualified.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Self {
            prefix: format!("outbox:{hash:016x}:"),
        }
    }

    pub fn shard(&self, shard: i32) -> String {
        format!("{}{shard}", self.prefix)
    }

    pub fn slot(&self, slot: u16) -> String {
        format!("{}r{slot}", self.prefix)
    }

    /// Names of every shard (0..count) then every membership slot, as `lock_holders` binds them.
    pub fn all(&self, shard_count: u32) -> Vec<String> {
        let shards = (0..shard_count).map(|s| self.shard(s as i32));
        let slots = (0..MEMBER_SLOTS).map(|s| self.slot(s));
        shards.chain(slots).collect()
    }
}

/// What a session shares with its store.
#[derive(Debug)]
pub(crate) struct SessionContext {
    pub sql: Sql,
    pub locks: LockNames,
    pub target: Target,
    /// The bare table name, the key of `outbox_relay_members`.
    pub table_name: String,
    /// Statements run once on each session connection: time limits, isolation.
    pub setup: Statement,
}

/// The connection ids holding each lock of `names` (one statement), in order.
pub(crate) async fn lock_holders(
    conn: &mut MySqlConnection,
    names: &[String],
) -> std::result::Result<Vec<Option<i64>>, sqlx::Error> {
    let statement = sql::lock_holders(names.len());
    let mut query = sqlx::query(&statement);
    for name in names {
        query = query.bind(name);
    }
    let row = query.fetch_one(conn).await?;
    (0..names.len())
        .map(|i| row.try_get::<Option<i64>, _>(i))
        .collect()
}

/// A shard session on MySQL / MariaDB: see [`ShardSession`].
///
/// Once its connection failed (I/O error, killed connection, no answer within
/// `store.session_timeout`) the session is poisoned: its locks are gone with the connection, it
/// owns nothing, and every call fails with [`ErrorKind::LeaseLost`].
pub struct MySqlShardSession {
    fence: Fence<MySqlConnection, MySql>,
    context: Arc<SessionContext>,
    /// The table's, read from the catalog as the session opened.
    payload_type: PayloadType,
    connection_id: i64,
    slot: Option<u16>,
    /// Every shard lock name then every slot lock name, bound by `cluster()`.
    all_locks: Vec<String>,
}

impl fmt::Debug for MySqlShardSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fence.debug_session(
            f,
            "MySqlShardSession",
            &[("connection_id", &self.connection_id), ("slot", &self.slot)],
        )
    }
}

impl MySqlShardSession {
    /// Connect a dedicated connection and join the table's relays.
    pub(crate) async fn open(
        options: &MySqlConnectOptions,
        context: Arc<SessionContext>,
        relay_id: &str,
        shard_count: u32,
        payload_type: PayloadType,
        connect_timeout: Duration,
        session_timeout: Duration,
    ) -> Result<Self> {
        let target = &context.target;
        let mut conn = connect_within::<MySql, _>(options, target, connect_timeout)
            .await?
            .map_err(|e| classify(e, target).context("opening a shard session"))?;
        let timeout = session_timeout + CLIENT_TIMEOUT_MARGIN;
        let opened = async {
            crate::classify::refuse_read_only(&mut conn, target).await?;
            join(&mut conn, &context, relay_id)
                .await
                .map_err(|e| classify(e, target).context("opening a shard session"))
        };
        let joined = tokio::time::timeout(timeout, opened).await.map_err(|_| {
            Error::new(
                ErrorKind::Timeout,
                format!(
                    "opening a shard session: MySQL at {} did not answer within {}",
                    target.endpoint.as_deref().unwrap_or("?"),
                    outboxkit_store_sql::format_duration(timeout)
                ),
            )
        })??;
        let (connection_id, slot) = joined;
        if slot.is_none() {
            tracing::warn!(
                table = %target.table,
                relay_id,
                "all {MEMBER_SLOTS} membership slots of the table are taken: this relay works \
                 but is not counted when relays share the shards"
            );
        }
        tracing::debug!(table = %target.table, relay_id, connection_id, ?slot, "shard session opened");
        Ok(Self {
            fence: Fence::new(
                conn,
                context.target.clone(),
                relay_id,
                shard_count,
                session_timeout,
            ),
            all_locks: context.locks.all(shard_count),
            context,
            payload_type,
            connection_id,
            slot,
        })
    }

    /// The server's id of this session's connection (`CONNECTION_ID()`, the `Id` of
    /// `SHOW PROCESSLIST`).
    pub fn connection_id(&self) -> i64 {
        self.connection_id
    }

    /// The membership slot this session holds, if any was free.
    pub fn slot(&self) -> Option<u16> {
        self.slot
    }

    /// Whether the connection was lost: the session owns nothing and every call fails.
    pub fn is_poisoned(&self) -> bool {
        self.fence.is_poisoned()
    }

    /// Run a lock statement (`TRY_LOCK`, `UNLOCK`) on the named lock `name`.
    async fn lock(
        &mut self,
        statement: &'static str,
        name: &str,
        action: &str,
    ) -> Result<Option<i64>> {
        self.fence
            .run(action, async |conn| {
                sqlx::query_scalar::<_, Option<i64>>(statement)
                    .bind(name)
                    .fetch_one(conn)
                    .await
            })
            .await
    }

    async fn claim_rows(
        &mut self,
        shards: &[i32],
        excluded: &[i64],
        dead_holds_aggregate: bool,
        limit: i64,
    ) -> Result<Vec<MySqlRow>> {
        let shards = sql::padded(shards);
        let excluded = sql::padded(excluded);
        let statement = (self.context.sql).claim(self.payload_type, shards.len(), excluded.len());
        let mut query = sqlx::query(&statement);
        for shard in &shards {
            query = query.bind(*shard);
        }
        for id in &excluded {
            query = query.bind(*id);
        }
        let query = query.bind(dead_holds_aggregate).bind(limit);
        self.fence
            .run("claiming rows", async |conn| query.fetch_all(conn).await)
            .await
    }

    /// Run `statement` (one per chunk of padded ids) on the session.
    async fn by_ids(&mut self, ids: &[i64], mode: MarkMode) -> Result<()> {
        for chunk in ids.chunks(MAX_LIST) {
            let chunk = sql::padded(chunk);
            let statement = match mode {
                MarkMode::Delete => self.context.sql.mark_delete(chunk.len()),
                MarkMode::Keep => self.context.sql.mark_keep(chunk.len()),
            };
            let mut query = sqlx::query(&statement);
            for id in &chunk {
                query = query.bind(*id);
            }
            self.fence
                .run("marking rows published", async |conn| {
                    query.execute(conn).await
                })
                .await?;
        }
        Ok(())
    }
}

/// Session setup on a fresh connection: time limits and isolation, connection id, a membership
/// slot (first free one) and its row in `outbox_relay_members`.
async fn join(
    conn: &mut MySqlConnection,
    context: &SessionContext,
    relay_id: &str,
) -> std::result::Result<(i64, Option<u16>), sqlx::Error> {
    conn.execute(sqlx::raw_sql(&context.setup)).await?;
    let connection_id: i64 = sqlx::query_scalar("SELECT CAST(CONNECTION_ID() AS SIGNED)")
        .fetch_one(&mut *conn)
        .await?;
    let names: Vec<String> = (0..MEMBER_SLOTS).map(|s| context.locks.slot(s)).collect();
    let holders = lock_holders(conn, &names).await?;
    let mut slot = None;
    for (index, holder) in holders.iter().enumerate() {
        if holder.is_some() {
            continue;
        }
        let taken: Option<i64> = sqlx::query_scalar(TRY_LOCK)
            .bind(&names[index])
            .fetch_one(&mut *conn)
            .await?;
        if taken == Some(1) {
            slot = u16::try_from(index).ok();
            break;
        }
    }
    if let Some(slot) = slot {
        let relay_id: String = relay_id.chars().take(MAX_RELAY_ID_CHARS).collect();
        sqlx::query(&context.sql.join_members)
            .bind(&context.table_name)
            .bind(slot)
            .bind(relay_id)
            .execute(&mut *conn)
            .await?;
    }
    Ok((connection_id, slot))
}

/// Read a text column whatever its collation (`_bin` collations carry the BINARY flag).
fn text(row: &MySqlRow, index: usize) -> std::result::Result<String, sqlx::Error> {
    row.try_get_unchecked::<String, _>(index)
}

fn decode_event(
    row: &MySqlRow,
    payload_type: PayloadType,
) -> std::result::Result<OutboxEvent, sqlx::Error> {
    let decode_error = |column: &str, source: Box<dyn std::error::Error + Send + Sync>| {
        sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source,
        }
    };
    let event_id = text(row, 1)?;
    let headers = text(row, 6)?;
    let destination: Option<String> = row.try_get_unchecked(7)?;
    Ok(OutboxEvent {
        id: row.try_get(0)?,
        event_id: Uuid::parse_str(&event_id).map_err(|e| decode_error("event_id", e.into()))?,
        aggregate_type: text(row, 2)?,
        aggregate_id: text(row, 3)?,
        event_type: text(row, 4)?,
        payload: MySql::payload(row, 5, payload_type)?,
        payload_type,
        headers: parse_headers(&headers).map_err(|e| decode_error("headers", e.into()))?,
        destination,
        created_at: row.try_get::<NaiveDateTime, _>(8)?.and_utc(),
        attempts: row.try_get(9)?,
        shard: row.try_get(10)?,
    })
}

#[async_trait]
impl ShardSession for MySqlShardSession {
    fn shard_count(&self) -> u32 {
        self.fence.shard_count()
    }

    fn owned(&self) -> &BTreeSet<i32> {
        self.fence.owned()
    }

    async fn cluster(&mut self) -> Result<ClusterView> {
        let all_locks = &self.all_locks;
        let holders = self
            .fence
            .run("reading the relays' locks", async |conn| {
                lock_holders(conn, all_locks).await
            })
            .await?;
        let shards = self.fence.shard_count() as usize;
        let mut view = ClusterView::default();
        for (shard, holder) in holders.iter().take(shards).enumerate() {
            if holder.is_some() {
                view.locked.insert(shard as i32);
            }
        }
        let members = holders[shards..].iter().filter(|h| h.is_some()).count()
            + usize::from(self.slot.is_none());
        view.live_relays = u32::try_from(members).unwrap_or(u32::MAX);
        Ok(view)
    }

    async fn try_acquire(&mut self, shard: i32) -> Result<bool> {
        if !self.fence.needs_lock(shard)? {
            // Named locks stack within a session: never take one twice, one release must free it.
            return Ok(true);
        }
        let name = self.context.locks.shard(shard);
        match self.lock(TRY_LOCK, &name, "taking a shard lock").await? {
            Some(1) => {
                self.fence.acquired(shard);
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(Error::new(
                ErrorKind::Other,
                format!("GET_LOCK('{name}') failed on the server; will try again"),
            )
            .temporary()),
        }
    }

    async fn release(&mut self, shard: i32) -> Result<()> {
        if !self.fence.holds_lock(shard)? {
            return Ok(());
        }
        let name = self.context.locks.shard(shard);
        let released = self.lock(UNLOCK, &name, "releasing a shard lock").await?;
        self.fence.released(shard);
        if released != Some(1) {
            tracing::warn!(shard, lock = %name, "released a shard lock this session did not hold");
        }
        Ok(())
    }

    async fn claim(&mut self, request: &ClaimRequest<'_>) -> Result<Vec<OutboxEvent>> {
        if !self.fence.may_claim(request.limit)? {
            return Ok(Vec::new());
        }
        let shards: Vec<i32> = self.fence.owned().iter().copied().collect();
        let limit = i64::try_from(request.limit).unwrap_or(i64::MAX);
        let rows = if request.exclude_ids.len() <= MAX_LIST {
            self.claim_rows(
                &shards,
                request.exclude_ids,
                request.dead_holds_aggregate,
                limit,
            )
            .await?
        } else {
            // Too many to list in the statement: read past them and drop them here.
            let extra = i64::try_from(request.exclude_ids.len()).unwrap_or(i64::MAX);
            let mut rows = self
                .claim_rows(
                    &shards,
                    &[],
                    request.dead_holds_aggregate,
                    limit.saturating_add(extra),
                )
                .await?;
            let excluded: HashSet<i64> = request.exclude_ids.iter().copied().collect();
            rows.retain(|row| {
                row.try_get::<i64, _>(0)
                    .map_or(true, |id| !excluded.contains(&id))
            });
            rows.truncate(request.limit);
            rows
        };
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
        self.by_ids(ids, mode).await
    }

    async fn record_failures(&mut self, failures: &[Failure]) -> Result<()> {
        self.fence.ensure_live()?;
        for chunk in failures.chunks(FAILURES_PER_STATEMENT) {
            let chunk = sql::padded(&chunk.iter().collect::<Vec<_>>());
            let statement = self.context.sql.record_failures(chunk.len());
            let mut query = sqlx::query(&statement);
            for failure in &chunk {
                let delay_ms = failure.retry_in.map(|d| {
                    i64::try_from(d.as_millis())
                        .unwrap_or(i64::MAX)
                        .min(MAX_DELAY_MS)
                });
                query = query
                    .bind(failure.id)
                    .bind(truncate_error(&failure.error))
                    .bind(delay_ms);
            }
            self.fence
                .run("recording failures", async |conn| query.execute(conn).await)
                .await?;
        }
        Ok(())
    }

    async fn close(self: Box<Self>) -> Result<()> {
        let Self {
            fence,
            context,
            slot,
            ..
        } = *self;
        // Leave and unlock explicitly, so that other relays see the shards free as soon as this
        // returns.
        fence
            .leave(async |conn| {
                if let Some(slot) = slot {
                    sqlx::query(&context.sql.leave_members)
                        .bind(&context.table_name)
                        .bind(slot)
                        .execute(&mut *conn)
                        .await?;
                }
                sqlx::query(UNLOCK_ALL).execute(&mut *conn).await
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_are_readable_when_short_and_always_fit() {
        let t = TableName::parse("shop.outbox").unwrap();
        let names = LockNames::for_table(&t);
        assert_eq!(names.shard(7), "outbox:shop.outbox:7");
        assert_eq!(names.slot(3), "outbox:shop.outbox:r3");
        assert_eq!(names, LockNames::for_table(&t));
        assert_ne!(
            names,
            LockNames::for_table(&TableName::parse("shop.outbox2").unwrap())
        );

        let long = TableName::parse(&format!("{}.{}", "d".repeat(30), "t".repeat(40))).unwrap();
        let hashed = LockNames::for_table(&long);
        assert!(hashed.shard(1023).starts_with("outbox:"), "{hashed:?}");
        assert!(hashed.shard(1023).len() <= MAX_LOCK_NAME);
        assert!(hashed.slot(MEMBER_SLOTS - 1).len() <= MAX_LOCK_NAME);
        let odd = TableName::parse("outbox").unwrap().or_in("Shop-DB");
        assert!(!LockNames::for_table(&odd).shard(0).contains("Shop"));

        let all = names.all(4);
        assert_eq!(all.len(), 4 + MEMBER_SLOTS as usize);
        assert_eq!(all[3], "outbox:shop.outbox:3");
        assert_eq!(all[4], "outbox:shop.outbox:r0");
    }
}
