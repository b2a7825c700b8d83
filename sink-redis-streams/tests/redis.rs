//! The Redis Streams sink against the real Redis (`OUTBOX_TEST_REDIS_URL`, default
//! `redis://127.0.0.1:6379`). Every test uses its own randomly named keys.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use outboxkit_core::cloudevents::{Format, STRUCTURED_CONTENT_TYPE};
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, check_structured, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{
    assert_all_published, awkward_event, describe_outcomes, publish_all, sample_batch,
    sample_event, whole_call_error,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Sink};
use outboxkit_harness::{redis_url, unique, RedisSide, StreamEntry};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};

fn config(stream: &str) -> RedisStreamsConfig {
    RedisStreamsConfig {
        stream: stream.to_owned(),
        ..RedisStreamsConfig::new(redis_url())
    }
}

async fn connect(config: RedisStreamsConfig) -> RedisStreamsSink {
    RedisStreamsSink::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test Redis: {e}"))
}

/// A test's own prefix, stream `<prefix>_order`, a sink connected with
/// `configure(config("<prefix>_{aggregate_type}"))` (which sends orders there), and the Redis
/// side under the prefix: (prefix, stream, sink, side).
async fn order_stream(
    configure: impl FnOnce(RedisStreamsConfig) -> RedisStreamsConfig,
) -> (String, String, RedisStreamsSink, RedisSide) {
    let prefix = unique("redis");
    let stream = format!("{prefix}_order");
    let sink = connect(configure(config(&format!("{prefix}_{{aggregate_type}}")))).await;
    let redis = RedisSide::open(&prefix).await;
    (prefix, stream, sink, redis)
}

/// Await `call`, which must fail (`why` says why it cannot succeed) within `limit`: its error.
async fn fails_within<T: std::fmt::Debug>(
    limit: Duration,
    call: impl Future<Output = outboxkit_core::Result<T>>,
    why: &str,
) -> outboxkit_core::Error {
    let started = Instant::now();
    let error = call.await.expect_err(why);
    assert!(started.elapsed() < limit, "took {:?}", started.elapsed());
    error
}

/// `format = "cloudevents"`: structured content mode, read back with a plain `XRANGE` — the
/// event's fields, `payload` the JSON event format document (every attribute, `data` or
/// `data_base64`) and `content_type`; no `created_at` (it is in the document), and `headers`
/// only for headers that are not extension attributes.
#[tokio::test]
async fn cloudevents_structured_mode_puts_the_document_in_payload() {
    let (prefix, stream, sink, redis) = order_stream(|config| RedisStreamsConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..config
    })
    .await;
    let events = sample_events(1, "order");
    let entries = publish_and_read(
        &sink,
        &redis,
        &stream,
        &events,
        &["payload", "content_type"],
    )
    .await;
    for (entry, event) in entries.iter().zip(&events) {
        assert_eq!(entry.text("content_type"), STRUCTURED_CONTENT_TYPE);
        check_structured(event, entry.field("payload").expect("payload"));
    }

    // Headers the document cannot carry (not extension names) travel in a `headers` field.
    let stream = format!("{prefix}_tenants");
    let mut event = sample_events(10, "order").remove(0);
    event.headers.insert("tenant-id".into(), "acme".into());
    event.destination = Some(stream.clone());
    let fields = ["payload", "content_type", "headers"];
    let entries = publish_and_read(&sink, &redis, &stream, &[event.clone()], &fields).await;
    check_structured(&event, entries[0].field("payload").expect("payload"));
    assert_eq!(entries[0].text("headers"), r#"{"tenant-id":"acme"}"#);
}

/// An event whose stream name renders empty (`{aggregate_type}` of `""`) is rejected, not
/// written to a stream named `""`; the rest of the batch is published.
#[tokio::test]
async fn an_empty_stream_name_is_rejected() {
    let prefix = unique("redis");
    let sink = connect(config("{aggregate_type}")).await;
    let redis = RedisSide::open(&prefix).await;
    let empty = sample_event(1, "", "A", "OrderPlaced");
    let fine = sample_event(2, &format!("{prefix}_order"), "B", "OrderPlaced");
    let outcomes = sink.publish(&[empty, fine]).await.unwrap();
    match &outcomes[0] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidMessage);
            assert!(e.message().contains("the stream name is empty"), "{e}");
        }
        other => panic!("expected a rejection: {other:?}"),
    }
    assert!(matches!(outcomes[1], Outcome::Published), "{outcomes:?}");
    assert_eq!(
        redis.stream_len("").await,
        0,
        "nothing written under the empty key"
    );
    redis.delete(&[format!("{prefix}_order")]).await;
}

