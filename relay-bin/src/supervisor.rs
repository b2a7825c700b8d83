//! `outbox-relay run`: one [`Relay`] per pipeline in one process, each with its own store
//! (its own pool and shard session), its own sink and its own tasks, so that one pipeline's
//! outage or backlog does not stop the others.
//!
//! At start every pipeline connects at once. An error of kind configuration in any pipeline (a
//! key the adapter refuses, a certificate the relay does not trust, a stream that does not
//! exist) stops the process, naming the pipeline. Any other error at start (a database or broker
//! that cannot be reached, refused credentials, a table not migrated) stops it too when there
//! is only one pipeline (the orchestrator restarts the process, as before pipelines existed)
//! unless `run --wait`; with several, or `--wait`, that pipeline keeps trying on its own, shown
//! as not ready on `/readyz`, while the others relay. SIGTERM or SIGINT while they connect
//! ends the start with exit code 0. A
//! panic in an adapter while a pipeline connects ends the start too, naming the pipeline (a bug
//! that trying again would only repeat); a pipeline's task that panics later ends that
//! pipeline with an error naming it, as an error would.
//!
//! A pipeline whose `store.table` is a pattern runs one relay per table it matches, all sharing
//! the pipeline's sink, each labelled `<pipeline>/<table>`. Every `discovery_interval` it looks
//! again: a new table gets its relay, a dropped table's relay stops cleanly (its in-flight
//! batch finished and marked), and a table that was never migrated is reported (on `/readyz`,
//! in `status` and in the `outbox_discovered_tables` gauge) and tried again at each scan.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outboxkit_core::{ErrorKind, Relay, RelayHandle, Shutdown, ShutdownTrigger, Sink, Store};
use tracing::{error, info, warn, Instrument};

use crate::cli::{Failure, Loaded};
use crate::pipeline::Pipeline;
use crate::registry::{Discovered, FactoryContext, Registry};

/// What each pipeline is doing, for `/healthz` and `/readyz`.
#[derive(Debug, Clone, Default)]
pub struct Board {
    slots: Arc<Mutex<BTreeMap<String, Slot>>>,
}

#[derive(Debug, Clone)]
enum Slot {
    /// Not connected yet: the last error.
    Connecting(String),
    /// A discovered table that was never migrated: the store's error.
    Unmigrated(String),
    /// A pattern pipeline whose pattern matches no table now, or only other pipelines' tables
    /// (then why, as `status` says it): nothing to do, ready.
    NoTable(Option<String>),
    /// Relaying.
    Relaying(RelayHandle),
}

impl Board {
    fn set(&self, pipeline: &str, slot: Slot) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(pipeline.to_owned(), slot);
    }

    fn remove(&self, pipeline: &str) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(pipeline);
    }

    fn snapshot(&self) -> Vec<(String, Slot)> {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Every pipeline's relay loop is running, or it is still trying to connect.
    pub fn is_alive(&self) -> bool {
        self.snapshot().iter().all(|(_, slot)| match slot {
            Slot::Connecting(_) | Slot::Unmigrated(_) | Slot::NoTable(_) => true,
            Slot::Relaying(handle) => handle.is_alive(),
        })
    }

    /// Whether every pipeline is ready, and one line per pipeline saying so or why not:
    /// `billing: ready, 16 shards owned` (`, paused by an operator ...` while a pause holds),
    /// `orders: not ready: <error>`.
    pub fn readiness(&self) -> (bool, String) {
        let mut all_ready = true;
        let mut body = String::new();
        for (name, slot) in self.snapshot() {
            let line = match slot {
                Slot::Relaying(handle) if handle.is_ready() => format!(
                    "ready, {} shards owned{}",
                    handle.shards_owned(),
                    if handle.is_paused() {
                        ", paused by an operator (`status` says who and why)"
                    } else {
                        ""
                    }
                ),
                Slot::Relaying(handle) => {
                    all_ready = false;
                    format!(
                        "not ready: {}",
                        handle.last_error().unwrap_or_else(|| "starting".to_owned())
                    )
                }
                Slot::Connecting(error) => {
                    all_ready = false;
                    format!("not ready: {error}")
                }
                Slot::Unmigrated(error) => {
                    all_ready = false;
                    format!("not migrated, not relayed: {error}")
                }
                Slot::NoTable(None) => "ready, no table matches the pattern yet".to_owned(),
                Slot::NoTable(Some(why)) => format!("ready, {why}"),
            };
            body.push_str(&format!("{name}: {line}\n"));
        }
        (all_ready && !body.is_empty(), body)
    }
}

