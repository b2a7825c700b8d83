//! The Kafka sink against a real Kafka-API broker process (`OUTBOX_TEST_KAFKA_BOOTSTRAP`,
//! default `127.0.0.1:9092`, the tansu broker `scripts/services.sh` starts). Every test uses
//! its own topics; the freeze test starts its own private broker.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, check_binary, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{
    awkward_event, describe_outcomes, publish_all, sample_batch, whole_call_error,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Payload, Sink};
use outboxkit_harness::{
    kafka_bootstrap, scratch_dir, unique, KafkaBrokerProcess, KafkaSide, OwnServer,
};
use outboxkit_sink_kafka::{KafkaSink, KafkaSinkConfig, RecordTimestamp, RELAY_HEADERS};

/// Partitions of the topics the tests create.
const PARTITIONS: i32 = 3;

/// A sink configuration for the test broker.
fn config(topic_template: &str) -> KafkaSinkConfig {
    KafkaSinkConfig {
        topic: topic_template.to_owned(),
        ..KafkaSinkConfig::new(kafka_bootstrap())
    }
}

/// A connected sink; fails the test (naming what to start) when the broker is unreachable.
async fn connect(config: KafkaSinkConfig) -> KafkaSink {
    KafkaSink::connect(config).await.unwrap_or_else(|e| {
        panic!(
            "Kafka at {} is unreachable ({e}): start it with scripts/services.sh \
             (or set OUTBOX_TEST_KAFKA_BOOTSTRAP)",
            kafka_bootstrap()
        )
    })
}

/// A test's own prefix and topic `<prefix>_order` on the test broker ([`PARTITIONS`]
/// partitions, these topic configs), where `config("<prefix>_{aggregate_type}")` sends orders.
async fn order_topic(configs: &[(&str, &str)]) -> (String, KafkaSide, String) {
    let prefix = unique("kafka");
    let kafka = configs.iter().fold(
        KafkaSide::open(&prefix).await.partitions(PARTITIONS),
        |side, (name, value)| side.topic_config(name, value),
    );
    let topic = format!("{prefix}_order");
    kafka.create_topic(&topic).await;
    (prefix, kafka, topic)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_key_value_and_headers() {
    let prefix = unique("kafka");
    let kafka = KafkaSide::open(&prefix).await.partitions(PARTITIONS);
    let topic = format!("{prefix}.order.OrderConfirmed");
    kafka.create_topic(&topic).await;
    // The default template: {aggregate_type}.{event_type}.
    let sink = connect(config(&format!(
        "{prefix}.{{aggregate_type}}.{{event_type}}"
    )))
    .await;

    let mut event = awkward_event(7, "order", "42", "OrderConfirmed");
    // A header of the writer's with a name the relay also sets: both are kept, the relay's
    // comes last (what a consumer's "last header" gives).
    event
        .headers
        .insert("event_type".to_owned(), "from-the-writer".to_owned());
    assert_eq!(sink.destination(&event), topic);

    let outcomes = sink
        .publish(std::slice::from_ref(&event))
        .await
        .expect("publish");
    assert!(
        outcomes[0].is_published(),
        "{}",
        describe_outcomes(&outcomes)
    );

    let got = kafka.read_topic(&topic, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!(m.key_text(), "42", "key = aggregate_id");
    assert_eq!(
        m.payload,
        event.payload_bytes(),
        "value = the payload, byte for byte"
    );
    let names: Vec<&str> = m.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "event_type",
            "tenant",
            "traceparent",
            "event_id",
            "event_type",
            "aggregate_type",
            "aggregate_id",
            "created_at"
        ],
        "the writer's headers, then the relay's"
    );
    assert_eq!(&names[3..], RELAY_HEADERS);
    assert_eq!(
        m.header("event_id"),
        Some(event.event_id.to_string().as_str())
    );
    assert_eq!(m.header("event_type"), Some("OrderConfirmed"));
    assert_eq!(m.headers[0].1, "from-the-writer");
    assert_eq!(m.header("aggregate_type"), Some("order"));
    assert_eq!(m.header("aggregate_id"), Some("42"));
    assert_eq!(m.header("created_at"), Some("2024-05-01T12:00:00.123456Z"));
    assert_eq!(m.header("tenant"), Some("acme \"eu\""));
    assert_eq!(
        m.header("traceparent"),
        event.headers.get("traceparent").map(String::as_str)
    );
}

