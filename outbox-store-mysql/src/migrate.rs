//! Embedded, versioned migrations of the outbox table.
//!
//! Each table's version and shard count live in `outbox_relay_schema` (same database as the
//! table). MySQL DDL is not transactional, so a migration runs on a dedicated connection under
//! the server-wide named lock `outbox-relay:migrate` (relays starting at the same time migrate
//! one after the other and all but the first find nothing to do), and each version is a single
//! `CREATE`/`ALTER` statement whose table comment records the version: a migration interrupted
//! between its DDL and its bookkeeping row is recognised and completed by the next run.

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions, Connection, Executor, Row};

use outboxkit_core::{Error, ErrorKind, PayloadType, Result};
use outboxkit_store_sql::migrate::{
    check_current, checked_payload_type, creation_script, forget_dropped, not_ours, render_table,
    Migration, ScriptDialect, TableCatalog,
};
use outboxkit_store_sql::pause::PAUSE_TABLE;
use outboxkit_store_sql::payload::{self, PayloadColumn};

use crate::classify::{classify, MySql, Target};
use crate::config::{TableName, MEMBERS_TABLE, SCHEMA_TABLE};
use outboxkit_store_sql::config::TableRules;

/// Schema version this crate creates and expects.
pub const SCHEMA_VERSION: i32 = 1;

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "create the outbox table and its indexes",
    sql: include_str!("../migrations/0001_create_outbox.sql"),
}];
// Numbered 1, 2, ... up to SCHEMA_VERSION: checked when the crate compiles.
const _: () = outboxkit_store_sql::migrate::assert_numbered(MIGRATIONS, SCHEMA_VERSION);

/// Server-wide named lock held while migrating any outbox table.
const MIGRATION_LOCK: &str = "outbox-relay:migrate";

/// Longest wait for another relay's migration.
const MIGRATION_LOCK_WAIT_SECS: i64 = 120;

/// The table comment of a table created by the relay starts with this.
const COMMENT_MARK: &str = "outbox-relay schema=";

/// Its `migrate --print-sql` script: statement by statement: MySQL commits each DDL statement.
impl ScriptDialect for MySql {
    const PRODUCT: &'static str = "MySQL / MariaDB";
    const TRANSACTIONAL: bool = false;
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
}

impl PayloadColumn for MySql {
    // LONGTEXT takes the table's character set and collation: utf8mb4, utf8mb4_bin.
    const COLUMN_TYPES: [&'static str; 3] = ["JSON", "LONGTEXT", "LONGBLOB"];

    fn convert(table: &str, _from: PayloadType, to: PayloadType) -> String {
        format!(
            "ALTER TABLE {table} MODIFY payload {} NOT NULL",
            Self::column_type(to)
        )
    }
}

/// The bookkeeping row and the payload column of an outbox table in MySQL / MariaDB.
impl TableCatalog for MySql {
    type Database = sqlx::MySql;
    const SCHEMA_VERSION: i32 = SCHEMA_VERSION;

    async fn schema_row(
        conn: &mut MySqlConnection,
        table: &TableName,
        target: &Target,
    ) -> Result<Option<(i32, i32)>> {
        outboxkit_store_sql::migrate::schema_row(conn, table, "?", target).await
    }

    /// Read from `information_schema`. MariaDB's `JSON` is a `LONGTEXT` with a `json_valid`
    /// check, which tells it from a `text` table.
    async fn execute(conn: &mut sqlx::MySqlConnection, sql: &str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .map(drop)
    }

