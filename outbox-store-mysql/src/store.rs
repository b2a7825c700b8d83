//! `MySqlStore`: the `Store` implementation.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnectOptions, MySqlQueryResult};
use sqlx::{Connection, Executor, MySqlPool, Row};

use outboxkit_core::{
    BacklogStatus, DeadEvent, DeadFilter, DeadSelection, Error, ErrorKind, EventFilter,
    EventRecord, HeldBack, NewEvent, Pause, Paused, PayloadType, ReplaySelection, Result,
    ShardOwner, ShardSession, Store,
};

use crate::classify::{classify, MySql, Target};
use crate::config::{MySqlStoreConfig, TableName, MEMBERS_TABLE, SCHEMA_TABLE};
use crate::enqueue::Outbox;
use crate::migrate;
use crate::session::{self, LockNames, MySqlShardSession, SessionContext, MEMBER_SLOTS};
use crate::sql::Sql;
use outboxkit_store_sql::classify::{connect, list_tables};
use outboxkit_store_sql::config;
use outboxkit_store_sql::migrate::{not_ours, pooled_table_facts, table_facts, TableCatalog};
use outboxkit_store_sql::pause;
use outboxkit_store_sql::privileges::{self, Grant};
use outboxkit_store_sql::replay::{replay_action, replay_rows, REPLAY_BATCH};
use outboxkit_store_sql::rows::{self, read_backlog, Listing, ListingParams, Query, RowColumns};
use outboxkit_store_sql::Statement;

/// What the store found out about the server when it connected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `VERSION()`, e.g. `10.11.6-MariaDB-0+deb12u1` or `8.0.36`.
    pub version: String,
    /// Whether the server is MariaDB (else MySQL).
    pub mariadb: bool,
    /// Whether the relay's connections use READ COMMITTED (not possible with statement-based
    /// binary logging, where they keep the server's default, REPEATABLE READ).
    pub read_committed: bool,
}

impl ServerInfo {
    fn parse(version: &str, log_bin: bool, binlog_format: &str) -> Self {
        Self {
            version: version.to_owned(),
            mariadb: version.to_ascii_lowercase().contains("mariadb"),
            read_committed: !log_bin || !binlog_format.eq_ignore_ascii_case("STATEMENT"),
        }
    }

    /// `(major, minor, patch)` of the version string.
    fn numbers(&self) -> (u32, u32, u32) {
        let mut parts = self
            .version
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        (
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
            parts.next().unwrap_or(0),
        )
    }

    /// The server as messages name it: `MariaDB` or `MySQL`.
    fn product(&self) -> &'static str {
        if self.mariadb {
            "MariaDB"
        } else {
            "MySQL"
        }
    }

    /// `Err` with what is needed when the server is too old for the relay.
    fn check_supported(&self, endpoint: &str) -> Result<()> {
        let version = self.numbers();
        let product = self.product();
        let minimum = if self.mariadb { (10, 6, 0) } else { (8, 0, 16) };
        if version < minimum {
            return Err(Error::config(format!(
                "store.url: {product} {} at {endpoint} is too old: outbox-relay needs MySQL \
                 8.0.16+ or MariaDB 10.6+ (SKIP LOCKED-era servers with expression defaults \
                 and enforced CHECK constraints)",
                self.version
            )));
        }
        Ok(())
    }

    /// The `SET` statements of every shard session.
    fn session_setup(&self, session_timeout: Duration) -> String {
        let lock_wait = session_timeout.as_secs_f64().ceil().max(1.0) as u64;
        // The server drops a session (and its locks) that stayed silent this long: a relay
        // whose host vanished, or that hangs, gives its shards back after it.
        let idle = outboxkit_store_sql::session::idle_session_limit(session_timeout).as_secs();
        let statement_limit = if self.mariadb {
            format!("max_statement_time = {:.3}", session_timeout.as_secs_f64())
        } else {
            format!("max_execution_time = {}", session_timeout.as_millis())
        };
        let mut setup = format!(
            "SET SESSION {statement_limit}, innodb_lock_wait_timeout = {lock_wait}, \
             lock_wait_timeout = {lock_wait}, wait_timeout = {idle}"
        );
        if self.read_committed {
            setup.push_str("; SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
        }
        setup
    }
}

