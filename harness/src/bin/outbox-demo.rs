//! `outbox-demo`, the Quickstart demo (`scripts/demo.sh`): the whole story on this machine's
//! database and broker, built on the harness.
//!
//! Writers run business transactions — each updates an order's row and enqueues its event in
//! the same transaction — while `outbox-relay run` processes publish; then the broker side's
//! independent consumer reads the broker back and the demo checks that every event arrived and
//! that, per order, first deliveries came in the order the writers committed them.
//!
//! A store or a sink is available when the harness feature of its side is compiled in
//! (`postgres`, `mysql`; `redis-streams`, `kafka`, `rabbitmq`, `sqs`, `sns`, `nats`): scripts/demo.sh builds
//! only the two of the pair it runs, and the relay with only that store and sink.

// Built without a store side or without a broker side (never by scripts/demo.sh), it can
// only refuse: no warnings about what that leaves unused.
#![cfg_attr(
    not(all(
        any(feature = "postgres", feature = "mysql"),
        any(
            feature = "redis-streams",
            feature = "kafka",
            feature = "rabbitmq",
            feature = "sqs",
            feature = "sns",
            feature = "nats"
        )
    )),
    allow(unused, unreachable_code)
)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use outboxkit_core::redact::redact_url_or_strip;
use outboxkit_core::NewEvent;
use outboxkit_harness::{
    check_delivery, free_port, http_get, BrokerSide, Scenario, Settings, StoreSide, WriterPlan,
};
use uuid::Uuid;

/// Outbox table of the demo (its business table is `outbox_demo_orders`).
const TABLE: &str = "outbox_demo";
/// Prefix of the demo's destinations (stream, topic, exchange, queue).
const DESTINATION: &str = "outbox-demo";
/// Shards of the demo's outbox table (the harness's relay configuration).
const SHARDS: u64 = 32;
/// Partitions of the demo's Kafka topics.
#[cfg(feature = "kafka")]
const KAFKA_PARTITIONS: i32 = 6;

/// Write order events in business transactions on the local database, relay them to the local
/// broker with `outbox-relay run` processes, read them back and check nothing was lost or
/// reordered.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-demo")]
struct Args {
    /// Database holding the outbox (`postgres`, or another store compiled in).
    #[arg(long, default_value = "postgres")]
    store: String,
    /// Broker to relay to (`redis-streams`, or another sink compiled in).
    #[arg(long, default_value = "redis-streams")]
    sink: String,
    /// Events to write (one business transaction each).
    #[arg(long, default_value_t = 5000)]
    events: u64,
    /// Orders (aggregates) the events are spread over.
    #[arg(long, default_value_t = 200)]
    aggregates: u64,
    /// Concurrent writer tasks.
    #[arg(long, default_value_t = 4)]
    writers: u64,
    /// Relays running at once (`outbox-relay run` processes, each with its own database
    /// session and shards).
    #[arg(long, default_value_t = 2)]
    relays: u32,
    /// Rows per claim.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Database URL (default: the local server of the chosen store).
    #[arg(long)]
    database_url: Option<String>,
    /// Broker URL or address (default: the local server of the chosen sink).
    #[arg(long)]
    broker_url: Option<String>,
    /// With a `rediss://` --broker-url: the CA certificates (PEM) that verify Redis, for the
    /// relays and the demo's reader alike.
    #[arg(long, value_name = "FILE")]
    broker_ca_file: Option<PathBuf>,
    /// With a `rediss://` --broker-url: a client certificate (PEM), with --broker-client-key.
    #[arg(long, value_name = "FILE", requires = "broker_client_key")]
    broker_client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "broker_client_cert")]
    broker_client_key: Option<PathBuf>,
    /// The `outbox-relay` binary the relays run (default: the one next to this program).
    #[arg(long, value_name = "FILE")]
    relay_bin: Option<PathBuf>,
}