    async fn payload_type(
        conn: &mut MySqlConnection,
        table: &TableName,
        target: &Target,
    ) -> Result<PayloadType> {
        let err = |e| classify(e, target).context(format!("reading the payload type of {table}"));
        let database = table.qualifier().unwrap_or_default();
        let column: Option<String> = sqlx::query_scalar(
            "SELECT CAST(DATA_TYPE AS CHAR) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND COLUMN_NAME = 'payload'",
        )
        .bind(database)
        .bind(table.name())
        .fetch_optional(&mut *conn)
        .await
        .map_err(err)?;
        let column = column.map(|c| c.to_ascii_lowercase());
        if column.as_deref() == Some("longtext") {
            // Only MariaDB has TABLE_NAME here; on MySQL (whose JSON is `json`) this fails: text.
            let checked: std::result::Result<i64, _> = sqlx::query_scalar(
                "SELECT COUNT(*) FROM information_schema.CHECK_CONSTRAINTS \
                 WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ? \
                 AND CHECK_CLAUSE LIKE '%json\\_valid(`payload`)%'",
            )
            .bind(database)
            .bind(table.name())
            .fetch_one(&mut *conn)
            .await;
            if checked.is_ok_and(|n| n > 0) {
                return Ok(PayloadType::Json);
            }
        }
        payload::from_catalog(table, column.as_deref(), |column| match column {
            "json" => Some(PayloadType::Json),
            "longtext" | "mediumtext" | "text" | "varchar" => Some(PayloadType::Text),
            "longblob" | "mediumblob" | "blob" | "varbinary" => Some(PayloadType::Binary),
            _ => None,
        })
    }
}

/// `(version, shards)` read back from a table comment written by a migration.
fn parse_comment(comment: &str) -> Option<(i32, i32)> {
    let rest = comment.strip_prefix(COMMENT_MARK)?;
    let (version, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix("shards=")?;
    let shards: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some((version.parse().ok()?, shards.parse().ok()?))
}

/// Which of the outbox table, `outbox_relay_schema`, `outbox_relay_members` and
/// `outbox_relay_pause` exist, and the outbox table's comment.
pub(crate) struct Existing {
    pub outbox: Option<String>,
    pub schema_table: bool,
    pub members_table: bool,
    pub pause_table: bool,
}

impl Existing {
    /// An outbox table whose comment no migration wrote: a table of the same name that is
    /// someone else's, which `migrate` refuses to touch.
    pub fn outbox_is_foreign(&self) -> bool {
        self.outbox
            .as_deref()
            .is_some_and(|comment| parse_comment(comment).is_none())
    }
}

pub(crate) async fn existing_tables(
    conn: &mut MySqlConnection,
    table: &TableName,
    target: &Target,
) -> Result<Existing> {
    let database = table.qualifier().unwrap_or_default();
    let rows = sqlx::query(
        "SELECT TABLE_NAME, TABLE_COMMENT FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME IN (?, ?, ?, ?)",
    )
    .bind(database)
    .bind(table.name())
    .bind(SCHEMA_TABLE)
    .bind(MEMBERS_TABLE)
    .bind(PAUSE_TABLE)
    .fetch_all(conn)
    .await
    .map_err(|e| classify(e, target))?;
    let mut existing = Existing {
        outbox: None,
        schema_table: false,
        members_table: false,
        pause_table: false,
    };
    for row in rows {
        let text = |i: usize| -> Result<String> {
            row.try_get_unchecked::<String, _>(i)
                .map_err(|e| classify(e, target))
        };
        let name = text(0)?;
        if name == table.name() {
            existing.outbox = Some(text(1)?);
        } else if name == SCHEMA_TABLE {
            existing.schema_table = true;
        } else if name == MEMBERS_TABLE {
            existing.members_table = true;
        } else if name == PAUSE_TABLE {
            existing.pause_table = true;
        }
    }
    Ok(existing)
}

/// Create or upgrade `table` (qualified by its database) to [`SCHEMA_VERSION`]. Idempotent.
/// A new table stores `payload_type` payloads (`json` when unset); an existing one must already
/// (see [`checked_payload_type`]).
pub(crate) async fn migrate(
    options: &MySqlConnectOptions,
    table: &TableName,
    shards: u32,
    payload_type: Option<PayloadType>,
    target: &Target,
) -> Result<()> {
    let mut conn = options
        .connect()
        .await
        .map_err(|e| classify(e, target).context(format!("migrating table {table}")))?;
    let outcome = migrate_on(&mut conn, table, shards, payload_type, target).await;
    // Closing the connection releases the migration lock whatever happened.
    if let Err(e) = conn.close().await {
        tracing::debug!("closing the migration connection: {e}");
    }
    outcome
}

async fn migrate_on(
    conn: &mut MySqlConnection,
    table: &TableName,
    shards: u32,
    payload_type: Option<PayloadType>,
    target: &Target,
) -> Result<()> {
    let err = |e: sqlx::Error| classify(e, target).context(format!("migrating table {table}"));
    // A user allowed to write on a read-only replica would create the tables there, breaking
    // its replication.
    crate::classify::refuse_read_only(conn, target)
        .await
        .map_err(|e| e.context(format!("migrating table {table}")))?;
    let locked: Option<i64> = sqlx::query_scalar("SELECT CAST(GET_LOCK(?, ?) AS SIGNED)")
        .bind(MIGRATION_LOCK)
        .bind(MIGRATION_LOCK_WAIT_SECS)
        .fetch_one(&mut *conn)
        .await
        .map_err(err)?;
    if locked != Some(1) {
        return Err(Error::new(
            ErrorKind::Timeout,
            format!(
                "migrating table {table}: another relay held the lock {MIGRATION_LOCK} for \
                 {MIGRATION_LOCK_WAIT_SECS}s (a migration still running?); try again"
            ),
        ));
    }

    let database = table.qualifier().unwrap_or_default();
    let database_exists: Option<String> = sqlx::query_scalar(
        "SELECT SCHEMA_NAME FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?",
    )
    .bind(database)
    .fetch_optional(&mut *conn)
    .await
    .map_err(err)?;
    if database_exists.is_none() {
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            MySql::quote_ident(database)
        ))))
        .await
        .map_err(err)?;
        tracing::info!(database, "created database");
    }

    let existing = existing_tables(conn, table, target).await?;
    let schema_table = table.quoted_sibling(SCHEMA_TABLE);
    if !existing.schema_table {
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(create_schema_table(
            &schema_table,
        ))))
        .await
        .map_err(err)?;
    }
    if !existing.members_table {
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(create_members_table(
            table,
        ))))
        .await
        .map_err(err)?;
    }
    if !existing.pause_table {
        // Also for a table migrated before pauses existed.
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(create_pause_table(
            table,
        ))))
        .await
        .map_err(err)?;
    }

    let new_table = (0, i32::try_from(shards).unwrap_or(i32::MAX));
    let (current, shard_count) = match MySql::schema_row(conn, table, target).await? {
        Some(_) if existing.outbox.is_none() => {
            let forget = forget_dropped(table, "?");
            conn.execute(sqlx::query(&forget).bind(table.name()))
                .await
                .map_err(err)?;
            new_table
        }
        Some(row) => row,
        None => match existing.outbox.as_deref() {
            None => new_table,
            Some(comment) => match parse_comment(comment) {
                // Created by a migration that stopped before its bookkeeping row.
                Some((version, shard_count)) => {
                    record_version(conn, &schema_table, table, version, shard_count)
                        .await
                        .map_err(err)?;
                    tracing::info!(table = %table, version, "recorded an interrupted migration");
                    (version, shard_count)
                }
                None => return Err(not_ours(table, SCHEMA_TABLE)),
            },
        },
    };
    check_current(table, current, SCHEMA_VERSION, shard_count, shards)?;

    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        let payload = payload_type.unwrap_or_default();
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(render_table(
            migration.sql,
            table,
            shard_count,
            payload,
        ))))
        .await
        .map_err(|e| err(e).context(migration.context()))?;
        record_version(conn, &schema_table, table, migration.version, shard_count)
            .await
            .map_err(err)?;
        migration.applied(table, shard_count);
    }
    checked_payload_type::<MySql>(conn, table, payload_type, target).await?;
    sqlx::query("DO RELEASE_LOCK(?)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    Ok(())
}

