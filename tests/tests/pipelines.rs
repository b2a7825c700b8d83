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

/// The pipelines of one test in one configuration file: each a scenario (its store side,
/// broker side and own one-pipeline configuration), the file holding them all as
/// `[pipelines.<name>]`, and the relays' environment.
struct Pipelines {
    legs: Vec<(&'static str, Scenario)>,
    /// PostgreSQL schemas the legs' tables live in, dropped by [`Pipelines::cleanup`].
    schemas: Vec<String>,
    dir: std::path::PathBuf,
    config: std::path::PathBuf,
    env: Vec<(String, String)>,
    port: u16,
}

/// One pipeline of a test: its name, a scenario between `store` and `broker` (prepared, its
/// table migrated), and lines for the sink's own table.
async fn leg(
    name: &'static str,
    store: impl StoreSide + 'static,
    (broker, sink_lines): (impl BrokerSide + 'static, &'static str),
) -> (&'static str, Scenario, &'static str) {
    let scenario = Scenario::prepare(Arc::new(store), Arc::new(broker), Settings::default()).await;
    (name, scenario, sink_lines)
}

/// The names of the tables and destinations of the pipelines `a`, `b` and `c` of test `name`:
/// `<name>_a`, `<name>_b`, `<name>_c`.
fn leg_names(name: &str) -> [String; 3] {
    ["a", "b", "c"].map(|leg| format!("{name}_{leg}"))
}

impl Pipelines {
    /// The pipelines `a`, `b` and `c` of test `name` ([`leg_names`]): `a` and `b` from the
    /// outbox tables of PostgreSQL schemas `<name>_a` and `<name>_b` (the tenant-per-schema
    /// layout), `c` from MariaDB table `<name>_c`; each to the broker side given for it (with
    /// lines for the sink's own table).
    async fn open(
        name: &str,
        a: (impl BrokerSide + 'static, &'static str),
        b: (impl BrokerSide + 'static, &'static str),
        c: (impl BrokerSide + 'static, &'static str),
    ) -> Self {
        let [schema_a, schema_b, table_c] = leg_names(name);
        let legs = vec![
            leg("a", PostgresSide::open_in_schema(&schema_a).await, a).await,
            leg("b", PostgresSide::open_in_schema(&schema_b).await, b).await,
            leg("c", MySqlSide::open(&table_c).await, c).await,
        ];
        Self::new(name, legs, vec![schema_a, schema_b])
    }

