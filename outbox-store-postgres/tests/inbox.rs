//! The consumer-side inbox on the real PostgreSQL.

use std::time::Duration;

use outboxkit_store_postgres::Inbox;
use uuid::Uuid;

fn url() -> String {
    std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

async fn setup() -> (sqlx::PgPool, Inbox, String) {
    let url = url();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {url} is unreachable: {e}"));
    let table = format!("inbox_t_{}", &Uuid::new_v4().simple().to_string()[..10]);
    let inbox = Inbox::new(&table).unwrap();
    inbox.migrate(&pool).await.unwrap();
    inbox.migrate(&pool).await.expect("migrate is idempotent");
    (pool, inbox, table)
}

#[tokio::test]
async fn the_same_event_delivered_twice_is_processed_once() {
    let (pool, inbox, table) = setup().await;
    let event = Uuid::now_v7();
    let mut effects = 0;
    for _delivery in 0..2 {
        let mut tx = pool.begin().await.unwrap();
        if inbox
            .try_mark_processed(&mut tx, "billing", event)
            .await
            .unwrap()
        {
            effects += 1;
        }
        tx.commit().await.unwrap();
    }
    assert_eq!(effects, 1);
    // Another consumer processes it on its own.
    let mut tx = pool.begin().await.unwrap();
    assert!(inbox
        .try_mark_processed(&mut tx, "shipping", event)
        .await
        .unwrap());
    tx.commit().await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_mark() {
    let (pool, inbox, table) = setup().await;
    let event = Uuid::now_v7();
    let mut tx = pool.begin().await.unwrap();
    assert!(inbox
        .try_mark_processed(&mut tx, "billing", event)
        .await
        .unwrap());
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(
        inbox
            .try_mark_processed(&mut tx, "billing", event)
            .await
            .unwrap(),
        "processed again after the rollback"
    );
    tx.commit().await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn two_concurrent_consumers_process_an_event_once() {
    let (pool, inbox, table) = setup().await;
    for _ in 0..20 {
        let event = Uuid::now_v7();
        let race = |pool: sqlx::PgPool, inbox: Inbox| async move {
            let mut tx = pool.begin().await.unwrap();
            let first = inbox
                .try_mark_processed(&mut tx, "billing", event)
                .await
                .unwrap();
            // Hold the transaction open a little, as a business effect would.
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.commit().await.unwrap();
            first
        };
        let (a, b) = tokio::join!(
            tokio::spawn(race(pool.clone(), inbox.clone())),
            tokio::spawn(race(pool.clone(), inbox.clone()))
        );
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(
            a ^ b,
            "exactly one consumer processes the event (got {a} and {b})"
        );
    }
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn purge_forgets_old_marks_only() {
    let (pool, inbox, table) = setup().await;
    for _ in 0..5 {
        let mut conn = pool.acquire().await.unwrap();
        inbox
            .try_mark_processed(&mut conn, "billing", Uuid::now_v7())
            .await
            .unwrap();
    }
    assert_eq!(
        inbox
            .purge_processed(&pool, Duration::from_secs(3600), 100)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        inbox
            .purge_processed(&pool, Duration::from_millis(10), 3)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        inbox
            .purge_processed(&pool, Duration::from_millis(10), 100)
            .await
            .unwrap(),
        2
    );
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}
