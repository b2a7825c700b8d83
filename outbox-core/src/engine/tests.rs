//! Engine logic against the in-memory store and the scripted sink.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::config::{OnDead, Retention};
use crate::error::{Error, ErrorKind};
use crate::memory::{MemoryStore, Script, ScriptedSink};
use crate::model::{NewEvent, OutboxEvent, Outcome};
use crate::sink::{whole_call_failure, SinkCapabilities};

fn fast_config() -> RelayConfig {
    RelayConfig {
        batch_size: 50,
        max_attempts: 4,
        backoff_initial: Duration::from_millis(40),
        backoff_max: Duration::from_millis(200),
        poll_interval_min: Duration::from_millis(1),
        poll_interval_max: Duration::from_millis(10),
        rebalance_interval: Duration::from_millis(20),
        status_interval: Duration::from_millis(50),
        purge_interval: Duration::from_millis(20),
        shutdown_grace: Duration::from_secs(5),
        ..RelayConfig::default()
    }
}

/// [`fast_config`] with every retry waiting `backoff`.
fn fixed_backoff(backoff: Duration) -> RelayConfig {
    RelayConfig {
        backoff_initial: backoff,
        backoff_max: backoff,
        ..fast_config()
    }
}

/// `per_aggregate` events for each of `aggregates` aggregates, interleaved like concurrent writers.
async fn write(store: &MemoryStore, aggregates: usize, per_aggregate: usize) -> Vec<i64> {
    let mut events = Vec::new();
    for n in 0..per_aggregate {
        for a in 0..aggregates {
            events.push(NewEvent::new(
                "order",
                format!("agg-{a}"),
                "OrderChanged",
                serde_json::json!({ "aggregate": a, "n": n }),
            ));
        }
    }
    store.insert(&events).await.unwrap()
}

/// A relay running in a task of its own.
struct Running {
    trigger: ShutdownTrigger,
    handle: RelayHandle,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Running {
    /// Shut it down and wait until it has stopped cleanly; its handle still reads the
    /// figures.
    async fn stop(self) -> RelayHandle {
        self.trigger.trigger();
        self.task.await.unwrap().unwrap();
        self.handle
    }
}

fn start(store: &MemoryStore, sink: &ScriptedSink, config: RelayConfig) -> Running {
    let relay = Relay::new(Arc::new(store.clone()), Arc::new(sink.clone()), config).unwrap();
    let handle = relay.handle();
    let (trigger, shutdown) = Shutdown::channel();
    let task = tokio::spawn(relay.run(shutdown));
    Running {
        trigger,
        handle,
        task,
    }
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Wait until no row is left pending (each is published or dead).
async fn drained(store: &MemoryStore, timeout: Duration) {
    wait_until("nothing pending", timeout, || pending(store) == 0).await;
}

fn pending(store: &MemoryStore) -> usize {
    store
        .rows()
        .iter()
        .filter(|r| !r.published && !r.dead)
        .count()
}

/// Per aggregate, the ids of first deliveries must increase.
fn assert_first_occurrences_in_order(delivered: &[OutboxEvent]) {
    let mut seen = std::collections::HashSet::new();
    let mut last: HashMap<&str, i64> = HashMap::new();
    for e in delivered {
        if !seen.insert(e.id) {
            continue;
        }
        if let Some(prev) = last.insert(e.aggregate_id.as_str(), e.id) {
            assert!(
                prev < e.id,
                "aggregate {} got event {} after {}",
                e.aggregate_id,
                e.id,
                prev
            );
        }
    }
}

/// How many deliveries were of aggregates other than `aggregate`.
fn delivered_outside(sink: &ScriptedSink, aggregate: &str) -> usize {
    sink.delivered()
        .iter()
        .filter(|e| e.aggregate_id != aggregate)
        .count()
}

fn event_id_of(store: &MemoryStore, id: i64) -> uuid::Uuid {
    store.row(id).unwrap().event.event_id
}

#[tokio::test]
async fn failing_event_in_the_middle_keeps_per_aggregate_order() {
    let store = MemoryStore::new(8);
    let ids = write(&store, 10, 10).await; // 100 events, ids in write order
    let sink = ScriptedSink::new();
    // The 5th event of agg-3 fails twice before it goes through.
    let victim = ids[4 * 10 + 3];
    let victim_event_id = event_id_of(&store, victim);
    sink.script(victim_event_id, Script::RetryTimes(2));

    let relay = start(&store, &sink, fast_config());
    drained(&store, Duration::from_secs(10)).await;
    relay.stop().await;

    let delivered = sink.delivered();
    assert_eq!(delivered.len(), 100, "each event delivered once");
    assert_first_occurrences_in_order(&delivered);
    assert_eq!(sink.attempts(victim_event_id), 3);
    // The victim's later siblings went out after it; other aggregates did not wait for it.
    let pos = |id: i64| delivered.iter().position(|e| e.id == id).unwrap();
    let victim_pos = pos(victim);
    for n in 5..10 {
        assert!(pos(ids[n * 10 + 3]) > victim_pos);
    }
    let others_after_victim_failed = delivered[..victim_pos]
        .iter()
        .filter(|e| e.aggregate_id != "agg-3" && e.id > victim)
        .count();
    assert!(
        others_after_victim_failed > 0,
        "other aggregates kept flowing during the retry"
    );
}

#[tokio::test]
async fn retry_backoff_holds_back_only_its_aggregate() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 5, 4).await;
    let sink = ScriptedSink::new();
    let first_of_agg0 = ids[0];
    sink.script(event_id_of(&store, first_of_agg0), Script::RetryTimes(1));
    let config = fixed_backoff(Duration::from_millis(400));
    let relay = start(&store, &sink, config);

