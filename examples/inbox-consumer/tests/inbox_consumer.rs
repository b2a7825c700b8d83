//! The example consumer processes each event once, against the real Redis and PostgreSQL.

use outboxkit_example_inbox_consumer::{OrderTotalsConsumer, Pass};
use outboxkit_store_postgres::Inbox;
use uuid::Uuid;

async fn services() -> (redis::aio::MultiplexedConnection, sqlx::PgPool) {
    let redis_url = std::env::var("OUTBOX_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let pg_url = std::env::var("OUTBOX_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let redis = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| panic!("Redis at {redis_url} is unreachable: {e}"));
    let pool = sqlx::PgPool::connect(&pg_url)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {pg_url} is unreachable: {e}"));
    (redis, pool)
}

/// Delete the test's streams and drop its tables.
async fn clean_up(
    redis: &mut redis::aio::MultiplexedConnection,
    pool: &sqlx::PgPool,
    streams: &[&str],
    suffix: &str,
) {
    let _: () = redis::cmd("DEL")
        .arg(streams)
        .query_async(redis)
        .await
        .unwrap();
    sqlx::query(&format!("DROP TABLE inbox_{suffix}, totals_{suffix}"))
        .execute(pool)
        .await
        .unwrap();
}

async fn xadd(
    redis: &mut redis::aio::MultiplexedConnection,
    stream: &str,
    event_id: Uuid,
    order: &str,
    amount: i64,
) {
    let _: String = redis::cmd("XADD")
        .arg(stream)
        .arg("*")
        .arg("event_id")
        .arg(event_id.to_string())
        .arg("aggregate_id")
        .arg(order)
        .arg("payload")
        .arg(serde_json::json!({ "amount": amount }).to_string())
        .query_async(redis)
        .await
        .unwrap();
}

fn consumer(name: &str, stream: &str, suffix: &str) -> OrderTotalsConsumer {
    OrderTotalsConsumer {
        name: name.to_owned(),
        stream: stream.to_owned(),
        group: "billing".to_owned(),
        inbox: Inbox::new(&format!("inbox_{suffix}")).unwrap(),
        totals_table: format!("totals_{suffix}"),
    }
}

#[tokio::test]
async fn an_event_delivered_twice_is_applied_once() {
    let (mut redis, pool) = services().await;
    let suffix = Uuid::new_v4().simple().to_string()[..10].to_owned();
    let stream = format!("inbox-example-{suffix}");
    let c = consumer("billing", &stream, &suffix);
    c.prepare(&mut redis, &pool).await.unwrap();

    let (e1, e2) = (Uuid::now_v7(), Uuid::now_v7());
    xadd(&mut redis, &stream, e1, "o1", 10).await;
    xadd(&mut redis, &stream, e2, "o1", 5).await;
    xadd(&mut redis, &stream, e1, "o1", 10).await; // the relay published e1 again
    let pass = c.pass(&mut redis, &pool, 100).await.unwrap();
    assert_eq!(
        pass,
        Pass {
            read: 3,
            applied: 2,
            duplicates: 1
        }
    );
    let total: i64 = sqlx::query_scalar(&format!(
        "SELECT total FROM totals_{suffix} WHERE order_id = 'o1'"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(total, 15);

    clean_up(&mut redis, &pool, &[&stream], &suffix).await;
}

#[tokio::test]
async fn two_concurrent_consumers_apply_each_event_once() {
    let (mut redis, pool) = services().await;
    let suffix = Uuid::new_v4().simple().to_string()[..10].to_owned();
    // Two streams carrying the same events (as after a redelivery), one consumer each, racing;
    // both record under the same consumer name, so the inbox decides who applies.
    let (s1, s2) = (format!("inbox-a-{suffix}"), format!("inbox-b-{suffix}"));
    let (a, b) = (
        consumer("billing", &s1, &suffix),
        consumer("billing", &s2, &suffix),
    );
    a.prepare(&mut redis, &pool).await.unwrap();
    b.prepare(&mut redis, &pool).await.unwrap();
    for n in 0..200 {
        let id = Uuid::now_v7();
        xadd(&mut redis, &s1, id, &format!("o{}", n % 10), 1).await;
        xadd(&mut redis, &s2, id, &format!("o{}", n % 10), 1).await;
    }
    let (ra, rb) = tokio::join!(
        {
            let (mut r, p, a) = (redis.clone(), pool.clone(), a.clone());
            async move { a.pass(&mut r, &p, 1000).await }
        },
        {
            let (mut r, p, b) = (redis.clone(), pool.clone(), b.clone());
            async move { b.pass(&mut r, &p, 1000).await }
        }
    );
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert_eq!(ra.read + rb.read, 400);
    assert_eq!(
        ra.applied + rb.applied,
        200,
        "each event applied exactly once ({ra:?}, {rb:?})"
    );
    let total: i64 = sqlx::query_scalar(&format!("SELECT sum(total)::int8 FROM totals_{suffix}"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(total, 200);

    clean_up(&mut redis, &pool, &[&s1, &s2], &suffix).await;
}
