//! A relay cut off by the network, from its database or from its broker, while the other relay
//! reaches both. The relay runs on a host of the test's own (a network namespace) and reaches
//! each server over a link of its own; a cut takes one link down. Packets are dropped and
//! nothing is closed, so neither end hears of it. The other relay must end up owning every
//! shard, the cut relay must ride it out without exiting and join again once the link is back;
//! writers write throughout, with rollbacks, and the scenario's delivery check runs at the end.
//!
//! Cut from the database, only the server can end the cut relay's shard session, its locks with
//! it. The cut comes while the server is answering the relay: its statement waits on a table
//! lock the test holds, and the lock is let go once the link is down, so the server sends its
//! answer into the partition. Unacknowledged data stops TCP keepalives. Before, PostgreSQL then
//! ended the session only at its idle limit (2 minutes), or at the kernel's retransmission
//! limit (about 15 minutes) where the answer filled the socket; each shard session now sets
//! `tcp_user_timeout` too, and the server drops the connection once what it sent has gone
//! unacknowledged for 25 s, as the keepalives do for a quiet one. A MySQL server has neither
//! for a session to set: it ends the session at the idle limit (`wait_timeout`, 2 minutes).
//!
//! Cut from the broker, the relay kept its shards, their events stuck however long the cut
//! lasted, though the other relay could publish them. Now it gives them back once its broker
//! calls have failed for `relay.hand_over_after`, and takes shards again when the broker
//! answers a check.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::proxy::Blackhole;
use outboxkit_harness::*;

/// Which of relay-0's links the test cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Database,
    Broker,
}

/// Start relay-0 on `host`, reaching the database at `url_at` and Redis over `to_broker`
/// (through a proxy on its machine end, returned), serving its endpoints on `endpoints`:9464.
async fn start_on_host(
    scenario: &mut Scenario,
    host: &NetworkHost,
    url_at: String,
    to_broker: &Link,
    endpoints: &str,
) -> Blackhole {
    let upstream = redis_url().trim_start_matches("redis://").to_owned();
    let broker_path = Blackhole::on(&to_broker.machine.to_string(), upstream).await;
    let mut env = scenario.broker.relay_env();
    env.push(("OUTBOX_STORE__URL".into(), url_at));
    env.push(("OUTBOX_SERVER__LISTEN".into(), format!("{endpoints}:9464")));
    env.push((
        "OUTBOX_SINK__REDIS_STREAMS__URL".into(),
        format!("redis://{}:{}", to_broker.machine, broker_path.port()),
    ));
    let launcher = host.launcher(&scenario.dir, &relay_binary());
    let (config, dir) = (scenario.config.clone(), scenario.dir.clone());
    let relay = RelayProcess::start_binary(&launcher, &config, &dir, "relay-0", &env);
    scenario.relays.push(relay);
    broker_path
}

/// relay-0's `/readyz` answers `code`, within 45 s.
async fn wait_ready_at(endpoints: &str, code: u16) {
    let at = endpoints.to_owned();
    wait_for("relay-0's /readyz", Duration::from_secs(45), move || {
        let ready = http_get_at(&at, 9464, "/readyz").map(|(code, _)| code);
        async move { ready == Some(code) }
    })
    .await;
}

/// The log lines of a relay that gave its shards back to a broker cut, and took shards again.
fn assert_handed_over_and_back(log: &str) {
    assert!(
        log.contains("the broker has failed every call for relay.hand_over_after: giving this relay's shards back")
            && log.contains("the broker answers a check again: taking shards again"),
        "{log}"
    );
}

