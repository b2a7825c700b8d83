//! One `publish` call of an AWS sink as batch requests (`SendMessageBatch`, `PublishBatch`):
//! resolve each destination once, prepare each message, cut requests of at most 10 entries and
//! `max_request_bytes` per destination, send them concurrently, and turn the per-entry answer
//! into one outcome per event.
//!
//! When a call holds several events of one aggregate (the relay's engine never does that for a
//! sink without `ordered_per_key`) they go out in successive waves, and an event whose
//! predecessor was not published is not sent. A request refused as a whole for its content
//! (too long, an invalid entry) is sent again entry by entry, so only the bad event is
//! rejected.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use futures_util::stream::{self, StreamExt};
use outboxkit_core::{Error, ErrorKind, OutboxEvent, Outcome, Result};

use crate::classify::{refuses_content, Hints};
use crate::message::{prepare, PreparedMessage};
use crate::sink::{SinkCore, Target};

/// Most entries SQS and SNS take in one batch request.
pub const MAX_ENTRIES_PER_REQUEST: usize = 10;

/// A sink's service, as [`publish`] drives it: what the sink implements is its one batch call
/// and the look-up of a destination; resolving once (cached), preparing messages, cutting and
/// sending requests and reading their answers are written once, here.
#[async_trait]
pub trait BatchService: Send + Sync {
    /// The service as messages name it (`SQS`, `SNS`).
    const SERVICE: &'static str;
    /// What to add to the errors an operator must act on.
    const HINTS: Hints;

    /// The sink's parts that are not its service's (template, resolved targets...).
    fn core(&self) -> &SinkCore;
    /// Most bytes in one request.
    fn max_request_bytes(&self) -> usize;
    /// Most requests in flight at once.
    fn max_concurrent_requests(&self) -> usize;
    /// Resolve `destination` with the service, uncached (see [`resolve`](Self::resolve)).
    async fn look_up(&self, destination: &str) -> Result<Target>;
    /// Whether the messages to `target` carry a group id (FIFO targets always do).
    fn group_id(&self, target: &Target) -> bool {
        target.fifo
    }
    /// Send one request of `entries` (each with its id, see [`entry_id`]); its errors, and those
    /// of its entries, are [`explain`](Self::explain)ed.
    async fn send_batch(
        &self,
        target: &Target,
        entries: Vec<(String, &PreparedMessage)>,
    ) -> Result<BatchAnswer>;
    /// What the errors of a request to `target` start with (`SendMessageBatch to SQS queue
    /// `orders` (us-east-1)`).
    fn context(&self, target: &Target) -> String;

    /// `destination` resolved once, then cached.
    async fn resolve(&self, destination: &str) -> Result<Target> {
        self.core()
            .resolve(destination, self.look_up(destination))
            .await
    }

    /// An error of a request to `target` (or of one of its entries): its context first, and
    /// what to do.
    fn explain(&self, error: Error, target: &Target) -> Error {
        Self::HINTS.apply(error.context(self.context(target)))
    }
}

/// The per-entry answer of one batch request.
#[derive(Debug, Default)]
pub struct BatchAnswer {
    /// Ids of the entries accepted.
    pub successful: Vec<String>,
    /// Ids of the entries refused, with the classified error of each.
    pub failed: Vec<(String, Error)>,
}

impl BatchAnswer {
    /// The answer of the ids of the entries accepted, and of those refused with their errors.
    pub fn new<'a>(
        successful: impl IntoIterator<Item = &'a str>,
        failed: impl IntoIterator<Item = (&'a str, Error)>,
    ) -> Self {
        Self {
            successful: successful.into_iter().map(str::to_owned).collect(),
            failed: failed
                .into_iter()
                .map(|(id, error)| (id.to_owned(), error))
                .collect(),
        }
    }
}

/// The id of the batch entry of the event at `index` in the call (`e0`, `e1`...).
pub fn entry_id(index: usize) -> String {
    format!("e{index}")
}

/// One request: events (by index in the call) bound for one target.
struct Request {
    destination: String,
    target: Target,
    members: Vec<usize>,
}

/// What became of one event of a call so far.
#[derive(Debug, Clone)]
enum Slot {
    Pending,
    Published,
    /// Not published: rejected, or to retry (with the error of its entry, of its request, of
    /// its target's resolution, or because an earlier event of its aggregate was not published).
    Failed(Outcome),
}

