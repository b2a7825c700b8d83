//! The webhook sink against a local HTTP server: what each request carries and what each
//! answer becomes (one outcome per event; `whole_call_failure` shows what the engine makes of
//! them), and `[sink.webhook]` read exactly as the relay's registry reads it.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Reply, TestServer};
use outboxkit_core::testkit::sink_suite::{
    assert_all_failed, assert_failed, sample_batch, sample_event,
};
use outboxkit_core::{whole_call_failure, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink};
use outboxkit_webhook_sink::{WebhookSink, WebhookSinkConfig};

fn config(server: &TestServer) -> WebhookSinkConfig {
    WebhookSinkConfig::new(format!("{}/hooks", server.url()))
}

fn sink(config: WebhookSinkConfig) -> WebhookSink {
    WebhookSink::new(config).unwrap_or_else(|e| panic!("building the sink: {e}"))
}

/// Every outcome, for assertion messages.
use outboxkit_core::testkit::sink_suite::describe_outcomes as describe;

/// A server answering every request with `reply`, and a sink posting to it.
async fn answering(reply: Reply) -> (TestServer, WebhookSink) {
    let server = TestServer::start().await;
    server.respond_with(move |_| reply.clone());
    let sink = sink(config(&server));
    (server, sink)
}

/// The outcomes of publishing `events` events, each of its own aggregate.
async fn publish_batch(sink: &WebhookSink, events: usize) -> Vec<Outcome> {
    let batch = sample_batch(1, events, "order", events);
    sink.publish(&batch).await.expect("outcomes")
}

/// `outcomes` all failed as `kind`, retried or not, and the engine fails the whole call: the
/// error it fails the call with.
fn call_failure(outcomes: &[Outcome], kind: ErrorKind, retried: bool) -> Error {
    assert_all_failed(outcomes, kind, retried);
    whole_call_failure(outcomes).expect("the engine fails the whole call")
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
        text.ends_with(&format!(
            "\"payload\":{}}}",
            String::from_utf8_lossy(&event.payload)
        )),
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
                    .ends_with("/hooks/throttled: HTTP 429 Too Many Requests"),
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
    assert_failed(&outcomes, 4, ErrorKind::Unavailable, true);
    assert_failed(&outcomes, 5, ErrorKind::Unroutable, false);
    match &outcomes[6] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidMessage);
            assert!(e.message().ends_with("total must be positive"), "{e}");
        }
        other => panic!("422: {other:?}"),
    }
    // Some events were published: the engine takes these outcomes event by event.
    assert!(whole_call_failure(&outcomes).is_none());
}

/// Every status of the table in `src/classify.rs`: its kind and whether it is retried.
#[tokio::test]
async fn every_status_has_its_kind() {
    use ErrorKind::*;
    let table: &[(u16, ErrorKind, bool)] = &[
        (301, Config, false),
        (302, Config, false),
        (307, Config, false),
        (308, Config, false),
        (400, InvalidMessage, false),
        (401, Unauthorized, false),
        (403, Unauthorized, false),
        (404, Unroutable, false),
        (405, InvalidMessage, false),
        (407, Unauthorized, false),
        (408, Timeout, true),
        (409, Other, true),
        (410, Unroutable, false),
        (413, MessageTooLarge, false),
        (422, InvalidMessage, false),
        (425, Other, true),
        (429, Unavailable, true),
        (451, InvalidMessage, false),
        (500, Other, true),
        (501, Other, true),
        (502, Unavailable, true),
        (503, Unavailable, true),
        (504, Timeout, true),
        (507, Other, true),
        (599, Other, true),
    ];
    let server = TestServer::start().await;
    server.respond_with(|request| {
        let code = request.path.rsplit('/').next().unwrap().parse().unwrap();
        Reply::status(code)
    });
    let sink = sink(config(&server));
    let batch: Vec<OutboxEvent> = table
        .iter()
        .map(|(code, _, _)| sample_event(1, &code.to_string(), "1", "Happened"))
        .collect();
    let outcomes = sink.publish(&batch).await.expect("outcomes");
    for ((code, kind, retried), outcome) in table.iter().zip(&outcomes) {
        let (e, was_retried) = match outcome {
            Outcome::Retry(e) => (e, true),
            Outcome::Reject(e) => (e, false),
            Outcome::Published => panic!("{code}: published"),
        };
        assert_eq!((e.kind(), was_retried), (*kind, *retried), "{code}: {e}");
        assert!(
            e.message().contains(&format!("/hooks/{code}: HTTP {code}")),
            "{e}"
        );
    }
}

#[tokio::test]
async fn throttling_on_every_request_fails_the_call_in_the_engine() {
    let (server, sink) = answering(Reply::status(429).header("Retry-After", "2")).await;
    let outcomes = publish_batch(&sink, 4).await;
    let e = call_failure(&outcomes, ErrorKind::Unavailable, true);
    assert_eq!(server.requests().len(), 4);
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
}