/// `format = "cloudevents"`: binary content mode of the Kafka binding, read back by a plain
/// consumer — every attribute a `ce_` header, the content type the `content-type` header, the
/// value the payload byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_binary_mode_maps_every_attribute_to_a_header() {
    let (prefix, kafka, topic) = order_topic(&[]).await;
    let sink = connect(KafkaSinkConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..config(&format!("{prefix}_{{aggregate_type}}"))
    })
    .await;
    let events = sample_events(1, "order");
    publish_all(&sink, &events).await;
    let got = kafka.read_topic(&topic, 3, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 3);
    for event in &events {
        let id = event.event_id.to_string();
        let m = got
            .iter()
            .find(|m| m.header("ce_id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no message with ce_id {id}"));
        assert_eq!(m.key_text(), event.aggregate_id, "key = aggregate_id");
        let content_type = m.header("content-type").expect("content-type header");
        let headers = m.headers.iter().map(|(n, v)| (n.as_str(), v.as_str()));
        check_binary(event, headers, "ce_", content_type, &m.payload);
        // Each header once: an extension is not repeated as a plain header.
        let names: Vec<&str> = m.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert!(!names.contains(&"traceparent"), "{names:?}");
        assert_eq!(names.iter().filter(|n| **n == "content-type").count(), 1);
        assert_eq!(&names[names.len() - RELAY_HEADERS.len()..], RELAY_HEADERS);
    }
}

/// `tombstone_on_empty_payload`: an event whose payload is empty (the JSON `null`, no text, no
/// bytes) goes out with its aggregate's key, its headers and no value at all — what a compacted
/// topic deletes the key by — in either format (CloudEvents: no `content-type`, as there is no
/// data). Other events, and every event with the key off (the default), go out as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_payload_is_a_tombstone_when_asked() {
    let (prefix, kafka, topic) = order_topic(&[]).await;
    let template = format!("{prefix}_{{aggregate_type}}");
    let events = |first: i64| {
        [
            Payload::Json(r#"{"n": 1}"#.to_owned()),
            Payload::Json("null".to_owned()),
            Payload::Text(String::new()),
            Payload::Binary(Vec::new()),
        ]
        .into_iter()
        .zip(first..)
        .map(|(payload, id)| OutboxEvent::new(id, "order", id.to_string(), "Changed", payload))
        .collect::<Vec<_>>()
    };
    let raw = events(1);
    let cloudevents = events(5);
    let off = events(9);
    for (events, config) in [
        (
            &raw,
            KafkaSinkConfig {
                tombstone_on_empty_payload: true,
                ..config(&template)
            },
        ),
        (
            &cloudevents,
            KafkaSinkConfig {
                tombstone_on_empty_payload: true,
                format: Format::CloudEvents,
                cloudevents_source: SOURCE_TEMPLATE.to_owned(),
                ..config(&template)
            },
        ),
        (&off, config(&template)),
    ] {
        publish_all(&connect(config).await, events).await;
    }

    let got = kafka.read_topic(&topic, 12, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 12);
    let message = |event: &OutboxEvent| {
        let id = event.event_id.to_string();
        got.iter()
            .find(|m| m.header("event_id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no message with event_id {id}"))
    };
    for (events, tombstones) in [(&raw, true), (&cloudevents, true), (&off, false)] {
        for (i, event) in events.iter().enumerate() {
            let m = message(event);
            assert_eq!(m.key_text(), event.aggregate_id, "key = aggregate_id");
            assert_eq!(
                m.tombstone,
                tombstones && i > 0,
                "event {} ({:?} payload {:?}): tombstone",
                event.id,
                event.payload_type,
                String::from_utf8_lossy(&event.payload)
            );
            if !m.tombstone {
                assert_eq!(
                    m.payload, event.payload,
                    "value = the payload, byte for byte"
                );
            }
            assert_eq!(&m.header_map()["aggregate_id"], &event.aggregate_id);
        }
    }
    for (i, event) in cloudevents.iter().enumerate() {
        let m = message(event);
        assert_eq!(m.header("ce_id"), Some(event.event_id.to_string().as_str()));
        assert_eq!(m.header("ce_type"), Some("Changed"));
        assert_eq!(
            m.header("content-type").is_some(),
            i == 0,
            "content-type only on the event with data"
        );
    }
}

