//! One relay process with N pipelines beside N relay processes of one pipeline each:
//! PostgreSQL → Redis Streams, N outbox tables, each loaded with its share of the events. For
//! each layout: the total drain rate (all tables empty), the relays' peak RSS summed over the
//! processes and their CPU time (user + system) summed likewise. Medians of `--runs` runs, the
//! two layouts alternating in each run.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::{write_file, BrokerSide, PostgresSide, RedisSide, RelayProcess, StoreSide};
use serde::{Deserialize, Serialize};

use crate::pair::{peak_rss_mib, PAD};
use crate::report::Figure;
use crate::Args;

/// One layout's figures over the runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Layout {
    pub name: String,
    pub processes: usize,
    pub drain: Figure,
    pub rss: Figure,
    pub cpu: Figure,
}

/// The comparison, as written to docs/bench/pipelines.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Comparison {
    pub date: String,
    pub command: String,
    pub pipelines: usize,
    pub events: u64,
    pub aggregates: u64,
    pub runs: usize,
    pub layouts: Vec<Layout>,
}

struct Table {
    side: Arc<PostgresSide>,
    redis: RedisSide,
    name: String,
}

/// The figures of one drain: events/s, summed peak RSS (MiB), summed CPU seconds.
struct Drained {
    rate: f64,
    rss_mib: f64,
    cpu_secs: f64,
}

/// User + system CPU seconds of a running process (`/proc/<pid>/stat`, clock ticks of
/// `getconf CLK_TCK`).
pub fn cpu_secs(pid: u32, ticks_per_sec: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|i| fields.get(*i)?.parse::<f64>().ok())
        .sum();
    ticks / ticks_per_sec
}

pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// `[pipelines.p<i>]` for each table, or (`only`) the one table as a file of one pipeline.
fn config(tables: &[Table], only: Option<usize>, batch: usize) -> String {
    let mut toml = String::new();
    for (i, table) in tables.iter().enumerate() {
        if only.is_some_and(|o| o != i) {
            continue;
        }
        let (store, sink) = (table.side.store_toml(), table.redis.sink_toml());
        if only.is_some() {
            toml.push_str(&format!("{store}\n{sink}\n"));
        } else {
            let rename = |text: &str, table_key: &str| {
                text.replace(
                    &format!("[{table_key}"),
                    &format!("[pipelines.p{i}.{table_key}"),
                )
            };
            toml.push_str(&format!(
                "{}\n{}\n",
                rename(&store, "store"),
                rename(&sink, "sink")
            ));
        }
    }
    format!(
        "{toml}\n[relay]\nbatch_size = {batch}\n\n[server]\nlisten = \"\"\n\n[log]\nlevel = \"warn\"\n"
    )
}

async fn load(tables: &[Table], per_table: u64, aggregates: u64, args: &Args) {
    for table in tables {
        table.redis.cleanup().await;
        table
            .side
            .bulk_load(per_table, aggregates, PAD, args.payload_type)
            .await;
    }
}