#[tokio::test]
async fn unreachable_endpoint_fails_every_event_as_a_connection_error() {
    let port = common::free_port();
    let sink = sink(WebhookSinkConfig::new(format!(
        "http://127.0.0.1:{port}/hooks?token=s3cr3t"
    )));
    let outcomes = publish_batch(&sink, 3).await;
    let e = call_failure(&outcomes, ErrorKind::Connection, true);
    assert!(
        e.message().contains(&format!(
            "cannot reach the webhook at 127.0.0.1:{port} (sink.webhook.url)"
        )),
        "{e}"
    );
    assert!(!e.full_message().contains("s3cr3t"), "{e}");
}

#[tokio::test]
async fn connection_closed_without_an_answer_is_a_connection_error() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and close at once, never answering.
    let closer = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    let sink = sink(WebhookSinkConfig::new(format!("http://{addr}/hooks")));
    let outcomes = sink.publish(&sample_batch(1, 2, "order", 2)).await;
    closer.abort();
    let outcomes = outcomes.expect("outcomes");
    let e = call_failure(&outcomes, ErrorKind::Connection, true);
    assert!(
        e.message()
            .contains("the connection failed before an answer arrived"),
        "{e}"
    );
}

#[tokio::test]
async fn server_errors_on_every_request_are_retried_per_event() {
    let (_server, sink) = answering(Reply::status(500)).await;
    let outcomes = publish_batch(&sink, 3).await;
    assert_all_failed(&outcomes, ErrorKind::Other, true);
    // A 500 is what a consumer that chokes on these very events answers: they must be able
    // to be parked eventually, so the engine counts an attempt against each.
    assert!(whole_call_failure(&outcomes).is_none());
}

#[tokio::test]
async fn refused_credentials_fail_the_call_in_the_engine() {
    let (_server, sink) = answering(Reply::status(401).body("invalid token")).await;
    let outcomes = publish_batch(&sink, 3).await;
    let e = call_failure(&outcomes, ErrorKind::Unauthorized, false);
    assert!(
        e.message()
            .ends_with("credentials refused: check sink.webhook.headers: invalid token"),
        "{e}"
    );
}

#[tokio::test]
async fn missing_endpoint_rejects_the_events() {
    let (_server, sink) = answering(Reply::status(404)).await;
    let outcomes = publish_batch(&sink, 2).await;
    assert_all_failed(&outcomes, ErrorKind::Unroutable, false);
    assert!(whole_call_failure(&outcomes).is_none(), "parked one by one");
}

