//! End to end: MySQL / MariaDB → `outbox-relay run` processes → Redis Streams, checked by an
//! independent reader.
//!
//! The first test runs on the machine's MariaDB (`OUTBOX_TEST_MYSQL_URL`). The restart test
//! runs its own, private MariaDB server (a fresh data directory on a free port), which it
//! SIGKILLs and starts again mid-run: restarting the shared server would break the other MySQL
//! tests running at the same time.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_core::NewEvent;
use outboxkit_store_mysql::Outbox;
use outboxkit_tests::mysql_pending_rows as pending_rows;
use outboxkit_tests::*;
use sqlx::{Connection, Executor};
use uuid::Uuid;

type Committed = Arc<Mutex<HashMap<Uuid, (i64, String)>>>;

/// Drop the outbox table, its bookkeeping rows and the business table.
async fn drop_tables(pool: &sqlx::MySqlPool, table: &str, orders: &str) {
    sqlx::query(&format!("DROP TABLE IF EXISTS {orders}, {table}"))
        .execute(pool)
        .await
        .unwrap();
    for bookkeeping in ["outbox_relay_schema", "outbox_relay_members"] {
        sqlx::query(&format!("DELETE FROM {bookkeeping} WHERE table_name = ?"))
            .bind(table)
            .execute(pool)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_relays_one_sigkilled_deliver_every_event_in_order() {
    const EVENTS: u64 = 20_000;
    const AGGREGATES: u64 = 500;
    const WRITERS: u64 = 8;

    let table = unique("e2e_my");
    let orders = format!("{table}_orders");
    let prefix = unique("e2e_my");
    let streams = vec![format!("{prefix}.order"), format!("{prefix}.customer")];
    let dir = scratch_dir(&table);
    let url = mysql_url();
    let config = write_file(
        &dir,
        "relay.toml",
        &mysql_redis_config(
            &url,
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            "",
            "",
        ),
    );

    // migrate is idempotent.
    for _ in 0..2 {
        let (ok, out, err) = run_cli(&config, &["migrate"]);
        assert!(ok, "migrate failed: {out}{err}");
    }
    let pool = mysql_pool(&url).await;
    let mut redis = redis_connection().await;
    create_mysql_orders(&pool, &orders, AGGREGATES).await;

    let mut relays: Vec<RelayProcess> = (0..3)
        .map(|i| RelayProcess::start(&config, &dir, &format!("relay-{i}")))
        .collect();

    // Concurrent writers: each event in a business transaction that updates (locks) its
    // aggregate's row; every 50th transaction rolls back.
    let committed: Committed = Arc::default();
    let rolled_back: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let outbox = Outbox::new(&table).unwrap();
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (pool, outbox, committed, rolled_back, written, orders) = (
            pool.clone(),
            outbox.clone(),
            committed.clone(),
            rolled_back.clone(),
            written.clone(),
            orders.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (w + 1);
            let mut n = 0;
            while n < EVENTS / WRITERS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let aggregate = (x % AGGREGATES).to_string();
                let kind = if x % AGGREGATES % 2 == 0 {
                    "order"
                } else {
                    "customer"
                };
                let mut tx = pool.begin().await.unwrap();
                sqlx::query(&format!(
                    "UPDATE {orders} SET version = version + 1 WHERE id = ?"
                ))
                .bind(&aggregate)
                .execute(&mut *tx)
                .await
                .unwrap();
                let event = NewEvent::new(
                    kind,
                    aggregate.clone(),
                    "Changed",
                    serde_json::json!({ "w": w, "n": n }),
                )
                .header(
                    "traceparent",
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                )
                .event_id(Uuid::now_v7());
                let event_id = event.event_id.unwrap();
                let id = outbox.enqueue(&mut tx, &event).await.unwrap();
                if x % 50 == 0 {
                    tx.rollback().await.unwrap();
                    rolled_back.lock().unwrap().push(event_id);
                    continue;
                }
                tx.commit().await.unwrap();
                committed.lock().unwrap().insert(event_id, (id, aggregate));
                written.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }));
    }

    // Mid-run, SIGKILL one relay, then start it again.
    wait_for(
        "a third of the events written",
        Duration::from_secs(120),
        || {
            let written = written.clone();
            async move { written.load(Ordering::Relaxed) >= EVENTS / 3 }
        },
    )
    .await;
    relays[0].kill_hard();
    let killed_at = written.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(700)).await;
    relays[0] = RelayProcess::start(&config, &dir, "relay-0");

    for w in writers {
        w.await.expect("writer");
    }
    let write_secs = started.elapsed().as_secs_f64();
    wait_for("the backlog to drain", Duration::from_secs(180), || {
        let pool = pool.clone();
        let table = table.clone();
        async move { pending_rows(&pool, &table).await == 0 }
    })
    .await;
    let drain_secs = started.elapsed().as_secs_f64();

    // All three relays are alive and share the shards.
    wait_for(
        "three relays sharing the 32 shards",
        Duration::from_secs(30),
        || {
            let config = config.clone();
            async move {
                let (ok, status, _) = run_cli(&config, &["status", "--json"]);
                let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
                ok && status["shards_owned"] == 32
                    && status["owners"].as_object().map(|o| o.len()) == Some(3)
            }
        },
    )
    .await;
    let (ok, status, err) = run_cli(&config, &["status", "--json"]);
    assert!(ok, "status failed: {err}");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["pending"], 0);
    for owner in status["owners"].as_object().unwrap().keys() {
        assert!(owner.starts_with("relay-"), "{status}");
    }

    for relay in &mut relays {
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(
            exit.success(),
            "{} exited with {exit} on SIGTERM; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    let delivered = read_streams(&mut redis, &streams).await;
    let committed = committed.lock().unwrap().clone();
    let check = check_delivery(&committed, &delivered);
    let rolled_back = rolled_back.lock().unwrap().clone();
    println!(
        "MariaDB → Redis: {} committed ({} rolled back), killed relay-0 after {killed_at} writes; \
         writes took {write_secs:.1}s, drained at {drain_secs:.1}s; read back {} messages, {} \
         distinct, {} duplicates",
        committed.len(),
        rolled_back.len(),
        check.messages,
        check.distinct,
        check.duplicates
    );
    assert_eq!(committed.len() as u64, EVENTS);
    assert!(!rolled_back.is_empty());
    assert!(
        check.missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        check.missing.len(),
        &check.missing[..check.missing.len().min(5)]
    );
    assert!(
        check.unexpected.is_empty(),
        "events that were never committed arrived: {:?}",
        &check.unexpected[..check.unexpected.len().min(5)]
    );
    for id in &rolled_back {
        assert!(
            delivered.iter().all(|m| m.event_id != *id),
            "rolled-back event {id} was published"
        );
    }
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );
    // Routing and fields: each aggregate's events are in its aggregate type's stream.
    for m in &delivered {
        let (_, aggregate) = &committed[&m.event_id];
        assert_eq!(&m.aggregate_id, aggregate);
        let parity = aggregate.parse::<u64>().unwrap() % 2;
        assert_eq!(
            m.stream.ends_with(".order"),
            parity == 0,
            "{} in {}",
            aggregate,
            m.stream
        );
        assert!(m.fields["headers"].contains("traceparent"));
    }

    let _: () = redis::cmd("DEL")
        .arg(&streams)
        .query_async(&mut redis)
        .await
        .unwrap();
    drop_tables(&pool, &table, &orders).await;
}