/// `timestamp = "created_at"`: the record's timestamp is the event's `created_at` (to the
/// millisecond), for consumers that window by event time; by default it is the produce time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_timestamp_is_the_produce_time_or_created_at() {
    let (prefix, kafka, topic) = order_topic(&[]).await;
    let template = format!("{prefix}_{{aggregate_type}}");
    // created_at 2024-05-01T12:00:00.123456Z.
    let produced = awkward_event(1, "order", "1", "Placed");
    let created = awkward_event(2, "order", "2", "Placed");
    let before = chrono::Utc::now().timestamp_millis();
    publish_all(
        &connect(config(&template)).await,
        std::slice::from_ref(&produced),
    )
    .await;
    let sink = connect(KafkaSinkConfig {
        timestamp: RecordTimestamp::CreatedAt,
        ..config(&template)
    })
    .await;
    publish_all(&sink, std::slice::from_ref(&created)).await;
    let after = chrono::Utc::now().timestamp_millis();

    let got = kafka.read_topic(&topic, 2, Duration::from_secs(15)).await;
    let timestamp = |event: &OutboxEvent| {
        let id = event.event_id.to_string();
        got.iter()
            .find(|m| m.header("event_id") == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no message with event_id {id}"))
            .timestamp
            .expect("a timestamp")
    };
    assert_eq!(timestamp(&created), 1_714_564_800_123, "created_at, in ms");
    let produce_time = timestamp(&produced);
    assert!(
        (before..=after).contains(&produce_time),
        "produce time {produce_time} within the call ({before}..{after})"
    );
}

