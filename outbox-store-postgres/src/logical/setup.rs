//! What `migrate` sets up for `capture = "logical"`, and what `check` verifies before relaying:
//! the server's settings, the user's privilege, the publication, the slot, the emit function,
//! and the bookkeeping row that remembers the slot was made (so a slot that disappears later
//! is an error, never silently made again).

use sqlx::{Connection, Executor, PgConnection, PgPool, Row};

use outboxkit_core::{Error, ErrorKind, HeldBack, PayloadType, Result};
use outboxkit_store_sql::config::{CaptureStyle, LogicalSettings};
use outboxkit_store_sql::Statement;

use super::backlog::{HeldFigures, ResumePoint};
use crate::classify::{classify, Target};
use crate::config::TableName;

/// The bookkeeping table of capture set-ups, in the outbox table's schema. Besides the set-up,
/// the relay reading the slot writes there, every `relay.status_interval`, how many events it
/// holds and when the oldest was written, for `status` run by other processes.
pub(crate) const CAPTURE_TABLE: &str = "outbox_relay_capture";

/// Where the operators' runbook for slots lives.
pub(crate) const RUNBOOK: &str = "docs/OPERATIONS.md, \"Replication slot\"";

/// The names a logical set-up uses for one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogicalNames {
    pub style: CaptureStyle,
    pub slot: String,
    pub publication: String,
    /// The prefix of the emit function's messages: `outbox:<schema>.<table>`.
    pub prefix: String,
    /// The emit function, quoted: `"app"."outbox_emit"`.
    pub function: String,
}

/// Longest name of a replication slot or a publication (`NAMEDATALEN` - 1).
const MAX_NAME: usize = 63;

/// The slot of a table when `store.logical.slot` is not set: `outbox_relay_<schema>_<table>`,
/// or, when that is longer than 63 bytes, its first 54 bytes, `_` and 8 hex digits of a hash of
/// `<schema>.<table>`, so that tables whose long names begin alike get slots of their own.
fn default_slot(schema: &str, table: &str) -> String {
    fit_name(
        format!("outbox_relay_{schema}_{table}"),
        &format!("{schema}.{table}"),
    )
}

/// `name` when it has at most 63 bytes, else its first 54 bytes, `_` and 8 hex digits of a hash
/// of `key` (which tells the long names apart). `name` is ASCII.
pub(crate) fn fit_name(name: String, key: &str) -> String {
    if name.len() <= MAX_NAME {
        return name;
    }
    let hash = crate::migrate::fnv1a64(key.as_bytes());
    format!("{}_{:08x}", &name[..MAX_NAME - 9], hash as u32)
}

impl LogicalNames {
    pub fn new(table: &TableName, settings: &LogicalSettings) -> Self {
        let schema = table.qualifier().unwrap_or("public");
        let slot = settings
            .slot
            .clone()
            .unwrap_or_else(|| default_slot(schema, table.name()));
        Self {
            style: settings.style,
            publication: settings.publication.clone().unwrap_or_else(|| slot.clone()),
            slot,
            prefix: format!("outbox:{schema}.{}", table.name()),
            function: table.quoted_sibling(&format!("{}_emit", table.name())),
        }
    }
}

fn err<'a>(target: &'a Target, doing: &str) -> impl Fn(sqlx::Error) -> Error + 'a {
    let doing = doing.to_owned();
    move |e| classify(e, target).context(doing.clone())
}

