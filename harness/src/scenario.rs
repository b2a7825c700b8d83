//! The end-to-end scenario: writers with rollbacks, `outbox-relay run` processes, a SIGKILL and
//! restart, a fault, drain, read back by an independent consumer, and the delivery check.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::NewEvent;
use uuid::Uuid;

use crate::broker::BrokerSide;
use crate::delivery::{check_delivery, Committed, Delivered, DeliveryCheck};
use crate::relay::{relay_binary, relay_config, run_cli, RelayProcess, Settings};
use crate::store::StoreSide;
use crate::util::{
    free_port, http_get, log_troubles, metric_at, scratch_dir, wait_for, wait_for_metric,
    wait_for_ready, write_file,
};

/// The W3C trace context every scenario event carries as header `traceparent`.
pub const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// The writers' PRNG seed (xorshift64; writer `w` starts from `SEED ^ (w + 1)`).
const SEED: u64 = 0x2545_F491_4F6C_DD1D;

/// The aggregate type of aggregate number `aggregate`: even ones are orders, odd ones
/// customers, so every run routes to two destinations.
pub fn aggregate_type(aggregate: u64) -> &'static str {
    if aggregate.is_multiple_of(2) {
        "order"
    } else {
        "customer"
    }
}

fn aggregate_type_of(aggregate_id: &str) -> &'static str {
    aggregate_type(
        aggregate_id
            .parse()
            .unwrap_or_else(|_| panic!("aggregate id {aggregate_id:?} is not a number")),
    )
}

/// `events` events `Placed` of type `order`, event `i` of order `o<i % orders>` with payload
/// `{"i": i}`: a small backlog for a test that checks something else than the scenario's.
pub fn placed_events(events: usize, orders: usize) -> Vec<NewEvent> {
    (0..events)
        .map(|i| {
            NewEvent::new(
                "order",
                format!("o{}", i % orders),
                "Placed",
                serde_json::json!({ "i": i }),
            )
        })
        .collect()
}

/// The event writer `w` writes as its `n`-th for `aggregate`: what
/// [`Scenario::assert_delivery`] checks of every delivery.
pub fn scenario_event(w: u64, n: u64, aggregate: u64) -> NewEvent {
    NewEvent::new(
        aggregate_type(aggregate),
        aggregate.to_string(),
        "Changed",
        serde_json::json!({ "aggregate": aggregate.to_string(), "w": w, "n": n, "note": "caf\u{e9}" }),
    )
    .header("traceparent", TRACEPARENT)
    .event_id(Uuid::now_v7())
}

/// A failed business transaction: `inserted` when it failed after its event's insert, when the
/// commit may have reached the server (its outcome is unknown until its row is looked for).
#[derive(Debug)]
pub struct WriteError {
    pub inserted: bool,
    pub message: String,
}

impl WriteError {
    /// Failed before the insert: nothing can have committed.
    pub fn before(e: impl std::fmt::Display) -> Self {
        Self {
            inserted: false,
            message: e.to_string(),
        }
    }

