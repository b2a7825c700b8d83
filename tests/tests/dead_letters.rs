//! Dead letters from the CLI, end to end on PostgreSQL → Redis Streams: an event the broker
//! refuses lands dead and holds its aggregate (`on_dead = "hold"`), is listed, retried once
//! the cause is fixed, and then published in order with its aggregate.

use std::time::Duration;

use outbox_core::NewEvent;
use outbox_store_postgres::Outbox;
use outbox_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_event_is_listed_retried_and_published_in_order() {
    let table = unique("dead");
    let prefix = unique("dead");
    let stream = format!("{prefix}.order");
    let poison = format!("{prefix}.poison");
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &postgres_redis_config(
            &table,
            &format!("{prefix}.{{aggregate_type}}"),
            "",
            "on_dead = \"hold\"\nstatus_interval = \"200ms\"",
        ),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let pool = postgres_pool().await;
    let mut redis = redis_connection().await;
    // A plain string where the stream should be: XADD answers WRONGTYPE → rejected → dead.
    let _: () = redis::cmd("SET")
        .arg(&poison)
        .arg("not a stream")
        .query_async(&mut redis)
        .await
        .unwrap();

    let outbox = Outbox::new(&table).unwrap();
    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let mut events = vec![
        event("A", 1),
        event("A", 2).destination(poison.clone()),
        event("A", 3),
        event("A", 4),
        event("C", 1).destination(poison.clone()),
    ];
    events.extend((1..=5).map(|n| event("B", n)));
    let mut conn = pool.acquire().await.unwrap();
    let ids = outbox.enqueue_many(&mut conn, &events).await.unwrap();
    drop(conn);
    let (a2, c1) = (ids[1], ids[4]);

    let mut relay = RelayProcess::start(&config, &dir, "relay-dead");
    wait_for(
        "A1 and B1..B5 published, A2 and C1 dead",
        Duration::from_secs(30),
        || {
            let config = config.clone();
            async move {
                let (ok, json, _) = run_cli(&config, &["dead", "list", "--json"]);
                ok && serde_json::from_str::<Vec<serde_json::Value>>(&json)
                    .map(|v| v.len() == 2)
                    .unwrap_or(false)
            }
        },
    )
    .await;
    wait_for("6 events in the stream", Duration::from_secs(30), || {
        let mut redis = redis.clone();
        let stream = stream.clone();
        async move {
            redis::cmd("XLEN")
                .arg(&stream)
                .query_async::<u64>(&mut redis)
                .await
                .unwrap_or(0)
                == 6
        }
    })
    .await;
    // Held: A3 and A4 wait behind the dead A2.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delivered = read_streams(&mut redis, std::slice::from_ref(&stream)).await;
    let a: Vec<&str> = delivered
        .iter()
        .filter(|m| m.aggregate_id == "A")
        .map(|m| m.payload.as_str())
        .collect();
    assert_eq!(
        a,
        vec![r#"{"n": 1}"#],
        "A3 and A4 are held behind the dead A2"
    );

    let (ok, text, err) = run_cli(&config, &["dead", "list"]);
    assert!(ok, "{err}");
    assert!(
        text.contains(&a2.to_string()) && text.contains("order/A"),
        "{text}"
    );
    assert!(
        text.contains("WRONGTYPE") || text.to_lowercase().contains("wrong"),
        "the broker's error is recorded:\n{text}"
    );
    let (ok, json, _) = run_cli(&config, &["dead", "list", "--aggregate-id", "A", "--json"]);
    assert!(ok);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&json).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], a2);
    assert_eq!(listed[0]["attempts"], 1, "a rejection is not retried");

    // Discard needs a confirmation.
    let (ok, _, err) = run_cli(&config, &["dead", "discard", &c1.to_string()]);
    assert!(!ok && err.contains("--yes"), "{err}");
    let (ok, out, err) = run_cli(&config, &["dead", "discard", &c1.to_string(), "--yes"]);
    assert!(
        ok && out.contains("1 dead event(s) discarded"),
        "{out}{err}"
    );

    // Fix the cause, retry: A2 goes out, then A3 and A4, in order.
    let _: () = redis::cmd("DEL")
        .arg(&poison)
        .query_async(&mut redis)
        .await
        .unwrap();
    let (ok, out, err) = run_cli(&config, &["dead", "retry", &a2.to_string()]);
    assert!(
        ok && out.starts_with("1 dead event(s) back to pending"),
        "{out}{err}"
    );
    wait_for("A2..A4 published", Duration::from_secs(30), || {
        let mut redis = redis.clone();
        let stream = stream.clone();
        async move {
            redis::cmd("XLEN")
                .arg(&stream)
                .query_async::<u64>(&mut redis)
                .await
                .unwrap_or(0)
                == 8
        }
    })
    .await;
    let main = read_streams(&mut redis, std::slice::from_ref(&stream)).await;
    let poisoned = read_streams(&mut redis, std::slice::from_ref(&poison)).await;
    assert_eq!(poisoned.len(), 1, "A2 reached its own destination once");
    // Stream entry ids are server timestamps: comparable across the two streams.
    let entry_id = |m: &StreamMessage| {
        let id = &m.fields["__entry_id"];
        let (ms, seq) = id.split_once('-').unwrap();
        (ms.parse::<u64>().unwrap(), seq.parse::<u64>().unwrap())
    };
    let a1 = main
        .iter()
        .find(|m| m.payload == r#"{"n": 1}"# && m.aggregate_id == "A")
        .unwrap();
    let a3 = main
        .iter()
        .find(|m| m.payload == r#"{"n": 3}"# && m.aggregate_id == "A")
        .unwrap();
    let a4 = main
        .iter()
        .find(|m| m.payload == r#"{"n": 4}"# && m.aggregate_id == "A")
        .unwrap();
    assert!(entry_id(a1) < entry_id(&poisoned[0]));
    assert!(
        entry_id(&poisoned[0]) < entry_id(a3),
        "A3 went out after the retried A2"
    );
    assert!(entry_id(a3) < entry_id(a4));

    let (ok, json, _) = run_cli(&config, &["status", "--json"]);
    assert!(ok);
    let status: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(status["pending"], 0, "{status}");
    assert_eq!(status["dead"], 0, "{status}");

    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "{}", relay.log_text());
    let _: () = redis::cmd("DEL")
        .arg(&stream)
        .arg(&poison)
        .query_async(&mut redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
