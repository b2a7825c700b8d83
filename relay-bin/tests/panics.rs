//! A panic in an adapter while `run` connects it (a team's own sink that panics in `build` or
//! in its first `check`)
//! ends the start with a failure naming the pipeline, exit code 1, where it used to take the
//! whole process down (exit code 101, no `error:` line), the other pipelines with it.
//!
//! The store is the local PostgreSQL (`OUTBOX_TEST_POSTGRES_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`); the tests fail, never skip, when it is down.

#![cfg(all(feature = "store-postgres", feature = "sink-redis-streams"))]

use clap::Parser;
use outboxkit_core::{OutboxEvent, Outcome, Sink};
use outboxkit_relay::cli::{execute, Cli};
use outboxkit_relay::Registry;

/// `kind = "broken"`: a sink that panics in `build` or in `check` (`panics_in`), as a third
/// party's might.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BrokenConfig {
    #[serde(default)]
    destination: String,
    panics_in: String,
}

impl outboxkit_core::SinkConfig for BrokenConfig {
    const KIND: &'static str = "broken";
    type Sink = BrokenSink;

    fn destination_mut(&mut self) -> &mut String {
        &mut self.destination
    }

    async fn build(self) -> outboxkit_core::Result<BrokenSink> {
        tokio::task::yield_now().await;
        if self.panics_in == "build" {
            panic!(
                "the broken sink cannot build its client: {}",
                "no such option"
            );
        }
        Ok(BrokenSink)
    }
}

#[derive(Debug)]
struct BrokenSink;

#[async_trait::async_trait]
impl Sink for BrokenSink {
    fn kind(&self) -> &'static str {
        "broken"
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        event.aggregate_type.clone()
    }

    async fn check(&self) -> outboxkit_core::Result<()> {
        tokio::task::yield_now().await;
        panic!("the broken sink's check indexed past the end: {}", 3);
    }

    async fn publish(&self, _: &[OutboxEvent]) -> outboxkit_core::Result<Vec<Outcome>> {
        unreachable!("a sink whose check panics is never published to")
    }
}

fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// `outbox-relay <command>` with `config` and the built-in adapters plus `broken`.
async fn relay(
    name: &str,
    config: &str,
    command: &str,
) -> Result<(), outboxkit_relay::cli::Failure> {
    let path = std::env::temp_dir().join(format!(
        "outbox-relay-panics-{name}-{}.toml",
        std::process::id()
    ));
    std::fs::write(&path, config).unwrap();
    let cli =
        Cli::try_parse_from(["outbox-relay", "--config", path.to_str().unwrap(), command]).unwrap();
    let mut registry = Registry::builtin();
    registry.sink::<BrokenConfig>();
    let outcome = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::spawn(async move { execute(cli, registry).await }),
    )
    .await
    .expect("the start ended");
    std::fs::remove_file(&path).unwrap();
    outcome.expect("the panic did not reach the caller")
}

/// `outbox-relay run` with `config`: its failure.
async fn run(name: &str, config: &str) -> outboxkit_relay::cli::Failure {
    match relay(name, config, "run").await {
        Ok(()) => panic!("a start whose sink panics succeeded"),
        Err(failure) => failure,
    }
}

async fn postgres_execute(sql: &str) {
    use outboxkit_store_postgres::sqlx::{self, Connection};
    let mut db = sqlx::PgConnection::connect(&postgres_url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut db)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_panics_while_connecting_fails_the_start() {
    // A migrated table, so that the start gets as far as the sink's first check.
    let table = format!("panics_one_{}", std::process::id());
    let config = format!(
        "[store]\nkind = \"postgres\"\nurl = \"{}\"\ntable = \"{table}\"\n\n\
         [sink]\nkind = \"broken\"\n\n[sink.broken]\npanics_in = \"check\"\n\n\
         [server]\nlisten = \"\"\n",
        postgres_url()
    );
    let migrated = relay("one", &config, "migrate").await;
    let failure = match migrated {
        Ok(()) => run("one", &config).await,
        Err(failure) => failure,
    };
    postgres_execute(&format!("DROP TABLE IF EXISTS {table}")).await;
    postgres_execute(&format!(
        "DELETE FROM outbox_relay_schema WHERE table_name = '{table}'"
    ))
    .await;
    assert_eq!(failure.code, 1, "{}", failure.message);
    assert!(
        failure.message.starts_with(
            "connecting panicked: the broken sink's check indexed past the end: 3 (a bug, most \
             likely in an adapter;"
        ),
        "{}",
        failure.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_panics_while_connecting_is_named_by_its_pipeline() {
    let url = postgres_url();
    let failure = run(
        "several",
        &format!(
            "[sink]\nkind = \"redis-streams\"\n\n[server]\nlisten = \"\"\n\n\
             [pipelines.stock.store]\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"panics_stock\"\n\n\
             [pipelines.billing.store]\nkind = \"postgres\"\nurl = \"{url}\"\ntable = \"panics_billing\"\n\n\
             [pipelines.billing.sink]\nkind = \"broken\"\n\n\
             [pipelines.billing.sink.broken]\npanics_in = \"build\"\n"
        ),
    )
    .await;
    assert_eq!(failure.code, 1, "{}", failure.message);
    assert!(
        failure
            .message
            .starts_with("pipeline billing: connecting panicked: the broken sink cannot build"),
        "{}",
        failure.message
    );
}
