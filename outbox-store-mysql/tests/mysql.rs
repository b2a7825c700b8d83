//! What only a live MySQL / MariaDB can show: writers' transactions, killed connections,
//! statement limits, concurrent migrations, plain-SQL writers, long id lists.

mod common;

use std::time::{Duration, Instant};

use outboxkit_core::{
    ClaimRequest, ErrorKind, Failure, MarkMode, NewEvent, OutboxEvent, ShardSession, Store,
};
use outboxkit_store_mysql::sqlx::{self, Connection, Executor, Row};
use outboxkit_store_mysql::{
    enqueue, enqueue_many, MySqlShardSession, MySqlStore, MySqlStoreConfig, Outbox, SCHEMA_VERSION,
};
use serde_json::json;

async fn migrated(config: MySqlStoreConfig) -> MySqlStore {
    let store = common::connect(config).await;
    store.migrate().await.expect("migrate");
    store
}

async fn session_with_all_shards(store: &MySqlStore, relay_id: &str) -> MySqlShardSession {
    let mut session = store
        .open_mysql_session(relay_id)
        .await
        .expect("open session");
    outboxkit_core::testkit::store_suite::acquire_all_shards(&mut session).await;
    session
}

async fn claim_all(session: &mut MySqlShardSession) -> outboxkit_core::Result<Vec<OutboxEvent>> {
    claim_excluding(session, 10_000, &[]).await
}

async fn claim_excluding(
    session: &mut MySqlShardSession,
    limit: usize,
    exclude_ids: &[i64],
) -> outboxkit_core::Result<Vec<OutboxEvent>> {
    session
        .claim(&ClaimRequest {
            limit,
            exclude_ids,
            dead_holds_aggregate: false,
        })
        .await
}

