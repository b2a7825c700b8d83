//! One store × sink pair: the pieces each measurement needs. A store side and a broker side are
//! combined; adding a pair is adding a side.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use outbox_core::{ClaimRequest, MarkMode, NewEvent, OutboxEvent, Sink, Store};
use outbox_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
use outbox_store_postgres::{Outbox, PostgresStore, PostgresStoreConfig};
use sqlx::Row;
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::Args;

const TABLE: &str = "bench_outbox";
const ORDERS: &str = "bench_orders";
const SHARDS: u32 = 64;
/// Padding that makes each payload about 300 bytes of JSON.
const PAD: usize = 240;

/// Drain result.
#[derive(Debug, Clone, Copy)]
pub struct Drain {
    pub rate: f64,
    pub peak_rss_mib: f64,
}

/// Latency result.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub events: usize,
}

/// Everything measured for a pair.
#[async_trait]
pub trait PairBench: Send + Sync {
    async fn drain(&self, events: u64, aggregates: u64, relays: u32) -> Result<Drain, String>;
    async fn article(&self, events: u64, aggregates: u64) -> Result<f64, String>;
    async fn database_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String>;
    async fn broker_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String>;
    async fn latency(
        &self,
        rate: u64,
        duration: Duration,
        aggregates: u64,
    ) -> Result<Latency, String>;
    async fn writer_throughput(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
        relay_running: bool,
    ) -> Result<f64, String>;
}

/// The database side of a pair.
#[async_trait]
trait StoreSide: Send + Sync {
    fn store(&self) -> Arc<dyn Store>;
    /// `[store]` of the relay's configuration.
    fn relay_toml(&self) -> String;
    /// Empty the outbox and load `events` pending rows spread over `aggregates`.
    async fn load(&self, events: u64, aggregates: u64) -> Result<(), String>;
    /// Pending rows.
    async fn pending(&self) -> Result<i64, String>;
    /// Recreate the business table with `aggregates` rows and empty the outbox.
    async fn reset_business(&self, aggregates: u64) -> Result<(), String>;
    /// One business transaction: update the order row, enqueue its event, commit.
    async fn write_one(&self, order: i64) -> Result<Uuid, String>;
    /// One round of the article's relay: a transaction that locks 100 rows with
    /// `FOR UPDATE SKIP LOCKED`, publishes them one by one awaiting each ack, marks
    /// `published_at`, commits. Returns the rows handled.
    async fn article_round(&self, sink: &dyn Sink) -> Result<usize, String>;
}

/// The broker side of a pair.
#[async_trait]
trait BrokerSide: Send + Sync {
    fn sink(&self) -> Arc<dyn Sink>;
    /// `[sink]` of the relay's configuration.
    fn relay_toml(&self) -> String;
    /// Forget everything delivered.
    async fn reset(&self) -> Result<(), String>;
    /// Messages delivered so far.
    async fn delivered(&self) -> Result<u64, String>;
    /// Stream (event id, receive time) of messages delivered from now on.
    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String>;
}

/// Open a pair by kinds.
pub async fn open(args: &Args, store: &str, sink: &str) -> Result<Box<dyn PairBench>, String> {
    let store: Arc<dyn StoreSide> = match store {
        "postgres" => Arc::new(PostgresSide::open(&args.postgres_url).await?),
        other => {
            return Err(format!(
                "--pairs: store \"{other}\" is not benchmarked (known: postgres)"
            ))
        }
    };
    let broker: Box<dyn BrokerSide> = match sink {
        "redis-streams" => Box::new(RedisSide::open(&args.redis_url).await?),
        other => {
            return Err(format!(
                "--pairs: sink \"{other}\" is not benchmarked (known: redis-streams)"
            ))
        }
    };
    let dir = std::env::temp_dir().join("outbox-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(Box::new(Pair {
        batch: args.batch_size,
        store,
        broker,
        relay_bin: args.relay_bin.clone(),
        dir,
    }))
}

