//! An operator's pause of a table (`outbox-relay pause`): one row per paused table in the
//! bookkeeping table [`PAUSE_TABLE`] beside it, which `migrate` makes. Every relay of the table
//! reads it at each rebalance and claims nothing while the row is there.

use outboxkit_core::{command, Error, ErrorKind, Pause, Paused, Result};
use std::marker::PhantomData;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};

use crate::migrate::ScriptDialect;
use crate::rows::{not_null, RowColumns};
use crate::Statement;

/// The bookkeeping table of paused tables, beside the outbox table (in its schema or database).
pub const PAUSE_TABLE: &str = "outbox_relay_pause";

/// The statements on the pause table of one outbox table. Values are bound: `$1`/`?` the outbox
/// table's name (unqualified, as in the schema table), then who paused it and why.
#[derive(Debug)]
pub struct PauseSql {
    /// The pause table, quoted (for the message that says to run `migrate`).
    pub pause_table: String,
    /// The pause of the table: `paused_at`, `paused_by`, `reason` ([`pause_row`]).
    pub read: Statement,
    /// [`read`](Self::read), locking the row until the transaction ends.
    pub read_for_update: Statement,
    /// Pause the table unless it is paused already (no row then: one affected row means it
    /// paused it).
    pub pause: Statement,
    /// Lift it.
    pub resume: Statement,
    /// When a read last found no pause table (a table an older `migrate` made): reads are not
    /// sent again for [`MISSING_RECHECK`], since each would be an error in the server's log.
    missing_since: Mutex<Option<Instant>>,
}

/// How long a relay that found no pause table takes that answer for true before it looks again
/// (a `pause` or `resume` made through the same store looks at once).
pub const MISSING_RECHECK: Duration = Duration::from_secs(60);

impl PauseSql {
    /// The statements on `pause_table` (quoted) with `placeholders` (the server's three, in
    /// order) and `insert` (`INSERT INTO` with the server's way of leaving an existing row alone
    /// before it, `on_conflict` after it), on server `D` (its current time, [`ScriptDialect::NOW`]).
    pub fn new<D: ScriptDialect>(
        pause_table: &str,
        placeholders: [&str; 3],
        insert: &str,
        on_conflict: &str,
    ) -> Self {
        let [table, by, reason] = placeholders;
        let now = D::NOW;
        let read = format!(
            "SELECT paused_at, paused_by, reason FROM {pause_table} WHERE table_name = {table}"
        );
        Self {
            pause_table: pause_table.to_owned(),
            read_for_update: format!("{read} FOR UPDATE").into(),
            read: read.into(),
            pause: format!(
                "{insert} {pause_table} (table_name, paused_at, paused_by, reason) \
                 VALUES ({table}, {now}, {by}, {reason}){on_conflict}"
            )
            .into(),
            resume: format!("DELETE FROM {pause_table} WHERE table_name = {table}").into(),
            missing_since: Mutex::new(None),
        }
    }
}

/// A row of [`PauseSql::read`].
pub fn pause_row<C: RowColumns>(row: &C::Row) -> Result<Pause, sqlx::Error> {
    Ok(Pause {
        since: not_null(C::time(row, 0)?, 0)?,
        by: not_null(C::text(row, 1)?, 1)?,
        reason: C::text(row, 2)?.unwrap_or_default(),
    })
}

/// The error is the server's "no such table" (PostgreSQL's `42P01`, MySQL's `42S02`): the pause
/// table of a database migrated before pauses existed. No table, no pause.
pub fn is_missing_table(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "42P01" || code == "42S02")
}

/// `pause` or `resume` on a database whose pause table `migrate` has not made yet.
pub fn no_pause_table(pause_table: &str) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "the pause table {pause_table} does not exist (the table was migrated by an older \
             relay): run {} to make it",
            command::line("migrate")
        ),
    )
}

/// The pause of one outbox table, on its store's pool: what the SQL stores' `paused`, `pause`
/// and `resume` are. `C` reads the server's rows.
pub struct Pauses<'a, C, DB: Database, E> {
    pool: &'a Pool<DB>,
    sql: &'a PauseSql,
    /// The outbox table's unqualified name: the key of its row.
    table: &'a str,
    /// The store's classification of what the server answered.
    error: E,
    columns: PhantomData<fn() -> C>,
}