    // Everyone else is delivered while agg-0 waits for its backoff (at least 200 ms).
    wait_until("other aggregates delivered", Duration::from_secs(5), || {
        delivered_outside(&sink, "agg-0") == 16
    })
    .await;
    let row = store.row(first_of_agg0).unwrap();
    assert_eq!(row.event.attempts, 1);
    assert!(row
        .last_error
        .as_deref()
        .unwrap()
        .contains("scripted retry"));
    assert!(
        sink.delivered().iter().all(|e| e.aggregate_id != "agg-0"),
        "agg-0 is held back while its first event waits"
    );
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    assert_first_occurrences_in_order(&sink.delivered());
    let agg0: Vec<i64> = sink
        .delivered()
        .iter()
        .filter(|e| e.aggregate_id == "agg-0")
        .map(|e| e.id)
        .collect();
    assert_eq!(agg0, vec![ids[0], ids[5], ids[10], ids[15]]);
}

#[tokio::test]
async fn dead_after_max_attempts_then_aggregate_flows_on_by_default() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 3, 3).await;
    let sink = ScriptedSink::new();
    let poison = ids[3]; // second event of agg-0
    sink.script(event_id_of(&store, poison), Script::AlwaysRetry);
    let relay = start(&store, &sink, fast_config());
    drained(&store, Duration::from_secs(10)).await;
    let handle = relay.stop().await;

    let row = store.row(poison).unwrap();
    assert!(row.dead, "parked as dead");
    assert_eq!(row.event.attempts, 4, "max_attempts attempts were made");
    assert_eq!(sink.attempts(row.event.event_id), 4);
    assert!(row.last_error.unwrap().contains("gave up after 4 attempts"));
    assert_eq!(handle.dead(), 1);
    // on_dead = skip: the third event of agg-0 was delivered after all.
    assert!(sink.delivered().iter().any(|e| e.id == ids[6]));
    assert_eq!(sink.delivered().len(), 8);
}

#[tokio::test]
async fn dead_event_holds_its_aggregate_with_on_dead_hold() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 3, 3).await;
    let sink = ScriptedSink::new();
    let poison = ids[3];
    sink.script(event_id_of(&store, poison), Script::Reject);
    let config = RelayConfig {
        on_dead: OnDead::Hold,
        ..fast_config()
    };
    let relay = start(&store, &sink, config);
    wait_until("others delivered", Duration::from_secs(5), || {
        sink.delivered().len() == 7
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.stop().await;

    let row = store.row(poison).unwrap();
    assert!(row.dead);
    assert_eq!(row.event.attempts, 1, "a rejection is not retried");
    assert_eq!(sink.attempts(row.event.event_id), 1);
    assert!(
        !sink.delivered().iter().any(|e| e.id == ids[6]),
        "held behind the dead event"
    );
    assert!(!store.row(ids[6]).unwrap().dead);
}

#[tokio::test]
async fn oversized_payload_is_dead_without_a_broker_call() {
    let store = MemoryStore::new(2);
    let big = "x".repeat(2000);
    store
        .insert(&[
            NewEvent::new("order", "a", "Big", serde_json::json!({ "blob": big })),
            NewEvent::new("order", "b", "Small", serde_json::json!({})),
        ])
        .await
        .unwrap();
    let sink = ScriptedSink::new().with_capabilities(SinkCapabilities {
        max_batch_len: 10,
        max_payload_bytes: Some(1000),
        ordered_per_key: false,
    });
    let relay = start(&store, &sink, fast_config());
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    let rows = store.rows();
    let big_row = rows.iter().find(|r| r.event.event_type == "Big").unwrap();
    assert!(big_row.dead);
    assert!(big_row
        .last_error
        .as_deref()
        .unwrap()
        .contains("larger than"));
    assert_eq!(sink.attempts(big_row.event.event_id), 0);
    assert_eq!(sink.delivered().len(), 1);
}

#[tokio::test]
async fn broker_outage_dead_letters_nothing_and_recovers() {
    let store = MemoryStore::new(4);
    write(&store, 10, 5).await;
    let sink = ScriptedSink::new();
    sink.set_down(true);
    let relay = start(&store, &sink, fast_config());
    wait_until("several failed calls", Duration::from_secs(5), || {
        sink.calls() >= 3
    })
    .await;
    assert!(
        !relay.handle.is_ready(),
        "not ready while the broker is down"
    );
    assert!(relay.handle.last_error().unwrap().contains("down"));
    assert!(store
        .rows()
        .iter()
        .all(|r| r.event.attempts == 0 && !r.dead));
    sink.set_down(false);
    drained(&store, Duration::from_secs(10)).await;
    assert!(relay.handle.is_ready());
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 50);
    assert_first_occurrences_in_order(&sink.delivered());
}

