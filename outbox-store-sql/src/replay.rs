//! `Store::replay` of the SQL stores, once a store has fixed the window and written its
//! statements: counted, or sent back to pending a batch at a time.

use sqlx::query::Query;
use sqlx::{ColumnIndex, Database, Decode, Executor, IntoArguments, Pool, Row, Type};

/// Most kept events one statement of `Store::replay` sends back to pending: a replay of days of
/// events goes in transactions of this many rows, in id order, so that it holds no lock and
/// leaves no dead tuples for long, and the relays publish the first ones while the rest follow.
pub const REPLAY_BATCH: i64 = 10_000;

/// What a replay was doing, for the context of its errors.
pub fn replay_action(dry_run: bool) -> &'static str {
    if dry_run {
        "counting the kept events to publish again"
    } else {
        "sending kept events back to pending"
    }
}

/// With `dry_run`, the count `count` returns (one row, one column); else the total of the
/// statements `batch` makes — each sends back at most [`REPLAY_BATCH`] rows, first ids first,
/// and a row sent back is pending, so no longer selected — run until one changes fewer.
/// `rows_affected` reads the server's answer (`PgQueryResult::rows_affected`...).
pub async fn replay_rows<'q, DB>(
    pool: &Pool<DB>,
    dry_run: bool,
    count: Query<'q, DB, DB::Arguments>,
    batch: impl Fn() -> Query<'q, DB, DB::Arguments>,
    rows_affected: fn(&DB::QueryResult) -> u64,
) -> Result<u64, sqlx::Error>
where
    DB: Database,
    for<'c> &'c Pool<DB>: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
{
    if dry_run {
        let row = count.fetch_one(pool).await?;
        return Ok(row.try_get::<i64, _>(0)?.max(0) as u64);
    }
    let mut total = 0;
    loop {
        let n = rows_affected(&batch().execute(pool).await?);
        total += n;
        if n < REPLAY_BATCH as u64 {
            return Ok(total);
        }
    }
}
