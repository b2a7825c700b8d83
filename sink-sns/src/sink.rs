//! The [`Sink`] implementation: `PublishBatch` requests of at most 10 entries and
//! `max_request_bytes`, sent concurrently (see [`outboxkit_aws::batch`]), one outcome per event
//! from SNS's per-entry answer.

use std::fmt;

use async_trait::async_trait;
use aws_sdk_sns::config::Region;
use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};
use aws_sdk_sns::Client;
use outboxkit_aws::batch::{self, BatchAnswer, BatchService};
use outboxkit_aws::classify::{check_answer, Hints};
use outboxkit_aws::message::{PreparedMessage, STRING_TYPE};
use outboxkit_aws::sink::{is_fifo_name, SinkCore, Target};
use outboxkit_core::{Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities};

use crate::classify::{classify_entry, classify_sdk_error};
use crate::config::{SnsConfig, CONFIG_SECTION, SNS_MAX_REQUEST_BYTES};
use crate::topic::TopicRef;

/// What to do about the errors an operator must act on.
const HINTS: Hints = Hints {
    missing_destination: "create the topic, or fix sink.sns.topic / the row's destination",
    unauthorized: "check the AWS credentials of the relay and its sns:Publish / sns:ListTopics \
         (and kms:GenerateDataKey, kms:Decrypt for encrypted topics) permissions",
    config: "check sink.sns.endpoint and sink.sns.region",
};

/// Publishes outbox events to Amazon SNS (standard and FIFO topics) with `PublishBatch`.
///
/// - The topic comes from the template (`topic`, default `{aggregate_type}`) or the row's
///   `destination`: a topic ARN, or a topic name (made an ARN with `topic_arn_prefix`, or looked
///   up once with `ListTopics`, then cached).
/// - FIFO topics (`.fifo`): `MessageGroupId` = `aggregate_id`, `MessageDeduplicationId` =
///   `event_id`. Standard topics: neither.
/// - The message and its attributes are the SQS sink's (see [`outboxkit_aws::message`]).
///
/// `Debug` shows the configuration, never credentials (which come from the AWS chain).
pub struct SnsSink {
    config: SnsConfig,
    client: Client,
    core: SinkCore,
}

impl fmt::Debug for SnsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnsSink")
            .field("location", &self.core.location)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SnsSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "sns";

    /// Build the sink (see [`connect_lazy`](Self::connect_lazy)) and [`check`](Sink::check)
    /// that SNS answers, accepts the credentials and (for a fixed topic) has the topic.
    pub async fn connect(config: SnsConfig) -> Result<Self> {
        let sink = Self::connect_lazy(config).await?;
        sink.check().await?;
        Ok(sink)
    }

    /// Validate `config`, load region, endpoint and credentials from the standard AWS chain
    /// (the `region`, `endpoint` and `profile` keys win over it) and build the sink without
    /// calling SNS.
    pub async fn connect_lazy(config: SnsConfig) -> Result<Self> {
        config.validate()?;
        let sdk_config = config.client_settings().load_sdk_config().await;
        Self::from_sdk_config(config, &sdk_config)
    }

    /// Build the sink from an AWS SDK configuration of your own; the `region` and `endpoint`
    /// keys of `config` still win over it.
    pub fn from_sdk_config(config: SnsConfig, sdk_config: &aws_config::SdkConfig) -> Result<Self> {
        config.validate()?;
        let settings = config.client_settings();
        let region = settings.region(sdk_config)?;
        let mut builder = aws_sdk_sns::config::Builder::from(sdk_config)
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
    pub fn config(&self) -> &SnsConfig {
        &self.config
    }

    /// The SNS client the sink publishes with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The ARN of the topic `destination` names (a name or an ARN), resolved once and cached.
    pub async fn topic_arn(&self, destination: &str) -> Result<String> {
        Batches(self).resolve(destination).await.map(|t| t.address)
    }

    /// The ARN of topic `name`, from the pages of `ListTopics`.
    async fn look_up(&self, name: &str) -> Result<String> {
        let context = || format!("ListTopics for SNS topic `{name}` ({})", self.core.location);
        let suffix = format!(":{name}");
        let mut next_token = None;
        loop {
            let page = self
                .client
                .list_topics()
                .set_next_token(next_token)
                .send()
                .await
                .map_err(|e| HINTS.apply(classify_sdk_error(&e).context(context())))?;
            if let Some(arn) = page
                .topics()
                .iter()
                .filter_map(|t| t.topic_arn())
                .find(|arn| arn.ends_with(&suffix))
            {
                return Ok(arn.to_owned());
            }
            match page.next_token() {
                Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                _ => break,
            }
        }
        Err(HINTS.apply(
            Error::new(
                ErrorKind::Unroutable,
                format!("{}: no such topic", context()),
            )
            .temporary(),
        ))
    }
}

