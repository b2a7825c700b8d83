//! What the stores' migrations share: the checks of a table's schema version and their
//! messages, the reading of its schema row, and the rendering and logging of a migration.

use std::fmt;
use std::future::Future;

use outboxkit_core::{command, Error, ErrorKind, PayloadType, Result};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use crate::classify::{classify, classify_on_pool, Dialect, Target};
use crate::config::{TableName, TableRules, SCHEMA_TABLE};
use crate::payload::PayloadColumn;
use crate::Statement;

/// One version of a store's schema.
#[derive(Debug)]
pub struct Migration {
    pub version: i32,
    /// What it does, as the log says it.
    pub description: &'static str,
    /// Its SQL, before [`render`].
    pub sql: &'static str,
}

/// Panics (at compile time, in a `const`) unless `migrations` are numbered 1, 2, ... in order
/// and end at `schema_version`.
pub const fn assert_numbered(migrations: &[Migration], schema_version: i32) {
    let mut i = 0;
    while i < migrations.len() {
        assert!(
            migrations[i].version == i as i32 + 1,
            "migrations are numbered 1, 2, ... in order"
        );
        i += 1;
    }
    assert!(
        i > 0 && migrations[i - 1].version == schema_version,
        "the last migration is at the schema version"
    );
}

impl Migration {
    /// What an error of this migration's SQL was doing: `schema version 1 (...)`.
    pub fn context(&self) -> String {
        format!("schema version {} ({})", self.version, self.description)
    }

    /// Log that this migration was applied to `table`.
    pub fn applied(&self, table: &dyn fmt::Display, shard_count: i32) {
        tracing::info!(
            table = %table,
            version = self.version,
            shards = shard_count,
            "{}",
            self.description
        );
    }
}

/// Before migrating `table`, at version `current` (0: new) with `shard_count` shards: `Err` when
/// it is newer than this relay knows (`known`). A migrated table keeps the shard count it was
/// created with, whatever `store.shards` (`shards`) says now.
pub fn check_current(
    table: &dyn fmt::Display,
    current: i32,
    known: i32,
    shard_count: i32,
    shards: u32,
) -> Result<()> {
    if current > known {
        return Err(newer_schema(table, current, known));
    }
    if current > 0 && u32::try_from(shard_count).ok() != Some(shards) {
        tracing::info!(
            table = %table,
            shard_count,
            configured = shards,
            "the table keeps the shard count it was created with; store.shards is ignored"
        );
    }
    Ok(())
}

/// The `(version, shard_count)` row of `table` in the store's bookkeeping table
/// ([`SCHEMA_TABLE`] beside it), or `None` when it was never migrated. `placeholder` is the
/// server's marker of the one bound value, the table's bare name (`$1`, `?`).
pub async fn schema_row<'c, S, E, DB>(
    conn: E,
    table: &TableName<S>,
    placeholder: &str,
    target: &Target,
) -> Result<Option<(i32, i32)>>
where
    S: Dialect + TableRules,
    DB: Database,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    i32: for<'r> Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    let statement = format!(
        "SELECT version, shard_count FROM {} WHERE table_name = {placeholder}",
        table.quoted_sibling(SCHEMA_TABLE)
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(statement))
        .bind(table.name())
        .fetch_optional(conn)
        .await
        .map_err(|e| classify::<S>(e, target))?;
    row.map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
        .transpose()
        .map_err(|e: sqlx::Error| classify::<S>(e, target))
}

/// `table` has a row in the bookkeeping table but does not exist: it was dropped after it was
/// migrated (by hand, to start over). Say so, and give the statement deleting that row (one
/// bound value, the table's bare name, at `placeholder` as for [`schema_row`]), after which
/// the migration creates the table again as a new one, with the configured shard count.
/// Without it, `migrate` found the table at its version, created nothing, and failed on the
/// missing table telling to run `migrate`.
pub fn forget_dropped<S: Dialect + TableRules>(
    table: &TableName<S>,
    placeholder: &str,
) -> Statement {
    tracing::warn!(
        table = %table,
        "the table was dropped after it was migrated (its row in {SCHEMA_TABLE} outlived it): \
         creating it again"
    );
    Statement::from(format!(
        "DELETE FROM {} WHERE table_name = {placeholder}",
        table.quoted_sibling(SCHEMA_TABLE)
    ))
}

