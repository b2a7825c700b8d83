//! The RabbitMQ sink against the real RabbitMQ (`OUTBOX_TEST_RABBITMQ_URL`, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). Every test uses its own routing keys and queues.

use std::time::{Duration, Instant};

use lapin::types::AMQPValue;
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, check_binary, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{
    assert_all_published, assert_failed, awkward_event, describe_outcomes, publish_all,
    sample_batch, sample_event,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Sink};
use outboxkit_harness::proxy::Blackhole;
use outboxkit_harness::{
    amqp_headers, rabbitmq_address, rabbitmq_url, rabbitmqctl, unique, RabbitMqSide,
};
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink, UnroutablePolicy};

/// The durable topic exchange the tests publish to (each test uses its own routing keys).
const TEST_EXCHANGE: &str = "outbox.tests";

fn config(routing_key: &str) -> RabbitMqConfig {
    RabbitMqConfig {
        routing_key: routing_key.to_owned(),
        ..RabbitMqConfig::new(rabbitmq_url(), TEST_EXCHANGE)
    }
}

/// A test's own prefix, its own exchange `<prefix>.<name>` (not declared here), and a
/// configuration publishing to that exchange with routing key `<prefix>.{aggregate_type}`.
fn own_exchange(name: &str) -> (String, String, RabbitMqConfig) {
    let prefix = unique("rabbitmq");
    let exchange = format!("{prefix}.{name}");
    let config = RabbitMqConfig {
        routing_key: format!("{prefix}.{{aggregate_type}}"),
        ..RabbitMqConfig::new(rabbitmq_url(), &exchange)
    };
    (prefix, exchange, config)
}

/// A test's own prefix, and the test exchange (declared) with queue `<prefix>.order` bound to
/// it for the routing key of that name — where `config("<prefix>.{aggregate_type}")` sends
/// orders; `arguments` add queue arguments.
async fn order_queue(arguments: &[(&str, AMQPValue)]) -> (String, RabbitMqSide, String) {
    let prefix = unique("rabbitmq");
    let broker = RabbitMqSide::open(TEST_EXCHANGE).await;
    broker.declare_exchange().await;
    let queue = format!("{prefix}.order");
    broker.bind_queue(&queue, &queue, arguments).await;
    (prefix, broker, queue)
}

