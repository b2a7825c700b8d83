//! The [`Sink`] implementation: `SendMessageBatch` requests of at most 10 entries and
//! `max_request_bytes`, sent concurrently, one outcome per event from SQS's per-entry answer.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use aws_sdk_sqs::config::Region;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use outboxkit_aws::batch::{self, fixed_destination, BatchAnswer, BatchService};
use outboxkit_aws::message::{prepare, PreparedMessage, STRING_TYPE};
use outboxkit_core::cloudevents::CloudEvents;
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};

use crate::classify::{classify_entry, classify_sdk_error, is_access_denied};
use crate::config::{SqsConfig, SQS_MAX_REQUEST_BYTES};
use crate::queue::QueueRef;

/// Resolved queues kept at most; past it the cache starts over (rows with ever-new
/// destinations must not grow memory without bound).
const MAX_CACHED_QUEUES: usize = 10_000;

/// A queue ready to send to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ResolvedQueue {
    name: String,
    url: String,
    fifo: bool,
}

/// Publishes outbox events to Amazon SQS (standard and FIFO queues) with `SendMessageBatch`.
///
/// - The queue comes from the template (`queue`, default `{aggregate_type}`) or the row's
///   `destination`: a queue name (resolved once with `GetQueueUrl`, then cached), a queue URL
///   or a queue ARN.
/// - A call is split into requests of at most 10 entries and `max_request_bytes`, sent
///   concurrently (at most `max_concurrent_requests` at once). When a call holds several
///   events of one aggregate (the relay's engine never does that: see
///   [`SinkCapabilities::ordered_per_key`]) they go out in successive waves, and an event
///   whose predecessor was not published is not sent.
/// - FIFO queues (`.fifo`): `MessageGroupId` = `aggregate_id`, `MessageDeduplicationId` =
///   `event_id`, so a redelivery within SQS's 5-minute window is dropped by SQS.
/// - With `format = "cloudevents"` the body is the event as a structured CloudEvent (JSON
///   event format), the attributes the event's fields and `content_type`; the headers are
///   in the document only.
/// - Per entry: `Successful` → published; `Failed` with `SenderFault` → rejected with SQS's
///   error; otherwise retried. See [`crate::classify`] for whole-request failures. Every event
///   gets its own outcome, classified by kind: whether the call failed as a whole (refused
///   credentials, SQS unreachable for every event...) is the engine's decision.
///
/// `Debug` shows the configuration, never credentials (which the sink never holds itself:
/// they come from the AWS chain).
pub struct SqsSink {
    config: SqsConfig,
    template: DestinationTemplate,
    cloudevents: Option<CloudEvents>,
    /// The template's destination when it does not depend on the event.
    fixed_destination: Option<String>,
    client: Client,
    /// `us-east-1 at http://127.0.0.1:4566`, for messages.
    location: String,
    queues: Mutex<HashMap<String, ResolvedQueue>>,
}

