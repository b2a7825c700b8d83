//! Rows the stores' statements return in the same shape on every server.

use outboxkit_core::BacklogStatus;
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Row, Type};

/// The row of a store's backlog statement: columns `pending`, `oldest_pending_age_secs`,
/// `dead`, `held_back_aggregates` and `retrying`.
pub fn backlog_status<R>(row: &R) -> Result<BacklogStatus, sqlx::Error>
where
    R: Row,
    for<'r> i64: Decode<'r, R::Database> + Type<R::Database>,
    for<'r> f64: Decode<'r, R::Database> + Type<R::Database>,
    for<'c> &'c str: ColumnIndex<R>,
{
    Ok(BacklogStatus {
        pending: row.try_get("pending")?,
        oldest_pending_age_secs: row.try_get("oldest_pending_age_secs")?,
        dead: row.try_get("dead")?,
        held_back_aggregates: row.try_get("held_back_aggregates")?,
        retrying: row.try_get("retrying")?,
        slot: None,
    })
}

/// Run a store's backlog `statement` and read its row ([`backlog_status`]).
pub async fn read_backlog<'q, 'c, E, DB>(
    executor: E,
    statement: &'q str,
) -> Result<BacklogStatus, sqlx::Error>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'s> &'s str: ColumnIndex<DB::Row>,
{
    let row = sqlx::query(statement).fetch_one(executor).await?;
    backlog_status(&row)
}
