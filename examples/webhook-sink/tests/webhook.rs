//! The webhook sink against a local HTTP server: what each request carries, and what each
//! answer becomes (outcome per event, or a failure of the whole call).

mod common;

use std::time::{Duration, Instant};

use common::{Reply, TestServer};
use outboxkit_core::testkit::sink_suite::{sample_batch, sample_event};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Sink};
use outboxkit_webhook_sink::{WebhookSink, WebhookSinkConfig};

fn config(server: &TestServer) -> WebhookSinkConfig {
    WebhookSinkConfig::new(format!("{}/hooks", server.url()))
}

fn sink(config: WebhookSinkConfig) -> WebhookSink {
    WebhookSink::new(config).unwrap_or_else(|e| panic!("building the sink: {e}"))
}

fn describe(outcomes: &[Outcome]) -> String {
    outcomes
        .iter()
        .map(|o| format!("{o:?}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[tokio::test]
async fn each_event_is_one_post_of_its_json_document() {
    let server = TestServer::start().await;
    let mut config = config(&server);
    config
        .headers
        .insert("Authorization".into(), "Bearer t0k3n".into());
    config.headers.insert("X-Source".into(), "orders-db".into());
    let sink = sink(config);

    let mut event = sample_event(1, "order", "42", "OrderConfirmed");
    event.payload = "{\"total\":  12.50, \"lines\": [1, 2], \"note\": \"caf\u{e9}\"}".into();
    event.headers.insert("tenant".into(), "acme".into());
    // Reserved and configured names stay in the body only.
    event
        .headers
        .insert("Content-Type".into(), "text/plain".into());
    event
        .headers
        .insert("authorization".into(), "Bearer forged".into());
    let outcomes = sink.publish(std::slice::from_ref(&event)).await.unwrap();
    assert!(outcomes[0].is_published(), "{}", describe(&outcomes));

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/hooks/order");
    assert_eq!(request.header("content-type"), Some("application/json"));
    assert_eq!(
        request.header("idempotency-key"),
        Some(event.event_id.to_string().as_str())
    );
    assert_eq!(
        request.header("traceparent"),
        Some(event.headers["traceparent"].as_str())
    );
    assert_eq!(request.header("tenant"), Some("acme"));
    assert_eq!(request.header("authorization"), Some("Bearer t0k3n"));
    assert_eq!(request.header("x-source"), Some("orders-db"));
    assert!(request
        .header("user-agent")
        .is_some_and(|ua| ua.starts_with("outbox-relay-webhook/")));

    let body = request.json();
    assert_eq!(body["event_id"], event.event_id.to_string());
    assert_eq!(body["aggregate_type"], "order");
    assert_eq!(body["aggregate_id"], "42");
    assert_eq!(body["event_type"], "OrderConfirmed");
    assert_eq!(
        body["created_at"],
        event
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
    );
    assert_eq!(body["headers"]["tenant"], "acme");
    assert_eq!(body["headers"]["Content-Type"], "text/plain");
    // The payload is embedded as JSON, not as a string, and byte for byte.
    assert!(body["payload"].is_object(), "{body}");
    assert_eq!(body["payload"]["lines"][1], 2);
    let text = String::from_utf8(request.body.clone()).unwrap();
    assert!(
        text.ends_with(&format!("\"payload\":{}}}", event.payload)),
        "{text}"
    );
}

#[tokio::test]
async fn each_answer_becomes_its_events_outcome() {
    let server = TestServer::start().await;
    server.respond_with(|request| match request.path.as_str() {
        "/hooks/ok" => Reply::status(200),
        "/hooks/created" => Reply::status(201),
        "/hooks/throttled" => Reply::status(429).header("Retry-After", "1"),
        "/hooks/broken" => Reply::status(500).body("{\"error\": \"boom\"}"),
        "/hooks/unavailable" => Reply::status(503),
        "/hooks/missing" => Reply::status(404),
        "/hooks/invalid" => Reply::status(422).body("total must be positive"),
        _ => Reply::status(400),
    });
    let sink = sink(config(&server));
    let destinations = [
        "ok",
        "created",
        "throttled",
        "broken",
        "unavailable",
        "missing",
        "invalid",
    ];
    let batch: Vec<OutboxEvent> = destinations
        .iter()
        .enumerate()
        .map(|(i, d)| sample_event(i as i64 + 1, d, &format!("agg-{i}"), "Happened"))
        .collect();
    let outcomes = sink.publish(&batch).await.expect("outcomes, not Err");
    assert_eq!(outcomes.len(), batch.len());
    let text = describe(&outcomes);
    assert!(outcomes[0].is_published(), "{text}");
    assert!(outcomes[1].is_published(), "{text}");
    match &outcomes[2] {
        Outcome::Retry(e) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable);
            assert!(
                e.message()
                    .ends_with("/hooks/throttled: HTTP 429 Too Many Requests (Retry-After 1s)"),
                "{e}"
            );
        }
        other => panic!("429: {other:?}"),
    }
    match &outcomes[3] {
        Outcome::Retry(e) => {
            assert_eq!(e.kind(), ErrorKind::Other);
            assert!(e.message().contains("HTTP 500"), "{e}");
            assert!(e.message().ends_with("{\"error\": \"boom\"}"), "{e}");
        }
        other => panic!("500: {other:?}"),
    }
    assert!(
        matches!(&outcomes[4], Outcome::Retry(e) if e.kind() == ErrorKind::Unavailable),
        "{text}"
    );
    assert!(
        matches!(&outcomes[5], Outcome::Reject(e) if e.kind() == ErrorKind::Unroutable),
        "{text}"
    );
    match &outcomes[6] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidMessage);
            assert!(e.message().ends_with("total must be positive"), "{e}");
        }
        other => panic!("422: {other:?}"),
    }
    // A call with some published events never pauses the sink.
    let again = sink.publish(&batch[..1]).await.expect("not paused");
    assert!(again[0].is_published());
}

