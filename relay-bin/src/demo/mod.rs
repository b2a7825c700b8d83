//! `outbox-relay demo`: the whole story on this machine's database and broker.
//!
//! Writers run business transactions — each updates an `orders` row and enqueues its event in
//! the same transaction — while relays publish; then an independent reader reads the broker
//! back and checks that every event arrived and that, per order, events arrived in the order
//! the writers committed them.
//!
//! Each database has a [`DemoDatabase`] (module named after the store kind) and each broker a
//! [`DemoBroker`] (module named after the sink kind); the driver here is shared.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use clap::Args;
use outboxkit_core::{
    NewEvent, OutboxEvent, Outcome, Relay, RelayConfig, Shutdown, Sink, SinkCapabilities, Store,
};
use uuid::Uuid;

use crate::cli::Failure;
use crate::registry::Registry;

#[cfg(feature = "sink-kafka")]
mod kafka;
#[cfg(feature = "store-mysql")]
mod mysql;
#[cfg(feature = "store-postgres")]
mod postgres;
#[cfg(feature = "sink-rabbitmq")]
mod rabbitmq;
#[cfg(feature = "sink-redis-streams")]
mod redis_streams;
#[cfg(feature = "sink-sqs")]
mod sqs;

/// Flags of `outbox-relay demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Database holding the outbox (`postgres`, or another store compiled in).
    #[arg(long, default_value = "postgres")]
    pub store: String,
    /// Broker to relay to (`redis-streams`, or another sink compiled in).
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
    /// Database URL (default: the local server of the chosen store).
    #[arg(long)]
    pub database_url: Option<String>,
    /// Broker URL or address (default: the local server of the chosen sink).
    #[arg(long)]
    pub broker_url: Option<String>,
}

/// Outbox table of the demo.
#[allow(dead_code)] // used by the store or sink modules compiled in
pub(crate) const TABLE: &str = "outbox_demo";
/// Business table of the demo.
#[allow(dead_code)] // used by the store or sink modules compiled in
pub(crate) const ORDERS: &str = "outbox_demo_orders";
/// Shards of the demo table.
#[allow(dead_code)] // used by the store or sink modules compiled in
pub(crate) const DEMO_SHARDS: u32 = 16;
/// Prefix of the demo's destinations (stream, topic, queue...).
#[allow(dead_code)] // used by the store or sink modules compiled in
pub(crate) const DESTINATION: &str = "outbox-demo";

/// The database side of the demo.
#[async_trait]
pub(crate) trait DemoDatabase: Send + Sync {
    /// For the header line.
    fn describe(&self) -> String;
    /// The store the relays use (outbox table migrated and emptied, orders table filled).
    fn store(&self) -> Arc<dyn Store>;
    /// One business transaction: bump the order's version (locking its row), enqueue the
    /// event built by [`order_event`] from the new version, commit. Returns the event id.
    async fn write_order_event(&self, order: i64) -> Result<Uuid, String>;
}