/// The outbox table in MySQL / MariaDB: migrations, claims through shard sessions, purge,
/// status. Cheap to clone.
#[derive(Clone)]
pub struct MySqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: MySqlStoreConfig,
    options: MySqlConnectOptions,
    pool: MySqlPool,
    table: TableName,
    context: Arc<SessionContext>,
    outbox: Outbox,
    server: ServerInfo,
    /// Whether the first connection used TLS (`TLS TLSv1.3 (ssl-mode=VERIFY_IDENTITY)`).
    tls: String,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("url", &self.inner.config.redacted_url())
            .field("table", &self.inner.table.to_string())
            .field("server", &self.inner.server.version)
            .finish()
    }
}

/// What errors name of the server `config` connects to, about `table`.
fn target_of(config: &MySqlStoreConfig, options: &MySqlConnectOptions, table: String) -> Target {
    config.target(
        crate::config::endpoint(options),
        options.get_database().map(str::to_owned),
        options.get_username().to_owned(),
        table,
    )
}

impl MySqlStore {
    /// Every table the configuration's user can see, as (database, table), outside the server's
    /// own databases: what a pattern `store.table` is matched against. One short connection.
    pub async fn list_tables(config: &MySqlStoreConfig) -> Result<Vec<(String, String)>> {
        outboxkit_store_sql::ensure_crypto_provider();
        let options = config.connect_options(MySqlConnectOptions::password)?;
        let target = target_of(config, &options, config.table.clone());
        list_tables::<MySql, _, _>(
            &options,
            &target,
            config.connect_timeout,
            "SELECT CAST(table_schema AS CHAR), CAST(table_name AS CHAR) \
             FROM information_schema.tables WHERE table_type = 'BASE TABLE' \
             AND table_schema NOT IN ('mysql', 'information_schema', 'performance_schema', 'sys')",
        )
        .await
    }

