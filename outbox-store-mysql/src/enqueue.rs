//! The writers' API: insert events inside the caller's own transaction.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, LazyLock};

use sqlx::MySqlConnection;

use outboxkit_core::{Error, ErrorKind, NewEvent, Result};

use outboxkit_store_sql::enqueue::{insert_error, to_json, INSERT_COLUMNS};
use outboxkit_store_sql::Statement;

use crate::classify::{MySql, Target};
use crate::config::TableName;

/// Longest `aggregate_type`, `aggregate_id` and `event_type`, in characters (`VARCHAR(255)`).
pub const MAX_NAME_CHARS: usize = 255;
/// Longest `destination`, in characters (`VARCHAR(1024)`).
pub const MAX_DESTINATION_CHARS: usize = 1024;

/// Rows per multi-row `INSERT` (7 values each).
const ROWS_PER_INSERT: usize = 1000;

/// Multi-row inserts of at most this many rows keep a prepared statement per size.
const CACHED_INSERT_ROWS: usize = 16;

/// A handle on one outbox table with its insert statements prepared as text; cheap to clone.
///
/// ```no_run
/// # async fn demo(pool: sqlx::MySqlPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outboxkit_core::NewEvent;
/// use outboxkit_store_mysql::Outbox;
///
/// let outbox = Outbox::new("outbox")?;
/// let mut tx = pool.begin().await?;
/// // ... change the business rows of the order first (this locks the aggregate) ...
/// let event = NewEvent::new("order", "42", "OrderConfirmed", serde_json::json!({"total": 99}));
/// let id = outbox.enqueue(&mut *tx, &event).await?;
/// tx.commit().await?;
/// # let _ = id;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Outbox {
    target: Target,
    table: String,
    insert_one: Statement,
    /// `@@auto_increment_increment` once known (0: not read yet).
    id_step: Arc<AtomicI64>,
}

impl Outbox {
    /// The table `table` or `database.table`. Unqualified names resolve to the connection's
    /// current database, as plain SQL would.
    pub fn new(table: &str) -> Result<Self> {
        Ok(Self::for_table(&TableName::parse(table)?))
    }

    pub(crate) fn for_table(table: &TableName) -> Self {
        let t = table.quoted();
        Self {
            target: Target::table(table.to_string()),
            insert_one: format!("INSERT INTO {t} ({INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)")
                .into(),
            table: t,
            id_step: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The same handle, its errors naming the server as `target` does: the store's own, which
    /// knows where it connected (`MariaDB at host:port refused a value ...`).
    pub(crate) fn naming(mut self, target: &Target) -> Self {
        self.target = target.clone();
        self
    }

    /// The table this handle writes to.
    pub fn table(&self) -> &str {
        &self.target.table
    }

    /// Insert one event on `conn` — typically `&mut *tx` of the caller's transaction, so the
    /// event commits (or rolls back) with the business change. Returns the row id.
    pub async fn enqueue(&self, conn: &mut MySqlConnection, event: &NewEvent) -> Result<i64> {
        let row = Values::of(event)?;
        let done = row
            .bind(sqlx::query(&self.insert_one))
            .execute(conn)
            .await
            .map_err(|e| self.error(e))?;
        i64::try_from(done.last_insert_id()).map_err(|_| self.no_id())
    }

    /// Insert several events with multi-row `INSERT`s (up to 1,000 rows each); returns their row
    /// ids in the order given (ids increase in that order).
    ///
    /// MySQL has no `RETURNING`: the ids are computed from `LAST_INSERT_ID()` (the first id of a
    /// statement) and `@@auto_increment_increment`. This relies on InnoDB giving the rows of one
    /// multi-row `INSERT ... VALUES` consecutive auto-increment values, which it does in every
    /// `innodb_autoinc_lock_mode` (0, 1 and 2: the number of rows of such a "simple insert" is
    /// known in advance and reserved at once).
    pub async fn enqueue_many(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<i64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        let rows = events.iter().map(Values::of).collect::<Result<Vec<_>>>()?;
        let step = self.id_step(conn).await?;
        let mut ids = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            let sql = self.insert_rows(chunk.len());
            let mut query = sqlx::query(&sql).persistent(chunk.len() <= CACHED_INSERT_ROWS);
            for row in chunk {
                query = row.bind(query);
            }
            let done = query.execute(&mut *conn).await.map_err(|e| self.error(e))?;
            let first = i64::try_from(done.last_insert_id()).map_err(|_| self.no_id())?;
            if first == 0 || done.rows_affected() != chunk.len() as u64 {
                return Err(self.no_id());
            }
            ids.extend((0..chunk.len() as i64).map(|k| first + k * step));
        }
        Ok(ids)
    }

    fn insert_rows(&self, n: usize) -> Statement {
        let mut sql = format!("INSERT INTO {} ({INSERT_COLUMNS}) VALUES ", self.table);
        for i in 0..n {
            if i > 0 {
                sql.push_str(", ");
            }
            sql.push_str("(?, ?, ?, ?, ?, ?, ?)");
        }
        sql.into()
    }

    async fn id_step(&self, conn: &mut MySqlConnection) -> Result<i64> {
        let known = self.id_step.load(Ordering::Relaxed);
        if known > 0 {
            return Ok(known);
        }
        let step: i64 = sqlx::query_scalar("SELECT CAST(@@auto_increment_increment AS SIGNED)")
            .fetch_one(conn)
            .await
            .map_err(|e| self.error(e))?;
        let step = step.max(1);
        self.id_step.store(step, Ordering::Relaxed);
        Ok(step)
    }

    fn no_id(&self) -> Error {
        Error::new(
            ErrorKind::Other,
            format!(
                "inserting into {}: the server returned no AUTO_INCREMENT id (is `id` still the \
                 table's AUTO_INCREMENT column?)",
                self.target.table
            ),
        )
    }

    fn error(&self, error: sqlx::Error) -> Error {
        insert_error::<MySql>(error, &self.target)
    }
}

/// One event's values, checked against the column sizes before anything is sent.
struct Values<'e> {
    event_id: String,
    event: &'e NewEvent,
    headers: String,
}

