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
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE inbox_{suffix}, totals_{suffix}"
    )))
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
) -> String {
    redis::cmd("XADD")
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
        .unwrap()
}

async fn total(pool: &sqlx::PgPool, suffix: &str, order: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT total FROM totals_{suffix} WHERE order_id = $1"
    )))
    .bind(order)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Messages of the group delivered and not acknowledged.
async fn pending(redis: &mut redis::aio::MultiplexedConnection, stream: &str) -> i64 {
    let summary: (i64, redis::Value, redis::Value, redis::Value) = redis::cmd("XPENDING")
        .arg(stream)
        .arg("billing")
        .query_async(redis)
        .await
        .unwrap();
    summary.0
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

/// A [`Pass`] that read, applied, skipped as duplicates and dead-lettered these many.
fn passed(read: usize, applied: usize, duplicates: usize, malformed: usize) -> Pass {
    Pass {
        read,
        applied,
        duplicates,
        malformed,
    }
}

/// The services and a prepared consumer of a stream of its own, `<prefix>-<suffix>`.
async fn prepared(
    prefix: &str,
) -> (
    redis::aio::MultiplexedConnection,
    sqlx::PgPool,
    String,
    OrderTotalsConsumer,
) {
    let (mut redis, pool) = services().await;
    let suffix = Uuid::new_v4().simple().to_string()[..10].to_owned();
    let c = consumer("billing", &format!("{prefix}-{suffix}"), &suffix);
    c.prepare(&mut redis, &pool).await.unwrap();
    (redis, pool, suffix, c)
}

#[tokio::test]
async fn an_event_delivered_twice_is_applied_once() {
    let (mut redis, pool, suffix, c) = prepared("inbox-example").await;
    let stream = c.stream.clone();

    let (e1, e2) = (Uuid::now_v7(), Uuid::now_v7());
    xadd(&mut redis, &stream, e1, "o1", 10).await;
    xadd(&mut redis, &stream, e2, "o1", 5).await;
    xadd(&mut redis, &stream, e1, "o1", 10).await; // the relay published e1 again
    let pass = c.pass(&mut redis, &pool, 100).await.unwrap();
    assert_eq!(pass, passed(3, 2, 1, 0));
    assert_eq!(total(&pool, &suffix, "o1").await, 15);

    clean_up(&mut redis, &pool, &[&stream], &suffix).await;
}

#[tokio::test]
async fn messages_of_a_failed_pass_are_taken_again() {
    let (mut redis, pool, suffix, c) = prepared("inbox-retry").await;
    let stream = c.stream.clone();
    xadd(&mut redis, &stream, Uuid::now_v7(), "o1", 10).await;
    xadd(&mut redis, &stream, Uuid::now_v7(), "o1", 5).await;
    let trimmed = xadd(&mut redis, &stream, Uuid::now_v7(), "o1", 100).await;

    // The database refuses the effect: the pass fails on its first message, having read three.
    let rename =
        |from: &str, to: &str| sqlx::AssertSqlSafe(format!("ALTER TABLE {from} RENAME TO {to}"));
    let (table, away) = (format!("totals_{suffix}"), format!("away_{suffix}"));
    sqlx::query(rename(&table, &away))
        .execute(&pool)
        .await
        .unwrap();
    let e = c.pass(&mut redis, &pool, 100).await.unwrap_err();
    assert!(e.contains(&table), "{e}");
    assert_eq!(pending(&mut redis, &stream).await, 3);
    sqlx::query(rename(&away, &table))
        .execute(&pool)
        .await
        .unwrap();
    // One of them is trimmed from the stream meanwhile: it comes back without fields.
    let _: i64 = redis::cmd("XDEL")
        .arg(&stream)
        .arg(&trimmed)
        .query_async(&mut redis)
        .await
        .unwrap();

    let pass = c.pass(&mut redis, &pool, 100).await.unwrap();
    assert_eq!(
        (pass.read, pass.applied, pass.duplicates),
        (3, 2, 0),
        "the pending messages are read again: {pass:?}"
    );
    assert_eq!(total(&pool, &suffix, "o1").await, 15);
    assert_eq!(pending(&mut redis, &stream).await, 0);
    let again = c.pass(&mut redis, &pool, 100).await.unwrap();
    assert_eq!(again.read, 0, "{again:?}");

    let dead = c.dead_letter_stream();
    clean_up(&mut redis, &pool, &[&stream, &dead], &suffix).await;
}

#[tokio::test]
async fn a_message_that_is_not_an_event_goes_to_the_dead_letter_stream() {
    let (mut redis, pool, suffix, c) = prepared("inbox-dead").await;
    let stream = c.stream.clone();
    xadd(&mut redis, &stream, Uuid::now_v7(), "o1", 10).await;
    let bad: String = redis::cmd("XADD")
        .arg(&stream)
        .arg("*")
        .arg("event_id")
        .arg("not-a-uuid")
        .arg("payload")
        .arg("{}")
        .query_async(&mut redis)
        .await
        .unwrap();
    xadd(&mut redis, &stream, Uuid::now_v7(), "o1", 5).await;

    let pass = c.pass(&mut redis, &pool, 100).await.unwrap();
    assert_eq!(pass, passed(3, 2, 0, 1));
    assert_eq!(total(&pool, &suffix, "o1").await, 15);
    assert_eq!(pending(&mut redis, &stream).await, 0);
    let dead = c.dead_letter_stream();
    let parked: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg(&dead)
        .arg("-")
        .arg("+")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(parked.ids.len(), 1);
    let parked = &parked.ids[0];
    assert_eq!(
        parked.get::<String>("source_id").as_deref(),
        Some(bad.as_str())
    );
    assert_eq!(
        parked.get::<String>("event_id").as_deref(),
        Some("not-a-uuid")
    );
    assert_eq!(parked.get::<String>("payload").as_deref(), Some("{}"));
    let reason: String = parked.get("reason").unwrap();
    assert!(reason.starts_with("no valid event_id"), "{reason}");

    clean_up(&mut redis, &pool, &[&stream, &dead], &suffix).await;
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
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT sum(total)::int8 FROM totals_{suffix}"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(total, 200);

    clean_up(&mut redis, &pool, &[&s1, &s2], &suffix).await;
}