/// Publish `batch`, each event to its destination (see [`SinkCore::destination`]): one outcome
/// per event, in order.
pub async fn publish<S: BatchService>(service: &S, batch: &[OutboxEvent]) -> Vec<Outcome> {
    let n = batch.len();
    let concurrency = service.max_concurrent_requests();
    let core = service.core();
    let destinations: Vec<String> = batch.iter().map(|e| core.destination(e)).collect();
    let mut slots: Vec<Slot> = vec![Slot::Pending; n];

    // Resolve every destination of the call (cached after the first time).
    let mut distinct: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    for destination in &destinations {
        if seen.insert(destination.as_str()) {
            distinct.push(destination.clone());
        }
    }
    let resolved: HashMap<String, Result<Target>> = stream::iter(distinct)
        .map(|d: String| async move {
            let target = service.resolve(&d).await;
            (d, target)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut targets: Vec<Option<Target>> = vec![None; n];
    for (i, destination) in destinations.iter().enumerate() {
        match &resolved[destination] {
            Ok(target) => targets[i] = Some(target.clone()),
            Err(e) => slots[i] = request_failure(e),
        }
    }
    let messages: Vec<Option<PreparedMessage>> = batch
        .iter()
        .zip(&targets)
        .map(|(event, target)| {
            let cloudevents = core.cloudevents.as_ref();
            target
                .as_ref()
                .map(|t| prepare(event, service.group_id(t), t.fifo, cloudevents))
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
        let mut requests = requests(service, &members, &destinations, &targets, &messages);
        while !requests.is_empty() {
            let results: Vec<(Request, Result<BatchAnswer>)> = stream::iter(requests)
                .map(|request| {
                    let messages = &messages;
                    async move {
                        let entries = request
                            .members
                            .iter()
                            .filter_map(|&i| Some((entry_id(i), messages[i].as_ref()?)))
                            .collect();
                        let result = service.send_batch(&request.target, entries).await;
                        (request, result)
                    }
                })
                .buffer_unordered(concurrency)
                .collect()
                .await;
            let mut again = Vec::new();
            for (request, result) in results {
                let name = request.target.address.as_str();
                match result {
                    Ok(answer) => {
                        let mut answered = HashSet::new();
                        for id in &answer.successful {
                            if let Some(i) = member_of(&request, id) {
                                slots[i] = Slot::Published;
                                answered.insert(i);
                            }
                        }
                        for (id, error) in answer.failed {
                            let Some(i) = member_of(&request, &id) else {
                                continue;
                            };
                            answered.insert(i);
                            tracing::debug!(
                                target_name = %name,
                                event_id = %batch[i].event_id,
                                error = %error,
                                "{} refused an entry",
                                S::SERVICE
                            );
                            slots[i] = Slot::Failed(Outcome::from_error(error));
                        }
                        for &i in &request.members {
                            if !answered.contains(&i) {
                                slots[i] = Slot::Failed(Outcome::Retry(Error::new(
                                    ErrorKind::Other,
                                    format!(
                                        "{}: {}'s answer does not mention entry {}",
                                        service.context(&request.target),
                                        S::SERVICE,
                                        entry_id(i)
                                    ),
                                )));
                            }
                        }
                    }
                    Err(error) if refuses_content(&error) && request.members.len() > 1 => {
                        tracing::debug!(
                            target_name = %name,
                            entries = request.members.len(),
                            error = %error,
                            "{} refused a whole request; sending its entries one by one",
                            S::SERVICE
                        );
                        for &i in &request.members {
                            again.push(Request {
                                destination: request.destination.clone(),
                                target: request.target.clone(),
                                members: vec![i],
                            });
                        }
                    }
                    Err(error) => {
                        if error.kind() == ErrorKind::Unroutable {
                            // The target may have been deleted (and re-created elsewhere):
                            // resolve its name again next time.
                            core.forget(&request.destination);
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
        // Events not sent in this wave (target not resolved) hold their aggregate too.
        for i in (0..n).filter(|&i| wave_of[i] == wave) {
            if !matches!(slots[i], Slot::Published | Slot::Pending) {
                held.insert(batch[i].aggregate_id.as_str());
            }
        }
    }

    slots
        .into_iter()
        .map(|slot| match slot {
            Slot::Published => Outcome::Published,
            Slot::Failed(outcome) => outcome,
            Slot::Pending => Outcome::Retry(Error::new(
                ErrorKind::Other,
                format!(
                    "not sent (the {} sink lost track of this event)",
                    S::SERVICE
                ),
            )),
        })
        .collect()
}

/// Cut the events of one wave into requests: per target, in call order, at most 10 entries
/// and `max_request_bytes` each (a larger message goes alone).
fn requests<S: BatchService>(
    service: &S,
    members: &[usize],
    destinations: &[String],
    targets: &[Option<Target>],
    messages: &[Option<PreparedMessage>],
) -> Vec<Request> {
    let max_bytes = service.max_request_bytes();
    let mut requests: Vec<Request> = Vec::new();
    // Open request per target, with its byte count.
    let mut open: HashMap<&str, (usize, usize)> = HashMap::new();
    for &i in members {
        let (Some(target), Some(message)) = (&targets[i], &messages[i]) else {
            continue;
        };
        let name = target.address.as_str();
        if let Some((index, bytes)) = open.get_mut(name) {
            let request = &mut requests[*index];
            if request.members.len() < MAX_ENTRIES_PER_REQUEST && *bytes + message.size <= max_bytes
            {
                request.members.push(i);
                *bytes += message.size;
                continue;
            }
        }
        open.insert(name, (requests.len(), message.size));
        requests.push(Request {
            destination: destinations[i].clone(),
            target: target.clone(),
            members: vec![i],
        });
    }
    requests
}

/// The slot of the events of a request (or resolution) that failed as a whole: each gets the
/// request's error as its outcome.
fn request_failure(error: &Error) -> Slot {
    Slot::Failed(Outcome::from_error(error.clone()))
}

/// The event index of batch entry `id` (`e<index>`) if it belongs to `request`.
fn member_of(request: &Request, id: &str) -> Option<usize> {
    let index: usize = id.strip_prefix('e')?.parse().ok()?;
    request.members.contains(&index).then_some(index)
}

/// The batching keys of a sink's section, checked; errors name the key (`sink.sqs.max_batch_len:
/// ...`). `service_limit` is the largest request the service takes.
pub fn validate_limits(
    section: &str,
    service: &str,
    max_batch_len: usize,
    max_request_bytes: usize,
    service_limit: usize,
    max_concurrent_requests: usize,
) -> Result<()> {
    if max_batch_len == 0 || max_batch_len > 10_000 {
        return Err(Error::config(format!(
            "{section}.max_batch_len: must be between 1 and 10000, got {max_batch_len}"
        )));
    }
    if !(1024..=service_limit).contains(&max_request_bytes) {
        return Err(Error::config(format!(
            "{section}.max_request_bytes: must be between 1024 and {service_limit} \
             ({service}'s limit), got {max_request_bytes}"
        )));
    }
    if max_concurrent_requests == 0 || max_concurrent_requests > 256 {
        return Err(Error::config(format!(
            "{section}.max_concurrent_requests: must be between 1 and 256, got {max_concurrent_requests}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxkit_core::DestinationTemplate;

    /// Targets are their names; nothing is sent.
    struct Fake(SinkCore);

    #[async_trait]
    impl BatchService for Fake {
        const SERVICE: &'static str = "FAKE";
        const HINTS: Hints = Hints {
            missing_destination: "",
            unauthorized: "",
            config: "",
        };
        fn core(&self) -> &SinkCore {
            &self.0
        }
        fn max_request_bytes(&self) -> usize {
            256 * 1024
        }
        fn max_concurrent_requests(&self) -> usize {
            1
        }
        async fn look_up(&self, destination: &str) -> Result<Target> {
            Ok(target(destination))
        }
        async fn send_batch(
            &self,
            _: &Target,
            entries: Vec<(String, &PreparedMessage)>,
        ) -> Result<BatchAnswer> {
            Ok(BatchAnswer {
                successful: entries.into_iter().map(|(id, _)| id).collect(),
                failed: Vec::new(),
            })
        }
        fn context(&self, target: &Target) -> String {
            target.name.clone()
        }
    }

    fn fake() -> Fake {
        let template = DestinationTemplate::parse("{aggregate_type}").unwrap();
        Fake(SinkCore::new(template, None, "here".to_owned()))
    }

    fn target(name: &str) -> Target {
        Target {
            name: name.to_owned(),
            address: name.to_owned(),
            fifo: false,
        }
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

    #[test]
    fn requests_hold_at_most_ten_entries_and_max_request_bytes_per_queue() {
        let n = 25;
        let members: Vec<usize> = (0..n).collect();
        let destinations = vec!["a".to_owned(); n];
        let mut targets = vec![Some(target("a")); n];
        targets[3] = Some(target("b"));
        let mut messages = vec![message(1000); n];
        messages[5] = message(200 * 1024);
        messages[6] = message(100 * 1024);
        messages[7] = message(400 * 1024);
        let requests = requests(&fake(), &members, &destinations, &targets, &messages);
        let shapes: Vec<(String, Vec<usize>)> = requests
            .iter()
            .map(|r| (r.target.address.clone(), r.members.clone()))
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
}