/// What the server must offer: `wal_level = logical` and a user allowed to replicate.
pub(crate) async fn check_server(conn: &mut PgConnection, target: &Target) -> Result<()> {
    let e = err(target, "checking the server for logical capture");
    let wal_level: String = sqlx::query_scalar("SELECT current_setting('wal_level')")
        .fetch_one(&mut *conn)
        .await
        .map_err(&e)?;
    if wal_level != "logical" {
        return Err(Error::new(
            ErrorKind::Config,
            needs_wal_level(
                target.endpoint.as_deref().unwrap_or("the server"),
                &wal_level,
            ),
        )
        .permanent());
    }
    let (user, allowed): (String, bool) = sqlx::query_as(
        "SELECT current_user::text, rolreplication OR rolsuper FROM pg_roles \
         WHERE rolname = current_user",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(&e)?;
    if !allowed {
        return Err(Error::new(
            ErrorKind::Unauthorized,
            format!(
                "store.capture = \"logical\": user \"{user}\" may not read the log; give it the \
                 replication privilege (ALTER ROLE \"{user}\" REPLICATION) or connect as a user \
                 that has it"
            ),
        )
        .permanent());
    }
    Ok(())
}

/// What a `server` running with `wal_level` (not `logical`) lacks, and what to do.
fn needs_wal_level(server: &str, wal_level: &str) -> String {
    format!(
        "store.capture = \"logical\" needs the server setting wal_level = logical, and {server} \
         runs with wal_level = {wal_level}: set it (ALTER SYSTEM SET wal_level = logical, or in \
         postgresql.conf; on a managed database, the provider's logical replication parameter) \
         and restart the server, or use store.capture = \"poll\""
    )
}

/// The slot as the server has it: `None` when it does not exist.
#[derive(Debug, Clone)]
pub(crate) struct SlotState {
    pub plugin: String,
    pub same_database: bool,
    /// `reserved`, `extended`, `unreserved` or `lost`.
    pub wal_status: Option<String>,
}

pub(crate) async fn slot_state(
    conn: &mut PgConnection,
    slot: &str,
    target: &Target,
) -> Result<Option<SlotState>> {
    let row = sqlx::query(
        "SELECT plugin::text, database = current_database() AS same_database, wal_status \
         FROM pg_replication_slots WHERE slot_name = $1",
    )
    .bind(slot)
    .fetch_optional(&mut *conn)
    .await
    .map_err(err(target, "reading the replication slot"))?;
    row.map(|row| {
        Ok(SlotState {
            plugin: row.try_get::<Option<String>, _>(0)?.unwrap_or_default(),
            same_database: row.try_get::<Option<bool>, _>(1)?.unwrap_or(false),
            wal_status: row.try_get(2)?,
        })
    })
    .transpose()
    .map_err(err(target, "reading the replication slot"))
}

/// `names` with the slot and publication `migrate` recorded for `table`, where the settings do
/// not name them: the table keeps the slot it was set up with (by an earlier version, whose
/// default name was another, or with a setting since removed).
pub(crate) async fn with_recorded(
    conn: &mut PgConnection,
    table: &TableName,
    settings: &LogicalSettings,
    mut names: LogicalNames,
    target: &Target,
) -> Result<LogicalNames> {
    if settings.slot.is_some() {
        return Ok(names);
    }
    if let Some(recorded) = recorded(conn, table, target).await? {
        if settings.publication.is_none() {
            names.publication = recorded.publication;
        }
        names.slot = recorded.slot;
    }
    Ok(names)
}

/// The bookkeeping row of a table that `migrate` set logical capture up for.
#[derive(Debug)]
pub(crate) struct Recorded {
    pub slot: String,
    pub style: String,
    pub publication: String,
}

/// The bookkeeping row of `table`, when migrate set logical capture up.
pub(crate) async fn recorded(
    conn: &mut PgConnection,
    table: &TableName,
    target: &Target,
) -> Result<Option<Recorded>> {
    let bookkeeping = table.quoted_sibling(CAPTURE_TABLE);
    let read = err(target, "reading the capture bookkeeping");
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1::text) IS NOT NULL")
        .bind(&bookkeeping)
        .fetch_one(&mut *conn)
        .await
        .map_err(&read)?;
    if !exists {
        return Ok(None);
    }
    let row: Option<(String, String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT slot, style, publication FROM {bookkeeping} WHERE table_name = $1"
    )))
    .bind(table.name())
    .fetch_optional(&mut *conn)
    .await
    .map_err(&read)?;
    Ok(row.map(|(slot, style, publication)| Recorded {
        slot,
        style,
        publication,
    }))
}

/// The check of a table relayed with `capture = "poll"` that `migrate` once set up for logical
/// capture. Message style is refused: its events are in the log, in no row, so polling would
/// publish none of them while the slot keeps the server's log. Table style can be polled (the
/// slot runbook does, to publish what a dropped slot left) and gets a warning: its slot keeps
/// the server's log until something reads it or it is dropped.
pub(crate) async fn check_polled(
    conn: &mut PgConnection,
    table: &TableName,
    target: &Target,
) -> Result<()> {
    let Some(Recorded { slot, style, .. }) = recorded(conn, table, target).await? else {
        return Ok(());
    };
    let bookkeeping = table.quoted_sibling(CAPTURE_TABLE);
    if style == CaptureStyle::Message.as_str() {
        return Err(Error::config(format!(
            "store.capture: table {table} is captured from the log in message style (slot \
             \"{slot}\", recorded in {bookkeeping}): its events are in no row, so store.capture = \
             \"poll\" would publish none of them; set store.capture = \"logical\" and \
             store.logical.style = \"message\""
        )));
    }
    tracing::warn!(
        %table,
        slot,
        "the table is relayed by polling (store.capture = \"poll\"), and `migrate` set it up \
         for logical capture: its slot keeps the server's log until a relay with store.capture = \
         \"logical\" reads it; if logical capture is given up for good, drop the slot and \
         delete the table's row of {bookkeeping} (docs/OPERATIONS.md, \"Replication slot\")"
    );
    Ok(())
}

