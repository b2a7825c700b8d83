//! The [`Sink`] implementation: `SendMessageBatch` requests of at most 10 entries and
//! `max_request_bytes`, sent concurrently, one outcome per event from SQS's per-entry answer.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use aws_sdk_sqs::config::retry::RetryConfig;
use aws_sdk_sqs::config::timeout::TimeoutConfig;
use aws_sdk_sqs::config::Region;
use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchOutput;
use aws_sdk_sqs::types::{MessageAttributeValue, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use futures_util::stream::{self, StreamExt};
use outboxkit_core::cloudevents::CloudEvents;
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};

use crate::classify::{classify_entry, classify_sdk_error, is_access_denied, refuses_content};
use crate::config::{SqsConfig, CONFIG_SECTION, MAX_ENTRIES_PER_REQUEST, SQS_MAX_REQUEST_BYTES};
use crate::message::{prepare, PreparedMessage};
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

/// One `SendMessageBatch` request: events (by index in the call) bound for one queue.
struct Request {
    destination: String,
    queue: ResolvedQueue,
    members: Vec<usize>,
}

/// What became of one event of a call so far.
#[derive(Debug, Clone)]
enum Slot {
    Pending,
    Published,
    /// Not published: rejected, or to retry (with the error of its entry, of its request, of
    /// its queue's resolution, or because an earlier event of its aggregate was not published).
    Failed(Outcome),
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
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        if let Some(profile) = &config.profile {
            loader = loader.profile_name(profile);
        }
        let sdk_config = loader.load().await;
        Self::from_sdk_config(config, &sdk_config)
    }

    /// Build the sink from an AWS SDK configuration of your own (credentials provider, HTTP
    /// client...); the `region` and `endpoint` keys of `config` still win over it.
    pub fn from_sdk_config(config: SqsConfig, sdk_config: &aws_config::SdkConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let region = config
            .region
            .clone()
            .or_else(|| sdk_config.region().map(|r| r.to_string()))
            .ok_or_else(|| {
                Error::config(format!(
                    "{CONFIG_SECTION}.region: no AWS region configured: set {CONFIG_SECTION}.region, \
                     or AWS_REGION, or a region in the AWS profile"
                ))
            })?;
        let mut builder = aws_sdk_sqs::config::Builder::from(sdk_config)
            .region(Region::new(region.clone()))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(config.connect_timeout)
                    .operation_attempt_timeout(config.request_timeout)
                    .build(),
            )
            .retry_config(RetryConfig::standard().with_max_attempts(config.retry_attempts));
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint.trim_end_matches('/'));
        }
        let client = Client::from_conf(builder.build());
        let endpoint = config.redacted_endpoint().or_else(|| {
            ["AWS_ENDPOINT_URL_SQS", "AWS_ENDPOINT_URL"]
                .iter()
                .find_map(|var| std::env::var(var).ok().filter(|v| !v.is_empty()))
                .map(|v| crate::config::redact_url(&v))
        });
        let location = match endpoint {
            Some(endpoint) => format!("{region} at {endpoint}"),
            None => region,
        };
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

    /// Cut the events of one wave into requests: per queue, in call order, at most 10 entries
    /// and `max_request_bytes` each (a larger message goes alone).
    fn requests(
        &self,
        members: &[usize],
        destinations: &[String],
        queues: &[Option<ResolvedQueue>],
        messages: &[Option<PreparedMessage>],
    ) -> Vec<Request> {
        let mut requests: Vec<Request> = Vec::new();
        // Open request per queue URL, with its byte count.
        let mut open: HashMap<&str, (usize, usize)> = HashMap::new();
        for &i in members {
            let (Some(queue), Some(message)) = (&queues[i], &messages[i]) else {
                continue;
            };
            if let Some((index, bytes)) = open.get_mut(queue.url.as_str()) {
                let request = &mut requests[*index];
                if request.members.len() < MAX_ENTRIES_PER_REQUEST
                    && *bytes + message.size <= self.config.max_request_bytes
                {
                    request.members.push(i);
                    *bytes += message.size;
                    continue;
                }
            }
            open.insert(queue.url.as_str(), (requests.len(), message.size));
            requests.push(Request {
                destination: destinations[i].clone(),
                queue: queue.clone(),
                members: vec![i],
            });
        }
        requests
    }

    async fn send(
        &self,
        request: &Request,
        messages: &[Option<PreparedMessage>],
    ) -> Result<SendMessageBatchOutput> {
        let mut entries = Vec::with_capacity(request.members.len());
        for &i in &request.members {
            let Some(message) = &messages[i] else {
                continue;
            };
            entries.push(entry(i, message)?);
        }
        self.client
            .send_message_batch()
            .queue_url(&request.queue.url)
            .set_entries(Some(entries))
            .send()
            .await
            .map_err(|e| {
                let error = classify_sdk_error(&e).context(format!(
                    "SendMessageBatch to SQS queue `{}` ({})",
                    request.queue.name, self.location
                ));
                with_hint(error)
            })
    }
}