/// A pipeline's store and sink, connected and checked.
struct Connected {
    store: Arc<dyn Store>,
    sink: Arc<dyn Sink>,
}

/// Build the store and the sink of the pipeline `ctx` describes, and check both.
async fn connect(
    registry: &Registry,
    ctx: FactoryContext<'_>,
) -> outboxkit_core::Result<Connected> {
    let store = registry.build_store(ctx).await?;
    let sink = registry.build_sink(ctx).await?;
    store.check().await?;
    sink.check().await?;
    Ok(Connected { store, sink })
}

/// Relay every pipeline of `pipelines` until SIGTERM/SIGINT, serving `/metrics`, `/healthz` and
/// `/readyz` for all of them.
pub async fn run(
    registry: &Registry,
    loaded: Arc<Loaded>,
    pipelines: Vec<Pipeline>,
    wait: bool,
) -> Result<(), Failure> {
    let several = pipelines.len() > 1;
    // Whether a pipeline that cannot connect at start keeps trying (`run --wait`, or several).
    let keep_trying = several || wait;
    // One relay id for the whole process: `status` shows one owner per process and table.
    let process_id = outboxkit_core::default_relay_id();
    let pipelines: Vec<Pipeline> = pipelines
        .into_iter()
        .map(|mut p| {
            p.relay.relay_id.get_or_insert_with(|| process_id.clone());
            p
        })
        .collect();
    let (trigger, shutdown) = Shutdown::channel();
    // Listen before anything connects: a signal while the pipelines connect (a broker that
    // does not answer can hold that for `connect_timeout`) ends the start with exit code 0
    // instead of killing the process.
    let mut signals = Signals::listen();
    tokio::spawn(async move {
        let signal = signals.next().await;
        if signal == "SIGHUP" {
            info!(
                "SIGHUP: {} does not reload its configuration; it stops as on SIGTERM (start it \
                 again to apply a changed configuration)",
                outboxkit_core::command::name()
            );
        }
        info!(signal, "shutdown requested: finishing in-flight work");
        trigger.trigger();
        let signal = signals.next().await;
        warn!(
            signal,
            "second signal: exiting now; unacknowledged events stay pending"
        );
        std::process::exit(130);
    });
    let metrics = crate::server::install_recorder().map_err(Failure::runtime)?;
    let board = Board::default();

    // Connect every pipeline at once; configuration errors end the start, and so does a panic
    // in an adapter (a bug: trying again would only panic again).
    let mut attempts = Tasks::default();
    for (i, pipeline) in pipelines.iter().enumerate() {
        let (registry, loaded, pipeline) = (registry.clone(), loaded.clone(), pipeline.clone());
        let span = relay_span(&pipeline.name);
        attempts.spawn(
            &pipeline.name.clone(),
            async move { (i, start(&registry, &loaded, &pipeline).await) }.instrument(span),
        );
    }
    let connecting = async {
        let mut answers = Vec::new();
        while let Some((label, joined)) = attempts.next().await {
            match joined {
                Ok(answer) => answers.push(answer),
                Err(broke) if several => {
                    return Err(Failure::runtime(format!(
                        "pipeline {label}: connecting {broke}"
                    )))
                }
                Err(broke) => return Err(Failure::runtime(format!("connecting {broke}"))),
            }
        }
        Ok(answers)
    };
    let mut stop = shutdown.clone();
    let mut answers: Vec<_> = tokio::select! {
        answers = connecting => answers?,
        () = stop.wait() => {
            info!("stopped while connecting: nothing was relayed");
            return Ok(());
        }
    };
    answers.sort_by_key(|(i, _)| *i);
    let mut ready = Vec::new();
    let mut waiting = Vec::new();
    for (i, attempt) in answers {
        let pipeline = &pipelines[i];
        match attempt {
            Ok(started) => ready.push((pipeline, started)),
            Err(e) if keep_trying && e.kind() != ErrorKind::Config => {
                if several {
                    warn!(pipeline = %pipeline.name, error = %e, "cannot connect yet; this pipeline keeps trying, the others start");
                } else {
                    warn!(pipeline = %pipeline.name, error = %e, "cannot connect yet; keeps trying (run --wait), not ready meanwhile");
                }
                board.set(&pipeline.name, Slot::Connecting(e.full_message()));
                waiting.push(pipeline);
            }
            Err(e) if several => {
                let failure = Failure::from(e);
                return Err(Failure {
                    message: format!("pipeline {}: {}", pipeline.name, failure.message),
                    code: failure.code,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }

    if !loaded.settings.server.listen.is_empty() {
        let listener = crate::server::bind(&loaded.settings.server.listen)
            .await
            .map_err(Failure::config)?;
        tokio::spawn(crate::server::serve(
            listener,
            board.clone(),
            metrics,
            shutdown.clone(),
        ));
    }

    // One table: its relay runs on this task (the runtime's main thread), as before pipelines
    // existed, leaving both worker threads to the sink's and the session's I/O.
    let alone = ready.len() == 1 && waiting.is_empty();
    let mut tasks = Tasks::default();
    for (pipeline, started) in ready {
        let span = relay_span(&pipeline.name);
        match started {
            Started::One(connected) => {
                let relay = relay(&pipeline.name, pipeline, connected, &board)?;
                if alone {
                    return relay
                        .run(shutdown)
                        .instrument(span)
                        .await
                        .map_err(Failure::from);
                }
                tasks.spawn(&pipeline.name, relay.run(shutdown.clone()).instrument(span));
            }
            Started::Pattern(scan) => {
                let (registry, loaded, pipeline) =
                    (registry.clone(), loaded.clone(), pipeline.clone());
                let (board, shutdown) = (board.clone(), shutdown.clone());
                tasks.spawn(
                    &pipeline.name.clone(),
                    async move {
                        discover_and_relay(&registry, &loaded, &pipeline, scan, &board, shutdown)
                            .await
                    }
                    .instrument(span),
                );
            }
        }
    }
    for pipeline in waiting {
        let (registry, loaded, pipeline) = (registry.clone(), loaded.clone(), pipeline.clone());
        let (board, shutdown) = (board.clone(), shutdown.clone());
        let span = relay_span(&pipeline.name);
        tasks.spawn(
            &pipeline.name.clone(),
            async move { keep_connecting(&registry, &loaded, &pipeline, &board, shutdown).await }
                .instrument(span),
        );
    }

    let mut outcome = Ok(());
    while let Some((label, joined)) = tasks.next().await {
        let result = match joined {
            Ok(result) => result.map_err(Failure::from),
            Err(broke) => Err(Failure::runtime(format!(
                "pipeline {label}: relaying {broke}"
            ))),
        };
        if let Err(failure) = result {
            error!(pipeline = %label, error = %failure.message, "a pipeline stopped with an error");
            outcome = Err(failure);
        }
    }
    outcome
}

/// The pipelines' tasks, each known by its pipeline's name: a task that panicked (a bug, in an
/// adapter or in the relay) ends as an error naming its pipeline, where a plain `JoinSet`
/// would hand the panic on to the process.
struct Tasks<T> {
    set: tokio::task::JoinSet<T>,
    labels: std::collections::HashMap<tokio::task::Id, String>,
}

impl<T> Default for Tasks<T> {
    fn default() -> Self {
        Self {
            set: tokio::task::JoinSet::new(),
            labels: Default::default(),
        }
    }
}

impl<T: Send + 'static> Tasks<T> {
    fn spawn(&mut self, label: &str, task: impl std::future::Future<Output = T> + Send + 'static) {
        let id = self.set.spawn(task).id();
        self.labels.insert(id, label.to_owned());
    }

    /// The next task to end: its label, and its output or why it has none (`panicked: ...`,
    /// said after what it was doing).
    async fn next(&mut self) -> Option<(String, Result<T, String>)> {
        let (id, output) = match self.set.join_next_with_id().await? {
            Ok((id, output)) => (id, Ok(output)),
            Err(e) => (e.id(), Err(broke(e))),
        };
        Some((self.labels.remove(&id).unwrap_or_default(), output))
    }
}

/// Why a task has no output, to follow what it was doing (`connecting`, `relaying`).
fn broke(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(panic) => format!(
            "panicked: {} (a bug, most likely in an adapter; the `panicked` log line before \
             says where)",
            outboxkit_core::error::panic_message(panic.as_ref())
        ),
        Err(e) => format!("was cancelled: {e}"),
    }
}

/// The span every log line of a pipeline's relay is written in, its tasks' and callbacks' too:
/// `relay{pipeline=billing}` (JSON: `"span":{"pipeline":"billing","name":"relay"}`); `label` is
/// the pipeline's name, or `<pipeline>/<table>` for a table a pattern found.
fn relay_span(label: &str) -> tracing::Span {
    tracing::info_span!("relay", pipeline = %label)
}

/// A relay of `pipeline` labelled `label` (its name, or a discovered table's
/// `<pipeline>/<table>`), on the board.
fn relay(
    label: &str,
    pipeline: &Pipeline,
    connected: Connected,
    board: &Board,
) -> Result<Relay, Failure> {
    let mut relay =
        Relay::new(connected.store, connected.sink, pipeline.relay.clone())?.pipeline(label);
    if pipeline.rekeys() {
        // Its store's and sink's errors name its own keys (`pipelines.billing.store.url`,
        // `sink.destination`).
        let pipeline = pipeline.clone();
        relay = relay.rekey_errors(move |e| pipeline.rekey_error(e));
    }
    board.set(label, Slot::Relaying(relay.handle()));
    Ok(relay)
}

/// What a pipeline starts with: its store and sink, or (a pattern) its sink and the first scan.
enum Started {
    One(Connected),
    Pattern(Scan),
}

/// A pattern pipeline's sink, scan interval and what the last scan found.
struct Scan {
    sink: Arc<dyn Sink>,
    interval: Duration,
    found: Discovered,
}

/// Connect `pipeline`: its store and sink; or, when its table is a pattern, its sink and the
/// tables the pattern matches now (none is an error with `require_match`, else a warning).
/// Errors name the pipeline's keys (`pipelines.billing.store.url`).
async fn start(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
) -> outboxkit_core::Result<Started> {
    connect_or_scan(registry, loaded, pipeline)
        .await
        .map_err(|e| pipeline.rekey_error(e))
}

async fn connect_or_scan(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
) -> outboxkit_core::Result<Started> {
    let ctx = loaded.context(pipeline);
    let Some(discovery) = registry.discovery(ctx)? else {
        return Ok(Started::One(connect(registry, ctx).await?));
    };
    let found = loaded.discover(registry, pipeline).await?;
    if found.tables.is_empty() {
        let message = match found.elsewhere.first() {
            None => format!(
                "{}.table: the pattern matches no table yet",
                pipeline.store_key
            ),
            Some(claimed) => format!(
                "{}.table: the pattern matches no table of its own yet ({} is relayed by \
                 pipeline {})",
                pipeline.store_key, claimed.table, claimed.pipeline
            ),
        };
        if discovery.require_match {
            return Err(outboxkit_core::Error::config(format!(
                "{message}, and {}.require_match is true",
                pipeline.store_key
            )));
        }
        warn!(pipeline = %pipeline.name, "{message}: looking again every {:?}", discovery.interval);
    }
    let sink = registry.build_sink(ctx).await?;
    sink.check().await?;
    Ok(Started::Pattern(Scan {
        sink,
        interval: discovery.interval,
        found,
    }))
}

/// A running relay of a discovered table.
struct TableRelay {
    trigger: ShutdownTrigger,
    task: tokio::task::JoinHandle<outboxkit_core::Result<()>>,
}

/// Relay every table of a pattern pipeline, scanning again every interval, until shutdown.
async fn discover_and_relay(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
    scan: Scan,
    board: &Board,
    mut shutdown: Shutdown,
) -> outboxkit_core::Result<()> {
    let Scan {
        sink,
        interval,
        found,
    } = scan;
    let mut found = Some(found);
    let mut running: BTreeMap<String, TableRelay> = BTreeMap::new();
    // Tables not relayed: their label and whether they were never migrated.
    let mut idle: BTreeMap<String, bool> = BTreeMap::new();
    // Tables matched and left to another pipeline (said once each).
    let mut left: BTreeSet<String> = BTreeSet::new();
    loop {
        if let Some(Discovered { tables, elsewhere }) = found.take() {
            for claimed in &elsewhere {
                if !left.contains(&claimed.table) {
                    warn!(table = %claimed.table, relayed_by = %claimed.pipeline, "the pattern matches a table that another pipeline relays: it is left to that pipeline");
                }
            }
            let none_because = (!elsewhere.is_empty()).then(|| crate::cli::no_table(&elsewhere));
            left = elsewhere.into_iter().map(|c| c.table).collect();
            let labels: BTreeSet<String> = tables
                .iter()
                .map(|t| format!("{}/{}", pipeline.name, t.table))
                .collect();
            // Dropped tables: stop their relays (each finishes and marks its batch).
            let gone: Vec<String> = running
                .keys()
                .filter(|label| !labels.contains(*label))
                .cloned()
                .collect();
            for label in gone {
                if let Some(table) = running.remove(&label) {
                    table.trigger.trigger();
                    let _ = table.task.await;
                }
                board.remove(&label);
                info!(table = %label, "the table is gone: its relay stopped");
            }
            idle.retain(|label, _| {
                let keep = labels.contains(label);
                if !keep {
                    board.remove(label);
                }
                keep
            });
            // New tables (and ones that failed before): connect and relay.
            for table in tables {
                let label = format!("{}/{}", pipeline.name, table.table);
                if running.contains_key(&label) {
                    continue;
                }
                let connected = async {
                    let store = table.build().await?;
                    store.check().await?;
                    Ok::<_, outboxkit_core::Error>(Connected {
                        store,
                        sink: sink.clone(),
                    })
                };
                match connected.await.map_err(|e| pipeline.rekey_error(e)) {
                    Ok(connected) => {
                        let relay = relay(&label, pipeline, connected, board)
                            .map_err(|f| outboxkit_core::Error::config(f.message))?;
                        let (trigger, own) = Shutdown::channel();
                        let span = relay_span(&label);
                        let task = tokio::spawn(relay.run(own).instrument(span));
                        info!(table = %label, "relaying a discovered table");
                        idle.remove(&label);
                        running.insert(label, TableRelay { trigger, task });
                    }
                    Err(e) => {
                        let unmigrated = matches!(e.kind(), ErrorKind::Schema | ErrorKind::Config);
                        if idle.insert(label.clone(), unmigrated) != Some(unmigrated) {
                            if unmigrated {
                                warn!(table = %label, error = %e, "found a table that cannot be relayed as it is (run {}); looking again at each scan", outboxkit_core::command::line("migrate"));
                            } else {
                                warn!(table = %label, error = %e, "cannot connect a discovered table; trying again at each scan");
                            }
                        }
                        let message = e.full_message();
                        board.set(
                            &label,
                            if unmigrated {
                                Slot::Unmigrated(message)
                            } else {
                                Slot::Connecting(message)
                            },
                        );
                    }
                }
            }
            record_tables(&pipeline.name, running.len(), &idle);
            if running.is_empty() && idle.is_empty() {
                board.set(&pipeline.name, Slot::NoTable(none_because));
            } else {
                board.remove(&pipeline.name);
            }
        }
        // A relay that ended by itself is started again at the next scan.
        let ended: Vec<String> = running
            .iter()
            .filter(|(_, t)| t.task.is_finished())
            .map(|(label, _)| label.clone())
            .collect();
        for label in ended {
            if let Some(table) = running.remove(&label) {
                if let Ok(Err(e)) = table.task.await {
                    error!(table = %label, error = %e, "a table's relay stopped with an error; starting it again at the next scan");
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.wait() => break,
        }
        match loaded.discover(registry, pipeline).await {
            Ok(discovered) => found = Some(discovered),
            Err(e) => {
                warn!(error = %e, "scanning for tables failed; the running ones go on, looking again later")
            }
        }
    }
    for table in running.values() {
        table.trigger.trigger();
    }
    for (_, table) in running {
        let _ = table.task.await;
    }
    Ok(())
}

/// The `outbox_discovered_tables` gauge of a pattern pipeline.
fn record_tables(pipeline: &str, relaying: usize, idle: &BTreeMap<String, bool>) {
    use outboxkit_core::metrics as m;
    let unmigrated = idle.values().filter(|u| **u).count();
    let failing = idle.len() - unmigrated;
    for (state, n) in [
        ("relaying", relaying),
        ("unmigrated", unmigrated),
        ("failing", failing),
    ] {
        metrics::gauge!(m::DISCOVERED_TABLES, m::PIPELINE => pipeline.to_owned(), "state" => state)
            .set(n as f64);
    }
}

/// Retry connecting `pipeline` (1 s, doubling up to 30 s) until it connects, then relay; stop
/// at shutdown.
async fn keep_connecting(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
    board: &Board,
    mut shutdown: Shutdown,
) -> outboxkit_core::Result<()> {
    let mut delay = Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait() => return Ok(()),
        }
        match start(registry, loaded, pipeline).await {
            Ok(Started::One(connected)) => {
                info!("connected");
                let relay = relay(&pipeline.name, pipeline, connected, board)
                    .map_err(|f| outboxkit_core::Error::config(f.message))?;
                return relay.run(shutdown).await;
            }
            Ok(Started::Pattern(scan)) => {
                info!("connected");
                board.remove(&pipeline.name);
                return discover_and_relay(registry, loaded, pipeline, scan, board, shutdown).await;
            }
            Err(e) => {
                warn!(error = %e, retry_in = ?delay, "cannot connect yet");
                board.set(&pipeline.name, Slot::Connecting(e.full_message()));
                delay = (delay * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// SIGTERM, SIGINT (Ctrl-C) and SIGHUP (the terminal closed, or `kill -HUP`), listened for
/// from the moment [`Signals::listen`] returns. Each stops the relay gracefully: it reloads
/// nothing on SIGHUP, and the signal's default action would end it with its batch unmarked.
struct Signals {
    #[cfg(unix)]
    unix: Option<[tokio::signal::unix::Signal; 3]>,
}

impl Signals {
    /// Take SIGTERM, SIGINT and SIGHUP over from their default action (ending the process) now.
    fn listen() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let unix = (|| {
                Ok::<_, std::io::Error>([
                    signal(SignalKind::terminate())?,
                    signal(SignalKind::interrupt())?,
                    signal(SignalKind::hangup())?,
                ])
            })();
            Self { unix: unix.ok() }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal's name.
    async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        if let Some([term, interrupt, hangup]) = &mut self.unix {
            return tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = interrupt.recv() => "SIGINT",
                _ = hangup.recv() => "SIGHUP",
            };
        }
        let _ = tokio::signal::ctrl_c().await;
        "Ctrl-C"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_pipeline_is() {
        let board = Board::default();
        assert_eq!(board.readiness(), (false, String::new()), "nothing yet");
        board.set(
            "billing",
            Slot::Connecting("PostgreSQL at db:5432 is unreachable".into()),
        );
        let (ready, body) = board.readiness();
        assert!(!ready);
        assert_eq!(
            body,
            "billing: not ready: PostgreSQL at db:5432 is unreachable\n"
        );
        assert!(board.is_alive(), "connecting is alive");

        let handle = RelayHandle::default();
        board.set("orders", Slot::Relaying(handle.clone()));
        assert!(!board.is_alive(), "a relay loop that is not running");
        let (_, body) = board.readiness();
        assert!(body.ends_with("orders: not ready: starting\n"), "{body}");

        let board = Board::default();
        board.set("tenants", Slot::NoTable(None));
        assert_eq!(
            board.readiness(),
            (
                true,
                "tenants: ready, no table matches the pattern yet\n".to_owned()
            )
        );
        board.set("tenants/t9.outbox", Slot::Unmigrated("not migrated".into()));
        board.remove("tenants");
        let (ready, body) = board.readiness();
        assert!(!ready);
        assert_eq!(
            body,
            "tenants/t9.outbox: not migrated, not relayed: not migrated\n"
        );
    }
}
