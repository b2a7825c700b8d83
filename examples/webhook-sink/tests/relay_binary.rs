//! The custom binary `outbox-webhook-relay` end to end: PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`,
//! default the local server) → `outbox-webhook-relay run` → a local HTTP server in this test.
//! Fails — never skips — when PostgreSQL is unreachable.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Recorded, Reply, TestServer};
use outboxkit_core::testkit::relay_process::{
    self, postgres_relay_toml, postgres_url, scratch_dir, unique, RelayProcess,
};
use outboxkit_core::NewEvent;
use outboxkit_store_postgres::Outbox;
use uuid::Uuid;

const EVENTS: usize = 500;
const AGGREGATES: usize = 20;
const SECRET: &str = "Bearer e2e-s3cr3t";

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-webhook-relay")
}

async fn postgres_pool() -> sqlx::PgPool {
    let url = postgres_url();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable ({e}): start it (scripts/services.sh)")
        })
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("relay.toml");
    std::fs::write(&path, text).expect("writing the configuration");
    path
}

fn config(table: &str, webhook: &str) -> String {
    let settings = format!(
        "url = \"{webhook}/hooks\"\npath = \"{{aggregate_type}}\"\ntimeout = \"5s\"\nconcurrency = 8"
    );
    postgres_relay_toml(table, 16, "webhook", &settings)
}

/// `outbox-webhook-relay --config FILE <args>` to completion: (exit status, stdout, stderr).
fn run_cli(config: &Path, args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    relay_process::run_cli(binary(), config, args, env)
}

/// `outbox-webhook-relay run` with the webhook's secret header set in its environment.
fn start_relay(config: &Path, dir: &Path) -> RelayProcess {
    let env = [("OUTBOX_SINK__WEBHOOK__HEADERS__AUTHORIZATION", SECRET)];
    RelayProcess::start(binary(), config, &env, dir.join("relay.log"))
}

async fn pending_rows(pool: &sqlx::PgPool, table: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE published_at IS NULL"
    )))
    .fetch_one(pool)
    .await
    .expect("counting pending rows")
}

