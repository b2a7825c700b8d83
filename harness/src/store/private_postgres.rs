//! A private, TLS-only PostgreSQL server of one test: its own data directory and port, plain
//! TCP connections refused by `pg_hba.conf`, optionally a client certificate required.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::tls::TestPki;
use crate::util::running_as_root;
use crate::util::{free_port, scratch_dir};

/// `pg_ctl` arguments of a crash: no checkpoint, the next start recovers from the log.
const IMMEDIATE_STOP: &[&str] = &["-m", "immediate", "-w", "stop"];

/// What the server asks of clients besides TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// TLS only; any client may log in as `postgres` (trust).
    TlsOnly,
    /// TLS and a client certificate signed by the test CA whose common name is the user
    /// (`clientcert=verify-full`); the user is [`crate::tls::CLIENT_NAME`].
    VerifyFull,
    /// TLS and a password (`scram-sha-256`); see [`PrivatePostgres::set_password`].
    Password,
}

/// See the module's documentation. Stopped (immediate shutdown) and deleted on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
}

fn tool(name: &str) -> PathBuf {
    let versions = std::fs::read_dir("/usr/lib/postgresql")
        .map(|dirs| {
            let mut v: Vec<PathBuf> = dirs.flatten().map(|d| d.path()).collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    for dir in versions.iter().rev() {
        let path = dir.join("bin").join(name);
        if path.exists() {
            return path;
        }
    }
    for dir in ["/usr/local/bin", "/usr/bin", "/usr/sbin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!("{name} is required for this test and was not found: scripts/services.sh installs it")
}

/// A PostgreSQL tool, run as the `postgres` user when we are root (the server refuses root).
fn command(name: &str) -> Command {
    if running_as_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(tool(name));
        c
    } else {
        Command::new(tool(name))
    }
}

fn run(name: &str, args: &[&str]) {
    let out = command(name)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"));
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn give_to_postgres(path: &Path) {
    if running_as_root() {
        let status = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "chown {}", path.display());
    }
}

/// `postgresql.conf` lines of a cluster for log-based capture, then `extra`.
fn logical_conf(extra: &str) -> String {
    format!(
        "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n\
         track_commit_timestamp = on\nwal_sender_timeout = 60s\n{extra}"
    )
}

/// `pg_hba.conf` of a cluster for log-based capture: trust on loopback, replication too.
const LOGICAL_HBA: &str =
    "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n";

impl PrivatePostgres {
    /// A new cluster under the scratch directory `name`, serving `pki`'s server certificate,
    /// started, with database `test` (and user [`crate::tls::CLIENT_NAME`]).
    pub fn start(name: &str, pki: &TestPki, auth: ClientAuth) -> Self {
        let tls_rule = match auth {
            ClientAuth::TlsOnly => "hostssl all all 127.0.0.1/32 trust",
            ClientAuth::VerifyFull => "hostssl all all 127.0.0.1/32 trust clientcert=verify-full",
            ClientAuth::Password => "hostssl all all 127.0.0.1/32 scram-sha-256",
        };
        let server = Self::init(
            name,
            "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
             ssl_ca_file = 'root.crt'\n",
            &format!("local all all trust\n{tls_rule}\nhostnossl all all 0.0.0.0/0 reject\n"),
            |data| {
                std::fs::copy(&pki.server.cert, data.join("server.crt")).unwrap();
                std::fs::copy(&pki.server.key, data.join("server.key")).unwrap();
                std::fs::copy(&pki.ca, data.join("root.crt")).unwrap();
            },
        );
        server.psql(&format!(
            "CREATE ROLE {} LOGIN SUPERUSER",
            crate::tls::CLIENT_NAME
        ));
        server
    }

    /// A new cluster under the scratch directory `name` for log-based capture: plain TCP with
    /// trust (replication connections too), `wal_level = logical`, room for slots, and
    /// `track_commit_timestamp`; started, with database `test`.
    pub fn start_logical(name: &str) -> Self {
        Self::start_logical_tuned(name, "")
    }

    /// [`Self::start_logical`] with more `postgresql.conf` lines (later lines win: `fsync = on`
    /// for a benchmark).
    pub fn start_logical_tuned(name: &str, conf: &str) -> Self {
        Self::init(name, &logical_conf(conf), LOGICAL_HBA, |_| {})
    }

    /// [`Self::start_logical`], listening on `address` too, as [`Self::start_reachable_at`].
    pub fn start_logical_reachable_at(name: &str, address: std::net::Ipv4Addr) -> Self {
        let conf = format!("listen_addresses = '127.0.0.1, {address}'\n");
        let hba = format!(
            "{LOGICAL_HBA}host all all samenet trust\nhost replication all samenet trust\n"
        );
        Self::init(name, &logical_conf(&conf), &hba, |_| {})
    }

    /// A new cluster under the scratch directory `name`: plain TCP with trust, listening on
    /// 127.0.0.1 and on `address` too (a [`crate::Link`]'s machine end, for a relay on a
    /// [`crate::NetworkHost`]; [`Self::url_at`]); started, with database `test`.
    pub fn start_reachable_at(name: &str, address: std::net::Ipv4Addr) -> Self {
        Self::init(
            name,
            &format!("listen_addresses = '127.0.0.1, {address}'\n"),
            "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all samenet trust\n",
            |_| {},
        )
    }

    fn init(name: &str, conf_extra: &str, hba: &str, files: impl FnOnce(&Path)) -> Self {
        let dir = scratch_dir(name).join("postgres");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        give_to_postgres(&dir);
        let data = dir.join("data");
        let data_arg = data.to_str().unwrap();
        run(
            "initdb",
            &[
                "-D",
                data_arg,
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        let port = free_port();
        files(&data);
        let mut conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        conf.push_str(&format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nshared_buffers = 32MB\nmax_connections = 100\n{conf_extra}",
            dir.display()
        ));
        std::fs::write(data.join("postgresql.conf"), conf).unwrap();
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        give_to_postgres(&dir);
        let server = Self { dir, port };
        server.start_again();
        server.psql("CREATE DATABASE test");
        server
    }

    /// Start the (stopped) server and wait until it accepts connections.
    pub fn start_again(&self) {
        let log = self.dir.join("server.log");
        self.pg_ctl(&["-l", log.to_str().unwrap(), "-w", "-t", "60", "start"]);
    }

    /// Crash the server: `pg_ctl -m immediate stop` (no checkpoint; the next start recovers
    /// from the log).
    pub fn crash(&self) {
        self.pg_ctl(IMMEDIATE_STOP);
    }

    /// `pg_ctl -D <data> <args>`; fails the test when it fails.
    fn pg_ctl(&self, args: &[&str]) {
        let data = self.dir.join("data");
        let mut all = vec!["-D", data.to_str().unwrap()];
        all.extend_from_slice(args);
        run("pg_ctl", &all);
    }

    /// Run `sql` as `postgres` over the local socket.
    pub fn psql(&self, sql: &str) {
        let port = self.port.to_string();
        run(
            "psql",
            &[
                "-h",
                self.dir.to_str().unwrap(),
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
        );
    }

    /// Give `user` this password (for [`ClientAuth::Password`]).
    pub fn set_password(&self, user: &str, password: &str) {
        self.psql(&format!("ALTER ROLE \"{user}\" PASSWORD '{password}'"));
    }

    /// The postmaster's process id, while the server runs.
    pub fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("data").join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    /// The TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://user@127.0.0.1:port/test?<query>` (no `?` when `query` is empty).
    pub fn url(&self, user: &str, query: &str) -> String {
        let sep = if query.is_empty() { "" } else { "?" };
        format!("postgres://{user}@127.0.0.1:{}/test{sep}{query}", self.port)
    }

    /// `postgres://postgres@<address>:port/test`: [`Self::start_reachable_at`]'s other address.
    pub fn url_at(&self, address: std::net::Ipv4Addr) -> String {
        format!("postgres://postgres@{address}:{}/test", self.port)
    }

    /// `postgres:///test?host=<socket dir>&port=<port>&user=<user>`: through its Unix socket.
    pub fn socket_url(&self, user: &str) -> String {
        format!(
            "postgres:///test?host={}&port={}&user={user}",
            self.dir.display(),
            self.port
        )
    }

    /// Serve `cert`/`key` from now on (copied over the server's files, then `pg_ctl reload`):
    /// a certificate rotation without a restart.
    pub fn serve(&self, cert: &Path, key: &Path) {
        let data = self.dir.join("data");
        std::fs::copy(cert, data.join("server.crt")).unwrap();
        std::fs::copy(key, data.join("server.key")).unwrap();
        give_to_postgres(&data);
        run("pg_ctl", &["-D", data.to_str().unwrap(), "reload"]);
        // The postmaster reads the files on SIGHUP; new connections use them.
        std::thread::sleep(std::time::Duration::from_millis(500));
    }

    /// The server's log (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let data = self.dir.join("data");
        let _ = command("pg_ctl")
            .args(["-D", data.to_str().unwrap()])
            .args(IMMEDIATE_STOP)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A PgBouncer of the test's own in front of the test server's database `test` (trust
/// authentication), in `pool_mode`, with `ignore_startup_parameters = <ignore>` (nothing when
/// empty); killed and deleted on drop. In transaction or statement mode its pool has one server
/// connection, which every client shares; in session mode, 20.
#[derive(Debug)]
pub struct PrivatePgBouncer {
    child: std::process::Child,
    dir: PathBuf,
    port: u16,
}

impl PrivatePgBouncer {
    /// Start it under the scratch directory `name` and wait until it accepts connections.
    pub fn start(name: &str, pool_mode: &str, ignore: &str) -> Self {
        use std::os::unix::process::CommandExt;
        let dir = scratch_dir(name).join(format!("pgbouncer-{pool_mode}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let server = crate::postgres_url();
        let server: sqlx::postgres::PgConnectOptions = server.parse().unwrap();
        let port = free_port();
        let pool_size = if pool_mode == "session" { 20 } else { 1 };
        let ignore = match ignore {
            "" => String::new(),
            list => format!("ignore_startup_parameters = {list}\n"),
        };
        let ini = format!(
            "[databases]\ntest = host={} port={} dbname=test\n[pgbouncer]\nlisten_addr = \
             127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\nauth_type = trust\nauth_file = \
             {}\npool_mode = {pool_mode}\ndefault_pool_size = {pool_size}\n{ignore}",
            server.get_host(),
            server.get_port(),
            dir.join("users.txt").display()
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        give_to_postgres(&dir);
        let mut command = Command::new(tool("pgbouncer"));
        command
            .arg(dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("pgbouncer.log")).unwrap());
        // It refuses to run as root.
        if running_as_root() {
            let id = |flag: &str| -> u32 {
                let out = Command::new("id")
                    .args([flag, "postgres"])
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            command.uid(id("-u")).gid(id("-g"));
        }
        let child = command
            .spawn()
            .expect("starting pgbouncer (scripts/services.sh installs it)");
        let bouncer = Self { child, dir, port };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "pgbouncer did not listen on {port}: {}",
                std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        bouncer
    }

    /// `postgres://postgres@127.0.0.1:<port>/test`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for PrivatePgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