/// What a store reads of its outbox table on a connection of its server: the bookkeeping row
/// and the payload column's type. What is checked of them is written once
/// ([`checked_payload_type`], [`table_facts`]).
pub trait TableCatalog: Dialect + TableRules + PayloadColumn + Sized {
    /// The store's sqlx database.
    type Database: Database;
    /// The schema version the store creates and expects.
    const SCHEMA_VERSION: i32;

    /// The version and shard count of `table`, or `None` when it was never migrated.
    fn schema_row(
        conn: &mut <Self::Database as Database>::Connection,
        table: &TableName<Self>,
        target: &Target,
    ) -> impl Future<Output = Result<Option<(i32, i32)>>> + Send;

    /// Run `sql`, one statement without a result (see [`crate::privileges`]), on `conn`.
    fn execute(
        conn: &mut <Self::Database as Database>::Connection,
        sql: &str,
    ) -> impl Future<Output = std::result::Result<(), sqlx::Error>> + Send;

    /// The payload type of `table`, read from the catalog.
    fn payload_type(
        conn: &mut <Self::Database as Database>::Connection,
        table: &TableName<Self>,
        target: &Target,
    ) -> impl Future<Output = Result<PayloadType>> + Send;
}

/// The payload type of `table`, read on `conn`, when a listing shows payloads (`wanted`);
/// `None` otherwise, without a query.
pub async fn payload_type_if<S: TableCatalog>(
    conn: &mut <S::Database as Database>::Connection,
    table: &TableName<S>,
    target: &Target,
    wanted: bool,
) -> Result<Option<PayloadType>> {
    match wanted {
        true => S::payload_type(conn, table, target).await.map(Some),
        false => Ok(None),
    }
}

/// The payload type of `table`, checked against `store.payload_type` (`configured`) when it is
/// set.
pub async fn checked_payload_type<S: TableCatalog>(
    conn: &mut <S::Database as Database>::Connection,
    table: &TableName<S>,
    configured: Option<PayloadType>,
    target: &Target,
) -> Result<PayloadType> {
    let actual = S::payload_type(conn, table, target).await?;
    crate::payload::check_configured::<S>(configured, actual, table, &table.quoted())?;
    Ok(actual)
}

/// The shard count of `table` from its schema `row` (checking the version, see
/// [`migrated_shards`]) and its payload type, read on `conn` and checked against
/// `store.payload_type` (`configured`).
pub async fn table_facts<S: TableCatalog>(
    conn: &mut <S::Database as Database>::Connection,
    table: &TableName<S>,
    row: Result<Option<(i32, i32)>>,
    configured: Option<PayloadType>,
    target: &Target,
) -> Result<(u32, PayloadType)> {
    let shard_count = migrated_shards(table, row, S::SCHEMA_VERSION)?;
    let payload_type = checked_payload_type::<S>(conn, table, configured, target).await?;
    Ok((shard_count, payload_type))
}

/// [`table_facts`] of `table`, read on a connection of `pool`: what a store checks before it
/// opens a shard session.
pub async fn pooled_table_facts<S: TableCatalog>(
    pool: &sqlx::Pool<S::Database>,
    table: &TableName<S>,
    configured: Option<PayloadType>,
    target: &Target,
) -> Result<(u32, PayloadType)> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| classify_on_pool::<S, _>(e, target, pool))?;
    let row = S::schema_row(&mut *conn, table, target).await;
    table_facts::<S>(&mut *conn, table, row, configured, target).await
}

