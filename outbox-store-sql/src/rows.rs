//! Rows the stores' statements return in the same shape on every server.

use chrono::{DateTime, Utc};
use outboxkit_core::{
    BacklogStatus, DeadEvent, DeadFilter, EventContent, EventFilter, EventRecord, EventState,
    HeldBack, PayloadType,
};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};
use uuid::Uuid;

use crate::classify::classify_on_pool;
use crate::config::TableName;
use crate::migrate::{payload_type_if, TableCatalog};
use crate::{Statement, Target};

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
pub async fn read_backlog<'c, E, DB>(
    executor: E,
    statement: &Statement,
) -> Result<BacklogStatus, sqlx::Error>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
    for<'r> i64: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    for<'s> &'s str: ColumnIndex<DB::Row>,
{
    let row = sqlx::query(statement).fetch_one(executor).await?;
    backlog_status(&row)
}

/// How a server's rows give the columns whose types differ between servers: the event id (a
/// `uuid`, or `CHAR(36)` text), text, and times (`timestamptz`, or `DATETIME(6)` in UTC). Each
/// store implements it on its marker type; [`record_with`] reads the rows of `find_events` and
/// of the dead list with it, and [`held_back`] those of the held-back list, by column position.
pub trait RowColumns {
    /// The server's row.
    type Row: Row;

    /// The event id at `index`.
    fn event_id(row: &Self::Row, index: usize) -> Result<Uuid, sqlx::Error>;

    /// The text at `index`, `None` for NULL.
    fn text(row: &Self::Row, index: usize) -> Result<Option<String>, sqlx::Error>;

    /// The time at `index`, `None` for NULL.
    fn time(row: &Self::Row, index: usize) -> Result<Option<DateTime<Utc>>, sqlx::Error>;

    /// The payload at `index` of a table of `payload_type`, as the store's statements select it
    /// (a `json` column as its text): the bytes a sink gets.
    fn payload(
        row: &Self::Row,
        index: usize,
        payload_type: PayloadType,
    ) -> Result<Vec<u8>, sqlx::Error>;

    /// How many rows a statement changed, from the server's `result`.
    fn rows_affected(result: &<<Self::Row as Row>::Database as Database>::QueryResult) -> u64;
}

/// A NULL where the table has none.
pub(crate) fn not_null<T>(value: Option<T>, index: usize) -> Result<T, sqlx::Error> {
    value.ok_or_else(|| sqlx::Error::ColumnDecode {
        index: index.to_string(),
        source: "unexpected NULL".into(),
    })
}

/// The columns the dead list and `find_events` select, in the order [`record_with`] reads.
pub const RECORD_COLUMNS: &str = "id, event_id, aggregate_type, aggregate_id, event_type, \
     destination, attempts, last_error, created_at, next_attempt_at, published_at, dead_at";

/// Run `query` on `executor` and read each row with `decode`.
pub async fn fetch<'q, 'c, E, DB, T>(
    executor: E,
    query: sqlx::query::Query<'q, DB, DB::Arguments>,
    decode: impl Fn(&DB::Row) -> Result<T, sqlx::Error>,
) -> Result<Vec<T>, sqlx::Error>
where
    DB: Database,
    E: Executor<'c, Database = DB>,
    DB::Arguments: IntoArguments<DB>,
{
    query
        .fetch_all(executor)
        .await?
        .iter()
        .map(decode)
        .collect()
}

/// A row of `find_events` or of the dead list: [`RECORD_COLUMNS`], then, with `content` (the
/// table's payload type), its payload and its headers as JSON text, read into
/// [`EventRecord::content`].
pub fn record_with<C: RowColumns>(
    row: &C::Row,
    content: Option<PayloadType>,
) -> Result<EventRecord, sqlx::Error>
where
    for<'r> i64: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    for<'r> i32: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    usize: ColumnIndex<C::Row>,
{
    let mut record = event_record::<C>(row)?;
    let Some(payload_type) = content else {
        return Ok(record);
    };
    let headers = not_null(C::text(row, 13)?, 13)?;
    record.content = Some(EventContent {
        payload: C::payload(row, 12, payload_type)?,
        payload_type,
        headers: crate::session::parse_headers(&headers).map_err(|e| {
            sqlx::Error::ColumnDecode {
                index: "headers".to_owned(),
                source: e.into(),
            }
        })?,
    });
    Ok(record)
}

