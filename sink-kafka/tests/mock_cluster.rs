//! Error handling through the real librdkafka producer against librdkafka's in-process mock
//! cluster, which fails chosen requests on demand: what the broker says decides each event's
//! outcome, and the outcomes' kinds whether the engine fails the whole call
//! (`outboxkit_core::whole_call_failure`). (The end-to-end behaviour against a real broker process
//! is in `kafka.rs` and the workspace's `tests/`.)

use std::time::Duration;

use outboxkit_core::testkit::sink_suite::{
    assert_all_published, describe_outcomes, publish_all, sample_batch, sample_event,
    whole_call_error,
};
use outboxkit_core::{ErrorKind, Outcome, Sink};
use outboxkit_sink_kafka::{KafkaSink, KafkaSinkConfig, RecordTimestamp};
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

const TOPIC: &str = "mock.order";

fn mock() -> MockCluster<'static, rdkafka::producer::DefaultProducerContext> {
    let cluster = MockCluster::new(1).expect("starting librdkafka's mock cluster");
    cluster
        .create_topic(TOPIC, 1, 1)
        .expect("creating the mock topic");
    cluster
}

fn sink(cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>) -> KafkaSink {
    let config = KafkaSinkConfig {
        topic: "mock.{aggregate_type}".to_owned(),
        delivery_timeout: Duration::from_secs(10),
        ..KafkaSinkConfig::new(cluster.bootstrap_servers())
    }
    // Keep librdkafka's own retries short so a test does not wait for its backoff.
    .property("retry.backoff.ms", "10");
    KafkaSink::new(config).expect("a valid configuration")
}

/// `check` of a fixed topic the broker refuses to describe says so, naming the topic and the
/// key, with the kind of the broker's refusal: not authorized is no configuration error, the
/// grant is missing.
#[tokio::test]
async fn check_of_a_fixed_topic_the_broker_refuses_names_it() {
    let cluster = mock();
    cluster
        .topic_error(
            TOPIC,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .expect("setting the topic's error");
    let config = KafkaSinkConfig {
        topic: TOPIC.to_owned(),
        ..KafkaSinkConfig::new(cluster.bootstrap_servers())
    };
    let e = KafkaSink::connect(config)
        .await
        .expect_err("the topic's metadata is refused");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(
        e.message().starts_with(&format!(
            "sink.kafka.topic: topic `{TOPIC}` on Kafka at {}: ",
            cluster.bootstrap_servers()
        )) && e.message().contains("Topic authorization failed"),
        "{e}"
    );
}

#[tokio::test]
async fn refused_topic_authorization_fails_the_whole_call() {
    let cluster = mock();
    let sink = sink(&cluster);
    sink.check().await.expect("the mock cluster answers");
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let batch = sample_batch(1, 3, "order", 3);
    let e = whole_call_error(&sink.publish(&batch).await)
        .expect("authorization failure fails the call");
    assert_eq!(e.kind(), ErrorKind::Unauthorized, "{e}");
    assert!(!e.is_retryable(), "{e}");
    assert!(
        e.message().contains("Topic authorization failed"),
        "the broker's reason is in the message: {e}"
    );
    assert!(e.message().contains("mock.order"), "names the topic: {e}");
    // Once the broker accepts again, the same events go through (with a new producer, which
    // does not remember the refusal).
    assert_eq!(sink.producer_generation(), 1);
    publish_all(&sink, &batch).await;
}

#[tokio::test]
async fn a_message_the_broker_finds_too_large_is_rejected() {
    let cluster = mock();
    let e = one_rejected_then_the_next_published(
        &cluster,
        sink(&cluster),
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
    )
    .await;
    assert_eq!(e.kind(), ErrorKind::MessageTooLarge, "{e}");
    assert!(
        e.message()
            .contains("the broker refused the message to topic `mock.order` as too large"),
        "{e}"
    );
}

/// With `timestamp = "created_at"`, a broker that refuses an old timestamp
/// (`log.message.timestamp.before.max.ms`) parks the event as dead at once; the next flows.
#[tokio::test]
async fn a_timestamp_the_broker_refuses_is_rejected() {
    let cluster = mock();
    let mut config = sink(&cluster).config().clone();
    config.timestamp = RecordTimestamp::CreatedAt;
    let sink = KafkaSink::new(config).expect("a valid configuration");
    let e = one_rejected_then_the_next_published(
        &cluster,
        sink,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP,
    )
    .await;
    assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
    assert!(e.message().contains("timestamp"), "{e}");
}

/// The broker answers the next produce request with `error`: the one event of the call must be
/// rejected (its error returned), and the event of the next call published.
async fn one_rejected_then_the_next_published(
    cluster: &MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    sink: KafkaSink,
    error: RDKafkaRespErr,
) -> outboxkit_core::Error {
    cluster.request_errors(RDKafkaApiKey::Produce, &[error]);
    let event = sample_event(1, "order", "a", "Placed");
    let outcomes = sink
        .publish(std::slice::from_ref(&event))
        .await
        .expect("publish");
    let [Outcome::Reject(e)] = &outcomes[..] else {
        panic!("expected one Reject, got {}", describe_outcomes(&outcomes));
    };
    let next = sample_event(2, "order", "b", "Placed");
    assert_all_published(&sink.publish(&[next]).await.expect("publish"));
    e.clone()
}

#[tokio::test]
async fn transient_broker_errors_are_retried_inside_the_call() {
    let cluster = mock();
    let sink = sink(&cluster);
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        ],
    );
    let batch = sample_batch(1, 10, "order", 10);
    publish_all(&sink, &batch).await;
    assert_eq!(sink.producer_generation(), 0);
}