/// The error of a slot that was made once and is gone, or that lost the log it needs.
fn slot_gone(names: &LogicalNames, table: &TableName, why: &str) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "replication slot \"{}\" of table {table} {why}: events committed since the relay last \
             confirmed its position may not have been relayed. The relay will not make a new \
             slot on its own, since that would skip them silently. Follow the runbook ({RUNBOOK}): \
             find what was missed, then delete the row of {table} from {} and run {} to make a \
             new slot",
            names.slot,
            table.quoted_sibling(CAPTURE_TABLE),
            outboxkit_core::command::line("migrate")
        ),
    )
    .permanent()
}

/// Table style: what keeps the publication from publishing every insert of `table`, as an
/// error for people (kind `Schema`, permanent), or `None`. Each is silent otherwise: the
/// events it leaves out are in no message the reader gets, and their rows stay pending. A
/// table dropped and created again is in no publication; `publish` without `insert` or a row
/// filter (PostgreSQL 15) are changes by hand.
pub(crate) async fn publication_fault(
    conn: &mut PgConnection,
    names: &LogicalNames,
    table: &TableName,
) -> sqlx::Result<Option<Error>> {
    let row: Option<(bool, Option<String>)> = sqlx::query_as(
        "SELECT p.pubinsert, t.rowfilter FROM pg_publication p \
         JOIN pg_publication_tables t ON t.pubname = p.pubname \
         WHERE p.pubname = $1 AND t.schemaname = $2 AND t.tablename = $3",
    )
    .bind(&names.publication)
    .bind(table.qualifier().unwrap_or("public"))
    .bind(table.name())
    .fetch_optional(conn)
    .await?;
    let publication = &names.publication;
    let what = match row {
        Some((true, None)) => return Ok(None),
        None => format!(
            "publication \"{publication}\" does not publish table {table}, so its inserts are not \
             in the log and no relay would publish them (a table dropped and created again leaves \
             every publication)"
        ),
        Some((false, _)) => format!(
            "publication \"{publication}\" does not publish the inserts of table {table} (its \
             `publish` option leaves out insert), so no relay would publish them"
        ),
        Some((true, Some(filter))) => format!(
            "publication \"{publication}\" publishes table {table} with a row filter (WHERE \
             {filter}): the events it leaves out are not in the log and no relay would publish \
             them"
        ),
    };
    Ok(Some(
        Error::new(
            ErrorKind::Schema,
            format!(
                "{what}: run {} (it makes the publication publish every insert of the table and \
                 writes again the rows still pending, which the log may not hold)",
                outboxkit_core::command::line("migrate")
            ),
        )
        .permanent(),
    ))
}

const RESUME_POINT_COLUMNS: &[&str] = &["reader_txn_lsn", "reader_txn_settled_below"];
const HELD_COLUMNS: &[&str] = &[
    "reader_retrying",
    "reader_held_back_aggregates",
    "reader_held_back",
];

/// Whether the capture bookkeeping table of `table` has all of `columns` (a table `migrate`
/// set up before they were added has not, until it runs again).
async fn has_columns<'c, E: sqlx::PgExecutor<'c>>(
    executor: E,
    table: &TableName,
    columns: &[&str],
) -> sqlx::Result<bool> {
    let found: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) \
         AND attname = ANY($2) AND NOT attisdropped",
    )
    .bind(table.quoted_sibling(CAPTURE_TABLE))
    .bind(columns)
    .fetch_one(executor)
    .await?;
    Ok(found == columns.len() as i64)
}

/// Whether the capture bookkeeping row has room for the reader's held-back figures.
pub(crate) async fn has_held_columns<'c, E: sqlx::PgExecutor<'c>>(
    executor: E,
    table: &TableName,
) -> sqlx::Result<bool> {
    has_columns(executor, table, HELD_COLUMNS).await
}