/// One batch entry with its id (unique per request, see [`batch::entry_id`]).
fn entry(id: String, message: &PreparedMessage) -> Result<PublishBatchRequestEntry> {
    let build_error = |e: aws_sdk_sns::error::BuildError| {
        Error::new(
            ErrorKind::Other,
            format!("building an SNS batch entry: {e}"),
        )
    };
    let mut builder = PublishBatchRequestEntry::builder()
        .id(id)
        .message(message.body.clone())
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
struct Batches<'a>(&'a SnsSink);

#[async_trait]
impl BatchService for Batches<'_> {
    const SERVICE: &'static str = "SNS";
    const HINTS: Hints = HINTS;

    fn core(&self) -> &SinkCore {
        &self.0.core
    }

    fn max_request_bytes(&self) -> usize {
        self.0.config.max_request_bytes
    }

    fn max_concurrent_requests(&self) -> usize {
        self.0.config.max_concurrent_requests
    }

    async fn look_up(&self, destination: &str) -> Result<Target> {
        let topic_ref = TopicRef::parse(destination)?;
        let name = topic_ref.name().to_owned();
        let arn = match topic_ref {
            TopicRef::Arn { arn, .. } => arn,
            TopicRef::Name(name) => match &self.0.config.topic_arn_prefix {
                Some(prefix) => format!("{prefix}{name}"),
                None => self.0.look_up(&name).await?,
            },
        };
        Ok(Target {
            fifo: is_fifo_name(&name),
            name,
            address: arn,
        })
    }

    async fn send_batch(
        &self,
        topic: &Target,
        entries: Vec<(String, &PreparedMessage)>,
    ) -> Result<BatchAnswer> {
        let entries = entries
            .into_iter()
            .map(|(id, message)| entry(id, message))
            .collect::<Result<Vec<_>>>()?;
        let output = self
            .0
            .client
            .publish_batch()
            .topic_arn(&topic.address)
            .set_publish_batch_request_entries(Some(entries))
            .send()
            .await
            .map_err(|e| self.explain(classify_sdk_error(&e), topic))?;
        Ok(BatchAnswer::new(
            output.successful().iter().filter_map(|ok| ok.id()),
            output
                .failed()
                .iter()
                .map(|failed| (failed.id(), self.explain(classify_entry(failed), topic))),
        ))
    }

    fn context(&self, topic: &Target) -> String {
        format!(
            "PublishBatch to SNS topic `{}` ({})",
            topic.name, self.0.core.location
        )
    }
}

#[async_trait]
impl Sink for SnsSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    /// `max_batch_len` events per call (split into ≤ 10-entry requests by the sink), payloads
    /// up to SNS's 256 KiB. `ordered_per_key` is false: the engine sends one event per
    /// aggregate per call, so no two requests in flight ever hold events of one FIFO group.
    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: Some(SNS_MAX_REQUEST_BYTES),
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.core.destination(event)
    }

    /// With a fixed topic: resolve it and `GetTopicAttributes` of it (reachable, credentials
    /// accepted, topic exists; a missing topic is a configuration error naming it). Otherwise
    /// `ListTopics`. An `AuthorizationError` answer proves the endpoint and the credentials, so
    /// it passes: the relay needs no permission beyond `sns:Publish`.
    async fn check(&self) -> Result<()> {
        let missing_is_config = |e: Error| {
            if e.kind() == ErrorKind::Unroutable {
                Error::config(format!("{CONFIG_SECTION}.topic: {}", e.full_message()))
            } else {
                e
            }
        };
        if let Some(destination) = &self.core.fixed_destination {
            let topic = Batches(self)
                .resolve(destination)
                .await
                .map_err(missing_is_config)?;
            let answer = self
                .client
                .get_topic_attributes()
                .topic_arn(&topic.address)
                .send()
                .await;
            return check_answer(answer, |e| {
                self.core.forget(destination);
                missing_is_config(HINTS.apply(classify_sdk_error(&e).context(format!(
                    "GetTopicAttributes of SNS topic `{}` ({})",
                    topic.name, self.core.location
                ))))
            });
        }
        let answer = self.client.list_topics().send().await;
        check_answer(answer, |e| {
            HINTS.apply(
                classify_sdk_error(&e)
                    .context(format!("ListTopics on SNS ({})", self.core.location)),
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
    fn region_is_required_and_credentials_never_show() {
        testkit::assert_region_required_and_user_info_hidden(
            "sink.sns",
            |region, endpoint, sdk| {
                let config = SnsConfig {
                    region,
                    endpoint,
                    ..SnsConfig::default()
                };
                SnsSink::from_sdk_config(config, sdk)
            },
        );
    }

    #[test]
    fn fifo_entries_carry_group_and_deduplication_ids() {
        let entry = entry(batch::entry_id(3), &testkit::fifo_message()).unwrap();
        assert_eq!(entry.id(), "e3");
        assert_eq!(entry.message(), "{}");
        assert_eq!(entry.message_group_id(), Some("42"));
        assert_eq!(entry.message_deduplication_id(), Some("x"));
        let attributes = entry.message_attributes().unwrap();
        assert_eq!(attributes["event_id"].data_type(), "String");
    }
}