/// `store` on a private server that listens on `to_database`'s machine end, at `url_at` there;
/// relay-0 on `host` reaching it over `to_database` and Redis over a link of its own, relay-1 on
/// the machine. The cut, and how long until relay-1 owned every shard: it must be within
/// `limit`.
async fn cut_off(
    store: Arc<dyn StoreSide>,
    host: &NetworkHost,
    to_database: &Link,
    url_at: String,
    cut_link: Cut,
    settings: Settings,
    limit: Duration,
) -> Duration {
    let name = store.table().to_owned();
    let to_broker = host.link();
    let redis = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::prepare(store.clone(), redis, settings).await;

    let (cut_one, kept) = match cut_link {
        Cut::Database => (to_database, &to_broker),
        Cut::Broker => (&to_broker, to_database),
    };
    // relay-0 serves its endpoints on the link that stays up.
    let endpoints = kept.host.to_string();
    let _broker_path = start_on_host(&mut scenario, host, url_at, &to_broker, &endpoints).await;
    scenario.start_relay("relay-1", &[]);
    scenario.wait_shared(2).await;

    let writers = scenario
        .start_writers(&WriterPlan::steady(4, 200, Duration::from_millis(20)))
        .await;
    writers.wait_written(1_000, Duration::from_secs(60)).await;
    let (cut, cut_at) = match cut_link {
        Cut::Database => {
            let lock = store.lock_table().await;
            let client = to_database.host.to_string();
            wait_for(
                "relay-0 waiting on the table",
                Duration::from_secs(20),
                || {
                    let (store, client) = (store.clone(), client.clone());
                    async move { store.lock_waiters(&client).await > 0 }
                },
            )
            .await;
            // Its other statements (the shard session's claim, if that was not the first)
            // reach the lock too.
            tokio::time::sleep(Duration::from_secs(1)).await;
            cut_one.cut();
            let cut = (Instant::now(), writers.written());
            lock.release().await;
            cut
        }
        Cut::Broker => {
            cut_one.cut();
            (Instant::now(), writers.written())
        }
    };
    scenario.wait_shared_within(1, limit).await;
    let took = cut.elapsed();
    let status = scenario.status();
    let owners = status["owners"].as_object().expect("owners");
    assert!(owners.keys().all(|k| k.starts_with("relay-1")), "{status}");
    // The cut relay says so: not ready, no shard, and (cut from the broker) a hand-over.
    wait_ready_at(&endpoints, 503).await;
    let metrics = http_get_at(&endpoints, 9464, "/metrics")
        .unwrap_or_default()
        .1;
    assert_eq!(
        metric_value(&metrics, "outbox_shards_owned"),
        Some(0.0),
        "{metrics}"
    );
    if cut_link == Cut::Broker {
        let hand_overs = metric_value(&metrics, "outbox_hand_overs_total");
        assert_eq!(hand_overs, Some(1.0), "{metrics}");
    }

    cut_one.heal();
    let healed = Instant::now();
    scenario.wait_shared(2).await;
    let rejoined = healed.elapsed();
    // relay-0 takes its share of new events again.
    let after = writers.written() + 1_000;
    writers.wait_written(after, Duration::from_secs(60)).await;
    let writes = writers.finish().await;
    scenario
        .drain("the backlog to drain", Duration::from_secs(120))
        .await;
    scenario.assert_relays_running();
    let status = scenario.settled_status().await;
    assert_eq!(status["dead"], 0, "{status}");
    scenario.stop_relays(Duration::from_secs(30));
    let logs = scenario.relay_logs();
    for (relay, log) in &logs {
        assert_no_error_lines(relay, log);
    }
    if cut_link == Cut::Broker {
        assert_handed_over_and_back(&logs[0].1);
    }

    let delivered = scenario
        .read_back(&writes.committed, Duration::from_secs(60))
        .await;
    let mut check = check_delivery(&writes.committed, &delivered);
    scenario
        .look_for_missing(&writes, &mut check, &delivered, &logs)
        .await;
    scenario.assert_delivery(&writes, &check, &delivered);
    println!(
        "{}: {} committed over 200 aggregates ({} rolled back); relay-0 cut off from the \
         {cut_link:?} after {cut_at} writes, its shards taken over {:.1}s later, sharing again \
         {:.1}s after the link came back; {} messages, {} distinct, {} duplicates, 0 order \
         violations",
        store.name(),
        writes.committed.len(),
        writes.rolled_back.len(),
        took.as_secs_f64(),
        rejoined.as_secs_f64(),
        check.messages,
        check.distinct,
        check.duplicates,
    );
    scenario.cleanup().await;
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_from_its_database_gives_its_shards_back_and_joins_again() {
    let name = unique("cutoff");
    let (postgres, mysql) = (format!("{name}_pg"), format!("{name}_my"));
    let (postgres_host, mysql_host) = (NetworkHost::create(), NetworkHost::create());
    let (postgres_link, mysql_link) = (postgres_host.link(), mysql_host.link());
    let postgres_server = PrivatePostgres::start_reachable_at(&postgres, postgres_link.machine);
    let mysql_server = PrivateMariaDb::create(&mysql).reachable_at(mysql_link.machine);
    mysql_server.start().await;
    let (on_postgres, on_mysql) = tokio::join!(
        async {
            let url = postgres_server.url("postgres", "");
            let store = Arc::new(PostgresSide::open_at(&url, &postgres).await);
            let at = postgres_server.url_at(postgres_link.machine);
            // The user timeout's 25 s, and the next rebalance: well before the 2 minutes after
            // which the server ends a silent session anyway.
            let limit = Duration::from_secs(60);
            let (link, settings) = (&postgres_link, Settings::default());
            cut_off(
                store,
                &postgres_host,
                link,
                at,
                Cut::Database,
                settings,
                limit,
            )
            .await
        },
        async {
            let store = Arc::new(MySqlSide::open_at(&mysql_server.url("test"), &mysql).await);
            let at = mysql_server.url_at(mysql_link.machine);
            // The server's idle limit: 4 × store.session_timeout, at least 2 minutes.
            let limit = Duration::from_secs(200);
            let (link, settings) = (&mysql_link, Settings::default());
            cut_off(store, &mysql_host, link, at, Cut::Database, settings, limit).await
        },
    );
    println!("taken over after {on_postgres:?} (PostgreSQL), {on_mysql:?} (MariaDB)");
}

/// Cut from Redis with `relay.hand_over_after = "5s"`: the first call into the cut fails at the
/// sink's `response_timeout` (10 s), the next one 10 s later is past the 5 s, and relay-0 gives
/// its shards back. Before, it kept them as long as the cut lasted (here, 60 s of waiting).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_cut_off_from_its_broker_hands_its_shards_over_and_joins_again() {
    let name = unique("brokercut");
    let host = NetworkHost::create();
    let link = host.link();
    let server = PrivatePostgres::start_reachable_at(&name, link.machine);
    let store = Arc::new(PostgresSide::open_at(&server.url("postgres", ""), &name).await);
    let at = server.url_at(link.machine);
    let settings = Settings::default().relay("hand_over_after = \"5s\"");
    let limit = Duration::from_secs(60);
    let took = cut_off(store, &host, &link, at, Cut::Broker, settings, limit).await;
    println!("taken over after {took:?}");
}

