//! `PostgresStore`: the `Store` implementation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgQueryResult};
use sqlx::{Connection, PgPool, Row};

use outboxkit_core::{
    BacklogStatus, DeadEvent, DeadFilter, DeadSelection, Error, EventFilter, EventRecord, HeldBack,
    NewEvent, Pause, Paused, PayloadType, ReplaySelection, Result, ShardOwner, ShardSession, Store,
};

use crate::classify::{classify, Postgres, Target};
use crate::config::{PostgresStoreConfig, TableName, SCHEMA_TABLE};
use crate::enqueue::Outbox;
use crate::logical::session::{LogicalContext, LogicalSession};
use crate::logical::setup;
use crate::logical::HeldFigures;
use crate::migrate;
use crate::session::{LockKeys, PostgresShardSession, SessionContext, APPLICATION_PREFIX};
use crate::sql::Sql;
use outboxkit_store_sql::classify::{connect, list_tables};
use outboxkit_store_sql::config;
use outboxkit_store_sql::migrate::{not_ours, pooled_table_facts, table_facts, TableCatalog};
use outboxkit_store_sql::pause;
use outboxkit_store_sql::privileges::{self, Grant};
use outboxkit_store_sql::replay::{replay_action, replay_rows, REPLAY_BATCH};
use outboxkit_store_sql::rows::{self, read_backlog, Listing, ListingParams, Query, RowColumns};
use outboxkit_store_sql::Statement;

/// What errors name of the server `config` connects to, about `table`.
fn target_of(config: &PostgresStoreConfig, options: &PgConnectOptions, table: String) -> Target {
    let user = options.get_username().to_owned();
    let database = options.get_database().unwrap_or(&user).to_owned();
    config.target(
        crate::config::endpoint(options),
        Some(database),
        user,
        table,
    )
}

/// The outbox table in PostgreSQL: migrations, claims through shard sessions, purge, status.
/// Cheap to clone.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: PostgresStoreConfig,
    options: PgConnectOptions,
    pool: PgPool,
    table: TableName,
    context: Arc<SessionContext>,
    outbox: Outbox,
    /// Whether the first connection used TLS (`TLS TLSv1.3 (sslmode=verify-full)`).
    tls: String,
    /// `Some` with `store.capture = "logical"`.
    logical: Option<Arc<LogicalContext>>,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.inner.config.redacted_url())
            .field("table", &self.inner.table.to_string())
            .finish()
    }
}

impl PostgresStore {
    /// Check the configuration and connect. The first connection is made now, so an
    /// unreachable database or refused credentials fail here with a one-line error.
    ///
    /// An unqualified table name is resolved to the connecting user's current schema.
    pub async fn connect(config: PostgresStoreConfig) -> Result<Self> {
        config.validate()?;
        outboxkit_store_sql::ensure_crypto_provider();
        let options = config.connect_options(PgConnectOptions::password)?;
        let configured = TableName::parse(&config.table).map_err(|e| e.context("store.table"))?;
        let mut target = target_of(&config, &options, configured.to_string());

        let mut conn = connect::<Postgres, _>(&options, &target, config.connect_timeout).await?;
        let table = match configured.qualifier() {
            Some(_) => configured,
            None => {
                let schema: Option<String> = sqlx::query_scalar("SELECT current_schema()")
                    .fetch_one(&mut conn)
                    .await
                    .map_err(|e| classify(e, &target))?;
                let schema = schema.ok_or_else(|| {
                    Error::config(format!(
                        "store.table: \"{configured}\" has no schema and the search_path of user \
                         \"{}\" names no existing schema: write it as schema.table",
                        options.get_username()
                    ))
                })?;
                configured.or_in(&schema)
            }
        };
        let tls_version: Option<String> = sqlx::query_scalar(
            "SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
        )
        .fetch_optional(&mut conn)
        .await
        .map_err(|e| classify(e, &target))?
        .flatten();
        let tls = config::tls_summary(&config.url, tls_version.as_deref(), "sslmode", "prefer");
        target.table = table.to_string();
        let names = match config.capture {
            outboxkit_store_sql::config::Capture::Poll => None,
            outboxkit_store_sql::config::Capture::Logical => {
                let names = crate::logical::LogicalNames::new(&table, &config.logical);
                let names = crate::logical::with_recorded(
                    &mut conn,
                    &table,
                    &config.logical,
                    names,
                    &target,
                )
                .await?;
                Some(names)
            }
        };
        if let Err(e) = conn.close().await {
            tracing::debug!("closing the first connection: {e}");
        }

        let pool = config
            .pool_options()
            .connect_lazy_with(options.clone().application_name("outbox-relay"));
        let logical = match names {
            None => None,
            Some(names) => Some(Arc::new(LogicalContext {
                names,
                table: table.clone(),
                sql: Sql::new(&table),
                target: target.clone(),
                options: options.clone(),
                password: crate::logical::password_of(&config.url, config.password.as_deref()),
                tls: crate::logical::tls_of_url(&config.url)?,
                hostaddr: outboxkit_store_sql::config::url_option(&config.url, "hostaddr"),
                max_unsettled: config.logical.max_unsettled,
                max_unsettled_bytes: config.logical.max_unsettled_bytes,
                takeover_after: config.logical.takeover_after,
                connect_timeout: config.connect_timeout,
                session_timeout: config.session_timeout,
                progress: Default::default(),
            })),
        };
        let context = Arc::new(SessionContext {
            sql: Sql::new(&table),
            keys: LockKeys::for_table(&table),
            target,
        });
        Ok(Self {
            inner: Arc::new(Inner {
                outbox: Outbox::for_table(&table).naming(&context.target),
                config,
                options,
                pool,
                table,
                context,
                tls,
                logical,
            }),
        })
    }

