//! MySQL / MariaDB, and a private MariaDB server a test may crash and start again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::{NewEvent, PayloadType, Result};
use outboxkit_store_mysql::MySql;
use outboxkit_store_mysql::Outbox;
use outboxkit_store_sql::payload::PayloadColumn;
use sqlx::{Connection, Executor, MySqlConnection};
use uuid::Uuid;

use super::{SqlOutbox, SqlSide, StoreSide};
use crate::scenario::Fault;
use crate::util::running_as_root;
use crate::util::{free_port, scratch_dir};

/// MySQL / MariaDB for tests: `OUTBOX_TEST_MYSQL_URL`, default the machine's local MariaDB.
pub fn mysql_url() -> String {
    std::env::var("OUTBOX_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// The MySQL / MariaDB side: [`MySqlSide::open`] and the rest of [`SqlSide`].
pub type MySqlSide = SqlSide<Outbox>;

#[async_trait]
impl SqlOutbox for Outbox {
    type Store = outboxkit_store_mysql::MySql;
    type Db = sqlx::MySql;
    type EventId = String;
    const SERVER: &'static str = "MySQL";
    const NAME: &'static str = "MariaDB";
    const VERSION_SQL: &'static str = "SELECT CONCAT(@@version_comment, ' ', VERSION())";
    const TRUNCATE: &'static str = "TRUNCATE TABLE";
    const LATENCY_MICROS: &'static str =
        "CAST(TIMESTAMPDIFF(MICROSECOND, created_at, published_at) AS SIGNED)";
    const DEAD_COLUMNS: &'static str =
        "CAST(event_id AS CHAR), CAST(attempts AS SIGNED), CAST(last_error AS CHAR)";
    const PARAM: &'static str = "?";

    fn test_url() -> String {
        mysql_url()
    }

    fn on_table(table: &str) -> Self {
        Outbox::new(table).expect("a valid outbox table name")
    }

    fn event_id(event_id: Uuid) -> String {
        event_id.to_string()
    }

    fn uuid(event_id: String) -> Uuid {
        Uuid::parse_str(&event_id).expect("a UUID event_id")
    }

    async fn enqueue(&self, conn: &mut MySqlConnection, event: &NewEvent) -> Result<i64> {
        Outbox::enqueue(self, conn, event).await
    }

    async fn enqueue_many(
        &self,
        conn: &mut MySqlConnection,
        events: &[NewEvent],
    ) -> Result<Vec<i64>> {
        Outbox::enqueue_many(self, conn, events).await
    }

    async fn analyze(side: &MySqlSide) {
        side.exec(&format!("ANALYZE TABLE {}, {}", side.table, side.orders))
            .await;
    }

    /// At most 1,000,000 events (the generated sequence's size).
    async fn bulk_load(
        side: &MySqlSide,
        events: u64,
        aggregates: u64,
        pad: usize,
        payload_type: PayloadType,
    ) {
        assert!(
            events <= 1_000_000,
            "the MySQL side loads at most 1,000,000 events"
        );
        side.truncate().await;
        let column = MySql::column_type(payload_type);
        side.exec(&format!(
            "ALTER TABLE {} MODIFY payload {column} NOT NULL",
            side.table
        ))
        .await;
        let json =
            format!("JSON_OBJECT('n', n + 1, 'order_id', n MOD ?, 'pad', REPEAT('x', {pad}))");
        let payload = match payload_type {
            PayloadType::Json => json,
            PayloadType::Text => format!("CAST({json} AS CHAR)"),
            PayloadType::Binary => format!("CAST({json} AS BINARY)"),
        };
        // One INSERT ... SELECT over a generated sequence (digits cross-joined: MySQL 8 and
        // MariaDB alike), in id order.
        let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                      UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                      UNION ALL SELECT 8 UNION ALL SELECT 9)";
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', CAST(n MOD ? AS CHAR), 'OrderChanged', {payload} \
             FROM (SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d + 10000 * f.d + 100000 * g.d AS n \
                   FROM {digits} a, {digits} b, {digits} c, {digits} e, {digits} f, {digits} g) nums \
             WHERE n < ? ORDER BY n",
            side.table
        )))
        .bind(aggregates)
        .bind(aggregates)
        .bind(events)
        .execute(&side.pool)
        .await
        .unwrap_or_else(|e| panic!("loading {events} events: {e}"));
        side.exec(&format!("ANALYZE TABLE {}", side.table)).await;
    }

    /// `pending = 1`: the store's generated column for [`PENDING`](super::PENDING), which its
    /// index covers.
    async fn any_pending(side: &MySqlSide) -> bool {
        let row: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT 1 FROM {} WHERE pending = 1 LIMIT 1",
            side.table
        )))
        .fetch_optional(&side.pool)
        .await
        .expect("looking for a pending row");
        row.is_some()
    }

    fn lock_table_sql(table: &str) -> (String, &'static str) {
        (format!("LOCK TABLES {table} WRITE"), "UNLOCK TABLES")
    }

    fn lock_waiters_sql(client: &str) -> String {
        format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE HOST LIKE '{client}:%' \
             AND STATE LIKE 'Waiting for table%'"
        )
    }

    fn create_orders_sql(orders: &str, aggregates: u64) -> String {
        let values: Vec<String> = (0..aggregates).map(|a| format!("('{a}', 0)")).collect();
        format!(
            "DROP TABLE IF EXISTS {orders}; \
             CREATE TABLE {orders} (id VARCHAR(16) PRIMARY KEY, version INT NOT NULL) ENGINE = InnoDB; \
             INSERT INTO {orders} VALUES {}",
            values.join(", ")
        )
    }

    async fn drop_bookkeeping(side: &MySqlSide) {
        for bookkeeping in ["outbox_relay_schema", "outbox_relay_members"] {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM {bookkeeping} WHERE table_name = ?"
            )))
            .bind(&side.table)
            .execute(&side.pool)
            .await
            .expect("deleting the bookkeeping rows");
        }
    }
}