    /// `legs`: (name, scenario, lines for the sink's own table).
    fn new(name: &str, legs: Vec<(&'static str, Scenario, &str)>, schemas: Vec<String>) -> Self {
        let port = free_port();
        let named: Vec<(&str, &Scenario, &str)> =
            legs.iter().map(|(n, s, extra)| (*n, s, *extra)).collect();
        let dir = scratch_dir(name);
        let config = write_file(
            &dir,
            "relay.toml",
            &pipelines_config(&named, &format!("127.0.0.1:{port}")),
        );
        let env = legs
            .iter()
            .flat_map(|(_, s, _)| s.broker.relay_env())
            .collect();
        Self {
            legs: legs.into_iter().map(|(n, s, _)| (n, s)).collect(),
            schemas,
            dir,
            config,
            env,
            port,
        }
    }

    fn cli(&self, args: &[&str]) -> (bool, String, String) {
        run_cli(&self.config, args, &self.env)
    }

    /// Start writers of `plan` on every pipeline.
    async fn start_writers(&self, plan: &WriterPlan) -> Vec<Writers> {
        let mut writers = Vec::new();
        for (_, scenario) in &self.legs {
            writers.push(scenario.start_writers(plan).await);
        }
        writers
    }

    /// Stop the writers and wait until every pipeline is drained.
    async fn finish_and_drain(&self, writers: Vec<Writers>, timeout: Duration) -> Vec<Writes> {
        let mut writes = Vec::new();
        for w in writers {
            writes.push(w.finish().await);
        }
        for (pipeline, scenario) in &self.legs {
            scenario
                .drain(&format!("pipeline {pipeline} to drain"), timeout)
                .await;
        }
        writes
    }

    /// For each pipeline: uncertain writes resolved, read back from its own broker, and the
    /// scenario's delivery check (`unexpected` catches another pipeline's events on it).
    async fn assert_delivered(&self, writes: Vec<Writes>, note: &str) {
        for ((pipeline, scenario), mut writes) in self.legs.iter().zip(writes) {
            let resolved = scenario.resolve_uncertain(&mut writes).await;
            let delivered = scenario
                .read_back(&writes.committed, Duration::from_secs(180))
                .await;
            let check = check_delivery(&writes.committed, &delivered);
            println!(
                "pipeline {pipeline}: {} → {}: {} committed ({} rolled back, {resolved} \
                 uncertain that committed); {} messages read back ({} duplicates){note}",
                scenario.store.name(),
                scenario.broker.name(),
                writes.committed.len(),
                writes.rolled_back.len(),
                check.messages,
                check.duplicates
            );
            scenario.assert_delivery(&writes, &check, &delivered);
        }
    }

    async fn cleanup(&self) {
        for (_, scenario) in &self.legs {
            scenario.cleanup().await;
        }
        for (schema, (_, scenario)) in self.schemas.iter().zip(&self.legs) {
            PostgresSide::open(scenario.store.table())
                .await
                .drop_schema(schema)
                .await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_pipelines_in_two_relays_one_sigkilled_each_on_its_own_broker() {
    let name = unique("pipelines");
    let [a, b, c] = leg_names(&name);
    let pipelines = Pipelines::open(
        &name,
        (RedisSide::open(&a).await, ""),
        (RabbitMqSide::open(&b).await, ""),
        (KafkaSide::open(&c).await, ""),
    )
    .await;
    let (config, env, port) = (&pipelines.config, &pipelines.env, pipelines.port);

    // migrate migrates every pipeline (idempotent: each scenario migrated its own table).
    let (ok, out, err) = pipelines.cli(&["migrate"]);
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
            RelayProcess::start(config, &pipelines.dir, &format!("relay-{i}"), &env)
        })
        .collect();
    let started = Instant::now();
    let writers = pipelines.start_writers(&WriterPlan::bounded(SCALE)).await;
    let total = SCALE.events * pipelines.legs.len() as u64;
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
    relays[0].sigkill_and_restart().await;

    let writes = pipelines
        .finish_and_drain(writers, Duration::from_secs(300))
        .await;
    let drained = started.elapsed().as_secs_f64();
    for relay in &mut relays {
        assert!(
            relay.is_running(),
            "{} died:\n{}",
            relay.name(),
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
                    .all(|p| status["pipelines"][p]["relays"] == 2);
            async move { shared }
        },
    )
    .await;
    let (ok, text, err) = pipelines.cli(&["status", "--json"]);
    assert!(ok, "status: {err}");
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    for pipeline in ["a", "b", "c"] {
        let line = &status["pipelines"][pipeline];
        assert_eq!(line["pending"], 0, "{status}");
        assert_eq!(line["dead"], 0, "{status}");
        // As in the single report: none kept (these relays delete what they publish).
        let kept = line.as_object().and_then(|l| l.get("oldest_kept_at"));
        assert_eq!(kept, Some(&serde_json::Value::Null), "{status}");
    }
    let (ok, table, _) = pipelines.cli(&["status"]);
    assert!(ok);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("pipeline"), "{table}");
    assert!(lines[0].ends_with("kept since (UTC)"), "{table}");
    assert_eq!(
        lines.len(),
        4,
        "a header and one line per pipeline:\n{table}"
    );
    for line in &lines[1..] {
        assert!(line.ends_with("  none"), "nothing kept:\n{table}");
    }
    let (ok, one, _) = pipelines.cli(&["--pipeline", "b", "status", "--json"]);
    assert!(ok);
    let one: serde_json::Value = serde_json::from_str(&one).unwrap();
    assert_eq!(
        one["shards_owned"], 32,
        "the whole report of one pipeline: {one}"
    );
    let (ok, _, err) = pipelines.cli(&["dead", "list"]);
    assert!(!ok && err.contains("choose one with --pipeline"), "{err}");

    // One pipeline paused: its line says who and why, the others' say nothing; then resumed.
    let pause = [
        "--pipeline",
        "b",
        "pause",
        "--by",
        "ops",
        "--reason",
        "b's consumer",
    ];
    let (ok, out, err) = pipelines.cli(&pause);
    assert!(ok && out.starts_with("paused pipeline b: "), "{out}{err}");
    let (ok, table, _) = pipelines.cli(&["status"]);
    assert!(ok);
    let paused: Vec<&str> = table.lines().filter(|l| l.contains("PAUSED")).collect();
    assert_eq!(paused.len(), 1, "{table}");
    assert!(
        paused[0].trim_start().starts_with("PAUSED since "),
        "{table}"
    );
    assert!(paused[0].ends_with(" UTC by ops: b's consumer"), "{table}");
    let b_line = table.lines().position(|l| l.starts_with("b ")).unwrap();
    assert!(
        table.lines().nth(b_line + 1).unwrap().contains("PAUSED"),
        "under b's line: {table}"
    );
    let (_, text, _) = pipelines.cli(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(status["pipelines"]["b"]["paused"]["by"], "ops", "{status}");
    assert_eq!(status["pipelines"]["a"]["paused"], serde_json::Value::Null);
    let (ok, out, err) = pipelines.cli(&["resume"]);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("resumed pipeline b: "))
            .count(),
        1,
        "{out}"
    );
    assert_eq!(
        out.lines()
            .filter(|l| l.starts_with("was not paused: pipeline "))
            .count(),
        2,
        "{out}"
    );

