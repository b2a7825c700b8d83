//! `outbox-relay demo`: the whole story on this machine's PostgreSQL and broker.
//!
//! Writers run business transactions — each updates an `orders` row and enqueues its event in
//! the same transaction — while relays publish; then an independent reader reads the broker
//! back and checks that every event arrived and that, per order, events arrived in the order
//! the writers committed them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use outbox_core::{OutboxEvent, Outcome, Sink, SinkCapabilities};
use uuid::Uuid;

use crate::cli::Failure;
use crate::registry::Registry;

/// Flags of `outbox-relay demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Broker to relay to.
    #[arg(long, default_value = "redis-streams")]
    pub sink: String,
    /// Events to write (one business transaction each).
    #[arg(long, default_value_t = 5000)]
    pub events: u64,
    /// Orders (aggregates) the events are spread over.
    #[arg(long, default_value_t = 200)]
    pub aggregates: u64,
    /// Concurrent writer tasks.
    #[arg(long, default_value_t = 4)]
    pub writers: u64,
    /// Relays running at once (each with its own database session and shards).
    #[arg(long, default_value_t = 2)]
    pub relays: u32,
    /// Rows per claim.
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// PostgreSQL holding the demo tables.
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test"
    )]
    pub database_url: String,
    /// Redis for `--sink redis-streams`.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
}

const TABLE: &str = "outbox_demo";
const ORDERS: &str = "outbox_demo_orders";
const STREAM: &str = "outbox-demo.order";
const DEMO_SHARDS: u32 = 16;

/// Wraps the real sink to note when each event was acknowledged (commit→ack latency).
#[derive(Debug)]
struct AckClock {
    inner: Arc<dyn Sink>,
    acked: Mutex<HashMap<Uuid, Instant>>,
}

#[async_trait]
impl Sink for AckClock {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    fn capabilities(&self) -> SinkCapabilities {
        self.inner.capabilities()
    }
    fn destination(&self, event: &OutboxEvent) -> String {
        self.inner.destination(event)
    }
    async fn check(&self) -> outbox_core::Result<()> {
        self.inner.check().await
    }
    async fn publish(&self, batch: &[OutboxEvent]) -> outbox_core::Result<Vec<Outcome>> {
        let outcomes = self.inner.publish(batch).await?;
        let now = Instant::now();
        let mut acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        for (event, outcome) in batch.iter().zip(&outcomes) {
            if outcome.is_published() {
                acked.entry(event.event_id).or_insert(now);
            }
        }
        Ok(outcomes)
    }
}