#[tokio::test]
async fn throttling_on_every_request_fails_the_call_and_honours_retry_after() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(429).header("Retry-After", "2"));
    let sink = sink(config(&server));
    let batch = sample_batch(1, 4, "order", 4);

    let e = sink
        .publish(&batch)
        .await
        .expect_err("the whole call fails");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.is_retryable());
    assert!(
        e.message().starts_with("all 4 requests of the call failed"),
        "{e}"
    );
    assert_eq!(server.requests().len(), 4);

    // Within Retry-After, the sink does not send anything.
    server.respond_with(|_| Reply::status(200));
    let started = Instant::now();
    let e = sink.publish(&batch).await.expect_err("paused");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert!(e.message().contains("asked to wait (Retry-After)"), "{e}");
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(server.requests().len(), 4, "no request during the pause");

    // After it, it sends again.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let outcomes = sink.publish(&batch).await.expect("sends again");
    assert!(outcomes.iter().all(Outcome::is_published));
    assert_eq!(server.requests().len(), 8);
}

#[tokio::test]
async fn retry_after_is_capped_by_max_retry_after() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(503).header("Retry-After", "3600"));
    let sink = sink(WebhookSinkConfig {
        max_retry_after: Duration::from_millis(300),
        ..config(&server)
    });
    let batch = sample_batch(1, 2, "order", 2);
    sink.publish(&batch).await.expect_err("unavailable");
    server.respond_with(|_| Reply::status(204));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let outcomes = sink.publish(&batch).await.expect("the pause is over");
    assert!(outcomes.iter().all(Outcome::is_published));
}

#[tokio::test]
async fn server_errors_on_every_request_are_retried_per_event() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(500));
    let sink = sink(config(&server));
    let outcomes = sink
        .publish(&sample_batch(1, 3, "order", 3))
        .await
        .expect("a 500 is about the event: outcomes");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Retry(e) if e.kind() == ErrorKind::Other)),
        "{}",
        describe(&outcomes)
    );
}

#[tokio::test]
async fn refused_credentials_fail_the_call_without_parking_events() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(401).body("invalid token"));
    let sink = sink(config(&server));
    let e = sink
        .publish(&sample_batch(1, 3, "order", 3))
        .await
        .expect_err("the whole call fails");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(e.message().contains("sink.webhook.headers"), "{e}");
}

