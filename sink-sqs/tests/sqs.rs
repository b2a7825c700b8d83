//! The SQS sink against a real SQS-API server (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack
//! on `http://127.0.0.1:4566`): FIFO groups and deduplication, SQS's per-entry refusals,
//! missing queues, attributes past SQS's limit, request splitting, `check`.

mod common;

use aws_sdk_sqs::types::QueueAttributeName;
use outboxkit_aws::testkit::{
    assert_fifo_messages, assert_headers_arrived, assert_structured_messages,
    event_past_the_attribute_limit, large_batch, publish, publish_fifo_case, READ_TIMEOUT,
};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{
    assert_bad_source_refused, sample_events, BAD_SOURCE, SOURCE_TEMPLATE,
};
use outboxkit_core::testkit::sink_suite::{
    assert_all_published, sample_batch, sample_event, unique_prefix,
};
use outboxkit_core::{ErrorKind, Outcome, Sink};
use outboxkit_sink_sqs::{SqsConfig, SqsSink};

fn sink(config: SqsConfig) -> SqsSink {
    common::sink(config).expect("a valid sink configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_group_and_deduplication_ids_in_order() {
    let sqs = common::server().await;
    let queue = format!("{}.fifo", unique_prefix());
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(common::config(&queue));
    let all = publish_fifo_case(&sink).await;
    let received = sqs.receive_all(&url, all.len(), READ_TIMEOUT).await;
    let fields = received.iter().map(|m| {
        let (group_id, deduplication_id) = (m.group_id.as_deref(), m.deduplication_id.as_deref());
        (m.body.as_str(), &m.attributes, group_id, deduplication_id)
    });
    assert_fifo_messages(&all, fields);
    sqs.delete_queue(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_redelivery_of_an_event_id_is_deduplicated_by_sqs() {
    let sqs = common::server().await;
    let queue = format!("{}.fifo", unique_prefix());
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(common::config(&queue));
    let batch = sample_batch(1, 10, "order", 10);
    assert_all_published(&publish(&sink, &batch).await);
    let first = sqs.receive_all(&url, 10, READ_TIMEOUT).await;
    assert_eq!(first.len(), 10);
    // The relay sends again after a crash or a lost acknowledgement: SQS acknowledges and
    // drops the copies, even though the first ones were already consumed and deleted.
    assert_all_published(&publish(&sink, &batch).await);
    let fresh = vec![sample_event(11, "order", "agg-0", "ItemAdded")];
    assert_all_published(&publish(&sink, &fresh).await);
    let second = sqs.receive_all(&url, 1, READ_TIMEOUT).await;
    assert_eq!(
        second
            .iter()
            .map(|m| m.attribute("event_id").to_owned())
            .collect::<Vec<_>>(),
        vec![fresh[0].event_id.to_string()],
        "only the fresh event arrives"
    );
    sqs.delete_queue(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_event_is_rejected_with_sqs_error_while_the_others_publish() {
    let sqs = common::server().await;
    let queue = unique_prefix();
    let url = sqs
        .create_queue(
            &queue,
            &[(QueueAttributeName::MaximumMessageSize, "262144")],
        )
        .await;
    let sink = sink(common::config(&queue));
    let mut batch = sample_batch(1, 6, "order", 6);
    batch[2].payload = format!("{{\"blob\": \"{}\"}}", "x".repeat(300 * 1024)).into_bytes();
    let outcomes = publish(&sink, &batch).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 {
            match outcome {
                Outcome::Reject(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
                    let text = e.full_message();
                    assert!(text.contains(&format!("SQS queue `{queue}`")), "{text}");
                    assert!(text.contains("262144"), "SQS's own error: {text}");
                }
                other => panic!("the oversized event: {other:?}"),
            }
        } else {
            assert!(outcome.is_published(), "event {i}: {outcome:?}");
        }
    }
    let received = sqs.receive_all(&url, 5, READ_TIMEOUT).await;
    assert_eq!(received.len(), 5);
    sqs.delete_queue(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_retries_its_events_while_other_queues_flow() {
    let sqs = common::server().await;
    let prefix = unique_prefix();
    let orders = format!("{prefix}_order");
    let invoices = format!("{prefix}_invoice");
    let orders_url = sqs.create_queue(&orders, &[]).await;
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
                assert!(text.contains("does not exist"), "{text}");
                assert!(text.contains("create the queue"), "{text}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Once the queue exists, the retry goes through (a failed lookup is not cached).
    let invoices_url = sqs.create_queue(&invoices, &[]).await;
    assert_all_published(&publish(&sink, &batch[4..]).await);
    assert_eq!(
        sqs.receive_all(&invoices_url, 3, READ_TIMEOUT).await.len(),
        3
    );
    assert_eq!(sqs.receive_all(&orders_url, 4, READ_TIMEOUT).await.len(), 4);
    sqs.delete_queue(&orders_url).await;
    sqs.delete_queue(&invoices_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_past_the_attribute_limit_travel_in_the_headers_attribute() {
    let sqs = common::server().await;
    let queue = unique_prefix();
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(common::config(&queue));
    let event = event_past_the_attribute_limit();
    assert_all_published(&publish(&sink, std::slice::from_ref(&event)).await);
    let received = sqs.receive_all(&url, 1, READ_TIMEOUT).await;
    assert_eq!(received.len(), 1);
    let message = &received[0];
    assert_headers_arrived(&event, &message.attributes, message.attribute_count);
    sqs.delete_queue(&url).await;
}

/// `format = "cloudevents"`: structured content mode, read back by a plain `ReceiveMessage` —
/// the body the JSON event format document (every attribute, `data` or `data_base64`); the
/// attributes the event's fields and `content_type`, no header attributes, no `body_encoding`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_sends_the_document_as_the_body() {
    let sqs = common::server().await;
    let queue = unique_prefix();
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(SqsConfig {
        format: Format::CloudEvents,
        cloudevents_source: SOURCE_TEMPLATE.to_owned(),
        ..common::config(&queue)
    });
    let events = sample_events(1, "order");
    assert_all_published(&publish(&sink, &events).await);
    let received = sqs.receive_all(&url, 3, READ_TIMEOUT).await;
    sqs.delete_queue(&url).await;
    assert_eq!(received.len(), 3);
    let fields = received
        .iter()
        .map(|m| (m.body.as_str(), &m.attributes, m.attribute_count));
    assert_structured_messages(&events, fields);
}

/// A `cloudevents_source` that is not a URI-reference is refused at start, naming the key.
#[test]
fn a_bad_cloudevents_source_is_refused_naming_the_key() {
    let config = SqsConfig {
        format: Format::CloudEvents,
        cloudevents_source: BAD_SOURCE.to_owned(),
        ..common::config("orders")
    };
    assert_bad_source_refused(common::sink(config), "sink.sqs.cloudevents_source");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_calls_are_split_into_requests_sqs_accepts() {
    let sqs = common::server().await;
    let queue = unique_prefix();
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(SqsConfig {
        max_batch_len: 100,
        ..common::config(&queue)
    });
    assert_all_published(&publish(&sink, &large_batch()).await);
    assert_eq!(sqs.receive_all(&url, 60, READ_TIMEOUT).await.len(), 60);
    sqs.delete_queue(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_urls_and_arns_work_as_destinations() {
    let sqs = common::server().await;
    let by_url = unique_prefix();
    let by_arn = unique_prefix();
    let url = sqs.create_queue(&by_url, &[]).await;
    let arn_url = sqs.create_queue(&by_arn, &[]).await;
    let sink = sink(common::config("{aggregate_type}"));
    let mut batch = sample_batch(1, 4, "order", 4);
    batch[0].destination = Some(url.clone());
    batch[1].destination = Some(url.clone());
    batch[2].destination = Some(format!("arn:aws:sqs:us-east-1:000000000000:{by_arn}"));
    batch[3].destination = Some(format!("arn:aws:sqs:us-east-1:000000000000:{by_arn}"));
    assert_all_published(&publish(&sink, &batch).await);
    assert_eq!(sqs.receive_all(&url, 2, READ_TIMEOUT).await.len(), 2);
    assert_eq!(sqs.receive_all(&arn_url, 2, READ_TIMEOUT).await.len(), 2);
    sqs.delete_queue(&url).await;
    sqs.delete_queue(&arn_url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_destinations_are_rejected_without_a_request() {
    let sink = sink(common::config("{aggregate_type}"));
    let mut batch = sample_batch(1, 2, "order", 2);
    batch[0].destination = Some("not a queue!".into());
    batch[1].aggregate_type = "caf\u{e9}".into();
    let outcomes = publish(&sink, &batch).await;
    for outcome in &outcomes {
        match outcome {
            Outcome::Reject(e) => {
                assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
                assert!(e.message().starts_with("SQS queue `"), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_queue_group_sets_the_group_on_standard_queues() {
    let sqs = common::server().await;
    let queue = unique_prefix();
    let url = sqs.create_queue(&queue, &[]).await;
    let sink = sink(SqsConfig {
        fair_queue_group: true,
        ..common::config(&queue)
    });
    let batch = sample_batch(1, 3, "order", 3);
    assert_all_published(&publish(&sink, &batch).await);
    let received = sqs.receive_all(&url, 3, READ_TIMEOUT).await;
    assert_eq!(received.len(), 3);
    for message in &received {
        assert_eq!(
            message.group_id.as_deref(),
            Some(message.attribute("aggregate_id"))
        );
        assert_eq!(message.deduplication_id, None);
    }
    sqs.delete_queue(&url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_missing_fixed_queue_and_passes_on_an_existing_one() {
    let sqs = common::server().await;
    sqs.require_server().await;
    let missing = unique_prefix();
    let sink = sink(common::config(&missing));
    let e = sink.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unroutable, "{e}");
    let text = e.full_message();
    assert!(
        text.contains(&format!("GetQueueUrl of SQS queue `{missing}`")),
        "{text}"
    );
    assert!(text.contains("us-east-1 at http://"), "{text}");
    assert!(text.contains("create the queue"), "{text}");

    let url = sqs.create_queue(&missing, &[]).await;
    sink.check().await.expect("the queue exists now");
    assert_eq!(sink.queue_url(&missing).await.unwrap(), url);
    sqs.delete_queue(&url).await;
}