    /// Check the configuration and connect. The first connection is made now, so an
    /// unreachable server, refused credentials or an unsupported version fail here with a
    /// one-line error.
    ///
    /// An unqualified table name lives in the URL's database.
    pub async fn connect(config: MySqlStoreConfig) -> Result<Self> {
        config.validate()?;
        outboxkit_store_sql::ensure_crypto_provider();
        let options = config.connect_options(MySqlConnectOptions::password)?;
        let configured = TableName::parse(&config.table).map_err(|e| e.context("store.table"))?;
        let table = match (configured.qualifier(), options.get_database()) {
            (Some(_), _) => configured,
            (None, Some(database)) => configured.or_in(database),
            (None, None) => {
                return Err(Error::config(format!(
                    "store.table: \"{configured}\" names no database and neither does store.url \
                     (\"{}\"): add /database to the URL or write the table as database.table",
                    config.redacted_url()
                )))
            }
        };
        let mut target = target_of(&config, &options, table.to_string());
        let endpoint = target.endpoint.clone().unwrap_or_default();

        let mut conn = connect::<MySql, _>(&options, &target, config.connect_timeout).await?;
        let row = sqlx::query(
            "SELECT VERSION(), CAST(@@log_bin AS SIGNED), CAST(@@binlog_format AS CHAR)",
        )
        .fetch_one(&mut conn)
        .await
        .map_err(|e| classify(e, &target))?;
        let read = || -> std::result::Result<ServerInfo, sqlx::Error> {
            let version: String = row.try_get_unchecked(0)?;
            let log_bin: Option<i64> = row.try_get(1)?;
            let format: Option<String> = row.try_get_unchecked(2)?;
            Ok(ServerInfo::parse(
                &version,
                log_bin.unwrap_or(0) != 0,
                format.as_deref().unwrap_or(""),
            ))
        };
        let server = read().map_err(|e| classify(e, &target))?;
        // From here on, errors name the server it is.
        target.product = Some(server.product());
        let tls_version: Option<String> = sqlx::query("SHOW SESSION STATUS LIKE 'Ssl_version'")
            .fetch_optional(&mut conn)
            .await
            .map_err(|e| classify(e, &target))?
            .and_then(|row| row.try_get_unchecked::<String, _>(1).ok());
        let tls = config::tls_summary(&config.url, tls_version.as_deref(), "ssl-mode", "PREFERRED");
        if let Err(e) = conn.close().await {
            tracing::debug!("closing the first connection: {e}");
        }
        server.check_supported(&endpoint)?;

        let read_committed = server.read_committed;
        let pool = config
            .pool_options::<sqlx::MySql>()
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if read_committed {
                        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_lazy_with(options.clone());
        let context = Arc::new(SessionContext {
            sql: Sql::new(&table),
            locks: LockNames::for_table(&table),
            target,
            table_name: table.name().to_owned(),
            setup: server.session_setup(config.session_timeout).into(),
        });
        Ok(Self {
            inner: Arc::new(Inner {
                outbox: Outbox::for_table(&table).naming(&context.target),
                config,
                options,
                pool,
                table,
                context,
                server,
                tls,
            }),
        })
    }

    /// The connection pool (not used by shard sessions, which have their own connections).
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// The outbox table, qualified by its database.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The configuration this store was connected with.
    pub fn config(&self) -> &MySqlStoreConfig {
        &self.inner.config
    }

    /// The server this store talks to.
    pub fn server(&self) -> &ServerInfo {
        &self.inner.server
    }

    /// The writers' handle on this store's table.
    pub fn outbox(&self) -> &Outbox {
        &self.inner.outbox
    }

    /// The claim statement a session runs for `shards` owned shards and `excluded` ids (both
    /// already padded; see the `sql` module), for EXPLAIN in tests and benchmarks. Binds: the
    /// shards, the excluded ids, whether dead rows hold their aggregate, the limit.
    #[doc(hidden)]
    pub fn claim_statement(&self, shards: usize, excluded: usize) -> String {
        self.sql()
            .claim(PayloadType::Json, shards, excluded)
            .to_string()
    }

    /// Like [`Store::open_session`], with the concrete session type.
    pub async fn open_mysql_session(&self, relay_id: &str) -> Result<MySqlShardSession> {
        let configured = self.inner.config.payload_type;
        let (shard_count, payload_type) = pooled_table_facts(
            &self.inner.pool,
            &self.inner.table,
            configured,
            self.target(),
        )
        .await?;
        MySqlShardSession::open(
            &self.inner.options,
            Arc::clone(&self.inner.context),
            relay_id,
            shard_count,
            payload_type,
            self.inner.config.connect_timeout,
            self.inner.config.session_timeout,
        )
        .await
    }

    /// The table's shard count, checking its schema version.
    async fn shard_count(&self) -> Result<u32> {
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.error(e))?;
        let row = MySql::schema_row(&mut conn, &self.inner.table, self.target()).await;
        outboxkit_store_sql::migrate::migrated_shards(
            &self.inner.table,
            row,
            migrate::SCHEMA_VERSION,
        )
    }

    /// Run `statement` (of `n` ids) on the pool for each chunk of `ids`, padded (see the `sql`
    /// module); the rows affected in all.
    async fn execute_by_ids(
        &self,
        ids: &[i64],
        statement: fn(&Sql, usize) -> Statement,
    ) -> std::result::Result<u64, sqlx::Error> {
        let mut total = 0;
        for chunk in ids.chunks(crate::sql::MAX_LIST) {
            let padded = crate::sql::padded(chunk);
            let statement = statement(self.sql(), padded.len());
            let mut query = sqlx::query(&statement);
            for id in &padded {
                query = query.bind(*id);
            }
            total += query.execute(&self.inner.pool).await?.rows_affected();
        }
        Ok(total)
    }