/// Message style: the [`ResumePoint`] the last reader of `table` left in the bookkeeping row
/// (`Some(None)`: it left none), or `None` when the row has no columns for it yet (a table
/// `migrate` set up before they were added, until it runs again).
pub(crate) async fn left_resume_point(
    conn: &mut PgConnection,
    table: &TableName,
) -> sqlx::Result<Option<Option<ResumePoint>>> {
    let bookkeeping = table.quoted_sibling(CAPTURE_TABLE);
    if !has_columns(&mut *conn, table, RESUME_POINT_COLUMNS).await? {
        return Ok(None);
    }
    let row: Option<(Option<String>, Option<i64>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT reader_txn_lsn::text, reader_txn_settled_below FROM {bookkeeping} \
         WHERE table_name = $1"
    )))
    .bind(table.name())
    .fetch_optional(conn)
    .await?;
    Ok(Some(row.and_then(|(lsn, below)| {
        let final_lsn = pgwire_replication::Lsn::parse(&lsn?).ok()?.as_u64();
        Some(ResumePoint {
            final_lsn,
            settled_below: below?,
        })
    })))
}

/// Message style: the failed events the last reader listed in the bookkeeping row (each
/// held-back aggregate's first, with its attempts, next try and last error), for the next
/// reader to carry on. Only called when the row has the columns ([`has_held_columns`]).
pub(crate) async fn left_held_back(
    conn: &mut PgConnection,
    table: &TableName,
) -> sqlx::Result<Vec<HeldBack>> {
    let listed: Option<Option<String>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT reader_held_back::text FROM {} WHERE table_name = $1",
        table.quoted_sibling(CAPTURE_TABLE)
    )))
    .bind(table.name())
    .fetch_optional(conn)
    .await?;
    Ok(listed_from_json(listed.flatten().as_deref()))
}

/// The `reader_held_back` column's text: the listed held-back aggregates as JSON.
pub(crate) fn listed_json(listed: &[HeldBack]) -> String {
    serde_json::to_string(listed).unwrap_or_else(|_| "[]".into())
}

/// The listed held-back aggregates of a `reader_held_back` column's text (none when NULL or
/// not such a list).
pub(crate) fn listed_from_json(text: Option<&str>) -> Vec<HeldBack> {
    text.and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// Message style: leave what this reader's failed events hold back in the bookkeeping row, as
/// it stops reading (the relay's status loop writes it every `relay.status_interval` while it
/// reads), so that the next reader carries on their attempts ([`left_held_back`]).
pub(crate) async fn leave_held_back(
    conn: &mut PgConnection,
    table: &TableName,
    held: &HeldFigures,
) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET reader_retrying = $2, reader_held_back_aggregates = $3, \
         reader_held_back = $4::text::jsonb WHERE table_name = $1",
        table.quoted_sibling(CAPTURE_TABLE)
    )))
    .bind(table.name())
    .bind(held.retrying)
    .bind(held.aggregates)
    .bind(listed_json(&held.listed))
    .execute(conn)
    .await
    .map(drop)
}

/// Message style: leave this reader's [`ResumePoint`] in the bookkeeping row.
pub(crate) async fn leave_resume_point(
    conn: &mut PgConnection,
    table: &TableName,
    point: ResumePoint,
) -> sqlx::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET reader_txn_lsn = $2::pg_lsn, reader_txn_settled_below = $3 \
         WHERE table_name = $1",
        table.quoted_sibling(CAPTURE_TABLE)
    )))
    .bind(table.name())
    .bind(pgwire_replication::Lsn::from_u64(point.final_lsn).to_string())
    .bind(point.settled_below)
    .execute(conn)
    .await
    .map(drop)
}

/// Check a slot that exists is ours to use.
fn check_slot(state: &SlotState, names: &LogicalNames, table: &TableName) -> Result<()> {
    if state.plugin != "pgoutput" || !state.same_database {
        return Err(Error::config(format!(
            "store.logical.slot: replication slot \"{}\" exists but {}; choose another \
             store.logical.slot",
            names.slot,
            if state.same_database {
                format!("uses the plugin \"{}\", not pgoutput", state.plugin)
            } else {
                "belongs to another database".to_owned()
            }
        )));
    }
    if state.wal_status.as_deref() == Some("lost") {
        return Err(slot_gone(
            names,
            table,
            "was invalidated by the server (wal_status = lost: the log it needed was removed, \
             see max_slot_wal_keep_size)",
        ));
    }
    Ok(())
}

/// Before relaying: the server, the bookkeeping row, the slot.
pub(crate) async fn check(
    conn: &mut PgConnection,
    table: &TableName,
    names: &LogicalNames,
    target: &Target,
) -> Result<()> {
    check_server(conn, target).await?;
    let Some(Recorded { slot, style, .. }) = recorded(conn, table, target).await? else {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "table {table} is not set up for logical capture: run {} with store.capture = \
                 \"logical\"",
                outboxkit_core::command::line("migrate")
            ),
        ));
    };
    check_recorded(&slot, &style, names, table)?;
    match slot_state(conn, &names.slot, target).await? {
        Some(state) => check_slot(&state, names, table)?,
        None => return Err(slot_gone(names, table, "was dropped")),
    }
    let e = err(target, "checking the publication");
    if names.style == CaptureStyle::Table {
        if let Some(fault) = publication_fault(conn, names, table).await.map_err(e)? {
            return Err(fault);
        }
    }
    Ok(())
}

