//! Dead letters from the CLI, end to end on PostgreSQL and on MySQL/MariaDB → Redis Streams:
//! an event the broker refuses lands dead and holds its aggregate (`on_dead = "hold"`), is
//! listed, retried once the cause is fixed, and then published in order with its aggregate.

use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_tests::*;

#[derive(Clone, Copy)]
enum Db {
    Postgres,
    MySql,
}

impl Db {
    fn config(self, table: &str, template: &str) -> String {
        let extra = "on_dead = \"hold\"\nstatus_interval = \"200ms\"";
        match self {
            Db::Postgres => postgres_redis_config(table, template, "", extra),
            Db::MySql => mysql_redis_config(&mysql_url(), table, template, "", extra),
        }
    }

    async fn enqueue(self, table: &str, events: &[NewEvent]) -> Vec<i64> {
        match self {
            Db::Postgres => {
                let pool = postgres_pool().await;
                let mut conn = pool.acquire().await.unwrap();
                outboxkit_store_postgres::Outbox::new(table)
                    .unwrap()
                    .enqueue_many(&mut conn, events)
                    .await
                    .unwrap()
            }
            Db::MySql => {
                let pool = mysql_pool(&mysql_url()).await;
                let mut tx = pool.begin().await.unwrap();
                let ids = outboxkit_store_mysql::Outbox::new(table)
                    .unwrap()
                    .enqueue_many(&mut tx, events)
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                ids
            }
        }
    }

    async fn drop_table(self, table: &str) {
        match self {
            Db::Postgres => {
                sqlx::query(&format!("DROP TABLE {table}"))
                    .execute(&postgres_pool().await)
                    .await
                    .unwrap();
            }
            Db::MySql => {
                sqlx::query(&format!("DROP TABLE {table}"))
                    .execute(&mysql_pool(&mysql_url()).await)
                    .await
                    .unwrap();
            }
        }
    }
}

fn n_of(m: &StreamMessage) -> i64 {
    serde_json::from_str::<serde_json::Value>(&m.payload).unwrap()["n"]
        .as_i64()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_dead_event_is_listed_retried_and_published_in_order() {
    round_trip(Db::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_dead_event_is_listed_retried_and_published_in_order() {
    round_trip(Db::MySql).await;
}

async fn round_trip(db: Db) {
    let table = unique("dead");
    let prefix = unique("dead");
    let stream = format!("{prefix}.order");
    let poison = format!("{prefix}.poison");
    let dir = scratch_dir(&table);
    let config = write_file(
        &dir,
        "relay.toml",
        &db.config(&table, &format!("{prefix}.{{aggregate_type}}")),
    );
    let (ok, out, err) = run_cli(&config, &["migrate"]);
    assert!(ok, "migrate failed: {out}{err}");
    let mut redis = redis_connection().await;
    // A plain string where the stream should be: XADD answers WRONGTYPE → rejected → dead.
    let _: () = redis::cmd("SET")
        .arg(&poison)
        .arg("not a stream")
        .query_async(&mut redis)
        .await
        .unwrap();

    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let mut events = vec![
        event("A", 1),
        event("A", 2).destination(poison.clone()),
        // A3 and A4 go where A2 goes: one stream shows the aggregate's order after the retry.
        event("A", 3).destination(poison.clone()),
        event("A", 4).destination(poison.clone()),
        event("C", 1).destination(poison.clone()),
    ];
    events.extend((1..=5).map(|n| event("B", n)));
    let ids = db.enqueue(&table, &events).await;
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
    let a: Vec<i64> = delivered
        .iter()
        .filter(|m| m.aggregate_id == "A")
        .map(n_of)
        .collect();
    assert_eq!(a, vec![1], "A3 and A4 are held behind the dead A2");
    // Never even attempted: they would have failed (WRONGTYPE) and be dead too.
    let (_, json, _) = run_cli(&config, &["dead", "list", "--json"]);
    assert_eq!(
        serde_json::from_str::<Vec<serde_json::Value>>(&json)
            .unwrap()
            .len(),
        2,
        "{json}"
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
        let poison = poison.clone();
        async move {
            redis::cmd("XLEN")
                .arg(&poison)
                .query_async::<u64>(&mut redis)
                .await
                .unwrap_or(0)
                == 3
        }
    })
    .await;
    let main = read_streams(&mut redis, std::slice::from_ref(&stream)).await;
    let poisoned = read_streams(&mut redis, std::slice::from_ref(&poison)).await;
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
    db.drop_table(&table).await;
}
