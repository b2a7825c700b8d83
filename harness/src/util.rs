//! Names, files, logs, waiting and the relay's HTTP endpoints.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A short random name part, so every test has its own tables, streams, topics and queues.
pub use outboxkit_core::testkit::relay_process::unique;

/// A scratch directory for config files and logs: `<temp dir>/outbox-relay-tests/<name>`
/// (created).
pub fn scratch_dir(name: &str) -> PathBuf {
    outboxkit_core::testkit::relay_process::scratch_dir("outbox-relay", name)
}

/// Write `text` to `dir/name` and return the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let mut f = std::fs::File::create(&path).expect("creating a test file");
    f.write_all(text.as_bytes()).expect("writing a test file");
    path
}

/// Scratch directory `name` with a `relay.toml` of one pipeline: the `[store]` keys `store`,
/// the sink's own section `sink` (a broker side's `sink_toml()`), idle polling at 50 ms and no
/// HTTP server. The directory and the file.
pub fn one_pipeline_config(name: &str, store: &str, sink: &str) -> (PathBuf, PathBuf) {
    let dir = scratch_dir(name);
    let text = format!(
        "[store]\n{store}\n{sink}\n[relay]\npoll_interval_max = \"50ms\"\n\n[server]\nlisten = \"\"\n"
    );
    let config = write_file(&dir, "relay.toml", &text);
    (dir, config)
}

/// For a fault the relays must ride out (a restart, a partition): `relay`'s `log` may warn, but
/// holds no ERROR line (what log alerts page on).
pub fn assert_no_error_lines(relay: &str, log: &str) {
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    assert!(errors.is_empty(), "{relay}: {errors:#?}");
}

/// `who` and the warning and error lines of its `log` (how many, then the last 10, without
/// terminal colours), for a failure message.
pub fn log_troubles(who: &str, log: &str) -> String {
    let troubles: Vec<String> = log
        .lines()
        .filter(|line| line.contains("WARN") || line.contains("ERROR"))
        .map(without_colours)
        .collect();
    format!(
        "{who} logged {} warnings and errors{}",
        troubles.len(),
        troubles[troubles.len().saturating_sub(10)..]
            .iter()
            .map(|line| format!("\n    {line}"))
            .collect::<String>()
    )
}

/// `line` without its ANSI escape sequences (`ESC [ ... letter`).
fn without_colours(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Poll `cond` until it holds or `timeout` passes (then fail the test).
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Wait until `/readyz` of the relay listening on `port` answers `code` (200: ready, 503: not).
pub async fn wait_for_ready(what: &str, port: u16, code: u16, timeout: Duration) {
    wait_for(what, timeout, || async move {
        matches!(http_get(port, "/readyz"), Some((c, _)) if c == code)
    })
    .await;
}

/// The value of metric `name` (see [`metric_value`]) on `/metrics` of the relay listening on
/// `port`, if it answers and has the metric.
pub fn metric_at(port: u16, name: &str) -> Option<f64> {
    http_get(port, "/metrics").and_then(|(_, body)| metric_value(&body, name))
}

/// Wait until metric `name` of the relay listening on `port` ([`metric_at`]) satisfies `cond`.
pub async fn wait_for_metric(
    what: &str,
    port: u16,
    name: &str,
    timeout: Duration,
    cond: impl Fn(f64) -> bool,
) {
    wait_for(what, timeout, || {
        let met = metric_at(port, name).is_some_and(&cond);
        async move { met }
    })
    .await;
}

/// The peak resident set (VmHWM) so far of the process `pid`, in MiB (0 when it cannot be
/// read).
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("finding a free port")
}

/// GET `path` from 127.0.0.1:`port` with a bare HTTP/1.1 request; (status code, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_at("127.0.0.1", port, path)
}

/// [`http_get`] from `address`:`port` (a relay on a [`crate::NetworkHost`]).
pub fn http_get_at(address: &str, port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::Read;
    let mut stream = std::net::TcpStream::connect((address, port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Some((code, body))
}

/// The value of an unlabelled Prometheus sample, or the sum of a labelled one's samples.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

/// The first line a command prints (its version), or "<cmd> (version unknown)".
#[cfg(any(
    feature = "redis-streams",
    feature = "kafka",
    feature = "rabbitmq",
    feature = "nats"
))]
pub(crate) fn first_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| format!("{cmd} (version unknown)"))
}

/// The guard every signal of the harness goes through: never pid 0 or 1.
#[cfg(any(
    test,
    feature = "kafka",
    feature = "nats",
    feature = "sqs",
    feature = "redis-streams"
))]
pub(crate) use outboxkit_core::testkit::relay_process::signal_pid;

#[cfg(any(
    feature = "kafka",
    feature = "nats",
    feature = "sqs",
    feature = "redis-streams"
))]
/// Send `signal` to the process group `pgid` of a server a test started itself in a group of
/// its own (`process_group(0)`: the group id is its pid), with the same guard. `--` before the
/// negative group id matters: without it procps kill(1) reads "-<pgid>" as an option and
/// signals pid -1, i.e. every process of the machine.
pub(crate) fn signal_group(pgid: u32, signal: &str) -> bool {
    assert!(pgid > 1, "refusing to signal process group {pgid}");
    std::process::Command::new("kill")
        .args(["-s", signal, "--"])
        .arg(format!("-{pgid}"))
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether this process runs as root (the database servers refuse root, or need to be told).
pub fn running_as_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_value_sums_labelled_samples_and_ignores_longer_names() {
        let text = "# HELP x\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3\nx_total_more 9\ny 1\n";
        assert_eq!(metric_value(text, "x_total"), Some(5.0));
        assert_eq!(metric_value(text, "y"), Some(1.0));
        assert_eq!(metric_value(text, "z"), None);
    }

    #[test]
    #[should_panic(expected = "refusing to signal process 1")]
    fn init_is_never_signalled() {
        signal_pid(1, "STOP");
    }
}