impl fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSink")
            .field("location", &self.location)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SqsSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "sqs";

    /// Build the sink (see [`connect_lazy`](Self::connect_lazy)) and [`check`](Sink::check)
    /// that SQS answers and accepts the credentials; fails fast with a one-line error naming
    /// the endpoint and the queue.
    pub async fn connect(config: SqsConfig) -> Result<Self> {
        let sink = Self::connect_lazy(config).await?;
        sink.check().await?;
        Ok(sink)
    }

    /// Validate `config`, load region, endpoint and credentials from the standard AWS chain
    /// (the `region`, `endpoint` and `profile` keys win over it) and build the sink without
    /// calling SQS. Credentials are only looked at when the first request is signed.
    pub async fn connect_lazy(config: SqsConfig) -> Result<Self> {
        config.validate()?;
        let sdk_config = config.client_settings().load_sdk_config().await;
        Self::from_sdk_config(config, &sdk_config)
    }

    /// Build the sink from an AWS SDK configuration of your own (credentials provider, HTTP
    /// client...); the `region` and `endpoint` keys of `config` still win over it.
    pub fn from_sdk_config(config: SqsConfig, sdk_config: &aws_config::SdkConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let settings = config.client_settings();
        let region = settings.region(sdk_config)?;
        let mut builder = aws_sdk_sqs::config::Builder::from(sdk_config)
            .region(Region::new(region.clone()))
            .timeout_config(settings.timeout_config())
            .retry_config(settings.retry_config());
        if let Some(endpoint) = settings.endpoint_url() {
            builder = builder.endpoint_url(endpoint);
        }
        let client = Client::from_conf(builder.build());
        let location = settings.location(&region);
        let fixed_destination = fixed_destination(&template);
        Ok(Self {
            config,
            template,
            cloudevents,
            fixed_destination,
            client,
            location,
            queues: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &SqsConfig {
        &self.config
    }

    /// The SQS client the sink sends with (e.g. to create queues in tests).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The URL of the queue `destination` names (a name, URL or ARN), resolved once with
    /// `GetQueueUrl` and cached.
    pub async fn queue_url(&self, destination: &str) -> Result<String> {
        self.resolve(destination).await.map(|q| q.url)
    }

    async fn resolve(&self, destination: &str) -> Result<ResolvedQueue> {
        if let Some(queue) = self.cached(destination) {
            return Ok(queue);
        }
        let queue_ref = QueueRef::parse(destination)?;
        let fifo = queue_ref.is_fifo();
        let queue = match queue_ref {
            QueueRef::Url { url, name } => ResolvedQueue { name, url, fifo },
            QueueRef::Name { name, owner } => {
                let owner = owner.or_else(|| self.config.queue_owner_account_id.clone());
                let answer = self
                    .client
                    .get_queue_url()
                    .queue_name(&name)
                    .set_queue_owner_aws_account_id(owner)
                    .send()
                    .await
                    .map_err(|e| {
                        let error = classify_sdk_error(&e).context(format!(
                            "GetQueueUrl of SQS queue `{name}` ({})",
                            self.location
                        ));
                        with_hint(error)
                    })?;
                let url = answer
                    .queue_url()
                    .filter(|u| !u.is_empty())
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::Other,
                            format!(
                            "GetQueueUrl of SQS queue `{name}` ({}): the answer holds no queue URL",
                            self.location
                        ),
                        )
                    })?;
                ResolvedQueue {
                    url: url.to_owned(),
                    name,
                    fifo,
                }
            }
        };
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        if queues.len() >= MAX_CACHED_QUEUES {
            queues.clear();
        }
        queues.insert(destination.to_owned(), queue.clone());
        Ok(queue)
    }

    fn cached(&self, destination: &str) -> Option<ResolvedQueue> {
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(destination)
            .cloned()
    }

    fn forget(&self, destination: &str) {
        self.queues
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(destination);
    }
}

/// One batch entry with its id (unique per request, see [`batch::entry_id`]).
fn entry(id: String, message: &PreparedMessage) -> Result<SendMessageBatchRequestEntry> {
    let build_error = |e: aws_sdk_sqs::error::BuildError| {
        Error::new(
            ErrorKind::Other,
            format!("building an SQS batch entry: {e}"),
        )
    };
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(id)
        .message_body(message.body.clone())
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone());
    for (name, value) in &message.attributes {
        let value = MessageAttributeValue::builder()
            .data_type(STRING_TYPE)
            .string_value(value.clone())
            .build()
            .map_err(build_error)?;
        builder = builder.message_attributes(name.clone(), value);
    }
    builder.build().map_err(build_error)
}

/// Add what to do to the errors an operator must act on.
fn with_hint(error: Error) -> Error {
    let hint = match error.kind() {
        ErrorKind::Unroutable if error.is_retryable() => {
            "create the queue, or fix sink.sqs.queue / the row's destination"
        }
        ErrorKind::Unauthorized => {
            "check the AWS credentials of the relay and its sqs:SendMessage / sqs:GetQueueUrl \
             (and kms:GenerateDataKey, kms:Decrypt for encrypted queues) permissions"
        }
        ErrorKind::Config => "check sink.sqs.endpoint and sink.sqs.region",
        _ => return error,
    };
    outboxkit_aws::classify::with_hint(error, hint)
}

/// The sink as [`batch::publish`] drives it (a private view, so the batch API stays out of the
/// sink's public interface).
struct Batches<'a>(&'a SqsSink);

impl std::ops::Deref for Batches<'_> {
    type Target = SqsSink;

    fn deref(&self) -> &SqsSink {
        self.0
    }
}

