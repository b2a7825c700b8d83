//! PostgreSQL behind PgBouncer (one of the test's own, in front of the test server), as many
//! deployments put it. In session mode the relay relays: its shard sessions set their settings
//! with statements, where they were startup options that PgBouncer refuses (`unsupported
//! startup parameter: options`, for ever). Set up otherwise, `run` stops at start saying what
//! to change, where it used to retry cryptic errors (`prepared statement "sqlx_s_1" already
//! exists`) for ever.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_pgbouncer_in_session_mode_it_relays_and_other_setups_are_named() {
    let name = unique("pgb");
    let redis = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::on_postgres(&name, redis.clone(), Settings::default()).await;
    scenario.store.enqueue_many(&placed_events(100, 10)).await;
    let mut stops = |bouncer: &PrivatePgBouncer, relay: &str| {
        let url = bouncer.url();
        scenario.stopped_at_start(relay, &[("OUTBOX_STORE__URL", url.as_str())])
    };

    let strict = PrivatePgBouncer::start(&name, "session", "");
    let log = stops(&strict, "relay-strict");
    assert!(
        log.contains(
            "refused a startup parameter (unsupported startup parameter: extra_float_digits)"
        ) && log.contains("ignore_startup_parameters = extra_float_digits"),
        "{log}"
    );
    drop(strict);
    let transactions = PrivatePgBouncer::start(&name, "transaction", "extra_float_digits");
    let log = stops(&transactions, "relay-transaction");
    assert!(
        log.contains("transaction or statement mode") && log.contains("pool_mode = session"),
        "{log}"
    );
    drop(transactions);
    assert_eq!(redis.stream_len(&redis.destination("order")).await, 0);

    let sessions = PrivatePgBouncer::start(&name, "session", "extra_float_digits");
    let url = sessions.url();
    let i = scenario.start_relay("relay-session", &[("OUTBOX_STORE__URL", url.as_str())]);
    scenario.drain("100 events", Duration::from_secs(30)).await;
    scenario.relays[i].stop(Duration::from_secs(20));
    scenario.cleanup().await;
    drop(sessions);
}
