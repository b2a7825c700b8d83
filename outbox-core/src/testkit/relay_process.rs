//! A custom relay binary under test — your `main` calling `outboxkit_relay::main` with your
//! registry — run as an operator runs it: [`run_cli`] for the subcommands that run to completion
//! (`migrate`, `--version`, a `run` refused at start), [`RelayProcess`] for `run` in the
//! background, its output in a log file, stopped with SIGTERM (or killed with SIGKILL and
//! started again). Unix only (`kill`, through the guard of [`signal_pid`]).
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

/// Send `signal` (`TERM`, `KILL`, `STOP`, `CONT`...) to the process `pid` with kill(1);
/// whether it was sent. Never to pid 0 or 1 (`kill -- 0` is the caller's own group, 1 is init):
/// the test fails instead — the guard every signal of the test tools goes through.
pub fn signal_pid(pid: u32, signal: &str) -> bool {
    assert!(pid > 1, "refusing to signal process {pid}");
    Command::new("kill")
        .args(["-s", signal, "--"])
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}

/// A running `binary --config <config> run`; SIGKILLed when dropped if still running.
#[derive(Debug)]
pub struct RelayProcess {
    child: Child,
    log: PathBuf,
    /// The process in failure messages: "the relay", or the name it was started with.
    name: String,
    /// How it was started, to start it again ([`Self::respawn`]).
    binary: PathBuf,
    config: PathBuf,
    /// The command and its flags after `--config <config>`: `run` unless started otherwise.
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl RelayProcess {
    /// Start `binary --config <config> run` with `RUST_LOG=info` and `env` added to its
    /// environment, stdout and stderr written to the file `log`.
    pub fn start(binary: &str, config: &Path, env: &[(&str, &str)], log: PathBuf) -> Self {
        std::fs::File::create(&log)
            .unwrap_or_else(|e| panic!("creating the relay log {}: {e}", log.display()));
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Self::start_appending("the relay", Path::new(binary), config, env, log)
    }

    /// [`Self::start`] as `name` in failure messages ("relay-0 did not exit..."), its output
    /// appended to `log` after what an earlier process left there.
    pub fn start_appending(
        name: &str,
        binary: &Path,
        config: &Path,
        env: Vec<(String, String)>,
        log: PathBuf,
    ) -> Self {
        Self::start_command(name, binary, config, &["run"], env, log)
    }

    /// [`Self::start_appending`] of `binary --config <config> <args>` (`run --wait`, say).
    pub fn start_command(
        name: &str,
        binary: &Path,
        config: &Path,
        args: &[&str],
        env: Vec<(String, String)>,
        log: PathBuf,
    ) -> Self {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let child = spawn(binary, config, &args, &env, &log);
        Self {
            child,
            log,
            name: name.to_owned(),
            binary: binary.to_owned(),
            config: config.to_owned(),
            args,
            env,
        }
    }

    /// Start it again as it was started (same binary, configuration, environment and log), once
    /// it exited (after [`Self::kill_hard`]).
    pub fn respawn(&mut self) {
        assert!(!self.is_running(), "{} is still running", self.name);
        self.child = spawn(&self.binary, &self.config, &self.args, &self.env, &self.log);
    }

    /// Its name in failure messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its process id (for reading `/proc/<pid>`).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// What it has written so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("waiting for the relay")
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGSTOP: it hangs with its connections up, as a paused VM or container would (SIGKILL
    /// when dropped still ends it).
    pub fn freeze(&mut self) {
        assert!(signal_pid(self.child.id(), "STOP"), "kill -STOP failed");
    }

    /// SIGCONT after [`Self::freeze`].
    pub fn thaw(&mut self) {
        assert!(signal_pid(self.child.id(), "CONT"), "kill -CONT failed");
    }

    /// SIGKILL: no chance to finish anything.
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then its exit status (at once when it has exited already); fails the test, with
    /// the log, unless it exits within `timeout` (SIGKILLed first).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal_and_wait("TERM", timeout)
    }

    /// [`Self::terminate`] with another `signal` (`HUP`, `INT`).
    pub fn signal_and_wait(&mut self, signal: &str, timeout: Duration) -> ExitStatus {
        if let Some(status) = self.exited() {
            return status;
        }
        assert!(signal_pid(self.child.id(), signal), "kill -{signal} failed");
        let still_running = format!(
            "{} did not exit within {timeout:?} of SIG{signal}",
            self.name
        );
        self.exit_within(timeout, &still_running)
    }

    /// Its exit status once it exits by itself (a relay that must fail at start); fails the
    /// test with `still_running` and the log unless it exits within `timeout` (SIGKILLed
    /// first).
    pub fn exit_within(&mut self, timeout: Duration, still_running: &str) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return status;
            }
            if Instant::now() > deadline {
                self.kill_hard();
                panic!("{still_running}; log:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM and require a clean exit (see [`Self::terminate`]).
    pub fn stop(&mut self, timeout: Duration) {
        let exit = self.terminate(timeout);
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            self.name,
            self.log_text()
        );
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if self.is_running() {
            self.kill_hard();
        }
    }
}

/// `binary --config <config> <args>` with `RUST_LOG=info` and `env`, its stdout and stderr
/// appended to `log`.
fn spawn(
    binary: &Path,
    config: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
) -> Child {
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("opening the relay log {}: {e}", log.display()));
    let err = out.try_clone().expect("cloning the log handle");
    Command::new(binary)
        .arg("--config")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "info")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()))
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
    #[should_panic(expected = "refusing to signal process 0")]
    fn the_callers_own_group_is_never_signalled() {
        signal_pid(0, "TERM");
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