/// The sequence number the test wrote into an event's payload.
fn sequence(request: &Recorded) -> Option<u64> {
    request.json()["payload"]["n"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_postgres_to_the_webhook_in_order_per_aggregate() {
    let table = unique("webhook_e2e");
    let dir = scratch_dir(binary(), &table);
    let server = TestServer::start().await;

    // The endpoint fails the first attempt of some events: a 500 for every 10th, a 429 with
    // Retry-After for every 50th. The relay must retry them without letting a later event of
    // the same aggregate overtake.
    let attempted: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let injected = Arc::new(Mutex::new(0usize));
    {
        let (attempted, injected) = (attempted.clone(), injected.clone());
        server.respond_with(move |request| {
            if request.method != "POST" {
                return Reply::status(200);
            }
            let Some(n) = sequence(request) else {
                return Reply::status(400).body("no payload.n");
            };
            let first = attempted.lock().unwrap().insert(n);
            if first && n % 50 == 7 {
                *injected.lock().unwrap() += 1;
                return Reply::status(429).header("Retry-After", "1");
            }
            if first && n % 10 == 3 {
                *injected.lock().unwrap() += 1;
                return Reply::status(500).body("transient failure");
            }
            Reply::status(202)
        });
    }

    let config = write_config(&dir, &config(&table, &server.url()));
    for _ in 0..2 {
        let (status, out, err) = run_cli(&config, &["migrate"], &[]);
        assert!(status.success(), "migrate failed: {out}{err}");
    }
    let pool = postgres_pool().await;
    let mut relay = start_relay(&config, &dir);

    // Write while the relay runs: 100 transactions of 5 events over 20 aggregates.
    let outbox = Outbox::new(&table).unwrap();
    let mut committed: HashMap<Uuid, (i64, String)> = HashMap::new();
    let started = Instant::now();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for chunk in 0..EVENTS / 5 {
        let events: Vec<NewEvent> = (0..5)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let n = (chunk * 5 + i) as u64;
                let aggregate = (x % AGGREGATES as u64) as usize;
                let kind = if aggregate.is_multiple_of(2) {
                    "order"
                } else {
                    "customer"
                };
                NewEvent::new(
                    kind,
                    format!("{kind}-{aggregate}"),
                    "Changed",
                    serde_json::json!({ "n": n, "aggregate": aggregate }),
                )
                .header(
                    "traceparent",
                    format!("00-4bf92f3577b34da6a3ce929d0e0e{n:04}-00f067aa0ba902b7-01"),
                )
                .event_id(Uuid::now_v7())
            })
            .collect();
        let mut tx = pool.begin().await.unwrap();
        let ids = outbox.enqueue_many(&mut tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        for (event, id) in events.iter().zip(ids) {
            committed.insert(event.event_id.unwrap(), (id, event.aggregate_id.clone()));
        }
    }
    let written = started.elapsed();

    let everything = {
        let expected: HashSet<String> = committed.keys().map(Uuid::to_string).collect();
        move |requests: &[Recorded]| {
            let accepted: HashSet<&str> = requests
                .iter()
                .filter(|r| r.accepted() && r.method == "POST")
                .filter_map(|r| r.header("idempotency-key"))
                .collect();
            expected.iter().all(|id| accepted.contains(id.as_str()))
        }
    };
    let delivered = server
        .wait_until(Duration::from_secs(120), everything)
        .await;
    let delivered_after = started.elapsed();
    if !delivered {
        let exited = relay.exited();
        panic!(
            "not every event reached the webhook within 120 s (relay exited: {exited:?}); log:\n{}",
            relay.log_text()
        );
    }

    // Every row is marked once the relay has the 2xx.
    let deadline = Instant::now() + Duration::from_secs(30);
    while pending_rows(&pool, &table).await > 0 {
        assert!(
            Instant::now() < deadline,
            "rows still pending after delivery"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit status {exit} on SIGTERM; log:\n{log}");
    assert!(
        !log.contains("e2e-s3cr3t"),
        "the Authorization header leaked into the log"
    );

    // Check what the endpoint received, in the order it received it.
    let requests = server.requests();
    let posts: Vec<&Recorded> = requests.iter().filter(|r| r.method == "POST").collect();
    let accepted: Vec<&Recorded> = posts.iter().copied().filter(|r| r.accepted()).collect();
    let mut first_seen: HashSet<Uuid> = HashSet::new();
    let mut last_id: HashMap<String, i64> = HashMap::new();
    let mut violations = Vec::new();
    let mut duplicates = 0;
    for request in &accepted {
        let body = request.json();
        let event_id: Uuid = body["event_id"].as_str().unwrap().parse().unwrap();
        assert_eq!(
            request.header("idempotency-key"),
            Some(event_id.to_string().as_str()),
            "Idempotency-Key is the event_id"
        );
        assert_eq!(request.header("authorization"), Some(SECRET));
        assert_eq!(request.header("content-type"), Some("application/json"));
        let kind = body["aggregate_type"].as_str().unwrap();
        assert_eq!(request.path, format!("/hooks/{kind}"));
        assert!(body["payload"].is_object(), "payload embedded as JSON");
        let n = body["payload"]["n"].as_u64().unwrap();
        assert_eq!(
            request.header("traceparent"),
            Some(format!("00-4bf92f3577b34da6a3ce929d0e0e{n:04}-00f067aa0ba902b7-01").as_str())
        );
        if !first_seen.insert(event_id) {
            duplicates += 1;
            continue;
        }
        let (id, aggregate) = committed
            .get(&event_id)
            .unwrap_or_else(|| panic!("{event_id} was never committed"));
        assert_eq!(body["aggregate_id"], aggregate.as_str());
        if let Some(previous) = last_id.insert(aggregate.clone(), *id) {
            if previous > *id {
                violations.push(format!("{aggregate}: id {id} arrived after id {previous}"));
            }
        }
    }
    let injected = *injected.lock().unwrap();
    println!(
        "{EVENTS} events over {AGGREGATES} aggregates written in {:.2}s, all delivered after {:.2}s; \
         {} POSTs ({} accepted, {injected} failures injected), {duplicates} duplicates",
        written.as_secs_f64(),
        delivered_after.as_secs_f64(),
        posts.len(),
        accepted.len(),
    );
    assert_eq!(first_seen.len(), EVENTS, "every committed event arrived");
    assert!(violations.is_empty(), "order violations: {violations:?}");
    assert!(injected >= EVENTS / 10, "{injected} failures injected");
    assert!(
        posts.len() >= EVENTS + injected,
        "failed events were retried"
    );

    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .expect("dropping the test table");
}

#[tokio::test]
async fn refuses_to_start_when_the_webhook_is_unreachable() {
    let table = unique("webhook_down");
    let dir = scratch_dir(binary(), &table);
    let port = common::free_port();
    let config = write_config(
        &dir,
        &config(&table, &format!("http://relay:s3cr3t@127.0.0.1:{port}")),
    );
    let (status, out, err) = run_cli(&config, &["migrate"], &[]);
    assert!(status.success(), "migrate failed: {out}{err}");
    let (status, _, err) = run_cli(&config, &["run"], &[]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "cannot reach the webhook at 127.0.0.1:{port} (sink.webhook.url)"
        )),
        "{err}"
    );
    assert!(!err.contains("s3cr3t"), "{err}");
    let pool = postgres_pool().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&pool)
        .await
        .expect("dropping the test table");
}

