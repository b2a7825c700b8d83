//! One store × sink pair and its measurements: drain rate and peak RSS, the article's baseline,
//! the database's and the broker's ceilings, commit→receive latency, the writers' cost. The
//! store and broker sides come from the harness; adding a pair is adding a side there.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_core::{ClaimRequest, MarkMode, NewEvent, OutboxEvent, PayloadType, Store};
use outboxkit_harness::{write_file, MySqlSide, PostgresSide, RelayProcess, StoreSide};
use uuid::Uuid;

use crate::article::Article;
use crate::broker::Broker;
use crate::Args;

/// The outbox table (the business table is `bench_outbox_orders`).
pub const TABLE: &str = "bench_outbox";
/// Shards of the database ceiling's session.
pub const SHARDS: u32 = 64;
/// Longest wait for the broker to hold every event after a drain (not timed).
const HELD_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections of the writers' pool (and most transactions in flight in the latency runs).
pub const WRITER_CONNECTIONS: usize = 40;
/// Padding that makes each payload about 300 bytes of JSON.
pub const PAD: usize = 240;

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
    /// Commits per second the writers achieved (below the target when the machine could not
    /// keep up).
    pub write_rate: f64,
}

/// A store × sink pair: the harness's store side (with the article's relay on its pool and the
/// store crate's store for the database ceiling) and the broker of the pair.
pub struct Pair {
    batch: usize,
    payload_type: PayloadType,
    article_secs: u64,
    relay_bin: PathBuf,
    dir: PathBuf,
    store: Arc<dyn StoreSide>,
    ceiling_store: Arc<dyn Store>,
    article: Article,
    broker: Broker,
}

/// Open a pair by kinds.
pub async fn open(args: &Args, store: &str, sink: &str) -> Result<Pair, String> {
    let connections = WRITER_CONNECTIONS as u32;
    let (side, article): (Arc<dyn StoreSide>, Article) = match store {
        "postgres" => {
            let side = PostgresSide::open_with_pool(&args.postgres_url, TABLE, connections).await;
            let article = Article::Postgres(side.pool().clone());
            (Arc::new(side), article)
        }
        "mysql" => {
            let side = MySqlSide::open_with_pool(&args.mysql_url, TABLE, connections).await;
            let article = Article::MySql(side.pool().clone());
            (Arc::new(side), article)
        }
        other => {
            return Err(format!(
                "--pairs: store \"{other}\" is not benchmarked (known: postgres, mysql)"
            ))
        }
    };
    Pair::with_side(args, side, article, sink).await
}

impl Pair {
    /// The pair of an opened store side (`article` on its pool) and the broker `sink`.
    pub async fn with_side(
        args: &Args,
        side: Arc<dyn StoreSide>,
        article: Article,
        sink: &str,
    ) -> Result<Pair, String> {
        let ceiling_store = side.connect_store(SHARDS, WRITER_CONNECTIONS as u32).await;
        let dir = std::env::temp_dir().join("outboxkit-bench");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        Ok(Pair {
            batch: args.batch_size,
            payload_type: args.payload_type,
            article_secs: args.article_secs,
            relay_bin: args.relay_bin.clone(),
            broker: Broker::open(args, sink, dir.clone()).await?,
            dir,
            store: side,
            ceiling_store,
            article,
        })
    }
}

pub use outboxkit_harness::peak_rss_mib;

/// SIGTERM, then SIGKILL after 30 s. (A relay dropped without it, after a failed measurement,
/// is killed: it never runs into the next one.)
pub fn stop(mut relay: RelayProcess) {
    relay.terminate(Duration::from_secs(30));
}

impl Pair {
    /// The relay's configuration file for this pair (rewritten at each call).
    pub fn config(&self) -> PathBuf {
        let text = format!(
            "{}\n{}\n[relay]\nbatch_size = {}\n\n[server]\nlisten = \"\"\n\n[log]\nlevel = \"warn\"\n",
            self.store.store_toml(),
            self.broker.side().sink_toml(),
            self.batch
        );
        write_file(&self.dir, "relay.toml", &text)
    }