fn check_recorded(slot: &str, style: &str, names: &LogicalNames, table: &TableName) -> Result<()> {
    if slot != names.slot {
        return Err(Error::config(format!(
            "store.logical.slot: table {table} was set up with the slot \"{slot}\", not \"{}\": \
             set store.logical.slot = \"{slot}\"",
            names.slot
        )));
    }
    if style != names.style.as_str() {
        return Err(Error::config(format!(
            "store.logical.style: table {table} was set up for {style} style, not {}: set \
             store.logical.style = \"{style}\" (changing the style of a table: drain it, drop the \
             slot and delete its row of {}, then migrate again)",
            names.style.as_str(),
            table.quoted_sibling(CAPTURE_TABLE)
        )));
    }
    Ok(())
}

/// How the emit function and `dead retry` turn a `payload` of `payload_type` into the bytes
/// after the envelope.
fn payload_bytes(payload_type: PayloadType) -> &'static str {
    match payload_type {
        PayloadType::Json => "convert_to(payload::text, 'UTF8')",
        PayloadType::Text => "convert_to(payload, 'UTF8')",
        PayloadType::Binary => "payload",
    }
}

/// The `pg_logical_emit_message` call that writes one event of message style: the envelope (one
/// line of JSON) then the payload's bytes, under the table's prefix. The event's fields are
/// read from the names `event_id`, `aggregate_type`, `aggregate_id`, `event_type`, `payload`,
/// `headers` and `destination` (the emit function's arguments, or the outbox table's columns);
/// `created_at` is the SQL of the event's time in microseconds since the epoch.
fn emit_message(names: &LogicalNames, payload_type: PayloadType, created_at: &str) -> String {
    format!(
        "pg_logical_emit_message(true, '{prefix}', \
             convert_to(json_build_object('v', 1, 'event_id', event_id, \
                 'aggregate_type', aggregate_type, 'aggregate_id', aggregate_id, \
                 'event_type', event_type, 'headers', coalesce(headers, '{{}}'), \
                 'destination', destination, 'created_at', {created_at}\
             )::text, 'UTF8') || '\\x0a'::bytea || {bytes})",
        prefix = names.prefix,
        bytes = payload_bytes(payload_type),
    )
}

/// The emit function of message style, for a table of `payload_type`.
fn emit_function(names: &LogicalNames, payload_type: PayloadType) -> String {
    let column = match payload_type {
        PayloadType::Json => "jsonb",
        PayloadType::Text => "text",
        PayloadType::Binary => "bytea",
    };
    format!(
        "CREATE OR REPLACE FUNCTION {function}(\
             aggregate_type text, aggregate_id text, event_type text, payload {column}, \
             headers jsonb DEFAULT '{{}}', destination text DEFAULT NULL, \
             event_id uuid DEFAULT gen_random_uuid()) \
         RETURNS bigint LANGUAGE plpgsql VOLATILE AS $fn$ \
         BEGIN \
             IF aggregate_type IS NULL OR aggregate_id IS NULL OR event_type IS NULL \
                OR payload IS NULL OR event_id IS NULL THEN \
                 RAISE EXCEPTION 'outbox event: aggregate_type, aggregate_id, event_type, payload \
                     and event_id must not be null' USING ERRCODE = 'not_null_violation'; \
             END IF; \
             IF jsonb_typeof(coalesce(headers, '{{}}')) <> 'object' THEN \
                 RAISE EXCEPTION 'outbox event: headers must be a JSON object' \
                     USING ERRCODE = 'check_violation'; \
             END IF; \
             RETURN {emit} - '0/0'::pg_lsn; \
         END $fn$",
        function = names.function,
        emit = emit_message(
            names,
            payload_type,
            "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
        ),
    )
}

/// `dead retry` of one dead row `$1` of message style: the row leaves the table and its event is
/// written into the log again, as the emit function writes it but with the row's own
/// `created_at` (the event's time, which a retry does not change). One row when it was dead.
pub(crate) fn re_emit_dead_row(
    names: &LogicalNames,
    table: &TableName,
    payload_type: PayloadType,
) -> Statement {
    Statement::from(format!(
        "WITH gone AS (DELETE FROM {table} \
                       WHERE id = $1 AND dead_at IS NOT NULL AND published_at IS NULL \
                       RETURNING event_id, aggregate_type, aggregate_id, event_type, payload, \
                                 headers, destination, created_at) \
         SELECT {emit} FROM gone",
        table = table.quoted(),
        emit = emit_message(
            names,
            payload_type,
            "(extract(epoch FROM created_at) * 1000000)::bigint"
        ),
    ))
}

