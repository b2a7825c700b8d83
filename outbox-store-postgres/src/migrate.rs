//! Embedded, versioned migrations of the outbox table.
//!
//! Each table's version and shard count live in `outbox_relay_schema` (same schema as the
//! table). A migration runs in one transaction under a transaction-scoped advisory lock, so
//! relays starting at the same time migrate one after the other and all but the first find
//! nothing to do.

use sqlx::{Executor, PgPool};

use outboxkit_core::{PayloadType, Result};
use outboxkit_store_sql::migrate::{
    check_current, checked_payload_type, creation_script, forget_dropped, not_ours, render_table,
    Migration, ScriptDialect, TableCatalog,
};
use outboxkit_store_sql::pause::PAUSE_TABLE;
use outboxkit_store_sql::payload::{self, PayloadColumn};

use crate::classify::{classify, Postgres, Target};
use crate::config::{TableName, SCHEMA_TABLE};

/// Schema version this crate creates and expects.
pub const SCHEMA_VERSION: i32 = 1;

const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    description: "create the outbox table and its partial indexes",
    sql: include_str!("../migrations/0001_create_outbox.sql"),
}];
// Numbered 1, 2, ... up to SCHEMA_VERSION: checked when the crate compiles.
const _: () = outboxkit_store_sql::migrate::assert_numbered(MIGRATIONS, SCHEMA_VERSION);

/// Lock held (per database) while migrating any outbox table: creating the shared bookkeeping
/// table must not race either. FNV-1a of `outbox-relay:migrate`.
const MIGRATION_LOCK_KEY: i64 = fnv1a64(b"outbox-relay:migrate") as i64;

/// FNV-1a, 64 bits.
pub(crate) const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    hash
}

/// Its `migrate --print-sql` script: one transaction: PostgreSQL's DDL is transactional.
impl ScriptDialect for Postgres {
    const PRODUCT: &'static str = "PostgreSQL";
    const TRANSACTIONAL: bool = true;
    const NOW: &'static str = "now()";
}

impl PayloadColumn for Postgres {
    const COLUMN_TYPES: [&'static str; 3] = ["jsonb", "text", "bytea"];

    fn convert(table: &str, from: PayloadType, to: PayloadType) -> String {
        let text = match from {
            PayloadType::Json => "payload::text",
            PayloadType::Text => "payload",
            PayloadType::Binary => "convert_from(payload, 'UTF8')",
        };
        let using = match to {
            PayloadType::Json => format!("{text}::jsonb"),
            PayloadType::Text => text.to_owned(),
            PayloadType::Binary => format!("convert_to({text}, 'UTF8')"),
        };
        format!(
            "ALTER TABLE {table} ALTER COLUMN payload TYPE {} USING {using}",
            Self::column_type(to)
        )
    }
}

/// The bookkeeping row and the payload column of an outbox table in PostgreSQL.
impl TableCatalog for Postgres {
    type Database = sqlx::Postgres;
    const SCHEMA_VERSION: i32 = SCHEMA_VERSION;

    async fn schema_row(
        conn: &mut sqlx::PgConnection,
        table: &TableName,
        target: &Target,
    ) -> Result<Option<(i32, i32)>> {
        outboxkit_store_sql::migrate::schema_row(conn, table, "$1", target).await
    }

    async fn execute(conn: &mut sqlx::PgConnection, sql: &str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(conn, sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .map(drop)
    }

    async fn payload_type(
        conn: &mut sqlx::PgConnection,
        table: &TableName,
        target: &Target,
    ) -> Result<PayloadType> {
        let column: Option<String> = sqlx::query_scalar(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             WHERE a.attrelid = to_regclass($1::text) AND a.attname = 'payload' \
             AND NOT a.attisdropped",
        )
        .bind(table.quoted())
        .fetch_optional(conn)
        .await
        .map_err(|e| classify(e, target).context(format!("reading the payload type of {table}")))?;
        payload::from_catalog(table, column.as_deref(), |column| match column {
            "jsonb" | "json" => Some(PayloadType::Json),
            "text" => Some(PayloadType::Text),
            "bytea" => Some(PayloadType::Binary),
            other if other.starts_with("character varying") => Some(PayloadType::Text),
            _ => None,
        })
    }
}

/// Create or upgrade `table` (fully qualified) to [`SCHEMA_VERSION`]. Idempotent.
/// A new table stores `payload_type` payloads (`json` when unset); an existing one must already
/// (see [`checked_payload_type`]).
pub(crate) async fn migrate(
    pool: &PgPool,
    table: &TableName,
    shards: u32,
    payload_type: Option<PayloadType>,
    target: &Target,
) -> Result<()> {
    let err = |e: sqlx::Error| classify(e, target).context(format!("migrating table {table}"));
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK_KEY)
        .execute(&mut *tx)
        .await
        .map_err(err)?;

