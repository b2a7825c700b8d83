//! Dead letters from the CLI, end to end on PostgreSQL and on MySQL/MariaDB → Redis Streams:
//! an event the broker refuses lands dead and holds its aggregate (`on_dead = "hold"`), is
//! listed, retried once the cause is fixed, and then published in order with its aggregate.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

const TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

fn n_of(m: &Delivered) -> i64 {
    serde_json::from_slice::<serde_json::Value>(&m.payload).unwrap()["n"]
        .as_i64()
        .unwrap()
}

on_each_sql_store!(
    round_trip,
    "dead",
    postgres_dead_event_is_listed_retried_and_published_in_order,
    mysql_dead_event_is_listed_retried_and_published_in_order
);

async fn round_trip(name: &str, store: Arc<dyn StoreSide>) {
    let relay = "on_dead = \"hold\"\nstatus_interval = \"200ms\"";
    let (redis, mut scenario, port) = RedisSide::scenario(name, store, relay).await;
    let stream = redis.destination("order");
    let poison = format!("{name}.poison");
    // A plain string where the stream should be: XADD answers WRONGTYPE → rejected → dead.
    let _: () = redis::cmd("SET")
        .arg(&poison)
        .arg("not a stream")
        .query_async(&mut redis.connection())
        .await
        .unwrap();

    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let mut events = vec![
        event("A", 1),
        event("A", 2)
            .destination(poison.clone())
            .header("traceparent", TRACEPARENT),
        // A3 and A4 go where A2 goes: one stream shows the aggregate's order after the retry.
        event("A", 3).destination(poison.clone()),
        event("A", 4).destination(poison.clone()),
        event("C", 1).destination(poison.clone()),
    ];
    events.extend((1..=5).map(|n| event("B", n)));
    let ids = scenario.store.enqueue_many(&events).await;
    let (a2, c1) = (ids[1], ids[4]);

    scenario.start_relay("relay-dead", &[]);
    let dead_listed = |scenario: &Scenario| {
        let (ok, json, _) = scenario.cli(&["dead", "list", "--json"]);
        ok && serde_json::from_str::<Vec<serde_json::Value>>(&json).is_ok_and(|v| v.len() == 2)
    };
    wait_for(
        "A1 and B1..B5 published, A2 and C1 dead",
        Duration::from_secs(30),
        || {
            let listed = dead_listed(&scenario);
            async move { listed }
        },
    )
    .await;
    wait_for("6 events in the stream", Duration::from_secs(30), || {
        let (redis, stream) = (redis.clone(), stream.clone());
        async move { redis.stream_len(&stream).await == 6 }
    })
    .await;
    // Held: A3 and A4 wait behind the dead A2.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = redis.read_stream(&stream).await;
    let a: Vec<i64> = delivered
        .iter()
        .filter(|m| m.aggregate_id == "A")
        .map(n_of)
        .collect();
    assert_eq!(a, vec![1], "A3 and A4 are held behind the dead A2");
    // Never even attempted: they would have failed (WRONGTYPE) and be dead too.
    let (_, json, _) = scenario.cli(&["dead", "list", "--json"]);
    assert_eq!(
        serde_json::from_str::<Vec<serde_json::Value>>(&json)
            .unwrap()
            .len(),
        2,
        "{json}"
    );

    let (ok, text, err) = scenario.cli(&["dead", "list"]);
    assert!(ok, "{err}");
    assert!(
        text.contains(&a2.to_string()) && text.contains("order/A"),
        "{text}"
    );
    assert!(text.contains("dead since (UTC)"), "the times' zone: {text}");
    // --limit: a note only when rows were left out; 0 is refused.
    let rows = |text: &str| text.lines().filter(|l| l.contains(" order/")).count();
    let (ok, text, err) = scenario.cli(&["dead", "list", "--limit", "1"]);
    assert!(
        ok && rows(&text) == 1 && text.contains("order/A"),
        "{text}{err}"
    );
    assert!(text.contains("there are more: raise --limit"), "{text}");
    let (ok, text, err) = scenario.cli(&["dead", "list", "--limit", "2"]);
    assert!(ok && rows(&text) == 2, "{text}{err}");
    assert!(
        !text.contains("there are more"),
        "nothing was left out: {text}"
    );
    let (ok, json, _) = scenario.cli(&["dead", "list", "--limit", "1", "--json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert!(ok && listed.len() == 1, "{json}");
    let (ok, _, err) = scenario.cli(&["dead", "list", "--limit", "0"]);
    assert!(!ok && err.contains("--limit"), "{err}");
    assert!(
        text.contains("WRONGTYPE") || text.to_lowercase().contains("wrong"),
        "the broker's error is recorded:\n{text}"
    );
    let (ok, json, _) = scenario.cli(&["dead", "list", "--aggregate-id", "A", "--json"]);
    assert!(ok);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], a2);
    assert_eq!(listed[0]["attempts"], 1, "a rejection is not retried");

    // `events` finds the aggregate's rows in every state, newest first: A4 and A3 pending
    // behind the dead A2; A1 was published and its row deleted (retention "delete").
    let (ok, json, err) = scenario.cli(&["events", "--aggregate-id", "A", "--json"]);
    assert!(ok, "{err}");
    let found: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let states: Vec<(i64, &str)> = found
        .iter()
        .map(|e| (e["id"].as_i64().unwrap(), e["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        vec![(ids[3], "pending"), (ids[2], "pending"), (a2, "dead")],
        "{json}"
    );
    assert_eq!(found[2]["destination"], poison.as_str(), "{json}");
    let (ok, text, err) = scenario.cli(&["events", "--aggregate-id", "A", "--limit", "2"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("state (UTC)") && text.contains("pending"),
        "{text}"
    );
    assert!(text.contains("there are more: raise --limit"), "{text}");
    let dead_id = found[2]["event_id"].as_str().unwrap().to_owned();
    let (ok, text, err) = scenario.cli(&["events", "--event-id", &dead_id]);
    assert!(ok, "{err}");
    assert!(
        text.contains(&dead_id) && text.contains("dead since ") && text.contains("order/A"),
        "{text}"
    );
    assert!(
        !text.contains("payload") && found.iter().all(|e| e.get("payload_type").is_none()),
        "no payload unless asked for: {text}{json}"
    );
    // --payload: what the broker refused, payload and headers, under the row and in JSON.
    let (ok, text, err) = scenario.cli(&["events", "--event-id", &dead_id, "--payload"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "heading, row, payload, headers:\n{text}");
    // The document as the database renders it: `{"n": 2}` on PostgreSQL, `{"n":2}` on MariaDB.
    let (label, document) = lines[2].trim_start().split_once("): ").unwrap();
    assert_eq!(
        label,
        format!("payload (json, {} bytes", document.len()),
        "{text}"
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(document).unwrap(),
        serde_json::json!({ "n": 2 }),
        "{text}"
    );
    assert_eq!(
        lines[3].trim_start(),
        format!(r#"headers: {{"traceparent":"{TRACEPARENT}"}}"#),
        "{text}"
    );
    let (ok, json, err) = scenario.cli(&["events", "--aggregate-id", "A", "--payload", "--json"]);
    assert!(ok, "{err}");
    let with: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let contents: Vec<(&str, serde_json::Value, usize)> = with
        .iter()
        .map(|e| {
            let headers = e["headers"].as_object().unwrap().len();
            (
                e["payload_type"].as_str().unwrap(),
                e["payload"].clone(),
                headers,
            )
        })
        .collect();
    assert_eq!(
        contents,
        vec![
            ("json", serde_json::json!({ "n": 4 }), 0),
            ("json", serde_json::json!({ "n": 3 }), 0),
            ("json", serde_json::json!({ "n": 2 }), 1),
        ],
        "{json}"
    );
    assert_eq!(with[2]["headers"]["traceparent"], TRACEPARENT, "{json}");
    assert_eq!(
        (with[2]["id"].as_i64(), &with[2]["state"]),
        (Some(a2), &found[2]["state"])
    );
    // The dead list shows them too, with --payload.
    let (ok, json, err) = scenario.cli(&["dead", "list", "--payload", "--json"]);
    assert!(ok, "{err}");
    let dead: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    let listed = dead.iter().find(|d| d["id"] == a2).expect("A2 is listed");
    assert_eq!(listed["payload"], serde_json::json!({ "n": 2 }), "{json}");
    assert_eq!(
        (&listed["payload_type"], &listed["headers"]["traceparent"]),
        (&serde_json::json!("json"), &serde_json::json!(TRACEPARENT)),
        "{json}"
    );
    let (ok, text, err) = scenario.cli(&["dead", "list", "--aggregate-id", "A", "--payload"]);
    assert!(
        ok && text
            .lines()
            .nth(2)
            .is_some_and(|l| l.trim_start().starts_with("payload (json, "))
            && text.contains(&format!(r#"headers: {{"traceparent":"{TRACEPARENT}"}}"#)),
        "{text}{err}"
    );
    let unknown = uuid::Uuid::new_v4().to_string();
    let (ok, text, err) = scenario.cli(&["events", "--event-id", &unknown]);
    assert!(
        ok && text.starts_with(&format!("no event {unknown}: "))
            && text.contains("relay.retention = \"delete\""),
        "{text}{err}"
    );
    let (ok, _, err) = scenario.cli(&["events", "--event-id", "not-a-uuid"]);
    assert!(!ok && err.contains("--event-id"), "{err}");

    // Discard needs a confirmation.
    let (ok, _, err) = scenario.cli(&["dead", "discard", &c1.to_string()]);
    assert!(!ok && err.contains("--yes"), "{err}");
    // So does discarding them all, which says what it would delete; only the aggregate given
    // (B has no dead event) loses its dead events.
    let (ok, _, err) = scenario.cli(&["dead", "discard", "--all", "--aggregate-id", "B"]);
    assert!(
        !ok && err.contains("deletes every dead event of aggregate B")
            && err.contains("dead list --aggregate-id B` shows them")
            && err.contains("add --yes"),
        "{err}"
    );
    let (ok, out, err) =
        scenario.cli(&["dead", "discard", "--all", "--aggregate-id", "B", "--yes"]);
    assert!(ok && out.contains("0 dead events discarded"), "{out}{err}");
    assert!(dead_listed(&scenario), "A2 and C1 are still dead");
    let (ok, out, err) = scenario.cli(&["dead", "discard", &c1.to_string(), "--yes"]);
    assert!(ok && out.contains("1 dead event discarded"), "{out}{err}");
    // An id that is no dead event (discarded already, or mistyped) is an error, not a quiet 0.
    let c1_id = c1.to_string();
    for args in [
        &["dead", "discard", &c1_id, "--yes"][..],
        &["dead", "retry", &c1_id],
    ] {
        let (ok, out, err) = scenario.cli(args);
        assert!(
            !ok && out.starts_with("0 dead events ")
                && err.contains(&format!("id {c1} is not a dead event of "))
                && err.contains("`outbox-relay dead list` shows the dead ones"),
            "{args:?}: {out}{err}"
        );
    }

    // Fix the cause, retry: A2 goes out, then A3 and A4, in order.
    redis.delete(std::slice::from_ref(&poison)).await;
    let (ok, out, err) = scenario.cli(&["dead", "retry", &a2.to_string()]);
    assert!(
        ok && out.starts_with("1 dead event back to pending"),
        "{out}{err}"
    );
    wait_for("A2..A4 published", Duration::from_secs(30), || {
        let (redis, poison) = (redis.clone(), poison.clone());
        async move { redis.stream_len(&poison).await == 3 }
    })
    .await;
    let main = redis.read_stream(&stream).await;
    let poisoned = redis.read_stream(&poison).await;
    assert_eq!(main.len(), 6, "A1 and B1..B5, once each");
    let order: Vec<(String, i64)> = poisoned
        .iter()
        .map(|m| (m.aggregate_id.clone(), n_of(m)))
        .collect();
    assert_eq!(
        order,
        vec![
            ("A".to_owned(), 2),
            ("A".to_owned(), 3),
            ("A".to_owned(), 4)
        ],
        "the retried A2 went out first, then the events held behind it, in order"
    );

    let status = scenario.status();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["dead"], 0, "{status}");
    // What the relay exports is what the README's Metrics table says, name, type and labels:
    // an alert written from the table finds its series.
    let seen = scrape_documented(port);
    for metric in [
        "outbox_events_published_total",
        "outbox_events_dead_total",
        "outbox_pending_events",
        "outbox_dead_events",
        "outbox_commit_to_ack_seconds",
        "outbox_shards_owned",
        "outbox_paused",
    ] {
        assert!(seen.contains(metric), "{metric} not exported: {seen:?}");
    }

    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "{}", relay.log_text());
    redis.delete(&[stream, poison]).await;
    scenario.cleanup().await;
}
