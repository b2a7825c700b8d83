//! A private, TLS-only Redis server of one test: its own scratch directory and port, no plain
//! TCP port at all (`--port 0`), optionally a client certificate required.
//!
//! The server is a child of the test process, started through `setpriv --pdeathsig KILL` so that
//! it dies with the thread that started it even when the test process ends without dropping
//! it; it is stopped by its own pid on drop (never any other Redis, such as the machine's shared
//! one on 6379).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::process::OwnProcess;
use crate::tls::{Leaf, TestPki};
use crate::util::{free_port, scratch_dir};
use crate::RedisSide;

/// See the module's documentation. Killed and its directory deleted on drop.
#[derive(Debug)]
pub struct PrivateRedis {
    process: OwnProcess,
    port: u16,
    pki: TestPki,
}

fn redis_server() -> PathBuf {
    for dir in ["/usr/local/bin", "/usr/bin"] {
        let path = Path::new(dir).join("redis-server");
        if path.exists() {
            return path;
        }
    }
    panic!(
        "redis-server is required for this test and was not found: install redis-server \
         (scripts/services.sh does)"
    )
}

impl PrivateRedis {
    /// A new server under the scratch directory `name`, serving `pki`'s server certificate on
    /// a free port of 127.0.0.1, trusting `pki`'s CA for client certificates, which it
    /// requires when `client_cert_required`. Ready (listening) when this returns.
    pub fn start(name: &str, pki: &TestPki, client_cert_required: bool) -> Self {
        let dir = scratch_dir(name).join("redis");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let log = dir.join("redis.log");
        // setpriv execs redis-server: the child's pid is the server's.
        let mut process = OwnProcess::spawn(
            Command::new("setpriv")
                .args(["--pdeathsig", "KILL", "--"])
                .arg(redis_server())
                .args(["--port", "0", "--bind", "127.0.0.1"])
                .args(["--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&pki.server.cert)
                .arg("--tls-key-file")
                .arg(&pki.server.key)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca)
                .args([
                    "--tls-auth-clients",
                    if client_cert_required { "yes" } else { "no" },
                ])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            "the private redis-server",
        )
        .logging_to(log)
        .owning(dir);
        process.wait_listening(port, Duration::from_secs(20));
        Self {
            process,
            port,
            pki: pki.clone(),
        }
    }

    /// The TLS port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `rediss://127.0.0.1:<port>` (a name the good server certificate holds).
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:<port>`: plain TCP to the TLS port, which must fail.
    pub fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The test PKI the server was started with.
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }

    /// A side reading streams `<prefix>.<aggregate_type>` over TLS, trusting the test CA and
    /// presenting the client certificate (accepted whether or not it is required).
    pub async fn side(&self, prefix: &str) -> RedisSide {
        let client = &self.pki.client;
        RedisSide::open_tls(
            &self.url(),
            prefix,
            &self.pki.ca,
            Some((&client.cert, &client.key)),
        )
        .await
    }

    /// Serve `leaf` from now on (`CONFIG SET tls-cert-file / tls-key-file` over TLS): new
    /// connections get it, a certificate rotation without a restart.
    pub async fn serve(&self, leaf: &Leaf) {
        let side = self.side("admin").await;
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("tls-cert-file")
            .arg(leaf.cert.to_str().expect("UTF-8 path"))
            .arg("tls-key-file")
            .arg(leaf.key.to_str().expect("UTF-8 path"))
            .query_async(&mut side.connection())
            .await
            .unwrap_or_else(|e| panic!("CONFIG SET tls-cert-file on the private Redis: {e}"));
    }

    /// The server's log (for failure messages).
    pub fn log(&self) -> String {
        self.process.log()
    }
}
