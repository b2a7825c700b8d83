//! `--capture-compare`: PostgreSQL → Redis Streams with `store.capture = "poll"` beside
//! `"logical"` in table style and in message style, in one run, on one PostgreSQL cluster the
//! bench starts itself (`wal_level = logical`; the machine's shared server runs `replica`),
//! with `fsync` on and `shared_buffers = 128MB` like the shared one. Each mode has its own
//! outbox table; writers are the same business transaction in every mode (lock the order row,
//! write the event, commit), so the differences are the relay's. Before each measurement of a
//! logical mode its slot is moved to the log's end, so no mode decodes another's writes.
//!
//! Per mode: drain (a backlog written in transactions of 100 events, timed from the relay's
//! start until Redis holds every event), commit→receive p50/p99 at each `--latency-rates` rate,
//! the database's CPU per event at those rates (every process of the cluster, user + system),
//! writers with the relay running as a share of writers with it stopped, and the relay's peak
//! RSS. Medians of `--runs` runs (min–max), the modes taking turns in each run.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::{LogicalSide, PostgresSide, PrivatePostgres, StoreSide};
use serde::{Deserialize, Serialize};

use crate::article::Article;
use crate::pair::{peak_rss_mib, stop, Pair, PAD, WRITER_CONNECTIONS};
use crate::pipelines::{clock_ticks, cpu_secs};
use crate::report::Figure;
use crate::Args;

/// One capture mode's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Mode {
    pub name: String,
    pub figures: Vec<Figure>,
}

/// The comparison, as written to docs/bench/capture.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub date: String,
    pub command: String,
    pub server: String,
    pub events: u64,
    pub aggregates: u64,
    pub runs: usize,
    pub modes: Vec<Mode>,
}

/// A mode: its pair (store side and Redis), and its slot when it reads the log.
struct Contender {
    name: &'static str,
    pair: Pair,
    slot: Option<String>,
    /// A pool on its database, for the slot.
    pool: sqlx::PgPool,
    figures: Vec<Figure>,
}