/// Log-based capture: relay-0 reads the slot and relay-1 stands by; relay-0 is cut from Redis.
/// With `relay.hand_over_after = "5s"` it lets the slot go and relay-1 reads it, while relay-0
/// waits for Redis to answer a check, then stands by. Every committed event arrives, none
/// rolled back does, first deliveries in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_reader_cut_off_from_its_broker_hands_the_slot_over() {
    use super::postgres_logical::{check_in_commit_order, drain_slot, reader_index, takeover};

    let name = unique("lgcut");
    let host = NetworkHost::create();
    let (to_database, to_broker) = (host.link(), host.link());
    let server = PrivatePostgres::start_logical_reachable_at(&name, to_database.machine);
    let side = Arc::new(LogicalSide::open(&server, &name, "message").await);
    let redis = Arc::new(RedisSide::open(&name).await);
    let settings = Settings::default().relay("hand_over_after = \"5s\"");
    let mut scenario = Scenario::prepare(side.clone(), redis, settings).await;
    let endpoints = to_database.host.to_string();
    let url_at = server.url_at(to_database.machine);
    let _broker_path = start_on_host(&mut scenario, &host, url_at, &to_broker, &endpoints).await;
    assert_eq!(reader_index(&side, Duration::from_secs(30)).await, 0);
    scenario.start_relay("relay-1", &[]);

    let writers = scenario
        .start_writers(&WriterPlan::steady(4, 200, Duration::from_millis(20)))
        .await;
    writers.wait_written(1_000, Duration::from_secs(60)).await;
    let cut_at = writers.written();
    to_broker.cut();
    let (reader, took) = takeover(&side, 0, Duration::from_secs(60)).await;
    assert_eq!(reader, 1);
    wait_ready_at(&endpoints, 503).await;
    let metrics = http_get_at(&endpoints, 9464, "/metrics")
        .unwrap_or_default()
        .1;
    let hand_overs = metric_value(&metrics, "outbox_hand_overs_total");
    assert_eq!(hand_overs, Some(1.0), "{metrics}");

    to_broker.heal();
    let healed = Instant::now();
    wait_ready_at(&endpoints, 200).await;
    let standing_by = healed.elapsed();
    let after = writers.written() + 1_000;
    writers.wait_written(after, Duration::from_secs(60)).await;
    let mut writes = writers.finish().await;
    drain_slot(&scenario, Duration::from_secs(120)).await;
    scenario.assert_relays_running();
    let status = scenario.settled_status().await;
    assert_eq!(status["dead"], 0, "{status}");
    let reader = status["slot"]["reader"].as_str().unwrap_or_default();
    assert!(reader.starts_with("relay-1 "), "{status}");
    scenario.stop_relays(Duration::from_secs(30));
    let logs = scenario.relay_logs();
    for (relay, log) in &logs {
        assert_no_error_lines(relay, log);
    }
    assert_handed_over_and_back(&logs[0].1);

    let check = check_in_commit_order(&scenario, &side, &mut writes).await;
    println!(
        "{}: {} committed over 200 aggregates ({} rolled back); relay-0 cut off from Redis after \
         {cut_at} writes, relay-1 read the slot {:.1}s later; relay-0 ready again (standing by) \
         {:.1}s after the link came back; {} messages, {} distinct, {} duplicates, 0 order \
         violations (commit order)",
        side.name(),
        writes.committed.len(),
        writes.rolled_back.len(),
        took.as_secs_f64(),
        standing_by.as_secs_f64(),
        check.messages,
        check.distinct,
        check.duplicates,
    );
    scenario.cleanup().await;
    drop(server);
}
