//! `outboxkit-bench`: measures outbox relay against the article's algorithm and against the
//! database's and the broker's own limits, in one run, on one machine.
//!
//! ```text
//! scripts/bench.sh            # = cargo run --release -p outboxkit-bench -- --runs 3
//! ```
//!
//! For each store × sink pair it measures drain throughput (1, 2, 3 relay processes), the
//! article's baseline, the database ceiling (claim + mark, no broker), the broker ceiling
//! (the same messages through the same client, no database), commit→receive latency at a
//! steady write rate, writer throughput with the relay stopped and running, and the relay's
//! peak RSS. Each figure is the median of `--runs` runs, with min and max.

mod article;
mod broker;
mod capture;
mod pair;
mod pipelines;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::report::{Figure, PairResult, Report};

/// Command line.
#[derive(Debug, Clone, Parser)]
#[command(name = "outboxkit-bench")]
pub struct Args {
    /// Runs per figure (the median is reported, with min and max).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Pending events drained per run.
    #[arg(long, default_value_t = 200_000)]
    pub events: u64,
    /// Aggregates the events are spread over.
    #[arg(long, default_value_t = 1000)]
    pub aggregates: u64,
    /// Events loaded for the article's algorithm per run (it is slow; its rate is steady).
    #[arg(long, default_value_t = 50_000)]
    pub article_events: u64,
    /// Longest the article's algorithm runs per run (its rate is taken over what it did).
    #[arg(long, default_value_t = 20)]
    pub article_secs: u64,
    /// Seconds of steady writes per latency run.
    #[arg(long, default_value_t = 30)]
    pub latency_secs: u64,
    /// Steady write rates for the latency runs (events/s).
    #[arg(long, value_delimiter = ',', default_value = "1000,5000")]
    pub latency_rates: Vec<u64>,
    /// Seconds of each writer-throughput segment.
    #[arg(long, default_value_t = 5)]
    pub writer_secs: u64,
    /// Segments with the relay stopped, alternating with as many with it running.
    #[arg(long, default_value_t = 3)]
    pub writer_rounds: u32,
    /// Concurrent writers in the writer-throughput runs.
    #[arg(long, default_value_t = 4)]
    pub writers: u64,
    /// Relay process counts for the scale-out runs.
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub relays: Vec<u32>,
    /// The release `outbox-relay` binary.
    #[arg(long, default_value = "target/release/outbox-relay")]
    pub relay_bin: PathBuf,
    /// PostgreSQL. Plain TCP by default, as the figures in docs/BENCHMARKS.md were measured:
    /// the relay (built with TLS) would otherwise encrypt its connections to a server that
    /// offers TLS (`sslmode=prefer`), which costs about a tenth of the drain here.
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    pub postgres_url: String,
    /// MySQL / MariaDB.
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306/test")]
    pub mysql_url: String,
    /// Redis.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis_url: String,
    /// RabbitMQ.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub rabbitmq_url: String,
    /// The tansu binary (Kafka API): the Kafka side starts a private broker for each run.
    #[arg(long, default_value = "/opt/outbox-relay/tansu/bin/tansu")]
    pub tansu_bin: PathBuf,
    /// The SQS endpoint (LocalStack).
    #[arg(long, default_value = "http://127.0.0.1:4566")]
    pub sqs_endpoint: String,
    /// Events per drain for the sqs and sns sinks: LocalStack, a Python emulator, takes a few thousand
    /// messages per second, so 200,000 per run would take many minutes.
    #[arg(long, default_value_t = 20_000)]
    pub sqs_events: u64,
    /// Events per drain for the rabbitmq sink (persistent, confirmed messages: the server's
    /// CPU bounds the rate, which is steady).
    #[arg(long, default_value_t = 200_000)]
    pub rabbitmq_events: u64,
    /// Where docs/BENCHMARKS.md and docs/bench/ go: `docs` by default, except for a run with
    /// `--skip`, whose partial report goes to `outbox-bench` in the temporary directory (so a
    /// quick run never writes over the published report).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The outbox table's payload type for the drains (`json`, `text` or `binary`): the same
    /// ≈300-byte JSON document, stored as `jsonb`/`JSON`, as text, or as its UTF-8 bytes.
    #[arg(long, default_value = "json")]
    pub payload_type: outboxkit_core::PayloadType,
    /// Rows per claim of the relay (and of the ceilings).
    #[arg(long, default_value_t = 500)]
    pub batch_size: usize,
    /// Parts to leave out of a quick run: article, ceilings, latency, writers (its report
    /// goes to the temporary directory unless `--out` says where).
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Measure nothing: render docs/BENCHMARKS.md and the plots again from these results.json
    /// files (comma-separated; their pairs are put together), e.g. after editing
    /// docs/bench/analysis.md.
    #[arg(long, value_delimiter = ',')]
    pub render: Vec<PathBuf>,
    /// Measure only one relay process with this many PostgreSQL → Redis pipelines beside as
    /// many processes of one pipeline each (`--events` in all); writes
    /// docs/bench/pipelines.{json,md} and renders docs/BENCHMARKS.md again from
    /// docs/bench/results.json with that section.
    #[arg(long, value_name = "N")]
    pub pipelines_compare: Option<usize>,
    /// Measure only PostgreSQL → Redis with `store.capture = "poll"` beside `"logical"` (table
    /// and message style), on a PostgreSQL cluster the bench starts itself; writes
    /// docs/bench/capture.{json,md} and renders docs/BENCHMARKS.md again from
    /// docs/bench/results.json with that section.
    #[arg(long)]
    pub capture_compare: bool,
    /// Store × sink pairs to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "postgres:redis-streams,postgres:kafka,postgres:rabbitmq,postgres:sqs,\
                         postgres:sns,postgres:nats,mysql:redis-streams,mysql:kafka,mysql:rabbitmq,\
                         mysql:sqs,mysql:sns,mysql:nats"
    )]
    pub pairs: Vec<String>,
}