#[async_trait]
impl BatchService for Batches<'_> {
    type Target = ResolvedQueue;
    const SERVICE: &'static str = "SQS";

    fn max_request_bytes(&self) -> usize {
        self.config.max_request_bytes
    }

    fn max_concurrent_requests(&self) -> usize {
        self.config.max_concurrent_requests
    }

    async fn resolve_target(&self, destination: &str) -> Result<ResolvedQueue> {
        self.resolve(destination).await
    }

    fn forget_target(&self, destination: &str) {
        self.forget(destination);
    }

    fn target_name<'a>(&self, queue: &'a ResolvedQueue) -> &'a str {
        &queue.url
    }

    fn prepare_message(&self, event: &OutboxEvent, queue: &ResolvedQueue) -> PreparedMessage {
        let group_id = queue.fifo || self.config.fair_queue_group;
        prepare(event, group_id, queue.fifo, self.cloudevents.as_ref())
    }

    async fn send_batch(
        &self,
        queue: &ResolvedQueue,
        entries: Vec<(String, &PreparedMessage)>,
    ) -> Result<BatchAnswer> {
        let entries = entries
            .into_iter()
            .map(|(id, message)| entry(id, message))
            .collect::<Result<Vec<_>>>()?;
        let output = self
            .client
            .send_message_batch()
            .queue_url(&queue.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| with_hint(classify_sdk_error(&e).context(self.context(queue))))?;
        Ok(BatchAnswer {
            successful: output
                .successful()
                .iter()
                .map(|ok| ok.id().to_owned())
                .collect(),
            failed: output
                .failed()
                .iter()
                .map(|failed| {
                    let error = with_hint(classify_entry(failed).context(self.context(queue)));
                    (failed.id().to_owned(), error)
                })
                .collect(),
        })
    }

    fn context(&self, queue: &ResolvedQueue) -> String {
        format!(
            "SendMessageBatch to SQS queue `{}` ({})",
            queue.name, self.location
        )
    }
}

#[async_trait]
impl Sink for SqsSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    /// `max_batch_len` events per call (split into ≤ 10-entry requests by the sink), payloads
    /// up to SQS's absolute 1 MiB limit: the queue's own `MaximumMessageSize` (which the sink
    /// does not know) is enforced by SQS, whose error is recorded on the dead event.
    /// `ordered_per_key` is false: the engine sends one event per aggregate per call, so no
    /// two requests in flight ever hold events of one FIFO group.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: Some(SQS_MAX_REQUEST_BYTES),
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    /// With a fixed queue name: `GetQueueUrl` of it (reachable, credentials accepted, queue
    /// exists). Otherwise `ListQueues` (an `AccessDenied` answer proves the endpoint and the
    /// credentials, so it passes: the relay needs no permission to list queues).
    async fn check(&self) -> Result<()> {
        if let Some(destination) = &self.fixed_destination {
            if matches!(QueueRef::parse(destination), Ok(QueueRef::Name { .. })) {
                return self.resolve(destination).await.map(drop);
            }
        }
        match self.client.list_queues().max_results(1).send().await {
            Ok(_) => Ok(()),
            Err(e) if is_access_denied(&e) => Ok(()),
            Err(e) => Err(with_hint(
                classify_sdk_error(&e).context(format!("ListQueues on SQS ({})", self.location)),
            )),
        }
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        let destinations: Vec<String> = batch.iter().map(|e| self.destination(e)).collect();
        Ok(batch::publish(&Batches(self), batch, &destinations).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_required() {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let e = SqsSink::from_sdk_config(SqsConfig::default(), &sdk).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().starts_with("sink.sqs.region: "), "{e}");
        let sink = SqsSink::from_sdk_config(
            SqsConfig {
                region: Some("eu-west-1".into()),
                endpoint: Some("http://user:pw@127.0.0.1:4566".into()),
                ..SqsConfig::default()
            },
            &sdk,
        )
        .unwrap();
        let debug = format!("{sink:?}");
        assert!(
            debug.contains("eu-west-1 at http://127.0.0.1:4566"),
            "{debug}"
        );
        assert!(!debug.contains("pw"), "{debug}");
    }

    #[test]
    fn batch_entries_carry_ids_attributes_and_fifo_fields() {
        let message = PreparedMessage {
            body: "{}".into(),
            attributes: vec![("event_id".into(), "x".into())],
            group_id: Some("42".into()),
            deduplication_id: Some("x".into()),
            size: 2,
        };
        let entry = entry(batch::entry_id(7), &message).unwrap();
        assert_eq!(entry.id(), "e7");
        assert_eq!(entry.message_body(), "{}");
        assert_eq!(entry.message_group_id(), Some("42"));
        assert_eq!(entry.message_deduplication_id(), Some("x"));
        let attributes = entry.message_attributes().unwrap();
        assert_eq!(attributes["event_id"].data_type(), "String");
        assert_eq!(attributes["event_id"].string_value(), Some("x"));
    }
}
