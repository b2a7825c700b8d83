//! The SNS sink against a real SNS-API server (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack
//! on `http://127.0.0.1:4566`), read back through SQS queues subscribed with raw message
//! delivery: FIFO groups and deduplication ids, SNS's refusals, missing topics, attributes past
//! the limit, CloudEvents, topic ARNs and `topic_arn_prefix`, `check`.

mod common;

use outboxkit_aws::testkit::{
    assert_fifo_messages, assert_headers_arrived, assert_structured_messages,
    event_past_the_attribute_limit, large_batch, publish, publish_fifo_case, READ_TIMEOUT,
};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{assert_all_published, sample_batch, unique_prefix};
use outboxkit_core::{ErrorKind, Outcome, Sink};
use outboxkit_sink_sns::{SnsConfig, SnsSink};

fn sink(config: SnsConfig) -> SnsSink {
    common::sink(config).expect("a valid sink configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_group_and_deduplication_ids_in_order() {
    let sns = common::server().await;
    let topic = format!("{}.fifo", unique_prefix());
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(common::config(&topic));
    let all = publish_fifo_case(&sink).await;
    let received = sns.queue().receive_all(&url, all.len(), READ_TIMEOUT).await;
    let fields = received.iter().map(|m| {
        let (group_id, deduplication_id) = (m.group_id.as_deref(), m.deduplication_id.as_deref());
        (m.body.as_str(), &m.attributes, group_id, deduplication_id)
    });
    assert_fifo_messages(&all, fields);
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
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
    let sns = common::server().await;
    let topic = unique_prefix();
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(common::config(&topic));
    let mut batch = sample_batch(1, 6, "order", 6);
    // Under the sink's 256 KiB payload limit, over SNS's message limit with the attributes.
    batch[2].payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(256 * 1024 - 20)).into_bytes();
    let outcomes = publish(&sink, &batch).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            match outcome {
                Outcome::Reject(e) => {
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
                }
                other => panic!("the oversized event: {other:?}"),
            }
        } else {
            assert!(outcome.is_published(), "event {i}: {outcome:?}");
        }
    }
    assert_eq!(
        sns.queue().receive_all(&url, 5, READ_TIMEOUT).await.len(),
        5
    );
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_topic_retries_its_events_while_other_topics_flow() {
    let sns = common::server().await;
    let prefix = unique_prefix();
    let orders = format!("{prefix}_order");
    let invoices = format!("{prefix}_invoice");
    let (orders_arn, orders_url) = common::topic(&sns, &orders).await;
    let sink = sink(common::config(&format!("{prefix}_{{aggregate_type}}")));
    let mut batch = sample_batch(1, 4, "order", 4);
    batch.extend(sample_batch(5, 3, "invoice", 3));
    let outcomes = publish(&sink, &batch).await;
    assert_all_published(&outcomes[..4]);
    for outcome in &outcomes[4..] {
        match outcome {
            Outcome::Retry(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                let text = e.full_message();
                assert!(text.contains(&format!("`{invoices}`")), "{text}");
                assert!(text.contains("no such topic"), "{text}");
                assert!(text.contains("create the topic"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Once the topic exists, the retry goes through (a failed lookup is not cached).
    let (invoices_arn, invoices_url) = common::topic(&sns, &invoices).await;
    assert_all_published(&publish(&sink, &batch[4..]).await);
    let queue = sns.queue();
    assert_eq!(
        queue
            .receive_all(&invoices_url, 3, READ_TIMEOUT)
            .await
            .len(),
        3
    );
    assert_eq!(
        queue.receive_all(&orders_url, 4, READ_TIMEOUT).await.len(),
        4
    );
    for (arn, url) in [(orders_arn, orders_url), (invoices_arn, invoices_url)] {
        queue.delete_queue(&url).await;
        sns.delete_topic(&arn).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_past_the_attribute_limit_travel_in_the_headers_attribute() {
    let sns = common::server().await;
    let topic = unique_prefix();
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(common::config(&topic));
    let event = event_past_the_attribute_limit();
    assert_all_published(&publish(&sink, std::slice::from_ref(&event)).await);
    let received = sns.queue().receive_all(&url, 1, READ_TIMEOUT).await;
    assert_eq!(received.len(), 1);
    let message = &received[0];
    assert_headers_arrived(&event, &message.attributes, message.attribute_count);
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
}

/// `format = "cloudevents"`: the message is the JSON event format document; the attributes
/// the event's fields and `content_type`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_sends_the_document_as_the_message() {
    let sns = common::server().await;
    let topic = unique_prefix();
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(SnsConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..common::config(&topic)
    });
    let events = sample_events(1, "order");
    assert_all_published(&publish(&sink, &events).await);
    let received = sns.queue().receive_all(&url, 3, READ_TIMEOUT).await;
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
    assert_eq!(received.len(), 3);
    let fields = received
        .iter()
        .map(|m| (m.body.as_str(), &m.attributes, m.attribute_count));
    assert_structured_messages(&events, fields);
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
    let sns = common::server().await;
    let topic = unique_prefix();
    let (arn, url) = common::topic(&sns, &topic).await;
    let sink = sink(common::config(&topic));
    assert_all_published(&publish(&sink, &large_batch()).await);
    assert_eq!(
        sns.queue().receive_all(&url, 60, READ_TIMEOUT).await.len(),
        60
    );
    sns.queue().delete_queue(&url).await;
    sns.delete_topic(&arn).await;
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
    let sink = sink(common::config("{aggregate_type}"));
    let mut batch = sample_batch(1, 2, "order", 2);
    batch[0].destination = Some("not a topic!".into());
    batch[1].destination = Some("arn:aws:sqs:us-east-1:000000000000:queue".into());
    for outcome in &publish(&sink, &batch).await {
        match outcome {
            Outcome::Reject(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                assert!(e.message().starts_with("SNS topic `"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
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