/// A `cloudevents_source` that is not a URI-reference is refused at start, naming the key.
#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = RedisStreamsConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..config("orders")
    };
    assert_bad_source_refused(
        RedisStreamsSink::connect_lazy(config),
        "sink.redis_streams.cloudevents_source",
    );
}

/// Publish `events` (all published), read `stream` back, and check each entry's field names
/// (the event's fields, then `more`, in entry order) and the event's fields; the entries, in
/// batch order.
async fn publish_and_read(
    sink: &RedisStreamsSink,
    redis: &RedisSide,
    stream: &str,
    events: &[OutboxEvent],
    more: &[&str],
) -> Vec<StreamEntry> {
    let event_fields = ["event_id", "aggregate_type", "aggregate_id", "event_type"];
    let fields = [&event_fields[..], more].concat();
    publish_all(sink, events).await;

    let entries = redis.entries(stream).await;
    redis.expire(stream, 600).await;
    assert_eq!(entries.len(), events.len());
    for (entry, event) in entries.iter().zip(events) {
        let names: Vec<&str> = entry.fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, fields);
        // Entries are in batch order: the pipeline keeps it.
        assert_eq!(entry.text("event_id"), event.event_id.to_string());
        assert_eq!(entry.text("aggregate_type"), "order");
        assert_eq!(entry.text("aggregate_id"), event.aggregate_id);
        assert_eq!(entry.text("event_type"), event.event_type);
    }
    entries
}

#[tokio::test]
async fn entries_carry_exactly_the_specified_fields() {
    let (_, stream, sink, redis) = order_stream(std::convert::identity).await;

    let with_headers = awkward_event(1, "order", "42", "OrderConfirmed");
    let mut without_headers = sample_event(2, "order", "43", "OrderCancelled");
    without_headers.headers.clear();
    let third = sample_event(3, "order", "42", "OrderShipped");
    let batch = vec![with_headers, without_headers, third];

    let fields = ["payload", "headers", "created_at"];
    let entries = publish_and_read(&sink, &redis, &stream, &batch, &fields).await;
    for (entry, event) in entries.iter().zip(&batch) {
        assert_eq!(entry.field("payload").unwrap(), event.payload_bytes());
        let headers: BTreeMap<String, String> =
            serde_json::from_str(&entry.text("headers")).expect("headers is a JSON object");
        assert_eq!(headers, event.headers);
        let created_at = chrono::DateTime::parse_from_rfc3339(&entry.text("created_at"))
            .expect("created_at is RFC 3339");
        assert_eq!(
            created_at.timestamp_micros(),
            event.created_at.timestamp_micros()
        );
    }
    assert_eq!(entries[0].text("created_at"), "2024-05-01T12:00:00.123456Z");
    assert_eq!(entries[1].text("headers"), "{}");
}

#[tokio::test]
async fn maxlen_trims_the_stream() {
    let (_, stream, sink, redis) = order_stream(|config| RedisStreamsConfig {
        maxlen: Some(100),
        ..config
    })
    .await;
    let batch = sample_batch(1, 5000, "order", 50);
    for chunk in batch.chunks(sink.capabilities().max_batch_len) {
        let outcomes = sink.publish(chunk).await.expect("publish");
        assert_eq!(outcomes.len(), chunk.len());
        assert_all_published(&outcomes);
    }
    let len = redis.stream_len(&stream).await;
    redis.expire(&stream, 600).await;
    // `MAXLEN ~` trims whole radix-tree nodes (100 entries each by default): about 100 left.
    assert!(
        (100..500).contains(&len),
        "XLEN {stream} = {len} after 5000 XADD with MAXLEN ~ 100"
    );
}