/// Start one process per configuration file, wait until every table is empty, take the
/// figures, stop the processes, check Redis holds every event.
async fn drain(
    tables: &[Table],
    configs: &[PathBuf],
    dir: &Path,
    relay_bin: &Path,
    events: u64,
    ticks: f64,
) -> Result<Drained, String> {
    let env = vec![("RUST_LOG".to_owned(), "warn".to_owned())];
    let started = Instant::now();
    let processes: Vec<RelayProcess> = configs
        .iter()
        .enumerate()
        .map(|(i, config)| {
            RelayProcess::start_binary(relay_bin, config, dir, &format!("pipelines-{i}"), &env)
        })
        .collect();
    let deadline = started + Duration::from_secs(600);
    for table in tables {
        while table.side.any_pending().await {
            if Instant::now() > deadline {
                return Err(format!("{}: not drained in 10 minutes", table.name));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut rss_mib = 0.0;
    let mut cpu = 0.0;
    for p in &processes {
        rss_mib += peak_rss_mib(p.id());
        cpu += cpu_secs(p.id(), ticks);
    }
    for mut p in processes {
        p.terminate(Duration::from_secs(30));
    }
    let mut held = 0;
    for table in tables {
        held += table.redis.held(0, Duration::ZERO).await;
    }
    if held < events {
        return Err(format!("Redis holds {held} of {events} events"));
    }
    Ok(Drained {
        rate: events as f64 / elapsed,
        rss_mib,
        cpu_secs: cpu,
    })
}

/// Measure both layouts with `n` pipelines; write docs/bench/pipelines.json and pipelines.md.
pub async fn compare(args: &Args, n: usize, command: String) -> Result<Comparison, String> {
    let ticks = clock_ticks();
    let dir = std::env::temp_dir().join("outboxkit-bench-pipelines");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let per_table = args.events / n as u64;
    let events = per_table * n as u64;
    let mut tables = Vec::new();
    for i in 0..n {
        let name = format!("bench_pipeline_{i}");
        let side = PostgresSide::open_with_pool(&args.postgres_url, &name, 4).await;
        side.connect_store(64, 2).await;
        let redis = RedisSide::open_at(&args.redis_url, &name).await;
        tables.push(Table {
            side: Arc::new(side),
            redis,
            name,
        });
    }
    let one = vec![write_file(
        &dir,
        "one-process.toml",
        &config(&tables, None, args.batch_size),
    )];
    let each: Vec<PathBuf> = (0..n)
        .map(|i| {
            write_file(
                &dir,
                &format!("process-{i}.toml"),
                &config(&tables, Some(i), args.batch_size),
            )
        })
        .collect();

    let mut layouts = [
        Layout {
            name: format!("1 process × {n} pipelines"),
            processes: 1,
            drain: Figure::new("drain", "events/s"),
            rss: Figure::new("peak RSS, all processes", "MiB"),
            cpu: Figure::new("CPU time, all processes", "s"),
        },
        Layout {
            name: format!("{n} processes × 1 pipeline"),
            processes: n,
            drain: Figure::new("drain", "events/s"),
            rss: Figure::new("peak RSS, all processes", "MiB"),
            cpu: Figure::new("CPU time, all processes", "s"),
        },
    ];
    for run in 1..=args.runs {
        for (layout, configs) in layouts.iter_mut().zip([&one, &each]) {
            load(&tables, per_table, args.aggregates, args).await;
            let d = drain(&tables, configs, &dir, &args.relay_bin, events, ticks).await?;
            eprintln!(
                "   run {run}, {}: {:.0} events/s, {:.1} MiB, {:.2} s CPU",
                layout.name, d.rate, d.rss_mib, d.cpu_secs
            );
            layout.drain.push(d.rate);
            layout.rss.push(d.rss_mib);
            layout.cpu.push(d.cpu_secs);
        }
    }
    for table in &tables {
        table.redis.cleanup().await;
        table.side.drop_tables().await;
    }
    Ok(Comparison {
        date: chrono::Utc::now().format("%Y-%m-%d").to_string(),
        command,
        pipelines: n,
        events,
        aggregates: args.aggregates,
        runs: args.runs,
        layouts: layouts.to_vec(),
    })
}

impl Comparison {
    /// The section of docs/BENCHMARKS.md.
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(
            md,
            "## Many pipelines: 1 process × {n} beside {n} processes × 1\n",
            n = self.pipelines
        );
        let _ = writeln!(
            md,
            "PostgreSQL → Redis Streams, {n} outbox tables of {} events each ({} in all, over {} \
             aggregates per table, the drain's payload), drained by one `outbox-relay run` with \
             {n} `[pipelines.*]`, or by {n} processes with one pipeline each (release build, \
             default settings); timed from the start until every table is empty, then Redis \
             checked to hold every event. Peak RSS (`VmHWM`) and CPU time (user + system, \
             `/proc/<pid>/stat`) are summed over the processes. Medians of {} runs (min–max), \
             the two layouts alternating in each run; measured on {} with `{}`.\n",
            self.events / self.pipelines as u64,
            self.events,
            self.aggregates,
            self.runs,
            self.date,
            self.command,
            n = self.pipelines
        );
        let _ = writeln!(
            md,
            "| layout | drain (events/s) | peak RSS, all processes (MiB) | CPU time, all processes (s) |"
        );
        let _ = writeln!(md, "|---|---|---|---|");
        for l in &self.layouts {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                l.name,
                l.drain.cell(0),
                l.rss.cell(1),
                l.cpu.cell(2)
            );
        }
        if let [one, each] = &self.layouts[..] {
            let _ = writeln!(
                md,
                "\nOne process beside {} processes: drain ×{:.2}, memory ×{:.2}, CPU ×{:.2}.",
                each.processes,
                one.drain.median() / each.drain.median(),
                one.rss.median() / each.rss.median(),
                one.cpu.median() / each.cpu.median()
            );
        }
        md
    }
}