    // Metrics and readiness per pipeline.
    scrape_documented(port);
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
    for w in &writes {
        assert_eq!(w.committed.len() as u64, SCALE.events);
    }
    pipelines
        .assert_delivered(
            writes,
            &format!(
                "; relay-0 SIGKILLed after {killed_at} of {total} writes; all drained at \
                 {drained:.1}s"
            ),
        )
        .await;
    pipelines.cleanup().await;
}

/// A pipeline whose table is a pattern: `<prefix>_*.outbox` on PostgreSQL → Redis, scanned
/// every 2 s. A tenant schema that exists at start is relayed; one whose table was never
/// migrated is reported (status, gauge, /readyz) and not relayed; a tenant created while the
/// relay runs (its table made by `migrate` with the pipeline's table overridden, as the
/// runbook says) is relayed within one scan and one poll; a dropped tenant's relay stops
/// cleanly while the process goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pattern_pipeline_follows_tenants_as_they_come_and_go() {
    let prefix = unique("tenants");
    let port = free_port();
    let redis = RedisSide::open(&prefix).await;
    let config_text = format!(
        r#"[pipelines.tenants.store]
kind = "postgres"
url = "{url}"
table = "{prefix}_*.outbox"
shards = 8
discovery_interval = "2s"

{sink}
[relay]
rebalance_interval = "200ms"
poll_interval_max = "50ms"
status_interval = "200ms"
shutdown_grace = "10s"

[server]
listen = "127.0.0.1:{port}"
"#,
        url = postgres_url(),
        sink = redis
            .sink_toml()
            .replace("[sink", "[pipelines.tenants.sink")
    );
    let dir = scratch_dir(&prefix);
    let config = write_file(&dir, "relay.toml", &config_text);
    let cli = |args: &[&str], env: &[(String, String)]| run_cli(&config, args, env);
    let migrate_tenant = |schema: &str| {
        let env = [(
            "OUTBOX_PIPELINES__TENANTS__STORE__TABLE".to_owned(),
            format!("{schema}.outbox"),
        )];
        let (ok, out, err) = cli(&["migrate", "--pipeline", "tenants"], &env);
        assert!(ok, "migrate {schema}: {out}{err}");
    };

    // Before the first tenant: `status` names the pipeline and why it has no figures; `dead`
    // says there is no table.
    let no_match = "no table matches its pattern";
    let (ok, text, err) = cli(&["status", "--json"], &[]);
    assert!(ok, "status before the first tenant: {text}{err}");
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(status["pipelines"]["tenants"]["note"], no_match, "{status}");
    let (ok, text, _) = cli(&["status"], &[]);
    let line = text.lines().find(|l| l.starts_with("tenants "));
    assert!(ok && line.is_some_and(|l| l.ends_with(no_match)), "{text}");
    let (ok, _, err) = cli(&["dead", "list"], &[]);
    let expected = format!("dead: pipeline tenants has no table: {no_match}");
    assert!(!ok && err.contains(&expected), "{err}");

