//! What only PostgreSQL can show: transactions of writers, killed backends, concurrent
//! migrations, connection errors, plain-SQL writers.

mod common;

use std::time::{Duration, Instant};

use outboxkit_core::{
    ClaimRequest, ErrorKind, MarkMode, NewEvent, OutboxEvent, ShardSession, Store,
};
use outboxkit_store_postgres::sqlx::{self, Connection, Executor, Row};
use outboxkit_store_postgres::{
    enqueue, enqueue_many, PostgresShardSession, PostgresStore, PostgresStoreConfig, SCHEMA_VERSION,
};
use serde_json::json;

async fn migrated(config: PostgresStoreConfig) -> PostgresStore {
    let store = common::connect(config).await;
    store.migrate().await.expect("migrate");
    store
}

async fn session_with_all_shards(store: &PostgresStore, relay_id: &str) -> PostgresShardSession {
    let mut session = store
        .open_postgres_session(relay_id)
        .await
        .expect("open session");
    outboxkit_core::testkit::store_suite::acquire_all_shards(&mut session).await;
    session
}

async fn claim_all(session: &mut PostgresShardSession) -> outboxkit_core::Result<Vec<OutboxEvent>> {
    session
        .claim(&ClaimRequest {
            limit: 1000,
            exclude_ids: &[],
            dead_holds_aggregate: false,
        })
        .await
}

async fn close(session: PostgresShardSession) {
    Box::new(session).close().await.expect("close session");
}

fn ids(events: &[OutboxEvent]) -> Vec<i64> {
    events.iter().map(|e| e.id).collect()
}

fn event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new("order", aggregate_id, "OrderChanged", json!({ "n": n }))
}