/// The shard count of `table` from what [`schema_row`] read: `Schema` errors when it has no row
/// (or there is no bookkeeping table) or it is at another version than `expected`.
pub fn migrated_shards(
    table: &dyn fmt::Display,
    row: Result<Option<(i32, i32)>>,
    expected: i32,
) -> Result<u32> {
    let row = match row {
        // No bookkeeping table: not migrated either.
        Err(e) if e.kind() == ErrorKind::Schema => None,
        row => row?,
    };
    let Some((version, shards)) = row else {
        return Err(not_migrated(table));
    };
    check_version(table, version, expected)?;
    Ok(u32::try_from(shards).unwrap_or(0))
}

/// A migration's SQL for one table: `{table}` becomes the quoted (qualified) table, `{name}` its
/// bare name, `{shards}` the shard count.
pub fn render(sql: &str, quoted_table: &str, name: &str, shards: i32, payload: &str) -> String {
    sql.replace("{table}", quoted_table)
        .replace("{name}", name)
        .replace("{shards}", &shards.to_string())
        .replace("{payload}", payload)
}

/// A migration's SQL for the outbox table `table` of `shards` shards storing `payload_type`
/// payloads, in the column type of its server ([`render`]).
pub fn render_table<S: PayloadColumn + TableRules>(
    sql: &str,
    table: &TableName<S>,
    shards: i32,
    payload_type: PayloadType,
) -> String {
    let payload = S::column_type(payload_type);
    render(sql, &table.quoted(), table.name(), shards, payload)
}

/// How one store's `migrate --print-sql` script differs from another's.
pub trait ScriptDialect {
    /// The server, as the script's first line names it: `PostgreSQL`, `MySQL / MariaDB`.
    const PRODUCT: &'static str;
    /// Whether the script is one transaction (`BEGIN` … `COMMIT`): DDL is transactional.
    const TRANSACTIONAL: bool;
    /// The server's current time in SQL, for the bookkeeping row: `now()`.
    const NOW: &'static str;
}

/// What `migrate` runs for a table that does not exist yet, as one script for a database
/// administrator to apply (`migrate --print-sql`): a first line saying what it makes, the
/// statements `before` (without `;`: the schema or database, the bookkeeping tables), every
/// migration of `migrations` (`script_of`), the bookkeeping row that `check` and `run`
/// look for, and the statements `after` (a store's own set-up of the table, such as
/// PostgreSQL's log-based capture).
pub fn creation_script<S: PayloadColumn + TableRules + ScriptDialect>(
    migrations: &[Migration],
    table: &TableName<S>,
    shards: u32,
    payload_type: Option<PayloadType>,
    before: &[String],
    after: &[String],
) -> String {
    let shard_count = i32::try_from(shards).unwrap_or(i32::MAX);
    let payload_type = payload_type.unwrap_or_default();
    let version = migrations.last().map_or(0, |m| m.version);
    let mut script = format!(
        "-- outbox-relay: table {table} at schema version {version}, {shard_count} shards, \
         payload {payload_type}; what `migrate` does, for {}.\n{}\n",
        S::PRODUCT,
        if S::TRANSACTIONAL { "BEGIN;\n" } else { "" }
    );
    for statement in before {
        script.push_str(&format!("{statement};\n\n"));
    }
    script.push_str(&script_of(migrations, table, shard_count, payload_type));
    script.push_str(&format!(
        "INSERT INTO {} (table_name, version, shard_count, applied_at) \
         VALUES ('{}', {version}, {shard_count}, {});\n",
        table.quoted_sibling(crate::config::SCHEMA_TABLE),
        table.name().replace('\'', "''"),
        S::NOW,
    ));
    for statement in after {
        script.push_str(&format!("\n{statement};\n"));
    }
    if S::TRANSACTIONAL {
        script.push_str("\nCOMMIT;\n");
    }
    script
}