#[tokio::test]
async fn missing_endpoint_rejects_the_events() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(404));
    let sink = sink(config(&server));
    let outcomes = sink
        .publish(&sample_batch(1, 2, "order", 2))
        .await
        .expect("outcomes");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Outcome::Reject(e) if e.kind() == ErrorKind::Unroutable)),
        "{}",
        describe(&outcomes)
    );
}

#[tokio::test]
async fn slow_endpoint_times_out_as_a_whole() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(200).delay(Duration::from_secs(3)));
    let sink = sink(WebhookSinkConfig {
        timeout: Duration::from_millis(300),
        ..config(&server)
    });
    let started = Instant::now();
    let e = sink
        .publish(&sample_batch(1, 3, "order", 3))
        .await
        .expect_err("timed out");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.message().contains("sink.webhook.timeout"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = TestServer::start().await;
    server.respond_with(|request| {
        if request.path.starts_with("/moved") {
            Reply::status(200)
        } else {
            Reply::status(302).header("Location", "/moved?token=s3cr3t")
        }
    });
    let sink = sink(config(&server));
    let e = sink
        .publish(&sample_batch(1, 2, "order", 2))
        .await
        .expect_err("a redirect is a configuration problem");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert!(e.message().contains("point sink.webhook.url"), "{e}");
    assert!(!e.message().contains("s3cr3t"), "{e}");
    assert!(
        server
            .requests()
            .iter()
            .all(|r| !r.path.starts_with("/moved")),
        "followed the redirect"
    );
}

#[tokio::test]
async fn bad_events_are_rejected_without_a_request() {
    let server = TestServer::start().await;
    let sink = sink(config(&server));
    let mut not_json = sample_event(1, "order", "1", "Happened");
    not_json.payload = "not json".into();
    let mut escaping = sample_event(2, "order", "2", "Happened");
    escaping.destination = Some("../admin".into());
    let good = sample_event(3, "order", "3", "Happened");
    let outcomes = sink.publish(&[not_json, escaping, good]).await.unwrap();
    assert!(
        matches!(&outcomes[0], Outcome::Reject(e) if e.kind() == ErrorKind::InvalidMessage),
        "{}",
        describe(&outcomes)
    );
    assert!(
        matches!(&outcomes[1], Outcome::Reject(e) if e.kind() == ErrorKind::Unroutable),
        "{}",
        describe(&outcomes)
    );
    assert!(outcomes[2].is_published());
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_sent_concurrently_within_the_bound() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(200).delay(Duration::from_millis(100)));
    let sink = sink(WebhookSinkConfig {
        concurrency: 4,
        ..config(&server)
    });
    let batch = sample_batch(1, 20, "order", 20);
    let started = Instant::now();
    let outcomes = sink.publish(&batch).await.unwrap();
    let took = started.elapsed();
    assert!(outcomes.iter().all(Outcome::is_published));
    let max = server.max_in_flight();
    assert!((2..=4).contains(&max), "{max} requests in flight at once");
    // 20 requests of 100 ms, 4 at a time: about 500 ms, far below the 2 s of one at a time.
    assert!(took < Duration::from_millis(1800), "{took:?}");
    let mut received: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.header("idempotency-key").unwrap().to_owned())
        .collect();
    let mut sent: Vec<String> = batch.iter().map(|e| e.event_id.to_string()).collect();
    received.sort();
    sent.sort();
    assert_eq!(received, sent, "each event POSTed once");
}

#[tokio::test]
async fn check_accepts_any_http_answer_and_fails_without_one() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(405));
    let reachable = sink(config(&server));
    reachable
        .check()
        .await
        .expect("a 405 still proves the endpoint answers");
    assert_eq!(server.requests()[0].method, "HEAD");
    assert_eq!(server.requests()[0].path, "/hooks");

    let port = common::free_port();
    let unreachable = sink(WebhookSinkConfig::new(format!(
        "http://relay:s3cr3t@127.0.0.1:{port}/hooks"
    )));
    let e = unreachable.check().await.expect_err("nothing listens");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    assert!(
        e.message()
            .starts_with(&format!("HEAD http://relay:***@127.0.0.1:{port}/hooks: cannot reach the webhook at 127.0.0.1:{port} (sink.webhook.url)")),
        "{e}"
    );
    assert!(!e.full_message().contains("s3cr3t"), "{e}");
}