/// A MariaDB server of the test's own: a fresh data directory, a free port on loopback. Its
/// [`Fault`] is a crash (SIGKILL; committed transactions survive in the redo log) and a start
/// again. Killed and its directory removed when dropped, whatever the test's outcome —
/// restarting the machine's shared server would break the other MySQL tests.
#[derive(Debug)]
pub struct PrivateMariaDb {
    dir: PathBuf,
    port: u16,
    child: Mutex<Option<Child>>,
    /// With [`Self::tls_only`]: the CA the readiness check trusts.
    tls_ca: Option<PathBuf>,
    /// With [`Self::reachable_at`]: the other address it listens on.
    also_at: Option<std::net::Ipv4Addr>,
}

fn tool(name: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return path;
        }
    }
    panic!(
        "{name} is required for this test and was not found: install mariadb-server \
         (scripts/services.sh does)"
    );
}

impl PrivateMariaDb {
    /// A new data directory under the scratch directory `name`; [`Self::start`] starts it.
    pub fn create(name: &str) -> Self {
        let dir = scratch_dir(name).join("mariadb");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut install = Command::new(tool("mariadb-install-db"));
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if running_as_root() {
            install.arg("--user=root");
        }
        let out = install.output().expect("running mariadb-install-db");
        assert!(
            out.status.success(),
            "mariadb-install-db failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            dir,
            port: free_port(),
            child: Mutex::new(None),
            tls_ca: None,
            also_at: None,
        }
    }

    /// Listen on `address` too (a [`crate::Link`]'s machine end, for a relay on a
    /// [`crate::NetworkHost`]; [`Self::url_at`]), where root logs in from the link's other end;
    /// call before [`Self::start`].
    pub fn reachable_at(mut self, address: std::net::Ipv4Addr) -> Self {
        self.also_at = Some(address);
        self
    }

    /// Root's URL for database `test` at [`Self::reachable_at`]'s address.
    pub fn url_at(&self, address: std::net::Ipv4Addr) -> String {
        format!("mysql://root@{address}:{}/test", self.port)
    }

    /// Serve `pki`'s server certificate and refuse every connection without TLS
    /// (`require_secure_transport`); call before [`Self::start`]. The user
    /// [`crate::tls::CLIENT_NAME`] (created by `start`) must present a client certificate.
    pub fn tls_only(mut self, pki: &crate::tls::TestPki) -> Self {
        std::fs::copy(&pki.server.cert, self.dir.join("server.crt")).unwrap();
        std::fs::copy(&pki.server.key, self.dir.join("server.key")).unwrap();
        std::fs::copy(&pki.ca, self.dir.join("ca.crt")).unwrap();
        self.tls_ca = Some(pki.ca.clone());
        self
    }

    /// Serve `cert`/`key` from now on (copied over the server's files, then `FLUSH SSL`): a
    /// certificate rotation without a restart.
    pub async fn serve(&self, cert: &Path, key: &Path) {
        std::fs::copy(cert, self.dir.join("server.crt")).unwrap();
        std::fs::copy(key, self.dir.join("server.key")).unwrap();
        let mut conn = sqlx::MySqlConnection::connect(&self.admin_url())
            .await
            .expect("connecting to the private mariadbd");
        conn.execute("FLUSH SSL").await.expect("FLUSH SSL");
        let _ = conn.close().await;
    }