/// A Redis user `<prefix>_user` with `password` that may run only `commands` (`+ping`...), made
/// on the test server (remove it with [`delete_user`]): its name, and the test URL with its
/// credentials for a password.
async fn restricted_user(
    redis: &RedisSide,
    prefix: &str,
    password: &str,
    commands: &[&str],
) -> (String, impl Fn(&str) -> String) {
    let user = format!("{prefix}_user");
    let mut set_user = redis::cmd("ACL");
    set_user.arg("SETUSER").arg(&user).arg("on");
    set_user.arg(format!(">{password}")).arg("~*").arg("-@all");
    let () = redis.query(set_user.arg(commands)).await;
    let name = user.clone();
    let url_with = move |password: &str| {
        let mut url = url::Url::parse(&redis_url()).unwrap();
        url.set_username(&name).unwrap();
        url.set_password(Some(password)).unwrap();
        url.to_string()
    };
    (user, url_with)
}

/// Remove the user [`restricted_user`] made.
async fn delete_user(redis: &RedisSide, user: &str) {
    let _: i64 = redis
        .query(redis::cmd("ACL").arg("DELUSER").arg(user))
        .await;
}

/// `max_age`: every `XADD` drops, about, the entries Redis added longer ago than that
/// (`MINID ~`): a stream's 1,000 entries of two hours ago go with `max_age = "1h"` and stay
/// with `"3h"`. `check` reads the server's version (7.x here) and passes, and a user whose ACL
/// refuses `INFO` passes too.
#[tokio::test]
async fn max_age_trims_what_redis_added_longer_ago() {
    let two_hours_ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        - 2 * 3_600_000;
    let mut stream_len = BTreeMap::new();
    for (max_age, prefix) in [(1, unique("redis")), (3, unique("redis"))] {
        let stream = format!("{prefix}_order");
        let redis = RedisSide::open(&prefix).await;
        let mut old = redis::pipe();
        for seq in 0..1000 {
            old.cmd("XADD")
                .arg(&stream)
                .arg(format!("{two_hours_ago}-{seq}"))
                .arg("old")
                .arg(seq)
                .ignore();
        }
        let () = old
            .query_async(&mut redis.connection())
            .await
            .expect("XADD the old entries");
        let sink = connect(RedisStreamsConfig {
            max_age: Some(Duration::from_secs(max_age * 3_600)),
            ..config(&format!("{prefix}_{{aggregate_type}}"))
        })
        .await;
        sink.check().await.expect("check with max_age on Redis 7");
        let outcomes = sink
            .publish(&sample_batch(1, 5, "order", 5))
            .await
            .expect("publish");
        assert_all_published(&outcomes);
        stream_len.insert(max_age, redis.stream_len(&stream).await);
        redis.delete(&[stream]).await;
    }
    // `MINID ~` trims whole radix-tree nodes (100 entries each by default): every node of old
    // entries is older than the hour, none of them than three hours.
    assert_eq!(stream_len[&1], 5, "entries left with max_age = 1h");
    assert_eq!(stream_len[&3], 1005, "entries left with max_age = 3h");

    let prefix = unique("redis");
    let redis = RedisSide::open(&prefix).await;
    let (user, url_with) = restricted_user(&redis, &prefix, "pw", &["+ping"]).await;
    let sink = RedisStreamsSink::connect(RedisStreamsConfig {
        max_age: Some(Duration::from_secs(60)),
        ..RedisStreamsConfig::new(url_with("pw"))
    })
    .await;
    let checked = match &sink {
        Ok(sink) => Some(sink.check().await),
        Err(_) => None,
    };
    delete_user(&redis, &user).await;
    sink.expect("connect as a user that may only PING");
    checked
        .expect("checked")
        .expect("check passes when INFO is refused");
}

#[tokio::test]
async fn wrongtype_rejects_only_the_events_for_that_key() {
    let prefix = unique("redis");
    let good = format!("{prefix}_good");
    let bad = format!("{prefix}_bad");
    let redis = RedisSide::open(&prefix).await;
    let _: () = redis::cmd("SET")
        .arg(&bad)
        .arg("not a stream")
        .arg("EX")
        .arg(600)
        .query_async(&mut redis.connection())
        .await
        .expect("SET");
    let sink = connect(config(&format!("{prefix}_{{aggregate_type}}"))).await;

    let batch: Vec<OutboxEvent> = (0..10)
        .map(|i| {
            let aggregate_type = if i % 3 == 1 { "bad" } else { "good" };
            sample_event(i + 1, aggregate_type, &format!("agg-{i}"), "Happened")
        })
        .collect();
    let outcomes = sink
        .publish(&batch)
        .await
        .expect("publish returns outcomes");
    assert_eq!(outcomes.len(), batch.len());
    for (event, outcome) in batch.iter().zip(&outcomes) {
        if event.aggregate_type == "bad" {
            match outcome {
                Outcome::Reject(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
                    assert!(!e.is_retryable());
                    assert!(e.message().contains("WRONGTYPE"), "{e}");
                    assert!(e.message().contains(&bad), "{e}");
                }
                other => panic!("event for the string key: {other:?}"),
            }
        } else {
            assert!(outcome.is_published(), "event for the stream: {outcome:?}");
        }
    }
    let entries = redis.entries(&good).await;
    redis.expire(&good, 600).await;
    let expected: Vec<String> = batch
        .iter()
        .filter(|e| e.aggregate_type == "good")
        .map(|e| e.event_id.to_string())
        .collect();
    let got: Vec<String> = entries.iter().map(|e| e.text("event_id")).collect();
    assert_eq!(got, expected);
    let kind: String = redis::cmd("TYPE")
        .arg(&bad)
        .query_async(&mut redis.connection())
        .await
        .expect("TYPE");
    assert_eq!(kind, "string");
}