    /// The rows `selection` names, by `by_ids` (see [`Self::execute_by_ids`]), or all of them
    /// (of one aggregate) by `all` (the aggregate id or `NULL`, bound twice).
    async fn execute_selection(
        &self,
        selection: &DeadSelection,
        by_ids: fn(&Sql, usize) -> Statement,
        all: &Statement,
    ) -> std::result::Result<u64, sqlx::Error> {
        match selection {
            DeadSelection::Ids(ids) => self.execute_by_ids(ids, by_ids).await,
            DeadSelection::All { aggregate_id } => {
                let done = sqlx::query(all)
                    .bind(aggregate_id.as_deref())
                    .bind(aggregate_id.as_deref())
                    .execute(&self.inner.pool)
                    .await?;
                Ok(done.rows_affected())
            }
        }
    }

    /// The rows `listing` selects, read with [`rows::list`].
    async fn list<T>(&self, listing: Listing<'_>, then: rows::Then<T>) -> Result<Vec<T>> {
        let (pool, table, listings) = (&self.inner.pool, &self.inner.table, &self.sql().listings);
        rows::list::<MySql, T>(pool, table, self.target(), listings, listing, then).await
    }

    fn target(&self) -> &Target {
        &self.inner.context.target
    }

    fn sql(&self) -> &Sql {
        &self.inner.context.sql
    }

    /// The privileges the relay's user needs: on the outbox table, its bookkeeping and the
    /// pause table (read at each rebalance, once `migrate` made it), and on the membership
    /// rows its sessions write (`REPLACE`: `INSERT` and `DELETE`).
    fn grants(&self) -> [Grant; 4] {
        let table = &self.inner.table;
        [
            Grant::outbox(table.quoted()),
            Grant::on(table.quoted_sibling(SCHEMA_TABLE)).select(),
            Grant::on(table.quoted_sibling(pause::PAUSE_TABLE)).select(),
            Grant::on(table.quoted_sibling(MEMBERS_TABLE))
                .select()
                .insert(
                    "table_name, slot, connection_id, relay_id, opened_at",
                    "'', 0, 0, '', NOW(6)",
                )
                .delete(),
        ]
    }

    /// The table's pause (`outbox-relay pause`), its failures classified as the store's.
    fn pauses(
        &self,
    ) -> pause::Pauses<'_, MySql, sqlx::MySql, impl Fn(sqlx::Error) -> Error + Sync + '_> {
        let error = move |e| self.error(e);
        pause::Pauses::new(
            &self.inner.pool,
            &self.sql().pause,
            self.inner.table.name(),
            error,
        )
    }

    fn error(&self, error: sqlx::Error) -> Error {
        outboxkit_store_sql::classify::classify_on_pool::<MySql, _>(
            error,
            self.target(),
            &self.inner.pool,
        )
    }
}

/// The listings' parameters: `(? IS NULL OR event_id = ?)`, `(? IS NULL OR aggregate_type = ?)
/// AND (? IS NULL OR aggregate_id = ?)`, each value twice, the event id as `CHAR(36)` text.
impl ListingParams for MySql {
    fn bind_event_id(
        query: Query<'_, sqlx::MySql>,
        event_id: Option<uuid::Uuid>,
    ) -> Query<'_, sqlx::MySql> {
        let event_id = event_id.map(|id| id.hyphenated().to_string());
        query.bind(event_id.clone()).bind(event_id)
    }

    fn bind_aggregate<'q>(
        query: Query<'q, sqlx::MySql>,
        aggregate_type: Option<&str>,
        aggregate_id: Option<&str>,
    ) -> Query<'q, sqlx::MySql> {
        query
            .bind(aggregate_type)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(aggregate_id)
    }
}

/// The listings' and the held-back list's columns: the event id as `CHAR(36)` text, text of
/// binary-collated columns (read unchecked), and `DATETIME(6)` in UTC.
impl RowColumns for MySql {
    type Row = sqlx::mysql::MySqlRow;