/// The broker side of the demo.
#[async_trait]
pub(crate) trait DemoBroker: Send + Sync {
    /// For the header line.
    fn describe(&self) -> String;
    /// The sink the relays publish with.
    fn sink(&self) -> Arc<dyn Sink>;
    /// Every message delivered to the demo's destination, in broker order (per order, the
    /// order the broker keeps): each message's payload text and `event_id`. Waits until
    /// `expected` distinct events arrived or `timeout` passed.
    async fn read_all(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(Uuid, String)>, Failure>;
}

/// The event of one order change: `{order_id, version, status}`.
#[allow(dead_code)] // used by the store or sink modules compiled in
pub(crate) fn order_event(order: i64, version: i64) -> NewEvent {
    const STATUSES: [&str; 5] = ["placed", "paid", "packed", "shipped", "delivered"];
    let status = STATUSES[(version.max(1) as usize - 1) % STATUSES.len()];
    let mut event_type = String::from("Order");
    let mut chars = status.chars();
    if let Some(first) = chars.next() {
        event_type.extend(first.to_uppercase());
        event_type.extend(chars);
    }
    NewEvent::new(
        "order",
        order.to_string(),
        event_type,
        serde_json::json!({ "order_id": order, "version": version, "status": status }),
    )
    .event_id(Uuid::now_v7())
}

async fn open_database(
    args: &DemoArgs,
    registry: &Registry,
) -> Result<Arc<dyn DemoDatabase>, Failure> {
    match args.store.as_str() {
        #[cfg(feature = "store-mysql")]
        "mysql" => mysql::open(args).await,
        #[cfg(feature = "store-postgres")]
        "postgres" => postgres::open(args).await,
        other => Err(Failure::config(format!(
            "demo --store {other}: not available (stores compiled in: {})",
            registry.store_kinds().join(", ")
        ))),
    }
}

async fn open_broker(args: &DemoArgs, registry: &Registry) -> Result<Arc<dyn DemoBroker>, Failure> {
    match args.sink.as_str() {
        #[cfg(feature = "sink-rabbitmq")]
        "rabbitmq" => rabbitmq::open(args).await,
        #[cfg(feature = "sink-redis-streams")]
        "redis-streams" => redis_streams::open(args).await,
        #[cfg(feature = "sink-sqs")]
        "sqs" => sqs::open(args).await,
        #[cfg(feature = "sink-kafka")]
        "kafka" => kafka::open(args).await,
        other => Err(Failure::config(format!(
            "demo --sink {other}: not available (sinks compiled in: {})",
            registry.sink_kinds().join(", ")
        ))),
    }
}

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
    async fn check(&self) -> outboxkit_core::Result<()> {
        self.inner.check().await
    }
    async fn publish(&self, batch: &[OutboxEvent]) -> outboxkit_core::Result<Vec<Outcome>> {
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

/// Per order, the versions of first occurrences must increase (version = the writers' commit
/// order for that order row).
fn check_order(messages: &[(Uuid, String)]) -> ReadBack {
    let mut out = ReadBack::default();
    let mut last: HashMap<i64, i64> = HashMap::new();
    for (event_id, payload) in messages {
        out.messages += 1;
        if !out.unique.insert(*event_id) {
            out.duplicates += 1;
            continue;
        }
        let doc: serde_json::Value = serde_json::from_str(payload).unwrap_or_default();
        let order = doc["order_id"].as_i64().unwrap_or(-1);
        let version = doc["version"].as_i64().unwrap_or(-1);
        if let Some(prev) = last.insert(order, version) {
            if version <= prev {
                out.order_violations += 1;
            }
        }
    }
    out
}

/// Run the demo.
pub async fn run(args: &DemoArgs, registry: &Registry) -> Result<(), Failure> {
    if args.aggregates == 0 || args.writers == 0 || args.relays == 0 || args.events == 0 {
        return Err(Failure::config(
            "demo: --events, --aggregates, --writers and --relays must be at least 1",
        ));
    }
    let database = open_database(args, registry).await?;
    let broker = open_broker(args, registry).await?;
    let store = database.store();
    let sink = Arc::new(AckClock {
        inner: broker.sink(),
        acked: Mutex::new(HashMap::new()),
    });
    println!(
        "outbox-relay demo: {} order events over {} orders, {} writers, {} relays\n  {} → {}",
        args.events,
        args.aggregates,
        args.writers,
        args.relays,
        database.describe(),
        broker.describe(),
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
        if owned.iter().sum::<u32>() == DEMO_SHARDS
            && (args.relays > DEMO_SHARDS || owned.iter().all(|n| *n > 0))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Writers.
    let committed: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let share = args.events / args.writers + u64::from(w < args.events % args.writers);
        let (database, committed, written) = (database.clone(), committed.clone(), written.clone());
        let aggregates = args.aggregates;
        writers.push(tokio::spawn(async move {
            // A small deterministic generator per writer (xorshift), so runs are comparable.
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (w + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            for _ in 0..share {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let order = (x % aggregates) as i64 + 1;
                let event_id = database.write_order_event(order).await?;
                committed
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(event_id, Instant::now());
                written.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        }));
    }

    // Progress until every event is acknowledged.
    let published = || handles.iter().map(|h| h.published()).sum::<u64>();
    let deadline = Instant::now() + Duration::from_secs(60 + args.events / 100);
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
        if p >= args.events || Instant::now() > deadline {
            break;
        }
    }
    let elapsed = started.elapsed();
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

    // Independent reader: everything the broker holds for the demo.
    let committed = committed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let messages = broker
        .read_all(committed.len(), Duration::from_secs(30))
        .await?;
    let read = check_order(&messages);
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
    let writes = committed.len() as u64;
    let published = published();
    let status = store.status().await?;

    println!();
    println!("events written       {writes} (each in a business transaction with its order row)");
    println!("events published     {published} (acknowledged by the broker and marked)");
    println!(
        "read back            {} messages, {} distinct events, {missing} missing",
        read.messages,
        read.unique.len()
    );
    println!("duplicates           {}", read.duplicates);
    println!("order violations     {}", read.order_violations);
    println!("still pending        {}", status.pending);
    println!(
        "throughput           {:.0} events/s written and relayed (the relays keep up with the writers)",
        writes as f64 / elapsed.as_secs_f64(),
    );
    println!(
        "commit→ack latency   p50 {} · p99 {} · max {}",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 99.0)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    if missing > 0 || read.order_violations > 0 || published < writes {
        return Err(Failure::runtime(format!(
            "demo failed: {missing} events missing, {} order violations, {published} of {writes} published",
            read.order_violations
        )));
    }
    println!("OK: every committed event arrived, in order per order.");
    Ok(())
}
