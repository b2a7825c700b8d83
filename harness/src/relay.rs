//! The `outbox-relay` binary: its configuration, `run` processes and one-shot CLI commands.

use std::path::{Path, PathBuf};

use outboxkit_core::testkit::relay_process;

use crate::broker::BrokerSide;
use crate::store::StoreSide;

/// The `outbox-relay` binary: `OUTBOX_TEST_RELAY_BIN`, or `target/debug/outbox-relay`, which a
/// test build of the workspace builds (for relay-bin's integration tests), as does `cargo build
/// -p outboxkit-relay`.
pub fn relay_binary() -> PathBuf {
    if let Ok(path) = std::env::var("OUTBOX_TEST_RELAY_BIN") {
        return PathBuf::from(path);
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = target.join("debug").join("outbox-relay");
    assert!(
        path.exists(),
        "{} does not exist: build it first with `cargo build -p outboxkit-relay` (a test build of \
         the whole workspace builds it too), or point OUTBOX_TEST_RELAY_BIN at it",
        path.display()
    );
    path
}

/// What a test sets beyond the common relay configuration.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `[server] listen` (empty: no HTTP server).
    pub listen: String,
    /// Lines added to `[store]`.
    pub store: String,
    /// Lines added to `[relay]`.
    pub relay: String,
    /// Lines added to the sink's own table (`[sink.kafka]`, `[sink.sqs]`...).
    pub sink: String,
}

impl Settings {
    /// Serve `/metrics`, `/healthz` and `/readyz` on 127.0.0.1:`port`.
    pub fn listen_on(mut self, port: u16) -> Self {
        self.listen = format!("127.0.0.1:{port}");
        self
    }

    /// Add lines to `[store]`.
    pub fn store(mut self, lines: &str) -> Self {
        self.store = lines.to_owned();
        self
    }

    /// Add lines to `[relay]`.
    pub fn relay(mut self, lines: &str) -> Self {
        self.relay = lines.to_owned();
        self
    }

    /// Add lines to the sink's own table.
    pub fn sink(mut self, lines: &str) -> Self {
        self.sink = lines.to_owned();
        self
    }
}

/// The `[relay]` keys of the tests' relays: small batches, short intervals and backoffs.
const TEST_RELAY: &str = r#"batch_size = 200
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "2s"
shutdown_grace = "10s""#;

/// The configuration file of a relay between `store` and `broker`: 32 shards, small batches and
/// short intervals, so a test's few thousand events spread over every shard and relay.
pub fn relay_config(store: &dyn StoreSide, broker: &dyn BrokerSide, settings: &Settings) -> String {
    format!(
        r#"
{store}shards = 32
{store_extra}

[relay]
{common}
{relay}

{sink}{sink_extra}

[server]
listen = "{listen}"
"#,
        store = store.store_toml(),
        store_extra = settings.store,
        common = TEST_RELAY,
        relay = settings.relay,
        sink = broker.sink_toml(),
        sink_extra = settings.sink,
        listen = settings.listen,
    )
}

/// One configuration file for several pipelines: `[pipelines.<name>]` with each scenario's store
/// and sink tables (as [`relay_config`] writes them for one pipeline, plus lines for the sink's
/// own table), the common `[relay]` settings shared by all, and `[server] listen`.
pub fn pipelines_config(pipelines: &[(&str, &crate::Scenario, &str)], listen: &str) -> String {
    let mut toml = String::new();
    for (name, scenario, sink_lines) in pipelines {
        let rename = |table: &str, text: String| -> String {
            text.lines()
                .map(|line| match line.strip_prefix(&format!("[{table}")) {
                    Some(rest) => format!("[pipelines.{name}.{table}{rest}\n"),
                    None => format!("{line}\n"),
                })
                .collect()
        };
        toml.push_str(&rename("store", scenario.store.store_toml()));
        toml.push_str("shards = 32\n\n");
        toml.push_str(&rename("sink", scenario.broker.sink_toml()));
        toml.push_str(sink_lines);
        toml.push_str("\n\n");
    }
    format!(
        r#"{toml}
[relay]
{TEST_RELAY}
status_interval = "200ms"

[server]
listen = "{listen}"
"#
    )
}

/// A relay process (`outbox-relay --config <config> run`) with relay id `name`, logging to
/// `dir/<name>.log`: the testkit's [`relay_process::RelayProcess`] of `outboxkit-core` (SIGTERM,
/// SIGKILL and start again, its log; killed when dropped if still running), whose methods it
/// offers, started the harness's way.
#[derive(Debug)]
pub struct RelayProcess {
    process: relay_process::RelayProcess,
}

impl RelayProcess {
    /// Start it with relay id `name`, logging to `dir/<name>.log`, with extra environment.
    pub fn start(config: &Path, dir: &Path, name: &str, env: &[(String, String)]) -> Self {
        Self::start_binary(&relay_binary(), config, dir, name, env)
    }

    /// [`Self::start`] with the relay binary `binary` (`env` may set `RUST_LOG`: it comes after
    /// the harness's `RUST_LOG=info`).
    pub fn start_binary(
        binary: &Path,
        config: &Path,
        dir: &Path,
        name: &str,
        env: &[(String, String)],
    ) -> Self {
        Self::start_command(binary, config, dir, name, &["run"], env)
    }

    /// [`Self::start_binary`] of the command `args` (`run --wait`, say).
    pub fn start_command(
        binary: &Path,
        config: &Path,
        dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let mut all = vec![("OUTBOX_RELAY__RELAY_ID".to_owned(), name.to_owned())];
        all.extend_from_slice(env);
        let log = dir.join(format!("{name}.log"));
        Self {
            process: relay_process::RelayProcess::start_command(
                name, binary, config, args, all, log,
            ),
        }
    }

    /// SIGKILL it, and start it again 700 ms later.
    pub async fn sigkill_and_restart(&mut self) {
        self.kill_hard();
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
        self.respawn();
    }
}

impl std::ops::Deref for RelayProcess {
    type Target = relay_process::RelayProcess;

    fn deref(&self) -> &Self::Target {
        &self.process
    }
}

impl std::ops::DerefMut for RelayProcess {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.process
    }
}

/// Run `outbox-relay --config FILE <args>` to completion; (success, stdout, stderr).
pub fn run_cli(config: &Path, args: &[&str], env: &[(String, String)]) -> (bool, String, String) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let binary = relay_binary();
    let (status, out, err) = relay_process::run_cli(&binary.to_string_lossy(), config, args, &env);
    (status.success(), out, err)
}