/// The capture bookkeeping table `bookkeeping` (quoted), with the columns added since it was
/// first made: what `migrate` runs, and what its script prints.
fn create_capture_table(bookkeeping: &str) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {bookkeeping} (\
                 table_name text PRIMARY KEY, slot text NOT NULL UNIQUE, style text NOT NULL, \
                 publication text NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), \
                 created_lsn pg_lsn)"
        ),
        format!(
            "ALTER TABLE {bookkeeping} \
                 ADD COLUMN IF NOT EXISTS reader_unsettled bigint, \
                 ADD COLUMN IF NOT EXISTS reader_oldest_at timestamptz, \
                 ADD COLUMN IF NOT EXISTS reader_reported_at timestamptz, \
                 ADD COLUMN IF NOT EXISTS reader_txn_lsn pg_lsn, \
                 ADD COLUMN IF NOT EXISTS reader_txn_settled_below bigint, \
                 ADD COLUMN IF NOT EXISTS reader_retrying bigint, \
                 ADD COLUMN IF NOT EXISTS reader_held_back_aggregates bigint, \
                 ADD COLUMN IF NOT EXISTS reader_held_back jsonb"
        ),
    ]
}

/// The publication: the table's inserts (table style), or nothing (message style: messages
/// are not filtered by publications, but pgoutput needs one to start).
fn create_publication(names: &LogicalNames, table: &TableName) -> String {
    let what = match names.style {
        CaptureStyle::Table => format!(" FOR TABLE {} WITH (publish = 'insert')", table.quoted()),
        CaptureStyle::Message => String::new(),
    };
    format!("CREATE PUBLICATION \"{}\"{what}", names.publication)
}

/// What `migrate --print-sql` adds for logical capture, in three parts, statements without
/// `;`. First, before anything else in the creation script's transaction, the server's
/// `wal_level` checked: the script stops there, with `migrate`'s words, on a server that cannot
/// capture. Then, at the end of that transaction, the capture bookkeeping table, the
/// publication and the emit function. Last, after its `COMMIT`, the slot, made in a statement
/// of its own since a slot cannot be made in a transaction that wrote, and the bookkeeping row
/// that records it with its first position. `table` names its schema: the slot's default name
/// and the messages' prefix hold it.
pub(crate) fn script_parts(
    table: &TableName,
    names: &LogicalNames,
    payload_type: PayloadType,
) -> (String, Vec<String>, Vec<String>) {
    let bookkeeping = table.quoted_sibling(CAPTURE_TABLE);
    let quote = |text: &str| text.replace('\'', "''");
    // `%`: RAISE puts the setting there.
    let wal_level = needs_wal_level("this server", "%");
    let check = format!(
        "-- log-based capture, {style} style: publication \"{publication}\", slot \"{slot}\"\n\
         DO $check$ BEGIN \
             IF current_setting('wal_level') <> 'logical' THEN \
                 RAISE EXCEPTION '{message}', current_setting('wal_level'); \
             END IF; \
         END $check$",
        style = names.style.as_str(),
        publication = names.publication,
        slot = names.slot,
        message = quote(&wal_level),
    );
    let mut inside = Vec::from(create_capture_table(&bookkeeping));
    inside.push(create_publication(names, table));
    inside.push(emit_function(names, payload_type));
    let after = vec![
        format!(
            "-- The replication slot, after the COMMIT above: a slot cannot be made in a \
             transaction that wrote\n\
             -- (do not apply this script with psql --single-transaction). Making it waits for \
             the\n\
             -- transactions running now to end. The relay's user needs the REPLICATION \
             attribute.\n\
             SELECT slot_name, lsn FROM pg_create_logical_replication_slot('{}', 'pgoutput')",
            quote(&names.slot)
        ),
        format!(
            "INSERT INTO {bookkeeping} (table_name, slot, style, publication, created_lsn) \
             SELECT '{name}', slot_name, '{style}', '{publication}', confirmed_flush_lsn \
             FROM pg_replication_slots WHERE slot_name = '{slot}'",
            slot = quote(&names.slot),
            name = quote(table.name()),
            style = names.style.as_str(),
            publication = quote(&names.publication),
        ),
    ];
    (check, inside, after)
}

