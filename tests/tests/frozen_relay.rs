//! A relay that hangs with its database connection up — a paused VM or container, a stopped
//! process; here a relay process of the test's own, SIGSTOPped through the testkit's pid guard.
//! Its kernel still answers TCP keepalives, so only the server can tell: it ends a shard
//! session silent for four times `store.session_timeout` (at least 2 minutes), and the other
//! relay takes the shards over. Before, on PostgreSQL the frozen relay kept its shards, their
//! events pending, for as long as it stayed frozen. Resumed, it finds its session gone and joins
//! again. Both stores at once: the wait is the same two minutes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxkit_harness::*;

async fn takes_over_from_a_frozen_relay(store: Arc<dyn StoreSide>, name: &str) {
    let redis = Arc::new(RedisSide::open(name).await);
    let mut scenario = Scenario::prepare(store, redis, Settings::default()).await;
    scenario.start_relays(2);
    scenario.wait_shared(2).await;

    scenario.relays[0].freeze();
    let frozen = Instant::now();
    scenario.store.enqueue_many(&placed_events(200, 50)).await;
    let limit = Duration::from_secs(200);
    scenario.drain("its shards taken over", limit).await;
    let status = scenario.status();
    assert_eq!(status["shards_owned"], 32, "{status}");
    assert_eq!(
        status["owners"].as_object().map(|o| o.len()),
        Some(1),
        "{status}"
    );
    let took = frozen.elapsed();
    // Not before the server's idle limit: a live relay's session is never ended.
    assert!(
        took >= Duration::from_secs(110),
        "taken over after {took:?}"
    );

    scenario.relays[0].thaw();
    scenario.wait_shared(2).await;
    scenario.store.enqueue_many(&placed_events(200, 50)).await;
    scenario
        .drain("after the thaw", Duration::from_secs(30))
        .await;
    scenario.stop_relays(Duration::from_secs(20));
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_relay_gives_its_shards_back_within_two_minutes() {
    let name = unique("frozen");
    let (postgres, mysql) = (format!("{name}_pg"), format!("{name}_my"));
    tokio::join!(
        async {
            let store = Arc::new(PostgresSide::open(&postgres).await);
            takes_over_from_a_frozen_relay(store, &postgres).await;
        },
        async {
            let store = Arc::new(MySqlSide::open(&mysql).await);
            takes_over_from_a_frozen_relay(store, &mysql).await;
        },
    );
}