    fn event_id(row: &Self::Row, index: usize) -> std::result::Result<uuid::Uuid, sqlx::Error> {
        let text: String = row.try_get_unchecked(index)?;
        uuid::Uuid::parse_str(&text).map_err(|e| sqlx::Error::ColumnDecode {
            index: "event_id".into(),
            source: e.into(),
        })
    }

    fn text(row: &Self::Row, index: usize) -> std::result::Result<Option<String>, sqlx::Error> {
        row.try_get_unchecked(index)
    }

    fn time(
        row: &Self::Row,
        index: usize,
    ) -> std::result::Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
        let time: Option<chrono::NaiveDateTime> = row.try_get(index)?;
        Ok(time.map(|t| t.and_utc()))
    }

    /// The bytes as stored: JSON cast to text, text and blobs as they are.
    fn payload(
        row: &Self::Row,
        index: usize,
        _payload_type: PayloadType,
    ) -> std::result::Result<Vec<u8>, sqlx::Error> {
        row.try_get_unchecked(index)
    }

    fn rows_affected(result: &sqlx::mysql::MySqlQueryResult) -> u64 {
        result.rows_affected()
    }
}

#[async_trait]
impl Store for MySqlStore {
    fn kind(&self) -> &'static str {
        "mysql"
    }

    fn describe(&self) -> String {
        let inner = &self.inner;
        inner
            .config
            .describe(inner.server.product(), &inner.table, &inner.tls)
    }

    async fn migrate(&self) -> Result<()> {
        migrate::migrate(
            &self.inner.options,
            &self.inner.table,
            self.inner.config.shards,
            self.inner.config.payload_type,
            self.target(),
        )
        .await
    }

    async fn check(&self) -> Result<()> {
        let table = &self.inner.table;
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.error(e))?;
        let existing = migrate::existing_tables(&mut conn, table, self.target()).await?;
        let row = match existing.schema_table {
            true => MySql::schema_row(&mut conn, table, self.target()).await?,
            false => None,
        };
        if row.is_none() && existing.outbox_is_foreign() {
            // `migrate` would refuse it too: running it is no advice.
            return Err(not_ours(table, SCHEMA_TABLE));
        }
        let grants = self.grants();
        if existing.outbox.is_none() || !existing.schema_table || !existing.members_table {
            // MySQL hides from information_schema the tables a user has no privilege on.
            let hidden = privileges::check::<MySql>(&mut conn, &grants, self.target()).await;
            return Err(match hidden {
                Err(e) if e.kind() == ErrorKind::Unauthorized => e,
                _ => migrate::not_migrated(table),
            });
        }
        crate::classify::refuse_read_only(&mut conn, self.target()).await?;
        let configured = self.inner.config.payload_type;
        table_facts::<MySql>(&mut conn, table, Ok(row), configured, self.target()).await?;
        privileges::check::<MySql>(&mut conn, &grants, self.target()).await
    }

    async fn open_session(&self, relay_id: &str) -> Result<Box<dyn ShardSession>> {
        Ok(Box::new(self.open_mysql_session(relay_id).await?))
    }

    async fn insert(&self, events: &[NewEvent]) -> Result<Vec<i64>> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| self.error(e))?;
        let ids = self.inner.outbox.enqueue_many(&mut tx, events).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(ids)
    }

    async fn purge_published(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let micros = i64::try_from(older_than.as_micros()).unwrap_or(i64::MAX);
        // Older than ~290,000 years cannot be: nothing to purge.
        let micros = micros.min(i64::from(i32::MAX) * 1_000_000);
        let done = sqlx::query(&self.sql().purge)
            .bind(micros)
            .bind(i64::from(limit))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| self.error(e).context("purging published rows"))?;
        Ok(done.rows_affected())
    }

    async fn status(&self) -> Result<BacklogStatus> {
        read_backlog(&self.inner.pool, &self.sql().status)
            .await
            .map_err(|e| self.error(e).context("reading the backlog"))
    }

    async fn oldest_kept(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        // DATETIME(6) columns in UTC.
        let oldest: Option<chrono::NaiveDateTime> = sqlx::query_scalar(&self.sql().oldest_kept)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.error(e).context("reading the oldest kept event"))?;
        Ok(oldest.map(|t| t.and_utc()))
    }

    async fn shard_owners(&self) -> Result<Vec<ShardOwner>> {
        let shard_count = self.shard_count().await?;
        let context = &self.inner.context;
        let names = context.locks.all(shard_count);
        let err = |e: sqlx::Error| self.error(e).context("reading shard owners");
        let mut conn = self.inner.pool.acquire().await.map_err(err)?;
        let holders = session::lock_holders(&mut conn, &names)
            .await
            .map_err(err)?;
        let members: Vec<(i64, i64, String)> = sqlx::query(&self.sql().members_of_table)
            .bind(&context.table_name)
            .fetch_all(&mut *conn)
            .await
            .map_err(err)?
            .iter()
            .map(|row| {
                Ok((
                    row.try_get::<i64, _>(0)?,
                    row.try_get::<i64, _>(1)?,
                    row.try_get_unchecked::<String, _>(2)?,
                ))
            })
            .collect::<std::result::Result<_, sqlx::Error>>()
            .map_err(err)?;
        let shards = shard_count as usize;
        // Relay ids by connection: a members row counts only while its slot is held by the
        // connection that wrote it.
        let mut relay_of: HashMap<i64, &str> = HashMap::new();
        for (slot, connection_id, relay_id) in &members {
            let held_by = usize::try_from(*slot)
                .ok()
                .filter(|s| *s < MEMBER_SLOTS as usize)
                .and_then(|s| holders[shards + s]);
            if held_by == Some(*connection_id) {
                relay_of.insert(*connection_id, relay_id);
            }
        }
        Ok(holders[..shards]
            .iter()
            .enumerate()
            .filter_map(|(shard, holder)| {
                let connection_id = (*holder)?;
                let owner = match relay_of.get(&connection_id) {
                    Some(relay_id) => format!("{relay_id} (connection {connection_id})"),
                    None => format!("connection {connection_id}"),
                };
                Some(ShardOwner {
                    shard: shard as i32,
                    owner,
                })
            })
            .collect())
    }

    async fn dead_list(&self, filter: &DeadFilter) -> Result<Vec<DeadEvent>> {
        self.list(Listing::Dead(filter), rows::dead).await
    }

    async fn paused(&self) -> Result<Option<Pause>> {
        self.pauses().read().await
    }

    async fn pause(&self, by: &str, reason: &str) -> Result<Paused> {
        self.pauses().pause(by, reason).await
    }

    async fn resume(&self) -> Result<Option<Pause>> {
        self.pauses().resume().await
    }

    async fn find_events(&self, filter: &EventFilter) -> Result<Vec<EventRecord>> {
        self.list(Listing::Events(filter), Ok).await
    }

    async fn dead_retry(&self, selection: &DeadSelection) -> Result<u64> {
        let sql = self.sql();
        self.execute_selection(selection, Sql::dead_retry_ids, &sql.dead_retry_all)
            .await
            .map_err(|e| self.error(e).context("sending dead rows back to pending"))
    }

    async fn replay(&self, selection: &ReplaySelection, dry_run: bool) -> Result<u64> {
        // DATETIME(6) columns in UTC.
        let since = selection.published_since.naive_utc();
        // An open window ends when the replay starts, by the database's clock: the events it
        // sends back are published again meanwhile, and must not be selected again.
        let until = match selection.published_until {
            Some(until) => until.naive_utc(),
            None => sqlx::query_scalar::<_, chrono::NaiveDateTime>("SELECT UTC_TIMESTAMP(6)")
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.error(e).context(replay_action(dry_run)))?,
        };
        let (aggregate_type, aggregate_id) = (
            selection.aggregate_type.as_deref(),
            selection.aggregate_id.as_deref(),
        );
        let query = |sql| {
            sqlx::query(sql)
                .bind(since)
                .bind(until)
                .bind(until)
                .bind(aggregate_type)
                .bind(aggregate_type)
                .bind(aggregate_id)
                .bind(aggregate_id)
        };
        replay_rows(
            &self.inner.pool,
            dry_run,
            query(&self.sql().replay_count),
            || query(&self.sql().replay).bind(REPLAY_BATCH),
            MySqlQueryResult::rows_affected,
        )
        .await
        .map_err(|e| self.error(e).context(replay_action(dry_run)))
    }

    async fn dead_discard(&self, selection: &DeadSelection) -> Result<u64> {
        let sql = self.sql();
        self.execute_selection(selection, Sql::dead_discard, &sql.dead_discard_all)
            .await
            .map_err(|e| self.error(e).context("discarding dead rows"))
    }

    async fn held_back(&self, limit: u32) -> Result<Vec<HeldBack>> {
        let query = sqlx::query(&self.sql().held_back).bind(i64::from(limit.max(1)));
        rows::fetch(&self.inner.pool, query, rows::held_back::<MySql>)
            .await
            .map_err(|e| self.error(e).context("listing held-back aggregates"))
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::ErrorKind;

    use super::*;

    #[test]
    fn server_versions_are_recognised_and_old_ones_refused() {
        let maria = ServerInfo::parse("10.11.6-MariaDB-0+deb12u1", false, "MIXED");
        assert!(maria.mariadb && maria.read_committed);
        assert_eq!(maria.numbers(), (10, 11, 6));
        maria.check_supported("db:3306").unwrap();
        for (version, format) in [
            ("10.6.0-MariaDB", "ROW"),
            ("11.4.2-MariaDB", "MIXED"),
            ("8.4.0-commercial", "ROW"),
        ] {
            let server = ServerInfo::parse(version, true, format);
            server.check_supported("db:3306").unwrap();
        }
        let e = ServerInfo::parse("10.5.23-MariaDB", false, "")
            .check_supported("db:3306")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(
            e.message()
                .contains("MariaDB 10.5.23-MariaDB at db:3306 is too old"),
            "{e}"
        );

        let mysql = ServerInfo::parse("8.0.36", true, "ROW");
        assert!(!mysql.mariadb && mysql.read_committed);
        mysql.check_supported("db:3306").unwrap();
        for old in ["5.7.44-log", "8.0.13"] {
            assert!(ServerInfo::parse(old, true, "ROW")
                .check_supported("db:3306")
                .is_err());
        }
    }

    #[test]
    fn statement_based_binlogs_keep_repeatable_read() {
        let s = ServerInfo::parse("8.0.36", true, "STATEMENT");
        assert!(!s.read_committed);
        assert!(!s
            .session_setup(Duration::from_secs(30))
            .contains("READ COMMITTED"));
        assert!(ServerInfo::parse("8.0.36", false, "STATEMENT").read_committed);
    }

    #[test]
    fn session_setup_sets_the_statement_limit_of_each_server() {
        for (server, timeout, statement_limit, lock_wait, idle) in [
            (
                ServerInfo::parse("10.11.6-MariaDB", false, "MIXED"),
                Duration::from_millis(1500),
                "max_statement_time = 1.500",
                2,
                120,
            ),
            (
                ServerInfo::parse("8.0.36", true, "ROW"),
                Duration::from_secs(60),
                "max_execution_time = 60000",
                60,
                240,
            ),
        ] {
            let setup = server.session_setup(timeout);
            assert!(
                setup.starts_with(&format!("SET SESSION {statement_limit}, ")),
                "{setup}"
            );
            assert!(
                setup.contains(&format!("innodb_lock_wait_timeout = {lock_wait}")),
                "{setup}"
            );
            assert!(setup.contains(&format!("wait_timeout = {idle}")), "{setup}");
            assert!(setup.ends_with("; SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"));
        }
    }
}