/// A row of the dead list read with [`record_with`]: an error unless it is dead.
pub fn dead(record: EventRecord) -> Result<DeadEvent, sqlx::Error> {
    record.into_dead().ok_or_else(|| sqlx::Error::ColumnDecode {
        index: "dead_at".to_owned(),
        source: "a row of the dead list that is not dead".into(),
    })
}

/// The statements of `find_events` and of the dead list: each without the payload and
/// headers, and with them for a table of each payload type ([`record_with`] reads both).
#[derive(Debug)]
pub struct Listings {
    /// In [`PayloadType::ALL`] order, then without content.
    events: [Statement; 4],
    dead: [Statement; 4],
}

impl Listings {
    /// `find_events` and `dead_list` write a store's statement selecting the columns they are
    /// given from the table aliased `o`; `payload` is how the store's claim reads a payload of
    /// each type (`o.payload::text AS payload`), `headers` how it reads the headers as JSON text.
    pub fn new(
        find_events: impl Fn(&str) -> String,
        dead_list: impl Fn(&str) -> String,
        payload: impl Fn(PayloadType) -> &'static str,
        headers: &str,
    ) -> Self {
        let [json, text, binary] =
            PayloadType::ALL.map(|t| format!("{RECORD_COLUMNS}, {}, {headers}", payload(t)));
        let columns = [json, text, binary, RECORD_COLUMNS.to_owned()];
        Self {
            events: columns.each_ref().map(|c| find_events(c).into()),
            dead: columns.each_ref().map(|c| dead_list(c).into()),
        }
    }

    /// `find_events` of a table of `content`'s payload type with the payload and headers, or
    /// without them (`None`).
    pub fn find_events(&self, content: Option<PayloadType>) -> &Statement {
        &self.events[content.map_or(3, |t| t as usize)]
    }

    /// The dead list of a table of `content`'s payload type with the payload and headers, or
    /// without them (`None`).
    pub fn dead_list(&self, content: Option<PayloadType>) -> &Statement {
        &self.dead[content.map_or(3, |t| t as usize)]
    }
}

/// A row of a store's held-back statement: aggregate type and id, the id, attempts, next
/// attempt and last error of its first waiting row, and how many wait behind it.
pub fn held_back<C: RowColumns>(row: &C::Row) -> Result<HeldBack, sqlx::Error>
where
    for<'r> i64: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    for<'r> i32: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    usize: ColumnIndex<C::Row>,
{
    Ok(HeldBack {
        aggregate_type: not_null(C::text(row, 0)?, 0)?,
        aggregate_id: not_null(C::text(row, 1)?, 1)?,
        id: row.try_get(2)?,
        attempts: row.try_get(3)?,
        next_attempt_at: C::time(row, 4)?,
        last_error: C::text(row, 5)?,
        waiting_behind: row.try_get(6)?,
    })
}

/// A query of a store's server, its arguments bound.
pub type Query<'q, DB> = sqlx::query::Query<'q, DB, <DB as Database>::Arguments>;

/// How a server's listing statements ([`Listings`]) take their filters, each `NULL` for any
/// value: `find_events` binds the event id, then, as the dead list does, the aggregate type and
/// id, then the limit ([`list`]).
pub trait ListingParams:
    TableCatalog + RowColumns<Row = <Self::Database as Database>::Row>
{
    /// `query` with the event id bound, as often as the statement names it.
    fn bind_event_id(
        query: Query<'_, Self::Database>,
        event_id: Option<Uuid>,
    ) -> Query<'_, Self::Database>;

    /// `query` with the aggregate type and id bound, as often as the statement names each.
    fn bind_aggregate<'q>(
        query: Query<'q, Self::Database>,
        aggregate_type: Option<&str>,
        aggregate_id: Option<&str>,
    ) -> Query<'q, Self::Database>;
}

