//! A server process a test started itself (a private broker), and the freeze it offers as a
//! [`Fault`].
//!
//! Every signal goes to the process's own pid — or, for a server started in a group of its own,
//! to that group — through the guards of [`signal_pid`] and [`signal_group`], never to a
//! shared service of the machine. Dropping it always thaws and kills it (and removes its
//! directory when it owns one), so a failing test never leaves a frozen server behind.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::scenario::Fault;
use crate::util::{signal_group, signal_pid};

/// See the module's documentation.
#[derive(Debug)]
pub struct OwnProcess {
    child: Child,
    /// The server in messages: "the test's nats-server".
    what: String,
    /// Started in a process group of its own (`process_group(0)`), killed as a group.
    group: bool,
    /// Its log, for failure messages.
    log: Option<PathBuf>,
    /// A directory of its own, removed on drop.
    dir: Option<PathBuf>,
}

impl OwnProcess {
    /// Start `command` (its arguments and standard streams set by the caller); `what` names the
    /// server in messages.
    pub fn spawn(command: &mut Command, what: &str) -> Self {
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        Self {
            child,
            what: what.to_owned(),
            group: false,
            log: None,
            dir: None,
        }
    }

    /// [`Self::spawn`] in a process group of its own, so that its children die with it.
    pub fn spawn_group(command: &mut Command, what: &str) -> Self {
        use std::os::unix::process::CommandExt;
        let mut process = Self::spawn(command.process_group(0), what);
        process.group = true;
        process
    }

    /// Its log file, which failure messages quote.
    pub fn logging_to(mut self, log: PathBuf) -> Self {
        self.log = Some(log);
        self
    }

    /// A directory that is the server's own, removed when it is dropped.
    pub fn owning(mut self, dir: PathBuf) -> Self {
        self.dir = Some(dir);
        self
    }

    /// Its log (empty when it has none or it cannot be read).
    pub fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|log| std::fs::read_to_string(log).ok())
            .unwrap_or_default()
    }

    /// Wait until it listens on `port` of 127.0.0.1; panics, quoting its log, when it exits
    /// first or does not listen within `timeout`.
    pub fn wait_listening(&mut self, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                panic!("{} exited ({status}) at start: {}", self.what, self.log());
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{} does not listen on port {port} after {}s: {}",
                self.what,
                timeout.as_secs(),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its exit status, once it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGSTOP: it keeps its connections and data but answers nothing — what a hung or
    /// unreachable server looks like to the relay.
    pub fn freeze(&self) {
        assert!(
            signal_pid(self.child.id(), "STOP"),
            "SIGSTOP of {} failed",
            self.what
        );
    }

    /// SIGCONT: it answers again.
    pub fn thaw(&self) {
        assert!(
            signal_pid(self.child.id(), "CONT"),
            "SIGCONT of {} failed",
            self.what
        );
    }
}

impl Drop for OwnProcess {
    fn drop(&mut self) {
        // Only while it has not been reaped is its pid surely still ours.
        let running = matches!(self.child.try_wait(), Ok(None));
        if running {
            signal_pid(self.child.id(), "CONT");
        }
        if self.group {
            signal_group(self.child.id(), "KILL");
        } else if running {
            signal_pid(self.child.id(), "KILL");
        }
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A private server of a test's own, in an [`OwnProcess`]: its [`Fault`] is a freeze
/// (SIGSTOP) for the fault's hold, then a thaw.
pub trait OwnServer: Send + Sync + std::fmt::Debug {
    /// Its process.
    fn process(&self) -> &OwnProcess;

    /// See [`OwnProcess::freeze`].
    fn freeze(&self) {
        self.process().freeze();
    }

    /// See [`OwnProcess::thaw`].
    fn thaw(&self) {
        self.process().thaw();
    }
}

#[async_trait]
impl<T: OwnServer> Fault for T {
    fn describe(&self) -> String {
        format!("{} frozen (SIGSTOP) and thawed", self.process().what)
    }

    async fn begin(&self) {
        self.freeze();
    }

    async fn end(&self) {
        self.thaw();
    }
}