/// A binary that reads a pipeline's settings from its own tables has the store's and the
/// sink's errors name them so, in the log, in what the handle shows and in the rows' last
/// error.
#[tokio::test]
async fn errors_pass_through_rekey_before_they_are_shown() {
    let store = MemoryStore::unmigrated(4);
    let sink = ScriptedSink::new();
    let relay = Relay::new(
        Arc::new(store.clone()),
        Arc::new(sink.clone()),
        fast_config(),
    )
    .unwrap()
    .rekey_errors(|e| Error::new(e.kind(), format!("{} [rekeyed]", e.message())));
    let handle = relay.handle();
    let (trigger, shutdown) = Shutdown::channel();
    let task = tokio::spawn(relay.run(shutdown));
    // No table yet: the session cannot open, a store error.
    wait_until("a store error", Duration::from_secs(5), || {
        handle.last_error().is_some()
    })
    .await;
    let last = handle.last_error().unwrap();
    assert!(last.ends_with(" [rekeyed]"), "{last}");
    // The table, and an event the sink refuses (scripted before it is written): its row's
    // last error.
    store.migrate().await.unwrap();
    let refused = uuid::Uuid::now_v7();
    sink.script(refused, Script::Reject);
    let mut event = NewEvent::new("order", "agg-0", "OrderChanged", serde_json::json!({}));
    event.event_id = Some(refused);
    let ids = store.insert(&[event]).await.unwrap();
    wait_until("the event parked", Duration::from_secs(5), || {
        store.row(ids[0]).is_some_and(|r| r.dead)
    })
    .await;
    let last = store.row(ids[0]).unwrap().last_error.unwrap_or_default();
    assert!(last.ends_with(" [rekeyed]"), "{last}");
    // A batch for the broker that is down: a sink error of the whole call.
    sink.set_down(true);
    write(&store, 1, 1).await;
    wait_until("the sink's error shown", Duration::from_secs(5), || {
        handle
            .last_error()
            .is_some_and(|e| e.contains("down") && e.ends_with(" [rekeyed]"))
    })
    .await;
    trigger.trigger();
    task.await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_finishes_the_in_flight_batch() {
    let store = MemoryStore::new(2);
    write(&store, 5, 40).await; // 200 events, batches of 50
    let sink = ScriptedSink::new().with_delay(Duration::from_millis(300));
    let relay = start(&store, &sink, fast_config());
    wait_until("a publish in flight", Duration::from_secs(5), || {
        sink.calls() >= 1
    })
    .await;
    let handle = relay.stop().await;
    let delivered = sink.delivered().len();
    assert!(delivered >= 5, "the in-flight call completed");
    assert!(delivered < 200, "no new batches after shutdown");
    // Everything the broker acknowledged was marked before exit; nothing else was.
    assert_eq!(pending(&store), 200 - delivered);
    assert_eq!(handle.published() as usize, delivered);
    assert!(!handle.is_alive());
    assert!(store.owners().is_empty(), "locks released");
}

#[tokio::test]
async fn shutdown_grace_bounds_a_hung_broker() {
    let store = MemoryStore::new(2);
    write(&store, 2, 2).await;
    let sink = ScriptedSink::new().with_delay(Duration::from_secs(30));
    let config = RelayConfig {
        shutdown_grace: Duration::from_millis(200),
        ..fast_config()
    };
    let relay = start(&store, &sink, config);
    wait_until("a publish in flight", Duration::from_secs(5), || {
        sink.calls() >= 1
    })
    .await;
    let t = Instant::now();
    relay.stop().await;
    assert!(t.elapsed() < Duration::from_secs(3));
    assert_eq!(pending(&store), 4, "unacknowledged events stay pending");
}

#[tokio::test]
async fn three_relays_share_shards_and_keep_order() {
    let store = MemoryStore::new(16);
    let sink = ScriptedSink::new().with_delay(Duration::from_millis(2));
    let relays: Vec<_> = (0..3)
        .map(|i| {
            start(
                &store,
                &sink,
                RelayConfig {
                    relay_id: Some(format!("relay-{i}")),
                    ..fast_config()
                },
            )
        })
        .collect();
    // Writers keep writing while the relays run.
    for _ in 0..10 {
        write(&store, 30, 5).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until("spread", Duration::from_secs(5), || {
        let owners = store.owners();
        let mut per: BTreeMap<String, usize> = BTreeMap::new();
        for o in owners.values() {
            *per.entry(o.clone()).or_default() += 1;
        }
        owners.len() == 16 && per.len() == 3 && per.values().all(|n| *n <= 6)
    })
    .await;
    drained(&store, Duration::from_secs(10)).await;
    for relay in &relays {
        relay.trigger.trigger();
    }
    for relay in relays {
        relay.task.await.unwrap().unwrap();
    }
    let delivered = sink.delivered();
    let unique: std::collections::HashSet<i64> = delivered.iter().map(|e| e.id).collect();
    assert_eq!(unique.len(), 1500);
    assert_first_occurrences_in_order(&delivered);
}

#[tokio::test]
async fn lost_session_is_reopened_and_nothing_is_lost() {
    let store = MemoryStore::new(4);
    write(&store, 10, 10).await;
    let sink = ScriptedSink::new().with_delay(Duration::from_millis(5));
    let relay = start(&store, &sink, fast_config());
    wait_until("some delivered", Duration::from_secs(5), || {
        !sink.delivered().is_empty()
    })
    .await;
    store.break_sessions();
    drained(&store, Duration::from_secs(10)).await;
    assert!(relay.handle.shards_owned() > 0, "took its shards back");
    relay.stop().await;
    let delivered = sink.delivered();
    let unique: std::collections::HashSet<i64> = delivered.iter().map(|e| e.id).collect();
    assert_eq!(unique.len(), 100);
    assert_first_occurrences_in_order(&delivered);
}

/// Two relays, and only relay-0's broker fails (a partition between that relay and the
/// broker): once its calls have failed for `hand_over_after`, relay-0 gives its shards back and
/// relay-1 publishes everything; relay-0 takes shards again once its broker answers a check.
/// With `hand_over_after = 0` it keeps them, and their events wait.
#[tokio::test]
async fn a_relay_whose_broker_fails_hands_its_shards_over_until_it_answers() {
    let store = MemoryStore::new(8);
    let (cut_off, reachable) = (ScriptedSink::new(), ScriptedSink::new());
    cut_off.set_down(true);
    let config = |i: usize, hand_over_after: Duration| RelayConfig {
        relay_id: Some(format!("relay-{i}")),
        hand_over_after,
        ..fast_config()
    };

    // Kept: relay-0's shards stay relay-0's, their events pending.
    let keeping = start(&store, &cut_off, config(0, Duration::ZERO));
    let other = start(&store, &reachable, config(1, Duration::ZERO));
    wait_until("the shards shared", Duration::from_secs(5), || {
        keeping.handle.shards_owned() == 4 && other.handle.shards_owned() == 4
    })
    .await;
    write(&store, 40, 2).await;
    wait_until("several failed calls", Duration::from_secs(5), || {
        cut_off.calls() >= 5
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(keeping.handle.shards_owned(), 4);
    assert!(pending(&store) > 0);
    keeping.stop().await;
    other.stop().await;

    let failing = start(&store, &cut_off, config(0, Duration::from_millis(200)));
    let other = start(&store, &reachable, config(1, Duration::from_millis(200)));
    write(&store, 40, 2).await;
    drained(&store, Duration::from_secs(10)).await;
    assert_eq!(failing.handle.shards_owned(), 0);
    assert_eq!(other.handle.shards_owned(), 8);
    assert!(failing.handle.last_error().unwrap().contains("down"));

    assert!(!failing.handle.is_ready());
    cut_off.set_down(false);
    wait_until("relay-0 sharing again", Duration::from_secs(10), || {
        failing.handle.shards_owned() == 4 && other.handle.shards_owned() == 4
    })
    .await;
    // Ready with nothing left to publish: the check that let it back in is the proof.
    assert!(
        failing.handle.is_ready(),
        "{:?}",
        failing.handle.last_error()
    );
    write(&store, 40, 2).await;
    drained(&store, Duration::from_secs(10)).await;
    failing.stop().await;
    other.stop().await;
    assert!(!cut_off.delivered().is_empty(), "relay-0 published again");
    let mut delivered = reachable.delivered();
    delivered.extend(cut_off.delivered());
    let unique: std::collections::HashSet<i64> = delivered.iter().map(|e| e.id).collect();
    assert_eq!(unique.len(), 240);
}

/// A session that opens and claims but cannot mark (a read-only server, a privilege revoked):
/// its rows are published again at each new session, so new sessions come after a growing
/// backoff, not at once (which sent the same events thousands of times a second), and the
/// rows are marked as soon as marks work again.
#[tokio::test]
async fn marks_that_keep_failing_back_off_instead_of_republishing_at_once() {
    let store = MemoryStore::new(4);
    write(&store, 10, 1).await;
    store.refuse_marks(true);
    let sink = ScriptedSink::new();
    let relay = start(&store, &sink, fast_config());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rounds = sink.delivered().len() / 10;
    println!("marks refused for 2 s: the 10 events were published {rounds} times");
    assert!(
        (2..=8).contains(&rounds),
        "{rounds} publishes of the same 10 events in 2 s"
    );
    store.refuse_marks(false);
    drained(&store, Duration::from_secs(10)).await;
    relay.stop().await;
}

/// With `retention = keep`, rows are marked, kept, then purged. With `purge_panics`, purges
/// panic (a bug in a store) until every row is published and several rounds have panicked:
/// each is one failed round, the relay stays ready, and the loop purges once the store works
/// again. Before, the first panic ended the purge loop for good, and published rows piled up
/// while the relay said it was fine.
async fn keep_retention_marks_then_purges_with(purge_panics: bool) {
    let store = MemoryStore::new(2);
    write(&store, 3, 3).await;
    store.panic_purges(purge_panics);
    let sink = ScriptedSink::new();
    let config = RelayConfig {
        retention: Retention::Keep(Duration::from_millis(100)),
        ..fast_config()
    };
    let relay = start(&store, &sink, config);
    wait_until("published and kept", Duration::from_secs(5), || {
        let rows = store.rows();
        !rows.is_empty() && rows.iter().all(|r| r.published)
    })
    .await;
    if purge_panics {
        // Purge rounds (every 20 ms) panic meanwhile; the rows are past their 100 ms.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(store.rows().len(), 9);
        assert!(relay.handle.is_ready());
        store.panic_purges(false);
    }
    wait_until("purged", Duration::from_secs(5), || store.rows().is_empty()).await;
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 9);
}

#[tokio::test]
async fn keep_retention_marks_then_purges() {
    keep_retention_marks_then_purges_with(false).await;
}

#[tokio::test]
async fn a_purge_that_panics_fails_one_round_and_the_loop_goes_on() {
    keep_retention_marks_then_purges_with(true).await;
}

#[tokio::test]
async fn turning_retention_off_deletes_the_rows_an_earlier_retention_kept() {
    let store = MemoryStore::new(2);
    write(&store, 3, 3).await;
    let sink = ScriptedSink::new();
    let keep_a_day = RelayConfig {
        retention: Retention::Keep(Duration::from_secs(86_400)),
        ..fast_config()
    };
    let relay = start(&store, &sink, keep_a_day);
    wait_until("published and kept", Duration::from_secs(5), || {
        let rows = store.rows();
        rows.len() == 9 && rows.iter().all(|r| r.published)
    })
    .await;
    relay.stop().await;

    // The operator sets `retention = "delete"`: the day-old rule no longer holds the rows.
    let relay = start(&store, &sink, fast_config());
    wait_until("kept rows deleted", Duration::from_secs(5), || {
        store.rows().is_empty()
    })
    .await;
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 9, "nothing published again");
}

#[tokio::test]
async fn ordered_sinks_get_whole_batches_and_unordered_ones_get_waves() {
    let store = MemoryStore::new(1);
    write(&store, 1, 20).await; // one hot aggregate
    let unordered = ScriptedSink::new();
    let relay = start(&store, &unordered, fast_config());
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    assert_eq!(unordered.calls(), 20, "one event of the aggregate per call");

    let store = MemoryStore::new(1);
    write(&store, 1, 20).await;
    let ordered = ScriptedSink::new().with_capabilities(SinkCapabilities {
        max_batch_len: 100,
        max_payload_bytes: None,
        ordered_per_key: true,
    });
    let relay = start(&store, &ordered, fast_config());
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    // The first claim measures the payloads with FIRST_CLAIM rows, the second takes the rest.
    assert_eq!(ordered.calls(), 2, "each claimed batch whole in one call");
    assert_first_occurrences_in_order(&ordered.delivered());
}

/// Claims aim at `relay.batch_bytes` of payload: the first asks for FIRST_CLAIM rows, each
/// later one for as many as the budget holds at the previous claim's mean payload size.
#[tokio::test]
async fn large_payloads_are_claimed_a_few_at_a_time() {
    let store = MemoryStore::new(1);
    let blob = "x".repeat(100_000);
    let events: Vec<NewEvent> = (0..60)
        .map(|i| {
            let payload = serde_json::json!({ "blob": blob });
            NewEvent::new("doc", format!("d{i}"), "Stored", payload)
        })
        .collect();
    store.insert(&events).await.unwrap();
    let ordered = ScriptedSink::new().with_capabilities(SinkCapabilities {
        max_batch_len: 100,
        max_payload_bytes: None,
        ordered_per_key: true,
    });
    let config = RelayConfig {
        batch_bytes: 300_000,
        ..fast_config()
    };
    let relay = start(&store, &ordered, config);
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    assert_eq!(ordered.delivered().len(), 60);
    // 16 rows, then 2 at a time (300,000 bytes hold two payloads of 100,011).
    assert_eq!(ordered.calls(), 1 + 44 / 2);
}

#[test]
fn the_next_claim_holds_batch_bytes_at_the_mean_payload_size() {
    let config = RelayConfig {
        batch_size: 500,
        batch_bytes: 1_000,
        ..RelayConfig::default()
    };
    let event = |bytes: usize| {
        let mut e = OutboxEvent::new(1, "doc", "d1", "Stored", serde_json::json!({}));
        e.payload = vec![b'x'; bytes];
        e
    };
    let limit = |sizes: &[usize]| {
        let batch: Vec<OutboxEvent> = sizes.iter().map(|&n| event(n)).collect();
        worker::next_claim_limit(&config, &batch, 7)
    };
    assert_eq!(limit(&[100, 100]), 10);
    assert_eq!(limit(&[10, 390]), 5, "the mean, not the largest");
    assert_eq!(limit(&[5_000]), 1, "at least one row, however large");
    assert_eq!(limit(&[0, 0]), 500, "at most batch_size");
    assert_eq!(limit(&[]), 7, "an empty claim keeps the limit");
}

#[test]
fn max_events_per_second_caps_claims_at_one_second_of_events() {
    let config = RelayConfig {
        batch_size: 500,
        batch_bytes: 1_000_000,
        max_events_per_second: Some(50),
        ..RelayConfig::default()
    };
    let batch = vec![OutboxEvent::new(
        1,
        "doc",
        "d1",
        "Stored",
        serde_json::json!({}),
    )];
    assert_eq!(worker::next_claim_limit(&config, &batch, 7), 50);
    assert_eq!(config.claim_cap(), 50);
    let unlimited = RelayConfig {
        max_events_per_second: None,
        ..config.clone()
    };
    assert_eq!(worker::next_claim_limit(&unlimited, &batch, 7), 500);
    let fast = RelayConfig {
        max_events_per_second: Some(10_000),
        ..config
    };
    assert_eq!(fast.claim_cap(), 500, "never above batch_size");
}

#[test]
fn the_pace_counts_the_time_publishing_took() {
    let config = RelayConfig {
        max_events_per_second: Some(100),
        ..RelayConfig::default()
    };
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut until = t0;
    // The first batch goes at once; the next may start half a second after it (50 at 100/s).
    assert_eq!(worker::pace(&config, &mut until, 50, t0), None);
    assert_eq!(until, t0 + ms(500));
    // Publishing took 100 ms: 400 ms left to wait.
    assert_eq!(
        worker::pace(&config, &mut until, 50, t0 + ms(100)),
        Some(ms(400))
    );
    assert_eq!(until, t0 + ms(1_000));
    // Publishing took longer than the pace: no wait, and no credit for the time lost.
    assert_eq!(worker::pace(&config, &mut until, 100, t0 + ms(3_000)), None);
    assert_eq!(until, t0 + ms(4_000));
    // Without the key nothing waits and nothing is counted.
    let mut untouched = t0;
    let unlimited = RelayConfig::default();
    assert_eq!(worker::pace(&unlimited, &mut untouched, 50, t0), None);
    assert_eq!(untouched, t0);
}

#[tokio::test]
async fn max_events_per_second_paces_a_backlog() {
    let store = MemoryStore::new(8);
    write(&store, 30, 10).await;
    let sink = ScriptedSink::new();
    let config = RelayConfig {
        batch_size: 500,
        max_events_per_second: Some(200),
        ..fast_config()
    };
    let started = Instant::now();
    let relay = start(&store, &sink, config);
    drained(&store, Duration::from_secs(10)).await;
    let took = started.elapsed();
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 300);
    // 16 rows first, then at most 200 a claim: 16 + 200 + 84, the third after 216 / 200 s.
    assert!(took >= Duration::from_millis(1_050), "drained in {took:?}");
    assert!(sink.calls() >= 3, "{} calls", sink.calls());
}

// --- When a call fails as a whole: the rule (`whole_call_failure`), then the engine. ---

fn failed(kind: ErrorKind) -> Outcome {
    Outcome::from_error(Error::new(kind, format!("{kind} failure")))
}

#[test]
fn whole_call_rule_unauthorized_or_config_fails_the_call_whatever_else() {
    // Rule 1: beside published events and per-event failures, first such error reported.
    let outcomes = [
        Outcome::Published,
        failed(ErrorKind::InvalidMessage),
        failed(ErrorKind::Unauthorized),
        failed(ErrorKind::Config),
    ];
    let e = whole_call_failure(&outcomes).expect("fails the call");
    assert_eq!(e.kind(), ErrorKind::Unauthorized);
    assert_eq!(e.message(), "unauthorized failure");
    // Reported as Retry or as Reject alike.
    let outcomes = [
        Outcome::Retry(Error::new(ErrorKind::Config, "bad setting").temporary()),
        Outcome::Published,
    ];
    assert_eq!(
        whole_call_failure(&outcomes).map(|e| e.kind()),
        Some(ErrorKind::Config)
    );
    // It wins over broker-side failures listed before it.
    let outcomes = [failed(ErrorKind::Timeout), failed(ErrorKind::Unauthorized)];
    assert_eq!(
        whole_call_failure(&outcomes).map(|e| e.kind()),
        Some(ErrorKind::Unauthorized)
    );
}

#[test]
fn whole_call_rule_every_event_failing_broker_side_fails_the_call() {
    // Rule 2: nothing published, every failure Connection / Timeout / Unavailable.
    let outcomes = [
        failed(ErrorKind::Timeout),
        failed(ErrorKind::Connection),
        failed(ErrorKind::Unavailable),
    ];
    let e = whole_call_failure(&outcomes).expect("fails the call");
    assert_eq!(
        e.kind(),
        ErrorKind::Timeout,
        "the first failure is reported"
    );
    assert!(e.is_retryable());
    for kind in [
        ErrorKind::Connection,
        ErrorKind::Timeout,
        ErrorKind::Unavailable,
    ] {
        assert_eq!(
            whole_call_failure(&[failed(kind)]).map(|e| e.kind()),
            Some(kind)
        );
    }
}

#[test]
fn whole_call_rule_otherwise_failures_stay_per_event() {
    // Rule 3: some event published, or a failure about its event, or no failure at all.
    let none = |outcomes: &[Outcome]| whole_call_failure(outcomes).is_none();
    assert!(none(&[]));
    assert!(none(&[Outcome::Published, Outcome::Published]));
    assert!(none(&[Outcome::Published, failed(ErrorKind::Unavailable)]));
    assert!(none(&[failed(ErrorKind::Connection), Outcome::Published]));
    assert!(none(&[
        failed(ErrorKind::Unavailable),
        failed(ErrorKind::InvalidMessage)
    ]));
    assert!(none(&[
        failed(ErrorKind::Timeout),
        failed(ErrorKind::Other)
    ]));
    for kind in [
        ErrorKind::MessageTooLarge,
        ErrorKind::InvalidMessage,
        ErrorKind::Unroutable,
        ErrorKind::Schema,
        ErrorKind::LeaseLost,
        ErrorKind::Other,
    ] {
        assert!(none(&[failed(kind), failed(kind)]), "{kind}");
    }
}

#[tokio::test]
async fn every_event_failing_with_connection_charges_no_attempt_and_dead_letters_nothing() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 4, 2).await;
    let sink = ScriptedSink::new();
    for &id in &ids {
        sink.script(
            event_id_of(&store, id),
            Script::FailTimes(u32::MAX, ErrorKind::Connection),
        );
    }
    // Were attempts charged, two failed calls would park every event.
    let config = RelayConfig {
        max_attempts: 2,
        ..fast_config()
    };
    let relay = start(&store, &sink, config);
    wait_until("several failed calls", Duration::from_secs(5), || {
        sink.calls() >= 4
    })
    .await;
    assert!(
        !relay.handle.is_ready(),
        "not ready while every event fails so"
    );
    assert!(relay
        .handle
        .last_error()
        .unwrap()
        .contains("scripted connection failure"));
    assert!(store
        .rows()
        .iter()
        .all(|r| r.event.attempts == 0 && !r.dead && r.last_error.is_none()));
    assert_eq!(relay.handle.dead(), 0);

    for &id in &ids {
        sink.script(event_id_of(&store, id), Script::RetryTimes(0));
    }
    drained(&store, Duration::from_secs(10)).await;
    assert!(relay.handle.is_ready());
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 8);
    assert_first_occurrences_in_order(&sink.delivered());
}

