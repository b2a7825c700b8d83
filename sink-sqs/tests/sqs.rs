//! The SQS sink against a real SQS-API server (`OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack
//! on `http://127.0.0.1:4566`): FIFO groups and deduplication, SQS's per-entry refusals,
//! missing queues, attributes past SQS's limit, request splitting, `check`.

use crate::common;

use outboxkit_aws::testkit::{self, publish, READ_TIMEOUT};
use outboxkit_core::cloudevents::Format;
use outboxkit_core::testkit::cloudevents::{assert_bad_source_refused, BAD_SOURCE};
use outboxkit_core::testkit::sink_suite::{
    assert_all_published, sample_batch, sample_event, unique_prefix,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Sink};
use outboxkit_sink_sqs::{SqsConfig, SqsSink};

fn sink(config: SqsConfig) -> SqsSink {
    common::sink(config).expect("a valid sink configuration")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_messages_carry_group_and_deduplication_ids_in_order() {
    testkit::fifo_messages_in_order(&common::queues().await).await;
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
    let queues = common::queues().await;
    testkit::oversized_event_rejected(&queues, 300 * 1024, |queue, e| {
        assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
        let text = e.full_message();
        assert!(text.contains(&format!("SQS queue `{queue}`")), "{text}");
        assert!(text.contains("262144"), "SQS's own error: {text}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_retries_its_events_while_other_queues_flow() {
    let missing = ["does not exist", "create the queue"];
    testkit::missing_destination_retried(&common::queues().await, &missing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_past_the_attribute_limit_travel_in_the_headers_attribute() {
    testkit::headers_past_the_limit_arrive(&common::queues().await).await;
}

/// `format = "cloudevents"`: structured content mode, read back by a plain `ReceiveMessage` —
/// the body the JSON event format document (every attribute, `data` or `data_base64`); the
/// attributes the event's fields and `content_type`, no header attributes, no `body_encoding`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloudevents_structured_mode_sends_the_document_as_the_body() {
    testkit::cloudevents_structured(&common::queues().await).await;
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
    testkit::large_calls_split(&common::queues().await).await;
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
    let malform = |batch: &mut [OutboxEvent]| {
        batch[0].destination = Some("not a queue!".into());
        batch[1].aggregate_type = "caf\u{e9}".into();
    };
    let queues = common::queues().await;
    testkit::malformed_destinations_rejected(&queues, malform, "SQS queue `").await;
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
