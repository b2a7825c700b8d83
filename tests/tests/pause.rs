//! `outbox-relay pause` and `resume` end to end, on PostgreSQL and on MySQL/MariaDB → Redis
//! Streams: a relay started on a paused table takes its shards and publishes nothing, stays
//! ready and says so on `outbox_paused`; `status` shows who paused it and why; `resume` lets it
//! publish every event, each aggregate's in order; a pause made while it runs stops it within a
//! rebalance, and what is written meanwhile waits. With log-based capture too.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::NewEvent;
use outboxkit_harness::*;

on_each_sql_store!(
    pause_round_trip,
    "pause",
    postgres_a_paused_table_waits_for_resume,
    mysql_a_paused_table_waits_for_resume
);

/// Log-based capture (table style, on a cluster of the test's own): the relay reads the slot and
/// holds what it read while paused; the server keeps the log meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_logical_a_paused_table_waits_for_resume() {
    let name = unique("pause");
    let server = PrivatePostgres::start_logical(&name);
    let side = Arc::new(LogicalSide::open(&server, &name, "table").await);
    pause_round_trip(&name, side).await;
}

/// `n` events of each of aggregates `A`..`D`, numbered from `from`.
fn events(from: u32, n: u32) -> Vec<NewEvent> {
    (from..from + n)
        .flat_map(|i| {
            ["A", "B", "C", "D"]
                .map(|agg| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": i })))
        })
        .collect()
}

/// Wait until the relay listening on `port` says `outbox_paused` `value`.
async fn paused_gauge(port: u16, value: f64) {
    let what = format!("outbox_paused = {value}");
    let timeout = Duration::from_secs(10);
    wait_for_metric(&what, port, "outbox_paused", timeout, |v| v == value).await;
}

async fn pause_round_trip(name: &str, store: Arc<dyn StoreSide>) {
    let (redis, mut scenario, port) = RedisSide::scenario(name, store, "").await;
    let stream = redis.destination("order");
    let stream_len = || {
        let (redis, stream) = (redis.clone(), stream.clone());
        async move { redis.stream_len(&stream).await }
    };

    let (ok, out, err) = scenario.cli(&["status"]);
    assert!(ok && !out.contains("PAUSED"), "{out}{err}");
    assert_eq!(scenario.status()["paused"], serde_json::Value::Null);
    let (ok, out, err) = scenario.cli(&["resume"]);
    assert!(ok && out.starts_with("was not paused: "), "{out}{err}");

    let pause = [
        "pause",
        "--reason",
        "consumer fix, INC-42",
        "--by",
        "ops@test",
    ];
    let (ok, out, err) = scenario.cli(&pause);
    assert!(ok, "{err}");
    let store = out
        .strip_prefix("paused ")
        .and_then(|rest| rest.split_once(" (since "))
        .map(|(store, _)| store.to_owned())
        .unwrap_or_else(|| panic!("pause said: {out}"));
    assert!(
        out.trim_end()
            .ends_with(" UTC by ops@test: consumer fix, INC-42)"),
        "{out}"
    );
    // A second pause keeps the first: its time, who, why.
    let (ok, again, err) = scenario.cli(&["pause", "--reason", "other", "--by", "someone"]);
    assert!(ok, "{err}");
    assert_eq!(
        again.replacen("already paused ", "paused ", 1),
        out,
        "the first pause holds"
    );
    let line = scenario.status_line("PAUSED               since ");
    assert!(
        line.ends_with(
            " UTC by ops@test: consumer fix, INC-42: no relay publishes until `outbox-relay resume`"
        ),
        "{line}"
    );
    // `check` passes (`run` can relay the table) and says it is paused.
    let (ok, out, err) = scenario.cli(&["check"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.lines().next().is_some_and(|l| l.starts_with("store: ok: ")
            && l.ends_with(" UTC by ops@test: consumer fix, INC-42: no relay publishes until `outbox-relay resume`")
            && l.contains("; PAUSED since ")),
        "{out}"
    );
    let (ok, out, err) = scenario.cli(&["check", "--json"]);
    assert!(ok, "{err}");
    let check: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        check["pipelines"]["default"]["stores"][0]["paused"]["by"], "ops@test",
        "{check}"
    );
    let status = scenario.status();
    assert_eq!(status["paused"]["by"], "ops@test", "{status}");
    assert_eq!(status["paused"]["reason"], "consumer fix, INC-42");

    // Started paused: it takes its shards (or the slot) and is ready, and publishes nothing.
    scenario.store.enqueue_many(&events(0, 10)).await;
    scenario.start_relay("relay-paused", &[]);
    wait_for_ready("the paused relay", port, 200, Duration::from_secs(30)).await;
    paused_gauge(port, 1.0).await;
    assert!(scrape_documented(port).contains("outbox_paused"));
    let (_, ready) = http_get(port, "/readyz").expect("/readyz");
    assert!(
        ready.starts_with("default: ready, ")
            && ready
                .ends_with(" shards owned, paused by an operator (`status` says who and why)\n"),
        "{ready}"
    );
    wait_for(
        "shards (or the slot) taken",
        Duration::from_secs(30),
        || {
            let owned = scenario.status()["shards_owned"].as_u64().unwrap_or(0);
            async move { owned > 0 }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stream_len().await, 0, "published while paused");
    assert_eq!(scenario.status()["pending"], 40);

    let (ok, out, err) = scenario.cli(&["resume"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("resumed {store} (paused since "))
            && out
                .trim_end()
                .ends_with(" UTC by ops@test: consumer fix, INC-42)"),
        "{out}"
    );
    wait_for("40 events", Duration::from_secs(30), || {
        let len = stream_len();
        async move { len.await == 40 }
    })
    .await;
    paused_gauge(port, 0.0).await;
    let (_, ready) = http_get(port, "/readyz").expect("/readyz");
    assert!(ready.ends_with(" shards owned\n"), "{ready}");
    let (ok, out, _) = scenario.cli(&["check", "--json"]);
    let check: serde_json::Value = serde_json::from_str(&out).unwrap();
    let store = &check["pipelines"]["default"]["stores"][0];
    assert!(ok && store.get("paused").is_none(), "{check}");

    // Paused while it runs: within a rebalance it stops, and what is written then waits.
    let (ok, _, err) = scenario.cli(&["pause"]);
    assert!(ok, "{err}");
    paused_gauge(port, 1.0).await;
    scenario.store.enqueue_many(&events(10, 5)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(stream_len().await, 40, "published while paused");
    let (ok, out, err) = scenario.cli(&["status"]);
    assert!(ok, "{err}");
    assert!(
        out.contains(" UTC by ") && out.contains("PAUSED               since "),
        "a pause without --reason: {out}"
    );
    let (ok, _, err) = scenario.cli(&["resume"]);
    assert!(ok, "{err}");
    wait_for("60 events", Duration::from_secs(30), || {
        let len = stream_len();
        async move { len.await == 60 }
    })
    .await;

    // Every event once, each aggregate's in order.
    let delivered = redis.read_stream(&stream).await;
    for agg in ["A", "B", "C", "D"] {
        let numbers: Vec<u64> = delivered
            .iter()
            .filter(|m| m.aggregate_id == agg)
            .map(|m| {
                let payload: serde_json::Value = serde_json::from_slice(&m.payload).unwrap();
                payload["n"].as_u64().unwrap()
            })
            .collect();
        assert_eq!(numbers, (0..15).collect::<Vec<_>>(), "aggregate {agg}");
    }
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    let log = relay.log_text();
    assert!(exit.success(), "exit {exit}; log:\n{log}");
    assert!(
        log.contains(
            "paused by an operator: claiming and publishing nothing until `outbox-relay resume`"
        ) && log.contains("ops@test")
            && log.contains("the pause is lifted: relaying again"),
        "{log}"
    );
    assert_no_error_lines("relay-paused", &log);
    scenario.cleanup().await;
}
