//! A custom relay binary under test — your `main` calling `outboxkit_relay::main` with your
//! registry — run as an operator runs it: [`run_cli`] for the subcommands that run to completion
//! (`migrate`, `--version`, a `run` refused at start), [`RelayProcess`] for `run` in the
//! background, its output in a log file, stopped with SIGTERM. Unix only (`kill -TERM`).
//! [`postgres_relay_toml`] writes a configuration for it, in a [`scratch_dir`] of its own.
//!
//! ```text
//! let binary = env!("CARGO_BIN_EXE_outbox-webhook-relay");
//! let (status, _, stderr) = run_cli(binary, &config, &["migrate"], &[]);
//! assert!(status.success(), "{stderr}");
//! let mut relay = RelayProcess::start(binary, &config, &[], dir.join("relay.log"));
//! // ... write events, read them back ...
//! assert!(relay.terminate(Duration::from_secs(20)).success(), "{}", relay.log_text());
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::plugin::sink_section;

/// The PostgreSQL of an end-to-end test: `OUTBOX_TEST_POSTGRES_URL`, default the local test
/// server `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// A fresh name for a test's table or topics: `prefix`, `_` and 10 hex digits.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

/// The scratch directory `name` of the tests of `binary` (created):
/// `<temp dir>/<binary's file name>-tests/<name>`.
pub fn scratch_dir(binary: &str, name: &str) -> PathBuf {
    let file_name = Path::new(binary).file_name().unwrap_or_default();
    let dir = std::env::temp_dir()
        .join(format!("{}-tests", file_name.to_string_lossy()))
        .join(name);
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}

/// The text of a `relay.toml` for an end-to-end run: the `postgres` store of [`postgres_url`]
/// relaying `table` over `shards` shards; a relay that rebalances, polls and backs off fast
/// (batches of 100, 10 s of shutdown grace); `[sink]` of kind `sink_kind`, with `sink_settings`
/// as the body of its section (`[sink.mqtt]`); and no HTTP server.
pub fn postgres_relay_toml(
    table: &str,
    shards: u32,
    sink_kind: &str,
    sink_settings: &str,
) -> String {
    format!(
        r#"
[store]
kind = "postgres"
url = "{pg}"
table = "{table}"
shards = {shards}

[relay]
batch_size = 100
rebalance_interval = "200ms"
poll_interval_max = "50ms"
backoff_initial = "100ms"
backoff_max = "1s"
shutdown_grace = "10s"

[sink]
kind = "{sink_kind}"

[sink.{section}]
{sink_settings}

[server]
listen = ""
"#,
        pg = postgres_url(),
        section = sink_section(sink_kind),
    )
}

/// `binary --config <config> <args>` to completion, with `env` added to its environment: its
/// exit status, stdout and stderr.
pub fn run_cli(
    binary: &str,
    config: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (ExitStatus, String, String) {
    let out = Command::new(binary)
        .arg("--config")
        .arg(config)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {binary}: {e}"));
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running `binary --config <config> run`; SIGKILLed when dropped if still running.
#[derive(Debug)]
pub struct RelayProcess {
    child: Child,
    log: PathBuf,
}

impl RelayProcess {
    /// Start `binary --config <config> run` with `RUST_LOG=info` and `env` added to its
    /// environment, stdout and stderr written to the file `log`.
    pub fn start(binary: &str, config: &Path, env: &[(&str, &str)], log: PathBuf) -> Self {
        let out = std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating the relay log {}: {e}", log.display()));
        let err = out.try_clone().expect("cloning the log handle");
        let child = Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("run")
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary}: {e}"));
        Self { child, log }
    }

    /// What it has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waiting for the relay")
    }

    /// SIGTERM, then its exit status; fails the test, with the log, unless it exits within
    /// `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        let sent = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("running kill");
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the relay did not exit within {timeout:?} of SIGTERM; log:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_scratch_directories_are_the_tests_own() {
        let name = unique("e2e");
        assert!(name.starts_with("e2e_") && name.len() == 14, "{name}");
        assert_ne!(unique("e2e"), name);
        let dir = scratch_dir("/build/target/debug/outbox-my-relay", &name);
        assert!(dir.is_dir());
        assert!(dir.ends_with(format!("outbox-my-relay-tests/{name}")));
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn the_relay_toml_has_the_store_the_sink_and_no_server() {
        let text = postgres_relay_toml("orders_outbox", 8, "redis-streams", "url = \"redis://r\"");
        let expected = format!(
            "[store]\nkind = \"postgres\"\nurl = \"{}\"\ntable = \"orders_outbox\"\nshards = 8\n",
            postgres_url()
        );
        assert!(text.contains(&expected), "{text}");
        assert!(
            text.contains(
                "[sink]\nkind = \"redis-streams\"\n\n[sink.redis_streams]\nurl = \"redis://r\"\n"
            ),
            "{text}"
        );
        assert!(text.contains("[server]\nlisten = \"\"\n"), "{text}");
    }
}
