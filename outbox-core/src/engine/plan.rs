//! Publish planning: which events of a claimed batch go in each `Sink::publish` call, and what
//! became of each event.
//!
//! [`Plan`] is pure: it builds rounds (calls) that never let a later event of an aggregate go
//! out before — or alongside, unless the sink keeps key order — an earlier one, and settles
//! each round from the sink's answer. [`publish_batch`] only calls the sink.

use std::borrow::Cow;
use std::collections::HashSet;
use std::time::{Duration, Instant};

use super::contain::{sink_call, Limit};
use crate::error::{Error, ErrorKind, Result};
use crate::model::{OutboxEvent, Outcome};
use crate::sink::{whole_call_failure, Sink, SinkCapabilities};

/// What became of one event of a claimed batch.
#[derive(Debug)]
pub(super) enum Disposition {
    /// The broker acknowledged it.
    Published,
    /// It failed on its own and may succeed later: back off, or park it after `max_attempts`.
    Retry(Error),
    /// It failed on its own for good: park it as dead.
    Reject(Error),
    /// Not sent: an earlier event of its aggregate failed, or the call failed as a whole.
    NotSent,
}

/// A batch's dispositions, one per event in batch order, and whether publishing stopped on a
/// call that failed as a whole.
#[derive(Debug)]
pub(super) struct PublishReport {
    pub(super) dispositions: Vec<Disposition>,
    /// The call failed as a whole (`Err` from the sink, or [`whole_call_failure`] of its
    /// outcomes): nothing dead-lettered for it.
    pub(super) call_error: Option<Error>,
}

/// One `publish` call: indexes into the batch, increasing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Round(Vec<usize>);

impl Round {
    /// The batch positions of the round's events.
    pub(super) fn indexes(&self) -> &[usize] {
        &self.0
    }
}

/// The rounds of one claimed batch and the disposition of each event so far.
#[derive(Debug)]
pub(super) struct Plan<'b> {
    batch: &'b [OutboxEvent],
    sink_kind: &'static str,
    ordered_per_key: bool,
    max_len: usize,
    decided: Vec<Option<Disposition>>,
    /// Aggregates with a failed or unsent event: their later events are not sent.
    blocked: HashSet<&'b str>,
}

impl<'b> Plan<'b> {
    /// Plan `batch` for a sink of kind `sink_kind` with `caps`. Payloads larger than the sink
    /// accepts are rejected at once, without a call.
    pub(super) fn new(
        batch: &'b [OutboxEvent],
        caps: SinkCapabilities,
        sink_kind: &'static str,
    ) -> Self {
        let mut decided: Vec<Option<Disposition>> = (0..batch.len()).map(|_| None).collect();
        if let Some(max) = caps.max_payload_bytes {
            for (i, event) in batch.iter().enumerate() {
                if event.payload.len() > max {
                    decided[i] = Some(Disposition::Reject(Error::new(
                        ErrorKind::MessageTooLarge,
                        format!(
                            "payload of {} bytes is larger than the {sink_kind} sink accepts ({max} bytes)",
                            event.payload.len(),
                        ),
                    )));
                }
            }
        }
        Self {
            batch,
            sink_kind,
            ordered_per_key: caps.ordered_per_key,
            max_len: caps.max_batch_len.max(1),
            decided,
            blocked: HashSet::new(),
        }
    }

    /// The next call: in batch order, the events not decided yet whose aggregate has no failed
    /// or unsent event before them — one per aggregate unless the sink keeps key order — up to
    /// `max_batch_len`. Events behind a failed or unsent one are decided `NotSent` on the way.
    /// `None` when nothing is left to send.
    pub(super) fn next_round(&mut self) -> Option<Round> {
        let batch = self.batch;
        let mut round = Vec::with_capacity(batch.len().min(self.max_len));
        let mut in_round: HashSet<&str> = HashSet::new();
        for (i, event) in batch.iter().enumerate() {
            let agg = event.aggregate_id.as_str();
            match &self.decided[i] {
                Some(Disposition::Published) => continue,
                Some(_) => {
                    self.blocked.insert(agg);
                    continue;
                }
                None => {}
            }
            if self.blocked.contains(agg) {
                self.decided[i] = Some(Disposition::NotSent);
                continue;
            }
            if !self.ordered_per_key && !in_round.insert(agg) {
                continue;
            }
            round.push(i);
            if round.len() == self.max_len {
                break;
            }
        }
        (!round.is_empty()).then_some(Round(round))
    }