struct Pair {
    batch: usize,
    store: Arc<dyn StoreSide>,
    broker: Box<dyn BrokerSide>,
    relay_bin: PathBuf,
    dir: PathBuf,
}

/// A relay child process.
struct RelayProcess(Child);

impl RelayProcess {
    fn peak_rss_mib(&self) -> f64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.0.id())).unwrap_or_default();
        status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    }

    fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Pair {
    fn config(&self) -> Result<PathBuf, String> {
        let text = format!(
            "{}\n{}\n[relay]\nbatch_size = {}\n\n[server]\nlisten = \"\"\n\n[log]\nlevel = \"warn\"\n",
            self.store.relay_toml(),
            self.broker.relay_toml(),
            self.batch
        );
        let path = self.dir.join("relay.toml");
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        Ok(path)
    }

    fn start_relay(&self, config: &Path, n: u32) -> Result<RelayProcess, String> {
        let log = std::fs::File::create(self.dir.join(format!("relay-{n}.log")))
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.relay_bin)
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("OUTBOX_RELAY__RELAY_ID", format!("bench-{n}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.relay_bin.display()))?;
        Ok(RelayProcess(child))
    }
}

fn sample_event(n: u64, aggregates: u64) -> OutboxEvent {
    let order = (n - 1) % aggregates;
    OutboxEvent {
        id: n as i64,
        event_id: Uuid::now_v7(),
        aggregate_type: "order".into(),
        aggregate_id: order.to_string(),
        event_type: "OrderChanged".into(),
        payload: serde_json::json!({ "n": n, "order_id": order, "pad": "x".repeat(PAD) })
            .to_string(),
        headers: Default::default(),
        destination: None,
        created_at: Utc::now(),
        attempts: 0,
        shard: 0,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[async_trait]
impl PairBench for Pair {
    async fn drain(&self, events: u64, aggregates: u64, relays: u32) -> Result<Drain, String> {
        self.broker.reset().await?;
        self.store.load(events, aggregates).await?;
        let config = self.config()?;
        let started = Instant::now();
        let processes: Vec<RelayProcess> = (0..relays)
            .map(|n| self.start_relay(&config, n))
            .collect::<Result<_, _>>()?;
        let deadline = started + Duration::from_secs(900);
        loop {
            if self.broker.delivered().await? >= events {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "drain of {events} events did not finish in 15 minutes"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        // Acknowledged is not yet marked: wait for the table too (not timed).
        while self.store.pending().await? > 0 {
            if Instant::now() > deadline {
                return Err("rows still pending after the broker got them all".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let peak_rss_mib = processes
            .first()
            .map(RelayProcess::peak_rss_mib)
            .unwrap_or(0.0);
        for p in processes {
            p.stop();
        }
        Ok(Drain {
            rate: events as f64 / elapsed.as_secs_f64(),
            peak_rss_mib,
        })
    }

    async fn article(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.broker.reset().await?;
        self.store.load(events, aggregates).await?;
        let sink = self.broker.sink();
        let started = Instant::now();
        let mut done = 0;
        loop {
            let n = self.store.article_round(sink.as_ref()).await?;
            if n == 0 {
                break;
            }
            done += n;
        }
        if (done as u64) < events {
            return Err(format!("the article's relay published {done} of {events}"));
        }
        Ok(done as f64 / started.elapsed().as_secs_f64())
    }

    async fn database_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.store.load(events, aggregates).await?;
        let store = self.store.store();
        let mut session = store
            .open_session("bench-ceiling")
            .await
            .map_err(|e| e.to_string())?;
        for shard in 0..session.shard_count() as i32 {
            session
                .try_acquire(shard)
                .await
                .map_err(|e| e.to_string())?;
        }
        let started = Instant::now();
        let mut done = 0u64;
        loop {
            let batch = session
                .claim(&ClaimRequest {
                    limit: self.batch,
                    exclude_ids: &[],
                    dead_holds_aggregate: false,
                })
                .await
                .map_err(|e| e.to_string())?;
            if batch.is_empty() {
                break;
            }
            let ids: Vec<i64> = batch.iter().map(|e| e.id).collect();
            session
                .mark_published(&ids, MarkMode::Delete)
                .await
                .map_err(|e| e.to_string())?;
            done += ids.len() as u64;
        }
        let rate = done as f64 / started.elapsed().as_secs_f64();
        session.close().await.map_err(|e| e.to_string())?;
        Ok(rate)
    }

    async fn broker_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.broker.reset().await?;
        let sink = self.broker.sink();
        let all: Vec<OutboxEvent> = (1..=events).map(|n| sample_event(n, aggregates)).collect();
        let started = Instant::now();
        for chunk in all.chunks(self.batch) {
            let outcomes = sink.publish(chunk).await.map_err(|e| e.to_string())?;
            if !outcomes.iter().all(|o| o.is_published()) {
                return Err("the broker refused events during the ceiling run".into());
            }
        }
        Ok(events as f64 / started.elapsed().as_secs_f64())
    }

    async fn latency(
        &self,
        rate: u64,
        duration: Duration,
        aggregates: u64,
    ) -> Result<Latency, String> {
        self.broker.reset().await?;
        self.store.reset_business(aggregates).await?;
        let config = self.config()?;
        let relay = self.start_relay(&config, 0)?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut received = self.broker.consume().await?;
        let committed: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();

        // Steady writes: every millisecond, start the commits due by then.
        let started = Instant::now();
        let mut issued = 0u64;
        let mut tasks = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut order = 0u64;
        while started.elapsed() < duration {
            tick.tick().await;
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while issued < due {
                issued += 1;
                order = (order + 7) % aggregates;
                let (store, committed) = (self.store.clone(), committed.clone());
                tasks.spawn(async move {
                    let id = store.write_one(order as i64 + 1).await?;
                    committed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id, Instant::now());
                    Ok::<(), String>(())
                });
            }
            while let Some(r) = tasks.try_join_next() {
                r.map_err(|e| e.to_string())??;
            }
        }
        while let Some(r) = tasks.join_next().await {
            r.map_err(|e| e.to_string())??;
        }
        let expected = committed.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut arrivals: HashMap<Uuid, Instant> = HashMap::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while arrivals.len() < expected && Instant::now() < deadline {
            match tokio::time::timeout(Duration::from_millis(500), received.recv()).await {
                Ok(Some((id, at))) => {
                    arrivals.entry(id).or_insert(at);
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        relay.stop();
        let committed = committed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut ms: Vec<f64> = committed
            .iter()
            .filter_map(|(id, c)| {
                arrivals
                    .get(id)
                    .map(|a| a.saturating_duration_since(*c).as_secs_f64() * 1000.0)
            })
            .collect();
        if ms.len() < committed.len() {
            return Err(format!(
                "latency run: {} of {} events arrived",
                ms.len(),
                committed.len()
            ));
        }
        ms.sort_by(f64::total_cmp);
        Ok(Latency {
            p50_ms: percentile(&ms, 50.0),
            p99_ms: percentile(&ms, 99.0),
            max_ms: ms.last().copied().unwrap_or(0.0),
            events: ms.len(),
        })
    }

    async fn writer_throughput(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
        relay_running: bool,
    ) -> Result<f64, String> {
        self.broker.reset().await?;
        self.store.reset_business(aggregates).await?;
        let relay = if relay_running {
            let config = self.config()?;
            let relay = self.start_relay(&config, 0)?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            Some(relay)
        } else {
            None
        };
        let started = Instant::now();
        let store = &self.store;
        let results = futures_join_all((0..writers).map(|w| async move {
            let mut n = 0u64;
            let mut order = w;
            while started.elapsed() < duration {
                order = (order + writers) % aggregates;
                store.write_one(order as i64 + 1).await?;
                n += 1;
            }
            Ok::<u64, String>(n)
        }))
        .await;
        let elapsed = started.elapsed();
        if let Some(relay) = relay {
            relay.stop();
        }
        let mut total = 0;
        for r in results {
            total += r?;
        }
        Ok(total as f64 / elapsed.as_secs_f64())
    }
}

/// Run futures concurrently on this task and collect their outputs in order.
async fn futures_join_all<F: std::future::Future>(
    futures: impl IntoIterator<Item = F>,
) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futures.iter_mut().enumerate() {
            if outputs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outputs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

/// PostgreSQL side.
struct PostgresSide {
    store: Arc<PostgresStore>,
    url: String,
    outbox: Outbox,
}

impl PostgresSide {
    async fn open(url: &str) -> Result<Self, String> {
        let mut config = PostgresStoreConfig::new(url).table(TABLE).shards(SHARDS);
        config.pool_size = 40;
        let store = PostgresStore::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        store.migrate().await.map_err(|e| e.to_string())?;
        Ok(Self {
            store: Arc::new(store),
            url: url.to_owned(),
            outbox: Outbox::new(TABLE).map_err(|e| e.to_string())?,
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

    async fn pending(&self) -> Result<i64, String> {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {TABLE} WHERE published_at IS NULL AND dead_at IS NULL"
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
            let outcome = sink
                .publish(std::slice::from_ref(&event))
                .await
                .map_err(|e| e.to_string())?;
            if !outcome.iter().all(|o| o.is_published()) {
                return Err("the broker refused an event in the article's run".into());
            }
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

/// Redis Streams side: one stream, `bench.order`.
struct RedisSide {
    url: String,
    sink: Arc<RedisStreamsSink>,
    connection: redis::aio::MultiplexedConnection,
}

const STREAM: &str = "bench.order";

impl RedisSide {
    async fn open(url: &str) -> Result<Self, String> {
        let mut config = RedisStreamsConfig::new(url);
        config.stream = STREAM.to_owned();
        let sink = RedisStreamsSink::connect(config)
            .await
            .map_err(|e| e.to_string())?;
        let client = redis::Client::open(url).map_err(|e| e.to_string())?;
        let connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        Ok(Self {
            url: url.to_owned(),
            sink: Arc::new(sink),
            connection,
        })
    }
}

#[async_trait]
impl BrokerSide for RedisSide {
    fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    fn relay_toml(&self) -> String {
        format!(
            "[sink]\nkind = \"redis-streams\"\ndestination = \"{STREAM}\"\n\n[sink.redis_streams]\nurl = \"{}\"\n",
            self.url
        )
    }

    async fn reset(&self) -> Result<(), String> {
        redis::cmd("DEL")
            .arg(STREAM)
            .query_async::<()>(&mut self.connection.clone())
            .await
            .map_err(|e| e.to_string())
    }

    async fn delivered(&self) -> Result<u64, String> {
        redis::cmd("XLEN")
            .arg(STREAM)
            .query_async(&mut self.connection.clone())
            .await
            .map_err(|e| e.to_string())
    }

    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String> {
        let client = redis::Client::open(self.url.as_str()).map_err(|e| e.to_string())?;
        // A dedicated connection: XREAD BLOCK holds it.
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut last = "$".to_owned();
            loop {
                let reply: Result<Option<redis::streams::StreamReadReply>, _> = redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(1000)
                    .arg("BLOCK")
                    .arg(200)
                    .arg("STREAMS")
                    .arg(STREAM)
                    .arg(&last)
                    .query_async(&mut connection)
                    .await;
                let Ok(reply) = reply else { return };
                let now = Instant::now();
                for key in reply.map(|r| r.keys).unwrap_or_default() {
                    for entry in key.ids {
                        let id: String = entry.get("event_id").unwrap_or_default();
                        if let Ok(id) = Uuid::parse_str(&id) {
                            if tx.send((id, now)).is_err() {
                                return;
                            }
                        }
                        last = entry.id;
                    }
                }
            }
        });
        Ok(rx)
    }
}
