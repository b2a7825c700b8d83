//! Store sides of the benchmark: PostgreSQL and MySQL/MariaDB.

use std::sync::Arc;

use async_trait::async_trait;
use outboxkit_core::{NewEvent, OutboxEvent, Sink, Store};
use outboxkit_store_mysql::{MySqlStore, MySqlStoreConfig};
use outboxkit_store_postgres::{Outbox, PostgresStore, PostgresStoreConfig};
use sqlx::Row;
use uuid::Uuid;

use crate::pair::{StoreSide, ORDERS, PAD, SHARDS, TABLE, WRITER_CONNECTIONS};

/// PostgreSQL side.
pub struct PostgresSide {
    store: Arc<PostgresStore>,
    url: String,
    outbox: Outbox,
    version: String,
}

impl PostgresSide {
    pub async fn open(url: &str) -> Result<Self, String> {
        let mut config = PostgresStoreConfig::new(url).table(TABLE).shards(SHARDS);
        config.pool_size = WRITER_CONNECTIONS as u32;
        let store = PostgresStore::connect(config)
            .await
            .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let version: String =
            sqlx::query_scalar("SELECT 'PostgreSQL ' || current_setting('server_version')")
                .fetch_one(store.pool())
                .await
                .map_err(|e| e.to_string())?;
        Ok(Self {
            store: Arc::new(store),
            url: url.to_owned(),
            outbox: Outbox::new(TABLE).map_err(|e| e.to_string())?,
            version,
        })
    }

    async fn exec(&self, sql: &str) -> Result<(), String> {
        sqlx::raw_sql(sql)
            .execute(self.store.pool())
            .await
            .map(drop)
            .map_err(|e| format!("{sql}: {e}"))
    }
}

#[async_trait]
impl StoreSide for PostgresSide {
    fn describe(&self) -> String {
        self.version.clone()
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn relay_toml(&self) -> String {
        format!(
            "[store]\nkind = \"postgres\"\nurl = \"{}\"\ntable = \"{TABLE}\"\n",
            self.url
        )
    }

    async fn load(&self, events: u64, aggregates: u64) -> Result<(), String> {
        self.exec(&format!("TRUNCATE {TABLE}")).await?;
        sqlx::query(&format!(
            "INSERT INTO {TABLE} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', ((g - 1) % $2)::text, 'OrderChanged', \
                    jsonb_build_object('n', g, 'order_id', (g - 1) % $2, 'pad', repeat('x', {PAD})) \
             FROM generate_series(1, $1) g"
        ))
        .bind(events as i64)
        .bind(aggregates as i64)
        .execute(self.store.pool())
        .await
        .map_err(|e| format!("loading {events} events: {e}"))?;
        self.exec(&format!("VACUUM ANALYZE {TABLE}")).await
    }

    async fn any_pending(&self) -> Result<bool, String> {
        sqlx::query_scalar(&format!(
            "SELECT EXISTS (SELECT 1 FROM {TABLE} WHERE published_at IS NULL AND dead_at IS NULL)"
        ))
        .fetch_one(self.store.pool())
        .await
        .map_err(|e| e.to_string())
    }

    async fn reset_business(&self, aggregates: u64) -> Result<(), String> {
        self.exec(&format!(
            "TRUNCATE {TABLE}; DROP TABLE IF EXISTS {ORDERS}; \
             CREATE TABLE {ORDERS} (id bigint PRIMARY KEY, version bigint NOT NULL); \
             INSERT INTO {ORDERS} SELECT g, 0 FROM generate_series(1, {aggregates}) g"
        ))
        .await?;
        self.exec(&format!("VACUUM ANALYZE {TABLE}")).await?;
        self.exec(&format!("VACUUM ANALYZE {ORDERS}")).await
    }

    async fn write_one(&self, order: i64) -> Result<Uuid, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        let version: i64 = sqlx::query(&format!(
            "UPDATE {ORDERS} SET version = version + 1 WHERE id = $1 RETURNING version"
        ))
        .bind(order)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| e.to_string())?
        .get(0);
        let event = NewEvent::new(
            "order",
            order.to_string(),
            "OrderChanged",
            serde_json::json!({ "order_id": order, "version": version, "pad": "x".repeat(PAD) }),
        )
        .event_id(Uuid::now_v7());
        self.outbox
            .enqueue(&mut tx, &event)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(event.event_id_or_new())
    }

    async fn article_round(&self, sink: &dyn Sink) -> Result<usize, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        let rows = sqlx::query(&format!(
            "SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload::text, created_at \
             FROM {TABLE} WHERE published_at IS NULL AND dead_at IS NULL \
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
        ))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let event = OutboxEvent {
                id: row.get(0),
                event_id: row.get(1),
                aggregate_type: row.get(2),
                aggregate_id: row.get(3),
                event_type: row.get(4),
                payload: row.get(5),
                headers: Default::default(),
                destination: None,
                created_at: row.get(6),
                attempts: 0,
                shard: 0,
            };
            // One by one, waiting for each acknowledgement, inside the transaction.
            publish_one(sink, &event).await?;
            ids.push(event.id);
        }
        sqlx::query(&format!(
            "UPDATE {TABLE} SET published_at = now() WHERE id = ANY($1)"
        ))
        .bind(&ids)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(ids.len())
    }
}

/// MySQL / MariaDB side.
pub struct MySqlSide {
    store: Arc<MySqlStore>,
    url: String,
    outbox: outboxkit_store_mysql::Outbox,
    version: String,
}