/// Set logical capture up for `table` (already migrated): check the server, make the
/// publication, the emit function and, the first time only, the slot.
pub(crate) async fn migrate(
    pool: &PgPool,
    table: &TableName,
    names: &LogicalNames,
    payload_type: PayloadType,
    target: &Target,
) -> Result<()> {
    let e = err(target, "setting up logical capture");
    let mut conn = pool.acquire().await.map_err(&e)?;
    check_server(&mut conn, target).await?;
    let bookkeeping = table.quoted_sibling(CAPTURE_TABLE);
    for statement in create_capture_table(&bookkeeping) {
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(statement)))
            .await
            .map_err(&e)?;
    }

    // The publication: the table's inserts (table style), or nothing (message style: messages
    // are not filtered by publications, but pgoutput needs one to start).
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)")
            .bind(&names.publication)
            .fetch_one(&mut *conn)
            .await
            .map_err(&e)?;
    if !exists {
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(create_publication(
            names, table,
        ))))
        .await
        .map_err(&e)?;
        tracing::info!(publication = %names.publication, "created publication");
    } else if names.style == CaptureStyle::Table {
        if let Some(fault) = publication_fault(&mut conn, names, table)
            .await
            .map_err(&e)?
        {
            let ours = recorded(&mut conn, table, target)
                .await?
                .is_some_and(|r| r.publication == names.publication);
            if !ours {
                return Err(Error::config(format!(
                    "store.logical.publication: publication \"{}\" exists and does not publish \
                     every insert of {table} ({}): make it (ALTER PUBLICATION \"{}\" SET TABLE {}; \
                     ALTER PUBLICATION \"{}\" SET (publish = 'insert')) or choose another name",
                    names.publication,
                    fault.message(),
                    names.publication,
                    table.quoted(),
                    names.publication,
                )));
            }
            publish_again(&mut conn, names, table, &fault, target).await?;
        }
    }
    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(emit_function(
        names,
        payload_type,
    ))))
    .await
    .map_err(&e)?;

    let recorded = recorded(&mut conn, table, target).await?;
    let state = slot_state(&mut conn, &names.slot, target).await?;
    match (&recorded, &state) {
        (Some(Recorded { slot, style, .. }), Some(state)) => {
            check_recorded(slot, style, names, table)?;
            check_slot(state, names, table)?;
        }
        (Some(Recorded { slot, style, .. }), None) => {
            check_recorded(slot, style, names, table)?;
            return Err(slot_gone(names, table, "was dropped"));
        }
        (None, Some(state)) => {
            // Made by hand, or by a migrate that stopped before its bookkeeping row.
            check_slot(state, names, table)?;
            record(&mut conn, &bookkeeping, table, names, None, target).await?;
        }
        (None, None) => {
            let (max, used): (i32, i64) = sqlx::query_as(
                "SELECT current_setting('max_replication_slots')::int, \
                 (SELECT count(*) FROM pg_replication_slots)",
            )
            .fetch_one(&mut *conn)
            .await
            .map_err(&e)?;
            if used >= i64::from(max) {
                return Err(Error::new(
                    ErrorKind::Config,
                    format!(
                        "no free replication slot for table {table}: the server has \
                         max_replication_slots = {max} and {used} are in use; raise \
                         max_replication_slots (a restart is needed) or drop a slot nobody reads"
                    ),
                )
                .permanent());
            }
            // A slot cannot be made in a transaction that wrote: its own connection. Making it
            // waits for the transactions running now to end.
            let mut own = PgConnection::connect_with(&pool.connect_options())
                .await
                .map_err(&e)?;
            let lsn: String = sqlx::query_scalar(
                "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
            )
            .bind(&names.slot)
            .fetch_one(&mut own)
            .await
            .map_err(&e)?;
            let _ = own.close().await;
            tracing::info!(slot = %names.slot, %lsn, "created replication slot");
            record(&mut conn, &bookkeeping, table, names, Some(&lsn), target).await?;
        }
    }
    Ok(())
}

