//! What only PostgreSQL can show. The cases every store on a server shares (writers'
//! transactions, killed sessions, statement limits, concurrent migrations, plain-SQL writers,
//! connection and configuration errors) are the live cases of the store suite
//! (tests/store_suite.rs).

use crate::common;

use std::time::{Duration, Instant};

use outboxkit_core::testkit::store_suite::{close_live, with_all_shards};
use outboxkit_core::{ClaimRequest, MarkMode, OutboxEvent, ShardSession};
use outboxkit_store_postgres::sqlx;

fn ids(events: &[OutboxEvent]) -> Vec<i64> {
    events.iter().map(|e| e.id).collect()
}

/// A queue table is often claimed from while its statistics are stale: created empty and never
/// analyzed, then a burst arrives (autovacuum behind, or off). The claim must stay an ordered
/// walk of the pending index with a cheap held-back check whatever the planner believes; it
/// once took 4–6 s per claim at 30,000 pending rows, so the relay fell behind its writers.
#[tokio::test]
async fn claims_stay_fast_on_a_backlog_whose_statistics_are_stale() {
    const PENDING: i64 = 30_000;
    const BATCH: usize = 500;
    let store = common::SERVER.migrated(common::fresh_config()).await;
    let t = store.table().quoted();
    // Whatever the server's autovacuum does, this table keeps the statistics it was born with.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {t} SET (autovacuum_enabled = false)"
    )))
    .execute(store.pool())
    .await
    .expect("turning autovacuum off for the table");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'agg-' || (g % 1000), 'OrderChanged', \
                jsonb_build_object('n', g, 'pad', repeat('x', 250)) \
         FROM generate_series(1, $1) g"
    )))
    .bind(PENDING)
    .execute(store.pool())
    .await
    .expect("inserting the backlog");
    // Three aggregates wait for a retry an hour away: their later rows are held back.
    let retrying: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE {t} SET attempts = 1, next_attempt_at = now() + interval '1 hour' \
         WHERE id IN (SELECT id FROM {t} ORDER BY id OFFSET 2 LIMIT 3) RETURNING id"
    )))
    .fetch_all(store.pool())
    .await
    .expect("marking rows as retrying");
    assert_eq!(retrying.len(), 3);
    let held: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT aggregate_id FROM {t} WHERE id = ANY($1)"
    )))
    .bind(&retrying)
    .fetch_all(store.pool())
    .await
    .unwrap();

    let mut session = with_all_shards(
        store
            .open_postgres_session("stale-statistics")
            .await
            .expect("open session"),
    )
    .await;
    // Ten claims, marked as the relay marks them: PostgreSQL plans the first five for their
    // parameters and may then switch to a generic plan; both must be fast.
    let mut slowest = Duration::ZERO;
    for _ in 0..10 {
        let started = Instant::now();
        let events = session
            .claim(&ClaimRequest {
                limit: BATCH,
                exclude_ids: &[],
                dead_holds_aggregate: false,
            })
            .await
            .expect("claim");
        slowest = slowest.max(started.elapsed());
        assert_eq!(events.len(), BATCH);
        for e in &events {
            assert!(
                !held.contains(&e.aggregate_id),
                "row {} of held-back aggregate {} was claimed",
                e.id,
                e.aggregate_id
            );
        }
        session
            .mark_published(&ids(&events), MarkMode::Delete)
            .await
            .expect("mark");
    }
    println!("slowest of 10 claims of {BATCH} rows at {PENDING} pending rows: {slowest:?}");
    assert!(
        slowest < Duration::from_millis(250),
        "a claim of {BATCH} rows took {slowest:?} at {PENDING} pending rows with stale statistics"
    );
    close_live(session).await;
    common::drop_table(store.table()).await;
}
