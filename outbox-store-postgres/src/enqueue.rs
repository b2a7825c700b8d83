//! The writers' API: insert events inside the caller's own transaction.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, OnceLock};

use sqlx::{PgConnection, Row};
use uuid::Uuid;

use outboxkit_core::{Error, ErrorKind, NewEvent, PayloadType, Result};

use outboxkit_store_sql::config::CaptureStyle;
use outboxkit_store_sql::enqueue::{insert_error, to_json, INSERT_COLUMNS};
use outboxkit_store_sql::migrate::TableCatalog;
use outboxkit_store_sql::Statement;

use crate::classify::{Postgres, Target};
use crate::config::TableName;

/// A handle on one outbox table with its insert statements prepared as text; cheap to clone.
///
/// The first insert reads the table's payload type (`json`, `text` or `binary`, see
/// `store.payload_type`) from the catalog, on the caller's connection, and the handle (and its
/// clones) keeps it. A `json` or `text` table takes a [`Payload`](outboxkit_core::Payload)
/// whose bytes are UTF-8 (a `json` table also requires a JSON document; PostgreSQL refuses
/// others); a `binary` table takes any bytes.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use outboxkit_core::NewEvent;
/// use outboxkit_store_postgres::Outbox;
///
/// let outbox = Outbox::new("app.outbox")?;
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
    table: TableName,
    target: Target,
    /// The table's payload type, read on first use.
    payload_type: Arc<OnceLock<PayloadType>>,
    /// How the relay reads the table (`message`: events go through the emit function), read on
    /// first use.
    style: Arc<OnceLock<CaptureStyle>>,
    /// The emit function's call for a table of each payload type.
    emit: [Statement; 3],
    /// The inserts of a table of each payload type, in [`PayloadType::ALL`] order.
    insert_one: [Statement; 3],
    insert_many: [Statement; 3],
}

/// How an insert turns the bound payload (text, or bytes for `binary`) into the column's type.
fn payload_casts(payload_type: PayloadType) -> (&'static str, &'static str, &'static str) {
    // (the one-row value, the array's element type, the value of an UNNEST element `p`)
    match payload_type {
        PayloadType::Json => ("$5::text::jsonb", "text", "p::jsonb"),
        PayloadType::Text => ("$5::text", "text", "p"),
        PayloadType::Binary => ("$5::bytea", "bytea", "p"),
    }
}

impl Outbox {
    /// The table `table` or `schema.table`. Unqualified names resolve through the writer's
    /// `search_path`, as plain SQL would.
    pub fn new(table: &str) -> Result<Self> {
        Ok(Self::for_table(&TableName::parse(table)?))
    }

    pub(crate) fn for_table(table: &TableName) -> Self {
        let t = table.quoted();
        Self {
            table: table.clone(),
            target: Target::table(table.to_string()),
            payload_type: Arc::default(),
            style: Arc::default(),
            emit: PayloadType::ALL.map(|payload_type| {
                let (value, _, _) = payload_casts(payload_type);
                format!(
                    "SELECT {}($2, $3, $4, {value}, $6::text::jsonb, $7, $1)",
                    table.quoted_sibling(&format!("{}_emit", table.name()))
                )
                .into()
            }),
            insert_one: PayloadType::ALL.map(|payload_type| {
                let (value, _, _) = payload_casts(payload_type);
                format!(
                    "INSERT INTO {t} ({INSERT_COLUMNS}) \
                     VALUES ($1, $2, $3, $4, {value}, $6::text::jsonb, $7) RETURNING id"
                )
                .into()
            }),
            // ORDER BY ord: identities are assigned in the order of the slice.
            insert_many: PayloadType::ALL.map(|payload_type| {
                let (_, element, value) = payload_casts(payload_type);
                format!(
                    "INSERT INTO {t} ({INSERT_COLUMNS}) \
                     SELECT e, at, ai, et, {value}, h::jsonb, d \
                     FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::{element}[], \
                                 $6::text[], $7::text[]) \
                          WITH ORDINALITY AS u(e, at, ai, et, p, h, d, ord) \
                     ORDER BY ord RETURNING id, event_id"
                )
                .into()
            }),
        }
    }

    /// The table's payload type: read from the catalog on `conn` the first time.
    pub async fn payload_type(&self, conn: &mut PgConnection) -> Result<PayloadType> {
        if let Some(payload_type) = self.payload_type.get() {
            return Ok(*payload_type);
        }
        let read = Postgres::payload_type(conn, &self.table, &self.target).await?;
        Ok(*self.payload_type.get_or_init(|| read))
    }

    /// The same handle, its errors naming the server as `target` does: the store's own, which
    /// knows where it connected (`PostgreSQL at host:port refused a value ...`).
    pub(crate) fn naming(mut self, target: &Target) -> Self {
        self.target = target.clone();
        self
    }

    /// The table this handle writes to.
    pub fn table(&self) -> &str {
        &self.target.table
    }

    /// How the relay reads this table: `message` when `migrate` set it up for logical capture
    /// in message style (read from the catalog on `conn` the first time), `table` otherwise.
    pub async fn style(&self, conn: &mut PgConnection) -> Result<CaptureStyle> {
        if let Some(style) = self.style.get() {
            return Ok(*style);
        }
        let recorded = crate::logical::setup::recorded(conn, &self.table, &self.target).await?;
        let style = match recorded {
            Some(r) if r.style == CaptureStyle::Message.as_str() => CaptureStyle::Message,
            _ => CaptureStyle::Table,
        };
        Ok(*self.style.get_or_init(|| style))
    }