/// Table style, the publication `migrate` made for the table no longer publishes every insert
/// of it (`fault`: the table dropped and created again, or the publication changed by hand):
/// make it publish the table's inserts, unfiltered, again, then write again the rows still
/// pending, whose inserts the log may not hold. A lock that writers wait for (and that waits
/// for those writing now) makes the rows there at the moment of the change a superset of the
/// ones missing from the log; the second transaction writes those again, with their ids, so the
/// relay reads them (a row the log did hold is read twice: at least once).
async fn publish_again(
    conn: &mut PgConnection,
    names: &LogicalNames,
    table: &TableName,
    fault: &Error,
    target: &Target,
) -> Result<()> {
    let e = err(target, "adding the table back to its publication");
    let quoted = table.quoted();
    let mut tx = conn.begin().await.map_err(&e)?;
    tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {quoted} IN SHARE ROW EXCLUSIVE MODE"
    ))))
    .await
    .map_err(&e)?;
    let missing: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {quoted} WHERE published_at IS NULL AND dead_at IS NULL ORDER BY id"
    )))
    .fetch_all(&mut *tx)
    .await
    .map_err(&e)?;
    tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER PUBLICATION \"{0}\" SET TABLE {quoted}; \
         ALTER PUBLICATION \"{0}\" SET (publish = 'insert')",
        names.publication
    ))))
    .await
    .map_err(&e)?;
    tx.commit().await.map_err(&e)?;

    let columns = "id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
                   destination, created_at, attempts, next_attempt_at, last_error";
    let written: u64 = sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH moved AS (DELETE FROM {quoted} WHERE id = ANY($1) \
             AND published_at IS NULL AND dead_at IS NULL RETURNING {columns}) \
         INSERT INTO {quoted} ({columns}) OVERRIDING SYSTEM VALUE \
         SELECT {columns} FROM moved ORDER BY id"
    )))
    .bind(&missing)
    .execute(&mut *conn)
    .await
    .map_err(&e)?
    .rows_affected();
    tracing::warn!(
        %table,
        publication = %names.publication,
        was = %fault.message(),
        rows_written_again = written,
        "the publication did not publish every insert of the table: it does again, and the rows \
         still pending, which the log may not hold, are written again, so the relay reads them"
    );
    Ok(())
}

async fn record(
    conn: &mut PgConnection,
    bookkeeping: &str,
    table: &TableName,
    names: &LogicalNames,
    lsn: Option<&str>,
    target: &Target,
) -> Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {bookkeeping} (table_name, slot, style, publication, created_lsn) \
         VALUES ($1, $2, $3, $4, $5::pg_lsn) ON CONFLICT (table_name) DO NOTHING"
    )))
    .bind(table.name())
    .bind(&names.slot)
    .bind(names.style.as_str())
    .bind(&names.publication)
    .bind(lsn)
    .execute(conn)
    .await
    .map_err(err(target, "recording the capture set-up"))?;
    Ok(())
}

/// The slot's figures: (active, active pid, lag in bytes behind the server's log, wal_status,
/// seconds since the reader last reported).
#[derive(Debug, Clone, Default)]
pub struct SlotLag {
    pub active: bool,
    pub active_pid: Option<i32>,
    pub lag_bytes: i64,
    pub wal_status: Option<String>,
    pub reply_age_secs: Option<f64>,
}

pub(crate) const SLOT_LAG: &str = "SELECT s.active, s.active_pid, \
     coalesce(pg_current_wal_lsn() - s.confirmed_flush_lsn, 0)::int8, s.wal_status, \
     extract(epoch FROM now() - r.reply_time)::float8 \
     FROM pg_replication_slots s LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid \
     WHERE s.slot_name = $1";

pub(crate) async fn slot_lag<'c, E: sqlx::PgExecutor<'c>>(
    executor: E,
    slot: &str,
) -> std::result::Result<Option<SlotLag>, sqlx::Error> {
    let row = sqlx::query(SLOT_LAG)
        .bind(slot)
        .fetch_optional(executor)
        .await?;
    row.map(|row| {
        Ok(SlotLag {
            active: row.try_get(0)?,
            active_pid: row.try_get(1)?,
            lag_bytes: row.try_get(2)?,
            wal_status: row.try_get(3)?,
            reply_age_secs: row.try_get(4)?,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_slots_fit_in_63_bytes_and_differ_per_table() {
        assert_eq!(default_slot("app", "outbox"), "outbox_relay_app_outbox");
        let fits = format!("t_{}", "x".repeat(41));
        assert_eq!(
            default_slot(&fits, "outbox").len(),
            63,
            "unchanged up to 63"
        );
        assert_eq!(
            default_slot(&fits, "outbox"),
            format!("outbox_relay_{fits}_outbox")
        );
        let long = |n: u32| default_slot(&format!("tenant_{}_{n}", "x".repeat(50)), "outbox");
        let (a, b) = (long(1), long(2));
        assert_eq!((a.len(), b.len()), (63, 63));
        assert_ne!(a, b);
        assert_eq!(a, long(1), "the same table, the same slot");
        assert!(a.starts_with("outbox_relay_tenant_xxx"), "{a}");
        // The members' application_name of two such slots (63 bytes each) differ too.
        let member = crate::logical::session::members_name;
        assert_ne!(member(&a), member(&b));
        assert!(member(&a).len() <= 63);
    }
}