/// The bookkeeping table `schema_table` (quoted), as `migrate` makes it.
fn create_schema_table(schema_table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {schema_table} (\
           table_name VARCHAR(64) NOT NULL PRIMARY KEY, \
           version INT NOT NULL, \
           shard_count INT NOT NULL, \
           applied_at DATETIME(6) NOT NULL\
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin \
         COMMENT = 'outbox-relay: schema version and shard count of each outbox table'"
    )
}

/// The table of the relays' membership slots beside `table`, as `migrate` makes it.
fn create_members_table(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
           table_name VARCHAR(64) NOT NULL, \
           slot SMALLINT NOT NULL, \
           connection_id BIGINT NOT NULL, \
           relay_id VARCHAR(255) NOT NULL, \
           opened_at DATETIME(6) NOT NULL, \
           PRIMARY KEY (table_name, slot)\
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin \
         COMMENT = 'outbox-relay: which relay session holds which membership slot'",
        table.quoted_sibling(MEMBERS_TABLE)
    )
}

/// The pause table beside `table` (see [`outboxkit_store_sql::pause`]), as `migrate` makes it.
fn create_pause_table(table: &TableName) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\
           table_name VARCHAR(64) NOT NULL PRIMARY KEY, \
           paused_at DATETIME(6) NOT NULL, \
           paused_by TEXT NOT NULL, \
           reason TEXT NOT NULL\
         ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin \
         COMMENT = 'outbox-relay: the tables an operator paused (outbox-relay pause)'",
        table.quoted_sibling(PAUSE_TABLE)
    )
}