#[tokio::test]
async fn one_unauthorized_event_fails_the_call_and_keeps_what_was_published() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 3, 1).await; // one call: agg-0, agg-1, agg-2
    let sink = ScriptedSink::new();
    let refused = ids[1];
    sink.script(
        event_id_of(&store, refused),
        Script::FailTimes(u32::MAX, ErrorKind::Unauthorized),
    );
    let relay = start(&store, &sink, fast_config());
    wait_until("the others published", Duration::from_secs(5), || {
        store.row(ids[0]).is_none() && store.row(ids[2]).is_none()
    })
    .await;
    wait_until("a second failed call", Duration::from_secs(5), || {
        sink.attempts(event_id_of(&store, refused)) >= 2
    })
    .await;
    // Unauthorized is not retryable, yet nothing is parked and no attempt is charged.
    let row = store.row(refused).unwrap();
    assert!(!row.dead);
    assert_eq!(row.event.attempts, 0);
    assert!(!relay.handle.is_ready());
    assert!(relay
        .handle
        .last_error()
        .unwrap()
        .contains("scripted unauthorized failure"));
    assert_eq!(
        sink.delivered().len(),
        2,
        "published once each, not sent again"
    );

    sink.script(event_id_of(&store, refused), Script::RetryTimes(0));
    drained(&store, Duration::from_secs(10)).await;
    let handle = relay.stop().await;
    assert_eq!(sink.delivered().len(), 3);
    assert_eq!(handle.dead(), 0);
}