/// What [`list`] reads: the dead list (oldest first) or `find_events` (newest first).
#[derive(Debug, Clone, Copy)]
pub enum Listing<'a> {
    Dead(&'a DeadFilter),
    Events(&'a EventFilter),
}

/// What [`list`] makes of each [`EventRecord`]: [`dead`] for the dead list, `Ok` for
/// `find_events`.
pub type Then<T> = fn(EventRecord) -> Result<T, sqlx::Error>;

/// The rows `listing` selects of `table`, read on a connection of `pool` with [`record_with`]
/// and then `then`; a failure is classified as the store's others are
/// ([`classify_on_pool`]).
pub async fn list<S: ListingParams, T>(
    pool: &Pool<S::Database>,
    table: &TableName<S>,
    target: &Target,
    listings: &Listings,
    listing: Listing<'_>,
    then: Then<T>,
) -> outboxkit_core::Result<Vec<T>>
where
    for<'c> &'c mut <S::Database as Database>::Connection: Executor<'c, Database = S::Database>,
    <S::Database as Database>::Arguments: IntoArguments<S::Database>,
    for<'e> i64: Encode<'e, S::Database> + Decode<'e, S::Database> + Type<S::Database>,
    for<'r> i32: Decode<'r, S::Database> + Type<S::Database>,
    usize: ColumnIndex<<S::Database as Database>::Row>,
{
    let error = |e| classify_on_pool::<S, S::Database>(e, target, pool);
    let mut conn = pool.acquire().await.map_err(error)?;
    let (with_payload, aggregate_type, aggregate_id, limit) = match listing {
        Listing::Dead(f) => (f.with_payload, &f.aggregate_type, &f.aggregate_id, f.limit),
        Listing::Events(f) => (f.with_payload, &f.aggregate_type, &f.aggregate_id, f.limit),
    };
    let content = payload_type_if::<S>(&mut conn, table, target, with_payload).await?;
    let (query, what) = match listing {
        Listing::Dead(_) => (
            sqlx::query(listings.dead_list(content)),
            "listing dead rows",
        ),
        Listing::Events(f) => {
            let query = sqlx::query(listings.find_events(content));
            (S::bind_event_id(query, f.event_id), "looking events up")
        }
    };
    let query = S::bind_aggregate(query, aggregate_type.as_deref(), aggregate_id.as_deref())
        .bind(i64::from(limit.max(1)));
    fetch(&mut *conn, query, |row| {
        record_with::<S>(row, content).and_then(then)
    })
    .await
    .map_err(|e| error(e).context(what))
}

/// A row of `find_events`: [`RECORD_COLUMNS`].
fn event_record<C: RowColumns>(row: &C::Row) -> Result<EventRecord, sqlx::Error>
where
    for<'r> i64: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    for<'r> i32: Decode<'r, <C::Row as Row>::Database> + Type<<C::Row as Row>::Database>,
    usize: ColumnIndex<C::Row>,
{
    let published_at = C::time(row, 10)?;
    let dead_at = C::time(row, 11)?;
    Ok(EventRecord {
        id: row.try_get(0)?,
        event_id: C::event_id(row, 1)?,
        aggregate_type: not_null(C::text(row, 2)?, 2)?,
        aggregate_id: not_null(C::text(row, 3)?, 3)?,
        event_type: not_null(C::text(row, 4)?, 4)?,
        destination: C::text(row, 5)?,
        state: EventState::of(published_at, dead_at),
        attempts: row.try_get(6)?,
        last_error: C::text(row, 7)?,
        created_at: not_null(C::time(row, 8)?, 8)?,
        next_attempt_at: C::time(row, 9)?,
        published_at,
        dead_at,
        content: None,
    })
}
