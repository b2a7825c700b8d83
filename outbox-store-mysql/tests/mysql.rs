//! What only a live MySQL / MariaDB can show: ids of multi-row inserts, interrupted
//! migrations, long id lists. The cases every store on a server shares (writers' transactions,
//! killed sessions, statement limits, concurrent migrations, plain-SQL writers, connection and
//! configuration errors) are the live cases of the store suite (tests/store_suite.rs).

use crate::common;

use std::time::Duration;

use outboxkit_core::testkit::store_suite::{close_live, with_all_shards};
use outboxkit_core::{
    ClaimRequest, ErrorKind, Failure, MarkMode, NewEvent, OutboxEvent, ShardSession, Store,
};
use outboxkit_store_mysql::sqlx::{self, Connection, Executor, Row};
use outboxkit_store_mysql::{MySqlShardSession, Outbox};
use serde_json::json;

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

fn ids(events: &[OutboxEvent]) -> Vec<i64> {
    events.iter().map(|e| e.id).collect()
}

fn event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new("order", aggregate_id, "OrderChanged", json!({ "n": n }))
}

/// `enqueue_many` returns the id of each event, across statements of 1,000 rows and with an
/// `auto_increment_increment` other than 1 (as on Galera or multi-primary setups).
#[tokio::test]
async fn enqueue_many_returns_each_rows_id_in_order() {
    let store = common::SERVER.migrated(common::fresh_config()).await;
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

    let rows = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id, event_id FROM {} ORDER BY id",
        store.table().quoted()
    )))
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

/// A migration that stopped between creating the table and recording it is completed.
#[tokio::test]
async fn an_interrupted_migration_is_completed() {
    let config = common::fresh_config().shards(8);
    let store = common::SERVER.migrated(config).await;
    let database = store.table().qualifier().unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM `{database}`.outbox_relay_schema WHERE table_name = ?"
    )))
    .bind(store.table().name())
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(store.check().await.unwrap_err().kind(), ErrorKind::Schema);
    store.migrate().await.unwrap();
    store.check().await.unwrap();
    let session = store.open_mysql_session("after").await.unwrap();
    assert_eq!(session.shard_count(), 8);
    close_live(session).await;
    common::drop_table(store.table()).await;
}

/// What `migrate --print-sql` prints (the configuration's `migration_sql`), applied by hand,
/// makes the table `migrate` makes: the same definition (names aside) and bookkeeping row; the
/// store's check accepts it and `migrate` leaves it as it is.
#[tokio::test]
async fn the_printed_migration_makes_what_migrate_makes() {
    use outboxkit_core::StoreConfig;
    let mut config = common::fresh_config().shards(8);
    config.payload_type = Some(outboxkit_core::PayloadType::Binary);
    let script = config
        .migration_sql()
        .expect("a table, polling")
        .expect("MySQL prints its SQL");
    let mut conn = common::raw_connection().await;
    conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(script.as_str())))
        .await
        .unwrap_or_else(|e| panic!("applying the printed SQL: {e}\n{script}"));
    let by_hand = common::connect(config.clone()).await;
    by_hand
        .check()
        .await
        .expect("check of the table made by hand");
    by_hand
        .migrate()
        .await
        .expect("migrate of the table made by hand");
    let mut reference = common::fresh_config().shards(8);
    reference.payload_type = config.payload_type;
    let reference = common::SERVER.migrated(reference).await;
    let mut shapes = Vec::new();
    for store in [&by_hand, &reference] {
        let table = store.table();
        let create: (String, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SHOW CREATE TABLE {}",
            table.quoted()
        )))
        .fetch_one(store.pool())
        .await
        .unwrap();
        let row: (i32, i32) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT version, shard_count FROM `{}`.outbox_relay_schema WHERE table_name = ?",
            table.qualifier().unwrap()
        )))
        .bind(table.name())
        .fetch_one(store.pool())
        .await
        .unwrap();
        shapes.push((create.1.replace(table.name(), "T"), row));
    }
    common::drop_table(by_hand.table()).await;
    common::drop_table(reference.table()).await;
    assert_eq!(shapes[0].1, (1, 8));
    assert_eq!(shapes[0], shapes[1]);
}

/// Lists longer than one statement takes: exclusions read past, marks and failures in chunks.
#[tokio::test]
async fn long_id_lists_are_claimed_marked_and_failed_correctly() {
    let config = common::fresh_config().shards(4);
    let store = common::SERVER.migrated(config).await;
    let events: Vec<NewEvent> = (0..4500).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let inserted = store.insert(&events).await.unwrap();
    let mut session = with_all_shards(
        store
            .open_mysql_session("long-lists")
            .await
            .expect("open session"),
    )
    .await;

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
    let attempts: Vec<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT attempts FROM {} WHERE id >= ? ORDER BY id",
        store.table().quoted()
    )))
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
    let last_error: String = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT last_error FROM {} WHERE id = ?",
        store.table().quoted()
    )))
    .bind(inserted[4499])
    .fetch_one(store.pool())
    .await
    .unwrap()
    .try_get_unchecked(0)
    .unwrap();
    assert_eq!(last_error, format!("row {} refused", inserted[4499]));
    close_live(session).await;
    common::drop_table(store.table()).await;
}

/// One `mysql` kind serves MySQL and MariaDB: once connected, errors name the server it is, as
/// `describe` does (a MariaDB operator reading "MySQL at ..." looks for the wrong server).
#[tokio::test]
async fn errors_after_connecting_name_the_server_it_is() {
    let mut config = common::fresh_config();
    config.payload_type = Some(outboxkit_core::PayloadType::Text);
    let store = common::connect(config).await;
    store.migrate().await.expect("migrate");
    let described = store.describe();
    let product = described
        .split(' ')
        .next()
        .filter(|p| ["MariaDB", "MySQL"].contains(p))
        .unwrap_or_else(|| panic!("describe names MariaDB or MySQL: {described}"));
    let not_text = NewEvent::new("order", "o-1", "Changed", vec![0xff_u8, 0xfe]);
    let e = store
        .insert(&[not_text])
        .await
        .expect_err("bytes that are not UTF-8 in a text table");
    common::drop_table(store.table()).await;
    let other = if product == "MySQL" {
        "MariaDB"
    } else {
        "MySQL"
    };
    assert!(
        e.message().contains(&format!(": {product} at "))
            && e.message().contains(" refused a value for table ")
            && !e.message().contains(other),
        "{product}: {e}"
    );
}