/// Every migration of `migrations` rendered for `table`, for a script a database administrator
/// applies (`migrate --print-sql`): each after a comment with its description, without the
/// file's own header comments (they describe the placeholders), ending with `;`.
fn script_of<S: PayloadColumn + TableRules>(
    migrations: &[Migration],
    table: &TableName<S>,
    shards: i32,
    payload_type: PayloadType,
) -> String {
    let mut script = String::new();
    for migration in migrations {
        let sql = render_table(migration.sql, table, shards, payload_type);
        let body: Vec<&str> = sql
            .lines()
            .skip_while(|line| line.trim().is_empty() || line.starts_with("--"))
            .collect();
        let body = body.join("\n");
        let body = body.trim_end();
        let end = if body.ends_with(';') { "" } else { ";" };
        script.push_str(&format!(
            "-- version {}: {}\n{body}{end}\n\n",
            migration.version, migration.description
        ));
    }
    script
}

/// The table does not exist or has no schema row.
pub fn not_migrated(table: &dyn fmt::Display) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "table {table} does not exist (or is not migrated): run {}",
            command::line("migrate")
        ),
    )
}

/// A table of the configured name exists, but the relay did not create it: it has no row in
/// the bookkeeping table `schema_table`. `migrate` refuses it, `check` too.
pub fn not_ours(table: &dyn fmt::Display, schema_table: &str) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "table {table} exists but was not created by outbox-relay (it has no row in \
             {schema_table}), and {} leaves it alone: rename it or set store.table to \
             another name",
            command::line("migrate")
        ),
    )
}

/// The table was migrated by a newer relay than this one (`known` is this relay's version).
pub fn newer_schema(table: &dyn fmt::Display, version: i32, known: i32) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "table {table} is at schema version {version}, newer than this relay knows \
             ({known}): upgrade {}",
            command::name()
        ),
    )
}

/// `Ok` when the table is at `expected`, the version this relay creates and needs.
pub fn check_version(table: &dyn fmt::Display, version: i32, expected: i32) -> Result<()> {
    if version > expected {
        return Err(newer_schema(table, version, expected));
    }
    if version < expected {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "table {table} is at schema version {version}, this relay needs \
                 {expected}: run {}",
                command::line("migrate")
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_other_than_the_expected_one_are_schema_errors_saying_what_to_do() {
        check_version(&"app.outbox", 2, 2).unwrap();
        let e = check_version(&"app.outbox", 3, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert_eq!(
            e.message(),
            "table app.outbox is at schema version 3, newer than this relay knows (2): \
             upgrade outbox-relay"
        );
        let e = check_version(&"app.outbox", 1, 2).unwrap_err();
        assert_eq!(
            e.message(),
            "table app.outbox is at schema version 1, this relay needs 2: run `outbox-relay \
             migrate`"
        );
        assert_eq!(
            not_migrated(&"t").message(),
            "table t does not exist (or is not migrated): run `outbox-relay migrate`"
        );
    }

    const fn migration(version: i32) -> Migration {
        Migration {
            version,
            description: "",
            sql: "",
        }
    }

    #[test]
    fn migrations_numbered_in_order_up_to_the_schema_version_pass() {
        assert_numbered(&[migration(1), migration(2)], 2);
    }

    #[test]
    #[should_panic(expected = "numbered 1, 2, ... in order")]
    fn a_gap_in_the_numbers_is_refused() {
        assert_numbered(&[migration(1), migration(3)], 3);
    }

    #[test]
    #[should_panic(expected = "at the schema version")]
    fn migrations_ending_below_the_schema_version_are_refused() {
        assert_numbered(&[migration(1)], 2);
    }

    #[test]
    fn render_substitutes_every_placeholder() {
        let sql = render(
            "CREATE {table} {name}_idx % {shards} '{}' {payload}",
            "\"a\".\"t\"",
            "t",
            8,
            "bytea",
        );
        assert_eq!(sql, "CREATE \"a\".\"t\" t_idx % 8 '{}' bytea");
    }
}