    /// Every table the configuration's user can see, as (schema, table), outside PostgreSQL's
    /// own schemas: what a pattern `store.table` is matched against. One short connection.
    pub async fn list_tables(config: &PostgresStoreConfig) -> Result<Vec<(String, String)>> {
        outboxkit_store_sql::ensure_crypto_provider();
        let options = config.connect_options(PgConnectOptions::password)?;
        let target = target_of(config, &options, config.table.clone());
        list_tables::<Postgres, _, _>(
            &options,
            &target,
            config.connect_timeout,
            "SELECT table_schema::text, table_name::text FROM information_schema.tables \
             WHERE table_type = 'BASE TABLE' \
             AND table_schema NOT IN ('pg_catalog', 'information_schema') \
             AND table_schema NOT LIKE 'pg\\_%'",
        )
        .await
    }

    /// The connection pool (not used by shard sessions, which have their own connections).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The outbox table, schema-qualified.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The configuration this store was connected with.
    pub fn config(&self) -> &PostgresStoreConfig {
        &self.inner.config
    }

    /// The writers' handle on this store's table.
    pub fn outbox(&self) -> &Outbox {
        &self.inner.outbox
    }

    /// Like [`Store::open_session`], with the concrete session type.
    pub async fn open_postgres_session(&self, relay_id: &str) -> Result<PostgresShardSession> {
        let (shard_count, payload_type) = self.table_facts().await?;
        PostgresShardSession::open(
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

    /// The table's shard count (checking its schema version) and its payload type, checked
    /// against `store.payload_type`.
    async fn table_facts(&self) -> Result<(u32, PayloadType)> {
        let configured = self.inner.config.payload_type;
        pooled_table_facts(
            &self.inner.pool,
            &self.inner.table,
            configured,
            self.target(),
        )
        .await
    }

    /// The rows `selection` names, by `by_ids` (`$1` the ids) or all of them (of one aggregate)
    /// by `all` (`$1` the aggregate id or `NULL`): the rows affected.
    async fn execute_selection(
        &self,
        selection: &DeadSelection,
        by_ids: &Statement,
        all: &Statement,
    ) -> std::result::Result<u64, sqlx::Error> {
        let query = match selection {
            DeadSelection::Ids(ids) => sqlx::query(by_ids).bind(ids.clone()),
            DeadSelection::All { aggregate_id } => sqlx::query(all).bind(aggregate_id.clone()),
        };
        Ok(query.execute(&self.inner.pool).await?.rows_affected())
    }

    /// The rows `listing` selects, read with [`rows::list`].
    async fn list<T>(&self, listing: Listing<'_>, then: rows::Then<T>) -> Result<Vec<T>> {
        let (pool, table, listings) = (&self.inner.pool, &self.inner.table, &self.sql().listings);
        rows::list::<Postgres, T>(pool, table, self.target(), listings, listing, then).await
    }

    fn target(&self) -> &Target {
        &self.inner.context.target
    }

    /// The slot, publication and emit function of `store.capture = "logical"`; `None` when
    /// polling.
    pub fn logical_names(&self) -> Option<&crate::logical::LogicalNames> {
        self.inner.logical.as_deref().map(|l| &l.names)
    }

    /// Whether events are captured from the log as messages (no row per event).
    fn is_message_style(&self) -> bool {
        let logical = self.inner.logical.as_deref();
        logical.is_some_and(|l| l.names.style == config::CaptureStyle::Message)
    }

    /// The replication slot's figures (`None` when polling, or when the slot does not exist).
    pub async fn slot_status(&self) -> Result<Option<outboxkit_core::SlotStatus>> {
        Ok(self.slot_figures().await?.0)
    }

    /// [`Self::slot_status`], and what the reader's failed events hold back (message style;
    /// none when polling, or when the slot does not exist).
    async fn slot_figures(&self) -> Result<(Option<outboxkit_core::SlotStatus>, HeldFigures)> {
        let Some(logical) = self.inner.logical.as_deref() else {
            return Ok((None, HeldFigures::default()));
        };
        let slot = &logical.names.slot;
        let Some(lag) = setup::slot_lag(&self.inner.pool, slot)
            .await
            .map_err(|e| self.error(e).context("reading the replication slot"))?
        else {
            return Ok((None, HeldFigures::default()));
        };
        let reader = match lag.active_pid {
            Some(pid) => {
                let application: Option<String> = sqlx::query_scalar(
                    "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
                )
                .bind(pid)
                .fetch_optional(&self.inner.pool)
                .await
                .map_err(|e| self.error(e).context("reading the replication slot"))?;
                Some(
                    match application
                        .as_deref()
                        .and_then(|a| a.strip_prefix(APPLICATION_PREFIX))
                    {
                        Some(relay_id) => format!("{relay_id} (pid {pid})"),
                        None => format!("pid {pid}"),
                    },
                )
            }
            None => None,
        };
        let figures = self.reader_figures(lag.active).await?;
        let status = outboxkit_core::SlotStatus {
            name: slot.clone(),
            lag_bytes: lag.lag_bytes,
            lag_secs: figures.oldest_secs,
            unsettled: figures.unsettled,
            reader,
            wal_status: lag.wal_status,
        };
        Ok((Some(status), figures.held))
    }

    /// What the slot's reader holds: events read and not settled, the age in seconds of the
    /// oldest, and what its failed events hold back. In the process that reads the slot, its
    /// own figures, which it also writes to the capture bookkeeping row; elsewhere, that row's,
    /// when the reader reported within the last minute. The held-back figures go through the
    /// row in message style only, once `migrate` gave it their columns.
    async fn reader_figures(&self, active: bool) -> Result<ReaderFigures> {
        use std::sync::atomic::Ordering::Relaxed;
        let Some(logical) = self.inner.logical.as_deref() else {
            return Ok(ReaderFigures::default());
        };
        let progress = &logical.progress;
        let table = &self.inner.table;
        let bookkeeping = table.quoted_sibling(setup::CAPTURE_TABLE);
        let err = |e| self.error(e).context("recording the slot reader's figures");
        if !progress.reading.load(Relaxed) && !active {
            return Ok(ReaderFigures::default());
        }
        // Only message style needs them: table style counts its rows.
        let held_columns = self.is_message_style()
            && setup::has_held_columns(&self.inner.pool, table)
                .await
                .map_err(err)?;
        if progress.reading.load(Relaxed) {
            let unsettled = progress.unsettled.load(Relaxed);
            let oldest = progress.oldest_micros.load(Relaxed);
            let held = progress.held();
            let oldest_at = (oldest != 0)
                .then(|| chrono::DateTime::<chrono::Utc>::from_timestamp_micros(oldest))
                .flatten();
            let mut update = String::from(
                "reader_unsettled = $2, reader_oldest_at = $3, reader_reported_at = now()",
            );
            if held_columns {
                update.push_str(
                    ", reader_retrying = $4, reader_held_back_aggregates = $5, \
                     reader_held_back = $6::text::jsonb",
                );
            }
            let query = sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {bookkeeping} SET {update} WHERE table_name = $1"
            )))
            .bind(table.name())
            .bind(unsettled as i64)
            .bind(oldest_at);
            let query = match held_columns {
                true => query
                    .bind(held.retrying)
                    .bind(held.aggregates)
                    .bind(setup::listed_json(&held.listed)),
                false => query,
            };
            query.execute(&self.inner.pool).await.map_err(err)?;
            let age = oldest_at.map_or(0.0, |at| {
                ((chrono::Utc::now() - at).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0)
            });
            return Ok(ReaderFigures {
                unsettled: Some(unsettled as i64),
                oldest_secs: Some(age),
                held,
            });
        }
        let held_select = match held_columns {
            true => "reader_retrying, reader_held_back_aggregates, reader_held_back::text",
            false => "NULL::int8, NULL::int8, NULL::text",
        };
        let row: Option<Reported> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT reader_unsettled, extract(epoch FROM now() - reader_oldest_at)::float8, \
             extract(epoch FROM now() - reader_reported_at)::float8, {held_select} \
             FROM {bookkeeping} WHERE table_name = $1"
        )))
        .bind(table.name())
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(err)?;
        Ok(match row {
            Some((held, oldest, Some(reported), retrying, aggregates, listed))
                if reported < 60.0 =>
            {
                ReaderFigures {
                    unsettled: Some(held.unwrap_or(0).max(0)),
                    oldest_secs: Some(oldest.unwrap_or(0.0).max(0.0)),
                    held: HeldFigures {
                        retrying: retrying.unwrap_or(0),
                        aggregates: aggregates.unwrap_or(0),
                        listed: setup::listed_from_json(listed.as_deref()),
                    },
                }
            }
            _ => ReaderFigures::default(),
        })
    }

    /// The relay's error for a sqlx error about this store's table.
    pub(crate) fn classify(&self, error: sqlx::Error) -> Error {
        self.error(error)
    }

    fn sql(&self) -> &Sql {
        &self.inner.context.sql
    }

    /// The privileges the relay's user needs: on the outbox table, its bookkeeping, the pause
    /// table (read at each rebalance, once `migrate` made it) and, with log-based capture, the
    /// capture bookkeeping (polling only reads it, when it exists).
    fn grants(&self) -> [Grant; 4] {
        let table = &self.inner.table;
        let outbox = Grant::outbox(table.quoted());
        let schema = Grant::on(table.quoted_sibling(SCHEMA_TABLE)).select();
        let pause = Grant::on(table.quoted_sibling(pause::PAUSE_TABLE)).select();
        let capture = Grant::on(table.quoted_sibling(setup::CAPTURE_TABLE)).select();
        match self.inner.logical {
            // Dead events of message style, and retried ones, are written to the table.
            Some(_) => [
                outbox.insert("aggregate_type", "''"),
                schema,
                pause,
                capture.update("reader_unsettled", "0"),
            ],
            None => [outbox, schema, pause, capture],
        }
    }

    /// The table's pause (`outbox-relay pause`), its failures classified as the store's.
    fn pauses(
        &self,
    ) -> pause::Pauses<'_, Postgres, sqlx::Postgres, impl Fn(sqlx::Error) -> Error + Sync + '_>
    {
        let error = move |e| self.error(e);
        pause::Pauses::new(
            &self.inner.pool,
            &self.sql().pause,
            self.inner.table.name(),
            error,
        )
    }

    fn error(&self, error: sqlx::Error) -> Error {
        outboxkit_store_sql::classify::classify_on_pool::<Postgres, _>(
            error,
            self.target(),
            &self.inner.pool,
        )
    }
}

