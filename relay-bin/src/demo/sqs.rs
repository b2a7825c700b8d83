//! The demo on SQS: a fresh FIFO queue (`MessageGroupId` = order id), read back with
//! `ReceiveMessage` + `DeleteMessageBatch` by independent consumers, then deleted.
//!
//! Default endpoint: LocalStack on `http://127.0.0.1:4566` (started by `scripts/services.sh`);
//! `--broker-url` points elsewhere. Region and credentials come from the AWS chain; on a
//! loopback endpoint without any configured credentials the demo uses LocalStack's `test`
//! credentials.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{DeleteMessageBatchRequestEntry, QueueAttributeName};
use aws_sdk_sqs::Client;
use outboxkit_core::Sink;
use outboxkit_sink_sqs::{SqsConfig, SqsSink};
use uuid::Uuid;

use super::{DemoArgs, DemoBroker, DESTINATION};
use crate::cli::Failure;

/// What the consumers read back so far: every message in the order it was received, and the
/// distinct event ids among them.
#[derive(Default)]
struct Record {
    messages: Vec<(Uuid, String)>,
    distinct: HashSet<Uuid>,
}

struct SqsDemo {
    sink: Arc<SqsSink>,
    client: Client,
    endpoint: String,
    queue: String,
    url: String,
}

fn is_loopback(endpoint: &str) -> bool {
    url::Url::parse(endpoint)
        .ok()
        .and_then(|u| u.host_str().map(str::to_owned))
        .is_some_and(|h| matches!(h.as_str(), "127.0.0.1" | "localhost" | "[::1]" | "::1"))
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoBroker>, Failure> {
    let endpoint = args
        .broker_url
        .clone()
        .unwrap_or_else(|| "http://127.0.0.1:4566".to_owned());
    let region = std::env::var("AWS_REGION")
        .or_else(|_| std::env::var("AWS_DEFAULT_REGION"))
        .unwrap_or_else(|_| "us-east-1".to_owned());
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(Region::new(region.clone()));
    let no_credentials = [
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ]
    .iter()
    .all(|var| std::env::var(var).is_err());
    if no_credentials && is_loopback(&endpoint) {
        loader = loader.credentials_provider(Credentials::new(
            "test",
            "test",
            None,
            None,
            "outbox-relay-demo",
        ));
    }
    let sdk_config = loader.load().await;

    let queue = format!(
        "{DESTINATION}-order-{}.fifo",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let config = SqsConfig {
        endpoint: Some(endpoint.clone()),
        region: Some(region),
        ..SqsConfig::new(queue.clone())
    };
    let sink = Arc::new(SqsSink::from_sdk_config(config, &sdk_config)?);
    let client = sink.client().clone();
    let created = client
        .create_queue()
        .queue_name(&queue)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await
        .map_err(|e| {
            Failure::runtime(format!(
                "creating the demo queue {queue} on SQS at {endpoint}: {} \
                 (start LocalStack with scripts/services.sh, or give --broker-url)",
                DisplayErrorContext(&e)
            ))
        })?;
    let url = created
        .queue_url()
        .ok_or_else(|| Failure::runtime(format!("creating {queue}: SQS returned no queue URL")))?
        .to_owned();
    sink.check().await?;
    Ok(Arc::new(SqsDemo {
        sink,
        client,
        endpoint,
        queue,
        url,
    }))
}

impl SqsDemo {
    /// One of four concurrent consumers: receive, record, delete. FIFO keeps a group's next
    /// message invisible until the previous one is deleted, and a message is recorded before it
    /// is deleted, so the combined record keeps every order's sequence. Runs until `expected` distinct
    /// events were recorded by all consumers together or `deadline` passed.
    async fn consume(
        &self,
        record: &Mutex<Record>,
        expected: usize,
        deadline: Instant,
    ) -> Result<(), Failure> {
        loop {
            let done = record
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .distinct
                .len()
                >= expected;
            if done || Instant::now() >= deadline {
                return Ok(());
            }
            let answer = self
                .client
                .receive_message()
                .queue_url(&self.url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .visibility_timeout(120)
                .message_attribute_names("event_id")
                .send()
                .await
                .map_err(|e| {
                    Failure::runtime(format!(
                        "reading queue {} back: {}",
                        self.queue,
                        DisplayErrorContext(&e)
                    ))
                })?;
            let mut delete = Vec::new();
            {
                let mut guard = record.lock().unwrap_or_else(|p| p.into_inner());
                let Record { messages, distinct } = &mut *guard;
                for message in answer.messages() {
                    let event_id = message
                        .message_attributes()
                        .and_then(|a| a.get("event_id"))
                        .and_then(|v| v.string_value())
                        .and_then(|v| Uuid::parse_str(v).ok())
                        .unwrap_or_default();
                    messages.push((event_id, message.body().unwrap_or_default().to_owned()));
                    distinct.insert(event_id);
                    if let Some(handle) = message.receipt_handle() {
                        let entry = DeleteMessageBatchRequestEntry::builder()
                            .id(format!("d{}", delete.len()))
                            .receipt_handle(handle)
                            .build()
                            .map_err(|e| Failure::runtime(format!("deleting messages: {e}")))?;
                        delete.push(entry);
                    }
                }
            }
            if !delete.is_empty() {
                self.client
                    .delete_message_batch()
                    .queue_url(&self.url)
                    .set_entries(Some(delete))
                    .send()
                    .await
                    .map_err(|e| {
                        Failure::runtime(format!(
                            "deleting read messages from {}: {}",
                            self.queue,
                            DisplayErrorContext(&e)
                        ))
                    })?;
            }
        }
    }
}

#[async_trait]
impl DemoBroker for SqsDemo {
    fn describe(&self) -> String {
        format!("SQS FIFO queue {} at {}", self.queue, self.endpoint)
    }

    fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    async fn read_all(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(Uuid, String)>, Failure> {
        let deadline = Instant::now() + timeout;
        let record = Mutex::new(Record::default());
        let results = tokio::join!(
            self.consume(&record, expected, deadline),
            self.consume(&record, expected, deadline),
            self.consume(&record, expected, deadline),
            self.consume(&record, expected, deadline),
        );
        // The queue was made for this run: remove it whatever happened.
        let _ = self.client.delete_queue().queue_url(&self.url).send().await;
        results.0?;
        results.1?;
        results.2?;
        results.3?;
        let record = record.into_inner().unwrap_or_else(|p| p.into_inner());
        Ok(record.messages)
    }
}
