//! `outbox-relay status`, end to end on PostgreSQL and on MySQL/MariaDB: an aggregate held back
//! behind an event that waits for a retry is named, with the row, its attempts, its next try,
//! how many events wait behind it and the broker's last error, as text and as JSON; beyond the
//! 20 listed, how many more are held back; once the retries went out none is named.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::{ClaimRequest, Failure, MarkMode, NewEvent};
use outboxkit_harness::*;

on_each_sql_store!(
    held_back_round_trip,
    "held",
    postgres_status_names_each_held_back_aggregate,
    mysql_status_names_each_held_back_aggregate
);

async fn held_back_round_trip(name: &str, side: Arc<dyn StoreSide>) {
    let (_redis, scenario, _port) = RedisSide::scenario(name, side.clone(), "").await;
    let event =
        |agg: &str, n: u32| NewEvent::new("order", agg, "Changed", serde_json::json!({ "n": n }));
    let ids = side
        .enqueue_many(&[event("A", 1), event("A", 2), event("A", 3), event("B", 1)])
        .await;
    // A relay's session: A's first event fails, to be tried again in an hour; B's goes out.
    let store = side.connect_store(32, 1).await;
    let mut session = store.open_session("relay-held").await.expect("a session");
    for shard in 0..session.shard_count() as i32 {
        assert!(session.try_acquire(shard).await.expect("taking a shard"));
    }
    let request = ClaimRequest {
        limit: 100,
        exclude_ids: &[],
        dead_holds_aggregate: false,
    };
    let claimed = session.claim(&request).await.expect("claiming");
    assert_eq!(claimed.len(), 4, "{claimed:?}");
    let slow_down = |&id: &i64| Failure {
        id,
        error: "the broker asked to slow down".to_owned(),
        retry_in: Some(Duration::from_secs(3600)),
    };
    session
        .record_failures(&[slow_down(&ids[0])])
        .await
        .expect("recording the failure");
    session
        .mark_published(&[ids[3]], MarkMode::Delete)
        .await
        .expect("marking B's");

    let status = scenario.status();
    let held = &status["held_back"];
    let next_try = held[0]["next_attempt_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("a next attempt time: {held}"));
    let from_now = next_try.with_timezone(&chrono::Utc) - chrono::Utc::now();
    assert!(
        from_now > chrono::Duration::minutes(59) && from_now <= chrono::Duration::minutes(60),
        "the next try, an hour after the failure: {next_try}"
    );
    assert_eq!(
        *held,
        serde_json::json!([{
            "aggregate_type": "order",
            "aggregate_id": "A",
            "id": ids[0],
            "attempts": 1,
            "next_attempt_at": held[0]["next_attempt_at"],
            "last_error": "the broker asked to slow down",
            "waiting_behind": 2,
        }]),
        "status --json"
    );
    assert_eq!(
        scenario.status_line("retrying             "),
        "1 event in 1 held-back aggregate"
    );
    assert_eq!(
        scenario.status_line("  held back "),
        format!(
            "order/A: row {} after 1 attempt, next try {} UTC, 2 waiting behind; the broker \
             asked to slow down",
            ids[0],
            next_try.format("%Y-%m-%d %H:%M:%S")
        )
    );

    // 21 more aggregates held back: the 20 waiting longest are listed, and how many are not.
    let more: Vec<NewEvent> = (1..=21).map(|n| event(&format!("C{n}"), 1)).collect();
    let more = side.enqueue_many(&more).await;
    let claimed = session.claim(&request).await.expect("claiming");
    assert_eq!(claimed.len(), 21, "the new aggregates' events: {claimed:?}");
    let failures: Vec<Failure> = more.iter().map(slow_down).collect();
    session
        .record_failures(&failures)
        .await
        .expect("recording the failures");
    let held = &scenario.status()["held_back"];
    let listed: Vec<i64> = (0..20).filter_map(|i| held[i]["id"].as_i64()).collect();
    let longest: Vec<i64> = ids[..1].iter().chain(&more[..19]).copied().collect();
    assert_eq!(listed, longest, "{held}");
    assert_eq!(held.as_array().map(Vec::len), Some(20));
    assert_eq!(
        scenario.status_line("retrying             "),
        "22 events in 22 held-back aggregates"
    );
    assert_eq!(
        scenario.status_line("  and "),
        "2 more held-back aggregates (the 20 waiting longest are listed)"
    );

    // The retries go out: nothing is held back.
    let first: Vec<i64> = ids[..1].iter().chain(&more).copied().collect();
    session
        .mark_published(&first, MarkMode::Delete)
        .await
        .expect("marking the retried events");
    assert_eq!(scenario.status()["held_back"], serde_json::json!([]));
    assert_eq!(
        scenario.status_line("retrying             "),
        "0 events in 0 held-back aggregates"
    );
    session.close().await.expect("closing the session");
    scenario.cleanup().await;
}