/// What the slot's reader holds (see [`PostgresStore::reader_figures`]).
#[derive(Debug, Default)]
struct ReaderFigures {
    unsettled: Option<i64>,
    oldest_secs: Option<f64>,
    held: HeldFigures,
}

/// The reader's figures as it reported them in the bookkeeping row: unsettled, age of the
/// oldest, seconds since the report, retrying, held-back aggregates and the list (JSON).
type Reported = (
    Option<i64>,
    Option<f64>,
    Option<f64>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

/// The listings' parameters: `($1::uuid IS NULL OR event_id = $1)`, then the aggregate type
/// and id, each once.
impl ListingParams for Postgres {
    fn bind_event_id(
        query: Query<'_, sqlx::Postgres>,
        event_id: Option<uuid::Uuid>,
    ) -> Query<'_, sqlx::Postgres> {
        query.bind(event_id)
    }

    fn bind_aggregate<'q>(
        query: Query<'q, sqlx::Postgres>,
        aggregate_type: Option<&str>,
        aggregate_id: Option<&str>,
    ) -> Query<'q, sqlx::Postgres> {
        query.bind(aggregate_type).bind(aggregate_id)
    }
}

/// The listings' and the held-back list's columns: `uuid`, `text` and `timestamptz`.
impl RowColumns for Postgres {
    type Row = sqlx::postgres::PgRow;