/// Drain `queue` (waiting for as many messages as `events`) and assert that every one of
/// `events` arrived, at least once.
async fn assert_arrived(broker: &RabbitMqSide, queue: &str, events: &[&OutboxEvent]) {
    let deliveries = broker
        .drain(queue, events.len(), Duration::from_secs(10))
        .await;
    let ids: std::collections::HashSet<String> = deliveries
        .iter()
        .filter_map(|d| d.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    for event in events {
        assert!(
            ids.contains(&event.event_id.to_string()),
            "{} lost",
            event.id
        );
    }
}

/// The properties every message of `event` has: `message_id` = `event_id`, `type` =
/// `event_type`, persistent.
fn assert_event_properties(p: &lapin::BasicProperties, event: &OutboxEvent) {
    assert_eq!(
        p.message_id().as_ref().map(|s| s.to_string()),
        Some(event.event_id.to_string())
    );
    assert_eq!(
        p.kind().as_ref().map(|s| s.to_string()),
        Some(event.event_type.clone())
    );
    assert_eq!(*p.delivery_mode(), Some(2), "persistent");
}

/// `rabbitmqctl` on the local broker; fails the test when it fails.
fn ctl(args: &[&str]) -> String {
    rabbitmqctl(args).unwrap_or_else(|e| panic!("{e}"))
}

async fn connect(config: RabbitMqConfig) -> RabbitMqSink {
    RabbitMqSink::connect(config)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test RabbitMQ: {e}"))
}

fn url_with_password(password: &str, vhost: &str) -> String {
    let mut url = url::Url::parse(&rabbitmq_url()).expect("a URL");
    url.set_password(Some(password)).expect("a URL with a host");
    url.set_path(vhost);
    url.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_the_specified_properties_and_headers() {
    let prefix = unique("rabbitmq");
    let broker = RabbitMqSide::open(TEST_EXCHANGE).await;
    broker.declare_exchange().await;
    let queue = format!("{prefix}.all");
    broker.bind_queue(&queue, &format!("{prefix}.#"), &[]).await;
    let sink = connect(config(&format!(
        "{prefix}.{{aggregate_type}}.{{event_type}}"
    )))
    .await;

    let mut first = awkward_event(1, "order", "42", "OrderConfirmed");
    // A writer's header named like an event field does not override the event's own value.
    first
        .headers
        .insert("aggregate_id".to_owned(), "spoofed".to_owned());
    let mut second = sample_event(2, "invoice", "7", "InvoiceSent");
    second.headers.clear();
    let mut third = sample_event(3, "order", "43", "OrderCancelled");
    third.destination = Some(format!("{prefix}.audit"));
    let batch = vec![first, second, third];

    publish_all(&sink, &batch).await;
    let deliveries = broker.drain(&queue, 3, Duration::from_secs(10)).await;
    broker.delete_queue(&queue).await;
    assert_eq!(deliveries.len(), 3);
    let expected_keys = [
        format!("{prefix}.order.OrderConfirmed"),
        format!("{prefix}.invoice.InvoiceSent"),
        format!("{prefix}.audit"),
    ];
    for ((delivery, event), key) in deliveries.iter().zip(&batch).zip(&expected_keys) {
        let p = &delivery.properties;
        assert_eq!(delivery.exchange.as_str(), TEST_EXCHANGE);
        assert_eq!(delivery.routing_key.as_str(), key);
        assert_eq!(delivery.data, event.payload_bytes(), "payload bytes");
        assert_event_properties(p, event);
        assert_eq!(
            p.content_type().as_ref().map(|s| s.to_string()),
            Some("application/json".to_owned())
        );
        assert_eq!(
            *p.timestamp(),
            Some(event.created_at.timestamp() as u64),
            "timestamp in seconds"
        );
        let headers = amqp_headers(delivery);
        assert_eq!(headers["event_id"], event.event_id.to_string());
        assert_eq!(headers["aggregate_type"], event.aggregate_type);
        assert_eq!(headers["aggregate_id"], event.aggregate_id);
        assert_eq!(headers["event_type"], event.event_type);
        for (name, value) in &event.headers {
            if name != "aggregate_id" {
                assert_eq!(headers.get(name), Some(value), "header {name}");
            }
        }
    }
    let headers = amqp_headers(&deliveries[0]);
    assert_eq!(headers["created_at"], "2024-05-01T12:00:00.123456Z");
    assert_eq!(headers["tenant"], "acme \"eu\"");
    assert_eq!(headers["aggregate_id"], "42");
    let names: Vec<String> = amqp_headers(&deliveries[1]).into_keys().collect();
    assert_eq!(
        names,
        [
            "aggregate_id",
            "aggregate_type",
            "created_at",
            "event_id",
            "event_type"
        ]
    );
}

/// `format = "cloudevents"`: binary content mode of the AMQP binding, read back by a plain
/// consumer — every attribute a `cloudEvents:` header, the content type the `content_type`
/// property, the body the payload byte for byte, the other properties as in raw format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_maps_every_attribute_to_a_header() {
    let (prefix, broker, queue) = order_queue(&[]).await;
    let sink = connect(RabbitMqConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..config(&format!("{prefix}.{{aggregate_type}}"))
    })
    .await;
    let events = sample_events(1, "order");
    publish_all(&sink, &events).await;
    let deliveries = broker.drain(&queue, 3, Duration::from_secs(10)).await;
    broker.delete_queue(&queue).await;
    assert_eq!(deliveries.len(), 3);
    for (delivery, event) in deliveries.iter().zip(&events) {
        let p = &delivery.properties;
        let headers = amqp_headers(delivery);
        let content_type = p.content_type().as_ref().expect("content_type").to_string();
        let pairs = headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        check_binary(event, pairs, "cloudEvents:", &content_type, &delivery.data);
        // Each header once: an extension is not repeated as a plain header.
        assert!(!headers.contains_key("traceparent"), "{headers:?}");
        assert!(!headers.contains_key("content-type"), "{headers:?}");
        // The properties and the event's fields as in raw format.
        assert_event_properties(p, event);
        assert_eq!(
            p.app_id().as_ref().map(|s| s.to_string()).as_deref(),
            Some("outbox-relay")
        );
        assert_eq!(headers["event_id"], event.event_id.to_string());
    }
}

