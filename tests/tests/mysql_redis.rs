//! End to end: a MariaDB restart mid-run. The test runs its own, private MariaDB server (a fresh
//! data directory on a free port), which it SIGKILLs and starts again while writers write and
//! two relays publish to Redis Streams: restarting the shared server would break the other
//! MySQL tests running at the same time. (The scenario on the shared server runs in
//! `matrix.rs`.)

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

/// Writers retry the transactions the crash cuts, as new events; those whose commit was cut
/// have an unknown outcome and are resolved by looking for their row afterwards (rows are kept:
/// `retention = "1h"`). Then a relay with `retention = "delete"` purges the rows kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mariadb_restart_mid_run_loses_nothing_and_the_relays_reconnect() {
    const EVENTS: u64 = 6_000;
    let name = unique("e2e_myr");
    let server = Arc::new(PrivateMariaDb::create(&name));
    server.start().await;
    let store = Arc::new(MySqlSide::open_at(&server.url("test"), &name).await);
    let mut scenario = Scenario::prepare(
        store.clone(),
        Arc::new(RedisSide::open(&name).await),
        Settings::default().relay("retention = \"1h\""),
    )
    .await;

    // Mid-run, crash the database server and start it again 3 seconds later; no relay is
    // killed: they must reconnect by themselves.
    let scale = Scale {
        events: EVENTS,
        aggregates: 200,
        writers: 4,
        relays: 2,
    };
    let mut plan = Plan::with_fault(scale, server.clone(), Duration::from_secs(3));
    plan.writers = plan.writers.retrying(Duration::from_secs(120));
    let run = scenario.run(plan).await;

    // The relays reconnected by themselves: each opened a new session.
    for (relay, log) in &run.relay_logs {
        assert!(
            log.matches("database session open").count() >= 2,
            "{relay} did not open a new session after the restart; log:\n{log}"
        );
    }
    // Every committed row is in the table, published: nothing was lost by the crash.
    let published = store.count_rows("published_at IS NOT NULL").await;
    assert_eq!(published as usize, run.writes.committed.len());
    assert!(run.writes.committed.len() as u64 >= EVENTS);

    // Retention turned off: the rows kept so far are purged too, and the log says so, in the
    // pipeline's span.
    let i = scenario.start_relay(
        "relay-delete",
        &[
            ("OUTBOX_RELAY__RETENTION", "delete"),
            ("OUTBOX_RELAY__PURGE_INTERVAL", "200ms"),
        ],
    );
    wait_for("the kept rows purged", Duration::from_secs(30), || {
        let store = store.clone();
        async move { store.count_rows("true").await == 0 }
    })
    .await;
    scenario.relays[i].terminate(Duration::from_secs(15));
    let log = scenario.relays[i].log_text();
    assert!(
        log.lines().any(|l| l.contains("relay{pipeline=default}")
            && l.contains(&format!("deleted published rows that an earlier relay.retention kept (relay.retention is \"delete\" now) purged={published}"))),
        "{log}"
    );

    scenario.cleanup().await;
    store.pool().close().await;
    drop(server);
}