    fn event_id(row: &Self::Row, index: usize) -> std::result::Result<uuid::Uuid, sqlx::Error> {
        row.try_get(index)
    }

    fn text(row: &Self::Row, index: usize) -> std::result::Result<Option<String>, sqlx::Error> {
        row.try_get(index)
    }

    fn time(
        row: &Self::Row,
        index: usize,
    ) -> std::result::Result<Option<chrono::DateTime<chrono::Utc>>, sqlx::Error> {
        row.try_get(index)
    }

    fn payload(
        row: &Self::Row,
        index: usize,
        payload_type: PayloadType,
    ) -> std::result::Result<Vec<u8>, sqlx::Error> {
        match payload_type {
            PayloadType::Json | PayloadType::Text => {
                Ok(row.try_get::<String, _>(index)?.into_bytes())
            }
            PayloadType::Binary => row.try_get(index),
        }
    }

    fn rows_affected(result: &sqlx::postgres::PgQueryResult) -> u64 {
        result.rows_affected()
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn describe(&self) -> String {
        let inner = &self.inner;
        inner
            .config
            .describe("PostgreSQL", &inner.table, &inner.tls)
    }

    async fn migrate(&self) -> Result<()> {
        if self.inner.logical.is_some() {
            // What the server must offer first, so that a migrate refused changes nothing.
            let mut conn = self.inner.pool.acquire().await.map_err(|e| self.error(e))?;
            setup::check_server(&mut conn, self.target()).await?;
        }
        migrate::migrate(
            &self.inner.pool,
            &self.inner.table,
            self.inner.config.shards,
            self.inner.config.payload_type,
            self.target(),
        )
        .await?;
        if let Some(logical) = self.inner.logical.as_deref() {
            let payload_type = {
                let mut conn = self.inner.pool.acquire().await.map_err(|e| self.error(e))?;
                Postgres::payload_type(&mut conn, &self.inner.table, self.target()).await?
            };
            setup::migrate(
                &self.inner.pool,
                &self.inner.table,
                &logical.names,
                payload_type,
                self.target(),
            )
            .await?;
        }
        Ok(())
    }

    async fn check(&self) -> Result<()> {
        let table = &self.inner.table;
        let mut conn = self.inner.pool.acquire().await.map_err(|e| self.error(e))?;
        let (outbox_exists, schema_table_exists): (bool, bool) = sqlx::query_as(
            "SELECT to_regclass($1::text) IS NOT NULL, to_regclass($2::text) IS NOT NULL",
        )
        .bind(table.quoted())
        .bind(table.quoted_sibling(SCHEMA_TABLE))
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| self.error(e))?;
        if !outbox_exists {
            return Err(migrate::not_migrated(table));
        }
        crate::classify::refuse_read_only(&mut conn, self.target()).await?;
        privileges::check::<Postgres>(&mut conn, &self.grants(), self.target()).await?;
        let row = match schema_table_exists {
            true => Postgres::schema_row(&mut conn, table, self.target()).await?,
            false => None,
        };
        if row.is_none() {
            // `migrate` would refuse it too: running it is no advice.
            return Err(not_ours(table, SCHEMA_TABLE));
        }
        let configured = self.inner.config.payload_type;
        table_facts::<Postgres>(&mut conn, table, Ok(row), configured, self.target()).await?;
        match self.inner.logical.as_deref() {
            Some(logical) => setup::check(&mut conn, table, &logical.names, self.target()).await,
            None => setup::check_polled(&mut conn, table, self.target()).await,
        }
    }