    /// Root's URL over TLS (trusting any certificate) when TLS-only, else plain.
    fn admin_url(&self) -> String {
        match self.tls_ca {
            Some(_) => format!("{}?ssl-mode=REQUIRED", self.url("")),
            None => self.url(""),
        }
    }

    /// Its URL for `database`.
    pub fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Start the server (again) on the same data directory and port, wait until it answers and
    /// create database `test`.
    pub async fn start(&self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .unwrap();
        let mut server = Command::new(tool("mariadbd"));
        server
            .arg("--no-defaults")
            .arg(format!("--datadir={}", self.dir.join("data").display()))
            .arg(format!(
                "--socket={}",
                self.dir.join("mysqld.sock").display()
            ))
            .arg(format!(
                "--pid-file={}",
                self.dir.join("mysqld.pid").display()
            ))
            .arg(format!("--port={}", self.port))
            .arg(match self.also_at {
                Some(address) => format!("--bind-address=127.0.0.1,{address}"),
                None => "--bind-address=127.0.0.1".to_owned(),
            })
            .arg("--skip-name-resolve")
            .arg("--innodb-buffer-pool-size=64M")
            // A binary log synced at every commit, as replicated production servers run: a
            // commit is then durable before other sessions can see it. Without it InnoDB makes
            // a commit visible before its redo is flushed, and a SIGKILL in between loses a
            // row the relay has already read and published (a crash test saw it once).
            .arg(format!(
                "--log-bin={}",
                self.dir.join("data").join("binlog").display()
            ))
            .arg("--sync-binlog=1")
            .arg("--max-connections=200")
            .args(match self.tls_ca {
                Some(_) => vec![
                    format!("--ssl-cert={}", self.dir.join("server.crt").display()),
                    format!("--ssl-key={}", self.dir.join("server.key").display()),
                    format!("--ssl-ca={}", self.dir.join("ca.crt").display()),
                    "--require-secure-transport=ON".to_owned(),
                ],
                None => Vec::new(),
            })
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if running_as_root() {
            server.arg("--user=root");
        }
        *self.child.lock().unwrap() = Some(server.spawn().expect("starting mariadbd"));
        let url = self.admin_url();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut conn) = sqlx::MySqlConnection::connect(&url).await {
                conn.execute("CREATE DATABASE IF NOT EXISTS test")
                    .await
                    .expect("creating database test");
                if self.tls_ca.is_some() {
                    let user = crate::tls::CLIENT_NAME;
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "CREATE USER IF NOT EXISTS '{user}'@'%' REQUIRE X509; \
                             GRANT ALL ON *.* TO '{user}'@'%'"
                    )))
                    .await
                    .expect("creating the certificate user");
                }
                if let Some(address) = self.also_at {
                    // Root from the link's other end, as root from 127.0.0.1.
                    let [a, b, c, _] = address.octets();
                    conn.execute(sqlx::AssertSqlSafe(format!(
                        "CREATE USER IF NOT EXISTS 'root'@'{a}.{b}.{c}.%'; \
                             GRANT ALL ON *.* TO 'root'@'{a}.{b}.{c}.%' WITH GRANT OPTION"
                    )))
                    .await
                    .expect("creating root at the other address");
                }
                let _ = conn.close().await;
                return;
            }
            let exited = self
                .child
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "the private mariadbd exited with {status}; log:\n{}",
                    std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the private mariadbd did not answer on port {} within 60s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `KILL` every client connection but the one that asks (a failover tool does this to the
    /// old primary's clients).
    pub async fn cut_connections(&self) {
        let mut conn = sqlx::MySqlConnection::connect(&self.admin_url())
            .await
            .expect("connecting to the private mariadbd");
        let others: Vec<i64> = sqlx::query_scalar(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID() \
             AND COMMAND <> 'Daemon'",
        )
        .fetch_all(&mut conn)
        .await
        .expect("listing the connections");
        for id in others {
            // A connection may end by itself meanwhile.
            let _ = conn
                .execute(sqlx::AssertSqlSafe(format!("KILL {id}")))
                .await;
        }
        let _ = conn.close().await;
    }

    /// SIGKILL: the server crashes; committed transactions survive in its redo log.
    pub fn kill(&self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[async_trait]
impl Fault for PrivateMariaDb {
    fn describe(&self) -> String {
        "MariaDB SIGKILLed and started again".to_owned()
    }

    async fn begin(&self) {
        self.kill();
    }

    async fn end(&self) {
        self.start().await;
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
