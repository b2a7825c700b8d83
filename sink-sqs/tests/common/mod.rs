//! Shared by the SQS integration tests: the test server's endpoint, an SDK configuration with
//! the test credentials, queue creation and an independent reader (`ReceiveMessage` + delete).

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};
use aws_sdk_sqs::Client;
use outboxkit_sink_sqs::{SqsConfig, SqsSink, OVERFLOW_ATTRIBUTE};

/// `OUTBOX_TEST_SQS_ENDPOINT`, default LocalStack on `http://127.0.0.1:4566`
/// (started by `scripts/services.sh`).
pub fn endpoint() -> String {
    std::env::var("OUTBOX_TEST_SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".to_owned())
}

/// The SDK configuration of the tests: region `us-east-1`, the dummy credentials `test`/`test`
/// LocalStack accepts.
pub fn sdk_config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(Credentials::new(
                "test",
                "test",
                None,
                None,
                "outboxkit-tests",
            )),
        )
        .build()
}

/// A sink configuration for the test server routing with `queue`.
pub fn config(queue: &str) -> SqsConfig {
    SqsConfig {
        endpoint: Some(endpoint()),
        region: Some("us-east-1".to_owned()),
        ..SqsConfig::new(queue)
    }
}

/// A sink built from `config` with the test credentials.
pub fn sink(config: SqsConfig) -> SqsSink {
    SqsSink::from_sdk_config(config, &sdk_config()).expect("a valid sink configuration")
}

/// A plain SQS client for the test server, for setting up and reading back.
pub fn admin() -> Client {
    let config = aws_sdk_sqs::config::Builder::from(&sdk_config())
        .endpoint_url(endpoint())
        .build();
    Client::from_conf(config)
}

/// Fail the test when the server does not answer.
pub async fn require_server(client: &Client) {
    let endpoint = endpoint();
    match tokio::time::timeout(
        Duration::from_secs(20),
        client.list_queues().max_results(1).send(),
    )
    .await
    {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => panic!(
            "the SQS server at {endpoint} does not answer ({}): start it with scripts/services.sh \
             or set OUTBOX_TEST_SQS_ENDPOINT",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        ),
        Err(_) => panic!("the SQS server at {endpoint} did not answer within 20s"),
    }
}

/// Create queue `name` (FIFO when it ends in `.fifo`) with extra attributes; returns its URL.
pub async fn create_queue(
    client: &Client,
    name: &str,
    attributes: &[(QueueAttributeName, &str)],
) -> String {
    require_server(client).await;
    let mut request = client.create_queue().queue_name(name);
    if name.ends_with(".fifo") {
        request = request.attributes(QueueAttributeName::FifoQueue, "true");
    }
    for (key, value) in attributes {
        request = request.attributes(key.clone(), *value);
    }
    let answer = request.send().await.unwrap_or_else(|e| {
        panic!(
            "creating queue {name}: {}",
            aws_sdk_sqs::error::DisplayErrorContext(&e)
        )
    });
    answer.queue_url().expect("a queue URL").to_owned()
}

/// Delete a queue (best effort: tests clean up after themselves).
pub async fn delete_queue(client: &Client, url: &str) {
    let _ = client.delete_queue().queue_url(url).send().await;
}

/// One message as the independent consumer received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: String,
    /// Message attributes (string values), with the JSON `headers` attribute merged in.
    pub attributes: BTreeMap<String, String>,
    /// Number of message attributes on the wire.
    pub attribute_count: usize,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

impl Received {
    pub fn attribute(&self, name: &str) -> &str {
        self.attributes
            .get(name)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("message has no attribute `{name}`: {self:?}"))
    }
}

/// Receive (and delete) messages of `url` until `expected` arrived and the queue looks empty,
/// or `timeout` passed. Always receives at least once, so stray messages are seen even with
/// `expected = 0`.
pub async fn receive_all(
    client: &Client,
    url: &str,
    expected: usize,
    timeout: Duration,
) -> Vec<Received> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let wait = remaining.as_secs().clamp(0, 1) as i32;
        let answer = client
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .wait_time_seconds(wait)
            .visibility_timeout(60)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::All)
            .send()
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "ReceiveMessage on {url}: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            });
        let messages = answer.messages();
        let mut handles = Vec::new();
        for message in messages {
            let mut attributes = BTreeMap::new();
            let wire: HashMap<String, aws_sdk_sqs::types::MessageAttributeValue> =
                message.message_attributes().cloned().unwrap_or_default();
            for (name, value) in &wire {
                if let Some(text) = value.string_value() {
                    attributes.insert(name.clone(), text.to_owned());
                }
            }
            if let Some(json) = attributes.remove(OVERFLOW_ATTRIBUTE) {
                let extra: BTreeMap<String, String> = serde_json::from_str(&json)
                    .expect("the headers attribute is a JSON object of strings");
                for (name, value) in extra {
                    attributes.entry(name).or_insert(value);
                }
            }
            let system = message.attributes().cloned().unwrap_or_default();
            out.push(Received {
                body: message.body().unwrap_or_default().to_owned(),
                attributes,
                attribute_count: wire.len(),
                group_id: system
                    .get(&MessageSystemAttributeName::MessageGroupId)
                    .cloned(),
                deduplication_id: system
                    .get(&MessageSystemAttributeName::MessageDeduplicationId)
                    .cloned(),
            });
            if let Some(handle) = message.receipt_handle() {
                handles.push(handle.to_owned());
            }
        }
        if !handles.is_empty() {
            let mut delete = client.delete_message_batch().queue_url(url);
            for (i, handle) in handles.iter().enumerate() {
                delete = delete.entries(
                    aws_sdk_sqs::types::DeleteMessageBatchRequestEntry::builder()
                        .id(format!("d{i}"))
                        .receipt_handle(handle)
                        .build()
                        .expect("a delete entry"),
                );
            }
            delete.send().await.unwrap_or_else(|e| {
                panic!(
                    "DeleteMessageBatch on {url}: {}",
                    aws_sdk_sqs::error::DisplayErrorContext(&e)
                )
            });
        }
        if messages.is_empty() && (out.len() >= expected || Instant::now() >= deadline) {
            return out;
        }
        if Instant::now() >= deadline {
            return out;
        }
    }
}