async fn close(session: MySqlShardSession) {
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
    // A database of its own, holding a table named `outbox`: the free functions use that name.
    let database = common::random_name("outbox_db");
    let store = migrated(common::fresh_config().table(format!("{database}.outbox"))).await;
    assert_eq!(store.table().to_string(), format!("{database}.outbox"));

    let mut conn = common::raw_connection().await;
    conn.execute(sqlx::raw_sql(&format!(
        "USE `{database}`; \
         CREATE TABLE orders (id VARCHAR(20) PRIMARY KEY, status VARCHAR(20) NOT NULL)"
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
    let payload: serde_json::Value = serde_json::from_str(&claimed[1].payload).unwrap();
    assert_eq!(payload, json!({"n": 2}));
    let orders: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
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
    assert!(error.message().contains("error 1062"), "{error}");
    // Values the columns cannot hold are refused before anything is sent.
    let error = enqueue(&mut conn, &event(&"x".repeat(300), 1))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidMessage, "{error}");
    assert_eq!(store.status().await.unwrap().pending, 4);

    close(session).await;
    let _ = conn.close().await;
    common::drop_database(&database).await;
}

/// `enqueue_many` returns the id of each event, across statements of 1,000 rows and with an
/// `auto_increment_increment` other than 1 (as on Galera or multi-primary setups).
#[tokio::test]
async fn enqueue_many_returns_each_rows_id_in_order() {
    let store = migrated(common::fresh_config()).await;
    let mut conn = common::raw_connection().await;
    conn.execute("SET SESSION auto_increment_increment = 3")
        .await
        .unwrap();
    let outbox = Outbox::new(&store.table().to_string()).unwrap();
    let events: Vec<NewEvent> = (0..1500)
        .map(|i| event(&format!("a{}", i % 7), i).event_id(uuid::Uuid::new_v4()))
        .collect();
    let mut tx = conn.begin().await.unwrap();
    let returned = outbox.enqueue_many(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(returned.len(), 1500);
    assert!(returned.windows(2).all(|w| w[0] < w[1]));
    assert!(returned[..1000].windows(2).all(|w| w[1] - w[0] == 3));

    let rows = sqlx::query(&format!(
        "SELECT id, event_id FROM {} ORDER BY id",
        store.table().quoted()
    ))
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1500);
    for ((row, id), event) in rows.iter().zip(&returned).zip(&events) {
        assert_eq!(row.get::<i64, _>(0), *id);
        let stored: String = row.try_get_unchecked(1).unwrap();
        assert_eq!(stored, event.event_id.unwrap_or_default().to_string());
    }
    let _ = conn.close().await;
    common::drop_table(store.table()).await;
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
    assert!(doomed.slot().is_some());

    sqlx::query(&format!("KILL {}", doomed.connection_id()))
        .execute(store.pool())
        .await
        .unwrap();

    // The next call notices, and so does every later one: the session is fenced off.
    let error = claim_all(&mut doomed).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::LeaseLost, "{error}");
    assert!(
        error
            .message()
            .starts_with("lost the MySQL session holding shard locks: "),
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

    // Another session takes every shard over and finds every row still there.
    let mut heir = store.open_mysql_session("heir").await.unwrap();
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
    // The dead session's members row no longer names an owner.
    let owners = store.shard_owners().await.unwrap();
    assert_eq!(owners.len(), 8);
    assert!(
        owners
            .iter()
            .all(|o| o.owner.starts_with("heir (connection ")),
        "{owners:?}"
    );

    close(doomed).await;
    close(heir).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn a_statement_limit_is_a_timeout_and_keeps_the_session() {
    let config = MySqlStoreConfig {
        session_timeout: Duration::from_millis(300),
        ..common::fresh_config()
    };
    let store = migrated(config).await;
    let inserted = store.insert(&[event("a", 1)]).await.unwrap();
    let mut session = session_with_all_shards(&store, "slow").await;

    let mut blocker = common::raw_connection().await;
    blocker
        .execute(sqlx::raw_sql(&format!(
            "LOCK TABLES {} WRITE",
            store.table().quoted()
        )))
        .await
        .unwrap();
    let started = Instant::now();
    let error = claim_all(&mut session).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(error.is_retryable());
    assert!(error.message().contains("store.session_timeout"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    blocker.execute("UNLOCK TABLES").await.unwrap();

    assert!(!session.is_poisoned());
    assert_eq!(ids(&claim_all(&mut session).await.unwrap()), inserted);
    close(session).await;
    let _ = blocker.close().await;
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

    let database = store.table().database().unwrap();
    let row = sqlx::query(&format!(
        "SELECT version, shard_count, applied_at IS NOT NULL AS applied \
         FROM `{database}`.outbox_relay_schema WHERE table_name = ?"
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
    let session = other.open_mysql_session("count").await.unwrap();
    assert_eq!(session.shard_count(), 16);
    close(session).await;
    common::drop_table(store.table()).await;
}

/// A migration that stopped between creating the table and recording it is completed.
#[tokio::test]
async fn an_interrupted_migration_is_completed() {
    let store = migrated(common::fresh_config().shards(8)).await;
    let database = store.table().database().unwrap();
    sqlx::query(&format!(
        "DELETE FROM `{database}`.outbox_relay_schema WHERE table_name = ?"
    ))
    .bind(store.table().name())
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(store.check().await.unwrap_err().kind(), ErrorKind::Schema);
    store.migrate().await.unwrap();
    store.check().await.unwrap();
    let session = store.open_mysql_session("after").await.unwrap();
    assert_eq!(session.shard_count(), 8);
    close(session).await;
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn the_table_has_the_documented_shape() {
    let store = migrated(common::fresh_config()).await;
    let database = store.table().database().unwrap().to_owned();
    let columns: Vec<(String, String, String, String)> = sqlx::query(
        "SELECT CAST(COLUMN_NAME AS CHAR), CAST(DATA_TYPE AS CHAR), CAST(IS_NULLABLE AS CHAR), \
                CAST(EXTRA AS CHAR) \
         FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
    )
    .bind(&database)
    .bind(store.table().name())
    .fetch_all(store.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| {
        (
            r.try_get_unchecked(0).unwrap(),
            r.try_get_unchecked(1).unwrap(),
            r.try_get_unchecked(2).unwrap(),
            r.try_get_unchecked(3).unwrap(),
        )
    })
    .collect();
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
            "shard",
            "pending",
            "retry_aggregate_id"
        ]
    );
    let types: Vec<&str> = columns
        .iter()
        .map(|c| match c.1.as_str() {
            // MariaDB's JSON is LONGTEXT with a JSON_VALID check.
            "longtext" => "json",
            other => other,
        })
        .collect();
    assert_eq!(
        types,
        [
            "bigint", "char", "varchar", "varchar", "varchar", "json", "json", "varchar",
            "datetime", "datetime", "int", "datetime", "text", "datetime", "smallint", "tinyint",
            "varchar"
        ]
    );
    assert!(columns[0].3.contains("auto_increment"));
    for generated in &columns[14..] {
        assert!(
            generated.3.to_ascii_uppercase().contains("STORED")
                || generated.3.to_ascii_uppercase().contains("PERSISTENT"),
            "{generated:?}"
        );
    }

    let indexes: Vec<(String, String)> = sqlx::query(
        "SELECT CAST(INDEX_NAME AS CHAR), \
                CAST(GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) AS CHAR) \
         FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? \
         GROUP BY INDEX_NAME ORDER BY INDEX_NAME",
    )
    .bind(&database)
    .bind(store.table().name())
    .fetch_all(store.pool())
    .await
    .unwrap()
    .iter()
    .map(|r| {
        (
            r.try_get_unchecked(0).unwrap(),
            r.try_get_unchecked(1).unwrap(),
        )
    })
    .collect();
    let expected: Vec<(String, String)> = [
        ("PRIMARY", "id"),
        ("dead_idx", "dead_at"),
        ("event_id_key", "event_id"),
        ("pending_idx", "pending,id,shard"),
        ("published_idx", "published_at"),
        ("retry_idx", "retry_aggregate_id,id"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    let mut indexes = indexes;
    indexes.sort();
    let mut expected = expected;
    expected.sort();
    assert_eq!(indexes, expected);
    common::drop_table(store.table()).await;
}

#[tokio::test]
async fn rows_written_with_plain_sql_are_claimed_with_their_defaults() {
    let store = migrated(common::fresh_config()).await;
    let mut conn = common::raw_connection().await;
    let t = store.table().quoted();
    // What a writer in another language does (see the README), with the session in another
    // time zone: created_at is UTC all the same.
    conn.execute("SET time_zone = '+05:00'").await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('order', '42', 'OrderConfirmed', ?, ?)"
    ))
    .bind(r#"{"total": 99}"#)
    .bind(r#"{"traceparent": "00-abc-01", "retries": 3, "flags": {"a": true}}"#)
    .execute(&mut conn)
    .await
    .unwrap();
    conn.execute(sqlx::raw_sql(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', '42', 'OrderShipped', '{{\"n\": 2}}')"
    )))
    .await
    .unwrap();
    for (what, values) in [
        (
            "headers must be a JSON object",
            "('order', '42', 'Bad', '{}', '[1]', DEFAULT)",
        ),
        (
            "payload must be JSON",
            "('order', '42', 'Bad', 'not json', '{}', DEFAULT)",
        ),
        (
            "event_id must be a UUID",
            "('order', '42', 'Bad', '{}', '{}', 'not-a-uuid')",
        ),
    ] {
        let refused = conn
            .execute(sqlx::raw_sql(&format!(
                "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers, \
                 event_id) VALUES {values}"
            )))
            .await;
        assert!(refused.is_err(), "{what}");
    }

    let mut session = session_with_all_shards(&store, "plain-sql").await;
    let claimed = claim_all(&mut session).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let first = &claimed[0];
    assert!(!first.event_id.is_nil());
    assert_ne!(first.event_id, claimed[1].event_id);
    let payload: serde_json::Value = serde_json::from_str(&first.payload).unwrap();
    assert_eq!(payload, json!({"total": 99}));
    assert_eq!(first.headers["traceparent"], "00-abc-01");
    assert_eq!(first.headers["retries"], "3");
    assert_eq!(first.headers["flags"], r#"{"a":true}"#);
    assert!(claimed[1].headers.is_empty());
    assert_eq!(first.destination, None);
    assert_eq!(first.attempts, 0);
    assert_eq!(first.shard, claimed[1].shard);
    let skew = (chrono::Utc::now() - first.created_at).num_seconds().abs();
    assert!(skew < 60, "created_at {} is not UTC now", first.created_at);
    close(session).await;
    let _ = conn.close().await;
    common::drop_table(store.table()).await;
}

/// Lists longer than one statement takes: exclusions read past, marks and failures in chunks.
#[tokio::test]
async fn long_id_lists_are_claimed_marked_and_failed_correctly() {
    let store = migrated(common::fresh_config().shards(4)).await;
    let events: Vec<NewEvent> = (0..4500).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let inserted = store.insert(&events).await.unwrap();
    let mut session = session_with_all_shards(&store, "long-lists").await;

    let claimed = claim_excluding(&mut session, 10, &inserted[..4200])
        .await
        .unwrap();
    assert_eq!(ids(&claimed), inserted[4200..4210]);

    let failures: Vec<Failure> = inserted[4200..]
        .iter()
        .map(|&id| Failure {
            id,
            error: format!("row {id} refused"),
            retry_in: Some(Duration::from_secs(3600)),
        })
        .collect();
    session.record_failures(&failures).await.unwrap();
    let status = store.status().await.unwrap();
    assert_eq!(status.retrying, 300);
    assert_eq!(status.held_back_aggregates, 300);
    // Padding repeats the first failure: its row is still counted once.
    let attempts: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT attempts FROM {} WHERE id >= ? ORDER BY id",
        store.table().quoted()
    ))
    .bind(inserted[4200])
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(attempts, vec![1; 300]);

    session
        .mark_published(&inserted[..4200], MarkMode::Delete)
        .await
        .unwrap();
    let status = store.status().await.unwrap();
    assert_eq!(status.pending, 300);
    assert!(claim_all(&mut session).await.unwrap().is_empty());
    let last_error: String = sqlx::query(&format!(
        "SELECT last_error FROM {} WHERE id = ?",
        store.table().quoted()
    ))
    .bind(inserted[4499])
    .fetch_one(store.pool())
    .await
    .unwrap()
    .try_get_unchecked(0)
    .unwrap();
    assert_eq!(last_error, format!("row {} refused", inserted[4499]));
    close(session).await;
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
async fn an_unreachable_server_is_a_connection_error_naming_the_host() {
    let config = MySqlStoreConfig::new("mysql://root:hunter2@127.0.0.1:1/test");
    let error = MySqlStore::connect(config).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.is_retryable());
    assert_eq!(
        error.to_string(),
        "cannot reach MySQL at 127.0.0.1:1 (store.url): connection refused"
    );
    assert!(!error.to_string().contains('\n') && !format!("{error:?}").contains("hunter2"));
}

#[tokio::test]
async fn an_unknown_database_is_a_config_error_naming_it() {
    let mut url = url::Url::parse(&common::test_url()).unwrap();
    url.set_path("/no_such_database_for_outbox_tests");
    let error = MySqlStore::connect(MySqlStoreConfig::new(url.as_str()))
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
    let error = MySqlStore::connect(common::fresh_config().table("Bad Name"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.table"), "{error}");
    let error = MySqlStore::connect(MySqlStoreConfig::new("mysql://db:notaport/x"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.url"), "{error}");
    let error = MySqlStore::connect(MySqlStoreConfig::new("mysql://root@127.0.0.1:3306"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(
        error.message().starts_with("store.table") && error.message().contains("database"),
        "{error}"
    );
}

#[tokio::test]
async fn describe_and_debug_hide_the_password() {
    let mut url = url::Url::parse(&common::test_url()).unwrap();
    url.set_password(Some("wrong-password-never-shown"))
        .unwrap();
    let config = MySqlStoreConfig::new(url.as_str()).table("app_x.outbox");
    let text = format!("{config:?}");
    assert!(!text.contains("wrong-password"), "{text}");
    // The server refuses the password: the error names the user, not the password.
    match MySqlStore::connect(config).await {
        Err(error) => {
            assert_eq!(error.kind(), ErrorKind::Unauthorized, "{error}");
            assert!(!error.to_string().contains("wrong-password"), "{error}");
        }
        Ok(store) => {
            // A server that ignores passwords for this user.
            let text = format!("{} {:?} {:?}", store.describe(), store, store.config());
            assert!(!text.contains("wrong-password"), "{text}");
        }
    }
    let store =
        common::connect(MySqlStoreConfig::new(common::test_url()).table("app_x.outbox")).await;
    assert!(
        store.describe().contains("table app_x.outbox"),
        "{}",
        store.describe()
    );
    assert_eq!(store.kind(), "mysql");
}