    /// Start relay process `bench-<n>` with `config`.
    pub fn start_relay(&self, config: &Path, n: u32) -> RelayProcess {
        let mut env = self.broker.side().relay_env();
        // As the configuration's `[log] level` ("warn"): the harness's RUST_LOG=info would win.
        let level = std::env::var("BENCH_RELAY_LOG").unwrap_or_else(|_| "warn".to_owned());
        env.push(("RUST_LOG".to_owned(), format!("{level},lapin=error")));
        RelayProcess::start_binary(
            &self.relay_bin,
            config,
            &self.dir,
            &format!("bench-{n}"),
            &env,
        )
    }

    /// One business transaction of the writers: update the order row, enqueue its event,
    /// commit; the event's id.
    async fn write_one(store: &dyn StoreSide, order: u64) -> Result<Uuid, String> {
        let event = NewEvent::new(
            "order",
            order.to_string(),
            "OrderChanged",
            serde_json::json!({ "order_id": order, "pad": "x".repeat(PAD) }),
        )
        .event_id(Uuid::now_v7());
        store
            .transact(&event, true)
            .await
            .map_err(|e| e.to_string())?;
        Ok(event.event_id_or_new())
    }

    /// Recreate the business table with `aggregates` rows and empty the outbox.
    async fn reset_business(&self, aggregates: u64) {
        self.store.truncate().await;
        self.store.create_orders(aggregates).await;
        self.store.analyze().await;
    }
}

fn sample_event(n: u64, aggregates: u64) -> OutboxEvent {
    let order = (n - 1) % aggregates;
    OutboxEvent::new(
        n as i64,
        "order",
        order.to_string(),
        "OrderChanged",
        serde_json::json!({ "n": n, "order_id": order, "pad": "x".repeat(PAD) }),
    )
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() as f64 - 1.0)).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

impl Pair {
    /// The store side.
    pub fn store(&self) -> &Arc<dyn StoreSide> {
        &self.store
    }

    /// The broker.
    pub fn broker(&self) -> &Broker {
        &self.broker
    }

    /// Server versions of the store and the broker.
    pub async fn describe(&self) -> (String, String) {
        (self.store.server_version().await, self.broker.describe())
    }

    /// Events per drain for this pair (`--events`, or less for a slow emulated broker).
    pub fn events(&self, requested: u64) -> u64 {
        self.broker
            .max_events()
            .map_or(requested, |max| max.min(requested))
    }

