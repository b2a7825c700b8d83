//! `outbox-relay replay` end to end, on PostgreSQL and on MySQL/MariaDB → Redis Streams: with
//! `relay.retention` keeping published rows, the events of a window and an aggregate are counted,
//! refused without `--yes`, then published again by the running relay, in their order, with
//! their event ids; a window with nothing in it sends nothing, and a table whose retention
//! deletes says why nothing is kept.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

on_each_sql_store!(
    replay_round_trip,
    "replay",
    postgres_kept_events_are_replayed_from_the_cli,
    mysql_kept_events_are_replayed_from_the_cli
);

async fn replay_round_trip(name: &str, store: Arc<dyn StoreSide>) {
    let relay = "retention = \"7d\"\nstatus_interval = \"200ms\"";
    let (redis, mut scenario, port) = RedisSide::scenario(name, store, relay).await;
    let stream = redis.destination("order");
    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let events = [
        event("A", 1),
        event("B", 1),
        event("A", 2),
        event("B", 2),
        event("A", 3),
    ];
    scenario.store.enqueue_many(&events).await;
    let (ok, out, err) = scenario.cli(&["status"]);
    assert!(
        ok && out.contains("\nkept                 none\n"),
        "{out}{err}"
    );
    assert_eq!(scenario.status()["oldest_kept_at"], serde_json::Value::Null);
    scenario.start_relay("relay-replay", &[]);
    let stream_holds = |n: u64| {
        let (redis, stream) = (redis.clone(), stream.clone());
        move || {
            let (redis, stream) = (redis.clone(), stream.clone());
            async move { redis.stream_len(&stream).await == n }
        }
    };
    wait_for(
        "5 events in the stream",
        Duration::from_secs(30),
        stream_holds(5),
    )
    .await;
    let first = redis.read_stream(&stream).await;
    let a_ids: Vec<_> = first
        .iter()
        .filter(|m| m.aggregate_id == "A")
        .map(|m| m.event_id)
        .collect();
    assert_eq!(a_ids.len(), 3);
    // How far back a replay reaches: the first publication, a moment ago.
    let kept = scenario.status_line("kept                 published since ");
    assert!(
        kept.contains(" UTC, ") && kept.contains("s ago (what `outbox-relay replay` can publish"),
        "{kept}"
    );
    let since = scenario.status()["oldest_kept_at"]
        .as_str()
        .map(|t| t.parse::<chrono::DateTime<chrono::Utc>>())
        .unwrap_or_else(|| panic!("no oldest_kept_at in status --json"))
        .expect("an RFC 3339 time");
    let age = chrono::Utc::now() - since;
    assert!(
        age >= chrono::Duration::zero() && age < chrono::Duration::minutes(1),
        "kept since {since}"
    );
    // The same, as the relay's gauge: seconds since that first publication.
    wait_for_metric(
        "the oldest kept event's age",
        port,
        "outbox_oldest_kept_age_seconds",
        Duration::from_secs(10),
        |v| v > 0.0 && v < 60.0,
    )
    .await;

    let (ok, out, err) = scenario.cli(&["replay", "--since", "1h", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("5 kept events of "), "{out}");
    assert!(out.contains("published since "), "{out}");
    // The window starts an hour ago, before the first publication: where the kept events begin.
    assert!(
        out.contains(&format!(
            " (the oldest kept event was published at {}: a replay reaches no further back)",
            since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        )),
        "{out}"
    );

    let aggregate_a = ["replay", "--since", "1h", "--aggregate-id", "A"];
    let (ok, _, err) = scenario.cli(&aggregate_a);
    assert!(!ok, "without --yes nothing is sent");
    assert!(
        err.contains("replay sends 3 kept events of ")
            && err.contains(", of aggregate A to the broker again")
            && err.contains("add --yes to confirm"),
        "{err}"
    );
    let (ok, out, err) = scenario.cli(&[&aggregate_a[..], &["--yes"]].concat());
    assert!(ok, "{err}");
    assert!(
        out.starts_with("3 kept events published since ")
            && out.contains("back to pending: the relay publishes them again"),
        "{out}"
    );
    wait_for(
        "A's 3 events again",
        Duration::from_secs(30),
        stream_holds(8),
    )
    .await;
    let again: Vec<_> = redis.read_stream(&stream).await[5..]
        .iter()
        .map(|m| (m.aggregate_id.clone(), m.event_id))
        .collect();
    let expected: Vec<_> = a_ids.iter().map(|id| ("A".to_owned(), *id)).collect();
    assert_eq!(
        again, expected,
        "A's events again, in order, same event ids"
    );

    let (ok, out, err) = scenario.cli(&["replay", "--since", "3h", "--until", "2h", "--yes"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("0 kept events published since "), "{out}");
    assert!(out.contains("nothing to publish again"), "{out}");

    // The same table as a relay that deletes what it publishes sees it: nothing kept, and why.
    let deleting = [("OUTBOX_RELAY__RETENTION".to_owned(), "delete".to_owned())];
    let (ok, out, err) = run_cli(
        &scenario.config,
        &[
            "replay",
            "--since",
            "1h",
            "--aggregate-id",
            "C",
            "--dry-run",
        ],
        &deleting,
    );
    assert!(ok, "{err}");
    assert!(out.contains("relay.retention is \"delete\""), "{out}");

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(redis.stream_len(&stream).await, 8, "nothing else sent");
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    scenario.cleanup().await;
}