/// A `cloudevents_source` that is not a URI-reference is refused at start, naming the key.
#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = KafkaSinkConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..config("orders")
    };
    assert_bad_source_refused(KafkaSink::new(config), "sink.kafka.cloudevents_source");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_aggregate_stays_in_one_partition_in_order() {
    let (prefix, kafka, topic) = order_topic(&[]).await;
    let sink = connect(config(&format!("{prefix}_{{aggregate_type}}"))).await;
    // 300 events over 20 aggregates, sent the way the engine sends them to this sink: one
    // event per aggregate per call, call after call.
    let batch = sample_batch(1, 300, "order", 20);
    for wave in batch.chunks(20) {
        publish_all(&sink, wave).await;
    }
    let got = kafka.read_topic(&topic, 300, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 300);
    let seq: HashMap<String, i64> = batch
        .iter()
        .map(|e| (e.event_id.to_string(), e.id))
        .collect();
    let mut home: HashMap<String, i32> = HashMap::new();
    let mut last: HashMap<String, i64> = HashMap::new();
    for m in &got {
        let key = m.key_text();
        let partition = *home.entry(key.clone()).or_insert(m.partition);
        assert_eq!(partition, m.partition, "aggregate {key} in two partitions");
        let id = seq[m.header("event_id").unwrap()];
        if let Some(previous) = last.insert(key.clone(), id) {
            assert!(previous < id, "aggregate {key}: {id} after {previous}");
        }
    }
    let used: HashSet<i32> = home.values().copied().collect();
    assert!(
        used.len() > 1,
        "20 keys spread over the partitions: {used:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_rejected_and_the_rest_published() {
    let (prefix, kafka, topic) = order_topic(&[("max.message.bytes", "10000")]).await;
    let sink = connect(
        config(&format!("{prefix}_{{aggregate_type}}")).property("message.max.bytes", "10000"),
    )
    .await;
    let mut batch = sample_batch(1, 4, "order", 3); // agg-0, agg-1, agg-2, agg-0
    batch[0].payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(20_000)).into_bytes();
    let outcomes = sink.publish(&batch).await.expect("publish");
    match &outcomes[0] {
        Outcome::Reject(e) => {
            assert_eq!(e.kind(), ErrorKind::MessageTooLarge, "{e}");
            let text = e.full_message();
            assert!(
                text.contains("message.max.bytes (10000 bytes)")
                    && text.contains(&format!("topic `{topic}`"))
                    && text.contains("payload 20012 bytes")
                    && text.contains("MSG_SIZE_TOO_LARGE"),
                "{text}"
            );
        }
        other => panic!("expected Reject, got {other:?}"),
    }
    assert!(
        outcomes[1].is_published() && outcomes[2].is_published(),
        "{}",
        describe_outcomes(&outcomes)
    );
    // The later event of the refused event's aggregate in the same call is not sent.
    match &outcomes[3] {
        Outcome::Retry(e) => assert!(
            e.message()
                .contains("an earlier event of aggregate `agg-0`"),
            "{e}"
        ),
        other => panic!("expected Retry, got {other:?}"),
    }
    let got = kafka.read_topic(&topic, 2, Duration::from_secs(15)).await;
    let ids: HashSet<String> = got
        .iter()
        .filter_map(|m| m.header("event_id").map(str::to_owned))
        .collect();
    let expected: HashSet<String> = [&batch[1], &batch[2]]
        .iter()
        .map(|e| e.event_id.to_string())
        .collect();
    assert_eq!(ids, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_properties_pass_through() {
    let (prefix, kafka, topic) = order_topic(&[]).await;
    let config = config(&format!("{prefix}_{{aggregate_type}}"))
        .property("compression.type", "zstd")
        .property("linger.ms", "1")
        .property("client.id", "outbox-relay-test")
        .property("partitioner", "murmur2_random");
    let sink = connect(config).await;
    let batch = sample_batch(1, 50, "order", 50);
    publish_all(&sink, &batch).await;
    let got = kafka.read_topic(&topic, 50, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 50, "zstd-compressed batches read back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_is_a_retry_never_a_reject() {
    let (prefix, _kafka, _existing) = order_topic(&[]).await;
    // librdkafka holds messages for a topic it has no metadata for this long before it calls
    // the topic missing (default 30 s).
    let config = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(3),
        ..config(&format!("{prefix}_{{aggregate_type}}"))
    }
    .property("topic.metadata.propagation.max.ms", "1000");
    let sink = connect(config).await;
    let mut batch = sample_batch(1, 2, "order", 2);
    batch[1].destination = Some(format!("{prefix}_never_created"));
    // The first call learns of the missing topic from a delivery report; the retry meets
    // librdkafka's own refusal to queue for a topic it now knows is missing. Both say the same.
    for call in ["first call", "retry"] {
        let outcomes = sink.publish(&batch).await.expect("publish");
        assert!(
            outcomes[0].is_published(),
            "{call}: {}",
            describe_outcomes(&outcomes)
        );
        match &outcomes[1] {
            Outcome::Retry(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{call}: {e}");
                assert!(
                    e.message().starts_with(&format!(
                        "topic `{prefix}_never_created` does not exist and the broker did not \
                         create it"
                    )),
                    "{call}: {e}"
                );
            }
            other => panic!("{call}: expected Retry, got {other:?}"),
        }
    }
}

/// A fixed topic (a template without placeholders) is looked up by `check`: one that exists
/// passes; one the broker does not have (tansu creates none on first use) is a configuration
/// error naming the key and the topic, before any event is taken and timed out. A template
/// that varies names no topic to look up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_looks_up_a_fixed_topic() {
    let (prefix, _kafka, topic) = order_topic(&[]).await;
    connect(config(&topic)).await;
    let missing = format!("{prefix}_never_created");
    let e = KafkaSink::connect(config(&missing))
        .await
        .expect_err("a fixed topic that does not exist");
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    assert_eq!(
        e.message(),
        format!(
            "sink.kafka.topic: topic `{missing}` does not exist on Kafka at {} and the broker \
             did not create it: create it (or enable auto.create.topics.enable on the broker)",
            kafka_bootstrap()
        )
    );
    connect(config(&format!("{prefix}_{{event_type}}"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_topic_name_kafka_cannot_have_is_rejected_at_once() {
    let (prefix, _kafka, _existing) = order_topic(&[]).await;
    let sink = connect(config(&format!("{prefix}_{{aggregate_type}}"))).await;
    // Four aggregates: a row destination and a rendered name Kafka refuses, between two
    // events that go out.
    let mut batch = sample_batch(1, 4, "order", 4);
    batch[1].destination = Some(format!("{prefix}/audit"));
    batch[2].aggregate_type = "order lines".to_owned();
    let started = Instant::now();
    let outcomes = sink.publish(&batch).await.expect("publish");
    let described = describe_outcomes(&outcomes);
    assert!(
        outcomes[0].is_published() && outcomes[3].is_published(),
        "{described}"
    );
    for (i, topic, why) in [
        (1, format!("{prefix}/audit"), "holds '/'"),
        (2, format!("{prefix}_order lines"), "holds ' '"),
    ] {
        match &outcomes[i] {
            Outcome::Reject(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                assert!(
                    e.message().starts_with(&format!("topic `{topic}` {why}")),
                    "{e}"
                );
            }
            other => panic!("event {i}: expected Reject, got {other:?}"),
        }
    }
    // Refused before sending: no wait for a metadata answer or a delivery timeout.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_the_brokers_and_the_key_when_unreachable() {
    let config = KafkaSinkConfig {
        check_timeout: Duration::from_secs(2),
        ..KafkaSinkConfig::new("127.0.0.1:1")
    };
    let started = Instant::now();
    let e = KafkaSink::connect(config)
        .await
        .expect_err("nothing listens on port 1");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(
        matches!(e.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{e:?}"
    );
    let text = e.full_message();
    assert!(
        text.starts_with("cannot reach Kafka at 127.0.0.1:1 (sink.kafka.\"bootstrap.servers\"): no metadata within 2s"),
        "{text}"
    );
    assert!(text.contains("Connection refused"), "says why: {text}");
}

/// The broker stops answering (SIGSTOP) for 12 s: calls fail as a whole as the engine decides
/// it (`Err`, or outcomes `whole_call_failure` fails the call for; never a Reject),
/// within about `delivery_timeout`; once it answers again the sink publishes by itself
/// (tansu fences the old producer id after librdkafka's epoch bump, so the sink makes a new
/// producer) and everything it acknowledged is in the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_broker_fails_calls_as_a_whole_and_the_sink_recovers() {
    let prefix = unique("kafka");
    let broker = KafkaBrokerProcess::start(&scratch_dir(&prefix));
    let kafka = KafkaSide::open_at(&broker.bootstrap, &prefix)
        .await
        .partitions(PARTITIONS);
    let topic = format!("{prefix}_order");
    kafka.create_topic(&topic).await;
    let config = KafkaSinkConfig {
        topic: format!("{prefix}_{{aggregate_type}}"),
        delivery_timeout: Duration::from_secs(4),
        ..KafkaSinkConfig::new(broker.bootstrap.clone())
    };
    let sink = connect(config).await;
    let mut next_id = 1;
    let mut acknowledged = HashSet::new();
    let mut publish = |outcomes: &[Outcome], batch: &[outboxkit_core::OutboxEvent]| {
        for (o, e) in outcomes.iter().zip(batch) {
            assert!(
                !matches!(o, Outcome::Reject(_)),
                "rejected during an outage: {o:?}"
            );
            if o.is_published() {
                acknowledged.insert(e.event_id.to_string());
            }
        }
    };

    let batch = sample_batch(next_id, 5, "order", 5);
    next_id += 5;
    publish(
        &sink
            .publish(&batch)
            .await
            .expect("publish before the outage"),
        &batch,
    );

    broker.freeze();
    let frozen = Instant::now();
    let mut whole_call_failures = 0;
    while frozen.elapsed() < Duration::from_secs(12) {
        let batch = sample_batch(next_id, 5, "order", 5);
        next_id += 5;
        let started = Instant::now();
        let result = sink.publish(&batch).await;
        if let Ok(outcomes) = &result {
            publish(outcomes, &batch);
        }
        if let Some(e) = whole_call_error(&result) {
            assert!(e.is_retryable(), "{e}");
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::Timeout | ErrorKind::Connection | ErrorKind::Unavailable
                ),
                "{e:?}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(4 + 15),
                "bounded by delivery_timeout"
            );
            whole_call_failures += 1;
        }
    }
    broker.thaw();
    assert!(
        whole_call_failures >= 1,
        "the outage failed calls as a whole"
    );

    // Recovery by itself: within a few calls everything is published again.
    let thawed = Instant::now();
    loop {
        let batch = sample_batch(next_id, 5, "order", 5);
        next_id += 5;
        match sink.publish(&batch).await {
            Ok(outcomes) if outcomes.iter().all(Outcome::is_published) => {
                publish(&outcomes, &batch);
                break;
            }
            Ok(outcomes) => publish(&outcomes, &batch),
            Err(e) => assert!(e.is_retryable(), "{e}"),
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(60),
            "the sink did not recover"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "recovered {:?} after the thaw; {whole_call_failures} whole-call failures; producer \
         generation {}",
        thawed.elapsed(),
        sink.producer_generation()
    );
    let got = kafka
        .read_topic(&topic, acknowledged.len(), Duration::from_secs(20))
        .await;
    let ids: HashSet<String> = got
        .iter()
        .filter_map(|m| m.header("event_id").map(str::to_owned))
        .collect();
    let lost: Vec<&String> = acknowledged.difference(&ids).collect();
    assert!(
        lost.is_empty(),
        "acknowledged but not in the topic: {lost:?}"
    );
}

/// TLS and SASL are librdkafka properties: the SASL settings reach the client (it attempts
/// the PLAIN handshake the broker requires), a failed authentication is reported as
/// `Unauthorized` with librdkafka's reason, and the password shows nowhere. (tansu 0.6
/// requires authentication with `--authentication` but its SASL handshake does not
/// interoperate with librdkafka 2.12 — "broker's supported mechanisms: (n/a)" — so a
/// successful SASL session cannot be shown against it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_properties_are_used_and_a_refused_handshake_is_unauthorized() {
    let broker =
        KafkaBrokerProcess::start_with(&scratch_dir(&unique("kafka")), &["--authentication"]);
    let config = KafkaSinkConfig {
        check_timeout: Duration::from_secs(3),
        ..KafkaSinkConfig::new(broker.bootstrap.clone())
    };

    // Without credentials the broker does not serve the client.
    let anonymous = KafkaSink::new(config.clone()).expect("a valid configuration");
    anonymous
        .check()
        .await
        .expect_err("the broker requires authentication");

    let config = config
        .property("security.protocol", "SASL_PLAINTEXT")
        .property("sasl.mechanisms", "PLAIN")
        .property("sasl.username", "outbox-relay")
        .property("sasl.password", "s3cr3t-pw");
    let sink = KafkaSink::new(config).expect("a valid configuration");
    let debug = format!("{sink:?}");
    assert!(
        !debug.contains("s3cr3t-pw") && debug.contains("sasl.password"),
        "{debug}"
    );
    let e = sink.check().await.expect_err("the handshake fails");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e:?}");
    let text = e.full_message();
    assert!(
        text.contains("SASL PLAIN mechanism handshake failed"),
        "{text}"
    );
    assert!(!text.contains("s3cr3t-pw"), "{text}");
    // Publishing fails as a whole, never parking events.
    let batch = sample_batch(1, 2, "order", 2);
    let config = KafkaSinkConfig {
        delivery_timeout: Duration::from_secs(3),
        ..sink.config().clone()
    };
    let sink = KafkaSink::new(config).expect("a valid configuration");
    let e = whole_call_error(&sink.publish(&batch).await).expect("no session, no delivery");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e:?}");
}