impl<'e> Values<'e> {
    fn of(event: &'e NewEvent) -> Result<Self> {
        for (field, value) in [
            ("aggregate_type", &event.aggregate_type),
            ("aggregate_id", &event.aggregate_id),
            ("event_type", &event.event_type),
        ] {
            check_length(field, value, MAX_NAME_CHARS)?;
        }
        if let Some(destination) = &event.destination {
            check_length("destination", destination, MAX_DESTINATION_CHARS)?;
        }
        Ok(Self {
            event_id: event.event_id_or_new().hyphenated().to_string(),
            event,
            headers: to_json(&event.headers, "headers")?,
        })
    }

    fn bind<'q>(
        &'q self,
        query: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        let query = query
            .bind(&self.event_id)
            .bind(&self.event.aggregate_type)
            .bind(&self.event.aggregate_id)
            .bind(&self.event.event_type);
        // Text as text, whatever the column; bytes that are not UTF-8 as bytes, which a `json`
        // or `text` column refuses ("Incorrect string value", "Cannot create a JSON value").
        let query = match self.event.payload.as_text() {
            Some(text) => query.bind(text),
            None => query.bind(self.event.payload.as_bytes()),
        };
        query
            .bind(&self.headers)
            .bind(self.event.destination.as_deref())
    }
}

fn check_length(field: &str, value: &str, max: usize) -> Result<()> {
    let chars = value.chars().count();
    if chars > max {
        return Err(Error::new(
            ErrorKind::InvalidMessage,
            format!("event {field} is {chars} characters long, the outbox column holds {max}"),
        ));
    }
    Ok(())
}

static DEFAULT_OUTBOX: LazyLock<Outbox> = LazyLock::new(|| {
    Outbox::for_table(&TableName::parse("outbox").expect("\"outbox\" is a valid table name"))
});

/// Insert one event into the table `outbox` on `conn` (the caller's transaction: `&mut *tx`).
/// For another table, use [`Outbox`].
pub async fn enqueue(conn: &mut MySqlConnection, event: &NewEvent) -> Result<i64> {
    DEFAULT_OUTBOX.enqueue(conn, event).await
}

/// Insert several events into the table `outbox`; ids in the order given.
pub async fn enqueue_many(conn: &mut MySqlConnection, events: &[NewEvent]) -> Result<Vec<i64>> {
    DEFAULT_OUTBOX.enqueue_many(conn, events).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_checked_before_sending() {
        let ok = NewEvent::new("order", "é".repeat(255), "Placed", serde_json::json!({}));
        assert!(Values::of(&ok).is_ok());
        let long = NewEvent::new("order", "é".repeat(256), "Placed", serde_json::json!({}));
        let e = Values::of(&long).err().unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidMessage);
        assert!(!e.is_retryable());
        assert!(
            e.message().contains("aggregate_id is 256 characters"),
            "{e}"
        );
        let long = NewEvent::new("order", "1", "Placed", serde_json::json!({}))
            .destination("d".repeat(1025));
        assert!(Values::of(&long)
            .err()
            .unwrap()
            .message()
            .contains("destination"));
    }

    #[test]
    fn event_ids_are_hyphenated_text_and_kept_when_given() {
        let id = uuid::Uuid::new_v4();
        let event = NewEvent::new("order", "1", "Placed", serde_json::json!(null)).event_id(id);
        let values = Values::of(&event).unwrap();
        assert_eq!(values.event_id, id.hyphenated().to_string());
        assert_eq!(values.event.payload.as_text(), Some("null"));
        assert_eq!(values.headers, "{}");
    }

    #[test]
    fn multi_row_inserts_have_seven_placeholders_per_row() {
        let outbox = Outbox::new("shop.outbox").unwrap();
        let sql = outbox.insert_rows(3);
        assert!(
            sql.starts_with("INSERT INTO `shop`.`outbox` (event_id,"),
            "{sql}"
        );
        assert_eq!(sql.matches('?').count(), 21);
        assert_eq!(outbox.insert_one.matches('?').count(), 7);
    }
}