#[tokio::test]
async fn a_partial_unavailable_failure_retries_only_that_event() {
    let store = MemoryStore::new(4);
    let ids = write(&store, 5, 2).await;
    let sink = ScriptedSink::new();
    let victim = ids[2]; // first event of agg-2, in a call with four that go through
    sink.script(
        event_id_of(&store, victim),
        Script::FailTimes(1, ErrorKind::Unavailable),
    );
    let config = fixed_backoff(Duration::from_millis(400));
    let relay = start(&store, &sink, config);
    wait_until("other aggregates delivered", Duration::from_secs(5), || {
        delivered_outside(&sink, "agg-2") == 8
    })
    .await;
    wait_until("the failure recorded", Duration::from_secs(5), || {
        store.row(victim).is_some_and(|r| r.last_error.is_some())
    })
    .await;
    let row = store.row(victim).unwrap();
    assert_eq!(row.event.attempts, 1, "the event is charged its attempt");
    assert!(!row.dead);
    assert!(row
        .last_error
        .as_deref()
        .unwrap()
        .contains("scripted unavailable failure 1/1"));
    assert!(relay.handle.is_ready(), "not a failure of the whole call");
    drained(&store, Duration::from_secs(5)).await;
    relay.stop().await;
    assert_eq!(sink.delivered().len(), 10);
    assert_first_occurrences_in_order(&sink.delivered());
}