    /// The events of `round`: borrowed from the batch when they are contiguous in it.
    pub(super) fn events(&self, round: &Round) -> Cow<'b, [OutboxEvent]> {
        let batch = self.batch;
        let indexes = round.indexes();
        match (indexes.first(), indexes.last()) {
            (Some(&first), Some(&last)) if last - first + 1 == indexes.len() => {
                Cow::Borrowed(&batch[first..=last])
            }
            _ => Cow::Owned(indexes.iter().map(|&i| batch[i].clone()).collect()),
        }
    }

    /// Settle `round` from what the sink answered. `Err` when the call failed as a whole — an
    /// `Err` from the sink, a wrong number of outcomes, or [`whole_call_failure`] of them (the
    /// one place that applies the rule) — and then no further round is to be sent: the
    /// acknowledged events stay published, the failed ones count as not sent (no attempt
    /// charged, nothing dead-lettered).
    pub(super) fn settle(&mut self, round: &Round, answer: Result<Vec<Outcome>>) -> Result<()> {
        let outcomes = answer?;
        let indexes = round.indexes();
        if outcomes.len() != indexes.len() {
            return Err(Error::new(
                ErrorKind::Other,
                format!(
                    "the {} sink returned {} outcomes for {} events (a bug in the sink); \
                     the batch will be sent again",
                    self.sink_kind,
                    outcomes.len(),
                    indexes.len()
                ),
            ));
        }
        let whole_call = whole_call_failure(&outcomes);
        for (&i, outcome) in indexes.iter().zip(outcomes) {
            let aggregate = self.batch[i].aggregate_id.as_str();
            self.decided[i] = Some(match outcome {
                Outcome::Published => Disposition::Published,
                _ if whole_call.is_some() => Disposition::NotSent,
                Outcome::Retry(error) => {
                    self.blocked.insert(aggregate);
                    Disposition::Retry(error)
                }
                Outcome::Reject(error) => {
                    self.blocked.insert(aggregate);
                    Disposition::Reject(error)
                }
            });
        }
        whole_call.map_or(Ok(()), Err)
    }

    /// Every event's disposition, in batch order; events never settled were not sent.
    pub(super) fn finish(self) -> Vec<Disposition> {
        self.decided
            .into_iter()
            .map(|d| d.unwrap_or(Disposition::NotSent))
            .collect()
    }
}