#[tokio::test]
async fn rolled_back_and_uncommitted_rows_are_never_claimed() {
    let store = migrated(common::fresh_config()).await;
    let outbox = store.outbox().clone();
    let mut session = session_with_all_shards(&store, "rollback").await;

    let mut rolled_back = store.pool().begin().await.unwrap();
    outbox
        .enqueue(&mut rolled_back, &event("a", 1))
        .await
        .unwrap();
    rolled_back.rollback().await.unwrap();

    let mut late = store.pool().begin().await.unwrap();
    let late_id = outbox.enqueue(&mut late, &event("b", 1)).await.unwrap();
    let committed = store.insert(&[event("c", 1)]).await.unwrap();
    assert!(late_id < committed[0]);

    // Only the committed row, although a lower id is in flight.
    assert_eq!(ids(&claim_all(&mut session).await.unwrap()), committed);
    late.commit().await.unwrap();
    // The late commit is not skipped: rows are selected by state, not by "id > last seen".
    assert_eq!(
        ids(&claim_all(&mut session).await.unwrap()),
        vec![late_id, committed[0]]
    );
    assert_eq!(store.status().await.unwrap().pending, 2);
    close(session).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn enqueue_commits_and_rolls_back_with_the_business_row() {
    // A schema of its own, holding a table named `outbox`: the free functions use that name.
    let schema = common::random_name("outbox_s");
    let store = migrated(common::fresh_config().table(format!("{schema}.outbox"))).await;
    assert_eq!(store.table().to_string(), format!("{schema}.outbox"));

    let mut conn = common::raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "SET search_path TO \"{schema}\"; \
         CREATE TABLE orders (id text PRIMARY KEY, status text NOT NULL)"
    )))
    .await
    .unwrap();

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES ('o-1', 'confirmed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let one = enqueue(&mut tx, &event("o-1", 1)).await.unwrap();
    let many = enqueue_many(
        &mut tx,
        &[event("o-1", 2), event("o-1", 3), event("o-2", 1)],
    )
    .await
    .unwrap();
    assert!(enqueue_many(&mut tx, &[]).await.unwrap().is_empty());
    tx.commit().await.unwrap();
    assert_eq!(many.len(), 3);
    assert!(
        one < many[0] && many.windows(2).all(|w| w[0] < w[1]),
        "{one} {many:?}"
    );

    let mut tx = conn.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES ('o-3', 'confirmed')")
        .execute(&mut *tx)
        .await
        .unwrap();
    store
        .outbox()
        .enqueue_many(&mut tx, &[event("o-3", 1), event("o-3", 2)])
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let mut session = session_with_all_shards(&store, "enqueue").await;
    let claimed = claim_all(&mut session).await.unwrap();
    let mut expected = vec![one];
    expected.extend(&many);
    assert_eq!(ids(&claimed), expected);
    assert_eq!(claimed[1].payload, r#"{"n": 2}"#);
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(orders, 1);

    // A duplicate event id is refused, and the whole statement with it.
    let event_id = claimed[0].event_id;
    let error = store
        .outbox()
        .enqueue_many(
            &mut conn,
            &[event("o-9", 1), event("o-9", 2).event_id(event_id)],
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Other, "{error}");
    assert!(!error.is_retryable());
    assert!(error.message().contains("23505"), "{error}");
    assert_eq!(store.status().await.unwrap().pending, 4);

    close(session).await;
    let _ = conn.close().await;
    common::drop_schema(&schema).await;
}

#[tokio::test]
async fn a_killed_session_loses_its_lease_and_its_shards_move() {
    let store = migrated(common::fresh_config().shards(8)).await;
    let inserted = store
        .insert(&[event("a", 1), event("b", 1), event("c", 1)])
        .await
        .unwrap();
    let mut doomed = session_with_all_shards(&store, "doomed").await;
    assert_eq!(ids(&claim_all(&mut doomed).await.unwrap()), inserted);

    let application: String =
        sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
            .bind(doomed.backend_pid())
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(application, "outbox-relay:doomed");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(doomed.backend_pid())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(killed);

    // The next call notices, and so does every later one: the session is fenced off.
    let error = claim_all(&mut doomed).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::LeaseLost, "{error}");
    assert!(
        error
            .message()
            .starts_with("lost the PostgreSQL session holding shard locks: "),
        "{error}"
    );
    assert!(doomed.is_poisoned());
    assert!(doomed.owned().is_empty());
    let error = doomed
        .mark_published(&inserted, MarkMode::Delete)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::LeaseLost);
    assert_eq!(
        doomed.try_acquire(0).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        doomed.cluster().await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );

    // Another session takes every shard over (once the server has cleaned up the backend) and
    // finds every row still there.
    let mut heir = store.open_postgres_session("heir").await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !heir.try_acquire(0).await.unwrap() {
        assert!(Instant::now() < deadline, "shard 0 was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for shard in 1..8 {
        assert!(heir.try_acquire(shard).await.unwrap(), "shard {shard}");
    }
    assert_eq!(ids(&claim_all(&mut heir).await.unwrap()), inserted);
    assert_eq!(heir.cluster().await.unwrap().live_relays, 1);

    close(doomed).await;
    close(heir).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn a_statement_timeout_is_a_timeout_and_keeps_the_session() {
    let config = PostgresStoreConfig {
        session_timeout: Duration::from_millis(300),
        ..common::fresh_config()
    };
    let store = migrated(config).await;
    let inserted = store.insert(&[event("a", 1)]).await.unwrap();
    let mut session = session_with_all_shards(&store, "slow").await;

    let mut blocker = store.pool().begin().await.unwrap();
    blocker
        .execute(sqlx::raw_sql(&format!(
            "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
            store.table().quoted()
        )))
        .await
        .unwrap();
    let error = claim_all(&mut session).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(error.is_retryable());
    blocker.rollback().await.unwrap();

    assert!(!session.is_poisoned());
    assert_eq!(ids(&claim_all(&mut session).await.unwrap()), inserted);
    close(session).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn concurrent_migrations_all_succeed() {
    let config = common::fresh_config().shards(16);
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let config = config.clone();
        tasks.push(tokio::spawn(async move {
            let store = common::connect(config).await;
            store.migrate().await.map(|()| store)
        }));
    }
    let mut stores = Vec::new();
    for task in tasks {
        stores.push(task.await.unwrap().expect("every migrate succeeds"));
    }
    let store = &stores[0];
    store.check().await.unwrap();

    let schema_table = format!(
        "\"{}\".outbox_relay_schema",
        store.table().schema().unwrap()
    );
    let row = sqlx::query(&format!(
        "SELECT version, shard_count, applied_at IS NOT NULL AS applied FROM {schema_table} \
         WHERE table_name = $1"
    ))
    .bind(store.table().name())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<i32, _>("version"), SCHEMA_VERSION);
    assert_eq!(row.get::<i32, _>("shard_count"), 16);
    assert!(row.get::<bool, _>("applied"));

    // The shard count comes from the database, whatever a later configuration says.
    let other = common::connect(config.shards(64)).await;
    other.migrate().await.unwrap();
    let session = other.open_postgres_session("count").await.unwrap();
    assert_eq!(session.shard_count(), 16);
    close(session).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn the_table_has_the_documented_shape() {
    let store = migrated(common::fresh_config()).await;
    let columns: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text, is_nullable::text, column_default::text \
         FROM information_schema.columns \
         WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
    )
    .bind(store.table().schema().unwrap())
    .bind(store.table().name())
    .fetch_all(store.pool())
    .await
    .unwrap();
    let names: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "id",
            "event_id",
            "aggregate_type",
            "aggregate_id",
            "event_type",
            "payload",
            "headers",
            "destination",
            "created_at",
            "published_at",
            "attempts",
            "next_attempt_at",
            "last_error",
            "dead_at",
            "shard"
        ]
    );
    let types: Vec<&str> = columns.iter().map(|c| c.1.as_str()).collect();
    assert_eq!(
        types,
        [
            "bigint",
            "uuid",
            "text",
            "text",
            "text",
            "jsonb",
            "jsonb",
            "text",
            "timestamp with time zone",
            "timestamp with time zone",
            "integer",
            "timestamp with time zone",
            "text",
            "timestamp with time zone",
            "smallint"
        ]
    );

    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexdef FROM pg_indexes WHERE schemaname = $1 AND tablename = $2",
    )
    .bind(store.table().schema().unwrap())
    .bind(store.table().name())
    .fetch_all(store.pool())
    .await
    .unwrap();
    let has = |needle: &str| indexes.iter().any(|d| d.contains(needle));
    assert!(
        has("(id) WHERE ((published_at IS NULL) AND (dead_at IS NULL))"),
        "{indexes:#?}"
    );
    assert!(has(
        "(aggregate_id, id) WHERE ((published_at IS NULL) AND (attempts > 0))"
    ));
    assert!(has("(published_at) WHERE (published_at IS NOT NULL)"));
    assert!(has("(id) WHERE (dead_at IS NOT NULL)"));

    let options: Vec<String> =
        sqlx::query_scalar("SELECT unnest(reloptions) FROM pg_class WHERE oid = to_regclass($1)")
            .bind(store.table().quoted())
            .fetch_all(store.pool())
            .await
            .unwrap();
    assert!(
        options
            .iter()
            .any(|o| o.starts_with("autovacuum_vacuum_scale_factor=")),
        "{options:?}"
    );
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn rows_written_with_plain_sql_are_claimed_with_their_defaults() {
    let store = migrated(common::fresh_config()).await;
    let mut conn = common::raw_connection().await;
    // What a writer in another language does (see the README).
    sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '42', 'OrderConfirmed', $1::jsonb, $2::jsonb), \
                ('order', '42', 'OrderShipped', '{{\"n\": 2}}', DEFAULT)",
        store.table().quoted()
    ))
    .bind(r#"{"total": 99}"#)
    .bind(r#"{"traceparent": "00-abc-01", "retries": 3, "flags": {"a": true}}"#)
    .execute(&mut conn)
    .await
    .unwrap();
    let writer_error = sqlx::query(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '42', 'Bad', '{{}}', '[1]')",
        store.table().quoted()
    ))
    .execute(&mut conn)
    .await;
    assert!(writer_error.is_err(), "headers must be a JSON object");

    let mut session = session_with_all_shards(&store, "plain-sql").await;
    let claimed = claim_all(&mut session).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let first = &claimed[0];
    assert!(!first.event_id.is_nil());
    assert_ne!(first.event_id, claimed[1].event_id);
    assert_eq!(first.payload, r#"{"total": 99}"#);
    assert_eq!(first.headers["traceparent"], "00-abc-01");
    assert_eq!(first.headers["retries"], "3");
    assert_eq!(first.headers["flags"], r#"{"a":true}"#);
    assert!(claimed[1].headers.is_empty());
    assert_eq!(first.destination, None);
    assert_eq!(first.attempts, 0);
    assert_eq!(first.shard, claimed[1].shard);
    assert!((chrono::Utc::now() - first.created_at).num_seconds().abs() < 60);
    close(session).await;
    let _ = conn.close().await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn migrate_refuses_a_table_it_did_not_create() {
    let config = common::fresh_config();
    let mut conn = common::raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "CREATE TABLE {} (id int)",
        config.table
    )))
    .await
    .unwrap();
    let store = common::connect(config).await;
    let error = store.migrate().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Schema, "{error}");
    assert!(
        error.message().contains("not created by outbox-relay"),
        "{error}"
    );
    let error = store.check().await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Schema, "{error}");
    let error = store.open_session("x").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Schema, "{error}");
    let _ = conn.close().await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn an_unreachable_database_is_a_connection_error_naming_the_host() {
    let config = PostgresStoreConfig::new("postgres://postgres:hunter2@127.0.0.1:1/test");
    let error = PostgresStore::connect(config).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.is_retryable());
    assert_eq!(
        error.to_string(),
        "cannot reach PostgreSQL at 127.0.0.1:1 (store.url): connection refused"
    );
    assert!(!error.to_string().contains('\n') && !format!("{error:?}").contains("hunter2"));
}