    if let Some(schema) = table.qualifier() {
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
        if !exists {
            tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA \"{schema}\""
            ))))
            .await
            .map_err(err)?;
            tracing::info!(schema, "created schema");
        }
    }

    let schema_table = table.quoted_sibling(SCHEMA_TABLE);
    let pause_table = table.quoted_sibling(PAUSE_TABLE);
    let (outbox_exists, schema_table_exists, pause_table_exists): (bool, bool, bool) =
        sqlx::query_as(
            "SELECT to_regclass($1::text) IS NOT NULL, to_regclass($2::text) IS NOT NULL, \
             to_regclass($3::text) IS NOT NULL",
        )
        .bind(table.quoted())
        .bind(&schema_table)
        .bind(&pause_table)
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    // The pause table also for a table migrated before pauses existed.
    for (exists, create) in [
        (schema_table_exists, create_schema_table(&schema_table, "")),
        (pause_table_exists, create_pause_table(&pause_table, "")),
    ] {
        if !exists {
            tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(create)))
                .await
                .map_err(err)?;
        }
    }

    let new_table = (0, i32::try_from(shards).unwrap_or(i32::MAX));
    let (current, shard_count) = match Postgres::schema_row(&mut tx, table, target).await? {
        Some(_) if !outbox_exists => {
            let forget = forget_dropped(table, "$1");
            tx.execute(sqlx::query(&forget).bind(table.name()))
                .await
                .map_err(err)?;
            new_table
        }
        Some(row) => row,
        None if outbox_exists => return Err(not_ours(table, SCHEMA_TABLE)),
        None => new_table,
    };
    check_current(table, current, SCHEMA_VERSION, shard_count, shards)?;

    for migration in MIGRATIONS.iter().filter(|m| m.version > current) {
        let sql = render_table(
            migration.sql,
            table,
            shard_count,
            payload_type.unwrap_or_default(),
        );
        tx.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql)))
            .await
            .map_err(|e| err(e).context(migration.context()))?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {schema_table} (table_name, version, shard_count, applied_at) \
             VALUES ($1, $2, $3, now()) \
             ON CONFLICT (table_name) DO UPDATE SET version = excluded.version, \
             applied_at = excluded.applied_at"
        )))
        .bind(table.name())
        .bind(migration.version)
        .bind(shard_count)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        migration.applied(table, shard_count);
    }
    checked_payload_type::<Postgres>(&mut tx, table, payload_type, target).await?;
    tx.commit().await.map_err(err)?;
    Ok(())
}

/// The bookkeeping table `schema_table` (quoted), as `migrate` makes it (`guard` empty: it
/// looked first) or a script does (`guard` = `IF NOT EXISTS `).
fn create_schema_table(schema_table: &str, guard: &str) -> String {
    format!(
        "CREATE TABLE {guard}{schema_table} (\
           table_name text PRIMARY KEY, \
           version integer NOT NULL, \
           shard_count integer NOT NULL, \
           applied_at timestamptz NOT NULL DEFAULT now())"
    )
}

/// The pause table `pause_table` (quoted; see [`outboxkit_store_sql::pause`]), as `migrate`
/// makes it (`guard` empty: it looked first) or a script does (`guard` = `IF NOT EXISTS `).
fn create_pause_table(pause_table: &str, guard: &str) -> String {
    format!(
        "CREATE TABLE {guard}{pause_table} (\
           table_name text PRIMARY KEY, \
           paused_at timestamptz NOT NULL DEFAULT now(), \
           paused_by text NOT NULL, \
           reason text NOT NULL DEFAULT '')"
    )
}

/// What [`migrate`] runs for a table that does not exist yet, as one script in one transaction
/// (see [`creation_script`]): the schema when the table names one, the bookkeeping table, the
/// migrations, the bookkeeping row, and around them log-based capture's statements `first` and
/// `last` (none when polled). An unqualified table goes where the applying session's
/// `search_path` puts it, with its bookkeeping table beside it.
pub(crate) fn script(
    table: &TableName,
    shards: u32,
    payload_type: Option<PayloadType>,
    first: Option<String>,
    last: &[String],
) -> String {
    let mut before = Vec::from_iter(first);
    if let Some(schema) = table.qualifier() {
        before.push(format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""));
    }
    let schema_table = table.quoted_sibling(SCHEMA_TABLE);
    before.push(create_schema_table(&schema_table, "IF NOT EXISTS "));
    let pause_table = table.quoted_sibling(PAUSE_TABLE);
    before.push(create_pause_table(&pause_table, "IF NOT EXISTS "));
    creation_script(MIGRATIONS, table, shards, payload_type, &before, last)
}

pub(crate) use outboxkit_store_sql::migrate::not_migrated;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_substitutes_the_table_and_shards() {
        let table = TableName::parse("app.events").unwrap();
        let sql = render_table(MIGRATIONS[0].sql, &table, 16, PayloadType::Json);
        assert!(sql.contains("CREATE TABLE \"app\".\"events\" ("), "{sql}");
        assert!(sql.contains("payload         jsonb NOT NULL,"), "{sql}");
        assert!(sql.contains("CREATE INDEX \"events_pending_idx\" ON \"app\".\"events\""));
        assert!(sql.contains("% 16)"));
        assert!(sql.contains("DEFAULT '{}'"));
        assert!(!sql.contains("{table}") && !sql.contains("{name}") && !sql.contains("{shards}"));
        for (payload_type, column) in [(PayloadType::Text, "text"), (PayloadType::Binary, "bytea")]
        {
            let sql = render_table(MIGRATIONS[0].sql, &table, 16, payload_type);
            assert!(sql.contains(&format!("payload         {column} NOT NULL,")));
        }
    }
}
