//! End to end: PostgreSQL → `outbox-relay run` → RabbitMQ (publisher confirms): unroutable
//! events. (The scenario itself runs in `matrix.rs`.)

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_events_are_never_published_and_end_dead_with_their_error() {
    let name = unique("e2e_rmq");
    let port = free_port();
    let rabbit = Arc::new(RabbitMqSide::open(&name).await);
    // Only orders (and customers) are bound; invoices are unroutable.
    let mut scenario = Scenario::on_postgres(
        &name,
        rabbit.clone(),
        Settings::default()
            .listen_on(port)
            .relay("max_attempts = 3\nstatus_interval = \"200ms\""),
    )
    .await;

    let mut events = Vec::new();
    for i in 0..30 {
        let kind = if i % 3 == 0 { "invoice" } else { "order" };
        events.push(NewEvent::new(
            kind,
            format!("{kind}-{}", i % 7),
            "Changed",
            serde_json::json!({ "i": i }),
        ));
    }
    scenario.store.enqueue_many(&events).await;

    scenario.start_relay("relay-unroutable", &[]);
    scenario
        .drain("every event published or dead", Duration::from_secs(60))
        .await;

    let dead = scenario.store.dead_rows().await;
    assert_eq!(dead.len(), 10, "{dead:?}");
    for row in &dead {
        let error = &row.last_error;
        assert_eq!(row.attempts, 3, "{error}");
        assert!(error.contains("gave up after 3 attempts"), "{error}");
        assert!(error.contains("312 NO_ROUTE"), "{error}");
        assert!(error.contains("routing key `invoice.Changed`"), "{error}");
    }
    let published = scenario.store.count_rows("dead_at IS NULL").await;
    assert_eq!(published, 0, "retention = delete: published rows are gone");

    wait_for_metric(
        "the metrics",
        port,
        "outbox_events_dead_total",
        Duration::from_secs(10),
        |v| v >= 10.0,
    )
    .await;
    let (_, metrics) = http_get(port, "/metrics").unwrap();
    assert_eq!(
        metric_value(&metrics, "outbox_events_published_total"),
        Some(20.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "outbox_events_dead_total"),
        Some(10.0),
        "{metrics}"
    );
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());

    let delivered = rabbit.consume(&rabbit.destination("order")).await;
    assert_eq!(delivered.len(), 20);
    assert!(delivered
        .iter()
        .all(|m| m.meta("routing_key") == "order.Changed"));
    scenario.cleanup().await;
}
