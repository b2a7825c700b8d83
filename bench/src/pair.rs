//! One store × sink pair: the pieces each measurement needs. A store side and a broker side are
//! combined; adding a pair is adding a side.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use outboxkit_core::{ClaimRequest, MarkMode, OutboxEvent, Sink, Store};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::brokers::{KafkaSide, RabbitMqSide, RedisSide, SqsSide};
use crate::stores::{MySqlSide, PostgresSide};
use crate::Args;

pub const TABLE: &str = "bench_outbox";
pub const ORDERS: &str = "bench_orders";
pub const SHARDS: u32 = 64;
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

/// Everything measured for a pair.
#[async_trait]
pub trait PairBench: Send + Sync {
    /// Server versions of the store and the broker.
    fn describe(&self) -> (String, String);
    /// Events per drain for this pair (`--events`, or less for a slow emulated broker).
    fn events(&self, requested: u64) -> u64;
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
    /// Writer commits/s with the relay stopped and running, alternating `rounds` times.
    async fn writer_cost(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
        rounds: u32,
    ) -> Result<(f64, f64), String>;
}

/// The database side of a pair.
#[async_trait]
pub trait StoreSide: Send + Sync {
    /// Server and version.
    fn describe(&self) -> String;
    fn store(&self) -> Arc<dyn Store>;
    /// `[store]` of the relay's configuration.
    fn relay_toml(&self) -> String;
    /// Empty the outbox and load `events` pending rows spread over `aggregates`.
    async fn load(&self, events: u64, aggregates: u64) -> Result<(), String>;
    /// Whether any row is still pending (cheap: the first entry of the pending index).
    async fn any_pending(&self) -> Result<bool, String>;
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
pub trait BrokerSide: Send + Sync {
    /// Server and version.
    fn describe(&self) -> String;
    /// The sink as the relay builds it (for the article's run and the broker ceiling).
    fn sink(&self) -> Arc<dyn Sink>;
    /// `[sink]` of the relay's configuration.
    fn relay_toml(&self) -> String;
    /// Environment the relay process needs (e.g. credentials).
    fn relay_env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Most events per drain this broker can take in reasonable time (an emulator).
    fn max_events(&self) -> Option<u64> {
        None
    }
    /// Forget everything delivered.
    async fn reset(&self) -> Result<(), String>;
    /// Messages delivered since the last reset (may read them back: not timed).
    async fn delivered(&self, expected: u64) -> Result<u64, String>;
    /// Stream (event id, receive time) of messages delivered from now on.
    async fn consume(&self) -> Result<mpsc::UnboundedReceiver<(Uuid, Instant)>, String>;
}

/// Open a pair by kinds.
pub async fn open(args: &Args, store: &str, sink: &str) -> Result<Box<dyn PairBench>, String> {
    let store: Arc<dyn StoreSide> = match store {
        "postgres" => Arc::new(PostgresSide::open(&args.postgres_url).await?),
        "mysql" => Arc::new(MySqlSide::open(&args.mysql_url).await?),
        other => {
            return Err(format!(
                "--pairs: store \"{other}\" is not benchmarked (known: postgres, mysql)"
            ))
        }
    };
    let broker: Box<dyn BrokerSide> = match sink {
        "redis-streams" => Box::new(RedisSide::open(&args.redis_url).await?),
        "kafka" => Box::new(KafkaSide::open(&args.tansu_bin).await?),
        "rabbitmq" => Box::new(RabbitMqSide::open(&args.rabbitmq_url, args.rabbitmq_events).await?),
        "sqs" => Box::new(SqsSide::open(&args.sqs_endpoint, args.sqs_events).await?),
        other => {
            return Err(format!(
                "--pairs: sink \"{other}\" is not benchmarked (known: redis-streams, kafka, rabbitmq, sqs)"
            ))
        }
    };
    let dir = std::env::temp_dir().join("outboxkit-bench");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    Ok(Box::new(Pair {
        batch: args.batch_size,
        article_secs: args.article_secs,
        store,
        broker,
        relay_bin: args.relay_bin.clone(),
        dir,
    }))
}

struct Pair {
    batch: usize,
    article_secs: u64,
    store: Arc<dyn StoreSide>,
    broker: Box<dyn BrokerSide>,
    relay_bin: PathBuf,
    dir: PathBuf,
}

/// A relay child process; stopped (SIGTERM, then SIGKILL after 30 s) when dropped, so a
/// failed measurement never leaves a relay running into the next one.
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

    fn stop(self) {
        drop(self);
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
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
            .envs(self.broker.relay_env())
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
    fn describe(&self) -> (String, String) {
        (self.store.describe(), self.broker.describe())
    }

    fn events(&self, requested: u64) -> u64 {
        self.broker
            .max_events()
            .map_or(requested, |max| max.min(requested))
    }

    async fn drain(&self, events: u64, aggregates: u64, relays: u32) -> Result<Drain, String> {
        self.broker.reset().await?;
        self.store.load(events, aggregates).await?;
        let config = self.config()?;
        let started = Instant::now();
        let processes: Vec<RelayProcess> = (0..relays)
            .map(|n| self.start_relay(&config, n))
            .collect::<Result<_, _>>()?;
        let deadline = started + Duration::from_secs(900);
        // A row leaves the pending set only once the broker acknowledged it: the drain is
        // over when none is left.
        while self.store.any_pending().await? {
            if Instant::now() > deadline {
                return Err(format!(
                    "drain of {events} events did not finish in 15 minutes"
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let elapsed = started.elapsed();
        // Not timed: the broker really holds them all.
        let delivered = self.broker.delivered(events).await?;
        if delivered < events {
            return Err(format!(
                "drain: the table is empty but the broker holds {delivered} of {events} events"
            ));
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
        let budget = Duration::from_secs(self.article_secs);
        let mut done = 0;
        // Its rate is steady: stop at the time budget when the broker is slow.
        while started.elapsed() < budget {
            let n = self.store.article_round(sink.as_ref()).await?;
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

    async fn database_ceiling(&self, events: u64, aggregates: u64) -> Result<f64, String> {
        self.store.load(events, aggregates).await?;
        let store = self.store.store();
        let mut session = store
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
            write_rate,
        })
    }

    async fn writer_cost(
        &self,
        writers: u64,
        duration: Duration,
        aggregates: u64,
        rounds: u32,
    ) -> Result<(f64, f64), String> {
        self.broker.reset().await?;
        self.store.reset_business(aggregates).await?;
        let config = self.config()?;
        let (mut alone, mut with) = ((0u64, Duration::ZERO), (0u64, Duration::ZERO));
        // Alternate, so that drift (checkpoints, table growth) weighs on both sides alike.
        for _ in 0..rounds {
            let (n, t) = self.writers(writers, duration, aggregates).await?;
            alone = (alone.0 + n, alone.1 + t);
            let relay = self.start_relay(&config, 0)?;
            // Not timed: the relay takes its shards and publishes what the writers left.
            let deadline = Instant::now() + Duration::from_secs(120);
            while self.store.any_pending().await? {
                if Instant::now() > deadline {
                    return Err("writer cost: the relay did not catch up within 2 minutes".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (n, t) = self.writers(writers, duration, aggregates).await?;
            with = (with.0 + n, with.1 + t);
            relay.stop();
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
                    store.write_one(order as i64 + 1).await?;
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
