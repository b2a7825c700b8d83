//! The SNS sink against a real SNS-API server (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack
//! on `http://127.0.0.1:4566`), read back through SQS queues subscribed with raw message
//! delivery: FIFO groups and deduplication ids, SNS's refusals, missing topics, attributes past
//! the limit, CloudEvents, topic ARNs and `topic_arn_prefix`, `check`.

use crate::common;

use outboxkit_aws::testkit::{self, publish, READ_TIMEOUT};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{assert_bad_source_refused, BAD_SOURCE};
use outboxkit_core::testkit::sink_suite::{assert_all_published, sample_batch, unique_prefix};
use outboxkit_core::{ErrorKind, OutboxEvent, Sink};
use outboxkit_sink_sns::{SnsConfig, SnsSink};

fn sink(config: SnsConfig) -> SnsSink {
    common::sink(config).expect("a valid sink configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_group_and_deduplication_ids_in_order() {
    testkit::fifo_messages_in_order(&common::topics().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_topics_carry_no_group_id() {
    let sns = common::server().await;
    let topic = unique_prefix();
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(common::config(&topic));
    assert_all_published(&publish(&sink, &sample_batch(1, 3, "order", 3)).await);
    let received = sns.queue().receive_all(&url, 3, READ_TIMEOUT).await;
    assert_eq!(received.len(), 3);
    for message in &received {
        assert_eq!(message.group_id, None);
        assert_eq!(message.attribute("aggregate_type"), "order");
    }
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_rejected_with_sns_error_while_the_others_publish() {
    // Under the sink's 256 KiB payload limit, over SNS's message limit with the attributes.
    let topics = common::topics().await;
    testkit::oversized_event_rejected(&topics, 256 * 1024 - 20, |topic, e| {
        let text = e.full_message();
        assert!(text.contains(&format!("SNS topic `{topic}`")), "{text}");
        assert!(
            matches!(
                e.kind(),
                ErrorKind::InvalidMessage | ErrorKind::MessageTooLarge
            ),
            "{text}"
        );
        eprintln!("SNS's refusal: {text}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_retries_its_events_while_other_topics_flow() {
    let missing = ["no such topic", "create the topic"];
    testkit::missing_destination_retried(&common::topics().await, &missing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_past_the_attribute_limit_travel_in_the_headers_attribute() {
    testkit::headers_past_the_limit_arrive(&common::topics().await).await;
}

/// `format = "cloudevents"`: the message is the JSON event format document; the attributes
/// the event's fields and `content_type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_sends_the_document_as_the_message() {
    testkit::cloudevents_structured(&common::topics().await).await;
}

/// A `cloudevents_source` that is not a URI-reference is refused at start, naming the key.
#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = SnsConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..common::config("orders")
    };
    assert_bad_source_refused(common::sink(config), "sink.sns.cloudevents_source");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_calls_are_split_into_requests_sns_accepts() {
    testkit::large_calls_split(&common::topics().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_arns_and_the_arn_prefix_work_as_destinations() {
    let sns = common::server().await;
    let by_arn = unique_prefix();
    let by_prefix = unique_prefix();
    let (arn, arn_url) = common::topic(&sns, &by_arn).await;
    let (prefixed_arn, prefix_url) = common::topic(&sns, &by_prefix).await;
    let prefix = prefixed_arn
        .strip_suffix(by_prefix.as_str())
        .unwrap()
        .to_owned();
    let sink = sink(SnsConfig {
        topic_arn_prefix: Some(prefix),
        ..common::config(&by_prefix)
    });
    let mut batch = sample_batch(1, 4, "order", 4);
    batch[0].destination = Some(arn.clone());
    batch[1].destination = Some(arn.clone());
    assert_all_published(&publish(&sink, &batch).await);
    let queue = sns.queue();
    assert_eq!(queue.receive_all(&arn_url, 2, READ_TIMEOUT).await.len(), 2);
    assert_eq!(
        queue.receive_all(&prefix_url, 2, READ_TIMEOUT).await.len(),
        2
    );
    assert_eq!(sink.topic_arn(&by_prefix).await.unwrap(), prefixed_arn);
    for (arn, url) in [(arn, arn_url), (prefixed_arn, prefix_url)] {
        queue.delete_queue(&url).await;
        sns.delete_topic(&arn).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_destinations_are_rejected_without_a_request() {
    let malform = |batch: &mut [OutboxEvent]| {
        batch[0].destination = Some("not a topic!".into());
        batch[1].destination = Some("arn:aws:sqs:us-east-1:000000000000:queue".into());
    };
    let topics = common::topics().await;
    testkit::malformed_destinations_rejected(&topics, malform, "SNS topic `").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_fixed_topic_as_a_configuration_error() {
    let sns = common::server().await;
    sns.require_server().await;
    let missing = unique_prefix();
    let sink = sink(common::config(&missing));
    let e = sink.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config, "{e}");
    let text = e.full_message();
    assert!(text.starts_with("sink.sns.topic: "), "{text}");
    assert!(text.contains(&format!("SNS topic `{missing}`")), "{text}");
    assert!(text.contains("us-east-1 at http://"), "{text}");

    let (arn, url) = common::topic(&sns, &missing).await;
    sink.check().await.expect("the topic exists now");
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
}