/// What to print and the exit code (2: usage, 1: anything else), as `outbox-relay` does.
#[derive(Debug)]
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn config(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 2,
        }
    }

    fn runtime(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The harness runs the relay named by OUTBOX_TEST_RELAY_BIN; set it before any thread runs.
    let relay_bin = args.relay_bin.clone().or_else(|| {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.join("outbox-relay"))
    });
    if let Some(bin) = relay_bin {
        if !bin.exists() {
            eprintln!(
                "error: {} does not exist: build it (scripts/demo.sh does) or give --relay-bin",
                bin.display()
            );
            return ExitCode::from(2);
        }
        std::env::set_var("OUTBOX_TEST_RELAY_BIN", bin);
    }
    // The harness fails by panicking with a message that says what to start; print just that.
    // (The panic unwinds, so the relay processes are killed on the way out.)
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("the demo failed");
        eprintln!("error: {message}");
    }));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.block_on(run(&args))
    }));
    match outcome {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(failure)) => {
            eprintln!("error: {}", failure.message);
            ExitCode::from(failure.code)
        }
        // Printed by the hook.
        Err(_) => ExitCode::FAILURE,
    }
}

/// The event of an order change: aggregate `order` `<aggregate>`, `OrderUpdated`,
/// `{order_id, writer, seq}`.
fn order_event(w: u64, n: u64, aggregate: u64) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate.to_string(),
        "OrderUpdated",
        serde_json::json!({ "order_id": aggregate, "writer": w, "seq": n }),
    )
    .event_id(Uuid::now_v7())
}

fn stores_compiled_in() -> Vec<&'static str> {
    [
        #[cfg(feature = "postgres")]
        "postgres",
        #[cfg(feature = "mysql")]
        "mysql",
    ]
    .to_vec()
}

fn sinks_compiled_in() -> Vec<&'static str> {
    [
        #[cfg(feature = "kafka")]
        "kafka",
        #[cfg(feature = "rabbitmq")]
        "rabbitmq",
        #[cfg(feature = "redis-streams")]
        "redis-streams",
        #[cfg(feature = "sqs")]
        "sqs",
        #[cfg(feature = "sns")]
        "sns",
        #[cfg(feature = "nats")]
        "nats",
    ]
    .to_vec()
}

/// The store side and its description, with the demo's tables dropped (a fresh run).
async fn open_store(args: &Args) -> Result<(Arc<dyn StoreSide>, String), Failure> {
    let url = args.database_url.clone();
    let (store, describe): (Arc<dyn StoreSide>, String) = match args.store.as_str() {
        #[cfg(feature = "postgres")]
        "postgres" => {
            let url = url.unwrap_or_else(outboxkit_harness::postgres_url);
            let side = outboxkit_harness::PostgresSide::open_at(&url, TABLE).await;
            let describe = format!(
                "PostgreSQL {}, table public.{TABLE}",
                redact_url_or_strip(&url)
            );
            (Arc::new(side), describe)
        }
        #[cfg(feature = "mysql")]
        "mysql" => {
            let url = url.unwrap_or_else(outboxkit_harness::mysql_url);
            let side = outboxkit_harness::MySqlSide::open_at(&url, TABLE).await;
            let describe = format!(
                "{} {}, table {TABLE}",
                side.name(),
                redact_url_or_strip(&url)
            );
            (Arc::new(side), describe)
        }
        other => {
            return Err(Failure::config(format!(
                "demo --store {other}: not available (stores compiled in: {})",
                stores_compiled_in().join(", ")
            )))
        }
    };
    store.drop_tables().await;
    let describe = format!("{describe} (business table {TABLE}_orders)");
    Ok((store, describe))
}