/// One batch entry; its id is the event's index in the call (unique per request, `e0`..).
fn entry(index: usize, message: &PreparedMessage) -> Result<SendMessageBatchRequestEntry> {
    let build_error = |e: aws_sdk_sqs::error::BuildError| {
        Error::new(
            ErrorKind::Other,
            format!("building an SQS batch entry: {e}"),
        )
    };
    let mut builder = SendMessageBatchRequestEntry::builder()
        .id(format!("e{index}"))
        .message_body(message.body.clone())
        .set_message_group_id(message.group_id.clone())
        .set_message_deduplication_id(message.deduplication_id.clone());
    for (name, value) in &message.attributes {
        let value = MessageAttributeValue::builder()
            .data_type("String")
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
    let retryable = error.is_retryable();
    let kind = error.kind();
    let text = format!("{} — {hint}", error.full_message());
    let out = Error::new(kind, text);
    if retryable {
        out.temporary()
    } else {
        out.permanent()
    }
}

/// The template's destination when it is the same for every event.
fn fixed_destination(template: &DestinationTemplate) -> Option<String> {
    let probe = |text: &str| OutboxEvent {
        id: 0,
        event_id: Default::default(),
        aggregate_type: format!("t{text}"),
        aggregate_id: format!("i{text}"),
        event_type: format!("e{text}"),
        payload: Vec::new(),
        payload_type: Default::default(),
        headers: Default::default(),
        destination: None,
        created_at: Default::default(),
        attempts: 0,
        shard: 0,
    };
    let a = template.render(&probe("1"));
    (a == template.render(&probe("2"))).then_some(a)
}

/// The slot of the events of a request (or queue resolution) that failed as a whole: each
/// gets the request's error as its outcome.
fn request_failure(error: &Error) -> Slot {
    Slot::Failed(Outcome::from_error(error.clone()))
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
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let n = batch.len();
        let concurrency = self.config.max_concurrent_requests;
        let mut slots: Vec<Slot> = vec![Slot::Pending; n];
        let destinations: Vec<String> = batch.iter().map(|e| self.destination(e)).collect();

        // Resolve every queue of the call (cached after the first time).
        let mut distinct: Vec<String> = Vec::new();
        let mut seen_destinations = HashSet::new();
        for destination in &destinations {
            if seen_destinations.insert(destination.as_str()) {
                distinct.push(destination.clone());
            }
        }
        let resolved: HashMap<String, Result<ResolvedQueue>> = stream::iter(distinct)
            .map(|d: String| async move {
                let queue = self.resolve(&d).await;
                (d, queue)
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let mut queues: Vec<Option<ResolvedQueue>> = vec![None; n];
        for (i, destination) in destinations.iter().enumerate() {
            match &resolved[destination] {
                Ok(queue) => queues[i] = Some(queue.clone()),
                Err(e) => slots[i] = request_failure(e),
            }
        }
        let messages: Vec<Option<PreparedMessage>> = batch
            .iter()
            .zip(&queues)
            .map(|(event, queue)| {
                queue.as_ref().map(|q| {
                    let fair_queue_group = self.config.fair_queue_group;
                    prepare(event, q.fifo, fair_queue_group, self.cloudevents.as_ref())
                })
            })
            .collect();

        // Waves: the k-th event of an aggregate in this call goes in wave k.
        let mut wave_of = vec![0usize; n];
        let mut per_aggregate: HashMap<&str, usize> = HashMap::new();
        for (i, event) in batch.iter().enumerate() {
            let count = per_aggregate
                .entry(event.aggregate_id.as_str())
                .or_default();
            wave_of[i] = *count;
            *count += 1;
        }
        let waves = wave_of.iter().max().map_or(0, |m| m + 1);
        let mut held: HashSet<&str> = HashSet::new();
        for wave in 0..waves {
            let mut members = Vec::new();
            for i in (0..n).filter(|&i| wave_of[i] == wave) {
                let aggregate = batch[i].aggregate_id.as_str();
                if !matches!(slots[i], Slot::Pending) {
                    continue;
                }
                if held.contains(aggregate) {
                    slots[i] = Slot::Failed(Outcome::Retry(Error::new(
                        ErrorKind::Other,
                        format!(
                            "not sent: an earlier event of aggregate `{aggregate}` in the same call \
                             was not published"
                        ),
                    )));
                    continue;
                }
                members.push(i);
            }
            let mut requests = self.requests(&members, &destinations, &queues, &messages);
            while !requests.is_empty() {
                let results: Vec<(Request, Result<SendMessageBatchOutput>)> =
                    stream::iter(requests)
                        .map(|request| {
                            let messages = &messages;
                            async move {
                                let result = self.send(&request, messages).await;
                                (request, result)
                            }
                        })
                        .buffer_unordered(concurrency)
                        .collect()
                        .await;
                let mut again = Vec::new();
                for (request, result) in results {
                    match result {
                        Ok(output) => {
                            let context = || {
                                format!(
                                    "SendMessageBatch to SQS queue `{}` ({})",
                                    request.queue.name, self.location
                                )
                            };
                            let mut answered = HashSet::new();
                            for ok in output.successful() {
                                if let Some(i) = member_of(&request, ok.id()) {
                                    slots[i] = Slot::Published;
                                    answered.insert(i);
                                }
                            }
                            for failed in output.failed() {
                                let Some(i) = member_of(&request, failed.id()) else {
                                    continue;
                                };
                                answered.insert(i);
                                let error = with_hint(classify_entry(failed).context(context()));
                                tracing::debug!(
                                    queue = %request.queue.name,
                                    event_id = %batch[i].event_id,
                                    error = %error,
                                    "SQS refused an entry"
                                );
                                slots[i] = Slot::Failed(Outcome::from_error(error));
                            }
                            for &i in &request.members {
                                if !answered.contains(&i) {
                                    slots[i] = Slot::Failed(Outcome::Retry(Error::new(
                                        ErrorKind::Other,
                                        format!(
                                            "{}: SQS's answer does not mention entry e{i}",
                                            context()
                                        ),
                                    )));
                                }
                            }
                        }
                        Err(error) if refuses_content(&error) && request.members.len() > 1 => {
                            tracing::debug!(
                                queue = %request.queue.name,
                                entries = request.members.len(),
                                error = %error,
                                "SQS refused a whole request; sending its entries one by one"
                            );
                            for &i in &request.members {
                                again.push(Request {
                                    destination: request.destination.clone(),
                                    queue: request.queue.clone(),
                                    members: vec![i],
                                });
                            }
                        }
                        Err(error) => {
                            if error.kind() == ErrorKind::Unroutable {
                                // The queue may have been deleted (and re-created elsewhere):
                                // resolve its name again next time.
                                self.forget(&request.destination);
                            }
                            for &i in &request.members {
                                slots[i] = request_failure(&error);
                            }
                        }
                    }
                }
                requests = again;
            }
            for &i in &members {
                if !matches!(slots[i], Slot::Published) {
                    held.insert(batch[i].aggregate_id.as_str());
                }
            }
            // Events not sent in this wave (queue not resolved) hold their aggregate too.
            for i in (0..n).filter(|&i| wave_of[i] == wave) {
                if !matches!(slots[i], Slot::Published | Slot::Pending) {
                    held.insert(batch[i].aggregate_id.as_str());
                }
            }
        }

        Ok(slots
            .into_iter()
            .map(|slot| match slot {
                Slot::Published => Outcome::Published,
                Slot::Failed(outcome) => outcome,
                Slot::Pending => Outcome::Retry(Error::new(
                    ErrorKind::Other,
                    "not sent (the SQS sink lost track of this event)",
                )),
            })
            .collect())
    }
}

/// The event index of batch entry `id` (`e<index>`) if it belongs to `request`.
fn member_of(request: &Request, id: &str) -> Option<usize> {
    let index: usize = id.strip_prefix('e')?.parse().ok()?;
    request.members.contains(&index).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(config: SqsConfig) -> SqsSink {
        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .build();
        SqsSink::from_sdk_config(config, &sdk).unwrap()
    }

    fn message(size: usize) -> Option<PreparedMessage> {
        Some(PreparedMessage {
            body: String::new(),
            attributes: Vec::new(),
            group_id: None,
            deduplication_id: None,
            size,
        })
    }

    fn queue(url: &str) -> Option<ResolvedQueue> {
        Some(ResolvedQueue {
            name: url.into(),
            url: url.into(),
            fifo: false,
        })
    }

    #[test]
    fn requests_hold_at_most_ten_entries_and_max_request_bytes_per_queue() {
        let sink = sink(SqsConfig::default());
        let n = 25;
        let members: Vec<usize> = (0..n).collect();
        let destinations = vec!["a".to_owned(); n];
        let mut queues = vec![queue("a"); n];
        queues[3] = queue("b");
        let mut messages = vec![message(1000); n];
        messages[5] = message(200 * 1024);
        messages[6] = message(100 * 1024);
        messages[7] = message(400 * 1024);
        let requests = sink.requests(&members, &destinations, &queues, &messages);
        let shapes: Vec<(String, Vec<usize>)> = requests
            .iter()
            .map(|r| (r.queue.url.clone(), r.members.clone()))
            .collect();
        assert_eq!(
            shapes,
            vec![
                ("a".to_owned(), vec![0, 1, 2, 4, 5]),
                ("b".to_owned(), vec![3]),
                ("a".to_owned(), vec![6]),
                ("a".to_owned(), vec![7]),
                ("a".to_owned(), vec![8, 9, 10, 11, 12, 13, 14, 15, 16, 17]),
                ("a".to_owned(), vec![18, 19, 20, 21, 22, 23, 24]),
            ]
        );
    }

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
    fn fixed_destinations_are_detected() {
        let t = |s: &str| DestinationTemplate::parse(s).unwrap();
        assert_eq!(
            fixed_destination(&t("orders.fifo")).as_deref(),
            Some("orders.fifo")
        );
        assert_eq!(fixed_destination(&t("{aggregate_type}")), None);
        assert_eq!(fixed_destination(&t("app-{event_type}")), None);
        assert_eq!(fixed_destination(&t("q-{aggregate_id}")), None);
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
        let entry = entry(7, &message).unwrap();
        assert_eq!(entry.id(), "e7");
        assert_eq!(entry.message_body(), "{}");
        assert_eq!(entry.message_group_id(), Some("42"));
        assert_eq!(entry.message_deduplication_id(), Some("x"));
        let attributes = entry.message_attributes().unwrap();
        assert_eq!(attributes["event_id"].data_type(), "String");
        assert_eq!(attributes["event_id"].string_value(), Some("x"));
    }
}