#[tokio::test]
async fn an_unknown_database_is_a_config_error_naming_it() {
    let mut url = url::Url::parse(&common::test_url()).unwrap();
    url.set_path("/no_such_database_for_outbox_tests");
    let error = PostgresStore::connect(PostgresStoreConfig::new(url.as_str()))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config, "{error}");
    assert!(
        error
            .message()
            .starts_with("database \"no_such_database_for_outbox_tests\" does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn a_bad_configuration_fails_before_connecting() {
    let error = PostgresStore::connect(common::fresh_config().table("Bad Name"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.table"), "{error}");
    let error = PostgresStore::connect(PostgresStoreConfig::new("postgres://db:notaport/x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.url"), "{error}");
}

#[tokio::test]
async fn describe_and_debug_hide_the_password() {
    let mut url = url::Url::parse(&common::test_url()).unwrap();
    url.set_password(Some("not-needed-with-trust-auth"))
        .unwrap();
    let store = common::connect(PostgresStoreConfig::new(url.as_str()).table("app_x.outbox")).await;
    let text = format!("{} {:?} {:?}", store.describe(), store, store.config());
    assert!(!text.contains("not-needed"), "{text}");
    assert!(
        store.describe().contains("table app_x.outbox"),
        "{}",
        store.describe()
    );
    assert_eq!(store.kind(), "postgres");
}

/// A queue table is often claimed from while its statistics are stale: created empty and never
/// analyzed, then a burst arrives (autovacuum behind, or off). The claim must stay an ordered
/// walk of the pending index with a cheap held-back check whatever the planner believes; it
/// once took 4–6 s per claim at 30,000 pending rows, so the relay fell behind its writers.
#[tokio::test]
async fn claims_stay_fast_on_a_backlog_whose_statistics_are_stale() {
    const PENDING: i64 = 30_000;
    const BATCH: usize = 500;
    let store = migrated(common::fresh_config()).await;
    let t = store.table().quoted();
    // Whatever the server's autovacuum does, this table keeps the statistics it was born with.
    sqlx::query(&format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"))
        .execute(store.pool())
        .await
        .expect("turning autovacuum off for the table");
    sqlx::query(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'agg-' || (g % 1000), 'OrderChanged', \
                jsonb_build_object('n', g, 'pad', repeat('x', 250)) \
         FROM generate_series(1, $1) g"
    ))
    .bind(PENDING)
    .execute(store.pool())
    .await
    .expect("inserting the backlog");
    // Three aggregates wait for a retry an hour away: their later rows are held back.
    let retrying: Vec<i64> = sqlx::query_scalar(&format!(
        "UPDATE {t} SET attempts = 1, next_attempt_at = now() + interval '1 hour' \
         WHERE id IN (SELECT id FROM {t} ORDER BY id OFFSET 2 LIMIT 3) RETURNING id"
    ))
    .fetch_all(store.pool())
    .await
    .expect("marking rows as retrying");
    assert_eq!(retrying.len(), 3);
    let held: Vec<String> =
        sqlx::query_scalar(&format!("SELECT aggregate_id FROM {t} WHERE id = ANY($1)"))
            .bind(&retrying)
            .fetch_all(store.pool())
            .await
            .unwrap();

    let mut session = session_with_all_shards(&store, "stale-statistics").await;
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
    close(session).await;
    common::drop_table(store.table()).await;
}