impl Args {
    /// Where the report goes (see `--out`).
    pub fn out(&self) -> PathBuf {
        match &self.out {
            Some(out) => out.clone(),
            None if !self.skip.is_empty() => std::env::temp_dir().join("outbox-bench"),
            None => PathBuf::from("docs"),
        }
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), String> {
    if !args.render.is_empty() {
        let mut report = Report::load(&args.render[0])?;
        for path in &args.render[1..] {
            report.merge(Report::load(path)?);
        }
        report.print();
        return report
            .write(&args.out())
            .map_err(|e| format!("writing the report: {e}"));
    }
    if !args.relay_bin.exists() {
        return Err(format!(
            "{} does not exist: build it with `cargo build --release -p outboxkit-relay` or pass --relay-bin",
            args.relay_bin.display()
        ));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    if let Some(n) = args.pipelines_compare {
        let comparison = pipelines::compare(&args, n.max(1), command).await?;
        let json = serde_json::to_string_pretty(&comparison).unwrap_or_default();
        return write_section(&args, "pipelines", json, comparison.markdown());
    }
    if args.capture_compare {
        let comparison = capture::compare(&args, command).await?;
        let json = serde_json::to_string_pretty(&comparison).unwrap_or_default();
        return write_section(&args, "capture", json, comparison.markdown());
    }
    let mut report = Report::new(&args, command).await;
    for pair in &args.pairs {
        let (store, sink) = pair
            .split_once(':')
            .ok_or_else(|| format!("--pairs: \"{pair}\" is not store:sink"))?;
        let bench = pair::open(&args, store, sink).await?;
        eprintln!("== {store} → {sink}");
        let (store_server, broker_server) = bench.describe().await;
        report.add_server(store, &store_server);
        report.add_server(sink, &broker_server);
        let mut result = PairResult::new(store, sink);
        result.events = bench.events(args.events);
        result.article_events = args.article_events.min(result.events);
        measure(&args, &bench, &mut result).await?;
        report.pairs.push(result);
        // After each pair, so an interrupted run keeps what it measured.
        report
            .write(&args.out())
            .map_err(|e| format!("writing the report: {e}"))?;
    }
    report.print();
    report
        .write(&args.out())
        .map_err(|e| format!("writing the report: {e}"))?;
    eprintln!(
        "report written to {}",
        args.out().join("BENCHMARKS.md").display()
    );
    Ok(())
}

/// A section measured apart: `docs/bench/<name>.{json,md}`, then docs/BENCHMARKS.md rendered
/// again from docs/bench/results.json with it.
fn write_section(args: &Args, name: &str, json: String, markdown: String) -> Result<(), String> {
    println!("{markdown}");
    let dir = args.out().join("bench");
    let write = |file: String, text: String| {
        std::fs::write(dir.join(&file), text).map_err(|e| format!("writing {file}: {e}"))
    };
    write(format!("{name}.json"), json)?;
    write(format!("{name}.md"), markdown)?;
    let report = Report::load(&dir.join("results.json"))?;
    report
        .write(&args.out())
        .map_err(|e| format!("writing the report: {e}"))
}

async fn measure(args: &Args, bench: &pair::Pair, result: &mut PairResult) -> Result<(), String> {
    let runs = args.runs.max(1);
    let events = result.events;
    let mut drains: Vec<Figure> = args
        .relays
        .iter()
        .map(|n| {
            Figure::new(
                &format!("drain, {n} relay{}", if *n == 1 { "" } else { "s" }),
                "events/s",
            )
        })
        .collect();
    let mut rss = Figure::new("relay peak RSS (1 relay, drain)", "MiB");
    let mut article = Figure::new("article's algorithm", "events/s");
    let mut db_ceiling = Figure::new("database ceiling (claim + mark, no broker)", "rows/s");
    let mut broker_ceiling = Figure::new("broker ceiling (same client, no database)", "events/s");
    let mut writers_alone = Figure::new("writers, relay stopped", "commits/s");
    let mut writers_with = Figure::new("writers, relay running", "commits/s");
    let mut latency: Vec<[Figure; 4]> = args
        .latency_rates
        .iter()
        .map(|r| {
            [
                Figure::new(&format!("commit→receive p50 at {r}/s"), "ms"),
                Figure::new(&format!("commit→receive p99 at {r}/s"), "ms"),
                Figure::new(&format!("commit→receive max at {r}/s"), "ms"),
                Figure::new(&format!("writes achieved at {r}/s"), "commits/s"),
            ]
        })
        .collect();

    for run in 1..=runs {
        eprintln!("-- run {run}/{runs}");
        for (i, n) in args.relays.iter().enumerate() {
            let d = bench.drain(events, args.aggregates, *n).await?;
            eprintln!(
                "   drain with {n} relay(s): {:.0} events/s, peak RSS {:.1} MiB",
                d.rate, d.peak_rss_mib
            );
            drains[i].push(d.rate);
            if *n == 1 {
                rss.push(d.peak_rss_mib);
            }
        }
        let skip = |part: &str| args.skip.iter().any(|s| s == part);
        if !skip("article") {
            let a = bench
                .article(result.article_events, args.aggregates)
                .await?;
            eprintln!("   article: {a:.0} events/s");
            article.push(a);
        }
        if !skip("ceilings") {
            let c = bench.database_ceiling(events, args.aggregates).await?;
            eprintln!("   database ceiling: {c:.0} rows/s");
            db_ceiling.push(c);
            let b = bench.broker_ceiling(events, args.aggregates).await?;
            eprintln!("   broker ceiling: {b:.0} events/s");
            broker_ceiling.push(b);
        }
        for (i, rate) in args
            .latency_rates
            .iter()
            .enumerate()
            .filter(|_| !skip("latency"))
        {
            let l = bench
                .latency(
                    *rate,
                    Duration::from_secs(args.latency_secs),
                    args.aggregates,
                )
                .await?;
            eprintln!(
                "   latency at {rate}/s: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} events, {:.0} commits/s)",
                l.p50_ms, l.p99_ms, l.max_ms, l.events, l.write_rate
            );
            latency[i][0].push(l.p50_ms);
            latency[i][1].push(l.p99_ms);
            latency[i][2].push(l.max_ms);
            latency[i][3].push(l.write_rate);
        }
        if skip("writers") {
            continue;
        }
        let duration = Duration::from_secs(args.writer_secs);
        let (alone, with) = bench
            .writer_cost(args.writers, duration, args.aggregates, args.writer_rounds)
            .await?;
        eprintln!("   writers: {alone:.0} commits/s alone, {with:.0} with the relay running");
        writers_alone.push(alone);
        writers_with.push(with);
    }
    result.figures.extend(drains);
    result.figures.push(article);
    result.figures.push(db_ceiling);
    result.figures.push(broker_ceiling);
    for l in latency {
        result.figures.extend(l);
    }
    result.figures.push(writers_alone);
    result.figures.push(writers_with);
    result.figures.push(rss);
    result.figures.retain(|f| !f.values.is_empty());
    Ok(())
}