/// The broker side, its description, and whether to clean it up afterwards (delete the
/// destinations and stop its consumer; otherwise they stay, for a look). The destinations of a
/// fixed name are emptied first; the others are the run's own.
async fn open_broker(args: &Args) -> Result<(Arc<dyn BrokerSide>, String, bool), Failure> {
    let url = args.broker_url.clone();
    #[allow(unused_variables)] // used by the Kafka, SQS and NATS sides only
    let run_prefix = format!(
        "{DESTINATION}-{}",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    Ok(match args.sink.as_str() {
        #[cfg(feature = "redis-streams")]
        "redis-streams" => {
            let url = url.unwrap_or_else(outboxkit_harness::redis_url);
            let side = if url.starts_with("rediss://") {
                let ca = args.broker_ca_file.as_deref().ok_or_else(|| {
                    Failure::config("demo --broker-url rediss://...: give --broker-ca-file too")
                })?;
                let client = args
                    .broker_client_cert
                    .as_deref()
                    .zip(args.broker_client_key.as_deref());
                outboxkit_harness::RedisSide::open_tls(&url, DESTINATION, ca, client).await
            } else {
                outboxkit_harness::RedisSide::open_at(&url, DESTINATION).await
            };
            side.cleanup().await;
            let describe = format!("Redis stream {}", side.destination("order"));
            (Arc::new(side), describe, false)
        }
        #[cfg(feature = "kafka")]
        "kafka" => {
            // Deleted topics linger on a Kafka-API broker for a while: a topic of the run's own.
            let bootstrap = url.unwrap_or_else(outboxkit_harness::kafka_bootstrap);
            let side = outboxkit_harness::KafkaSide::open_at(&bootstrap, &run_prefix)
                .await
                .partitions(KAFKA_PARTITIONS);
            let describe = format!(
                "Kafka topic {} ({KAFKA_PARTITIONS} partitions) at {bootstrap}",
                side.destination("order")
            );
            (Arc::new(side), describe, false)
        }
        #[cfg(feature = "rabbitmq")]
        "rabbitmq" => {
            let url = url.unwrap_or_else(outboxkit_harness::rabbitmq_url);
            let side = outboxkit_harness::RabbitMqSide::open_at(&url, DESTINATION).await;
            side.cleanup().await;
            let describe = format!(
                "RabbitMQ exchange {DESTINATION} (topic, publisher confirms) → queue {}",
                side.destination("order")
            );
            (Arc::new(side), describe, false)
        }
        #[cfg(feature = "sqs")]
        "sqs" => {
            // A queue deleted on SQS cannot be created again for 60 s: a queue of the run's own.
            let endpoint = url.unwrap_or_else(outboxkit_harness::sqs_endpoint);
            let side = outboxkit_harness::SqsSide::fifo_at(&endpoint, &run_prefix).await;
            let describe = format!("SQS FIFO queue {} at {endpoint}", side.destination("order"));
            (Arc::new(side), describe, true)
        }
        #[cfg(feature = "sns")]
        "sns" => {
            // SNS → SQS: a FIFO topic and the FIFO queue subscribed to it, of the run's own.
            let endpoint = url.unwrap_or_else(outboxkit_harness::sqs_endpoint);
            let side = outboxkit_harness::SnsSide::fifo_at(&endpoint, &run_prefix).await;
            let describe = format!(
                "SNS FIFO topic {0} at {endpoint} → SQS FIFO queue {0} (raw delivery)",
                side.destination("order")
            );
            (Arc::new(side), describe, true)
        }
        #[cfg(feature = "nats")]
        "nats" => {
            let url = url.unwrap_or_else(outboxkit_harness::nats_url);
            let side = outboxkit_harness::NatsSide::open_at(&url, &run_prefix).await;
            let describe = format!(
                "NATS JetStream stream {} (subjects {}.>) at {url}",
                side.stream(),
                run_prefix
            );
            (Arc::new(side), describe, false)
        }
        other => {
            return Err(Failure::config(format!(
                "demo --sink {other}: not available (sinks compiled in: {})",
                sinks_compiled_in().join(", ")
            )))
        }
    })
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

/// `outbox-relay status --json`, or `null` when it fails (a relay still starting...).
fn status(scenario: &Scenario) -> serde_json::Value {
    let (ok, out, _) = scenario.cli(&["status", "--json"]);
    if ok {
        serde_json::from_str(&out).unwrap_or_default()
    } else {
        serde_json::Value::Null
    }
}

/// Run the demo.
async fn run(args: &Args) -> Result<(), Failure> {
    if args.aggregates == 0 || args.writers == 0 || args.relays == 0 || args.events == 0 {
        return Err(Failure::config(
            "demo: --events, --aggregates, --writers and --relays must be at least 1",
        ));
    }
    let (store, store_describe) = open_store(args).await?;
    let (broker, broker_describe, clean_up) = open_broker(args).await?;
    // A fresh scratch directory (relay configuration and logs) for this run.
    let _ = std::fs::remove_dir_all(
        std::env::temp_dir()
            .join("outbox-relay-tests")
            .join(store.table()),
    );
    let mut scenario = Scenario::prepare(store.clone(), broker.clone(), Settings::default()).await;
    let logs = scenario.dir.display().to_string();
    println!(
        "outbox-relay demo: {} order events over {}, {}, {}\n  {} → {}",
        args.events,
        counted(args.aggregates, "order"),
        counted(args.writers, "writer"),
        counted(args.relays, "relay"),
        store_describe,
        broker_describe,
    );

    // Relays: `outbox-relay run` processes, each serving /readyz on a port of its own.
    let batch_size = args.batch_size.to_string();
    let mut ports = Vec::new();
    for i in 0..args.relays {
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        scenario.start_relay(
            &format!("demo-relay-{i}"),
            &[
                ("OUTBOX_SERVER__LISTEN", listen.as_str()),
                ("OUTBOX_RELAY__BATCH_SIZE", batch_size.as_str()),
                // Keep published rows (marked) rather than delete them: the demo counts them
                // and reads their publish times.
                ("OUTBOX_RELAY__RETENTION", "1h"),
            ],
        );
        ports.push(port);
    }
    let ready = |ports: &[u16]| {
        ports
            .iter()
            .filter(|port| matches!(http_get(**port, "/readyz"), Some((200, _))))
            .count()
    };
    // Let the relays share the shards out and get ready before the clock starts.
    let settle = Instant::now() + Duration::from_secs(10);
    while Instant::now() < settle {
        let status = status(&scenario);
        let shards = SHARDS;
        let owners = status["owners"].as_object().map_or(0, |o| o.len()) as u64;
        if status["shards_owned"].as_u64() == Some(shards)
            && owners == u64::from(args.relays).min(shards)
            && ready(&ports) == ports.len()
        {
            break;
        }
        scenario.assert_relays_running();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Writers.
    let plan = WriterPlan {
        writers: args.writers,
        aggregates: args.aggregates,
        events: Some(args.events),
        pause: Duration::ZERO,
        rollbacks: false,
        rollback_one_in: 50,
        retry_for: None,
        event: order_event,
    };
    let started = Instant::now();
    let writers = scenario.start_writers(&plan).await;

    // Progress until every event is published.
    let published = || async { store.count_rows("published_at IS NOT NULL").await as u64 };
    let deadline = Instant::now() + Duration::from_secs(60 + args.events / 100);
    let mut last_print = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (w, p) = (writers.written(), published().await);
        if last_print.elapsed() >= Duration::from_millis(500) || p >= args.events {
            println!(
                "  [{:>5.1}s] written {w:>7}/{} · published {p:>7} · relays ready {}/{}",
                started.elapsed().as_secs_f64(),
                args.events,
                ready(&ports),
                ports.len()
            );
            last_print = Instant::now();
        }
        if p >= args.events || Instant::now() > deadline {
            break;
        }
        scenario.assert_relays_running();
    }
    let elapsed = started.elapsed();
    let writes = writers.finish().await;
    scenario.stop_relays(Duration::from_secs(30));

    // The broker side's independent consumer: everything the broker holds for the demo.
    let committed = writes.committed;
    let delivered = scenario
        .read_back(&committed, Duration::from_secs(30))
        .await;
    let check = check_delivery(&committed, &delivered);
    let missing = check.missing.len();
    let order_violations = if broker.ordered() {
        check.order_violations.len()
    } else {
        0
    };

    let mut latencies = store.publish_latencies().await;
    latencies.sort();
    let writes = committed.len() as u64;
    let published = published().await;
    let pending = store.pending().await;
    if clean_up {
        broker.cleanup().await;
    }

    println!();
    println!("events written       {writes} (each in a business transaction with its order row)");
    println!("events published     {published} (acknowledged by the broker and marked)");
    println!(
        "read back            {} messages, {} distinct events, {missing} missing",
        check.messages, check.distinct
    );
    println!("duplicates           {}", check.duplicates);
    println!("order violations     {order_violations}");
    println!("still pending        {pending}");
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
    if missing > 0 || order_violations > 0 || published < writes {
        return Err(Failure::runtime(format!(
            "demo failed: {missing} events missing, {order_violations} order violations, \
             {published} of {writes} published (relay logs in {logs})"
        )));
    }
    println!("OK: every committed event arrived, in order per order.");
    Ok(())
}

/// `n` and `noun`, plural unless `n` is 1: "1 relay", "2 relays".
fn counted(n: impl Into<u64>, noun: &str) -> String {
    let n = n.into();
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
