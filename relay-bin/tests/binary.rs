//! The real `outbox-relay` binary, run as a process with a configuration file of the test's.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

/// A configuration file under the temp directory, removed on drop.
pub struct TempConfig(PathBuf);

impl TempConfig {
    pub fn new(contents: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "outbox-relay-config-errors-{}-{}.toml",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::write(&path, contents).expect("write the temp config");
        Self(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn display(&self) -> String {
        self.0.display().to_string()
    }

    /// How an error names this file: `(in PATH)`.
    pub fn named(&self) -> String {
        format!("(in {})", self.display())
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Run the binary with `args` and only the `env` given among `OUTBOX_*` and `RUST_LOG`; kill it
/// after 30 s (a configuration that was wrongly accepted would otherwise relay forever).
pub fn relay(args: &[&str], env: &[(&str, &str)]) -> Outcome {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, _) in std::env::vars_os() {
        let name = key.to_string_lossy().to_ascii_uppercase();
        if name.starts_with("OUTBOX_") || name == "RUST_LOG" {
            command.env_remove(&key);
        }
    }
    command.envs(env.iter().copied());
    let mut child = command.spawn().expect("start outbox-relay");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for outbox-relay") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("outbox-relay {args:?} still running after 30s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    if let Some(mut out) = child.stdout.take() {
        out.read_to_string(&mut stdout).expect("read stdout");
    }
    if let Some(mut err) = child.stderr.take() {
        err.read_to_string(&mut stderr).expect("read stderr");
    }
    Outcome {
        code: status.code(),
        stdout,
        stderr,
    }
}

/// `outbox-relay --config FILE <command>`.
pub fn with_config(config: &TempConfig, command: &str, env: &[(&str, &str)]) -> Outcome {
    let path = config.path().to_str().expect("temp path is UTF-8");
    relay(&["--config", path, command], env)
}