/// A panic elsewhere in the relay's loop (here in a store's claim) stops the relay with an
/// error that says so, instead of unwinding through its caller: the handle is no longer alive
/// (`/healthz` fails) and the session is dropped, so another relay takes every shard.
#[tokio::test]
async fn a_panic_in_the_loop_stops_the_relay_with_an_error_and_frees_its_shards() {
    let store = MemoryStore::new(4);
    write(&store, 5, 4).await;
    store.panic_claims(true);
    let sink = ScriptedSink::new();
    let running = start(&store, &sink, fast_config());
    let stopped = running.task.await.expect("the relay's task returns");
    let e = stopped.expect_err("the relay stops with an error");
    assert_eq!(
        e.message(),
        "the relay panicked and stopped: scripted panic in claim (a bug; its session was \
         dropped, so other relays take its shards)"
    );
    assert!(!running.handle.is_alive());
    assert!(store.owners().is_empty(), "{:?}", store.owners());

    store.panic_claims(false);
    let other = start(&store, &sink, fast_config());
    drained(&store, Duration::from_secs(10)).await;
    other.stop().await;
    assert_first_occurrences_in_order(&sink.delivered());
}

/// A sink whose calls carrying one event misbehave as `script` says, `times` times (a bug in a
/// third party's sink, set off by that event), then work: each such call fails as a whole,
/// like an outage. The relay keeps running and says why it is not ready (`said`), dead-letters
/// nothing, and publishes everything, in order, once the sink answers.
async fn a_misbehaving_call_fails_as_a_whole(
    script: Script,
    times: u32,
    config: RelayConfig,
    said: impl Fn(&str) -> bool,
) {
    let store = MemoryStore::new(4);
    let ids = write(&store, 5, 4).await;
    let sink = ScriptedSink::new();
    let event = event_id_of(&store, ids[7]);
    sink.script(event, script);
    let running = start(&store, &sink, config);
    let handle = running.handle.clone();
    wait_until("the failed call reported", Duration::from_secs(5), || {
        let reported = handle.last_error().is_some_and(|e| said(&e));
        reported && !handle.is_ready() && handle.is_alive()
    })
    .await;
    drained(&store, Duration::from_secs(10)).await;
    assert!(handle.is_alive());
    let handle = running.stop().await;
    assert_eq!(sink.attempts(event), times + 1);
    assert_eq!(handle.dead(), 0);
    assert!(store.rows().iter().all(|r| r.published && !r.dead));
    assert_first_occurrences_in_order(&sink.delivered());
}

