//! A custom relay binary under test — your `main` calling `outboxkit_relay::main` with your
//! registry — run as an operator runs it: [`run_cli`] for the subcommands that run to completion
//! (`migrate`, `--version`, a `run` refused at start), [`RelayProcess`] for `run` in the
//! background, its output in a log file, stopped with SIGTERM. Unix only (`kill -TERM`).
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