    // Before the relay: tenant a migrated, tenant b's table made by hand (never migrated).
    let (a, b, c) = (
        format!("{prefix}_a"),
        format!("{prefix}_b"),
        format!("{prefix}_c"),
    );
    let tenant_a = PostgresSide::open_in_schema(&a).await;
    migrate_tenant(&a);
    let tenant_b = PostgresSide::open_in_schema(&b).await;
    tenant_b
        .exec_sql(&format!("CREATE TABLE {b}.outbox (id bigint)"))
        .await;
    let event = |aggregate: &str, i: u32| {
        outboxkit_core::NewEvent::new("order", aggregate, "Placed", serde_json::json!({ "i": i }))
            .event_id(uuid::Uuid::now_v7())
    };
    let first: Vec<_> = (0..20).map(|i| event("a1", i)).collect();
    tenant_a.enqueue_many(&first).await;

    // `events` searches every table of the pattern: tenant a's pending events (the newest
    // three, under the table's heading), tenant b's table named as not searched (exit 1).
    let table_a = format!("tenants/{a}.outbox");
    let (ok, text, err) = cli(&["events", "--aggregate-id", "a1", "--limit", "3"], &[]);
    let rows = text.lines().filter(|l| l.contains(" order/a1 ")).count();
    assert!(
        !ok && text.starts_with(&format!("-- pipeline {table_a}\n")) && rows == 3,
        "{text}{err}"
    );
    assert!(
        text.contains(&format!("pipeline tenants/{b}.outbox: not searched: "))
            && err.contains(&format!("events failed for pipeline(s) tenants/{b}.outbox")),
        "{text}{err}"
    );
    let newest = first[19].event_id_or_new().to_string();
    let (ok, json, err) = cli(&["events", "--event-id", &newest, "--json"], &[]);
    assert!(
        !ok && err.contains(&format!("tenants/{b}.outbox: not searched: ")),
        "{err}"
    );
    let found: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(found.len(), 1, "{json}");
    assert_eq!(found[0]["pipeline"], table_a.as_str());
    assert_eq!(found[0]["state"], "pending");

    let mut relay = RelayProcess::start(&config, &dir, "relay-tenants", &[]);
    wait_for("tenant a relayed", Duration::from_secs(30), || async {
        tenant_a.pending().await == 0
    })
    .await;

    // Tenant b is reported, not skipped silently.
    let (ok, text, err) = cli(&["status", "--json"], &[]);
    assert!(
        !ok,
        "status fails while a table cannot be read: {text}{err}"
    );
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    let b_line = &status["pipelines"][format!("tenants/{b}.outbox")];
    assert!(
        b_line["error"]
            .as_str()
            .unwrap_or_default()
            .contains("migrate"),
        "{status}"
    );
    assert_eq!(
        status["pipelines"][format!("tenants/{a}.outbox")]["pending"],
        0
    );
    // One table's report and its dead events: the commands they point to name the table.
    let (ok, text, err) = cli(&["--pipeline", &table_a, "status"], &[]);
    let dead_list = format!("`outbox-relay --pipeline {table_a} dead list`");
    assert!(
        ok && text.contains(&format!("(see {dead_list})")),
        "{text}{err}"
    );
    let (ok, _, err) = cli(&["--pipeline", &table_a, "dead", "retry", "999999999"], &[]);
    assert!(
        !ok && err.contains(&format!("{dead_list} shows the dead ones")),
        "{err}"
    );
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert!(
        metrics.contains("outbox_discovered_tables{pipeline=\"tenants\",state=\"unmigrated\"} 1"),
        "{metrics}"
    );
    assert!(scrape_documented(port).contains("outbox_discovered_tables"));
    let (code, ready) = http_get(port, "/readyz").unwrap();
    assert_eq!(code, 503, "{ready}");
    assert!(
        ready.contains(&format!("tenants/{b}.outbox: not migrated")),
        "{ready}"
    );
    assert!(
        ready.contains(&format!("tenants/{a}.outbox: ready")),
        "{ready}"
    );