/// Publish a claimed batch round by round (see [`Plan`]), stopping at a call that failed as a
/// whole; a call that panics or takes longer than `timeout` (`relay.publish_timeout`) failed
/// as a whole.
pub(super) async fn publish_batch(
    sink: &dyn Sink,
    batch: &[OutboxEvent],
    timeout: Duration,
    duration: &metrics::Histogram,
) -> PublishReport {
    let mut plan = Plan::new(batch, sink.capabilities(), sink.kind());
    let mut call_error = None;
    let limit = Limit {
        limit: timeout,
        set_by: "relay.publish_timeout",
        then: "the call failed as a whole; its events stay pending and are sent again",
    };
    while let Some(round) = plan.next_round() {
        let events = plan.events(&round);
        let started = Instant::now();
        let answer = sink_call(sink.kind(), "publish", &limit, sink.publish(&events)).await;
        duration.record(started.elapsed().as_secs_f64());
        if let Err(e) = plan.settle(&round, answer) {
            call_error = Some(e);
            break;
        }
    }
    PublishReport {
        dispositions: plan.finish(),
        call_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: i64, aggregate: &str) -> OutboxEvent {
        OutboxEvent::new(
            id,
            "order",
            aggregate,
            "OrderChanged",
            serde_json::json!({}),
        )
    }

    /// Events with ids 1, 2, ... of the aggregates named, in order.
    fn batch(aggregates: &[&str]) -> Vec<OutboxEvent> {
        aggregates
            .iter()
            .zip(1..)
            .map(|(aggregate, id)| event(id, aggregate))
            .collect()
    }

    fn caps(max_batch_len: usize, ordered_per_key: bool) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len,
            max_payload_bytes: None,
            ordered_per_key,
        }
    }

    fn ids(plan: &Plan<'_>, round: &Round) -> Vec<i64> {
        plan.events(round).iter().map(|e| e.id).collect()
    }

    fn all_published(n: usize) -> Result<Vec<Outcome>> {
        Ok((0..n).map(|_| Outcome::Published).collect())
    }

    /// Every round's ids, with every call acknowledged in full.
    fn rounds_when_all_published(plan: &mut Plan<'_>) -> Vec<Vec<i64>> {
        let mut rounds = Vec::new();
        while let Some(round) = plan.next_round() {
            rounds.push(ids(plan, &round));
            plan.settle(&round, all_published(round.indexes().len()))
                .unwrap();
        }
        rounds
    }

    fn names(dispositions: &[Disposition]) -> Vec<&'static str> {
        dispositions
            .iter()
            .map(|d| match d {
                Disposition::Published => "published",
                Disposition::Retry(_) => "retry",
                Disposition::Reject(_) => "reject",
                Disposition::NotSent => "not sent",
            })
            .collect()
    }

    fn retry(kind: ErrorKind) -> Outcome {
        Outcome::Retry(Error::new(kind, format!("{kind} failure")))
    }

    #[test]
    fn an_unordered_sink_gets_one_event_per_aggregate_per_call_in_id_order() {
        let batch = batch(&["A", "B", "A", "A", "B", "C"]);
        let mut plan = Plan::new(&batch, caps(100, false), "test");
        assert_eq!(
            rounds_when_all_published(&mut plan),
            vec![vec![1, 2, 6], vec![3, 5], vec![4]]
        );
        assert!(plan.next_round().is_none());
        assert_eq!(names(&plan.finish()), vec!["published"; 6]);
    }

    #[test]
    fn an_ordered_sink_gets_the_batch_in_calls_of_max_batch_len() {
        let batch = batch(&["A", "A", "B", "A", "B", "A"]);
        let mut plan = Plan::new(&batch, caps(4, true), "test");
        assert_eq!(
            rounds_when_all_published(&mut plan),
            vec![vec![1, 2, 3, 4], vec![5, 6]]
        );
    }

    #[test]
    fn max_batch_len_caps_an_unordered_call_and_zero_counts_as_one() {
        let batch = batch(&["A", "B", "C", "D", "E"]);
        let mut plan = Plan::new(&batch, caps(2, false), "test");
        assert_eq!(
            rounds_when_all_published(&mut plan),
            vec![vec![1, 2], vec![3, 4], vec![5]]
        );
        let mut plan = Plan::new(&batch[..2], caps(0, true), "test");
        assert_eq!(rounds_when_all_published(&mut plan), vec![vec![1], vec![2]]);
    }

    #[test]
    fn an_oversized_payload_is_rejected_without_a_call_and_holds_its_aggregate() {
        let mut batch = batch(&["A", "A", "B"]);
        batch[0].payload = vec![b'x'; 11];
        let capabilities = SinkCapabilities {
            max_payload_bytes: Some(10),
            ..caps(100, false)
        };
        let mut plan = Plan::new(&batch, capabilities, "test");
        assert_eq!(rounds_when_all_published(&mut plan), vec![vec![3]]);
        let dispositions = plan.finish();
        assert_eq!(
            names(&dispositions),
            vec!["reject", "not sent", "published"]
        );
        let Disposition::Reject(error) = &dispositions[0] else {
            panic!("not rejected: {:?}", dispositions[0]);
        };
        assert_eq!(error.kind(), ErrorKind::MessageTooLarge);
        assert_eq!(
            error.message(),
            "payload of 11 bytes is larger than the test sink accepts (10 bytes)"
        );
    }

    #[test]
    fn a_failed_event_holds_back_the_rest_of_its_aggregate_only() {
        let batch = batch(&["A", "B", "C", "A", "B", "C", "D"]);
        let mut plan = Plan::new(&batch, caps(100, false), "test");
        let round = plan.next_round().unwrap();
        assert_eq!(ids(&plan, &round), vec![1, 2, 3, 7]);
        let rejected = Outcome::Reject(Error::new(ErrorKind::InvalidMessage, "bad"));
        let answer = Ok(vec![
            retry(ErrorKind::Other),
            rejected,
            Outcome::Published,
            Outcome::Published,
        ]);
        plan.settle(&round, answer).unwrap();
        let round = plan.next_round().unwrap();
        assert_eq!(ids(&plan, &round), vec![6], "only C moves on");
        plan.settle(&round, all_published(1)).unwrap();
        assert!(plan.next_round().is_none());
        assert_eq!(
            names(&plan.finish()),
            vec![
                "retry",
                "reject",
                "published",
                "not sent",
                "not sent",
                "published",
                "published"
            ]
        );
    }

    #[test]
    fn an_ordered_sink_failure_holds_back_what_the_call_did_not_reach() {
        let batch = batch(&["A", "A", "A", "B"]);
        let mut plan = Plan::new(&batch, caps(2, true), "test");
        let round = plan.next_round().unwrap();
        assert_eq!(ids(&plan, &round), vec![1, 2]);
        let answer = Ok(vec![Outcome::Published, retry(ErrorKind::Other)]);
        plan.settle(&round, answer).unwrap();
        let round = plan.next_round().unwrap();
        assert_eq!(ids(&plan, &round), vec![4]);
        plan.settle(&round, all_published(1)).unwrap();
        assert_eq!(
            names(&plan.finish()),
            vec!["published", "retry", "not sent", "published"]
        );
    }

    #[test]
    fn a_call_failed_as_a_whole_keeps_what_was_published_and_ends_the_plan() {
        let batch = batch(&["A", "B", "C", "A"]);
        let mut plan = Plan::new(&batch, caps(100, false), "test");
        let round = plan.next_round().unwrap();
        let answer = Ok(vec![
            Outcome::Published,
            retry(ErrorKind::Other),
            Outcome::Reject(Error::new(ErrorKind::Unauthorized, "refused")),
        ]);
        let error = plan.settle(&round, answer).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Unauthorized);
        assert_eq!(
            names(&plan.finish()),
            vec!["published", "not sent", "not sent", "not sent"],
            "no attempt charged, nothing parked"
        );
    }

    #[test]
    fn an_err_or_a_wrong_number_of_outcomes_fails_the_call() {
        let batch = batch(&["A", "B"]);
        let mut plan = Plan::new(&batch, caps(100, false), "test");
        let round = plan.next_round().unwrap();
        let error = plan
            .settle(&round, Err(Error::new(ErrorKind::Connection, "down")))
            .unwrap_err();
        assert_eq!(error.message(), "down");
        assert_eq!(names(&plan.finish()), vec!["not sent"; 2]);

        let mut plan = Plan::new(&batch, caps(100, false), "test");
        let round = plan.next_round().unwrap();
        let error = plan.settle(&round, all_published(1)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Other);
        assert!(
            error
                .message()
                .starts_with("the test sink returned 1 outcomes for 2 events"),
            "{error}"
        );
        assert_eq!(names(&plan.finish()), vec!["not sent"; 2]);
    }

    #[test]
    fn a_contiguous_round_is_borrowed_from_the_batch() {
        let batch = batch(&["A", "B", "A", "C"]);
        let mut plan = Plan::new(&batch, caps(2, false), "test");
        let round = plan.next_round().unwrap();
        assert!(matches!(plan.events(&round), Cow::Borrowed(_)));
        plan.settle(&round, all_published(2)).unwrap();
        let round = plan.next_round().unwrap();
        assert_eq!(round.indexes(), &[2, 3]);
        assert!(matches!(plan.events(&round), Cow::Borrowed(_)));

        let mut plan = Plan::new(&batch, caps(100, false), "test");
        let round = plan.next_round().unwrap();
        assert_eq!(round.indexes(), &[0, 1, 3]);
        let events = plan.events(&round);
        assert!(matches!(events, Cow::Owned(_)));
        assert_eq!(
            events.iter().map(|e| e.id).collect::<Vec<_>>(),
            vec![1, 2, 4]
        );
    }
}
