//! The [`Sink`] implementation: `SendMessageBatch` requests of at most 10 entries and
//! `max_request_bytes`, sent concurrently, one outcome per event from SQS's per-entry answer.

use std::fmt;

use async_trait::async_trait;
use aws_sdk_sqs::config::Region;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use outboxkit_aws::batch::{self, BatchAnswer, BatchService};
use outboxkit_aws::classify::{check_answer, Hints};
use outboxkit_aws::message::{PreparedMessage, STRING_TYPE};
use outboxkit_aws::sink::{SinkCore, Target};
use outboxkit_core::{Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities};

use crate::classify::{classify_entry, classify_sdk_error};
use crate::config::{SqsConfig, SQS_MAX_REQUEST_BYTES};
use crate::queue::QueueRef;

/// What to do about the errors an operator must act on.
const HINTS: Hints = Hints {
    missing_destination: "create the queue, or fix sink.sqs.queue / the row's destination",
    unauthorized:
        "check the AWS credentials of the relay and its sqs:SendMessage / sqs:GetQueueUrl \
         (and kms:GenerateDataKey, kms:Decrypt for encrypted queues) permissions",
    config: "check sink.sqs.endpoint and sink.sqs.region",
};

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
    client: Client,
    core: SinkCore,
}

impl fmt::Debug for SqsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsSink")
            .field("location", &self.core.location)
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
        let settings = config.client_settings();
        let region = settings.region(sdk_config)?;
        let mut builder = aws_sdk_sqs::config::Builder::from(sdk_config)
            .region(Region::new(region.clone()))
            .timeout_config(settings.timeout_config())
            .retry_config(settings.retry_config());
        if let Some(endpoint) = settings.endpoint_url() {
            builder = builder.endpoint_url(endpoint);
        }
        let location = settings.location(&region);
        Ok(Self {
            core: SinkCore::new(config.template()?, config.cloudevents()?, location),
            config,
            client: Client::from_conf(builder.build()),
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
        Batches(self).resolve(destination).await.map(|q| q.address)
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
    const SERVICE: &'static str = "SQS";
    const HINTS: Hints = HINTS;

    fn core(&self) -> &SinkCore {
        &self.core
    }

    fn max_request_bytes(&self) -> usize {
        self.config.max_request_bytes
    }

    fn max_concurrent_requests(&self) -> usize {
        self.config.max_concurrent_requests
    }

    async fn look_up(&self, destination: &str) -> Result<Target> {
        let queue_ref = QueueRef::parse(destination)?;
        let fifo = queue_ref.is_fifo();
        let (name, owner) = match queue_ref {
            QueueRef::Url { url, name } => {
                return Ok(Target {
                    name,
                    address: url,
                    fifo,
                })
            }
            QueueRef::Name { name, owner } => (name, owner),
        };
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
                    self.core.location
                ));
                HINTS.apply(error)
            })?;
        let url = answer
            .queue_url()
            .filter(|u| !u.is_empty())
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Other,
                    format!(
                        "GetQueueUrl of SQS queue `{name}` ({}): the answer holds no queue URL",
                        self.core.location
                    ),
                )
            })?;
        Ok(Target {
            address: url.to_owned(),
            name,
            fifo,
        })
    }

    fn group_id(&self, queue: &Target) -> bool {
        queue.fifo || self.config.fair_queue_group
    }

    async fn send_batch(
        &self,
        queue: &Target,
        entries: Vec<(String, &PreparedMessage)>,
    ) -> Result<BatchAnswer> {
        let entries = entries
            .into_iter()
            .map(|(id, message)| entry(id, message))
            .collect::<Result<Vec<_>>>()?;
        let output = self
            .client
            .send_message_batch()
            .queue_url(&queue.address)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| self.explain(classify_sdk_error(&e), queue))?;
        Ok(BatchAnswer::new(
            output.successful().iter().map(|ok| ok.id()),
            output
                .failed()
                .iter()
                .map(|failed| (failed.id(), self.explain(classify_entry(failed), queue))),
        ))
    }

    fn context(&self, queue: &Target) -> String {
        format!(
            "SendMessageBatch to SQS queue `{}` ({})",
            queue.name, self.core.location
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
        self.core.destination(event)
    }

    /// With a fixed queue name: `GetQueueUrl` of it (reachable, credentials accepted, queue
    /// exists). Otherwise `ListQueues` (an `AccessDenied` answer proves the endpoint and the
    /// credentials, so it passes: the relay needs no permission to list queues).
    async fn check(&self) -> Result<()> {
        if let Some(destination) = &self.core.fixed_destination {
            if matches!(QueueRef::parse(destination), Ok(QueueRef::Name { .. })) {
                return Batches(self).resolve(destination).await.map(drop);
            }
        }
        let answer = self.client.list_queues().max_results(1).send().await;
        check_answer(answer, |e| {
            HINTS.apply(
                classify_sdk_error(&e)
                    .context(format!("ListQueues on SQS ({})", self.core.location)),
            )
        })
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        Ok(batch::publish(&Batches(self), batch).await)
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_aws::testkit;

    use super::*;

    #[test]
    fn region_is_required() {
        testkit::assert_region_required_and_user_info_hidden(
            "sink.sqs",
            |region, endpoint, sdk| {
                let config = SqsConfig {
                    region,
                    endpoint,
                    ..SqsConfig::default()
                };
                SqsSink::from_sdk_config(config, sdk)
            },
        );
    }

    #[test]
    fn batch_entries_carry_ids_attributes_and_fifo_fields() {
        let entry = entry(batch::entry_id(7), &testkit::fifo_message()).unwrap();
        assert_eq!(entry.id(), "e7");
        assert_eq!(entry.message_body(), "{}");
        assert_eq!(entry.message_group_id(), Some("42"));
        assert_eq!(entry.message_deduplication_id(), Some("x"));
        let attributes = entry.message_attributes().unwrap();
        assert_eq!(attributes["event_id"].data_type(), "String");
        assert_eq!(attributes["event_id"].string_value(), Some("x"));
    }
}
