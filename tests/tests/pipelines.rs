//! Several pipelines in one relay process: PostgreSQL schema `a` → Redis Streams, PostgreSQL
//! schema `b` → RabbitMQ, MariaDB → Kafka, all in one configuration file. Writers on all
//! three, two relay processes, one SIGKILLed and restarted mid-run: every committed event of
//! each pipeline arrives on that pipeline's broker (and no other), none rolled back does, first
//! deliveries keep each aggregate's order; `status` and `/metrics` speak per pipeline.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::*;

/// Per pipeline: 6,000 events over 200 aggregates, 3 writers.
const SCALE: Scale = Scale {
    events: 6_000,
    aggregates: 200,
    writers: 3,
    relays: 2,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pipelines_in_two_relays_one_sigkilled_each_on_its_own_broker() {
    let name = unique("pipelines");
    let (schema_a, schema_b) = (format!("{name}_a"), format!("{name}_b"));
    let legs = [
        (
            "a",
            Scenario::prepare(
                Arc::new(PostgresSide::open_in_schema(&schema_a).await),
                Arc::new(RedisSide::open(&format!("{name}_a")).await),
                Settings::default(),
            )
            .await,
        ),
        (
            "b",
            Scenario::prepare(
                Arc::new(PostgresSide::open_in_schema(&schema_b).await),
                Arc::new(RabbitMqSide::open(&format!("{name}_b")).await),
                Settings::default(),
            )
            .await,
        ),
        (
            "c",
            Scenario::prepare(
                Arc::new(MySqlSide::open(&format!("{name}_c")).await),
                Arc::new(KafkaSide::open(&format!("{name}_c")).await),
                Settings::default(),
            )
            .await,
        ),
    ];
    let port = free_port();
    let named: Vec<(&str, &Scenario)> = legs.iter().map(|(n, s)| (*n, s)).collect();
    let dir = scratch_dir(&name);
    let config = write_file(
        &dir,
        "relay.toml",
        &pipelines_config(&named, &format!("127.0.0.1:{port}")),
    );
    let env: Vec<(String, String)> = legs
        .iter()
        .flat_map(|(_, s)| s.broker.relay_env())
        .collect();

    // migrate migrates every pipeline (idempotent: each scenario migrated its own table).
    let (ok, out, err) = run_cli(&config, &["migrate"], &env);
    assert!(ok, "migrate: {out}{err}");
    for pipeline in ["a", "b", "c"] {
        assert!(out.contains(&format!("pipeline {pipeline}: ")), "{out}");
    }

    // relay-0 serves on `port`, the others on ports of their own.
    let mut relays: Vec<RelayProcess> = (0..SCALE.relays)
        .map(|i| {
            let mut env = env.clone();
            if i > 0 {
                let listen = format!("127.0.0.1:{}", free_port());
                env.push(("OUTBOX_SERVER__LISTEN".to_owned(), listen));
            }
            RelayProcess::start(&config, &dir, &format!("relay-{i}"), &env)
        })
        .collect();
    let started = Instant::now();
    let mut writers = Vec::new();
    for (_, scenario) in &legs {
        writers.push(scenario.start_writers(&WriterPlan::bounded(SCALE)).await);
    }
    let total = SCALE.events * legs.len() as u64;
    wait_for(
        "a third of the events written",
        Duration::from_secs(180),
        || {
            let written: u64 = writers.iter().map(Writers::written).sum();
            async move { written >= total / 3 }
        },
    )
    .await;
    let killed_at: u64 = writers.iter().map(Writers::written).sum();
    relays[0].kill_hard();
    tokio::time::sleep(Duration::from_millis(700)).await;
    relays[0].respawn();

    let mut writes = Vec::new();
    for w in writers {
        writes.push(w.finish().await);
    }
    for (pipeline, scenario) in &legs {
        scenario
            .drain(
                &format!("pipeline {pipeline} to drain"),
                Duration::from_secs(300),
            )
            .await;
    }
    let drained = started.elapsed().as_secs_f64();
    for relay in &mut relays {
        assert!(
            relay.is_running(),
            "{} died:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    // status: one line per pipeline; JSON per pipeline; both relays own shards of each.
    let (config_ref, env_ref) = (config.clone(), env.clone());
    wait_for(
        "both relays sharing every pipeline's shards",
        Duration::from_secs(30),
        move || {
            let (ok, text, _) = run_cli(&config_ref, &["status", "--json"], &env_ref);
            let status: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
            let shared = ok
                && ["a", "b", "c"]
                    .iter()
                    .all(|p| status["pipelines"][p]["owners"] == 2);
            async move { shared }
        },
    )
    .await;
    let (ok, text, err) = run_cli(&config, &["status", "--json"], &env);
    assert!(ok, "status: {err}");
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    for pipeline in ["a", "b", "c"] {
        let line = &status["pipelines"][pipeline];
        assert_eq!(line["pending"], 0, "{status}");
        assert_eq!(line["dead"], 0, "{status}");
    }
    let (ok, table, _) = run_cli(&config, &["status"], &env);
    assert!(ok);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("pipeline"), "{table}");
    assert_eq!(
        lines.len(),
        4,
        "a header and one line per pipeline:\n{table}"
    );
    let (ok, one, _) = run_cli(&config, &["--pipeline", "b", "status", "--json"], &env);
    assert!(ok);
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(
        one["shards_owned"], 32,
        "the whole report of one pipeline: {one}"
    );
    let (ok, _, err) = run_cli(&config, &["dead", "list"], &env);
    assert!(!ok && err.contains("choose one with --pipeline"), "{err}");

    // Metrics and readiness per pipeline.
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics");
    for pipeline in ["a", "b", "c"] {
        assert!(
            metrics.contains(&format!("pipeline=\"{pipeline}\"")),
            "no series of pipeline {pipeline}:\n{metrics}"
        );
    }
    let (code, ready) = http_get(port, "/readyz").expect("/readyz");
    assert_eq!(code, 200, "{ready}");
    assert_eq!(ready.lines().count(), 3, "{ready}");

    for relay in &mut relays {
        relay.stop(Duration::from_secs(30));
    }

    for ((pipeline, scenario), mut writes) in legs.iter().zip(writes) {
        assert_eq!(writes.committed.len() as u64, SCALE.events);
        let resolved = scenario.resolve_uncertain(&mut writes).await;
        let delivered = scenario
            .read_back(&writes.committed, Duration::from_secs(180))
            .await;
        let check = check_delivery(&writes.committed, &delivered);
        println!(
            "pipeline {pipeline}: {} → {}: {} committed ({} rolled back, {resolved} uncertain \
             that committed); {} messages read back ({} duplicates); relay-0 SIGKILLed after \
             {killed_at} of {total} writes; all drained at {drained:.1}s",
            scenario.store.name(),
            scenario.broker.name(),
            writes.committed.len(),
            writes.rolled_back.len(),
            check.messages,
            check.duplicates
        );
        // `unexpected` catches another pipeline's events on this pipeline's broker.
        scenario.assert_delivery(&writes, &check, &delivered);
    }

    for (_, scenario) in &legs {
        scenario.cleanup().await;
    }
    for (schema, (_, scenario)) in [&schema_a, &schema_b].into_iter().zip(&legs) {
        let side = PostgresSide::open(&scenario.store.table().to_owned()).await;
        side.drop_schema(schema).await;
    }
}