    // A new tenant while the relay runs: delivered within one scan and one poll.
    let mut arrivals = redis.watch().await;
    let tenant_c = PostgresSide::open_in_schema(&c).await;
    migrate_tenant(&c);
    let created = Instant::now();
    let late = event("c1", 0);
    let late_id = late.event_id.unwrap();
    tenant_c.enqueue_many(&[late]).await;
    let arrived = loop {
        let (id, at) = tokio::time::timeout(Duration::from_secs(20), arrivals.recv())
            .await
            .expect("the new tenant's event within 20 s")
            .expect("the watch runs");
        if id == late_id {
            break at;
        }
    };
    let took = arrived.duration_since(created);
    println!(
        "new tenant {c}: its first event arrived {:.2}s after its table was migrated \
         (discovery_interval 2s, poll_interval_max 50ms)",
        took.as_secs_f64()
    );
    assert!(
        took <= Duration::from_millis(2_000 + 50 + 1_500),
        "took {took:?}: more than one scan, one poll and 1.5 s to connect the table and take its shards"
    );

    // Tenant a's schema dropped: its relay stops, the others go on.
    tenant_a.drop_schema(&a).await;
    wait_for(
        "tenant a gone from /readyz",
        Duration::from_secs(15),
        || async {
            http_get(port, "/readyz")
                .is_some_and(|(_, body)| !body.contains(&format!("tenants/{a}.outbox")))
        },
    )
    .await;
    let second = event("c1", 1);
    let second_id = second.event_id.unwrap();
    tenant_c.enqueue_many(&[second]).await;
    loop {
        let (id, _) = tokio::time::timeout(Duration::from_secs(20), arrivals.recv())
            .await
            .expect("tenant c still relayed")
            .expect("the watch runs");
        if id == second_id {
            break;
        }
    }
    assert!(relay.is_running(), "{}", relay.log_text());
    let log = relay.log_text();
    assert!(
        log.contains("the table is gone: its relay stopped"),
        "{log}"
    );

    relay.stop(Duration::from_secs(30));
    let delivered: std::collections::HashSet<uuid::Uuid> = redis
        .read_back(&Default::default(), Duration::ZERO)
        .await
        .iter()
        .map(|d| d.event_id)
        .collect();
    for e in &first {
        assert!(
            delivered.contains(&e.event_id.unwrap()),
            "tenant a's events all arrived"
        );
    }
    redis.cleanup().await;
    tenant_b.drop_schema(&b).await;
    tenant_c.drop_schema(&c).await;
}