    async fn open_session(&self, relay_id: &str) -> Result<Box<dyn ShardSession>> {
        if let Some(logical) = self.inner.logical.as_ref() {
            let (_, payload_type) = self.table_facts().await?;
            let session = LogicalSession::open(Arc::clone(logical), relay_id, payload_type).await?;
            return Ok(Box::new(session));
        }
        Ok(Box::new(self.open_postgres_session(relay_id).await?))
    }

    fn check_relay_settings(&self, relay: &outboxkit_core::RelayConfig) -> Result<()> {
        if self.inner.logical.is_some() && relay.on_dead == outboxkit_core::OnDead::Hold {
            return Err(Error::config(
                "relay.on_dead: \"hold\" is not available with store.capture = \"logical\" (a \
                 dead event would hold its aggregate and the replication slot, and so the \
                 server's log, until someone acts); use \"skip\", the default",
            ));
        }
        Ok(())
    }

    async fn insert(&self, events: &[NewEvent]) -> Result<Vec<i64>> {
        let mut tx = self.inner.pool.begin().await.map_err(|e| self.error(e))?;
        let ids = self.inner.outbox.enqueue_many(&mut tx, events).await?;
        tx.commit().await.map_err(|e| self.error(e))?;
        Ok(ids)
    }

    async fn purge_published(&self, older_than: Duration, limit: u32) -> Result<u64> {
        let done = sqlx::query(&self.sql().purge)
            .bind(older_than.as_secs_f64())
            .bind(i64::from(limit))
            .execute(&self.inner.pool)
            .await
            .map_err(|e| self.error(e).context("purging published rows"))?;
        Ok(done.rows_affected())
    }