    /// Failed at the commit or the rollback.
    pub fn after(e: impl std::fmt::Display) -> Self {
        Self {
            inserted: true,
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Something a test does to a broker or a database mid-run: freeze it, or stop it, and then
/// bring it back. Implemented by the private servers ([`crate::KafkaBrokerProcess`],
/// [`crate::OwnSqsServer`], [`crate::PrivateMariaDb`]) and by [`crate::RabbitMqApp`].
#[async_trait]
pub trait Fault: Send + Sync + std::fmt::Debug {
    /// What it does, for the run's summary.
    fn describe(&self) -> String;
    /// Freeze or stop.
    async fn begin(&self);
    /// Thaw or start again (and wait until it answers).
    async fn end(&self);
}

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct Scale {
    pub events: u64,
    pub aggregates: u64,
    pub writers: u64,
    pub relays: usize,
}

impl Scale {
    /// 20,000 events over 500 aggregates: 8 writers, 3 relays.
    pub const FULL: Scale = Scale {
        events: 20_000,
        aggregates: 500,
        writers: 8,
        relays: 3,
    };

    /// 5,000 events over 200 aggregates, for SQS (LocalStack is slow): 4 writers, 2 relays.
    pub const SQS: Scale = Scale {
        events: 5_000,
        aggregates: 200,
        writers: 4,
        relays: 2,
    };

    /// `events` over `aggregates` from one writer into one relay: the steady trickle the fault
    /// tests write through an outage (with [`Plan::pausing`]).
    pub const fn trickle(events: u64, aggregates: u64) -> Scale {
        Scale {
            events,
            aggregates,
            writers: 1,
            relays: 1,
        }
    }
}

/// What the writers do.
#[derive(Debug, Clone)]
pub struct WriterPlan {
    /// Concurrent writer tasks.
    pub writers: u64,
    /// Aggregates `0` .. `aggregates - 1` (the business table's rows).
    pub aggregates: u64,
    /// Committed events in all (each writer its share); `None`: until [`Writers::finish`].
    pub events: Option<u64>,
    /// A pause after each transaction (steady writes).
    pub pause: Duration,
    /// Roll back the transactions whose PRNG draw is a multiple of [`Self::rollback_one_in`].
    pub rollbacks: bool,
    /// With `rollbacks`, about one transaction in this many rolls back (50 unless set).
    pub rollback_one_in: u64,
    /// Retry a failed transaction for this long (a database restart) instead of failing.
    pub retry_for: Option<Duration>,
    /// The event writer `w` writes as its `n`-th for `aggregate` (its aggregate id must be
    /// `aggregate`): the scenario's by default, carrying what [`Scenario::assert_delivery`]
    /// reads.
    pub event: fn(w: u64, n: u64, aggregate: u64) -> NewEvent,
}

impl WriterPlan {
    /// `scale.events` events over `scale.aggregates` by `scale.writers` writers, as fast as they
    /// go, with rollbacks.
    pub fn bounded(scale: Scale) -> Self {
        Self {
            writers: scale.writers,
            aggregates: scale.aggregates,
            events: Some(scale.events),
            pause: Duration::ZERO,
            rollbacks: true,
            rollback_one_in: 50,
            retry_for: None,
            event: scenario_event,
        }
    }

    /// `writers` writers over `aggregates`, each pausing `pause` after each transaction, with
    /// rollbacks, until [`Writers::finish`].
    pub fn steady(writers: u64, aggregates: u64, pause: Duration) -> Self {
        Self {
            writers,
            aggregates,
            events: None,
            pause,
            rollbacks: true,
            rollback_one_in: 50,
            retry_for: None,
            event: scenario_event,
        }
    }

    /// Retry failed transactions for up to `limit` each (see [`Writes::uncertain`]).
    pub fn retrying(mut self, limit: Duration) -> Self {
        self.retry_for = Some(limit);
        self
    }
}

/// What the writers did.
#[derive(Debug, Default, Clone)]
pub struct Writes {
    pub committed: Committed,
    /// Rolled back: must never arrive.
    pub rolled_back: Vec<Uuid>,
    /// Failed after their insert (a retried transaction): committed or not, as their row says
    /// ([`Scenario::resolve_uncertain`]).
    pub uncertain: Vec<(Uuid, String)>,
    /// Failed transactions (retried).
    pub failed_attempts: u64,
}

/// Concurrent writer tasks: business transactions, each updating (locking) its aggregate's
/// row of the business table and enqueueing its event, aggregates drawn by a xorshift PRNG.
#[derive(Debug)]
pub struct Writers {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    writes: Arc<Mutex<Writes>>,
}

impl Writers {
    /// Start them (the business table must exist: [`Scenario::start_writers`] creates it).
    pub fn start(store: Arc<dyn StoreSide>, plan: &WriterPlan) -> Self {
        let written = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let writes: Arc<Mutex<Writes>> = Arc::default();
        let tasks = (0..plan.writers)
            .map(|w| {
                let (store, plan, written, stop, writes) = (
                    store.clone(),
                    plan.clone(),
                    written.clone(),
                    stop.clone(),
                    writes.clone(),
                );
                tokio::spawn(
                    async move { write(w, &*store, &plan, &written, &stop, &writes).await },
                )
            })
            .collect();
        Self {
            tasks,
            written,
            stop,
            writes,
        }
    }

    /// Events committed so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Wait until `events` are committed.
    pub async fn wait_written(&self, events: u64, timeout: Duration) {
        let written = self.written.clone();
        wait_for(&format!("{events} events written"), timeout, move || {
            let written = written.clone();
            async move { written.load(Ordering::Relaxed) >= events }
        })
        .await;
    }

    /// The events committed so far.
    pub fn committed(&self) -> Committed {
        self.writes.lock().unwrap().committed.clone()
    }

    /// Stop (steady writers) or wait for the last event (bounded ones); what they did.
    pub async fn finish(self) -> Writes {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.expect("writer");
        }
        std::mem::take(&mut *self.writes.lock().unwrap())
    }
}

async fn write(
    w: u64,
    store: &dyn StoreSide,
    plan: &WriterPlan,
    written: &AtomicU64,
    stop: &AtomicBool,
    writes: &Mutex<Writes>,
) {
    // Writer `w`'s share: an even split, the first `events % writers` writers one more.
    let share = plan
        .events
        .map(|events| events / plan.writers + u64::from(w < events % plan.writers));
    let mut x: u64 = SEED ^ (w + 1);
    let mut n = 0;
    while share.map_or(!stop.load(Ordering::Relaxed), |share| n < share) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let aggregate = x % plan.aggregates;
        let rollback = plan.rollbacks && x.is_multiple_of(plan.rollback_one_in.max(1));
        let deadline = Instant::now() + plan.retry_for.unwrap_or_default();
        loop {
            let event = (plan.event)(w, n, aggregate);
            let event_id = event.event_id.expect("an event id");
            let result = store.transact(&event, !rollback).await;
            let retry = {
                let mut writes = writes.lock().unwrap();
                match result {
                    Ok(_) if rollback => {
                        writes.rolled_back.push(event_id);
                        false
                    }
                    Ok(id) => {
                        writes
                            .committed
                            .insert(event_id, (id, aggregate.to_string()));
                        written.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                        false
                    }
                    Err(e) => {
                        let Some(limit) = plan.retry_for else {
                            panic!("writer {w}: a business transaction failed: {e}");
                        };
                        writes.failed_attempts += 1;
                        if rollback {
                            // Never committed, whatever failed.
                            writes.rolled_back.push(event_id);
                        } else if e.inserted {
                            writes.uncertain.push((event_id, aggregate.to_string()));
                        }
                        assert!(
                            Instant::now() < deadline,
                            "writer {w} could not write for {limit:?}: {e}"
                        );
                        !rollback
                    }
                }
            };
            if !retry {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !plan.pause.is_zero() {
            tokio::time::sleep(plan.pause).await;
        }
    }
}

/// How [`Scenario::run`] runs.
#[derive(Debug, Clone)]
pub struct Plan {
    pub writers: WriterPlan,
    /// Relay processes, `relay-0` ...
    pub relays: usize,
    /// SIGKILL `relay-0` once a third of the events is written, and start it again.
    pub sigkill: bool,
    /// After that SIGKILL, until the writers are done: a SIGKILL every this long (from one to
    /// the next), of each relay in turn (`relay-1`, `relay-2`...), each started again 700 ms
    /// later.
    pub sigkill_every: Option<Duration>,
    /// A fault at that moment, held for the duration given.
    pub fault: Option<(Arc<dyn Fault>, Duration)>,
    /// Serve each relay's `/readyz` and `/metrics` on a port of its own, and watch them around
    /// the fault: [`Run::outage`].
    pub watch_health: bool,
}

impl Plan {
    /// `scale`'s writers (with rollbacks) and relays, one relay SIGKILLed mid-run, no fault.
    pub fn new(scale: Scale) -> Self {
        Self {
            writers: WriterPlan::bounded(scale),
            relays: scale.relays,
            sigkill: true,
            sigkill_every: None,
            fault: None,
            watch_health: false,
        }
    }

    /// `scale`'s writers (with rollbacks) and relays, and `fault` held for `hold` once a third
    /// is written, instead of the SIGKILL: the relays must ride it out by themselves.
    pub fn with_fault(scale: Scale, fault: Arc<dyn Fault>, hold: Duration) -> Self {
        Self {
            sigkill: false,
            fault: Some((fault, hold)),
            ..Self::new(scale)
        }
    }

    /// Each writer waits `pause` between transactions: a steady rate that goes on through the
    /// fault.
    pub fn pausing(mut self, pause: Duration) -> Self {
        self.writers.pause = pause;
        self
    }

    /// See [`Self::sigkill_every`].
    pub fn sigkilling_every(mut self, period: Duration) -> Self {
        self.sigkill_every = Some(period);
        self
    }

    /// See [`Self::watch_health`].
    pub fn watching_health(mut self) -> Self {
        self.watch_health = true;
        self
    }
}

/// What the relays' endpoints and the store showed around the fault of a run that watched
/// them ([`Plan::watch_health`]).
#[derive(Debug, Default)]
pub struct Outage {
    /// How long the fault held: its hold, or longer when no relay had reported it on `/readyz`
    /// by then (up to 60 s).
    pub held: Duration,
    /// Events committed while the fault held.
    pub written_during: u64,
    /// Pending rows (the store's count) when the fault began, and when it ended.
    pub pending_before: i64,
    pub pending_at_end: i64,
    /// Whether some relay's `/readyz` answered 503 while the fault held (asked every 250 ms).
    pub not_ready_seen: bool,
    /// `relay-0`'s `/readyz` status just before the fault ended.
    pub ready_at_end: Option<u16>,
    /// The highest `outbox_pending_events` on `relay-0`'s `/metrics` while the fault held.
    pub pending_metric_peak: f64,
    /// Seconds from the fault's end until every relay's `/readyz` answered 200 again.
    pub ready_after: f64,
    /// `relay-0`'s `/metrics` once the backlog drained and its gauge showed it.
    pub metrics_after: String,
}

/// What [`Scenario::run`] saw.
#[derive(Debug)]
pub struct Run {
    pub writes: Writes,
    /// Uncertain transactions that had committed after all.
    pub resolved: usize,
    pub delivered: Vec<Delivered>,
    pub check: DeliveryCheck,
    /// `relay-0` SIGKILLed (and the fault begun) after this many events.
    pub killed_at: u64,
    /// SIGKILLs in all (see [`Plan::sigkill_every`]).
    pub sigkills: usize,
    /// `outbox-relay status --json` once drained.
    pub status: serde_json::Value,
    /// Each relay's (name, log), taken after it stopped.
    pub relay_logs: Vec<(String, String)>,
    pub write_secs: f64,
    pub drain_secs: f64,
    pub read_secs: f64,
    /// With [`Plan::watch_health`] and a fault: what the relays showed around it.
    pub outage: Option<Outage>,
}

/// A store side, a broker side, a relay configuration between them, and relay processes.
#[derive(Debug)]
pub struct Scenario {
    pub store: Arc<dyn StoreSide>,
    pub broker: Arc<dyn BrokerSide>,
    /// Scratch directory: configuration and relay logs.
    pub dir: PathBuf,
    pub config: PathBuf,
    pub relays: Vec<RelayProcess>,
}

impl Scenario {
    /// Prepare the broker's destinations, write the relay configuration and migrate (twice:
    /// migrate is idempotent).
    pub async fn prepare(
        store: Arc<dyn StoreSide>,
        broker: Arc<dyn BrokerSide>,
        settings: Settings,
    ) -> Self {
        broker.prepare().await;
        let dir = scratch_dir(store.table());
        let config = write_file(
            &dir,
            "relay.toml",
            &relay_config(&*store, &*broker, &settings),
        );
        let scenario = Self {
            store,
            broker,
            dir,
            config,
            relays: Vec::new(),
        };
        for _ in 0..2 {
            let (ok, out, err) = scenario.cli(&["migrate"]);
            assert!(ok, "migrate failed: {out}{err}");
        }
        scenario
    }

    /// [`Self::prepare`] from the outbox table `table` of the test PostgreSQL
    /// ([`crate::PostgresSide::open`]).
    #[cfg(feature = "postgres")]
    pub async fn on_postgres(table: &str, broker: Arc<dyn BrokerSide>, settings: Settings) -> Self {
        let store = crate::PostgresSide::open(table).await;
        Self::prepare(Arc::new(store), broker, settings).await
    }

    /// Run `outbox-relay --config <config> <args>` to completion; (success, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (bool, String, String) {
        run_cli(&self.config, args, &self.broker.relay_env())
    }

    /// `outbox-relay status --json`.
    pub fn status(&self) -> serde_json::Value {
        let (ok, status, err) = self.cli(&["status", "--json"]);
        assert!(ok, "status failed: {err}");
        serde_json::from_str(&status).unwrap_or_else(|e| panic!("status --json: {e}: {status}"))
    }

    /// The rest of the line of `outbox-relay status` (text) that starts with `prefix`.
    pub fn status_line(&self, prefix: &str) -> String {
        let (ok, out, err) = self.cli(&["status"]);
        assert!(ok, "status failed: {err}");
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no line `{prefix}...` in status: {out}"))
            .to_owned()
    }

    /// [`Self::status`] once it reports nothing pending, or as it is after 15 s. In message
    /// style `pending` is what the slot's reader held at its last report (every
    /// `relay.status_interval`, 5 s by default), so it can lag a finished drain by that long.
    pub async fn settled_status(&self) -> serde_json::Value {
        let started = Instant::now();
        loop {
            let status = self.status();
            if status["pending"] == 0 || started.elapsed() > Duration::from_secs(15) {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Start a relay process with relay id `name` (and extra environment); its index.
    pub fn start_relay(&mut self, name: &str, env: &[(&str, &str)]) -> usize {
        self.start_relay_command(name, &["run"], env)
    }

    /// [`Self::start_relay`] of the command `args` (`run --wait`, say).
    pub fn start_relay_command(
        &mut self,
        name: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let mut all = self.broker.relay_env();
        all.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let binary = relay_binary();
        let process =
            RelayProcess::start_command(&binary, &self.config, &self.dir, name, args, &all);
        self.relays.push(process);
        self.relays.len() - 1
    }

    /// Start relay `name` with `env`; it must stop by itself, failing, within 30 s (a
    /// configuration error at start, not an outage retried for ever). Its log.
    pub fn stopped_at_start(&mut self, name: &str, env: &[(&str, &str)]) -> String {
        let i = self.start_relay(name, env);
        let exit = self.relays[i].exit_within(Duration::from_secs(30), "it must stop at start");
        let log = self.relays[i].log_text();
        assert!(!exit.success(), "{log}");
        log
    }

    /// Start `relay-0` .. `relay-<n-1>`.
    pub fn start_relays(&mut self, n: usize) {
        for i in 0..n {
            self.start_relay(&format!("relay-{i}"), &[]);
        }
    }

    /// SIGKILL relay `i`, and start it again 700 ms later.
    pub async fn sigkill_and_restart(&mut self, i: usize) {
        self.relays[i].sigkill_and_restart().await;
    }

    /// (Re)create the business table and start writers.
    pub async fn start_writers(&self, plan: &WriterPlan) -> Writers {
        self.store.create_orders(plan.aggregates).await;
        Writers::start(self.store.clone(), plan)
    }

    /// Wait until nothing is pending.
    pub async fn drain(&self, what: &str, timeout: Duration) {
        let store = self.store.clone();
        wait_for(what, timeout, move || {
            let store = store.clone();
            async move { store.pending().await == 0 }
        })
        .await;
    }

    /// Require every relay process to be running.
    pub fn assert_relays_running(&mut self) {
        for relay in &mut self.relays {
            assert!(
                relay.is_running(),
                "{} died; log:\n{}",
                relay.name(),
                relay.log_text()
            );
        }
    }

    /// Wait until `relays` relays own the 32 shards between them.
    pub async fn wait_shared(&self, relays: usize) {
        self.wait_shared_within(relays, Duration::from_secs(30))
            .await;
    }

    /// [`Self::wait_shared`], for up to `timeout`.
    pub async fn wait_shared_within(&self, relays: usize, timeout: Duration) {
        let (config, env) = (self.config.clone(), self.broker.relay_env());
        wait_for(
            &format!("{relays} relays sharing the 32 shards"),
            timeout,
            move || {
                let (ok, status, _) = run_cli(&config, &["status", "--json"], &env);
                let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
                let shared = ok
                    && status["shards_owned"] == 32
                    && status["owners"].as_object().map(|o| o.len()) == Some(relays);
                async move { shared }
            },
        )
        .await;
    }

    /// Each relay's (name, log text).
    pub fn relay_logs(&self) -> Vec<(String, String)> {
        self.relays
            .iter()
            .map(|r| (r.name().to_owned(), r.log_text()))
            .collect()
    }

    /// SIGTERM every relay; each must exit cleanly.
    pub fn stop_relays(&mut self, timeout: Duration) {
        for relay in &mut self.relays {
            relay.stop(timeout);
        }
    }

    /// Look up the rows of the uncertain transactions: a row means it committed. How many did.
    /// (The rows must be kept: `retention` longer than the run.)
    pub async fn resolve_uncertain(&self, writes: &mut Writes) -> usize {
        let mut resolved = 0;
        for (event_id, aggregate) in std::mem::take(&mut writes.uncertain) {
            if let Some(id) = self.store.row_of(event_id).await {
                writes.committed.insert(event_id, (id, aggregate));
                resolved += 1;
            }
        }
        resolved
    }

    /// Read back what arrived, waiting (up to `timeout`) for `committed` where the broker side
    /// has to.
    pub async fn read_back(&self, committed: &Committed, timeout: Duration) -> Vec<Delivered> {
        let expected: HashSet<Uuid> = committed.keys().copied().collect();
        self.broker.read_back(&expected, timeout).await
    }

    /// When events are missing, find out what can be found, for the failure message
    /// ([`DeliveryCheck::findings`]): for a few of them, whether the outbox still holds the row
    /// and where the aggregate's events just before and after it were delivered; what the
    /// broker side can tell ([`BrokerSide::look_for_missing`]); and the relays' warnings and
    /// errors (`log_troubles`). `relay_logs` are (relay, log text).
    pub async fn look_for_missing(
        &self,
        writes: &Writes,
        check: &mut DeliveryCheck,
        delivered: &[Delivered],
        relay_logs: &[(String, String)],
    ) {
        if check.missing.is_empty() {
            return;
        }
        let where_delivered = |event_id: Uuid| {
            delivered
                .iter()
                .find(|m| m.event_id == event_id)
                .map(|m| {
                    let mut meta: Vec<String> =
                        m.meta.iter().map(|(k, v)| format!("{k} {v}")).collect();
                    meta.sort();
                    format!("{} {}", m.destination, meta.join(", "))
                })
                .unwrap_or_else(|| "not delivered".to_owned())
        };
        let mut findings = Vec::new();
        for event_id in check.missing.iter().take(5) {
            let (id, aggregate) = &writes.committed[event_id];
            let row = match self.store.row_of(*event_id).await {
                Some(_) => "still in the outbox table",
                None => "no longer in the outbox table",
            };
            let mut same: Vec<(i64, Uuid)> = writes
                .committed
                .iter()
                .filter(|(_, (_, a))| a == aggregate)
                .map(|(e, (i, _))| (*i, *e))
                .collect();
            same.sort();
            let at = same.iter().position(|(i, _)| i == id).unwrap_or_default();
            let neighbour = |n: Option<&(i64, Uuid)>| {
                n.map(|(i, e)| format!("id {i}: {}", where_delivered(*e)))
                    .unwrap_or_else(|| "none".to_owned())
            };
            let version = match self.store.business_version(aggregate).await {
                Some(version) => format!(
                    "its business row counts {version} committed transactions, the writers \
                     {}",
                    same.len()
                ),
                None => "its business row cannot tell how many transactions committed".to_owned(),
            };
            findings.push(format!(
                "{event_id} (aggregate {aggregate}, id {id}): its row is {row}; {version}; the \
                 aggregate's event before it, {}; after it, {}",
                neighbour(at.checked_sub(1).and_then(|i| same.get(i))),
                neighbour(same.get(at + 1))
            ));
        }
        let missing: HashSet<Uuid> = check.missing.iter().copied().collect();
        findings.extend(self.broker.look_for_missing(&missing, delivered).await);
        findings.extend(
            relay_logs
                .iter()
                .map(|(relay, log)| log_troubles(relay, log)),
        );
        check.findings = findings;
    }

    /// The delivery check of the scenario: every committed event arrived, nothing else did and
    /// nothing rolled back, first deliveries kept each aggregate's order (where the destination
    /// keeps order at all), each message is in its aggregate type's destination with its
    /// aggregate and payload; then the broker side's own checks.
    pub fn assert_delivery(&self, writes: &Writes, check: &DeliveryCheck, delivered: &[Delivered]) {
        assert!(
            check.missing.is_empty(),
            "{} committed events never arrived, e.g. {:?}{}",
            check.missing.len(),
            &check.missing[..check.missing.len().min(5)],
            check
                .findings
                .iter()
                .map(|finding| format!("\n  {finding}"))
                .collect::<String>()
        );
        assert!(
            check.unexpected.is_empty(),
            "events that were never committed arrived: {:?}",
            &check.unexpected[..check.unexpected.len().min(5)]
        );
        let rolled_back: HashSet<Uuid> = writes.rolled_back.iter().copied().collect();
        for m in delivered {
            assert!(
                !rolled_back.contains(&m.event_id),
                "rolled-back event {} was published",
                m.event_id
            );
        }
        if self.broker.ordered() {
            assert!(
                check.order_violations.is_empty(),
                "per-aggregate order broken ({} violations): {:?}",
                check.order_violations.len(),
                &check.order_violations[..check.order_violations.len().min(5)]
            );
        }
        for m in delivered {
            let (_, aggregate) = &writes.committed[&m.event_id];
            assert_eq!(&m.aggregate_id, aggregate, "{m:?}");
            assert_eq!(
                m.destination,
                self.broker.destination(aggregate_type_of(aggregate)),
                "{aggregate} in {}",
                m.destination
            );
            let payload: serde_json::Value =
                serde_json::from_slice(&m.payload).unwrap_or_else(|e| panic!("{e}: {m:?}"));
            assert_eq!(payload["aggregate"], aggregate.as_str(), "{m:?}");
            assert_eq!(payload["note"], "caf\u{e9}", "{m:?}");
        }
        self.broker.check_messages(delivered, &writes.committed);
    }

    /// The scenario: relays, writers, `relay-0` SIGKILLed and restarted once a third is written
    /// (and the fault, if any, then), drain, every relay alive and sharing the shards with
    /// nothing dead, a clean SIGTERM of each, uncertain writes resolved, read back, and
    /// [`Self::assert_delivery`].
    pub async fn run(&mut self, plan: Plan) -> Run {
        let events = plan
            .writers
            .events
            .expect("Scenario::run needs bounded writers");
        let ports: Vec<u16> = if plan.watch_health {
            (0..plan.relays).map(|_| free_port()).collect()
        } else {
            Vec::new()
        };
        for i in 0..plan.relays {
            let listen = ports.get(i).map(|port| format!("127.0.0.1:{port}"));
            let env: Vec<(&str, &str)> = listen
                .iter()
                .map(|l| ("OUTBOX_SERVER__LISTEN", l.as_str()))
                .collect();
            self.start_relay(&format!("relay-{i}"), &env);
        }
        let started = Instant::now();
        let writers = self.start_writers(&plan.writers).await;

        writers
            .wait_written(events / 3, Duration::from_secs(180))
            .await;
        let killed_at = writers.written();
        let mut sigkills = 0;
        if plan.sigkill {
            let mut killed = tokio::time::Instant::now();
            self.sigkill_and_restart(0).await;
            sigkills += 1;
            if let Some(period) = plan.sigkill_every {
                loop {
                    tokio::time::sleep_until(killed + period).await;
                    if writers.written() >= events {
                        break;
                    }
                    killed = tokio::time::Instant::now();
                    self.sigkill_and_restart(sigkills % plan.relays).await;
                    sigkills += 1;
                }
            }
        }
        let mut fault_note = String::new();
        let mut outage = None;
        if let Some((fault, hold)) = &plan.fault {
            let down = Instant::now();
            if ports.is_empty() {
                fault.begin().await;
                tokio::time::sleep(*hold).await;
                fault.end().await;
            } else {
                outage = Some(self.watch_fault(&**fault, *hold, &ports, &writers).await);
            }
            fault_note = format!(
                "; {} after {killed_at} writes, back after {:.1}s",
                fault.describe(),
                down.elapsed().as_secs_f64()
            );
        }
        let mut writes = writers.finish().await;
        let write_secs = started.elapsed().as_secs_f64();
        self.drain("the backlog to drain", Duration::from_secs(300))
            .await;
        let drain_secs = started.elapsed().as_secs_f64();
        if let Some(outage) = outage.as_mut() {
            wait_for_metric(
                "/metrics to show the drained backlog",
                ports[0],
                "outbox_pending_events",
                Duration::from_secs(30),
                |v| v == 0.0,
            )
            .await;
            outage.metrics_after = http_get(ports[0], "/metrics")
                .map(|(_, body)| body)
                .unwrap_or_default();
        }

        // Every relay is alive and they share the shards; nothing is dead.
        self.assert_relays_running();
        self.wait_shared(plan.relays).await;
        let status = self.settled_status().await;
        assert_eq!(status["pending"], 0, "{status}");
        assert_eq!(status["dead"], 0, "{status}");
        assert_eq!(status["shards_owned"], 32, "{status}");
        for owner in status["owners"].as_object().expect("owners").keys() {
            assert!(owner.starts_with("relay-"), "{status}");
        }
        self.stop_relays(Duration::from_secs(30));
        let relay_logs = self.relay_logs();

        assert_eq!(writes.committed.len() as u64, events);
        if plan.writers.rollbacks {
            assert!(!writes.rolled_back.is_empty());
        }
        let resolved = self.resolve_uncertain(&mut writes).await;
        let read_started = Instant::now();
        let delivered = self
            .read_back(&writes.committed, Duration::from_secs(180))
            .await;
        let read_secs = read_started.elapsed().as_secs_f64();
        let mut check = check_delivery(&writes.committed, &delivered);
        self.look_for_missing(&writes, &mut check, &delivered, &relay_logs)
            .await;
        println!(
            "{} → {}: {} committed ({} rolled back, {} failed attempts, {resolved} of them \
             committed after all){}{fault_note}; writes took {write_secs:.1}s, drained at \
             {drain_secs:.1}s; read back {} messages ({} distinct, {} duplicates) in \
             {read_secs:.1}s",
            self.store.name(),
            self.broker.name(),
            writes.committed.len(),
            writes.rolled_back.len(),
            writes.failed_attempts,
            match sigkills {
                0 => String::new(),
                1 => format!(", relay-0 SIGKILLed after {killed_at} writes and restarted"),
                n => format!(
                    ", {n} SIGKILLs of a relay (each restarted), the first after {killed_at} \
                     writes"
                ),
            },
            check.messages,
            check.distinct,
            check.duplicates
        );
        self.assert_delivery(&writes, &check, &delivered);
        Run {
            writes,
            resolved,
            delivered,
            check,
            killed_at,
            sigkills,
            status,
            relay_logs,
            write_secs,
            drain_secs,
            read_secs,
            outage,
        }
    }

    /// Begin `fault`, hold it (asking every relay's `/readyz` and `relay-0`'s `/metrics` every
    /// 250 ms), end it, require every relay still running, and wait until every relay is ready
    /// again.
    async fn watch_fault(
        &mut self,
        fault: &dyn Fault,
        hold: Duration,
        ports: &[u16],
        writers: &Writers,
    ) -> Outage {
        for port in ports {
            wait_for_ready("the relays ready", *port, 200, Duration::from_secs(30)).await;
        }
        let mut outage = Outage {
            pending_before: self.store.pending().await,
            ..Outage::default()
        };
        let written_before = writers.written();
        fault.begin().await;
        let began = Instant::now();
        loop {
            if ports
                .iter()
                .any(|port| matches!(http_get(*port, "/readyz"), Some((503, _))))
            {
                outage.not_ready_seen = true;
            }
            if let Some(pending) = metric_at(ports[0], "outbox_pending_events") {
                outage.pending_metric_peak = outage.pending_metric_peak.max(pending);
            }
            let held = began.elapsed();
            if held >= hold && (outage.not_ready_seen || held >= hold.max(Duration::from_secs(60)))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        outage.pending_at_end = self.store.pending().await;
        outage.written_during = writers.written() - written_before;
        outage.ready_at_end = http_get(ports[0], "/readyz").map(|(code, _)| code);
        outage.held = began.elapsed();
        fault.end().await;
        // A relay that died while the fault held is still dead now (and the fault is over
        // whatever happens here).
        self.assert_relays_running();
        let ended = Instant::now();
        for port in ports {
            wait_for_ready(
                "the relays ready after the fault",
                *port,
                200,
                Duration::from_secs(60),
            )
            .await;
        }
        outage.ready_after = ended.elapsed().as_secs_f64();
        outage
    }

    /// One relay and 60 events over 6 aggregates, the 11th (aggregate `a4`) with a payload of
    /// `blob_kib` KiB: that event, and only it, ends dead at its first attempt (rejected, not
    /// retried), after the broker's or the sink's refusal that `expected_error` accepts (its
    /// `last_error`), while every other event arrives, in order per aggregate where the
    /// destination keeps it — the later events of `a4` included (`on_dead = "skip"`). Prints
    /// the error.
    pub async fn oversized_event_ends_dead(
        &mut self,
        blob_kib: usize,
        expected_error: impl Fn(&str) -> bool,
    ) {
        let events: Vec<NewEvent> = (0..60)
            .map(|i| {
                let payload = if i == 10 {
                    serde_json::json!({ "i": i, "blob": "z".repeat(blob_kib * 1024) })
                } else {
                    serde_json::json!({ "i": i })
                };
                NewEvent::new("order", format!("a{}", i % 6), "Changed", payload)
                    .event_id(Uuid::now_v7())
            })
            .collect();
        let big = events[10].event_id.expect("set above");
        let ids = self.store.enqueue_many(&events).await;
        self.start_relay("relay-big", &[]);
        self.drain("the backlog to drain", Duration::from_secs(60))
            .await;

        let dead = self.store.dead_rows().await;
        assert_eq!(
            dead.len(),
            1,
            "exactly the oversized event is dead: {dead:?}"
        );
        let Some(big_row) = dead.iter().find(|row| row.event_id == big) else {
            panic!("the oversized event is not dead; dead rows: {dead:?}");
        };
        assert_eq!(big_row.attempts, 1, "rejected at once, not retried");
        let last_error = &big_row.last_error;
        assert!(
            expected_error(last_error),
            "the refusal must be recorded: {last_error}"
        );
        let status = self.settled_status().await;
        assert_eq!(status["dead"], 1, "{status}");
        assert_eq!(status["pending"], 0, "{status}");
        println!("dead at its first attempt with: {last_error}");

        let relay = &mut self.relays[0];
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
        let committed: Committed = events
            .iter()
            .zip(&ids)
            .filter_map(|(e, id)| Some((e.event_id?, (*id, e.aggregate_id.clone()))))
            .filter(|(event_id, _)| *event_id != big)
            .collect();
        let later_of_a4 = events[11..].iter().filter(|e| e.aggregate_id == "a4");
        assert!(later_of_a4.count() > 0);
        let delivered = self.read_back(&committed, Duration::from_secs(60)).await;
        let check = check_delivery(&committed, &delivered);
        let expected: HashSet<Uuid> = committed.keys().copied().collect();
        let findings = if check.missing.is_empty() {
            Vec::new()
        } else {
            let missing: HashSet<Uuid> = check.missing.iter().copied().collect();
            self.broker.look_for_missing(&missing, &delivered).await
        };
        let delivered_ids: HashSet<Uuid> = delivered.iter().map(|d| d.event_id).collect();
        assert_eq!(
            delivered_ids,
            expected,
            "every other event, a4's later ones included, and not the oversized one; {}",
            findings.join("; ")
        );
        if self.broker.ordered() {
            assert!(
                check.order_violations.is_empty(),
                "{:?}",
                check.order_violations
            );
        }
    }

    /// Delete the broker's destinations and drop the tables.
    pub async fn cleanup(&self) {
        self.broker.cleanup().await;
        self.store.drop_tables().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_events_carry_what_the_checks_read() {
        let event = scenario_event(3, 7, 42);
        assert_eq!(event.aggregate_type, "order");
        assert_eq!(event.aggregate_id, "42");
        let payload: serde_json::Value = serde_json::from_slice(event.payload.as_bytes()).unwrap();
        assert_eq!(payload["aggregate"], "42");
        assert_eq!(payload["note"], "caf\u{e9}");
        assert_eq!(event.headers["traceparent"], TRACEPARENT);
        assert_eq!(aggregate_type_of("43"), "customer");
    }
}
