//! The article's relay, the baseline: one round is a transaction that locks 100 pending rows
//! with `FOR UPDATE SKIP LOCKED`, publishes them one by one awaiting each acknowledgement, marks
//! them `published_at` and commits. Its SQL is the store's own dialect.

use std::future::Future;

use outboxkit_core::{OutboxEvent, Payload, Sink};
use sqlx::Row;
use uuid::Uuid;

/// The database the article's relay runs on (the store side's pool).
pub enum Article {
    Postgres(sqlx::PgPool),
    MySql(sqlx::MySqlPool),
}

impl Article {
    /// One round over `table`; the rows handled.
    pub async fn round(&self, table: &str, sink: &dyn Sink) -> Result<usize, String> {
        match self {
            Self::Postgres(pool) => round(pool, table, sink).await,
            Self::MySql(pool) => round(pool, table, sink).await,
        }
    }
}

/// The round's statements in a database's dialect.
trait Dialect: sqlx::Database {
    /// Up to 100 pending rows of `table` in `id` order, locked, leaving out rows another
    /// transaction holds (the article's locking clause): `id`, `event_id`, `aggregate_type`,
    /// `aggregate_id`, `event_type`, the payload as text and `created_at`.
    fn select(table: &str) -> String;

    /// The event of a selected row.
    fn event(row: &Self::Row) -> Result<OutboxEvent, String>;

    /// Mark the rows `ids` of `table` published, in the round's transaction `tx`.
    fn mark(
        tx: &mut Self::Connection,
        table: &str,
        ids: &[i64],
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// One round of the article's relay on `pool`: select and lock, publish one by one, mark,
/// commit.
async fn round<D: Dialect>(
    pool: &sqlx::Pool<D>,
    table: &str,
    sink: &dyn Sink,
) -> Result<usize, String>
where
    for<'c> &'c mut D::Connection: sqlx::Executor<'c, Database = D>,
    D::Arguments: sqlx::IntoArguments<D>,
{
    let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
    let rows = sqlx::query(sqlx::AssertSqlSafe(D::select(table)))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
    let mut ids = Vec::with_capacity(rows.len());
    for row in &rows {
        let event = D::event(row)?;
        // One by one, waiting for each acknowledgement, inside the transaction.
        publish_one(sink, &event).await?;
        ids.push(event.id);
    }
    D::mark(&mut tx, table, &ids).await?;
    tx.commit().await.map_err(|e| e.to_string())?;
    Ok(ids.len())
}

impl Dialect for sqlx::Postgres {
    fn select(table: &str) -> String {
        format!(
            "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text, created_at \
             FROM {table} WHERE published_at IS NULL AND dead_at IS NULL \
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
        )
    }

    fn event(row: &sqlx::postgres::PgRow) -> Result<OutboxEvent, String> {
        Ok(OutboxEvent {
            event_id: row.get(1),
            created_at: row.get(6),
            ..OutboxEvent::new(
                row.get(0),
                row.get::<String, _>(2),
                row.get::<String, _>(3),
                row.get::<String, _>(4),
                Payload::Json(row.get(5)),
            )
        })
    }

    async fn mark(tx: &mut sqlx::PgConnection, table: &str, ids: &[i64]) -> Result<(), String> {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {table} SET published_at = now() WHERE id = ANY($1)"
        )))
        .bind(ids)
        .execute(tx)
        .await
        .map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Dialect for sqlx::MySql {
    fn select(table: &str) -> String {
        format!(
            "SELECT id, CAST(event_id AS CHAR), CAST(aggregate_type AS CHAR), \
                    CAST(aggregate_id AS CHAR), CAST(event_type AS CHAR), \
                    CAST(payload AS CHAR), created_at \
             FROM {table} WHERE pending = 1 \
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
        )
    }

    fn event(row: &sqlx::mysql::MySqlRow) -> Result<OutboxEvent, String> {
        let text = |i: usize| row.try_get::<String, _>(i).map_err(|e| e.to_string());
        let created_at: chrono::NaiveDateTime = row.try_get(6).map_err(|e| e.to_string())?;
        Ok(OutboxEvent {
            event_id: Uuid::parse_str(&text(1)?).map_err(|e| e.to_string())?,
            created_at: created_at.and_utc(),
            ..OutboxEvent::new(
                row.try_get(0).map_err(|e| e.to_string())?,
                text(2)?,
                text(3)?,
                text(4)?,
                Payload::Json(text(5)?),
            )
        })
    }

    async fn mark(tx: &mut sqlx::MySqlConnection, table: &str, ids: &[i64]) -> Result<(), String> {
        if !ids.is_empty() {
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {table} SET published_at = UTC_TIMESTAMP(6) WHERE id IN ({})",
                list.join(",")
            )))
            .execute(tx)
            .await
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The article's publish: one event, waiting for its acknowledgement.
async fn publish_one(sink: &dyn Sink, event: &OutboxEvent) -> Result<(), String> {
    let outcome = sink
        .publish(std::slice::from_ref(event))
        .await
        .map_err(|e| e.to_string())?;
    if !outcome.iter().all(|o| o.is_published()) {
        return Err("the broker refused an event in the article's run".into());
    }
    Ok(())
}