    async fn status(&self) -> Result<BacklogStatus> {
        let mut status = read_backlog(&self.inner.pool, &self.sql().status)
            .await
            .map_err(|e| self.error(e).context("reading the backlog"))?;
        if self.inner.logical.is_some() {
            let (slot, held) = self.slot_figures().await?;
            status.slot = slot;
            if self.is_message_style() {
                // No row per event: what is pending, and what waits for a retry, is what the
                // reader holds.
                status.pending = status.slot.as_ref().and_then(|s| s.unsettled).unwrap_or(0);
                status.oldest_pending_age_secs =
                    status.slot.as_ref().and_then(|s| s.lag_secs).unwrap_or(0.0);
                status.retrying = held.retrying;
                status.held_back_aggregates = held.aggregates;
            }
        }
        Ok(status)
    }

    async fn oldest_kept(&self) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
        sqlx::query_scalar(&self.sql().oldest_kept)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| self.error(e).context("reading the oldest kept event"))
    }

    async fn shard_owners(&self) -> Result<Vec<ShardOwner>> {
        if self.inner.logical.is_some() {
            let reader = self.slot_status().await?.and_then(|s| s.reader);
            return Ok(reader
                .map(|owner| ShardOwner { shard: 0, owner })
                .into_iter()
                .collect());
        }
        let rows: Vec<(i64, i32, Option<String>)> = sqlx::query_as(&self.sql().owners)
            .bind(i64::from(self.inner.context.keys.shard_key))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| self.error(e).context("reading shard owners"))?;
        Ok(rows
            .into_iter()
            .filter_map(|(shard, pid, application)| {
                let shard = i32::try_from(shard).ok()?;
                let owner = match application
                    .as_deref()
                    .and_then(|a| a.strip_prefix(APPLICATION_PREFIX))
                {
                    Some(relay_id) => format!("{relay_id} (pid {pid})"),
                    None => format!("pid {pid}"),
                };
                Some(ShardOwner { shard, owner })
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
        if let Some(logical) = self.inner.logical.as_deref() {
            let mut tx = self.inner.pool.begin().await.map_err(|e| self.error(e))?;
            let payload_type =
                Postgres::payload_type(&mut tx, &self.inner.table, self.target()).await?;
            let n =
                crate::logical::retry_dead(&mut tx, self, &logical.names, payload_type, selection)
                    .await
                    .map_err(|e| e.context("sending dead events back"))?;
            tx.commit().await.map_err(|e| self.error(e))?;
            return Ok(n);
        }
        let sql = self.sql();
        self.execute_selection(selection, &sql.dead_retry_ids, &sql.dead_retry_all)
            .await
            .map_err(|e| self.error(e).context("sending dead rows back to pending"))
    }

    async fn dead_discard(&self, selection: &DeadSelection) -> Result<u64> {
        let sql = self.sql();
        self.execute_selection(selection, &sql.dead_discard, &sql.dead_discard_all)
            .await
            .map_err(|e| self.error(e).context("discarding dead rows"))
    }

    async fn replay(&self, selection: &ReplaySelection, dry_run: bool) -> Result<u64> {
        let what = replay_action(dry_run);
        // With log-based capture (table style) the rows are written again, for the log.
        let statement = match self.inner.logical.as_deref() {
            Some(logical) => {
                crate::logical::refuse_replay(&logical.names, self.table())
                    .map_err(|e| e.context(what))?;
                &self.sql().replay_rewrite
            }
            None => &self.sql().replay,
        };
        // An open window ends when the replay starts, by the database's clock: the events it
        // sends back are published again meanwhile, and must not be selected again.
        let until = match selection.published_until {
            Some(until) => until,
            None => sqlx::query_scalar("SELECT now()")
                .fetch_one(&self.inner.pool)
                .await
                .map_err(|e| self.error(e).context(what))?,
        };
        let query = |sql| {
            sqlx::query(sql)
                .bind(selection.published_since)
                .bind(until)
                .bind(selection.aggregate_type.as_deref())
                .bind(selection.aggregate_id.as_deref())
        };
        replay_rows(
            &self.inner.pool,
            dry_run,
            query(&self.sql().replay_count),
            || query(statement).bind(REPLAY_BATCH),
            PgQueryResult::rows_affected,
        )
        .await
        .map_err(|e| self.error(e).context(what))
    }

    /// In message style, as the slot's reader noted them: the 100 with the lowest ids at the
    /// most.
    async fn held_back(&self, limit: u32) -> Result<Vec<HeldBack>> {
        if self.is_message_style() {
            let mut listed = self.slot_figures().await?.1.listed;
            listed.truncate(limit.max(1) as usize);
            return Ok(listed);
        }
        let query = sqlx::query(&self.sql().held_back).bind(i64::from(limit.max(1)));
        rows::fetch(&self.inner.pool, query, rows::held_back::<Postgres>)
            .await
            .map_err(|e| self.error(e).context("listing held-back aggregates"))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use outboxkit_core::{Failure, MarkMode};
    use sqlx::Executor;

    use super::*;

    fn test_url() -> String {
        std::env::var("OUTBOX_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
    }

    /// The claim walks the pending partial index in id order and checks held-back aggregates
    /// in the retry index, on a table where most rows are history.
    #[tokio::test]
    async fn the_claim_uses_the_pending_and_retry_indexes() {
        let table = format!(
            "outbox_t_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..16]
        );
        let store = PostgresStore::connect(PostgresStoreConfig::new(test_url()).table(&table))
            .await
            .expect("PostgreSQL is required for this test (OUTBOX_TEST_POSTGRES_URL)");
        store.migrate().await.unwrap();
        let t = store.table().quoted();
        store
            .pool()
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, published_at) \
                 SELECT 'order', 'agg-' || (i % 500), 'E', '{{}}', \
                        CASE WHEN i <= 18000 THEN now() END \
                 FROM generate_series(1, 20000) AS i; \
                 ANALYZE {t};"
            ))))
            .await
            .unwrap();
        let mut session = store.open_postgres_session("explain").await.unwrap();
        for shard in 0..32 {
            assert!(session.try_acquire(shard).await.unwrap());
        }
        let claimed = session
            .claim(&outboxkit_core::ClaimRequest {
                limit: 10,
                exclude_ids: &[],
                dead_holds_aggregate: false,
            })
            .await
            .unwrap();
        session
            .record_failures(&[Failure {
                id: claimed[0].id,
                error: "x".to_owned(),
                retry_in: Some(Duration::from_secs(60)),
            }])
            .await
            .unwrap();
        session
            .mark_published(&[claimed[1].id], MarkMode::Keep)
            .await
            .unwrap();

        let shards: Vec<i16> = (0..32).collect();
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "EXPLAIN {}",
            store.sql().claim(outboxkit_core::PayloadType::Json)
        )))
        .bind(&shards)
        .bind(&[claimed[2].id][..])
        .bind(false)
        .bind(500_i64)
        .fetch_all(store.pool())
        .await
        .unwrap();
        let plan = plan.join("\n");
        assert!(plan.contains(&format!("{table}_pending_idx")), "{plan}");
        assert!(plan.contains(&format!("{table}_retry_idx")), "{plan}");
        assert!(!plan.contains("Seq Scan"), "{plan}");
        Box::new(session).close().await.unwrap();
        let bookkeeping = store.table().quoted_sibling(SCHEMA_TABLE);
        store
            .pool()
            .execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP TABLE {t}; DELETE FROM {bookkeeping} WHERE table_name = '{table}'"
            ))))
            .await
            .unwrap();
    }
}