/// A pattern that also matches the table another pipeline names: that table is the other
/// pipeline's alone (`migrate`, `status`, `run`), else its events would go to either sink. A
/// table two patterns match is the first pattern pipeline's (`zz`, after `tenants`, relays
/// nothing, into the broker of `own`, which would catch a misrouted event).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pattern_leaves_alone_the_table_another_pipeline_names() {
    let prefix = unique("claimed");
    let port = free_port();
    let (tenant, own) = (format!("{prefix}_t"), format!("{prefix}_own"));
    let (tenants_broker, own_broker) = (
        RedisSide::open(&format!("{prefix}-tenants")).await,
        RedisSide::open(&format!("{prefix}-own")).await,
    );
    let store = |table: &str| {
        format!(
            "kind = \"postgres\"\nurl = \"{}\"\ntable = \"{table}\"\nshards = 8\n",
            postgres_url()
        )
    };
    let sink = |broker: &RedisSide, pipeline: &str| {
        broker
            .sink_toml()
            .replace("[sink", &format!("[pipelines.{pipeline}.sink"))
    };
    let config_text = format!(
        "[pipelines.own.store]\n{}\n{}\n[pipelines.tenants.store]\n{}\n{}\n\
         [pipelines.zz.store]\n{}\n{}\n[relay]\nrebalance_interval = \"200ms\"\npoll_interval_max = \"50ms\"\n\n\
         [server]\nlisten = \"127.0.0.1:{port}\"\n",
        store(&format!("{own}.outbox")),
        sink(&own_broker, "own"),
        store(&format!("{prefix}_*.outbox")),
        sink(&tenants_broker, "tenants"),
        store(&format!("{prefix}_t*.outbox")),
        sink(&own_broker, "zz"),
    );
    let dir = scratch_dir(&prefix);
    let config = write_file(&dir, "relay.toml", &config_text);
    let cli = |args: &[&str], env: &[(String, String)]| run_cli(&config, args, env);
    let (tenant_side, own_side) = (
        PostgresSide::open_in_schema(&tenant).await,
        PostgresSide::open_in_schema(&own).await,
    );
    let env = [(
        "OUTBOX_PIPELINES__TENANTS__STORE__TABLE".to_owned(),
        format!("{tenant}.outbox"),
    )];
    let (ok, out, err) = cli(&["migrate", "--pipeline", "tenants"], &env);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli(&["migrate"], &[]);
    let claimed = format!("tenants/{own}.outbox");
    assert!(
        ok && !out.contains(&claimed),
        "migrated once, by its own pipeline: {out}{err}"
    );
    assert!(out.contains("migrated pipeline own: "), "{out}");
    let (ok, text, err) = cli(&["status", "--json"], &[]);
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    let zz_note = format!(
        "its pattern matches only tables other pipelines relay: {tenant}.outbox (pipeline tenants)"
    );
    assert_eq!(
        status["pipelines"]["zz"]["note"],
        zz_note.as_str(),
        "{status}"
    );
    let reported: Vec<&String> = status["pipelines"].as_object().unwrap().keys().collect();
    let expected = [
        &"own".to_owned(),
        &format!("tenants/{tenant}.outbox"),
        &"zz".to_owned(),
    ];
    assert!(ok && reported == expected, "{status}{err}");
    let (ok, _, err) = cli(&["--pipeline", &claimed, "status"], &[]);
    assert!(
        !ok && err
            .contains("the table is relayed by pipeline own, not tenants: use --pipeline own"),
        "{err}"
    );
    let (ok, _, err) = cli(
        &["--pipeline", &format!("zz/{tenant}.outbox"), "status"],
        &[],
    );
    let use_instead = format!(
        "the table is relayed by pipeline tenants, not zz: use --pipeline tenants/{tenant}.outbox"
    );
    assert!(!ok && err.contains(&use_instead), "{err}");

    let events = |aggregate: &str| -> Vec<outboxkit_core::NewEvent> {
        (0..20)
            .map(|i| {
                outboxkit_core::NewEvent::new(
                    "order",
                    aggregate,
                    "Placed",
                    serde_json::json!({ "i": i }),
                )
                .event_id(uuid::Uuid::now_v7())
            })
            .collect()
    };
    let (to_tenants, to_own) = (events("t1"), events("o1"));
    tenant_side.enqueue_many(&to_tenants).await;
    own_side.enqueue_many(&to_own).await;
    let mut relay = RelayProcess::start(&config, &dir, "relay-claimed", &[]);
    wait_for("both tables relayed", Duration::from_secs(30), || async {
        tenant_side.pending().await == 0 && own_side.pending().await == 0
    })
    .await;
    let (_, ready) = http_get(port, "/readyz").unwrap();
    assert!(ready.contains(&format!("zz: ready, {zz_note}")), "{ready}");
    relay.stop(Duration::from_secs(30));
    let log = relay.log_text();
    let left: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("it is left to that pipeline"))
        .collect();
    let said = |pipeline: &str, table: &str, owner: &str| {
        left.iter().any(|l| {
            l.contains(&format!("relay{{pipeline={pipeline}}}"))
                && l.ends_with(&format!("table={table}.outbox relayed_by={owner}"))
        })
    };
    assert!(
        left.len() == 2 && said("tenants", &own, "own") && said("zz", &tenant, "tenants"),
        "{log}"
    );
    for (broker, written, name) in [
        (&tenants_broker, &to_tenants, "tenants"),
        (&own_broker, &to_own, "own"),
    ] {
        let mut read: Vec<uuid::Uuid> = broker
            .read_back(&Default::default(), Duration::ZERO)
            .await
            .iter()
            .map(|d| d.event_id)
            .collect();
        read.sort();
        let mut expected: Vec<uuid::Uuid> = written.iter().map(|e| e.event_id.unwrap()).collect();
        expected.sort();
        assert_eq!(
            read, expected,
            "pipeline {name}'s broker has its own table's events only"
        );
    }
    tenants_broker.cleanup().await;
    own_broker.cleanup().await;
    tenant_side.drop_schema(&tenant).await;
    own_side.drop_schema(&own).await;
}