/// A sink that panics three times on one event.
#[tokio::test]
async fn a_panicking_sink_fails_its_call_as_a_whole_and_the_relay_goes_on() {
    let config = fixed_backoff(Duration::from_millis(100));
    a_misbehaving_call_fails_as_a_whole(Script::PanicTimes(3), 3, config, |e| {
        e.contains("the scripted sink panicked in publish: scripted panic")
            && e.contains("its events stay pending")
    })
    .await;
}

/// A sink call that never returns, twice (a sink without timeouts of its own), is given up
/// after `relay.publish_timeout`. Before, the relay waited on the call for good, its shards
/// held and `/readyz` still 200.
#[tokio::test]
async fn a_sink_call_that_never_returns_is_given_up_after_the_publish_timeout() {
    let config = RelayConfig {
        publish_timeout: Duration::from_millis(300),
        ..fixed_backoff(Duration::from_millis(100))
    };
    a_misbehaving_call_fails_as_a_whole(Script::HangTimes(2), 2, config, |e| {
        e == "the scripted sink did not answer publish within 300ms (relay.publish_timeout): \
              the call failed as a whole; its events stay pending and are sent again"
    })
    .await;
}

#[tokio::test]
async fn a_paused_table_is_not_relayed_until_resumed_and_keeps_its_order() {
    let store = MemoryStore::new(8);
    write(&store, 10, 5).await;
    let paused = store.pause("ops@host", "consumer fix").await.unwrap();
    assert!(matches!(paused, crate::Paused::Now(_)), "{paused:?}");
    let sink = ScriptedSink::new();
    // Started paused: not one claim, though every shard is taken.
    let relay = start(&store, &sink, fast_config());
    wait_until("shards taken", Duration::from_secs(5), || {
        relay.handle.shards_owned() == 8
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(sink.calls(), 0, "a paused table is published from");
    assert_eq!(pending(&store), 50);
    assert!(relay.handle.is_ready(), "a paused relay is healthy");

    // Resumed: within a rebalance interval (20 ms here) it relays all, in order.
    store.resume().await.unwrap().expect("it was paused");
    drained(&store, Duration::from_secs(5)).await;
    assert_eq!(sink.delivered().len(), 50);
    assert_first_occurrences_in_order(&sink.delivered());

    // Paused while running: what was written after is left alone.
    store.pause("ops@host", "").await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    write(&store, 10, 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pending(&store), 20, "published while paused");
    assert_eq!(sink.delivered().len(), 50);
    store.resume().await.unwrap();
    drained(&store, Duration::from_secs(5)).await;
    let handle = relay.stop().await;
    assert_eq!(handle.published(), 70);
    assert_first_occurrences_in_order(&sink.delivered());
}