/// User + system CPU seconds of the whole cluster: the postmaster with its reaped children
/// (`cutime`, `cstime`), and every live child.
fn cluster_cpu_secs(postmaster: u32, ticks: f64) -> f64 {
    let mut total = cpu_secs(postmaster, ticks);
    let stat = std::fs::read_to_string(format!("/proc/{postmaster}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    total += [13, 14]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum::<f64>()
        / ticks;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(postmaster) {
            total += cpu_secs(pid, ticks);
        }
    }
    total
}

impl Contender {
    /// Mode `name`: `side` (on `pool`) to Redis Streams, reading `slot` when it reads the log.
    async fn new(
        args: &Args,
        name: &'static str,
        side: Arc<dyn StoreSide>,
        pool: &sqlx::PgPool,
        slot: Option<&str>,
    ) -> Result<Self, String> {
        Ok(Self {
            name,
            pair: Pair::with_side(args, side, Article::Postgres(pool.clone()), "redis-streams")
                .await?,
            slot: slot.map(str::to_owned),
            pool: pool.clone(),
            figures: Vec::new(),
        })
    }

    fn figure(&mut self, name: &str, unit: &str) -> &mut Figure {
        if let Some(i) = self.figures.iter().position(|f| f.name == name) {
            return &mut self.figures[i];
        }
        self.figures.push(Figure::new(name, unit));
        self.figures.last_mut().expect("just pushed")
    }

    /// Move the slot to the log's end (no relay runs): what earlier measurements wrote, of
    /// any mode, is not read (each measurement empties the outbox table first). The server's
    /// sender for a relay just stopped may hold the slot a moment longer: waited for, up to
    /// 10 s.
    async fn skip_others(&self) -> Result<(), String> {
        let Some(slot) = &self.slot else {
            return Ok(());
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let advanced =
                sqlx::query("SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())")
                    .bind(slot)
                    .execute(&self.pool)
                    .await;
            match advanced {
                Ok(_) => return Ok(()),
                // object_in_use: the last run's relay still reads the slot.
                Err(e)
                    if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55006")
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => {
                    return Err(format!(
                        "{}: moving the slot to the log's end: {e}",
                        self.name
                    ))
                }
            }
        }
    }

    /// Load `events`, start one relay, time until Redis holds them all; (events/s, peak RSS).
    async fn drain(&self, events: u64, aggregates: u64) -> Result<(f64, f64), String> {
        self.skip_others().await?;
        let broker = self.pair.broker();
        broker.reset().await?;
        self.pair
            .store()
            .bulk_load(events, aggregates, PAD, outboxkit_core::PayloadType::Json)
            .await;
        let config = self.pair.config();
        let started = Instant::now();
        let relay = self.pair.start_relay(&config, 0);
        let deadline = started + Duration::from_secs(900);
        while broker.side().held(events, Duration::ZERO).await < events {
            if Instant::now() > deadline {
                return Err(format!("{}: not drained in 15 minutes", self.name));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let rate = events as f64 / started.elapsed().as_secs_f64();
        let rss = peak_rss_mib(relay.id());
        // Not timed: the relay confirms (or marks) the last events before it stops.
        let side = self.pair.store();
        let settle = Instant::now() + Duration::from_secs(120);
        while side.any_pending().await && Instant::now() < settle {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop(relay);
        Ok((rate, rss))
    }
}

pub async fn compare(args: &Args, command: String) -> Result<Comparison, String> {
    let server = PrivatePostgres::start_logical_tuned(
        "outboxkit-bench-capture",
        "fsync = on\nshared_buffers = 128MB\nmax_connections = 200\n",
    );
    let postmaster = server
        .postmaster_pid()
        .ok_or("the bench's PostgreSQL has no postmaster.pid")?;
    let url = server.url("postgres", "sslmode=disable");
    let connections = WRITER_CONNECTIONS as u32;
    let poll = Arc::new(PostgresSide::open_with_pool(&url, "bench_poll", connections).await);
    // Each mode's own writers: polling's lock the order row first (its writer contract),
    // logical capture's do not need to.
    let table = Arc::new(
        LogicalSide::open_with_pool(&server, "bench_log_table", "table", connections).await,
    );
    let message = Arc::new(
        LogicalSide::open_with_pool(&server, "bench_log_message", "message", connections).await,
    );
    let version = poll.server_version().await;
    let mut contenders = vec![Contender::new(args, "poll", poll.clone(), poll.pool(), None).await?];
    for (name, side) in [
        ("logical, table style", table),
        ("logical, message style", message),
    ] {
        let contender =
            Contender::new(args, name, side.clone(), side.pool(), Some(side.slot())).await?;
        contenders.push(contender);
    }
    for c in &contenders {
        let config = c.pair.config();
        let out = std::process::Command::new(&args.relay_bin)
            .arg("--config")
            .arg(&config)
            .arg("migrate")
            .output()
            .map_err(|e| format!("running {}: {e}", args.relay_bin.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{}: migrate failed: {}{}",
                c.name,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    if let Ok(only) = std::env::var("BENCH_CAPTURE_ONLY") {
        contenders.retain(|c| c.name.contains(only.as_str()));
    }
    let ticks = clock_ticks();
    let runs = args.runs.max(1);
    for run in 1..=runs {
        eprintln!("-- capture run {run}/{runs}");
        for c in contenders.iter_mut() {
            let (rate, rss) = c.drain(args.events, args.aggregates).await?;
            eprintln!(
                "   {}: drain {rate:.0} events/s, peak RSS {rss:.1} MiB",
                c.name
            );
            c.figure("drain", "events/s").push(rate);
            c.figure("relay peak RSS (drain)", "MiB").push(rss);

            for rate in &args.latency_rates {
                c.skip_others().await?;
                let cpu_before = cluster_cpu_secs(postmaster, ticks);
                let l = c
                    .pair
                    .latency(
                        *rate,
                        Duration::from_secs(args.latency_secs),
                        args.aggregates,
                    )
                    .await?;
                let cpu = cluster_cpu_secs(postmaster, ticks) - cpu_before;
                let per_event = cpu * 1e6 / l.events.max(1) as f64;
                eprintln!(
                    "   {}: at {rate}/s p50 {:.1} ms, p99 {:.1} ms, database CPU {per_event:.0} µs/event ({:.0} commits/s)",
                    c.name, l.p50_ms, l.p99_ms, l.write_rate
                );
                c.figure(&format!("commit→receive p50 at {rate}/s"), "ms")
                    .push(l.p50_ms);
                c.figure(&format!("commit→receive p99 at {rate}/s"), "ms")
                    .push(l.p99_ms);
                c.figure(&format!("database CPU per event at {rate}/s"), "µs")
                    .push(per_event);
                c.figure(&format!("writes achieved at {rate}/s"), "commits/s")
                    .push(l.write_rate);
            }

            c.skip_others().await?;
            let cost = c
                .pair
                .writer_cost(
                    args.writers,
                    Duration::from_secs(args.writer_secs),
                    args.aggregates,
                    args.writer_rounds,
                )
                .await;
            let (alone, with) = match cost {
                Ok(cost) => cost,
                Err(e) => {
                    // Which rows stayed pending, for whoever reads the error.
                    let rows: Vec<(i64, uuid::Uuid, String)> =
                        sqlx::query_as(sqlx::AssertSqlSafe(format!(
                            "SELECT id, event_id, created_at::text FROM {} \
                         WHERE published_at IS NULL LIMIT 20",
                            c.pair.store().table()
                        )))
                        .fetch_all(&c.pool)
                        .await
                        .unwrap_or_default();
                    return Err(format!("{}: {e}\nrows still pending: {rows:?}", c.name));
                }
            };
            eprintln!(
                "   {}: writers {alone:.0} commits/s alone, {with:.0} with the relay ({:.0}%)",
                c.name,
                100.0 * with / alone
            );
            c.figure("writers, relay stopped", "commits/s").push(alone);
            c.figure("writers, relay running", "commits/s").push(with);
            c.figure("writers with the relay, share of without", "%")
                .push(100.0 * with / alone);
        }
    }
    drop(server);
    Ok(Comparison {
        date: chrono::Utc::now().format("%Y-%m-%d").to_string(),
        command,
        server: version,
        events: args.events,
        aggregates: args.aggregates,
        runs,
        modes: contenders
            .into_iter()
            .map(|c| Mode {
                name: c.name.to_owned(),
                figures: c.figures,
            })
            .collect(),
    })
}

impl Comparison {
    /// The section of docs/BENCHMARKS.md.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "## Capture modes: polling beside the log\n");
        let _ = writeln!(
            md,
            "PostgreSQL → Redis Streams with `store.capture = \"poll\"`, and `\"logical\"` in table \
             style and in message style, on one PostgreSQL cluster the bench starts itself \
             ({}, `wal_level = logical`, `fsync` on, `shared_buffers = 128MB`), release build, \
             default settings. Drain: {} events over {} aggregates written beforehand in \
             transactions of 100, timed from the relay's start until Redis holds them all. \
             Writers are each mode's own: with polling a transaction locks its order row, then \
             writes the event and commits (the writer contract); with logical capture it writes \
             the event and commits, locking nothing. So writers with the relay stopped differ \
             between modes, and their share with it running compares each mode with itself. \
             Database CPU: every process of the cluster (writers' backends included), user + \
             system, over the steady-rate run, per event. Medians of {} runs (min–max), the \
             modes taking turns in each run; measured on {} with `{}`.\n",
            self.server, self.events, self.aggregates, self.runs, self.date, self.command
        );
        let _ = write!(md, "| figure |");
        for m in &self.modes {
            let _ = write!(md, " {} |", m.name);
        }
        let _ = writeln!(md);
        let _ = writeln!(md, "|---|{}", "---|".repeat(self.modes.len()));
        let Some(first) = self.modes.first() else {
            return md;
        };
        for figure in &first.figures {
            let decimals = if figure.unit == "ms" { 1 } else { 0 };
            let _ = write!(md, "| {} ({}) |", figure.name, figure.unit);
            for m in &self.modes {
                let cell = m
                    .figures
                    .iter()
                    .find(|f| f.name == figure.name)
                    .map(|f| f.cell(decimals))
                    .unwrap_or_default();
                let _ = write!(md, " {cell} |");
            }
            let _ = writeln!(md);
        }
        let _ = writeln!(
            md,
            "\nRatios of the medians against polling, measured in the same run:\n"
        );
        for m in &self.modes[1..] {
            let ratio = |name: &str| {
                let of = |mode: &Mode| {
                    mode.figures
                        .iter()
                        .find(|f| f.name == name)
                        .map(Figure::median)
                        .unwrap_or(f64::NAN)
                };
                of(m) / of(first)
            };
            let _ = writeln!(
                md,
                "- {}: drain ×{:.2}; writers' share {:.0}% against {:.0}%; database CPU per event at {}/s ×{:.2}; peak RSS ×{:.2}.",
                m.name,
                ratio("drain"),
                m.figures
                    .iter()
                    .find(|f| f.name == "writers with the relay, share of without")
                    .map(Figure::median)
                    .unwrap_or(f64::NAN),
                first
                    .figures
                    .iter()
                    .find(|f| f.name == "writers with the relay, share of without")
                    .map(Figure::median)
                    .unwrap_or(f64::NAN),
                self.modes[0]
                    .figures
                    .iter()
                    .find(|f| f.name.starts_with("database CPU per event at "))
                    .map(|f| f.name.trim_start_matches("database CPU per event at ").trim_end_matches("/s").to_owned())
                    .unwrap_or_default(),
                self.modes[0]
                    .figures
                    .iter()
                    .find(|f| f.name.starts_with("database CPU per event at "))
                    .map(|f| ratio(&f.name))
                    .unwrap_or(f64::NAN),
                ratio("relay peak RSS (drain)"),
            );
        }
        md
    }
}