/// Configuration errors of `[sink.webhook]` are reported before anything connects, naming the
/// key and the file (the store URL points nowhere on purpose).
#[test]
fn configuration_errors_name_the_key_and_the_file() {
    let dir = scratch_dir(binary(), &unique("webhook_config"));
    let base = "[store]\nkind = \"postgres\"\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n\
                [sink]\nkind = \"webhook\"\n";
    let cases: &[(&str, &str)] = &[
        (
            "",
            "sink.webhook.url: missing required key (in FILE, or set OUTBOX_SINK__WEBHOOK__URL)",
        ),
        (
            "[sink.webhook]\nurl = \"http://h\"\nulr = \"x\"\n",
            "sink.webhook.ulr: unknown key (expected one of: url, path,",
        ),
        (
            "[sink.webhook]\nurl = \"ftp://u:s3cr3t@h/in\"\n",
            "sink.webhook.url: unsupported scheme `ftp://` (expected http:// or https://) (in FILE)",
        ),
        (
            "[sink.webhook]\nurl = \"http://h\"\npath = \"{aggregate}\"\n",
            "sink.webhook.path: destination template `{aggregate}`: unknown placeholder",
        ),
        (
            "[sink.webhook]\nurl = \"http://h\"\ntimeout = \"soon\"\n",
            "sink.webhook.timeout: expected a duration such as \"500ms\", \"30s\", \"5m\" or \"7d\", found string \"soon\" (in FILE)",
        ),
        (
            "[sink.webhook]\nurl = \"http://h/events/{aggregate_type}\"\n",
            "sink.webhook.url: contains a placeholder, but `url` is the fixed base URL: put the \
             template into sink.webhook.path",
        ),
        (
            "[sink.webhook]\nurl = \"http://h\"\n[sink.webhook.headers]\nContent-Type = \"text/plain\"\n",
            "sink.webhook.headers: `Content-Type` is set by the sink itself and cannot be configured \
             (reserved: content-type, content-length, idempotency-key, host, transfer-encoding, \
             connection, keep-alive, proxy-connection, te, trailer, upgrade, expect) (in FILE)",
        ),
        (
            "[sink.webhok]\nurl = \"http://h\"\n",
            // The other sinks listed depend on the features the binary was built with.
            "sink.webhok: unknown key (expected one of: kind, destination, ",
        ),
    ];
    for (section, expected) in cases {
        let config = write_config(&dir, &format!("{base}{section}"));
        let (status, _, err) = run_cli(&config, &["run"], &[]);
        let expected = expected.replace("FILE", &config.display().to_string());
        assert_eq!(status.code(), Some(2), "{section}: {err}");
        assert!(
            err.starts_with(&format!("error: invalid configuration: {expected}")),
            "{section}\nexpected: {expected}\ngot: {err}"
        );
        assert!(!err.contains("s3cr3t"), "{err}");
    }

    // From the environment, the variable is named.
    let config = write_config(&dir, &format!("{base}[sink.webhook]\nurl = \"http://h\"\n"));
    let (status, _, err) = run_cli(
        &config,
        &["run"],
        &[("OUTBOX_SINK__WEBHOOK__CONCURRENCY", "0")],
    );
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(
        err.contains(
            "sink.webhook.concurrency: must be between 1 and 1024, got 0 \
             (from environment variable OUTBOX_SINK__WEBHOOK__CONCURRENCY)"
        ),
        "{err}"
    );
}

#[test]
fn version_lists_the_webhook_sink() {
    let out = Command::new(binary())
        .arg("--version")
        .output()
        .expect("running outbox-webhook-relay --version");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("sinks: ") && text.contains("webhook"),
        "{text}"
    );
    assert!(
        text.contains("stores: ") && text.contains("postgres"),
        "{text}"
    );
}