impl MySqlSide {
    pub async fn open(url: &str) -> Result<Self, String> {
        let mut config = MySqlStoreConfig::new(url);
        config.table = TABLE.to_owned();
        config.shards = SHARDS;
        config.pool_size = WRITER_CONNECTIONS as u32;
        let store = MySqlStore::connect(config)
            .await
            .map_err(|e| format!("MySQL at {url}: {e}"))?;
        store.migrate().await.map_err(|e| e.to_string())?;
        let version: String =
            sqlx::query_scalar("SELECT CONCAT(@@version_comment, ' ', VERSION())")
                .fetch_one(store.pool())
                .await
                .map_err(|e| e.to_string())?;
        Ok(Self {
            outbox: store.outbox().clone(),
            store: Arc::new(store),
            url: url.to_owned(),
            version,
        })
    }

    async fn exec(&self, sql: &str) -> Result<(), String> {
        sqlx::raw_sql(sql)
            .execute(self.store.pool())
            .await
            .map(drop)
            .map_err(|e| format!("{sql}: {e}"))
    }
}

#[async_trait]
impl StoreSide for MySqlSide {
    fn describe(&self) -> String {
        self.version.clone()
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn relay_toml(&self) -> String {
        format!(
            "[store]\nkind = \"mysql\"\nurl = \"{}\"\ntable = \"{TABLE}\"\n",
            self.url
        )
    }

    async fn load(&self, events: u64, aggregates: u64) -> Result<(), String> {
        if events > 1_000_000 {
            return Err("--events: the MySQL side loads at most 1,000,000 events".into());
        }
        self.exec(&format!("TRUNCATE TABLE {TABLE}")).await?;
        // One INSERT ... SELECT over a generated sequence (digits cross-joined: MySQL 8 and
        // MariaDB alike), in id order.
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        sqlx::query(&format!(
            "INSERT INTO {TABLE} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', CAST(n MOD ? AS CHAR), 'OrderChanged', \
                    JSON_OBJECT('n', n + 1, 'order_id', n MOD ?, 'pad', REPEAT('x', {PAD})) \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f, {digits} g) nums \
             WHERE n < ? ORDER BY n"
        ))
        .bind(aggregates)
        .bind(aggregates)
        .bind(events)
        .execute(self.store.pool())
        .await
        .map_err(|e| format!("loading {events} events: {e}"))?;
        self.exec(&format!("ANALYZE TABLE {TABLE}")).await
    }

    async fn any_pending(&self) -> Result<bool, String> {
        let row: Option<i32> =
            sqlx::query_scalar(&format!("SELECT 1 FROM {TABLE} WHERE pending = 1 LIMIT 1"))
                .fetch_optional(self.store.pool())
                .await
                .map_err(|e| e.to_string())?;
        Ok(row.is_some())
    }

    async fn reset_business(&self, aggregates: u64) -> Result<(), String> {
        let values: Vec<String> = (1..=aggregates).map(|g| format!("({g}, 0)")).collect();
        self.exec(&format!(
            "TRUNCATE TABLE {TABLE}; DROP TABLE IF EXISTS {ORDERS}; \
             CREATE TABLE {ORDERS} (id BIGINT PRIMARY KEY, version BIGINT NOT NULL) ENGINE = InnoDB; \
             INSERT INTO {ORDERS} VALUES {}; ANALYZE TABLE {TABLE}, {ORDERS}",
            values.join(", ")
        ))
        .await
    }

    async fn write_one(&self, order: i64) -> Result<Uuid, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        sqlx::query(&format!(
            "UPDATE {ORDERS} SET version = version + 1 WHERE id = ?"
        ))
        .bind(order)
        .execute(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let event = NewEvent::new(
            "order",
            order.to_string(),
            "OrderChanged",
            serde_json::json!({ "order_id": order, "pad": "x".repeat(PAD) }),
        )
        .event_id(Uuid::now_v7());
        self.outbox
            .enqueue(&mut tx, &event)
            .await
            .map_err(|e| e.to_string())?;
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(event.event_id_or_new())
    }

    async fn article_round(&self, sink: &dyn Sink) -> Result<usize, String> {
        let mut tx = self.store.pool().begin().await.map_err(|e| e.to_string())?;
        let rows = sqlx::query(&format!(
            "SELECT id, CAST(event_id AS CHAR), CAST(aggregate_type AS CHAR), \
                    CAST(aggregate_id AS CHAR), CAST(event_type AS CHAR), \
                    CAST(payload AS CHAR), created_at \
             FROM {TABLE} WHERE pending = 1 \
             ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED"
        ))
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| e.to_string())?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let text = |i: usize| row.try_get::<String, _>(i).map_err(|e| e.to_string());
            let created_at: chrono::NaiveDateTime = row.try_get(6).map_err(|e| e.to_string())?;
            let event = OutboxEvent {
                id: row.try_get(0).map_err(|e| e.to_string())?,
                event_id: Uuid::parse_str(&text(1)?).map_err(|e| e.to_string())?,
                aggregate_type: text(2)?,
                aggregate_id: text(3)?,
                event_type: text(4)?,
                payload: text(5)?,
                headers: Default::default(),
                destination: None,
                created_at: created_at.and_utc(),
                attempts: 0,
                shard: 0,
            };
            publish_one(sink, &event).await?;
            ids.push(event.id);
        }
        if !ids.is_empty() {
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            sqlx::query(&format!(
                "UPDATE {TABLE} SET published_at = UTC_TIMESTAMP(6) WHERE id IN ({})",
                list.join(",")
            ))
            .execute(&mut *tx)
            .await
            .map_err(|e| e.to_string())?;
        }
        tx.commit().await.map_err(|e| e.to_string())?;
        Ok(ids.len())
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
