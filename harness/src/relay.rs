//! The `outbox-relay` binary: its configuration, `run` processes and one-shot CLI commands.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::broker::BrokerSide;
use crate::store::StoreSide;
use crate::util::signal_pid;

/// The `outbox-relay` binary: `OUTBOX_TEST_RELAY_BIN`, or the one `cargo build -p
/// outboxkit-relay` built.
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
        "{} does not exist: build it first with `cargo build -p outboxkit-relay` (scripts/test.sh does), \
         or point OUTBOX_TEST_RELAY_BIN at it",
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

/// A relay process (`outbox-relay --config <config> run`); killed (SIGKILL) when dropped if
/// still running.
#[derive(Debug)]
pub struct RelayProcess {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    binary: PathBuf,
    config: PathBuf,
    env: Vec<(String, String)>,
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
        let log = dir.join(format!("{name}.log"));
        let child = Self::spawn(binary, config, &log, name, env);
        Self {
            name: name.to_owned(),
            child,
            log,
            binary: binary.to_owned(),
            config: config.to_owned(),
            env: env.to_vec(),
        }
    }

    fn spawn(
        binary: &Path,
        config: &Path,
        log: &Path,
        name: &str,
        env: &[(String, String)],
    ) -> Child {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("opening the relay log");
        let err = out.try_clone().expect("cloning the log handle");
        Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("OUTBOX_RELAY__RELAY_ID", name)
            .env("RUST_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
    }

    /// Start it again as it was started (same name, configuration, environment and log), once
    /// it exited (after [`Self::kill_hard`]).
    pub fn respawn(&mut self) {
        assert!(!self.is_running(), "{} is still running", self.name);
        self.child = Self::spawn(&self.binary, &self.config, &self.log, &self.name, &self.env);
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for the exit status (bounded: SIGKILL and fail after `timeout`).
    pub fn terminate(&mut self, timeout: Duration) -> std::process::ExitStatus {
        signal_pid(self.child.id(), "TERM");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("waiting for the relay") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "{} did not exit within {timeout:?} of SIGTERM; log:\n{}",
                    self.name,
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and require a clean exit.
    pub fn stop(&mut self, timeout: Duration) {
        let exit = self.terminate(timeout);
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            self.name,
            self.log_text()
        );
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.kill_hard();
        }
    }
}

/// Run `outbox-relay --config FILE <args>` to completion; (success, stdout, stderr).
pub fn run_cli(config: &Path, args: &[&str], env: &[(String, String)]) -> (bool, String, String) {
    let out = Command::new(relay_binary())
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("running outbox-relay");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