/// The cumulative buckets `(le, count)` of `outbox_commit_to_ack_seconds` of `pipeline` in a
/// `/metrics` text.
fn commit_to_ack_buckets(metrics: &str, pipeline: &str) -> Vec<(f64, f64)> {
    let prefix = "outbox_commit_to_ack_seconds_bucket{";
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .filter(|rest| rest.contains(&format!("pipeline=\"{pipeline}\"")))
        .filter_map(|rest| {
            let le = rest.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = rest.rsplit(' ').next()?.parse().ok()?;
            Some((le, count))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// The `q` quantile of the events counted between two bucket snapshots, interpolated within
/// its bucket as Prometheus' `histogram_quantile` does; and how many events that is.
fn quantile_between(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> (f64, f64) {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(le, n)| {
            let was = before
                .iter()
                .find(|(l, _)| l == le)
                .map_or(0.0, |(_, n)| *n);
            (*le, n - was)
        })
        .collect();
    let total = delta.last().map_or(0.0, |(_, n)| *n);
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, n) in &delta {
        if n >= rank {
            if le.is_infinite() {
                return (lower.0, total);
            }
            let share = if n > lower.1 {
                (rank - lower.1) / (n - lower.1)
            } else {
                1.0
            };
            return (lower.0 + (le - lower.0) * share, total);
        }
        lower = (le, n);
    }
    (lower.0, total)
}

/// One pipeline's broker down does not slow the others: pipelines `a` (PostgreSQL → a private
/// `nats-server`), `b` (PostgreSQL → Redis Streams) and `c` (MariaDB → RabbitMQ) in one relay
/// process under steady writes; 30 s as they are, then 30 s with `a`'s nats-server frozen
/// (SIGSTOP, its own pid only). `b`'s and `c`'s commit→ack p99 during the outage stays within
/// twice its value before; `/readyz` names `a` alone as not ready; once thawed, `a` catches
/// up, and every pipeline delivered every committed event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_broker_holds_back_only_its_own_pipeline() {
    let name = unique("isolation");
    let nats_server = PrivateNats::start(&name, &[]);
    let [a, b, c] = leg_names(&name);
    let pipelines = Pipelines::open(
        &name,
        (
            NatsSide::open_at(&nats_server.url(), &a).await,
            "request_timeout = \"3s\"\nconnect_timeout = \"2s\"",
        ),
        (RedisSide::open(&b).await, ""),
        (RabbitMqSide::open(&c).await, ""),
    )
    .await;
    let port = pipelines.port;
    let mut env = pipelines.env.clone();
    env.push(("OUTBOX_LOG__FORMAT".to_owned(), "json".to_owned()));
    let mut relay = RelayProcess::start(&pipelines.config, &pipelines.dir, "relay-isolation", &env);
    wait_for_ready("/readyz", port, 200, Duration::from_secs(30)).await;

    // About 100 events/s per pipeline: 2 writers, 20 ms after each transaction.
    let writers = pipelines
        .start_writers(&WriterPlan::steady(2, 100, Duration::from_millis(20)))
        .await;
    let metrics = || http_get(port, "/metrics").expect("/metrics").1;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let warm = metrics();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let before_outage = metrics();

    nats_server.freeze();
    let frozen = Instant::now();
    let mut saw_a_down = false;
    while frozen.elapsed() < Duration::from_secs(30) {
        if let Some((503, body)) = http_get(port, "/readyz") {
            let a_down = body.lines().any(|l| l.starts_with("a: not ready"));
            let others_ready = body.lines().filter(|l| l.contains(": ready")).count() == 2;
            saw_a_down |= a_down && others_ready;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let during_outage = metrics();
    nats_server.thaw();

    for (pipeline, _) in &pipelines.legs[1..] {
        let (baseline, n0) = quantile_between(
            &commit_to_ack_buckets(&warm, pipeline),
            &commit_to_ack_buckets(&before_outage, pipeline),
            0.99,
        );
        let (outage, n1) = quantile_between(
            &commit_to_ack_buckets(&before_outage, pipeline),
            &commit_to_ack_buckets(&during_outage, pipeline),
            0.99,
        );
        println!(
            "pipeline {pipeline}: commit→ack p99 {:.1} ms over {n0} events before the outage, \
             {:.1} ms over {n1} events while pipeline a's broker was frozen ({:.2}×)",
            baseline * 1e3,
            outage * 1e3,
            outage / baseline
        );
        assert!(n0 > 1_000.0 && n1 > 1_000.0, "{n0} and {n1} events");
        assert!(
            outage <= 2.0 * baseline,
            "pipeline {pipeline}: p99 {outage:.4}s during the outage, {baseline:.4}s before"
        );
    }
    assert!(
        saw_a_down,
        "/readyz never named pipeline a alone as not ready during the outage"
    );

    let writes = pipelines
        .finish_and_drain(writers, Duration::from_secs(120))
        .await;
    relay.stop(Duration::from_secs(30));
    pipelines.assert_delivered(writes, "").await;
    // The NATS client's connection events (async-nats calls back on a task of its own) name the
    // pipeline, as every line of a pipeline's does: in JSON, `span.pipeline`.
    let nats_pipeline = &pipelines.legs[0].0;
    let log = relay.log_text();
    let connected: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|record| record["fields"]["message"] == "NATS connection (re)established")
        .collect();
    assert!(
        !connected.is_empty()
            && connected
                .iter()
                .all(|record| record["span"]["pipeline"] == **nats_pipeline),
        "{log}"
    );
    pipelines.cleanup().await;
}

/// Discovery on MySQL/MariaDB: `table = "<prefix>_*.outbox"` finds the `outbox` table of every
/// matching database on the server; `status` reports each, and a relay drains each to its
/// sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pattern_finds_the_outbox_of_every_matching_mysql_database() {
    let prefix = unique("dbs");
    let server = MySqlSide::open("outbox").await;
    let (x, y) = (format!("{prefix}_x"), format!("{prefix}_y"));
    let mut sides = Vec::new();
    for db in [&x, &y] {
        server.exec_sql(&format!("CREATE DATABASE {db}")).await;
        let side = MySqlSide::open(&format!("{db}.outbox")).await;
        side.connect_store(8, 2).await;
        sides.push(side);
    }
    sides[0].enqueue_many(&placed_events(30, 3)).await;
    let redis = RedisSide::open(&prefix).await;
    let (dir, config) = one_pipeline_config(
        &prefix,
        &format!(
            "kind = \"mysql\"\nurl = \"{}\"\ntable = \"{prefix}_*.outbox\"\n",
            mysql_url()
        ),
        &redis.sink_toml(),
    );
    let (ok, text, err) = run_cli(&config, &["status", "--json"], &[]);
    assert!(ok, "status: {err}");
    let status: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        status["pipelines"][format!("default/{x}.outbox")]["pending"],
        30,
        "{status}"
    );
    assert_eq!(
        status["pipelines"][format!("default/{y}.outbox")]["pending"],
        0,
        "{status}"
    );
    assert_eq!(
        status["pipelines"].as_object().unwrap().len(),
        2,
        "{status}"
    );

    let mut relay = RelayProcess::start(&config, &dir, "relay-dbs", &[]);
    let x_side = &sides[0];
    wait_for(
        "the first database drained",
        Duration::from_secs(30),
        || async { x_side.pending().await == 0 },
    )
    .await;
    relay.stop(Duration::from_secs(30));
    assert_eq!(redis.held(30, Duration::ZERO).await, 30);
    redis.cleanup().await;
    for db in [&x, &y] {
        server.exec_sql(&format!("DROP DATABASE {db}")).await;
    }
}
