//! The custom binary `outbox-mqtt-relay` end to end: PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`,
//! default the local server) → `outbox-mqtt-relay run` → Mosquitto → a subscriber in this
//! test. Fails, never skips, when PostgreSQL or Mosquitto is unreachable.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use common::Subscriber;
use outboxkit_core::testkit::relay_process::{
    self, postgres_relay_toml, postgres_url, scratch_dir, unique, RelayProcess,
};
use outboxkit_core::NewEvent;
use outboxkit_store_postgres::Outbox;
use uuid::Uuid;

const EVENTS: usize = 200;
const AGGREGATES: usize = 10;

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_outbox-mqtt-relay")
}

async fn postgres_pool() -> sqlx::PgPool {
    let url = postgres_url();
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .unwrap_or_else(|e| {
            panic!("PostgreSQL at {url} is unreachable ({e}): start it (scripts/services.sh)")
        })
}

/// A scratch directory with `relay.toml` for `table`, the given `[sink.mqtt]` body.
fn write_config(table: &str, mqtt: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(binary(), table);
    let path = dir.join("relay.toml");
    let text = postgres_relay_toml(table, 8, "mqtt", mqtt);
    std::fs::write(&path, text).expect("writing the configuration");
    (dir, path)
}

/// `outbox-mqtt-relay --config FILE <args>` to completion: (exit status, stdout + stderr).
fn run_cli(config: &Path, args: &[&str]) -> (ExitStatus, String) {
    let (status, out, err) = relay_process::run_cli(binary(), config, args, &[]);
    (status, out + &err)
}

async fn drop_table(table: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS {table}")))
        .execute(&postgres_pool().await)
        .await
        .expect("dropping the test table");
}

/// `outbox-mqtt-relay run` with the broker password set in its environment.
fn start_relay(config: &Path, dir: &Path) -> RelayProcess {
    let env = [("OUTBOX_SINK__MQTT__PASSWORD", "e2e-s3cr3t")];
    RelayProcess::start(binary(), config, &env, dir.join("relay.log"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_postgres_to_mosquitto_in_order_per_aggregate() {
    let table = unique("mqtt_e2e");
    let prefix = unique("e2e");
    let subscriber = Subscriber::connect().await;
    subscriber.subscribe(&format!("{prefix}/#")).await;
    let (host, port) = common::mosquitto();
    let (dir, config) = write_config(
        &table,
        &format!(
            "url = \"mqtt://{host}:{port}\"\nusername = \"relay\"\n\
             topic = \"{prefix}/{{aggregate_type}}/{{event_type}}\""
        ),
    );
    let (status, out) = run_cli(&config, &["migrate"]);
    assert!(status.success(), "migrate failed: {out}");
    let (status, out) = run_cli(&config, &["--version"]);
    assert!(status.success() && out.contains("mqtt"), "--version: {out}");

    let mut relay = start_relay(&config, &dir);
    let pool = postgres_pool().await;
    let outbox = Outbox::new(&table).unwrap();
    let mut committed: HashMap<Uuid, (i64, String)> = HashMap::new();
    for chunk in 0..EVENTS / 10 {
        let events: Vec<NewEvent> = (0..10)
            .map(|i| {
                let n = chunk * 10 + i;
                let aggregate = (n * 7 + chunk) % AGGREGATES;
                NewEvent::new(
                    "order",
                    format!("order-{aggregate}"),
                    "Changed",
                    serde_json::json!({ "n": n }),
                )
                .header("traceparent", format!("00-{n:032x}-00f067aa0ba902b7-01"))
                .event_id(Uuid::now_v7())
            })
            .collect();
        let mut tx = pool.begin().await.unwrap();
        let ids = outbox.enqueue_many(&mut tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        for (event, id) in events.iter().zip(ids) {
            let event_id = event.event_id.expect("an event id");
            committed.insert(event_id, (id, event.aggregate_id.clone()));
        }
    }

    let topic = format!("{prefix}/order/Changed");
    let received = subscriber
        .wait_for(|t| t == topic, EVENTS, Duration::from_secs(60))
        .await;
    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit status {exit} on SIGTERM; log:\n{log}");
    assert!(
        !log.contains("e2e-s3cr3t"),
        "the password leaked into the log"
    );

    let mut first_seen = HashMap::new();
    let mut last_id: HashMap<&str, i64> = HashMap::new();
    for message in &received {
        let event_id: Uuid = message.property("event_id").parse().unwrap();
        let (id, aggregate) = committed
            .get(&event_id)
            .unwrap_or_else(|| panic!("{event_id} was never committed"));
        assert_eq!(message.property("aggregate_id"), aggregate);
        assert!(message.property("traceparent").starts_with("00-"));
        if first_seen.insert(event_id, *id).is_some() {
            continue; // at least once: a redelivery may follow, never an overtaking
        }
        if let Some(previous) = last_id.insert(aggregate, *id) {
            assert!(
                previous < *id,
                "{aggregate}: id {id} arrived after {previous}"
            );
        }
    }
    assert_eq!(
        first_seen.len(),
        EVENTS,
        "not every event arrived within 60s; log:\n{log}"
    );
    drop_table(&table).await;
}

#[tokio::test]
async fn refuses_bad_settings_and_an_unreachable_broker() {
    let table = unique("mqtt_bad");
    let (_, config) = write_config(&table, "uri = \"mqtt://broker\"");
    let (status, out) = run_cli(&config, &["run"]);
    assert_eq!(status.code(), Some(2), "{out}");
    assert!(out.contains("sink.mqtt.uri"), "{out}");

    let (_, config) = write_config(&table, "url = \"mqtt://127.0.0.1:1\"");
    let (status, out) = run_cli(&config, &["migrate"]);
    assert!(status.success(), "migrate failed: {out}");
    let (status, out) = run_cli(&config, &["run"]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("mqtt"), "{out}");
    drop_table(&table).await;
}

/// A custom binary names itself, never `outbox-relay`, wherever it tells the operator what to
/// type: its help and version (its own, and the relay's), the store's "run ... migrate", and `status`'s dead-list command.
/// An operator who copied `outbox-relay migrate` would run another binary, or none.
#[tokio::test]
async fn names_itself_where_it_says_what_to_run() {
    let table = unique("mqtt_name");
    let (_, config) = write_config(&table, "url = \"mqtt://127.0.0.1:1\"");
    let (status, out) = run_cli(&config, &["--help"]);
    assert!(status.success(), "{out}");
    assert!(
        out.contains("Usage: outbox-mqtt-relay [OPTIONS] <COMMAND>"),
        "{out}"
    );
    // Its own version, and the relay's it is built on.
    let (status, out) = run_cli(&config, &["--version"]);
    let version = format!(
        "outbox-mqtt-relay {} (outboxkit-relay {}; stores: ",
        env!("CARGO_PKG_VERSION"),
        outboxkit_relay::cli::VERSION
    );
    assert!(status.success() && out.starts_with(&version), "{out}");

    let (status, out) = run_cli(&config, &["status"]);
    assert_eq!(status.code(), Some(1), "{out}");
    assert!(out.contains("run `outbox-mqtt-relay migrate`"), "{out}");
    let (status, out) = run_cli(&config, &["migrate"]);
    assert!(status.success(), "migrate failed: {out}");
    let (status, out) = run_cli(&config, &["status"]);
    assert!(status.success(), "{out}");
    assert!(out.contains("(see `outbox-mqtt-relay dead list`)"), "{out}");
    assert!(!out.contains("outbox-relay "), "{out}");
    drop_table(&table).await;
}