/// A `cloudevents_source` that is not a URI-reference is refused at start, naming the key.
#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = RabbitMqConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..config("orders")
    };
    assert_bad_source_refused(
        RabbitMqSink::connect_lazy(config),
        "sink.rabbitmq.cloudevents_source",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unroutable_messages_never_count_as_published() {
    let (prefix, broker, bound) = order_queue(&[]).await;
    let sink = connect(config(&format!("{prefix}.{{aggregate_type}}"))).await;

    // Orders are routed; invoices (no queue bound) are not — interleaved in one batch, so
    // that `multiple` acks mix the returned messages with the acked ones.
    let mut batch: Vec<OutboxEvent> = Vec::new();
    for i in 0..40 {
        let kind = if i % 3 == 0 { "invoice" } else { "order" };
        batch.push(sample_event(i + 1, kind, &format!("a{i}"), "Changed"));
    }
    let outcomes = sink.publish(&batch).await.expect("publish");
    assert_eq!(outcomes.len(), batch.len());
    for (event, outcome) in batch.iter().zip(&outcomes) {
        if event.aggregate_type == "invoice" {
            match outcome {
                Outcome::Retry(e) => {
                    assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                    let text = e.full_message();
                    assert!(text.contains("312 NO_ROUTE"), "{text}");
                    assert!(text.contains(&format!("`{prefix}.invoice`")), "{text}");
                    assert!(text.contains("`outbox.tests`"), "{text}");
                }
                other => panic!("unroutable event {}: {other:?}", event.id),
            }
        } else {
            assert!(outcome.is_published(), "event {}: {outcome:?}", event.id);
        }
    }
    let routed = batch.iter().filter(|e| e.aggregate_type == "order").count();
    let deliveries = broker.drain(&bound, routed, Duration::from_secs(10)).await;
    assert_eq!(deliveries.len(), routed);

    // unroutable = "reject": parked at once.
    let rejecting = connect(RabbitMqConfig {
        unroutable: UnroutablePolicy::Reject,
        ..config(&format!("{prefix}.{{aggregate_type}}"))
    })
    .await;
    let batch = vec![
        sample_event(100, "order", "x", "Changed"),
        sample_event(101, "invoice", "y", "Changed"),
    ];
    let outcomes = rejecting.publish(&batch).await.expect("publish");
    assert!(
        outcomes[0].is_published(),
        "{}",
        describe_outcomes(&outcomes)
    );
    assert_failed(&outcomes, 1, ErrorKind::Unroutable, false);

    // mandatory = false: RabbitMQ drops unroutable messages silently and acks them (documented).
    let lax = connect(RabbitMqConfig {
        mandatory: false,
        ..config(&format!("{prefix}.{{aggregate_type}}"))
    })
    .await;
    publish_all(&lax, &batch).await;
    assert_eq!(
        broker.drain(&bound, 2, Duration::from_secs(10)).await.len(),
        2
    );
    broker.delete_queue(&bound).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacked_messages_are_retried() {
    let (prefix, broker, queue) = order_queue(&[
        ("x-max-length", AMQPValue::LongInt(2)),
        ("x-overflow", AMQPValue::LongString("reject-publish".into())),
    ])
    .await;
    let sink = connect(config(&format!("{prefix}.{{aggregate_type}}"))).await;
    let batch = sample_batch(1, 5, "order", 5);
    let outcomes = sink.publish(&batch).await.expect("publish");
    let published = outcomes.iter().filter(|o| o.is_published()).count();
    assert_eq!(published, 2, "{}", describe_outcomes(&outcomes));
    for outcome in &outcomes[2..] {
        match outcome {
            Outcome::Retry(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
                assert!(e.message().contains("basic.nack"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
    let deliveries = broker.drain(&queue, 2, Duration::from_secs(10)).await;
    assert_eq!(deliveries.len(), 2);
    broker.delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_that_cannot_be_amqp_messages_are_rejected_alone() {
    let (prefix, broker, queue) = order_queue(&[]).await;
    let sink = connect(RabbitMqConfig {
        max_message_bytes: 1000,
        ..config(&format!("{prefix}.{{aggregate_type}}"))
    })
    .await;
    let mut batch = sample_batch(1, 5, "order", 5);
    batch[1].destination = Some("k".repeat(300));
    batch[2].headers.insert("h".repeat(256), "v".to_owned());
    batch[3].payload = format!("\"{}\"", "x".repeat(2000)).into_bytes();
    let outcomes = sink.publish(&batch).await.expect("publish");
    assert!(outcomes[0].is_published() && outcomes[4].is_published());
    for (i, kind) in [
        (1, ErrorKind::InvalidMessage),
        (2, ErrorKind::InvalidMessage),
        (3, ErrorKind::MessageTooLarge),
    ] {
        match &outcomes[i] {
            Outcome::Reject(e) => assert_eq!(e.kind(), kind, "event {i}: {e}"),
            other => panic!("event {i}: {other:?}"),
        }
    }
    assert_eq!(
        broker.drain(&queue, 2, Duration::from_secs(10)).await.len(),
        2
    );
    broker.delete_queue(&queue).await;
}

/// Restores the broker's `max_message_size` when dropped, even if the test fails.
struct MaxMessageSize(String);

impl Drop for MaxMessageSize {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rabbitmqctl")
            .args([
                "eval",
                &format!("application:set_env(rabbit, max_message_size, {}).", self.0),
            ])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_broker_refuses_is_rejected_and_the_rest_published() {
    // Lower the broker's max_message_size (new channels pick it up), restore it afterwards.
    let current = ctl(&["eval", "application:get_env(rabbit, max_message_size)."]);
    let current = current
        .trim()
        .strip_prefix("{ok,")
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or("134217728")
        .to_owned();
    let _restore = MaxMessageSize(current);
    ctl(&[
        "eval",
        "application:set_env(rabbit, max_message_size, 65536).",
    ]);

    let (prefix, broker, queue) = order_queue(&[]).await;
    // The sink allows more than the broker does: the broker closes the channel.
    let sink = connect(config(&format!("{prefix}.{{aggregate_type}}"))).await;
    let mut batch = sample_batch(1, 6, "order", 6);
    batch[2].payload = format!("\"{}\"", "x".repeat(100_000)).into_bytes();
    let outcomes = sink.publish(&batch).await.expect("publish");
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            match outcome {
                Outcome::Reject(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
                    assert!(e.full_message().contains("406"), "{e}");
                }
                other => panic!("the oversized event: {other:?}"),
            }
        } else {
            assert!(outcome.is_published(), "event {i}: {outcome:?}");
        }
    }
    // Each good event arrived (maybe twice: at least once), the refused one never.
    let deliveries = broker.drain(&queue, 5, Duration::from_secs(10)).await;
    let ids: std::collections::HashSet<String> = deliveries
        .iter()
        .filter_map(|d| d.properties.message_id().as_ref().map(|s| s.to_string()))
        .collect();
    for (i, event) in batch.iter().enumerate() {
        assert_eq!(
            ids.contains(&event.event_id.to_string()),
            i != 2,
            "event {i}"
        );
    }
    // The sink goes on with a new channel.
    let next = sample_batch(10, 3, "order", 3);
    let outcomes = sink
        .publish(&next)
        .await
        .expect("publish after the refusal");
    assert_all_published(&outcomes);
    broker.delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_exchange_fails_the_call_and_is_named() {
    let (prefix, exchange, config) = own_exchange("missing");
    let e = RabbitMqSink::connect(config.clone()).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(&format!("exchange `{exchange}` does not exist")),
        "{text}"
    );
    assert!(text.contains("sink.rabbitmq.declare_exchange"), "{text}");

    // Publishing to it fails the whole call (nothing is dead-lettered)...
    let sink = RabbitMqSink::connect_lazy(config).unwrap();
    let batch = sample_batch(1, 4, "order", 4);
    let e = sink.publish(&batch).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
    assert!(e.to_string().contains(&exchange), "{e}");

    // ... and once the exchange exists, the same sink publishes (a new channel is opened).
    let broker = RabbitMqSide::open(&exchange).await;
    broker.declare_exchange().await;
    let queue = format!("{prefix}.order");
    broker.bind_queue(&queue, &queue, &[]).await;
    publish_all(&sink, &batch).await;
    assert_eq!(
        broker.drain(&queue, 4, Duration::from_secs(10)).await.len(),
        4
    );
    broker.delete_queue(&queue).await;
    broker.delete_exchange().await;
}

/// On the default exchange a fixed routing key names the one queue every event goes to: the
/// start-up check refuses a queue that does not exist (naming both keys), and passes once it
/// does. A key that varies, or `mandatory = false` (a message nothing takes is dropped, by
/// choice), is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_looks_up_the_queue_a_fixed_key_names_on_the_default_exchange() {
    let prefix = unique("rabbitmq");
    let queue = format!("{prefix}.orders");
    let direct = |routing_key: &str| RabbitMqConfig {
        routing_key: routing_key.to_owned(),
        ..RabbitMqConfig::new(rabbitmq_url(), "")
    };
    let e = RabbitMqSink::connect(direct(&queue)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("queue `{queue}` does not exist on RabbitMQ at "))
            && text.contains(
                "the default exchange (sink.rabbitmq.exchange = \"\") routes by queue name and \
                 sink.rabbitmq.routing_key names this queue: declare it, or fix the key"
            ),
        "{text}"
    );
    connect(RabbitMqConfig {
        mandatory: false,
        ..direct(&queue)
    })
    .await;
    connect(direct(&format!("{prefix}.{{aggregate_type}}"))).await;

    let broker = RabbitMqSide::open("").await;
    let _declared = broker.declare_queue(&queue, &[]).await;
    let sink = connect(direct(&queue)).await;
    let batch = sample_batch(1, 2, "order", 2);
    publish_all(&sink, &batch).await;
    let arrived = broker.drain(&queue, 2, Duration::from_secs(10)).await;
    broker.delete_queue(&queue).await;
    assert_eq!(arrived.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declares_the_exchange_when_asked_and_names_a_conflict() {
    let (prefix, exchange, config) = own_exchange("declared");
    let declaring = RabbitMqConfig {
        declare_exchange: true,
        exchange_type: "direct".to_owned(),
        exchange_durable: false,
        ..config
    };
    let sink = connect(declaring.clone()).await;
    let broker = RabbitMqSide::open(&exchange).await;
    let queue = format!("{prefix}.order");
    broker.bind_queue(&queue, &queue, &[]).await;
    let batch = sample_batch(1, 3, "order", 3);
    publish_all(&sink, &batch).await;
    assert_eq!(
        broker.drain(&queue, 3, Duration::from_secs(10)).await.len(),
        3
    );

    let e = RabbitMqSink::connect(RabbitMqConfig {
        exchange_type: "fanout".to_owned(),
        ..declaring
    })
    .await
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let text = e.to_string();
    assert!(text.contains(&format!("exchange `{exchange}`")), "{text}");
    assert!(text.contains("sink.rabbitmq.exchange_type"), "{text}");
    assert!(text.contains("406"), "{text}");
    broker.delete_queue(&queue).await;
    broker.delete_exchange().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_are_unauthorized_and_the_password_never_shows() {
    let config = RabbitMqConfig::new(url_with_password("n0t-the-s3cr3t", "/%2f"), "");
    let e = RabbitMqSink::connect(config.clone()).await.unwrap_err();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{text}");
    assert!(!e.is_retryable());
    assert!(text.contains("refused user `guest`"), "{text}");
    assert!(text.contains("sink.rabbitmq.url"), "{text}");
    assert!(!text.contains("n0t-the-s3cr3t"), "{text}");
    let sink = RabbitMqSink::connect_lazy(config).unwrap();
    assert!(!format!("{sink:?}").contains("n0t-the-s3cr3t"));
    let e = sink
        .publish(&sample_batch(1, 1, "order", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!e.to_string().contains("n0t-the-s3cr3t"), "{e}");
}

/// A broker user of the test's own (a unique name), with `password` and every permission on
/// vhost `/`; deleted when dropped, also when the test fails.
struct TestUser {
    name: String,
}

impl TestUser {
    fn add(password: &str) -> Self {
        let user = Self {
            name: unique("outbox_pw_user"),
        };
        ctl(&["add_user", &user.name, password]);
        ctl(&["set_permissions", "-p", "/", &user.name, ".*", ".*", ".*"]);
        user
    }

    /// The test broker's URL with this user and `password` in the user info (`None`: no
    /// password in the URL).
    fn url(&self, password: Option<&str>) -> String {
        let mut url = url::Url::parse(&rabbitmq_url()).expect("a URL");
        url.set_username(&self.name).expect("a URL with a host");
        url.set_password(password).expect("a URL with a host");
        url.to_string()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if let Err(e) = rabbitmqctl(&["delete_user", &self.name]) {
            eprintln!("{e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_password_key_alone_logs_in_and_publishes() {
    let password = format!("pw-{}", unique("key"));
    let user = TestUser::add(&password);
    let (prefix, broker, queue) = order_queue(&[]).await;
    let routing_key = format!("{prefix}.{{aggregate_type}}");

    // The URL names the user only; the password comes from its own key.
    let config = RabbitMqConfig {
        password: Some(password.clone()),
        connection_name: format!("{prefix}-relay"),
        ..RabbitMqConfig::new(user.url(None), TEST_EXCHANGE)
    };
    let sink = connect(RabbitMqConfig {
        routing_key: routing_key.clone(),
        ..config
    })
    .await;
    assert!(!format!("{sink:?}").contains(&password), "{sink:?}");
    let batch = sample_batch(1, 5, "order", 2);
    assert_all_published(&sink.publish(&batch).await.expect("publish"));
    let listing = ctl(&["list_connections", "user", "client_properties", "-s"]);
    assert!(
        listing
            .lines()
            .any(|line| line.contains(&format!("{prefix}-relay")) && line.starts_with(&user.name)),
        "no connection of {} named {prefix}-relay:\n{listing}",
        user.name
    );
    drop(sink);

    // The key replaces a password the URL has (a stale one here), it is not a fallback.
    let sink = connect(RabbitMqConfig {
        password: Some(password.clone()),
        routing_key,
        ..RabbitMqConfig::new(user.url(Some("stale-url-password")), TEST_EXCHANGE)
    })
    .await;
    let more = sample_batch(6, 5, "order", 2);
    assert_all_published(&sink.publish(&more).await.expect("publish"));
    let sent: Vec<&OutboxEvent> = batch.iter().chain(&more).collect();
    assert_arrived(&broker, &queue, &sent).await;
    broker.delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_key_is_unauthorized_and_never_shows() {
    let user = TestUser::add(&format!("pw-{}", unique("right")));
    let wrong = format!("n0t-the-s3cr3t-{}", unique("wrong"));
    let config = RabbitMqConfig {
        password: Some(wrong.clone()),
        ..RabbitMqConfig::new(user.url(None), "")
    };
    let debug = format!("{config:?}");
    assert!(!debug.contains(&wrong), "{debug}");
    assert!(debug.contains("password: Some(\"***\")"), "{debug}");

    let e = RabbitMqSink::connect(config.clone()).await.unwrap_err();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{text}");
    assert!(!e.is_retryable(), "{text}");
    assert!(
        text.contains(&format!("refused user `{}`", user.name)),
        "{text}"
    );
    assert!(
        text.contains("(sink.rabbitmq.url, sink.rabbitmq.password)"),
        "{text}"
    );
    assert!(!text.contains(&wrong), "{text}");
    assert!(!format!("{e:?}").contains(&wrong), "{e:?}");

    // A lazily built sink fails its first call the same way.
    let sink = RabbitMqSink::connect_lazy(config).unwrap();
    assert!(!format!("{sink:?}").contains(&wrong));
    let e = sink
        .publish(&sample_batch(1, 1, "order", 1))
        .await
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!e.to_string().contains(&wrong), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_key_with_a_url_without_user_logs_in_as_guest() {
    let host = rabbitmq_address();
    let wrong = format!("n0t-guests-{}", unique("pw"));
    let config = RabbitMqConfig {
        password: Some(wrong.clone()),
        ..RabbitMqConfig::new(format!("amqp://{host}/%2f"), "")
    };
    let e = RabbitMqSink::connect(config).await.unwrap_err();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{text}");
    assert!(text.contains("refused user `guest`"), "{text}");
    assert!(!text.contains(&wrong), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_vhost_is_refused_and_named() {
    let url = url::Url::parse(&rabbitmq_url()).unwrap();
    let password = url.password().unwrap_or("guest").to_owned();
    let config = RabbitMqConfig::new(url_with_password(&password, "/no-such-vhost"), "");
    let e = RabbitMqSink::connect(config).await.unwrap_err();
    let text = e.to_string();
    assert!(!e.is_retryable(), "{text}");
    assert!(text.contains("vhost `no-such-vhost`"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_broker_closes_its_connection() {
    let (prefix, broker, queue) = order_queue(&[]).await;
    let name = format!("{prefix}-relay");
    let sink = connect(RabbitMqConfig {
        connection_name: name.clone(),
        ..config(&format!("{prefix}.{{aggregate_type}}"))
    })
    .await;
    let first = sample_batch(1, 10, "order", 10);
    let outcomes = sink.publish(&first).await.expect("publish");
    assert!(outcomes.iter().all(Outcome::is_published));

    // An operator closes the relay's connection.
    let listing = ctl(&["list_connections", "pid", "client_properties", "-s"]);
    let pid = listing
        .lines()
        .find(|line| line.contains(&name))
        .and_then(|line| line.split_whitespace().next())
        .unwrap_or_else(|| panic!("connection {name} not listed:\n{listing}"))
        .to_owned();
    ctl(&["close_connection", &pid, "test closes the connection"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while sink.is_connected().await {
        assert!(Instant::now() < deadline, "the sink never saw the close");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The next calls reconnect by themselves; a call that fails does so as a whole, retryably.
    let second = sample_batch(11, 10, "order", 10);
    let mut failures = 0;
    loop {
        match sink.publish(&second).await {
            Ok(outcomes) => {
                assert_all_published(&outcomes);
                break;
            }
            Err(e) => {
                assert!(e.is_retryable(), "{e}");
                assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
                failures += 1;
                assert!(failures < 5, "still failing: {e}");
            }
        }
    }
    assert!(sink.is_connected().await);
    let sent: Vec<&OutboxEvent> = first.iter().chain(&second).collect();
    assert_arrived(&broker, &queue, &sent).await;
    broker.delete_queue(&queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_name_the_server_and_the_key() {
    let config = RabbitMqConfig {
        connect_timeout: Duration::from_secs(3),
        ..RabbitMqConfig::new("amqp://relay:s3cr3t@127.0.0.1:1/%2f", "events")
    };
    let e = RabbitMqSink::connect(config).await.unwrap_err();
    let text = e.to_string();
    assert_eq!(e.kind(), ErrorKind::Connection, "{text}");
    assert!(e.is_retryable());
    assert!(
        text.starts_with("cannot reach RabbitMQ at 127.0.0.1:1 (sink.rabbitmq.url): "),
        "{text}"
    );
    assert!(!text.contains("s3cr3t"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_answering_times_out_and_the_sink_recovers() {
    // A proxy to the broker that can freeze: bytes stop flowing both ways and the connections
    // stay open — a broker that hangs.
    let proxy = Blackhole::to(rabbitmq_address()).await;
    let (prefix, broker, queue) = order_queue(&[]).await;
    let mut url = url::Url::parse(&rabbitmq_url()).unwrap();
    url.set_port(Some(proxy.port())).unwrap();
    let sink = connect(RabbitMqConfig {
        confirm_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..RabbitMqConfig {
            url: url.to_string(),
            ..config(&format!("{prefix}.{{aggregate_type}}"))
        }
    })
    .await;
    let first = sample_batch(1, 5, "order", 5);
    assert!(sink
        .publish(&first)
        .await
        .expect("publish")
        .iter()
        .all(Outcome::is_published));

    // The broker hangs: the call fails as a whole, in bounded time, retryably.
    proxy.partition();
    let second = sample_batch(6, 5, "order", 5);
    let started = Instant::now();
    let e = sink.publish(&second).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{e}");
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_retryable());
    assert!(
        e.to_string().contains("sink.rabbitmq.confirm_timeout"),
        "{e}"
    );
    // Still hanging: reconnecting times out too (connect_timeout).
    let e = sink.publish(&second).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
    assert!(e.is_retryable());

    // It answers again: the next call goes through a new connection.
    proxy.heal();
    publish_all(&sink, &second).await;
    let sent: Vec<&OutboxEvent> = first.iter().chain(&second).collect();
    assert_arrived(&broker, &queue, &sent).await;
    broker.delete_queue(&queue).await;
}