#[tokio::test]
async fn slow_endpoint_times_out() {
    let server = TestServer::start().await;
    server.respond_with(|_| Reply::status(200).delay(Duration::from_secs(3)));
    let sink = sink(WebhookSinkConfig {
        timeout: Duration::from_millis(300),
        ..config(&server)
    });
    let started = Instant::now();
    let outcomes = publish_batch(&sink, 3).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let e = call_failure(&outcomes, ErrorKind::Timeout, true);
    assert!(
        e.message()
            .contains("the answer took longer than 300ms (sink.webhook.timeout)"),
        "{e}"
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
    let outcomes = publish_batch(&sink, 2).await;
    assert_all_failed(&outcomes, ErrorKind::Config, false);
    let e = whole_call_failure(&outcomes).expect("a configuration problem fails the call");
    assert!(e.message().contains("point sink.webhook.url"), "{e}");
    assert!(
        server
            .requests()
            .iter()
            .all(|r| !r.path.starts_with("/moved")),
        "followed the redirect"
    );
}

#[tokio::test]
async fn destinations_are_paths_under_the_url() {
    let server = TestServer::start().await;
    let sink = sink(WebhookSinkConfig::new(format!(
        "{}/hooks/?sig=1",
        server.url()
    )));
    let mut odd = sample_event(1, "order", "1", "Happened");
    odd.destination = Some("/a/b c?d#e".into());
    let plain = sample_event(2, "order", "2", "Happened");
    let outcomes = sink.publish(&[odd, plain]).await.unwrap();
    assert!(
        outcomes.iter().all(Outcome::is_published),
        "{}",
        describe(&outcomes)
    );
    let paths: Vec<String> = server.requests().iter().map(|r| r.path.clone()).collect();
    assert!(
        paths.contains(&"/hooks/a/b%20c%3Fd%23e?sig=1".to_owned()),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"/hooks/order?sig=1".to_owned()),
        "{paths:?}"
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
    assert_failed(&outcomes, 0, ErrorKind::InvalidMessage, false);
    assert_failed(&outcomes, 1, ErrorKind::Unroutable, false);
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

// --- `[sink.webhook]`, read as the relay's registry reads it. ---

/// `[sink.webhook]` (and `[sink] destination`) read by `outboxkit_relay::sink_config` from a
/// configuration file: deserialized, `sink.destination` applied, validated, errors located.
fn read(sink_keys: &str, section: &str) -> (Result<WebhookSinkConfig>, PathBuf) {
    let dir = std::env::temp_dir()
        .join("outbox-webhook-sink-tests")
        .join(uuid::Uuid::new_v4().simple().to_string());
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("relay.toml");
    let text = format!(
        "[store]\nkind = \"postgres\"\nurl = \"postgres://nobody@127.0.0.1:1/none\"\n\
         [sink]\nkind = \"webhook\"\n{sink_keys}\n[sink.webhook]\n{section}"
    );
    std::fs::write(&file, text).unwrap();
    let config = outboxkit_relay::sink_config_in_file::<WebhookSinkConfig>(&file);
    (config, file)
}

#[test]
fn settings_have_defaults_and_read_every_key() {
    let (config, _) = read("", "url = \"http://127.0.0.1:8080\"\n");
    let config = config.unwrap();
    assert_eq!(config, WebhookSinkConfig::new("http://127.0.0.1:8080"));
    assert_eq!(config.path, "{aggregate_type}");
    assert_eq!(config.timeout, Duration::from_secs(10));
    assert_eq!(config.connect_timeout, Duration::from_secs(5));
    assert!(config.headers.is_empty());
    assert_eq!((config.concurrency, config.max_batch_len), (16, 500));

    let (config, _) = read(
        "destination = \"{aggregate_type}/{event_type}\"",
        "url = \"https://hooks.example.com/outbox\"\npath = \"ignored\"\ntimeout = \"2s\"\n\
         connect_timeout = \"500ms\"\nconcurrency = 4\nmax_batch_len = 50\n\
         headers = { Authorization = \"Bearer t0k3n\", X-Tenant = \"acme\" }\n",
    );
    let config = config.unwrap();
    assert_eq!(
        config.path, "{aggregate_type}/{event_type}",
        "sink.destination wins"
    );
    assert_eq!(config.timeout, Duration::from_secs(2));
    assert_eq!(config.connect_timeout, Duration::from_millis(500));
    assert_eq!((config.concurrency, config.max_batch_len), (4, 50));
    assert_eq!(config.headers["X-Tenant"], "acme");
}

#[test]
fn invalid_settings_name_the_key_and_the_file() {
    let cases = [
        (
            "url = \"http://h\"\ntimeout = \"0s\"\n",
            "sink.webhook.timeout: must be longer than 0s",
        ),
        (
            "url = \"http://h\"\nmax_batch_len = 0\n",
            "sink.webhook.max_batch_len: must be at least 1",
        ),
        (
            "url = \"hooks.example.com/in\"\n",
            "sink.webhook.url: `hooks.example.com/in` is not a URL",
        ),
        (
            "url = \"http://h\"\nheaders = { \"Bad Name\" = \"x\" }\n",
            "sink.webhook.headers: `Bad Name` is not a valid HTTP header name",
        ),
        (
            "url = \"http://h\"\nheaders = { Authorization = \"Bearer s3cr3t\\r\\nX-Evil: 1\" }\n",
            "sink.webhook.headers: `Authorization` has a value that is not valid in HTTP",
        ),
    ];
    for (section, expected) in cases {
        let (config, file) = read("", section);
        let e = config.expect_err(section).to_string();
        assert!(
            e.starts_with(expected),
            "{section}\nexpected: {expected}\ngot: {e}"
        );
        assert!(e.ends_with(&format!("(in {})", file.display())), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
    }
    let (config, file) = read("destination = \"{aggregate}\"", "url = \"http://h\"\n");
    let e = config.unwrap_err().to_string();
    assert!(e.starts_with("sink.destination: "), "{e}");
    assert!(e.ends_with(&format!("(in {})", file.display())), "{e}");
}

#[test]
fn debug_hides_secrets() {
    let mut config =
        WebhookSinkConfig::new("https://relay:pa55w0rd@hooks.example.com/in?code=s3cr3t&v=2");
    config
        .headers
        .insert("Authorization".into(), "Bearer t0k3n".into());
    config.headers.insert("X-Tenant".into(), "acme".into());
    let debug = format!("{config:?} {:?}", WebhookSink::new(config.clone()).unwrap());
    for secret in ["pa55w0rd", "s3cr3t", "t0k3n", "acme"] {
        assert!(!debug.contains(secret), "{secret} in {debug}");
    }
    assert!(
        debug.contains("https://relay:***@hooks.example.com/in?code=***&v=***"),
        "{debug}"
    );
}