#[tokio::test]
async fn unreachable_url_fails_connect_naming_the_host() {
    let error = fails_within(
        Duration::from_secs(5),
        RedisStreamsSink::connect(RedisStreamsConfig::new("redis://127.0.0.1:1")),
        "nothing listens on port 1",
    )
    .await;
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.is_retryable());
    assert_eq!(
        error.to_string(),
        "cannot reach Redis at 127.0.0.1:1 (sink.redis_streams.url): connection refused"
    );
}

/// A server that answers the connection's setup with an error (a database number it does not
/// have) is reachable: a configuration error naming the URL, not "cannot reach".
#[tokio::test]
async fn a_database_the_server_does_not_have_is_a_configuration_error() {
    let url = format!("{}/9999", redis_url().trim_end_matches('/'));
    let error = RedisStreamsSink::connect(RedisStreamsConfig::new(url))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Config, "{error}");
    let text = error.to_string();
    assert!(
        text.starts_with("Redis at ")
            && text.contains(" refused to set up the connection (sink.redis_streams.url): ")
            && text.ends_with("(check the URL's database number, user and protocol)"),
        "{text}"
    );
}

#[tokio::test]
async fn silent_server_times_out() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let config = RedisStreamsConfig {
        connect_timeout: Duration::from_millis(500),
        response_timeout: Duration::from_millis(800),
        ..RedisStreamsConfig::new(format!("redis://{address}"))
    };

    let error = fails_within(
        Duration::from_secs(3),
        RedisStreamsSink::connect(config.clone()),
        "the server never answers",
    )
    .await;
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(error.to_string().contains(&address.to_string()), "{error}");
    // rediss:// to a server that does not take TLS looks the same: the likely cause is said.
    let tls = fails_within(
        Duration::from_secs(3),
        RedisStreamsSink::connect(RedisStreamsConfig {
            url: format!("rediss://{address}"),
            ..config.clone()
        }),
        "the server never answers the handshake",
    )
    .await;
    assert_eq!(
        tls.to_string(),
        format!(
            "cannot reach Redis at {address} (sink.redis_streams.url): no answer within 500ms \
             (the URL asks for TLS with rediss://: check that the server takes TLS on this port)"
        )
    );

    let sink = RedisStreamsSink::connect_lazy(config).unwrap();
    let error = fails_within(
        Duration::from_secs(3),
        sink.publish(&sample_batch(1, 3, "order", 1)),
        "the server never answers",
    )
    .await;
    assert!(error.is_retryable(), "{error}");
    assert!(
        matches!(error.kind(), ErrorKind::Timeout | ErrorKind::Connection),
        "{error}"
    );
    holder.abort();
}