    pub async fn drain(&self, events: u64, aggregates: u64, relays: u32) -> Result<Drain, String> {
        self.broker.reset().await?;
        self.store
            .bulk_load(events, aggregates, PAD, self.payload_type)
            .await;
        let config = self.config();
        let started = Instant::now();
        let processes: Vec<RelayProcess> =
            (0..relays).map(|n| self.start_relay(&config, n)).collect();
        let deadline = started + Duration::from_secs(900);
        // A row leaves the pending set only once the broker acknowledged it: the drain is
        // over when none is left.
        while self.store.any_pending().await {
            if Instant::now() > deadline {
                return Err(format!(
                    "drain of {events} events did not finish in 15 minutes"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        // Not timed: the broker really holds them all.
        let delivered = self.broker.side().held(events, HELD_TIMEOUT).await;
        if delivered < events {
            return Err(format!(
                "drain: the table is empty but the broker holds {delivered} of {events} events"
            ));
        }
        let peak_rss_mib = processes
            .first()
            .map(|p| peak_rss_mib(p.id()))
            .unwrap_or(0.0);
        for p in processes {
            stop(p);
        }
        Ok(Drain {
            rate: events as f64 / elapsed.as_secs_f64(),
            peak_rss_mib,
        })
    }

    pub async fn article(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.broker.reset().await?;
        self.store
            .bulk_load(events, aggregates, PAD, self.payload_type)
            .await;
        let sink = self.broker.sink();
        let started = Instant::now();
        let budget = Duration::from_secs(self.article_secs);
        let mut done = 0;
        // Its rate is steady: stop at the time budget when the broker is slow.
        while started.elapsed() < budget {
            let n = self
                .article
                .round(self.store.table(), sink.as_ref())
                .await?;
            if n == 0 {
                break;
            }
            done += n;
        }
        if done == 0 {
            return Err(format!("the article's relay published none of {events}"));
        }
        Ok(done as f64 / started.elapsed().as_secs_f64())
    }

    pub async fn database_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.store
            .bulk_load(events, aggregates, PAD, self.payload_type)
            .await;
        let mut session = self
            .ceiling_store
            .open_session("bench-ceiling")
            .await
            .map_err(|e| e.to_string())?;
        for shard in 0..session.shard_count() as i32 {
            if !session
                .try_acquire(shard)
                .await
                .map_err(|e| e.to_string())?
            {
                return Err(format!(
                    "database ceiling: shard {shard} is held by another session (a relay still running?)"
                ));
            }
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

    pub async fn broker_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String> {
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

    pub async fn latency(
        &self,
        rate: u64,
        duration: Duration,
        aggregates: u64,
    ) -> Result<Latency, String> {
        self.broker.reset().await?;
        self.reset_business(aggregates).await;
        let config = self.config();
        let relay = self.start_relay(&config, 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut received = self.broker.side().watch().await;
        let committed: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();

        // Steady writes: every millisecond, start the commits due by then.
        let started = Instant::now();
        let mut issued = 0u64;
        let mut tasks = tokio::task::JoinSet::new();
        let mut tick = tokio::time::interval(Duration::from_millis(1));
        let mut order = 0u64;
        // No more transactions in flight than the pool has connections: when the machine
        // cannot keep up, the writers fall behind the rate (reported) instead of timing out.
        let in_flight = Arc::new(tokio::sync::Semaphore::new(WRITER_CONNECTIONS));
        while started.elapsed() < duration {
            tick.tick().await;
            let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
            while issued < due && started.elapsed() < duration {
                issued += 1;
                order = (order + 7) % aggregates;
                let (store, committed) = (self.store.clone(), committed.clone());
                let permit = in_flight
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|e| e.to_string())?;
                tasks.spawn(async move {
                    let _permit = permit;
                    let id = Self::write_one(store.as_ref(), order).await?;
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
        let write_rate = issued as f64 / started.elapsed().as_secs_f64();
        let expected = committed.lock().unwrap_or_else(|p| p.into_inner()).len();
        let mut arrivals: HashMap<Uuid, Instant> = HashMap::new();
        // A broker slower than the write rate (an emulator) delivers the backlog after the
        // writers stop: wait while events keep arriving, up to 10 minutes.
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut last_arrival = Instant::now();
        while arrivals.len() < expected
            && Instant::now() < deadline
            && last_arrival.elapsed() < Duration::from_secs(30)
        {
            match tokio::time::timeout(Duration::from_millis(500), received.recv()).await {
                Ok(Some((id, at))) => {
                    arrivals.entry(id).or_insert(at);
                    last_arrival = Instant::now();
                }
                Ok(None) => break,
                Err(_) => {}
            }
        }
        stop(relay);
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
            write_rate,
        })
    }

    pub async fn writer_cost(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
        rounds: u32,
    ) -> Result<(f64, f64), String> {
        self.broker.reset().await?;
        self.reset_business(aggregates).await;
        let config = self.config();
        let (mut alone, mut with) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
        // Alternate, so that drift (checkpoints, table growth) weighs on both sides alike.
        for _ in 0..rounds {
            let (n, t) = self.writers(writers, duration, aggregates).await?;
            alone = (alone.0 + n, alone.1 + t);
            let relay = self.start_relay(&config, 0);
            // Not timed: the relay takes its shards and publishes what the writers left.
            let deadline = Instant::now() + Duration::from_secs(120);
            while self.store.any_pending().await {
                if Instant::now() > deadline {
                    return Err(format!(
                        "writer cost: the relay did not catch up within 2 minutes ({} pending); its log:\n{}",
                        self.store.pending().await,
                        relay.log_text()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (n, t) = self.writers(writers, duration, aggregates).await?;
            with = (with.0 + n, with.1 + t);
            stop(relay);
        }
        Ok((
            alone.0 as f64 / alone.1.as_secs_f64(),
            with.0 as f64 / with.1.as_secs_f64(),
        ))
    }
}

impl Pair {
    /// `writers` concurrent business transactions, as fast as they go, for `duration`.
    async fn writers(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
    ) -> Result<(u64, Duration), String> {
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..writers {
            let store = self.store.clone();
            tasks.spawn(async move {
                let mut n = 0u64;
                let mut order = w;
                while started.elapsed() < duration {
                    order = (order + writers) % aggregates;
                    Self::write_one(store.as_ref(), order).await?;
                    n += 1;
                }
                Ok::<u64, String>(n)
            });
        }
        let mut total = 0;
        while let Some(done) = tasks.join_next().await {
            total += done.map_err(|e| e.to_string())??;
        }
        let elapsed = started.elapsed();
        Ok((total, elapsed))
    }
}