/// What [`migrate`] runs for a table that does not exist yet, as one script (see
/// [`creation_script`]): the database, the bookkeeping tables, the migrations and the
/// bookkeeping row. `table` is qualified (an unqualified `store.table` is in the URL's
/// database). MySQL commits each DDL statement by itself: a script stopped half-way is
/// completed by `migrate`, as an interrupted migration is.
pub(crate) fn script(table: &TableName, shards: u32, payload_type: Option<PayloadType>) -> String {
    let mut before = Vec::new();
    if let Some(database) = table.qualifier() {
        before.push(format!(
            "CREATE DATABASE IF NOT EXISTS {}",
            MySql::quote_ident(database)
        ));
    }
    before.push(create_schema_table(&table.quoted_sibling(SCHEMA_TABLE)));
    before.push(create_members_table(table));
    before.push(create_pause_table(table));
    creation_script(MIGRATIONS, table, shards, payload_type, &before, &[])
}

async fn record_version(
    conn: &mut MySqlConnection,
    schema_table: &str,
    table: &TableName,
    version: i32,
    shard_count: i32,
) -> std::result::Result<(), sqlx::Error> {
    let updated = sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {schema_table} SET version = ?, applied_at = UTC_TIMESTAMP(6) WHERE table_name = ?"
    )))
    .bind(version)
    .bind(table.name())
    .execute(&mut *conn)
    .await?;
    if updated.rows_affected() == 0 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {schema_table} (table_name, version, shard_count, applied_at) \
             VALUES (?, ?, ?, UTC_TIMESTAMP(6))"
        )))
        .bind(table.name())
        .bind(version)
        .bind(shard_count)
        .execute(&mut *conn)
        .await?;
    }
    Ok(())
}

pub(crate) use outboxkit_store_sql::migrate::not_migrated;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_substitutes_the_table_and_shards() {
        let table = TableName::parse("app.events").unwrap();
        let sql = render_table(MIGRATIONS[0].sql, &table, 16, PayloadType::Json);
        assert!(sql.contains("CREATE TABLE `app`.`events` ("), "{sql}");
        assert!(sql.contains("payload            JSON NOT NULL,"), "{sql}");
        for (payload_type, column) in [
            (PayloadType::Text, "LONGTEXT"),
            (PayloadType::Binary, "LONGBLOB"),
        ] {
            let sql = render_table(MIGRATIONS[0].sql, &table, 16, payload_type);
            assert!(sql.contains(&format!("payload            {column} NOT NULL,")));
        }
        assert!(sql.contains("CONSTRAINT events_headers_object CHECK"));
        assert!(sql.contains("CRC32(aggregate_id) % 16)"));
        assert!(sql.contains("DEFAULT ('{}')"));
        assert!(
            sql.contains("[0-9a-fA-F]{8}-"),
            "the regex keeps its braces"
        );
        assert!(!sql.contains("{table}") && !sql.contains("{name}") && !sql.contains("{shards}"));
        // The comment records what the migration did.
        let comment = sql
            .split("COMMENT = '")
            .nth(1)
            .and_then(|c| c.split('\'').next())
            .unwrap();
        assert_eq!(parse_comment(comment), Some((1, 16)));
    }

    #[test]
    fn comments_of_other_tables_are_not_recognised() {
        assert_eq!(parse_comment(""), None);
        assert_eq!(parse_comment("orders of the shop"), None);
        assert_eq!(parse_comment("outbox-relay schema=x shards=4: ..."), None);
        assert_eq!(
            parse_comment("outbox-relay schema=2 shards=128: x"),
            Some((2, 128))
        );
    }
}