    /// Write one event on `conn` — typically `&mut *tx` of the caller's transaction, so the
    /// event commits (or rolls back) with the business change. Returns the row id; for a table
    /// set up for logical capture in message style, the event goes into the log through the
    /// table's emit function instead (no row) and the result is its log position.
    pub async fn enqueue(&self, conn: &mut PgConnection, event: &NewEvent) -> Result<i64> {
        if self.style(&mut *conn).await? == CaptureStyle::Message {
            return self.emit(conn, event).await;
        }
        let payload_type = self.payload_type(&mut *conn).await?;
        self.write_one(
            conn,
            event,
            &self.insert_one[payload_type as usize],
            payload_type,
        )
        .await
    }

    /// Run `statement` (an insert or an emit, binding the event's fields as `$1`..`$7`) for
    /// `event` on `conn`; its one value.
    async fn write_one(
        &self,
        conn: &mut PgConnection,
        event: &NewEvent,
        statement: &Statement,
        payload_type: PayloadType,
    ) -> Result<i64> {
        let headers = to_json(&event.headers, "headers")?;
        let query = sqlx::query_scalar(statement)
            .bind(event.event_id_or_new())
            .bind(&event.aggregate_type)
            .bind(&event.aggregate_id)
            .bind(&event.event_type);
        let query = match payload_type {
            PayloadType::Binary => query.bind(event.payload.as_bytes()),
            _ => query.bind(event.payload.text_for(self.table(), payload_type)?),
        };
        query
            .bind(headers)
            .bind(event.destination.as_deref())
            .fetch_one(conn)
            .await
            .map_err(|e| self.error(e))
    }

    /// Write `event` into the log with the table's emit function (message style of logical
    /// capture), on `conn`, inside the caller's transaction. Returns its log position.
    pub async fn emit(&self, conn: &mut PgConnection, event: &NewEvent) -> Result<i64> {
        let payload_type = self.payload_type(&mut *conn).await?;
        self.write_one(conn, event, &self.emit[payload_type as usize], payload_type)
            .await
    }

    /// Insert several events with one statement; returns their row ids in the order given
    /// (ids increase in that order). In message style, one emit per event, in that order.
    pub async fn enqueue_many(
        &self,
        conn: &mut PgConnection,
        events: &[NewEvent],
    ) -> Result<Vec<i64>> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        if self.style(&mut *conn).await? == CaptureStyle::Message {
            let mut positions = Vec::with_capacity(events.len());
            for event in events {
                positions.push(self.emit(&mut *conn, event).await?);
            }
            return Ok(positions);
        }
        let payload_type = self.payload_type(&mut *conn).await?;
        let n = events.len();
        let mut event_ids = Vec::with_capacity(n);
        let mut aggregate_types = Vec::with_capacity(n);
        let mut aggregate_ids = Vec::with_capacity(n);
        let mut event_types = Vec::with_capacity(n);
        let mut texts = Vec::new();
        let mut bytes = Vec::new();
        let mut headers = Vec::with_capacity(n);
        let mut destinations = Vec::with_capacity(n);
        for event in events {
            event_ids.push(event.event_id_or_new());
            aggregate_types.push(event.aggregate_type.as_str());
            aggregate_ids.push(event.aggregate_id.as_str());
            event_types.push(event.event_type.as_str());
            match payload_type {
                PayloadType::Binary => bytes.push(event.payload.as_bytes()),
                _ => texts.push(event.payload.text_for(self.table(), payload_type)?),
            }
            headers.push(to_json(&event.headers, "headers")?);
            destinations.push(event.destination.as_deref());
        }
        let query = sqlx::query(&self.insert_many[payload_type as usize])
            .bind(&event_ids)
            .bind(&aggregate_types)
            .bind(&aggregate_ids)
            .bind(&event_types);
        let query = match payload_type {
            PayloadType::Binary => query.bind(&bytes),
            _ => query.bind(&texts),
        };
        let rows = query
            .bind(&headers)
            .bind(&destinations)
            .fetch_all(conn)
            .await
            .map_err(|e| self.error(e))?;
        let mut by_event_id = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: i64 = row.try_get(0).map_err(|e| self.error(e))?;
            let event_id: Uuid = row.try_get(1).map_err(|e| self.error(e))?;
            by_event_id.insert(event_id, id);
        }
        event_ids
            .iter()
            .map(|event_id| {
                by_event_id.get(event_id).copied().ok_or_else(|| {
                    Error::new(
                        ErrorKind::Other,
                        format!(
                            "inserting into {}: no id returned for event {event_id}",
                            self.target.table
                        ),
                    )
                })
            })
            .collect()
    }

    fn error(&self, error: sqlx::Error) -> Error {
        insert_error::<Postgres>(error, &self.target)
    }
}

static DEFAULT_OUTBOX: LazyLock<Outbox> = LazyLock::new(|| {
    Outbox::for_table(&TableName::parse("outbox").expect("\"outbox\" is a valid table name"))
});

/// The default table's handle, forgetting the payload type: `outbox` may be a table of another
/// type on each connection (another database, another `search_path`).
fn default_outbox() -> Outbox {
    Outbox {
        payload_type: Arc::default(),
        style: Arc::default(),
        ..DEFAULT_OUTBOX.clone()
    }
}

/// Insert one event into the table `outbox` on `conn` (the caller's transaction: `&mut *tx`).
/// Each call reads the table's payload type first; an [`Outbox`] handle reads it once.
pub async fn enqueue(conn: &mut PgConnection, event: &NewEvent) -> Result<i64> {
    default_outbox().enqueue(conn, event).await
}

/// Insert several events into the table `outbox` with one statement; ids in the order given.
/// Each call reads the table's payload type first; an [`Outbox`] handle reads it once.
pub async fn enqueue_many(conn: &mut PgConnection, events: &[NewEvent]) -> Result<Vec<i64>> {
    default_outbox().enqueue_many(conn, events).await
}