/// Run the demo.
pub async fn run(args: &DemoArgs, registry: &Registry) -> Result<(), Failure> {
    if args.sink != "redis-streams" {
        let known = registry.sink_kinds().join(", ");
        return Err(Failure::config(format!(
            "demo --sink {}: the demo can read back from redis-streams (sinks compiled in: {known})",
            args.sink
        )));
    }
    if args.aggregates == 0 || args.writers == 0 || args.relays == 0 || args.events == 0 {
        return Err(Failure::config(
            "demo: --events, --aggregates, --writers and --relays must be at least 1",
        ));
    }
    imp::run(args).await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// What the independent reader found.
#[derive(Debug, Default)]
struct ReadBack {
    messages: u64,
    unique: HashSet<Uuid>,
    duplicates: u64,
    order_violations: u64,
}

/// Per order, the versions of first occurrences must increase (version = the writer's commit
/// order for that order row).
fn check_order(messages: &[(Uuid, String, i64)]) -> ReadBack {
    let mut out = ReadBack::default();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for (event_id, order, version) in messages {
        out.messages += 1;
        if !out.unique.insert(*event_id) {
            out.duplicates += 1;
            continue;
        }
        if let Some(prev) = last.insert(order.as_str(), *version) {
            if *version <= prev {
                out.order_violations += 1;
            }
        }
    }
    out
}

#[cfg(not(all(feature = "store-postgres", feature = "sink-redis-streams")))]
mod imp {
    use super::*;
    pub async fn run(_: &DemoArgs) -> Result<(), Failure> {
        Err(Failure::config(
            "demo needs the store-postgres and sink-redis-streams features",
        ))
    }
}

#[cfg(all(feature = "store-postgres", feature = "sink-redis-streams"))]
mod imp {
    use super::*;
    use outbox_core::{NewEvent, Relay, RelayConfig, Shutdown, Store};
    use outbox_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
    use outbox_store_postgres::{Outbox, PostgresStore, PostgresStoreConfig};
    use redis::AsyncCommands;
    use sqlx::Row;

    pub async fn run(args: &DemoArgs) -> Result<(), Failure> {
        let config = PostgresStoreConfig::new(args.database_url.clone())
            .table(TABLE)
            .shards(DEMO_SHARDS);
        let store = Arc::new(PostgresStore::connect(config).await?);
        store.migrate().await?;
        let pool = store.pool().clone();
        let db = |e: sqlx::Error| Failure::runtime(format!("preparing the demo tables: {e}"));
        sqlx::query(&format!("DELETE FROM {TABLE}"))
            .execute(&pool)
            .await
            .map_err(db)?;
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {ORDERS} (id bigint PRIMARY KEY, status text NOT NULL, version int NOT NULL)"
        ))
        .execute(&pool)
        .await
        .map_err(db)?;
        sqlx::query(&format!("TRUNCATE {ORDERS}"))
            .execute(&pool)
            .await
            .map_err(db)?;
        sqlx::query(&format!(
            "INSERT INTO {ORDERS} SELECT g, 'new', 0 FROM generate_series(1, $1) g"
        ))
        .bind(args.aggregates as i64)
        .execute(&pool)
        .await
        .map_err(db)?;

        let mut sink_config = RedisStreamsConfig::new(args.redis_url.clone());
        sink_config.stream = STREAM.to_owned();
        let redis_sink = RedisStreamsSink::connect(sink_config).await?;
        let redis_client = redis::Client::open(args.redis_url.as_str())
            .map_err(|e| Failure::config(format!("--redis-url: {e}")))?;
        let mut redis = redis_client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| Failure::runtime(format!("connecting to Redis: {e}")))?;
        let _: () = redis
            .del(STREAM)
            .await
            .map_err(|e| Failure::runtime(format!("clearing stream {STREAM}: {e}")))?;
        let sink = Arc::new(AckClock {
            inner: Arc::new(redis_sink),
            acked: Mutex::new(HashMap::new()),
        });

        println!(
            "outbox-relay demo: {} order events over {} orders, {} writers, {} relays\n  {} (tables {TABLE}, {ORDERS}) → Redis stream {STREAM}",
            args.events,
            args.aggregates,
            args.writers,
            args.relays,
            store.describe(),
        );

        // Relays.
        let (trigger, shutdown) = Shutdown::channel();
        let mut relays = Vec::new();
        let mut handles = Vec::new();
        for i in 0..args.relays {
            let relay = Relay::new(
                store.clone(),
                sink.clone(),
                RelayConfig {
                    batch_size: args.batch_size,
                    relay_id: Some(format!("demo-relay-{i}")),
                    rebalance_interval: Duration::from_millis(200),
                    ..RelayConfig::default()
                },
            )?;
            handles.push(relay.handle());
            relays.push(tokio::spawn(relay.run(shutdown.clone())));
        }

        // Let the relays share the shards out before the clock starts.
        let settle = Instant::now() + Duration::from_secs(5);
        while Instant::now() < settle {
            let owned: Vec<u32> = handles.iter().map(|h| h.shards_owned()).collect();
            let spread = owned.iter().sum::<u32>() == DEMO_SHARDS
                && (args.relays > DEMO_SHARDS || owned.iter().all(|n| *n > 0));
            if spread {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Writers: each transaction updates its order row (locking it) and enqueues the event.
        let committed: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
        let written = Arc::new(AtomicU64::new(0));
        let outbox = Outbox::new(TABLE)?;
        let started = Instant::now();
        let mut writers = Vec::new();
        for w in 0..args.writers {
            let share = args.events / args.writers + u64::from(w < args.events % args.writers);
            let (pool, outbox, committed, written) = (
                pool.clone(),
                outbox.clone(),
                committed.clone(),
                written.clone(),
            );
            let aggregates = args.aggregates;
            writers.push(tokio::spawn(async move {
                let mut rng = fastrand_seed(w);
                for _ in 0..share {
                    let order = (rng() % aggregates) as i64 + 1;
                    let mut tx = pool.begin().await?;
                    let row = sqlx::query(&format!(
                        "UPDATE {ORDERS} SET version = version + 1, \
                         status = (ARRAY['placed','paid','packed','shipped','delivered'])[1 + (version % 5)] \
                         WHERE id = $1 RETURNING version, status"
                    ))
                    .bind(order)
                    .fetch_one(&mut *tx)
                    .await?;
                    let version: i32 = row.get(0);
                    let status: String = row.get(1);
                    let event = NewEvent::new(
                        "order",
                        order.to_string(),
                        format!("Order{}", capitalize(&status)),
                        serde_json::json!({ "order_id": order, "version": version, "status": status }),
                    );
                    let event_id = event.event_id_or_new();
                    outbox
                        .enqueue(&mut tx, &event.event_id(event_id))
                        .await
                        .map_err(|e| sqlx::Error::Protocol(e.full_message()))?;
                    tx.commit().await?;
                    committed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(event_id, Instant::now());
                    written.fetch_add(1, Ordering::Relaxed);
                }
                Ok::<(), sqlx::Error>(())
            }));
        }

        // Progress until every event is acknowledged.
        let published = || handles.iter().map(|h| h.published()).sum::<u64>();
        let deadline = Instant::now() + Duration::from_secs(30 + args.events / 100);
        let mut last_print = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let (w, p) = (written.load(Ordering::Relaxed), published());
            if last_print.elapsed() >= Duration::from_millis(500) || p >= args.events {
                println!(
                    "  [{:>5.1}s] written {w:>7}/{} · published {p:>7} · relays ready {}/{}",
                    started.elapsed().as_secs_f64(),
                    args.events,
                    handles.iter().filter(|h| h.is_ready()).count(),
                    handles.len()
                );
                last_print = Instant::now();
            }
            if p >= args.events {
                break;
            }
            if Instant::now() > deadline {
                break;
            }
        }
        let write_elapsed = started.elapsed();
        for w in writers {
            match w.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(Failure::runtime(format!("a writer failed: {e}"))),
                Err(e) => return Err(Failure::runtime(format!("a writer panicked: {e}"))),
            }
        }
        trigger.trigger();
        for r in relays {
            let _ = r.await;
        }

        // Independent reader: the whole stream, from the broker.
        let mut messages: Vec<(Uuid, String, i64)> = Vec::with_capacity(args.events as usize);
        let mut cursor = "-".to_owned();
        loop {
            let reply: redis::streams::StreamRangeReply = redis
                .xrange_count(STREAM, &cursor, "+", 5000)
                .await
                .map_err(|e| Failure::runtime(format!("reading stream {STREAM} back: {e}")))?;
            let n = reply.ids.len();
            for entry in &reply.ids {
                let event_id: String = entry.get("event_id").unwrap_or_default();
                let payload: String = entry.get("payload").unwrap_or_default();
                let doc: serde_json::Value = serde_json::from_str(&payload).unwrap_or_default();
                messages.push((
                    Uuid::parse_str(&event_id).unwrap_or_default(),
                    doc["order_id"].to_string(),
                    doc["version"].as_i64().unwrap_or(-1),
                ));
            }
            match reply.ids.last() {
                Some(last) if n == 5000 => cursor = format!("({}", last.id),
                _ => break,
            }
        }
        let read = check_order(&messages);
        let committed = committed.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let missing = committed
            .keys()
            .filter(|id| !read.unique.contains(id))
            .count();

        let acked = sink.acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut latencies: Vec<Duration> = committed
            .iter()
            .filter_map(|(id, c)| acked.get(id).map(|a| a.saturating_duration_since(*c)))
            .collect();
        latencies.sort();
        let first_ack = acked.values().min().copied();
        let last_ack = acked.values().max().copied();
        let relay_secs = match (first_ack, last_ack) {
            (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
            _ => write_elapsed.as_secs_f64(),
        };
        let writes = committed.len() as u64;
        let published = published();
        let status = store.status().await?;

        println!();
        println!(
            "events written       {writes} (each in a business transaction with its order row)"
        );
        println!("events published     {published} (acknowledged by Redis and marked)");
        println!(
            "read back            {} messages, {} distinct events, {} missing",
            read.messages,
            read.unique.len(),
            missing
        );
        println!("duplicates           {}", read.duplicates);
        println!("order violations     {}", read.order_violations);
        println!("still pending        {}", status.pending);
        println!(
            "throughput           writers {:.0} commits/s · relay {:.0} events/s (the relay keeps up with the writers)",
            writes as f64 / write_elapsed.as_secs_f64(),
            published as f64 / relay_secs
        );
        println!(
            "commit→ack latency   p50 {} · p99 {} · max {}",
            ms(percentile(&latencies, 50.0)),
            ms(percentile(&latencies, 99.0)),
            ms(latencies.last().copied().unwrap_or_default())
        );
        if missing > 0 || read.order_violations > 0 || published < writes {
            return Err(Failure::runtime(format!(
                "demo failed: {missing} events missing, {} order violations, {} of {writes} published",
                read.order_violations, published
            )));
        }
        println!("OK: every committed event arrived, in order per order.");
        Ok(())
    }

    fn capitalize(s: &str) -> String {
        let mut c = s.chars();
        match c.next() {
            Some(f) => f.to_uppercase().chain(c).collect(),
            None => String::new(),
        }
    }

    /// A small deterministic generator per writer (xorshift), so runs are comparable.
    fn fastrand_seed(seed: u64) -> impl FnMut() -> u64 {
        let mut x =
            0x9E37_79B9_7F4A_7C15u64 ^ (seed.wrapping_add(1).wrapping_mul(0xBF58_476D_1CE4_E5B9));
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }
}