#[tokio::test]
async fn a_broken_idempotence_state_recreates_the_producer() {
    let cluster = mock();
    let sink = sink(&cluster);
    let first = sample_batch(1, 2, "order", 2);
    let outcomes = sink.publish(&first).await.expect("publish");
    assert_all_published(&outcomes);
    // The broker loses track of the producer's sequence: librdkafka raises a fatal error.
    cluster.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER],
    );
    let second = sample_batch(3, 2, "order", 2);
    let result = sink.publish(&second).await;
    match &result {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(outcomes) => assert!(
            outcomes.iter().all(|o| matches!(o, Outcome::Retry(_))),
            "nothing may be rejected for a producer-side problem: {}",
            describe_outcomes(outcomes)
        ),
    }
    assert_eq!(sink.producer_generation(), 1, "the producer was recreated");
    let outcomes = sink
        .publish(&second)
        .await
        .expect("publish with the new producer");
    assert_all_published(&outcomes);
}

#[tokio::test]
async fn a_broker_that_stops_answering_fails_the_call_as_a_timeout() {
    let cluster = mock();
    let config = KafkaSinkConfig {
        topic: "mock.{aggregate_type}".to_owned(),
        delivery_timeout: Duration::from_secs(2),
        ..KafkaSinkConfig::new(cluster.bootstrap_servers())
    };
    let sink = KafkaSink::new(config).expect("a valid configuration");
    sink.check().await.expect("the mock cluster answers");
    cluster.broker_down(1).expect("taking the mock broker down");
    let batch = sample_batch(1, 3, "order", 3);
    let result = sink.publish(&batch).await;
    if let Ok(outcomes) = &result {
        assert!(
            outcomes.iter().all(|o| matches!(o, Outcome::Retry(_))),
            "nothing may be rejected or published with the broker down: {}",
            describe_outcomes(outcomes)
        );
    }
    let e = whole_call_error(&result).expect("broker down fails the call");
    assert!(
        matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Connection),
        "{e:?}"
    );
    assert!(e.is_retryable(), "{e}");
    assert!(
        e.message().contains("sink.kafka.delivery_timeout"),
        "says which setting bounded the wait: {e}"
    );
    cluster.broker_up(1).expect("bringing the mock broker back");
    publish_all(&sink, &batch).await;
}