impl<C, DB: Database, E> std::fmt::Debug for Pauses<'_, C, DB, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pauses")
            .field("table", &self.table)
            .field("pause_table", &self.sql.pause_table)
            .finish_non_exhaustive()
    }
}

impl<'a, C, DB, E> Pauses<'a, C, DB, E>
where
    E: Fn(sqlx::Error) -> Error + Sync,
    DB: Database,
    C: RowColumns<Row = DB::Row>,
    DB::Arguments: IntoArguments<DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    /// The pause of `table` (unqualified) with `sql`, on `pool`; `error` classifies failures.
    pub fn new(pool: &'a Pool<DB>, sql: &'a PauseSql, table: &'a str, error: E) -> Self {
        Self {
            pool,
            sql,
            table,
            error,
            columns: PhantomData,
        }
    }

    /// The table's pause, `None` when it is not paused or the pause table does not exist yet
    /// ([`is_missing_table`]: no table, no pause; asked again after [`MISSING_RECHECK`]).
    pub async fn read(&self) -> Result<Option<Pause>> {
        if self
            .missing_since()
            .is_some_and(|at| at.elapsed() < MISSING_RECHECK)
        {
            return Ok(None);
        }
        let read = async {
            let mut conn = self.pool.acquire().await?;
            self.first(&mut conn, &self.sql.read).await
        };
        match read.await {
            Err(e) if is_missing_table(&e) => {
                self.set_missing_since(Some(Instant::now()));
                Ok(None)
            }
            read => {
                read.map_err(|e| (self.error)(e).context("reading whether the table is paused"))
            }
        }
    }

    /// Pause the table for `by` and `reason` unless it is paused already, in one transaction.
    pub async fn pause(&self, by: &str, reason: &str) -> Result<Paused> {
        let pause = async {
            let mut tx = self.pool.begin().await?;
            let inserted = sqlx::query(&self.sql.pause)
                .bind(self.table)
                .bind(by)
                .bind(reason)
                .execute(&mut *tx)
                .await?;
            let inserted = C::rows_affected(&inserted) == 1;
            let pause = self
                .first(&mut tx, &self.sql.read)
                .await?
                .ok_or(sqlx::Error::RowNotFound)?;
            tx.commit().await?;
            self.set_missing_since(None);
            Ok(if inserted {
                Paused::Now(pause)
            } else {
                Paused::Already(pause)
            })
        };
        pause.await.map_err(|e| self.failed(e, "pausing the table"))
    }

    /// Lift the table's pause: the pause it lifted, `None` when there was none.
    pub async fn resume(&self) -> Result<Option<Pause>> {
        let resume = async {
            let mut tx = self.pool.begin().await?;
            let pause = self.first(&mut tx, &self.sql.read_for_update).await?;
            if pause.is_some() {
                sqlx::query(&self.sql.resume)
                    .bind(self.table)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            self.set_missing_since(None);
            Ok(pause)
        };
        resume
            .await
            .map_err(|e| self.failed(e, "lifting the pause of the table"))
    }

    fn missing_since(&self) -> Option<Instant> {
        *self
            .sql
            .missing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn set_missing_since(&self, at: Option<Instant>) {
        *self
            .sql
            .missing_since
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = at;
    }

    /// The pause `statement` reads.
    async fn first(
        &self,
        conn: &mut DB::Connection,
        statement: &Statement,
    ) -> Result<Option<Pause>, sqlx::Error> {
        let row = sqlx::query(statement)
            .bind(self.table)
            .fetch_optional(&mut *conn)
            .await?;
        row.as_ref().map(pause_row::<C>).transpose()
    }

    /// A failure of `pause` or `resume`: a database migrated before pauses existed is told to
    /// run `migrate`.
    fn failed(&self, error: sqlx::Error, doing: &str) -> Error {
        if is_missing_table(&error) {
            return no_pause_table(&self.sql.pause_table).context(doing.to_owned());
        }
        (self.error)(error).context(doing.to_owned())
    }
}