/// A MariaDB server of the test's own: a fresh data directory, a free port on loopback. Killed
/// and its directory removed when dropped, whatever the test's outcome.
struct PrivateMariaDb {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
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

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PrivateMariaDb {
    fn create(name: &str) -> Self {
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
            child: None,
        }
    }

    fn url(&self, database: &str) -> String {
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Start the server (again) on the same data directory and port, and wait until it answers.
    async fn start(&mut self) {
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
            .arg("--bind-address=127.0.0.1")
            .arg("--skip-name-resolve")
            .arg("--innodb-buffer-pool-size=64M")
            .arg("--max-connections=200")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if running_as_root() {
            server.arg("--user=root");
        }
        self.child = Some(server.spawn().expect("starting mariadbd"));
        let url = self.url("");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(mut conn) = sqlx::MySqlConnection::connect(&url).await {
                conn.execute("CREATE DATABASE IF NOT EXISTS test")
                    .await
                    .expect("creating database test");
                let _ = conn.close().await;
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
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

    /// SIGKILL: the server crashes; committed transactions survive in its redo log.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Transactions cut by the restart are retried as new events; those whose commit was cut have an
/// unknown outcome and are resolved by looking for their row afterwards (rows are kept).
#[derive(Debug, Default)]
struct Writes {
    committed: HashMap<Uuid, (i64, String)>,
    uncertain: Vec<(Uuid, String)>,
    failed_attempts: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_restart_mid_run_loses_nothing_and_the_relays_reconnect() {
    const EVENTS: u64 = 6_000;
    const AGGREGATES: u64 = 200;
    const WRITERS: u64 = 4;

    let table = unique("e2e_myr");
    let orders = format!("{table}_orders");
    let prefix = unique("e2e_myr");
    let stream = format!("{prefix}.order");
    let dir = scratch_dir(&table);
    let mut server = PrivateMariaDb::create(&table);
    server.start().await;
    let url = server.url("test");
    let config = write_file(
        &dir,
        "relay.toml",
        &mysql_redis_config(
            &url,
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            "",
            "retention = \"1h\"",
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = mysql_pool(&url).await;
    let mut redis = redis_connection().await;
    create_mysql_orders(&pool, &orders, AGGREGATES).await;

    let mut relays: Vec<RelayProcess> = (0..2)
        .map(|i| RelayProcess::start(&config, &dir, &format!("relay-{i}")))
        .collect();

    let writes: Arc<Mutex<Writes>> = Arc::default();
    let written = Arc::new(AtomicU64::new(0));
    let outbox = Outbox::new(&table).unwrap();
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (pool, outbox, writes, written, orders) = (
            pool.clone(),
            outbox.clone(),
            writes.clone(),
            written.clone(),
            orders.clone(),
        );
        writers.push(tokio::spawn(async move {
            let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ (w + 1);
            for n in 0..EVENTS / WRITERS {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let aggregate = (x % AGGREGATES).to_string();
                let deadline = Instant::now() + Duration::from_secs(120);
                loop {
                    let event = NewEvent::new(
                        "order",
                        aggregate.clone(),
                        "Changed",
                        serde_json::json!({ "w": w, "n": n }),
                    )
                    .event_id(Uuid::now_v7());
                    let event_id = event.event_id.unwrap();
                    // Until the insert succeeded nothing can commit; after it, a failure may
                    // have happened after the commit reached the server.
                    let mut inserted = None;
                    let attempt = async {
                        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
                        sqlx::query(&format!(
                            "UPDATE {orders} SET version = version + 1 WHERE id = ?"
                        ))
                        .bind(&aggregate)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| e.to_string())?;
                        let id = outbox
                            .enqueue(&mut tx, &event)
                            .await
                            .map_err(|e| e.to_string())?;
                        inserted = Some(id);
                        tx.commit().await.map_err(|e| e.to_string())?;
                        Ok::<i64, String>(id)
                    }
                    .await;
                    match attempt {
                        Ok(id) => {
                            let mut writes = writes.lock().unwrap();
                            writes.committed.insert(event_id, (id, aggregate.clone()));
                            written.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(e) => {
                            {
                                let mut writes = writes.lock().unwrap();
                                writes.failed_attempts += 1;
                                if inserted.is_some() {
                                    writes.uncertain.push((event_id, aggregate.clone()));
                                }
                            }
                            assert!(
                                Instant::now() < deadline,
                                "writer {w} could not write for 120s: {e}"
                            );
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }
        }));
    }

    // Mid-run, crash the database server and start it again a few seconds later.
    wait_for(
        "a third of the events written",
        Duration::from_secs(120),
        || {
            let written = written.clone();
            async move { written.load(Ordering::Relaxed) >= EVENTS / 3 }
        },
    )
    .await;
    let killed_at = written.load(Ordering::Relaxed);
    server.kill();
    let down = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start().await;
    let downtime = down.elapsed().as_secs_f64();

    for w in writers {
        w.await.expect("writer");
    }
    let write_secs = started.elapsed().as_secs_f64();
    wait_for(
        "the backlog to drain after the restart",
        Duration::from_secs(180),
        || {
            let pool = pool.clone();
            let table = table.clone();
            async move { pending_rows(&pool, &table).await == 0 }
        },
    )
    .await;
    let drain_secs = started.elapsed().as_secs_f64();

    // The relays reconnected by themselves: still running, each opened a new session, and
    // together they own every shard again.
    for relay in &mut relays {
        assert!(
            relay.is_running(),
            "{} died; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }
    wait_for(
        "both relays to own the 32 shards again",
        Duration::from_secs(30),
        || {
            let config = config.clone();
            async move {
                let (ok, status, _) = run_cli(&config, &["status", "--json"]);
                let status: serde_json::Value = serde_json::from_str(&status).unwrap_or_default();
                ok && status["shards_owned"] == 32
                    && status["owners"].as_object().map(|o| o.len()) == Some(2)
            }
        },
    )
    .await;
    for relay in &mut relays {
        let log = relay.log_text();
        assert!(
            log.matches("database session open").count() >= 2,
            "{} did not open a new session after the restart; log:\n{log}",
            relay.name
        );
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(
            exit.success(),
            "{} exited with {exit}; log:\n{}",
            relay.name,
            relay.log_text()
        );
    }

    // Resolve the transactions whose commit was cut: a kept row means it committed.
    let mut writes = std::mem::take(&mut *writes.lock().unwrap());
    let mut resolved_committed = 0;
    for (event_id, aggregate) in std::mem::take(&mut writes.uncertain) {
        let id: Option<i64> =
            sqlx::query_scalar(&format!("SELECT id FROM {table} WHERE event_id = ?"))
                .bind(event_id.to_string())
                .fetch_optional(&pool)
                .await
                .unwrap();
        if let Some(id) = id {
            writes.committed.insert(event_id, (id, aggregate));
            resolved_committed += 1;
        }
    }
    // Every committed row is in the table, published: nothing was lost by the crash.
    let rows: i64 = sqlx::query_scalar(&format!(
        "SELECT COUNT(*) FROM {table} WHERE published_at IS NOT NULL"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows as usize, writes.committed.len());

    let delivered = read_streams(&mut redis, std::slice::from_ref(&stream)).await;
    let check = check_delivery(&writes.committed, &delivered);
    println!(
        "MariaDB restart: {} committed ({} failed attempts around the crash, {resolved_committed} \
         of them committed after all); server killed after {killed_at} writes and back after \
         {downtime:.1}s; writes took {write_secs:.1}s, drained at {drain_secs:.1}s; read back {} \
         messages, {} distinct, {} duplicates",
        writes.committed.len(),
        writes.failed_attempts,
        check.messages,
        check.distinct,
        check.duplicates
    );
    assert!(writes.committed.len() as u64 >= EVENTS);
    assert!(
        check.missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        check.missing.len(),
        &check.missing[..check.missing.len().min(5)]
    );
    assert!(
        check.unexpected.is_empty(),
        "events that never committed arrived: {:?}",
        &check.unexpected[..check.unexpected.len().min(5)]
    );
    assert!(
        check.order_violations.is_empty(),
        "per-aggregate order broken: {:?}",
        &check.order_violations[..check.order_violations.len().min(5)]
    );

    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .query_async(&mut redis)
        .await
        .unwrap();
    pool.close().await;
    drop(server);
}
