//! End to end over TLS: PostgreSQL → an `outbox-relay run` process (the full binary, where
//! rustls has both ring and aws-lc-rs and the Redis sink installs ring as the process default)
//! → a private TLS-only Redis that requires a client certificate and a password. The TLS files
//! come from the configuration file, the password from the environment only.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::tls::TestPki;
use outboxkit_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_publishes_to_redis_over_tls_with_a_client_certificate() {
    let name = unique("e2e_tls");
    let pki = TestPki::create(&scratch_dir(&name).join("pki"));
    let server = PrivateRedis::start(&name, &pki, true);
    let redis = Arc::new(server.side(&name).await);
    let password = "e2e-tls-pw";
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(password)
        .query_async(&mut redis.connection())
        .await
        .expect("CONFIG SET requirepass");
    let mut scenario = Scenario::prepare(
        Arc::new(PostgresSide::open(&name).await),
        redis.clone(),
        Settings::default(),
    )
    .await;
    let events: Vec<NewEvent> = (0..120)
        .map(|i| {
            NewEvent::new(
                "order",
                format!("o{}", i % 5),
                "Placed",
                serde_json::json!({ "i": i }),
            )
        })
        .collect();
    scenario.store.enqueue_many(&events).await;

    let relay = scenario.start_relay(
        "relay-tls",
        &[("OUTBOX_SINK__REDIS_STREAMS__PASSWORD", password)],
    );
    scenario
        .drain("120 events published over TLS", Duration::from_secs(60))
        .await;
    scenario.assert_relays_running();
    let entries = redis.entries(&format!("{name}.order")).await;
    let mut got: Vec<u64> = entries
        .iter()
        .map(|e| {
            let payload: serde_json::Value =
                serde_json::from_slice(e.field("payload").expect("payload")).expect("JSON");
            payload["i"].as_u64().expect("i")
        })
        .collect();
    got.sort_unstable();
    got.dedup();
    assert_eq!(got, (0..120).collect::<Vec<u64>>(), "every event arrived");
    let log = scenario.relays[relay].log_text();
    assert!(
        !log.contains(password),
        "the password is in the relay's log"
    );
    scenario.cleanup().await;
}