#[tokio::test]
async fn reconnects_after_its_connection_is_killed() {
    let (_, stream, sink, redis) = order_stream(std::convert::identity).await;
    let batch = sample_batch(1, 30, "order", 3);
    let outcomes = sink.publish(&batch[..10]).await.expect("first publish");
    assert!(outcomes.iter().all(Outcome::is_published));

    let id = sink.client_id().await.expect("CLIENT ID");
    let killed: i64 = redis
        .query(redis::cmd("CLIENT").arg("KILL").arg("ID").arg(id))
        .await;
    assert_eq!(killed, 1, "the sink's connection {id} was killed");

    // The call that finds the connection dead may fail as a whole (retryable); it never
    // rejects events.
    let mut published = 10;
    match sink.publish(&batch[10..20]).await {
        Ok(outcomes) => {
            assert_all_published(&outcomes);
            published = 20;
        }
        Err(e) => {
            assert!(e.is_retryable(), "{e}");
            assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
        }
    }
    let outcomes = sink
        .publish(&batch[published..])
        .await
        .expect("the call after a dropped connection goes through a new one");
    assert_all_published(&outcomes);
    let new_id = sink.client_id().await.expect("CLIENT ID");
    assert_ne!(new_id, id);

    let entries = redis.entries(&stream).await;
    redis.expire(&stream, 600).await;
    let got: Vec<String> = entries.iter().map(|e| e.text("event_id")).collect();
    let expected: Vec<String> = batch[..10]
        .iter()
        .chain(&batch[published..])
        .map(|e| e.event_id.to_string())
        .collect();
    assert_eq!(got, expected);
}

/// A user that may connect but not write: wrong password fails connect as unauthorized,
/// `NOPERM` on `XADD` fails the whole publish as the engine decides it (nothing parked).
#[tokio::test]
async fn refused_credentials_fail_the_call_not_the_events() {
    let prefix = unique("redis");
    let redis = RedisSide::open(&prefix).await;
    let (user, url_with) =
        restricted_user(&redis, &prefix, "right-password", &["+ping", "+client|id"]).await;

    let wrong = RedisStreamsSink::connect(RedisStreamsConfig::new(url_with("wrong-password")))
        .await
        .map(drop);
    // The same password from the `password` key: the error names that key.
    let mut user_only = url::Url::parse(&url_with("x")).unwrap();
    user_only.set_password(None).unwrap();
    let wrong_key = RedisStreamsSink::connect(RedisStreamsConfig {
        password: Some("wrong-password".to_owned()),
        ..RedisStreamsConfig::new(user_only.to_string())
    })
    .await
    .map(drop);
    let sink = RedisStreamsSink::connect(RedisStreamsConfig {
        stream: format!("{prefix}_{{aggregate_type}}"),
        ..RedisStreamsConfig::new(url_with("right-password"))
    })
    .await;
    let published = match &sink {
        Ok(sink) => Some(sink.publish(&sample_batch(1, 3, "order", 1)).await),
        Err(_) => None,
    };
    delete_user(&redis, &user).await;

    let error = wrong.expect_err("wrong password");
    assert_eq!(error.kind(), ErrorKind::Unauthorized, "{error}");
    assert!(!error.is_retryable());
    assert!(
        error.to_string().ends_with(
            "refused the credentials (sink.redis_streams.url): \
             authentication failed (check the user name and password)"
        ),
        "{error}"
    );
    assert!(!error.to_string().contains("wrong-password"), "{error}");
    let error = wrong_key.expect_err("wrong password in the password key");
    assert_eq!(error.kind(), ErrorKind::Unauthorized, "{error}");
    assert!(
        error.to_string().contains(
            "refused the credentials (sink.redis_streams.url, sink.redis_streams.password): "
        ),
        "{error}"
    );
    assert!(!error.to_string().contains("wrong-password"), "{error}");

    let sink = sink.unwrap_or_else(|e| panic!("connect with the right password: {e}"));
    assert!(!format!("{sink:?}").contains("right-password"));
    let published = published.unwrap();
    if let Ok(outcomes) = &published {
        assert!(
            !outcomes.iter().any(Outcome::is_published),
            "{}",
            describe_outcomes(outcomes)
        );
    }
    let error = whole_call_error(&published)
        .expect("NOPERM fails the call as a whole (the engine parks nothing)");
    assert_eq!(error.kind(), ErrorKind::Unauthorized, "{error}");
    assert!(!error.is_retryable());
    assert!(error.message().contains("NOPERM"), "{error}");
}

#[tokio::test]
async fn kind_capabilities_and_check() {
    let sink = connect(RedisStreamsConfig {
        max_batch_len: 250,
        ..config("{aggregate_type}")
    })
    .await;
    assert_eq!(sink.kind(), "redis-streams");
    let capabilities = sink.capabilities();
    assert_eq!(capabilities.max_batch_len, 250);
    assert_eq!(capabilities.max_payload_bytes, Some(512 * 1024 * 1024));
    assert!(!capabilities.ordered_per_key);
    sink.check().await.expect("PING");
}
