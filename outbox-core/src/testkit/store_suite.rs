//! Store conformance suite: every [`Store`] implementation runs these cases against a real
//! database.
//!
//! Implement [`StoreFactory`] (a store on a new, not yet migrated table per call) and generate
//! one test per case with [`store_suite!`](crate::store_suite):
//!
//! ```text
//! struct Factory;
//!
//! #[async_trait::async_trait]
//! impl outboxkit_core::testkit::store_suite::StoreFactory for Factory {
//!     async fn fresh_store(&self) -> Box<dyn outboxkit_core::Store> {
//!         Box::new(MyStore::connect(/* a new table */).await.unwrap())
//!     }
//! }
//!
//! outboxkit_core::store_suite!(Factory);
//! ```
//!
//! Each case takes a fresh store, so cases can run in parallel. The factory must give stores
//! with at least 4 shards.
//!
//! A store on a server (SQL or other) also runs the live cases: what only a real server shows —
//! writers' transactions, killed sessions, statement limits, concurrent migrations, plain-SQL
//! writers, connection and configuration errors. Implement [`LiveHarness`] too (the store's own
//! types and the few steps only its SQL can do) and pass `live`:
//!
//! ```text
//! outboxkit_core::store_suite!(Factory, live);
//! ```
//!
//! A store with a consumer-side inbox runs the inbox cases with [`inbox_suite!`](crate::inbox_suite)
//! and an [`inbox::InboxHarness`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::DerefMut;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use crate::error::{Error, ErrorKind, Result};
use crate::model::{NewEvent, OutboxEvent, Payload, PayloadType};
use crate::store::{ClaimRequest, Failure, MarkMode, ShardSession, Store};

/// Gives the suite its stores.
#[async_trait]
pub trait StoreFactory: Send + Sync {
    /// A store on a new table that is NOT yet migrated (each call: another table).
    async fn fresh_store(&self) -> Box<dyn Store>;

    /// Called at the end of each passing case: drop the tables this factory created.
    async fn cleanup(&self) {}
}

/// Generate one `#[tokio::test]` per case of the store suite, each calling
/// `outboxkit_core::testkit::store_suite::<case>(&factory)` with the factory `$factory` (an
/// expression evaluated once per test). The calling crate needs `tokio` (macros, rt).
///
/// `store_suite!(factory, live)` also generates the live cases, for a factory that implements
/// [`LiveHarness`].
#[macro_export]
macro_rules! store_suite {
    ($factory:expr, live) => {
        $crate::store_suite!($factory);
        $crate::store_suite!(@cases ($factory)
            rolled_back_and_uncommitted_rows_are_never_claimed,
            enqueue_commits_and_rolls_back_with_the_business_row,
            a_killed_session_loses_its_lease_and_its_shards_move,
            a_statement_timeout_is_a_timeout_and_keeps_the_session,
            concurrent_migrations_all_succeed,
            the_table_has_the_documented_shape,
            rows_written_with_plain_sql_are_claimed_with_their_defaults,
            migrate_refuses_a_table_it_did_not_create,
            migrate_creates_again_a_table_dropped_by_hand,
            an_unreachable_server_is_a_connection_error_naming_the_host,
            an_unknown_database_is_a_config_error_naming_it,
            a_bad_configuration_fails_before_connecting,
            describe_and_debug_hide_the_password,
            text_and_binary_tables_keep_payloads_byte_for_byte,
            a_text_table_refuses_bytes_that_are_not_utf8,
            a_configured_payload_type_must_match_the_table,
            a_table_migrated_before_pauses_existed_gets_its_pause_table_from_migrate,
        );
    };
    ($factory:expr) => {
        $crate::store_suite!(@cases ($factory)
            migrate_is_idempotent_and_check_requires_it,
            insert_and_claim_round_trip_every_field,
            claim_without_owned_shards_returns_nothing,
            shard_locks_are_exclusive_and_visible,
            claim_honours_limit_and_exclude_ids,
            mark_published_delete_and_keep_then_purge,
            retry_holds_the_row_and_its_aggregate_only,
            dead_rows_skip_or_hold_their_aggregate,
            dead_rows_are_listed_retried_and_discarded,
            events_are_found_in_every_state,
            kept_events_are_replayed,
            a_replay_of_many_events_sends_every_one,
            a_replay_under_a_running_relay_sends_each_event_once,
            status_reports_the_backlog,
            shard_owners_name_the_relay,
            a_pause_holds_until_resumed_and_is_the_tables_own,
            aggregates_keep_one_shard_and_spread,
        );
    };
    (@cases ($factory:expr) $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                let factory = $factory;
                $crate::testkit::store_suite::$case(&factory).await;
            }
        )+
    };
}

/// Unwrap a store result, panicking with the error's whole message.
#[track_caller]
fn ok<T>(result: Result<T>, what: &str) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("{what}: {e} ({e:?})"),
    }
}

/// A fresh store, migrated.
pub async fn migrated_store(factory: &dyn StoreFactory) -> Box<dyn Store> {
    let store = factory.fresh_store().await;
    ok(store.migrate().await, "migrate");
    store
}

/// Take every shard of the table; panics if one is held by another session.
pub async fn acquire_all_shards(session: &mut dyn ShardSession) {
    let count = i32::try_from(session.shard_count()).expect("shard count fits i32");
    for shard in 0..count {
        let taken = ok(session.try_acquire(shard).await, "try_acquire");
        assert!(taken, "shard {shard} should be free");
    }
    assert_eq!(session.owned().len(), count as usize);
}

async fn open_with_all_shards(store: &dyn Store, relay_id: &str) -> Box<dyn ShardSession> {
    let mut session = ok(store.open_session(relay_id).await, "open_session");
    acquire_all_shards(session.as_mut()).await;
    session
}

/// A migrated store holding `events` (their ids, in order) and a session of `relay_id` that
/// holds every shard.
async fn with_rows(
    factory: &dyn StoreFactory,
    events: &[NewEvent],
    relay_id: &str,
) -> (Box<dyn Store>, Vec<i64>, Box<dyn ShardSession>) {
    let store = migrated_store(factory).await;
    let ids = ok(store.insert(events).await, "insert");
    let session = open_with_all_shards(store.as_ref(), relay_id).await;
    (store, ids, session)
}

async fn claim(
    session: &mut dyn ShardSession,
    limit: usize,
    exclude_ids: &[i64],
    dead_holds_aggregate: bool,
) -> Vec<OutboxEvent> {
    let request = ClaimRequest {
        limit,
        exclude_ids,
        dead_holds_aggregate,
    };
    ok(session.claim(&request).await, "claim")
}

/// The store's `(pending, dead)` counts.
async fn pending_and_dead(store: &dyn Store) -> (i64, i64) {
    let status = ok(store.status().await, "status");
    (status.pending, status.dead)
}

async fn claim_ids(session: &mut dyn ShardSession, dead_holds_aggregate: bool) -> Vec<i64> {
    claim(session, 10_000, &[], dead_holds_aggregate)
        .await
        .iter()
        .map(|e| e.id)
        .collect()
}

async fn close(session: Box<dyn ShardSession>) {
    ok(session.close().await, "close");
}

fn event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate_id,
        "OrderChanged",
        json!({ "aggregate": aggregate_id, "n": n }),
    )
}

fn failure(id: i64, retry_in: Option<Duration>) -> Failure {
    Failure {
        id,
        error: format!("suite: broker refused row {id}"),
        retry_in,
    }
}

/// `check()` fails with a schema error before `migrate()`, passes after; `migrate()` twice is
/// harmless and keeps the rows.
pub async fn migrate_is_idempotent_and_check_requires_it(factory: &dyn StoreFactory) {
    let store = factory.fresh_store().await;
    assert!(!store.kind().is_empty());
    assert!(!store.describe().is_empty());
    let error = store
        .check()
        .await
        .expect_err("check() must fail before migrate()");
    assert_eq!(error.kind(), ErrorKind::Schema, "{error}");
    assert!(!error.is_retryable(), "{error}");

    ok(store.migrate().await, "first migrate");
    ok(store.check().await, "check after migrate");
    ok(store.migrate().await, "second migrate");
    ok(store.check().await, "check after the second migrate");

    let ids = ok(store.insert(&[event("a", 1)]).await, "insert");
    ok(store.migrate().await, "third migrate");
    assert_eq!(ok(store.status().await, "status").pending, 1);
    let mut session = open_with_all_shards(store.as_ref(), "suite-migrate").await;
    assert_eq!(claim_ids(session.as_mut(), false).await, ids);
    close(session).await;
    factory.cleanup().await;
}

/// Every field written comes back from a claim, in id order.
pub async fn insert_and_claim_round_trip_every_field(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    assert!(ok(store.insert(&[]).await, "empty insert").is_empty());

    let given_id = Uuid::new_v4();
    let events = vec![
        NewEvent::new(
            "order",
            "order-1",
            "OrderPlaced",
            json!({"total": 99.5, "lines": [{"sku": "A-1", "qty": 2}], "note": "héllo \"q\""}),
        )
        .event_id(given_id)
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .header("tenant", "acme")
        .destination("orders.special"),
        NewEvent::new("invoice", "inv-7", "InvoiceIssued", json!([1, "two", null])),
        NewEvent::new("order", "order-1", "OrderConfirmed", json!("plain string")),
    ];
    let before = Utc::now();
    let ids = ok(store.insert(&events).await, "insert");
    assert_eq!(ids.len(), events.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");

    let mut session = open_with_all_shards(store.as_ref(), "suite-round-trip").await;
    let claimed = claim(session.as_mut(), 10, &[], false).await;
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    let mut event_ids = BTreeSet::new();
    for (row, written) in claimed.iter().zip(&events) {
        if let Some(event_id) = written.event_id {
            assert_eq!(row.event_id, event_id);
        }
        assert!(!row.event_id.is_nil());
        event_ids.insert(row.event_id);
        assert_eq!(row.aggregate_type, written.aggregate_type);
        assert_eq!(row.aggregate_id, written.aggregate_id);
        assert_eq!(row.event_type, written.event_type);
        let payload: serde_json::Value =
            serde_json::from_slice(&row.payload).expect("payload is JSON text");
        let wanted: serde_json::Value =
            serde_json::from_slice(written.payload.as_bytes()).expect("written JSON");
        assert_eq!(payload, wanted);
        assert_eq!(row.payload_bytes(), &row.payload[..]);
        assert_eq!(row.headers, written.headers);
        assert_eq!(row.destination, written.destination);
        assert_eq!(row.attempts, 0);
        let skew = (row.created_at - before).num_seconds().abs();
        assert!(
            skew < 60,
            "created_at {} is far from now {before}",
            row.created_at
        );
        assert!(row.shard >= 0 && (row.shard as u32) < session.shard_count());
    }
    assert_eq!(event_ids.len(), events.len(), "event ids are distinct");
    assert_eq!(
        claimed[0].shard, claimed[2].shard,
        "same aggregate, same shard"
    );
    close(session).await;
    factory.cleanup().await;
}

/// A session that owns no shard claims nothing; owning one shard claims that shard's rows only.
pub async fn claim_without_owned_shards_returns_nothing(factory: &dyn StoreFactory) {
    let events: Vec<NewEvent> = (0..20).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let (_store, _, mut session) = with_rows(factory, &events, "suite-no-shard").await;
    let all = claim(session.as_mut(), 100, &[], false).await;
    assert_eq!(all.len(), 20);
    let owned: Vec<i32> = session.owned().iter().copied().collect();
    for shard in owned {
        ok(session.release(shard).await, "release");
    }
    assert!(session.owned().is_empty());
    assert!(claim(session.as_mut(), 100, &[], false).await.is_empty());

    let shard = all[0].shard;
    assert!(ok(session.try_acquire(shard).await, "try_acquire"));
    let expected: Vec<i64> = all
        .iter()
        .filter(|e| e.shard == shard)
        .map(|e| e.id)
        .collect();
    assert_eq!(claim_ids(session.as_mut(), false).await, expected);
    close(session).await;
    factory.cleanup().await;
}

/// Two sessions never hold the same shard; release and close free shards; `cluster()` sees
/// both relays and every locked shard.
pub async fn shard_locks_are_exclusive_and_visible(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    let mut a = ok(store.open_session("suite-relay-a").await, "open a");
    let mut b = ok(store.open_session("suite-relay-b").await, "open b");
    assert!(a.shard_count() >= 4, "the suite needs at least 4 shards");
    assert_eq!(a.shard_count(), b.shard_count());
    assert!(a.owned().is_empty());

    assert!(ok(a.try_acquire(0).await, "a takes 0"));
    assert!(ok(a.try_acquire(1).await, "a takes 1"));
    assert!(ok(a.try_acquire(0).await, "a takes 0 again"), "a holds 0");
    assert!(!ok(b.try_acquire(0).await, "b tries 0"), "0 is a's");
    assert!(!ok(b.try_acquire(1).await, "b tries 1"), "1 is a's");
    assert!(ok(b.try_acquire(2).await, "b takes 2"));
    assert_eq!(a.owned(), &BTreeSet::from([0, 1]));
    assert_eq!(b.owned(), &BTreeSet::from([2]));

    let view = ok(a.cluster().await, "cluster");
    assert_eq!(view.live_relays, 2, "{view:?}");
    assert_eq!(view.locked, BTreeSet::from([0, 1, 2]));
    assert_eq!(ok(b.cluster().await, "cluster from b"), view);

    // Taken twice, released once: free.
    ok(a.release(0).await, "a releases 0");
    ok(a.release(3).await, "a releases 3 it never had");
    assert_eq!(a.owned(), &BTreeSet::from([1]));
    assert!(ok(b.try_acquire(0).await, "b takes 0 after release"));
    assert!(!ok(a.try_acquire(0).await, "a tries 0"), "0 is now b's");

    close(a).await;
    let view = ok(b.cluster().await, "cluster after a closed");
    assert_eq!(view.live_relays, 1, "{view:?}");
    assert_eq!(view.locked, BTreeSet::from([0, 2]));
    assert!(ok(b.try_acquire(1).await, "b takes 1 after a closed"));
    close(b).await;

    let mut c = ok(store.open_session("suite-relay-c").await, "open c");
    acquire_all_shards(c.as_mut()).await;
    let view = ok(c.cluster().await, "cluster");
    assert_eq!(view.live_relays, 1);
    assert_eq!(view.locked.len(), c.shard_count() as usize);
    close(c).await;
    factory.cleanup().await;
}

/// `limit` caps a claim; `exclude_ids` are never returned; claiming changes nothing.
pub async fn claim_honours_limit_and_exclude_ids(factory: &dyn StoreFactory) {
    let events: Vec<NewEvent> = (0..10).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let (_store, ids, mut session) = with_rows(factory, &events, "suite-limit").await;

    let first: Vec<i64> = claim(session.as_mut(), 4, &[], false)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(first, ids[..4]);
    let rest: Vec<i64> = claim(session.as_mut(), 100, &first, false)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(rest, ids[4..]);
    let some: Vec<i64> = claim(session.as_mut(), 3, &[ids[0], ids[2]], false)
        .await
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(some, vec![ids[1], ids[3], ids[4]]);
    assert!(claim(session.as_mut(), 0, &[], false).await.is_empty());
    assert!(claim(session.as_mut(), 100, &ids, false).await.is_empty());
    assert_eq!(claim_ids(session.as_mut(), false).await, ids);
    close(session).await;
    factory.cleanup().await;
}

/// `Delete` removes rows; `Keep` hides them from claims until a purge past the retention
/// deletes them, while a long retention deletes nothing.
pub async fn mark_published_delete_and_keep_then_purge(factory: &dyn StoreFactory) {
    let events: Vec<NewEvent> = (0..5).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let (store, ids, mut session) = with_rows(factory, &events, "suite-mark").await;
    ok(
        session.mark_published(&[], MarkMode::Delete).await,
        "mark nothing",
    );

    ok(
        session.mark_published(&ids[..2], MarkMode::Delete).await,
        "mark delete",
    );
    assert_eq!(claim_ids(session.as_mut(), false).await, ids[2..]);
    assert_eq!(ok(store.status().await, "status").pending, 3);

    ok(
        session.mark_published(&ids[2..4], MarkMode::Keep).await,
        "mark keep",
    );
    assert_eq!(claim_ids(session.as_mut(), false).await, ids[4..]);
    assert_eq!(ok(store.status().await, "status").pending, 1);
    assert!(
        ok(store.oldest_kept().await, "oldest_kept").is_some(),
        "two events kept"
    );

    assert_eq!(
        ok(
            store.purge_published(Duration::from_secs(3600), 100).await,
            "purge with long retention"
        ),
        0
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert_eq!(
        ok(store.purge_published(Duration::ZERO, 1).await, "purge 1"),
        1
    );
    assert_eq!(
        ok(
            store.purge_published(Duration::ZERO, 100).await,
            "purge rest"
        ),
        1
    );
    assert_eq!(
        ok(
            store.purge_published(Duration::ZERO, 100).await,
            "purge again"
        ),
        0
    );
    assert_eq!(
        ok(store.oldest_kept().await, "oldest_kept"),
        None,
        "the purge took every kept event"
    );
    assert_eq!(claim_ids(session.as_mut(), false).await, ids[4..]);
    assert_eq!(pending_and_dead(store.as_ref()).await, (1, 0));
    close(session).await;
    factory.cleanup().await;
}

/// A failed row waits until due and holds back the later rows of its aggregate only; it comes
/// back with `attempts = 1`.
pub async fn retry_holds_the_row_and_its_aggregate_only(factory: &dyn StoreFactory) {
    let events = [event("A", 1), event("B", 1), event("A", 2), event("B", 2)];
    let (store, ids, mut session) = with_rows(factory, &events, "suite-retry").await;
    let (a1, b1, a2, b2) = (ids[0], ids[1], ids[2], ids[3]);
    assert_eq!(claim_ids(session.as_mut(), false).await, ids);

    let delay = Duration::from_millis(300);
    let failed_at = Instant::now();
    ok(
        session.record_failures(&[failure(a1, Some(delay))]).await,
        "record failure",
    );
    ok(session.record_failures(&[]).await, "record nothing");
    assert_eq!(claim_ids(session.as_mut(), false).await, vec![b1, b2]);
    let status = ok(store.status().await, "status");
    assert_eq!((status.retrying, status.held_back_aggregates), (1, 1));
    assert_eq!((status.pending, status.dead), (4, 0));
    ok(
        session.mark_published(&[b1, b2], MarkMode::Delete).await,
        "mark B",
    );

    // Not before it is due...
    let mut claimed = claim(session.as_mut(), 100, &[], false).await;
    if failed_at.elapsed() < delay {
        assert!(claimed.is_empty(), "a1 came back early: {claimed:?}");
    }
    // ...but once due, and alone: a2 stays behind a1 until a1 is published.
    let deadline = Instant::now() + Duration::from_secs(3);
    while claimed.is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
        claimed = claim(session.as_mut(), 100, &[], false).await;
    }
    assert!(failed_at.elapsed() >= delay);
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a1]);
    assert_eq!(claimed[0].attempts, 1);

    ok(
        session.mark_published(&[a1], MarkMode::Delete).await,
        "mark a1",
    );
    let claimed = claim(session.as_mut(), 100, &[], false).await;
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), vec![a2]);
    assert_eq!(claimed[0].attempts, 0);
    let status = ok(store.status().await, "status");
    assert_eq!((status.retrying, status.held_back_aggregates), (0, 0));
    close(session).await;
    factory.cleanup().await;
}

/// `retry_in = None` parks a row as dead: never claimed, counted in `status().dead`; the later
/// rows of its aggregate flow unless `dead_holds_aggregate`.
pub async fn dead_rows_skip_or_hold_their_aggregate(factory: &dyn StoreFactory) {
    let events = [event("A", 1), event("A", 2), event("B", 1)];
    let (store, ids, mut session) = with_rows(factory, &events, "suite-dead").await;
    let (a1, a2, b1) = (ids[0], ids[1], ids[2]);
    ok(
        session.record_failures(&[failure(a1, None)]).await,
        "park as dead",
    );
    assert_eq!(claim_ids(session.as_mut(), false).await, vec![a2, b1]);
    assert_eq!(claim_ids(session.as_mut(), true).await, vec![b1]);
    let status = ok(store.status().await, "status");
    assert_eq!(status.dead, 1);
    assert_eq!(status.pending, 2);
    assert_eq!((status.retrying, status.held_back_aggregates), (0, 0));

    ok(
        session.mark_published(&[a2, b1], MarkMode::Delete).await,
        "mark",
    );
    assert!(claim_ids(session.as_mut(), false).await.is_empty());
    assert_eq!(ok(store.status().await, "status").dead, 1);
    close(session).await;
    factory.cleanup().await;
}

/// The operator's commands (`outbox-relay dead list | retry | discard`): dead rows listed oldest
/// first with their error, filtered; a retry resets the row and keeps its id, so its place
/// before its aggregate's later rows; both count only the rows that were dead (the command
/// reports an id that was not), and leave every other row alone.
pub async fn dead_rows_are_listed_retried_and_discarded(factory: &dyn StoreFactory) {
    use crate::model::{DeadEvent, DeadFilter, DeadSelection};
    let events = [event("A", 1), event("A", 2), event("B", 1), event("C", 1)];
    let (store, ids, mut session) = with_rows(factory, &events, "suite-dead-commands").await;
    let (a1, a2, b1, c1) = (ids[0], ids[1], ids[2], ids[3]);
    let parked = [failure(a1, None), failure(b1, None), failure(c1, None)];
    ok(session.record_failures(&parked).await, "park as dead");
    let list = |aggregate_type: Option<&str>, aggregate_id: Option<&str>, limit: u32| {
        let filter = DeadFilter {
            aggregate_type: aggregate_type.map(str::to_owned),
            aggregate_id: aggregate_id.map(str::to_owned),
            limit,
            with_payload: false,
        };
        let store = &store;
        async move { ok(store.dead_list(&filter).await, "dead_list") }
    };
    let ids_of = |dead: &[DeadEvent]| dead.iter().map(|d| d.id).collect::<Vec<_>>();
    let dead = list(None, None, 100).await;
    assert_eq!(
        ids_of(&dead),
        vec![a1, b1, c1],
        "every dead row, oldest first"
    );
    let first = &dead[0];
    assert_eq!(
        (first.aggregate_type.as_str(), first.aggregate_id.as_str()),
        ("order", "A")
    );
    assert_eq!(first.event_type, "OrderChanged");
    assert_eq!(first.attempts, 1, "one failed attempt");
    assert_eq!(
        first.last_error.as_deref(),
        Some(format!("suite: broker refused row {a1}").as_str())
    );
    assert_eq!(ids_of(&list(None, Some("B"), 100).await), vec![b1]);
    assert_eq!(ids_of(&list(Some("order"), Some("C"), 100).await), vec![c1]);
    assert!(list(Some("invoice"), None, 100).await.is_empty());
    assert_eq!(
        ids_of(&list(None, None, 2).await),
        vec![a1, b1],
        "the limit"
    );

    // Payload and headers only when asked for, then the writer's, as find_events gives them.
    assert!(dead.iter().all(|d| d.content.is_none()), "{dead:?}");
    let with_payload = DeadFilter {
        limit: 100,
        with_payload: true,
        ..DeadFilter::default()
    };
    let listed = ok(
        store.dead_list(&with_payload).await,
        "dead_list with payload",
    );
    assert_eq!(ids_of(&listed), vec![a1, b1, c1]);
    for ((row, written), plain) in listed
        .iter()
        .zip([&events[0], &events[2], &events[3]])
        .zip(&dead)
    {
        let content = row.content.as_ref().expect("the payload was asked for");
        let payload: serde_json::Value = serde_json::from_slice(&content.payload).unwrap();
        let expected: serde_json::Value =
            serde_json::from_slice(written.payload.as_bytes()).unwrap();
        assert_eq!(
            (payload, content.payload_type),
            (expected, PayloadType::Json),
            "row {}",
            row.id
        );
        assert_eq!(content.headers, written.headers, "row {}", row.id);
        let without = DeadEvent {
            content: None,
            ..row.clone()
        };
        assert_eq!(&without, plain, "the rest of the row is the same");
    }

    // a2 is pending and 0 is no row: only a1 comes back, before a2.
    let retried = ok(
        store.dead_retry(&DeadSelection::Ids(vec![a1, a2, 0])).await,
        "dead_retry of ids",
    );
    assert_eq!(retried, 1, "only the dead row given counts");
    let claimed = claim(session.as_mut(), 100, &[], true).await;
    let claimed: Vec<(i64, i32)> = claimed.iter().map(|e| (e.id, e.attempts)).collect();
    assert_eq!(
        claimed,
        vec![(a1, 0), (a2, 0)],
        "a retried row keeps its place in its aggregate, attempts reset"
    );

    let discarded = ok(
        store
            .dead_discard(&DeadSelection::Ids(vec![b1, a2, 0]))
            .await,
        "dead_discard",
    );
    assert_eq!(discarded, 1, "only the dead row given is deleted");
    assert_eq!(ids_of(&list(None, None, 100).await), vec![c1]);
    let retried = ok(
        store
            .dead_retry(&DeadSelection::All {
                aggregate_id: Some("B".to_owned()),
            })
            .await,
        "dead_retry of a discarded aggregate",
    );
    assert_eq!(retried, 0);
    let retried = ok(
        store
            .dead_retry(&DeadSelection::All { aggregate_id: None })
            .await,
        "dead_retry of all",
    );
    assert_eq!(retried, 1);
    let counts = pending_and_dead(store.as_ref()).await;
    assert_eq!(counts, (3, 0), "a1, a2 and c1 pending");
    assert_eq!(claim_ids(session.as_mut(), true).await, vec![a1, a2, c1]);

    // Discarding every dead row, of one aggregate or of all: pending rows stay.
    let parked = [failure(a1, None), failure(c1, None)];
    ok(session.record_failures(&parked).await, "park as dead again");
    let all_of = |aggregate: Option<&str>| DeadSelection::All {
        aggregate_id: aggregate.map(str::to_owned),
    };
    let discarded = ok(store.dead_discard(&all_of(Some("C"))).await, "discard C's");
    assert_eq!(discarded, 1);
    assert_eq!(ids_of(&list(None, None, 100).await), vec![a1]);
    let discarded = ok(store.dead_discard(&all_of(None)).await, "discard all");
    assert_eq!(discarded, 1);
    let counts = pending_and_dead(store.as_ref()).await;
    assert_eq!(counts, (1, 0), "a2 pending, nothing dead");
    assert_eq!(claim_ids(session.as_mut(), false).await, vec![a2]);
    close(session).await;
    factory.cleanup().await;
}

/// `find_events` finds rows in every state, newest first: published and kept (with its time),
/// pending and retrying (attempts, next attempt, last error), dead (since, error); by event id,
/// aggregate type and aggregate, within a limit; a row's own destination comes back; a row
/// deleted on publish is found no more. Payload and headers only when asked for, then those
/// the writer gave, in every state.
pub async fn events_are_found_in_every_state(factory: &dyn StoreFactory) {
    use crate::model::{EventFilter, EventRecord, EventState};
    let events = [
        event("A", 1),
        event("A", 2).destination("audit.special").header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        event("B", 1),
        event("C", 1),
        event("D", 1),
    ];
    let (store, ids, mut session) = with_rows(factory, &events, "suite-find-events").await;
    let (a1, a2, b1, c1, d1) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    ok(
        session.mark_published(&[a1], MarkMode::Keep).await,
        "publish a1, kept",
    );
    let failures = [
        failure(b1, Some(Duration::from_secs(600))),
        failure(c1, None),
    ];
    ok(
        session.record_failures(&failures).await,
        "b1 retries, c1 dead",
    );
    ok(
        session.mark_published(&[d1], MarkMode::Delete).await,
        "publish d1, deleted",
    );
    let find = |filter: EventFilter| {
        let store = &store;
        async move { ok(store.find_events(&filter).await, "find_events") }
    };
    let all = |limit: u32| EventFilter {
        limit,
        ..EventFilter::default()
    };
    let ids_of = |found: &[EventRecord]| found.iter().map(|e| e.id).collect::<Vec<_>>();

    let found = find(all(100)).await;
    assert_eq!(
        ids_of(&found),
        vec![c1, b1, a2, a1],
        "newest first; d1 was deleted on publish"
    );
    let states: Vec<EventState> = found.iter().map(|e| e.state).collect();
    use EventState::{Dead, Pending, Published};
    assert_eq!(states, vec![Dead, Pending, Pending, Published]);
    let (c, b, a_2, a_1) = (&found[0], &found[1], &found[2], &found[3]);

    let published_at = a_1.published_at.expect("a published row has its time");
    assert!(
        published_at >= a_1.created_at - chrono::Duration::seconds(5),
        "published at {published_at}, created at {}",
        a_1.created_at
    );
    assert_eq!((a_1.attempts, a_1.dead_at), (0, None));

    assert_eq!(a_2.destination.as_deref(), Some("audit.special"));
    assert_eq!(a_1.destination, None);
    assert_eq!(
        (
            a_2.attempts,
            &a_2.last_error,
            a_2.published_at,
            a_2.next_attempt_at
        ),
        (0, &None, None, None),
        "a2 waits, untouched"
    );

    assert_eq!(b.attempts, 1);
    assert_eq!(
        b.last_error.as_deref(),
        Some(format!("suite: broker refused row {b1}").as_str())
    );
    let next = b
        .next_attempt_at
        .expect("a retrying row has its next attempt");
    assert!(
        next > b.created_at + chrono::Duration::seconds(300),
        "next attempt {next}, created {}",
        b.created_at
    );
    assert_eq!((b.published_at, b.dead_at), (None, None));

    assert!(c.dead_at.is_some(), "a dead row has its time");
    assert_eq!(c.attempts, 1);
    assert_eq!(
        c.last_error.as_deref(),
        Some(format!("suite: broker refused row {c1}").as_str())
    );
    assert_eq!(
        (
            c.aggregate_type.as_str(),
            c.aggregate_id.as_str(),
            c.event_type.as_str()
        ),
        ("order", "C", "OrderChanged")
    );

    // By event id (of a row in each state), aggregate, aggregate type; the limit.
    for record in &found {
        let by_id = find(EventFilter {
            event_id: Some(record.event_id),
            ..all(100)
        })
        .await;
        assert_eq!(
            by_id,
            vec![record.clone()],
            "by event id {}",
            record.event_id
        );
    }
    let unknown = find(EventFilter {
        event_id: Some(uuid::Uuid::new_v4()),
        ..all(100)
    })
    .await;
    assert!(unknown.is_empty(), "an unknown event id finds nothing");
    let of_a = find(EventFilter {
        aggregate_id: Some("A".to_owned()),
        ..all(100)
    })
    .await;
    assert_eq!(ids_of(&of_a), vec![a2, a1]);
    let typed = find(EventFilter {
        aggregate_type: Some("order".to_owned()),
        aggregate_id: Some("B".to_owned()),
        ..all(100)
    })
    .await;
    assert_eq!(ids_of(&typed), vec![b1]);
    let other_type = find(EventFilter {
        aggregate_type: Some("invoice".to_owned()),
        ..all(100)
    })
    .await;
    assert!(other_type.is_empty());
    assert_eq!(ids_of(&find(all(2)).await), vec![c1, b1], "the limit");

    // Without `with_payload` no payload is read; with it, each row's in every state.
    assert!(found.iter().all(|e| e.content.is_none()), "{found:?}");
    let with_payload = find(EventFilter {
        with_payload: true,
        ..all(100)
    })
    .await;
    assert_eq!(ids_of(&with_payload), vec![c1, b1, a2, a1]);
    for (record, written) in with_payload
        .iter()
        .zip([&events[3], &events[2], &events[1], &events[0]])
    {
        let content = record
            .content
            .as_ref()
            .unwrap_or_else(|| panic!("row {} has no content: {record:?}", record.id));
        assert_eq!(content.payload_type, PayloadType::Json, "row {}", record.id);
        // A json table's payload is the database's rendering of the document.
        let payload: serde_json::Value = serde_json::from_slice(&content.payload)
            .unwrap_or_else(|e| panic!("row {}: payload is not JSON: {e}", record.id));
        let expected: serde_json::Value =
            serde_json::from_slice(written.payload.as_bytes()).unwrap();
        assert_eq!(payload, expected, "row {}", record.id);
        assert_eq!(content.headers, written.headers, "row {}", record.id);
        let without = EventRecord {
            content: None,
            ..record.clone()
        };
        let listed = found.iter().find(|e| e.id == record.id).unwrap();
        assert_eq!(&without, listed, "the rest of the row is the same");
    }
    assert_eq!(
        with_payload[2]
            .content
            .as_ref()
            .unwrap()
            .headers
            .get("traceparent")
            .map(String::as_str),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    close(session).await;
    factory.cleanup().await;
}

/// `replay` sends the kept events a selection names (published with `Keep`) back to pending:
/// counted first with `dry_run`, then claimed again with their `event_id`s, in id order,
/// attempts reset; narrowed by aggregate type, aggregate and publication time. Events deleted
/// on publish, pending or dead are never among them. `oldest_kept` says how far back a replay
/// reaches: none before anything is kept and once nothing is.
pub async fn kept_events_are_replayed(factory: &dyn StoreFactory) {
    use crate::model::ReplaySelection;
    let events = [
        event("A", 1),
        event("B", 1),
        event("A", 2),
        event("B", 2),
        event("C", 1),
        event("C", 2),
    ];
    let (store, ids, mut session) = with_rows(factory, &events, "suite-replay").await;
    let oldest_kept = || async { ok(store.oldest_kept().await, "oldest_kept") };
    assert_eq!(oldest_kept().await, None, "nothing published yet");
    let event_ids: BTreeMap<i64, Uuid> = claim(session.as_mut(), 100, &[], false)
        .await
        .iter()
        .map(|e| (e.id, e.event_id))
        .collect();
    let event_ids_of = |claimed: &[OutboxEvent]| {
        claimed
            .iter()
            .map(|e| (e.event_id, e.attempts))
            .collect::<Vec<_>>()
    };
    let expected = |rows: &[i64]| rows.iter().map(|id| (event_ids[id], 0)).collect::<Vec<_>>();
    // B1 failed once before it was published; A1..B2 published and kept, C1 deleted on
    // publish, C2 dead.
    let failed_once = [failure(ids[1], Some(Duration::ZERO))];
    ok(session.record_failures(&failed_once).await, "a failure");
    ok(
        session.mark_published(&ids[..4], MarkMode::Keep).await,
        "mark keep",
    );
    ok(
        session.mark_published(&ids[4..5], MarkMode::Delete).await,
        "mark delete",
    );
    ok(
        session.record_failures(&[failure(ids[5], None)]).await,
        "park as dead",
    );
    // Wide margins: the store stamps `published_at` with the database's clock.
    let hour = chrono::Duration::hours(1);
    let replay = |selection: ReplaySelection, dry_run: bool| {
        let store = &store;
        async move { ok(store.replay(&selection, dry_run).await, "replay") }
    };
    let everything = ReplaySelection::since(Utc::now() - hour);
    let oldest = oldest_kept().await.expect("four events kept");
    assert!(
        (Utc::now() - oldest).abs() < hour,
        "kept since {oldest}, now {}",
        Utc::now()
    );

    assert_eq!(replay(everything.clone(), true).await, 4, "counted");
    assert_eq!(
        pending_and_dead(store.as_ref()).await,
        (0, 1),
        "a dry run changes nothing"
    );
    let before = ReplaySelection {
        published_until: Some(Utc::now() - hour),
        ..ReplaySelection::since(Utc::now() - hour * 2)
    };
    assert_eq!(replay(before, false).await, 0, "a window that ended before");
    assert_eq!(
        replay(ReplaySelection::since(Utc::now() + hour), false).await,
        0,
        "a window that starts after"
    );
    let invoices = ReplaySelection {
        aggregate_type: Some("invoice".to_owned()),
        ..everything.clone()
    };
    assert_eq!(replay(invoices, false).await, 0, "another aggregate type");

    let aggregate_a = ReplaySelection {
        aggregate_type: Some("order".to_owned()),
        aggregate_id: Some("A".to_owned()),
        ..everything.clone()
    };
    assert_eq!(replay(aggregate_a, false).await, 2, "aggregate A");
    assert_eq!(pending_and_dead(store.as_ref()).await, (2, 1));
    assert_eq!(
        event_ids_of(&claim(session.as_mut(), 100, &[], false).await),
        expected(&[ids[0], ids[2]]),
        "A's events pending again, in their order"
    );
    let of_b = oldest_kept().await.expect("B's events kept");
    assert!(
        of_b >= oldest,
        "B's kept since {of_b}, all four since {oldest}"
    );
    assert_eq!(
        replay(everything.clone(), false).await,
        2,
        "the rest: A's are pending already"
    );
    assert_eq!(oldest_kept().await, None, "every kept event pending again");
    assert_eq!(
        event_ids_of(&claim(session.as_mut(), 100, &[], false).await),
        expected(&ids[..4]),
        "every kept event pending again, in id order, attempts reset"
    );
    ok(
        session.mark_published(&ids[..4], MarkMode::Delete).await,
        "mark delete",
    );
    assert_eq!(
        replay(everything, false).await,
        0,
        "events deleted on publish are gone"
    );
    assert_eq!(
        pending_and_dead(store.as_ref()).await,
        (0, 1),
        "C2 still dead"
    );
    close(session).await;
    factory.cleanup().await;
}

/// A migrated store holding `count` events over 100 aggregates, all published and kept, and the
/// session of `relay_id` (every shard) that marked them.
async fn with_kept_events(
    factory: &dyn StoreFactory,
    count: usize,
    relay_id: &str,
) -> (Box<dyn Store>, Box<dyn ShardSession>) {
    let store = migrated_store(factory).await;
    let mut session = open_with_all_shards(store.as_ref(), relay_id).await;
    let events: Vec<NewEvent> = (0..count)
        .map(|n| event(&format!("agg-{}", n % 100), n as u32))
        .collect();
    for chunk in events.chunks(1_000) {
        let ids = ok(store.insert(chunk).await, "insert");
        ok(
            session.mark_published(&ids, MarkMode::Keep).await,
            "mark keep",
        );
    }
    (store, session)
}

/// A replay of more events than a store sends back in one statement (10,007: the SQL stores
/// go 10,000 at a time) sends every one, and says so.
pub async fn a_replay_of_many_events_sends_every_one(factory: &dyn StoreFactory) {
    use crate::model::ReplaySelection;
    const EVENTS: usize = 10_007;
    let (store, session) = with_kept_events(factory, EVENTS, "suite-replay-many").await;
    let kept = ReplaySelection::since(Utc::now() - chrono::Duration::hours(1));
    assert_eq!(ok(store.replay(&kept, true).await, "count"), EVENTS as u64);
    assert_eq!(
        ok(store.replay(&kept, false).await, "replay"),
        EVENTS as u64
    );
    assert_eq!(pending_and_dead(store.as_ref()).await, (EVENTS as i64, 0));
    assert_eq!(ok(store.replay(&kept, false).await, "replay again"), 0);
    close(session).await;
    factory.cleanup().await;
}

/// A replay with an open window while a relay publishes what it sends back (claims and marks
/// kept, as fast as it can): each kept event is sent back once, not again after the relay
/// published it anew (a window without an end ends when the replay starts). 30,007 events, so
/// that the SQL stores' statements of 10,000 leave the relay time between them.
pub async fn a_replay_under_a_running_relay_sends_each_event_once(factory: &dyn StoreFactory) {
    use crate::model::ReplaySelection;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    const EVENTS: usize = 30_007;
    let (store, mut session) = with_kept_events(factory, EVENTS, "suite-replay-relay").await;
    let stop = Arc::new(AtomicBool::new(false));
    let relay = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut published = 0;
            while !stop.load(Ordering::Relaxed) {
                let ids: Vec<i64> = claim(session.as_mut(), 2_000, &[], false)
                    .await
                    .iter()
                    .map(|e| e.id)
                    .collect();
                ok(
                    session.mark_published(&ids, MarkMode::Keep).await,
                    "the relay's mark",
                );
                published += ids.len();
                if ids.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            (session, published)
        }
    });
    let kept = ReplaySelection::since(Utc::now() - chrono::Duration::hours(1));
    let sent_back = ok(store.replay(&kept, false).await, "replay");
    stop.store(true, Ordering::Relaxed);
    let (session, _) = relay.await.expect("the relay task");
    assert_eq!(sent_back, EVENTS as u64, "each kept event sent back once");
    close(session).await;
    factory.cleanup().await;
}

/// Backlog figures: pending, age of the oldest pending row, dead, aggregates held back, rows
/// retrying; and the aggregates held back, each with the row it waits behind.
pub async fn status_reports_the_backlog(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    let empty = ok(store.status().await, "status of an empty table");
    assert_eq!(empty.pending, 0);
    assert_eq!(empty.oldest_pending_age_secs, 0.0);
    assert_eq!(
        (empty.dead, empty.held_back_aggregates, empty.retrying),
        (0, 0, 0)
    );

    let ids = ok(
        store
            .insert(&[
                event("A", 1),
                event("B", 1),
                event("C", 1),
                event("A", 2),
                event("A", 3),
                event("B", 2),
            ])
            .await,
        "insert",
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    let status = ok(store.status().await, "status");
    assert_eq!(status.pending, 6);
    assert!(
        status.oldest_pending_age_secs > 0.0 && status.oldest_pending_age_secs < 60.0,
        "{status:?}"
    );
    assert_eq!(
        (status.dead, status.held_back_aggregates, status.retrying),
        (0, 0, 0)
    );

    let mut session = open_with_all_shards(store.as_ref(), "suite-status").await;
    let later = Some(Duration::from_secs(60));
    ok(
        session
            .record_failures(&[
                failure(ids[0], later),
                failure(ids[1], later),
                failure(ids[2], None),
            ])
            .await,
        "record failures",
    );
    ok(
        session.record_failures(&[failure(ids[0], later)]).await,
        "record a second failure",
    );
    let status = ok(store.status().await, "status");
    assert_eq!(status.pending, 5);
    assert_eq!(status.dead, 1);
    assert_eq!(status.retrying, 2);
    assert_eq!(status.held_back_aggregates, 2);
    // The aggregates held back, the longest-waiting first: A behind its first event (two failed
    // attempts, two events waiting behind it), B behind its first (one, one).
    let held = ok(store.held_back(20).await, "held_back");
    let summary: Vec<_> = held
        .iter()
        .map(|h| (h.aggregate_id.as_str(), h.id, h.attempts, h.waiting_behind))
        .collect();
    assert_eq!(
        summary,
        [("A", ids[0], 2, 2), ("B", ids[1], 1, 1)],
        "{held:?}"
    );
    for h in &held {
        assert_eq!(h.aggregate_type, "order");
        let error = format!("suite: broker refused row {}", h.id);
        assert_eq!(h.last_error.as_deref(), Some(error.as_str()));
        let next = h
            .next_attempt_at
            .expect("a retrying row has its next attempt");
        let from_now = next - chrono::Utc::now();
        assert!(
            from_now > chrono::Duration::seconds(30) && from_now < chrono::Duration::seconds(65),
            "the next attempt, 60 s after the failure: {next}"
        );
    }
    let first = ok(store.held_back(1).await, "held_back, 1 at most");
    assert_eq!(first, held[..1], "the limit");

    ok(
        session.mark_published(&[ids[1]], MarkMode::Delete).await,
        "mark",
    );
    let status = ok(store.status().await, "status");
    assert_eq!(
        (status.pending, status.retrying, status.held_back_aggregates),
        (4, 1, 1)
    );
    let held = ok(store.held_back(20).await, "held_back");
    assert_eq!(
        held.len(),
        1,
        "B goes on once its first is published: {held:?}"
    );
    assert_eq!((held[0].aggregate_id.as_str(), held[0].id), ("A", ids[0]));
    close(session).await;
    factory.cleanup().await;
}

/// `shard_owners()` names the relay holding each shard.
pub async fn shard_owners_name_the_relay(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    assert!(ok(store.shard_owners().await, "owners").is_empty());
    let mut alpha = ok(store.open_session("relay-alpha").await, "open alpha");
    let mut beta = ok(store.open_session("relay-beta").await, "open beta");
    assert!(ok(alpha.try_acquire(0).await, "alpha takes 0"));
    assert!(ok(beta.try_acquire(1).await, "beta takes 1"));

    let owners = ok(store.shard_owners().await, "owners");
    let by_shard: BTreeMap<i32, String> = owners.into_iter().map(|o| (o.shard, o.owner)).collect();
    assert_eq!(by_shard.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    assert!(by_shard[&0].contains("relay-alpha"), "{by_shard:?}");
    assert!(by_shard[&1].contains("relay-beta"), "{by_shard:?}");

    ok(alpha.release(0).await, "release");
    let owners = ok(store.shard_owners().await, "owners");
    assert_eq!(owners.iter().map(|o| o.shard).collect::<Vec<_>>(), vec![1]);
    close(alpha).await;
    close(beta).await;
    assert!(ok(store.shard_owners().await, "owners").is_empty());
    factory.cleanup().await;
}

/// `pause` holds until `resume`, for the table it was made on only: it says who paused it,
/// why and since when (the server's clock), a second `pause` keeps the first, `resume` gives
/// back the pause it lifted, and a pause changes no row.
pub async fn a_pause_holds_until_resumed_and_is_the_tables_own(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    let other = migrated_store(factory).await;
    ok(
        store
            .insert(&[NewEvent::new("order", "A1", "Placed", json!({}))])
            .await,
        "insert",
    );
    assert_eq!(
        ok(store.paused().await, "paused"),
        None,
        "a new table is not paused"
    );
    assert_eq!(ok(store.resume().await, "resume"), None, "nothing to lift");

    let before = Utc::now() - chrono::Duration::minutes(1);
    let pause = match ok(
        store.pause("alice@ops-1", "consumer fix, INC-42").await,
        "pause",
    ) {
        crate::model::Paused::Now(pause) => pause,
        already => panic!("a first pause found one: {already:?}"),
    };
    assert_eq!(pause.by, "alice@ops-1");
    assert_eq!(pause.reason, "consumer fix, INC-42");
    let after = Utc::now() + chrono::Duration::minutes(1);
    assert!(
        before < pause.since && pause.since < after,
        "since {} (the server's clock, about now)",
        pause.since
    );
    assert_eq!(ok(store.paused().await, "paused"), Some(pause.clone()));
    assert_eq!(
        ok(other.paused().await, "paused"),
        None,
        "another table is not paused by it"
    );

    let again = ok(store.pause("bob@ops-2", "").await, "pause again");
    assert_eq!(
        again,
        crate::model::Paused::Already(pause.clone()),
        "the first pause holds"
    );
    assert_eq!(again.pause(), &pause);
    assert_eq!(
        ok(store.status().await, "status").pending,
        1,
        "no row changed"
    );

    assert_eq!(ok(store.resume().await, "resume"), Some(pause));
    assert_eq!(ok(store.paused().await, "paused"), None);
    assert_eq!(ok(store.resume().await, "resume"), None, "lifted once");
    let empty = ok(store.pause("carol", "").await, "pause without a reason");
    assert!(
        matches!(&empty, crate::model::Paused::Now(p) if p.reason.is_empty() && p.by == "carol")
    );
    ok(store.resume().await, "resume");
    factory.cleanup().await;
}

/// All events of one aggregate share one shard; many aggregates use several shards.
pub async fn aggregates_keep_one_shard_and_spread(factory: &dyn StoreFactory) {
    let events: Vec<NewEvent> = (0..3)
        .flat_map(|n| (0..200).map(move |a| event(&format!("customer-{a}"), n)))
        .collect();
    let (_store, _, mut session) = with_rows(factory, &events, "suite-shards").await;
    let claimed = claim(session.as_mut(), 1000, &[], false).await;
    assert_eq!(claimed.len(), 600);
    let mut shards_of: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for row in &claimed {
        assert!(row.shard >= 0 && (row.shard as u32) < session.shard_count());
        shards_of
            .entry(row.aggregate_id.as_str())
            .or_default()
            .insert(row.shard);
    }
    assert_eq!(shards_of.len(), 200);
    for (aggregate, shards) in &shards_of {
        assert_eq!(shards.len(), 1, "{aggregate} is in shards {shards:?}");
    }
    let used: BTreeSet<i32> = shards_of.values().flatten().copied().collect();
    assert!(used.len() > 1, "200 aggregates all in shard {used:?}");
    close(session).await;
    factory.cleanup().await;
}

/// Which writers' API an enqueue goes through (see [`LiveHarness::enqueue`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// The store's handle on its table, one event (`store.outbox().enqueue`).
    Outbox,
    /// The store's handle on its table, many events (`store.outbox().enqueue_many`).
    OutboxMany,
    /// The free function on the table named `outbox` of the connection's default schema or
    /// database, one event (`enqueue`).
    Free,
    /// The same, many events (`enqueue_many`).
    FreeMany,
}

/// The settings the live cases vary, on a store's plugin configuration type. The SQL stores
/// share theirs (`outboxkit-store-sql`, feature `testkit`); a third party's store implements it
/// for its own configuration type.
pub trait SuiteConfig: crate::StoreConfig + Clone + Sync {
    /// Settings with every default and this URL.
    fn for_url(url: &str) -> Self;
    /// The same settings with another `store.table`.
    fn with_table(self, table: &str) -> Self;
    /// The same settings with another `store.shards`.
    fn with_shards(self, shards: u32) -> Self;
    /// The same settings with another `store.session_timeout`.
    fn with_session_timeout(self, timeout: Duration) -> Self;
    /// The same settings with `store.payload_type` set.
    fn with_payload_type(self, payload_type: PayloadType) -> Self;
    /// `store.table` as set.
    fn table_setting(&self) -> String;
}

/// What the live cases need beyond [`StoreFactory`]: the store's own types, its settings, and
/// the few steps only its SQL can do. Methods panic when the server fails them (they are test
/// steps); those returning a `Result` hand the store's error to the case, which checks it.
#[async_trait]
pub trait LiveHarness: StoreFactory {
    /// The store.
    type Store: Store;
    /// Its shard session.
    type Session: ShardSession + 'static;
    /// Its `[store]` settings: the store's plugin configuration type.
    type Config: SuiteConfig<Store = Self::Store>;
    /// A writers' connection pool (the store's own, or one on another schema or database).
    type Pool: WriterPool<Conn = Self::Conn>;
    /// A writer's connection, which [`Self::enqueue`] writes on: the connection of a
    /// transaction, or one outside any transaction.
    type Conn: Send;
    /// What keeps the outbox table locked (see [`Self::block_table`]).
    type Blocker: Send;

    /// [`Store::kind`] of the store.
    const KIND: &'static str;
    /// The server as the store's messages name it (`PostgreSQL`).
    const PRODUCT: &'static str;
    /// The schema version the store creates.
    const SCHEMA_VERSION: i32;
    /// What the message of a duplicate-key error contains (`23505`).
    const DUPLICATE_KEY: &'static str;
    /// Whether claimed payloads are JSON text in the server's normal form (`{"n": 2}`), rather
    /// than JSON as written.
    const NORMALIZES_JSON: bool;
    /// Longest aggregate type, aggregate id and event type the writers take, if limited.
    const MAX_NAME_CHARS: Option<usize>;
    /// Whether a table needs a database named by the URL or by the table setting.
    const TABLE_NEEDS_DATABASE: bool;
    /// Whether the test server lets the test user in whatever the password (trust auth).
    const ACCEPTS_ANY_PASSWORD: bool;
    /// The documented columns of the outbox table: name and type, in order.
    const COLUMNS: &'static [(&'static str, &'static str)];

    /// `OUTBOX_TEST_*_URL`, or the local test database.
    fn test_url(&self) -> String;
    /// Settings for a new, random table of the test database.
    fn fresh_config(&self) -> Self::Config;

    /// Connect a store (not migrated): the configuration's own `build`, as the relay does.
    async fn connect(&self, config: Self::Config) -> Result<Self::Store> {
        crate::StoreConfig::build(config).await
    }
    /// The store's table, as it names it (`schema.table`).
    fn table(&self, store: &Self::Store) -> String;
    /// A session of the store, with the concrete type.
    async fn open_session(&self, store: &Self::Store, relay_id: &str) -> Self::Session;
    /// Whether the session lost its connection.
    fn is_poisoned(&self, session: &Self::Session) -> bool;
    /// The start of the owner `shard_owners()` reports for a session of `relay_id`
    /// (`relay-a (pid `).
    fn owner_prefix(&self, relay_id: &str) -> String;
    /// Kill the server side of `session` (a session of `relay_id`), as an operator would.
    async fn kill(&self, store: &Self::Store, session: &Self::Session, relay_id: &str);
    /// Keep the outbox table locked against the session's statements until
    /// [`Self::unblock`].
    async fn block_table(&self, store: &Self::Store) -> Self::Blocker;
    /// Release what [`Self::block_table`] took.
    async fn unblock(&self, blocker: Self::Blocker);

    /// Run one statement on a plain connection to the test database.
    async fn execute(&self, sql: &str);
    /// Drop the store's table and forget its bookkeeping rows.
    async fn drop_table(&self, store: &Self::Store);
    /// Drop a schema or database and everything in it.
    async fn drop_namespace(&self, namespace: &str);
    /// Table `name` of schema or database `namespace` quoted as the store's messages quote it:
    /// `"ns"."name"` (this default), `` `ns`.`name` ``.
    fn quoted_in(&self, namespace: &str, name: &str) -> String {
        format!("\"{namespace}\".\"{name}\"")
    }
    /// `(version, shard_count, applied_at is set)` of the table's bookkeeping row.
    async fn schema_row(&self, store: &Self::Store) -> (i32, i32, bool);
    /// Name and type of each column of the table, in order (types as in [`Self::COLUMNS`]).
    async fn columns(&self, store: &Self::Store) -> Vec<(String, String)>;
    /// Check the table's indexes and whatever else the store documents about its table.
    async fn check_indexes(&self, store: &Self::Store);
    /// Write two rows with plain SQL, as a writer in another language does: `order` `42`
    /// `OrderConfirmed` with payload `{"total": 99}` and headers
    /// `{"traceparent": "00-abc-01", "retries": 3, "flags": {"a": true}}`, then `order` `42`
    /// `OrderShipped` with payload `{"n": 2}` and the default headers. Check that rows the
    /// table must refuse (headers not an object, ...) are refused.
    async fn write_with_plain_sql(&self, store: &Self::Store);

    /// The store's own writers' pool.
    fn pool(&self, store: &Self::Store) -> Self::Pool;
    /// A pool whose connections use `namespace` (a schema or database that holds a migrated
    /// table `outbox`) by default, where a table `orders (id, status)` of 20 characters each
    /// was created.
    async fn pool_in(&self, namespace: &str) -> Self::Pool;
    /// Enqueue through `writer` (for [`Writer::Outbox`] and [`Writer::Free`], `events` is one
    /// event) on `conn` (a transaction's, or one outside any transaction); the ids of the rows.
    async fn enqueue(
        &self,
        store: &Self::Store,
        conn: &mut Self::Conn,
        writer: Writer,
        events: &[NewEvent],
    ) -> Result<Vec<i64>>;
}

/// A writers' connection pool of the live cases ([`LiveHarness::Pool`]).
#[async_trait]
pub trait WriterPool: Send + Sync {
    /// A connection ([`LiveHarness::Conn`]).
    type Conn: Send;
    /// A writer's open transaction, on its connection.
    type Tx: WriterTx + DerefMut<Target = Self::Conn>;
    /// A connection of the pool, outside any transaction.
    type Lease: DerefMut<Target = Self::Conn> + Send;

    /// Begin a writer's transaction.
    async fn begin(&self) -> Self::Tx;
    /// A connection outside any transaction.
    async fn acquire(&self) -> Self::Lease;
    /// `SELECT count(*) FROM orders`.
    async fn count_orders(&self) -> i64;
}

/// A writer's open transaction of the live cases ([`WriterPool::Tx`]).
#[async_trait]
pub trait WriterTx: Send + Sized {
    /// Commit it.
    async fn commit(self);
    /// Roll it back.
    async fn rollback(self);
    /// `INSERT INTO orders VALUES ('<id>', 'confirmed')` in the transaction.
    async fn insert_order(&mut self, id: &str);
}

/// A random name such as `outbox_t_1f2e3d4c5b6a7980`.
pub fn random_name(prefix: &str) -> String {
    let hex = Uuid::new_v4().simple().to_string();
    format!("{prefix}_{}", &hex[..16])
}

/// An event whose payload is `{"n": n}`.
fn small_event(aggregate_id: &str, n: u32) -> NewEvent {
    NewEvent::new("order", aggregate_id, "OrderChanged", json!({ "n": n }))
}

fn ids(events: &[OutboxEvent]) -> Vec<i64> {
    events.iter().map(|e| e.id).collect()
}

async fn connected<H: LiveHarness>(harness: &H, config: H::Config) -> H::Store {
    match harness.connect(config).await {
        Ok(store) => store,
        Err(e) => panic!(
            "{} is required for this test (see {}): {e}",
            H::PRODUCT,
            harness.test_url()
        ),
    }
}

async fn live_migrated<H: LiveHarness>(harness: &H, config: H::Config) -> H::Store {
    let store = connected(harness, config).await;
    store.migrate().await.expect("migrate");
    store
}

async fn live_session<H: LiveHarness>(harness: &H, store: &H::Store, relay_id: &str) -> H::Session {
    with_all_shards(harness.open_session(store, relay_id).await).await
}

/// `session`, holding every shard of its table now ([`acquire_all_shards`]).
pub async fn with_all_shards<S: ShardSession>(mut session: S) -> S {
    acquire_all_shards(&mut session).await;
    session
}

async fn claim_all(session: &mut dyn ShardSession) -> Result<Vec<OutboxEvent>> {
    session
        .claim(&ClaimRequest {
            limit: 10_000,
            exclude_ids: &[],
            dead_holds_aggregate: false,
        })
        .await
}

/// [`LiveHarness::enqueue`] outside any transaction, on a connection of `pool`.
async fn enqueue_autocommit<H: LiveHarness>(
    harness: &H,
    store: &H::Store,
    pool: &H::Pool,
    writer: Writer,
    events: &[NewEvent],
) -> Result<Vec<i64>> {
    let mut conn = pool.acquire().await;
    harness.enqueue(store, &mut conn, writer, events).await
}

/// Close `session`, which must succeed.
pub async fn close_live<S: ShardSession + 'static>(session: S) {
    Box::new(session).close().await.expect("close session");
}

/// The payload text of a claimed row is `expected`: as JSON always, as text too where the store
/// normalizes JSON.
fn assert_payload<H: LiveHarness>(payload: &[u8], expected: &str) {
    let parsed: serde_json::Value = serde_json::from_slice(payload).expect("payload is JSON");
    let wanted: serde_json::Value = serde_json::from_str(expected).expect("expected JSON");
    assert_eq!(parsed, wanted);
    if H::NORMALIZES_JSON {
        assert_eq!(payload, expected.as_bytes());
    }
}

fn assert_error(error: &Error, kind: ErrorKind) {
    assert_eq!(error.kind(), kind, "{error}");
}

/// Rows of a rolled-back transaction are never claimed, nor rows still uncommitted; a late
/// commit below claimed ids is claimed all the same.
pub async fn rolled_back_and_uncommitted_rows_are_never_claimed<H: LiveHarness>(harness: &H) {
    let store = live_migrated(harness, harness.fresh_config()).await;
    let mut session = live_session(harness, &store, "rollback").await;
    let pool = harness.pool(&store);

    let mut rolled_back = pool.begin().await;
    harness
        .enqueue(
            &store,
            &mut rolled_back,
            Writer::Outbox,
            &[small_event("a", 1)],
        )
        .await
        .unwrap();
    rolled_back.rollback().await;

    let mut late = pool.begin().await;
    let late_id = harness
        .enqueue(&store, &mut late, Writer::Outbox, &[small_event("b", 1)])
        .await
        .unwrap()[0];
    let committed = store.insert(&[small_event("c", 1)]).await.unwrap();
    assert!(late_id < committed[0]);

    // Only the committed row, although a lower id is in flight.
    assert_eq!(ids(&claim_all(&mut session).await.unwrap()), committed);
    late.commit().await;
    // The late commit is not skipped: rows are selected by state, not by "id > last seen".
    assert_eq!(
        ids(&claim_all(&mut session).await.unwrap()),
        vec![late_id, committed[0]]
    );
    assert_eq!(store.status().await.unwrap().pending, 2);
    close_live(session).await;
    harness.drop_table(&store).await;
}

/// A table migrated by a relay older than `pause` has no pause table beside it: it is not
/// paused (its relays read nothing wrong, and ask again only after a minute), `check` finds
/// nothing missing for relaying, `pause` and `resume` say to run `migrate`, and `migrate` makes
/// the pause table. In a schema or database of the test's own: the pause table is shared by the
/// tables beside it.
pub async fn a_table_migrated_before_pauses_existed_gets_its_pause_table_from_migrate<
    H: LiveHarness,
>(
    harness: &H,
) {
    let namespace = random_name("pause_old");
    let config = harness
        .fresh_config()
        .with_table(&format!("{namespace}.outbox"));
    let store = live_migrated(harness, config.clone()).await;
    // What an older `migrate` left: no pause table.
    harness
        .execute(&format!("DROP TABLE {namespace}.outbox_relay_pause"))
        .await;

    assert_eq!(ok(store.paused().await, "paused"), None);
    ok(
        store.check().await,
        "check: nothing to migrate for relaying",
    );
    let e = store.pause("ops", "").await.expect_err("no pause table");
    assert_eq!(e.kind(), ErrorKind::Schema);
    let pause_table = harness.quoted_in(&namespace, "outbox_relay_pause");
    assert!(
        e.full_message().contains(&format!(
            "the pause table {pause_table} does not exist (the table was migrated by an older \
             relay): run `outbox-relay migrate` to make it"
        )),
        "{e}"
    );
    let e = store.resume().await.expect_err("no pause table");
    assert_eq!(e.kind(), ErrorKind::Schema);

    ok(store.migrate().await, "migrate again");
    // A relay that found no pause table does not ask again for a minute (each read would be
    // an error in the server's log): a pause made meanwhile elsewhere is seen after that.
    let operator = connected(harness, config).await;
    let elsewhere = ok(operator.pause("ops", "elsewhere").await, "pause");
    assert!(matches!(elsewhere, crate::model::Paused::Now(_)));
    assert_eq!(
        ok(store.paused().await, "paused"),
        None,
        "within the minute"
    );
    let lifted = ok(operator.resume().await, "resume");
    assert!(lifted.is_some(), "it was paused");
    assert!(matches!(
        ok(store.pause("ops", "upgrade").await, "pause"),
        crate::model::Paused::Now(_)
    ));
    assert_eq!(
        ok(store.paused().await, "paused").map(|p| p.reason),
        Some("upgrade".into())
    );
    harness.drop_namespace(&namespace).await;
}

/// Events enqueued in a writer's transaction commit and roll back with its business rows,
/// through the store's handle and through the free functions.
pub async fn enqueue_commits_and_rolls_back_with_the_business_row<H: LiveHarness>(harness: &H) {
    // A schema or database of its own, holding a table named `outbox`: the free functions use
    // that name.
    let namespace = random_name("outbox_ns");
    let config = harness
        .fresh_config()
        .with_table(&format!("{namespace}.outbox"));
    let store = live_migrated(harness, config).await;
    assert_eq!(harness.table(&store), format!("{namespace}.outbox"));
    let pool = harness.pool_in(&namespace).await;

    let mut tx = pool.begin().await;
    tx.insert_order("o-1").await;
    let one = harness
        .enqueue(&store, &mut tx, Writer::Free, &[small_event("o-1", 1)])
        .await
        .unwrap()[0];
    let many = harness
        .enqueue(
            &store,
            &mut tx,
            Writer::FreeMany,
            &[
                small_event("o-1", 2),
                small_event("o-1", 3),
                small_event("o-2", 1),
            ],
        )
        .await
        .unwrap();
    let none = harness
        .enqueue(&store, &mut tx, Writer::FreeMany, &[])
        .await;
    assert!(none.unwrap().is_empty());
    tx.commit().await;
    assert_eq!(many.len(), 3);
    assert!(
        one < many[0] && many.windows(2).all(|w| w[0] < w[1]),
        "{one} {many:?}"
    );

    let mut tx = pool.begin().await;
    tx.insert_order("o-3").await;
    harness
        .enqueue(
            &store,
            &mut tx,
            Writer::OutboxMany,
            &[small_event("o-3", 1), small_event("o-3", 2)],
        )
        .await
        .unwrap();
    tx.rollback().await;

    let mut session = live_session(harness, &store, "enqueue").await;
    let claimed = claim_all(&mut session).await.unwrap();
    let mut expected = vec![one];
    expected.extend(&many);
    assert_eq!(ids(&claimed), expected);
    assert_payload::<H>(&claimed[1].payload, r#"{"n": 2}"#);
    assert_eq!(pool.count_orders().await, 1);

    // A duplicate event id is refused, and the whole statement with it.
    let event_id = claimed[0].event_id;
    let error = enqueue_autocommit(
        harness,
        &store,
        &pool,
        Writer::OutboxMany,
        &[
            small_event("o-9", 1),
            small_event("o-9", 2).event_id(event_id),
        ],
    )
    .await
    .unwrap_err();
    assert_error(&error, ErrorKind::Other);
    assert!(!error.is_retryable());
    assert!(error.message().contains(H::DUPLICATE_KEY), "{error}");
    if let Some(max) = H::MAX_NAME_CHARS {
        // Values the columns cannot hold are refused before anything is sent.
        let long = small_event(&"x".repeat(max + 45), 1);
        let error = enqueue_autocommit(harness, &store, &pool, Writer::Free, &[long])
            .await
            .unwrap_err();
        assert_error(&error, ErrorKind::InvalidMessage);
    }
    assert_eq!(store.status().await.unwrap().pending, 4);

    close_live(session).await;
    drop(pool);
    harness.drop_namespace(&namespace).await;
}

/// `text` and `binary` tables keep every payload byte for byte, whichever writer wrote it (the
/// table's handle and the free functions, one row and many), and claimed events carry the
/// table's payload type: every byte value 0–255 in a `binary` table, JSON no database
/// rendered (key order, spaces, `1.0`, a trailing newline) and XML in a `text` table.
pub async fn text_and_binary_tables_keep_payloads_byte_for_byte<H: LiveHarness>(harness: &H) {
    let cases = [
        (
            PayloadType::Binary,
            vec![
                Payload::Binary((0..=255).collect()),
                Payload::Binary((0..=255).rev().collect()),
                Payload::Text("caf\u{e9}".into()),
                Payload::Json(r#"{"b": 2, "a": 1}"#.into()),
            ],
        ),
        (
            PayloadType::Text,
            vec![
                Payload::Text("{\"z\": 1.0,   \"a\" : [ 1 ,2 ]}\n".into()),
                Payload::Text("<order id='42'>caf\u{e9}</order>".into()),
                Payload::Binary(b"plain bytes, valid UTF-8".to_vec()),
                Payload::Json(r#"{"b":2,"a":1}"#.into()),
            ],
        ),
    ];
    for (payload_type, payloads) in cases {
        // A table named `outbox` of its own schema or database: the free functions use it.
        let namespace = random_name("outbox_pt");
        let config = harness
            .fresh_config()
            .with_table(&format!("{namespace}.outbox"))
            .with_payload_type(payload_type);
        let store = live_migrated(harness, config).await;
        ok(store.check().await, "check");
        let pool = harness.pool_in(&namespace).await;
        let events: Vec<NewEvent> = payloads
            .iter()
            .map(|payload| NewEvent::new("order", "o-1", "Changed", payload.clone()))
            .collect();
        let mut tx = pool.begin().await;
        let mut expected = Vec::new();
        for (writer, written) in [
            (Writer::Outbox, &events[..1]),
            (Writer::Free, &events[1..2]),
            (Writer::OutboxMany, &events[2..]),
            (Writer::FreeMany, &events[..]),
        ] {
            let result = harness.enqueue(&store, &mut tx, writer, written).await;
            let ids = result.unwrap_or_else(|e| panic!("{payload_type} table, {writer:?}: {e}"));
            assert_eq!(ids.len(), written.len());
            expected.extend(written.iter().map(|e| e.payload.as_bytes().to_vec()));
        }
        tx.commit().await;

        let mut session = live_session(harness, &store, "payloads").await;
        let claimed = claim_all(&mut session).await.unwrap();
        let payloads: Vec<Vec<u8>> = claimed.iter().map(|e| e.payload.clone()).collect();
        assert_eq!(payloads, expected, "{payload_type} table");
        assert!(claimed.iter().all(|e| e.payload_type == payload_type));
        // `find_events` with the payload gives the same bytes as the claim, newest first.
        let filter = crate::model::EventFilter {
            limit: 100,
            with_payload: true,
            ..Default::default()
        };
        let found = store.find_events(&filter).await.unwrap();
        let contents: Vec<(Vec<u8>, PayloadType)> = found
            .iter()
            .rev()
            .map(|e| {
                let content = e.content.clone().expect("the payload was asked for");
                (content.payload, content.payload_type)
            })
            .collect();
        let parked: Vec<Failure> = claimed.iter().map(|e| failure(e.id, None)).collect();
        let claimed: Vec<(Vec<u8>, PayloadType)> = claimed
            .iter()
            .map(|e| (e.payload.clone(), e.payload_type))
            .collect();
        assert_eq!(contents, claimed, "{payload_type} table: find_events");
        // Parked as dead, the dead list with the payload gives them too, oldest first.
        session.record_failures(&parked).await.unwrap();
        let filter = crate::model::DeadFilter {
            limit: 100,
            with_payload: true,
            ..Default::default()
        };
        let dead: Vec<(Vec<u8>, PayloadType)> = store
            .dead_list(&filter)
            .await
            .unwrap()
            .into_iter()
            .map(|e| {
                let content = e.content.expect("the payload was asked for");
                (content.payload, content.payload_type)
            })
            .collect();
        assert_eq!(dead, claimed, "{payload_type} table: dead_list");
        close_live(session).await;
        drop(pool);
        harness.drop_namespace(&namespace).await;
    }
}

/// A `text` or `json` table refuses bytes that are not UTF-8 when they are written: the writer
/// gets the error and nothing is inserted.
pub async fn a_text_table_refuses_bytes_that_are_not_utf8<H: LiveHarness>(harness: &H) {
    for payload_type in [PayloadType::Text, PayloadType::Json] {
        let config = harness.fresh_config().with_payload_type(payload_type);
        let store = live_migrated(harness, config).await;
        let bytes = NewEvent::new("order", "o-1", "Changed", (0..=255u8).collect::<Vec<_>>());
        let fine = small_event("o-1", 1);
        let error = store.insert(&[fine, bytes]).await.unwrap_err();
        assert!(!error.is_retryable(), "{payload_type}: {error}");
        assert_eq!(store.status().await.unwrap().pending, 0, "{payload_type}");
        harness.drop_table(&store).await;
    }
}

/// With `store.payload_type` set, a table of another type is refused by `migrate`, `check` and
/// sessions, with an error naming the key, both types and the statement that converts it;
/// unset, the table's type is used.
pub async fn a_configured_payload_type_must_match_the_table<H: LiveHarness>(harness: &H) {
    let config = harness.fresh_config();
    let store = live_migrated(harness, config.clone()).await;
    ok(store.check().await, "check");
    let mismatched = connected(harness, config.with_payload_type(PayloadType::Binary)).await;
    for (step, result) in [
        ("check", mismatched.check().await),
        ("migrate", mismatched.migrate().await),
        ("open_session", mismatched.open_session("r").await.map(drop)),
    ] {
        let error = result.expect_err(step);
        assert_error(&error, ErrorKind::Config);
        let text = error.to_string();
        for part in [
            "store.payload_type = \"binary\"",
            "`json` payloads",
            "ALTER TABLE",
        ] {
            assert!(text.contains(part), "{step}: {text}");
        }
    }
    harness.drop_table(&store).await;
}

/// A session whose connection is killed fails every later call with `LeaseLost` and owns
/// nothing; another session takes its shards over and finds every row.
pub async fn a_killed_session_loses_its_lease_and_its_shards_move<H: LiveHarness>(harness: &H) {
    let store = live_migrated(harness, harness.fresh_config().with_shards(8)).await;
    let inserted = store
        .insert(&[
            small_event("a", 1),
            small_event("b", 1),
            small_event("c", 1),
        ])
        .await
        .unwrap();
    let mut doomed = live_session(harness, &store, "doomed").await;
    assert_eq!(ids(&claim_all(&mut doomed).await.unwrap()), inserted);
    harness.kill(&store, &doomed, "doomed").await;

    // The next call notices, and so does every later one: the session is fenced off.
    let error = claim_all(&mut doomed).await.unwrap_err();
    assert_error(&error, ErrorKind::LeaseLost);
    let prefix = format!("lost the {} session holding shard locks: ", H::PRODUCT);
    assert!(error.message().starts_with(&prefix), "{error}");
    assert!(harness.is_poisoned(&doomed));
    assert!(doomed.owned().is_empty());
    let error = doomed
        .mark_published(&inserted, MarkMode::Delete)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::LeaseLost);
    assert_eq!(
        doomed.try_acquire(0).await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );
    assert_eq!(
        doomed.cluster().await.unwrap_err().kind(),
        ErrorKind::LeaseLost
    );

    // Another session takes every shard over (once the server has cleaned up the dead
    // connection) and finds every row still there.
    let mut heir = harness.open_session(&store, "heir").await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !heir.try_acquire(0).await.unwrap() {
        assert!(Instant::now() < deadline, "shard 0 was never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for shard in 1..8 {
        assert!(heir.try_acquire(shard).await.unwrap(), "shard {shard}");
    }
    assert_eq!(ids(&claim_all(&mut heir).await.unwrap()), inserted);
    assert_eq!(heir.cluster().await.unwrap().live_relays, 1);
    // The dead session no longer names an owner.
    let owners = store.shard_owners().await.unwrap();
    assert_eq!(owners.len(), 8);
    let heir_owner = harness.owner_prefix("heir");
    assert!(
        owners.iter().all(|o| o.owner.starts_with(&heir_owner)),
        "{owners:?}"
    );

    close_live(doomed).await;
    close_live(heir).await;
    harness.drop_table(&store).await;
}

/// A statement that hits the server's statement limit is a retryable timeout and leaves the
/// session usable.
pub async fn a_statement_timeout_is_a_timeout_and_keeps_the_session<H: LiveHarness>(harness: &H) {
    let config = harness
        .fresh_config()
        .with_session_timeout(Duration::from_millis(300));
    let store = live_migrated(harness, config).await;
    let inserted = store.insert(&[small_event("a", 1)]).await.unwrap();
    let mut session = live_session(harness, &store, "slow").await;

    let blocker = harness.block_table(&store).await;
    let started = Instant::now();
    let error = claim_all(&mut session).await.unwrap_err();
    assert_error(&error, ErrorKind::Timeout);
    assert!(error.is_retryable());
    assert!(error.message().contains("store.session_timeout"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    harness.unblock(blocker).await;

    assert!(!harness.is_poisoned(&session));
    assert_eq!(ids(&claim_all(&mut session).await.unwrap()), inserted);
    close_live(session).await;
    harness.drop_table(&store).await;
}

/// Relays migrating the same table at once all succeed; the shard count is the first one's.
pub async fn concurrent_migrations_all_succeed<H: LiveHarness>(harness: &H) {
    let config = harness.fresh_config().with_shards(16);
    let migrate = || async {
        let store = connected(harness, config.clone()).await;
        store.migrate().await.map(|()| store)
    };
    let (a, b, c) = tokio::join!(migrate(), migrate(), migrate());
    let mut stores = Vec::new();
    for store in [a, b, c] {
        stores.push(store.expect("every migrate succeeds"));
    }
    let store = &stores[0];
    store.check().await.unwrap();

    let (version, shard_count, applied) = harness.schema_row(store).await;
    assert_eq!(version, H::SCHEMA_VERSION);
    assert_eq!(shard_count, 16);
    assert!(applied);

    // The shard count comes from the database, whatever a later configuration says.
    let other = connected(harness, config.with_shards(64)).await;
    other.migrate().await.unwrap();
    let session = harness.open_session(&other, "count").await;
    assert_eq!(session.shard_count(), 16);
    close_live(session).await;
    harness.drop_table(store).await;
}

/// The table has the documented columns, types and indexes.
pub async fn the_table_has_the_documented_shape<H: LiveHarness>(harness: &H) {
    let store = live_migrated(harness, harness.fresh_config()).await;
    let columns = harness.columns(&store).await;
    let names: Vec<&str> = columns.iter().map(|c| c.0.as_str()).collect();
    let documented: Vec<&str> = H::COLUMNS.iter().map(|c| c.0).collect();
    assert_eq!(names, documented);
    let types: Vec<&str> = columns.iter().map(|c| c.1.as_str()).collect();
    let documented: Vec<&str> = H::COLUMNS.iter().map(|c| c.1).collect();
    assert_eq!(types, documented);
    harness.check_indexes(&store).await;
    harness.drop_table(&store).await;
}

/// Rows written with plain SQL get their defaults (event id, headers, created_at in UTC) and
/// are claimed like any other.
pub async fn rows_written_with_plain_sql_are_claimed_with_their_defaults<H: LiveHarness>(
    harness: &H,
) {
    let store = live_migrated(harness, harness.fresh_config()).await;
    harness.write_with_plain_sql(&store).await;

    let mut session = live_session(harness, &store, "plain-sql").await;
    let claimed = claim_all(&mut session).await.unwrap();
    assert_eq!(claimed.len(), 2);
    let first = &claimed[0];
    assert!(!first.event_id.is_nil());
    assert_ne!(first.event_id, claimed[1].event_id);
    assert_payload::<H>(&first.payload, r#"{"total": 99}"#);
    assert_eq!(first.headers["traceparent"], "00-abc-01");
    assert_eq!(first.headers["retries"], "3");
    assert_eq!(first.headers["flags"], r#"{"a":true}"#);
    assert!(claimed[1].headers.is_empty());
    assert_eq!(first.destination, None);
    assert_eq!(first.attempts, 0);
    assert_eq!(first.shard, claimed[1].shard);
    let skew = (Utc::now() - first.created_at).num_seconds().abs();
    assert!(skew < 60, "created_at {} is not UTC now", first.created_at);
    close_live(session).await;
    harness.drop_table(&store).await;
}

/// `migrate()` leaves alone a table of that name it did not create; `check()` and sessions
/// refuse it.
pub async fn migrate_refuses_a_table_it_did_not_create<H: LiveHarness>(harness: &H) {
    let config = harness.fresh_config();
    harness
        .execute(&format!("CREATE TABLE {} (id int)", config.table_setting()))
        .await;
    let store = connected(harness, config).await;
    let error = store.migrate().await.unwrap_err();
    assert_error(&error, ErrorKind::Schema);
    assert!(
        error.message().contains("not created by outbox-relay"),
        "{error}"
    );
    // `check()` (what `run` and `status` ask first) says the same: `migrate` is no way out.
    let error = store.check().await.unwrap_err();
    assert_error(&error, ErrorKind::Schema);
    assert!(
        error.message().contains("not created by outbox-relay"),
        "{error}"
    );
    let error = store.open_session("x").await.unwrap_err();
    assert_error(&error, ErrorKind::Schema);
    harness.drop_table(&store).await;
}

/// A migrated table dropped by hand (its bookkeeping row left behind) is created again by the
/// next `migrate()`, at the current schema version; `check()` and sessions accept it.
pub async fn migrate_creates_again_a_table_dropped_by_hand<H: LiveHarness>(harness: &H) {
    let config = harness.fresh_config();
    let table = config.table_setting();
    let store = connected(harness, config).await;
    ok(store.migrate().await, "migrate");
    harness.execute(&format!("DROP TABLE {table}")).await;
    let error = store.check().await.unwrap_err();
    assert_error(&error, ErrorKind::Schema);
    ok(store.migrate().await, "migrate after the table was dropped");
    ok(store.check().await, "check after the second migrate");
    let (version, _, applied) = harness.schema_row(&store).await;
    assert_eq!((version, applied), (H::SCHEMA_VERSION, true));
    let session = harness.open_session(&store, "relay-a").await;
    close_live(session).await;
    harness.drop_table(&store).await;
}

/// The test URL changed by `change`.
fn test_url_with<H: LiveHarness>(harness: &H, change: impl FnOnce(&mut url::Url)) -> String {
    let mut url = url::Url::parse(&harness.test_url()).expect("the test URL parses");
    change(&mut url);
    url.to_string()
}

/// Nothing listening: a retryable connection error naming host and port, on one line, without
/// the password.
pub async fn an_unreachable_server_is_a_connection_error_naming_the_host<H: LiveHarness>(
    harness: &H,
) {
    let url = test_url_with(harness, |url| {
        url.set_password(Some("hunter2")).unwrap();
        url.set_host(Some("127.0.0.1")).unwrap();
        url.set_port(Some(1)).unwrap();
    });
    let error = match harness.connect(H::Config::for_url(&url)).await {
        Err(error) => error,
        Ok(store) => panic!("connected to port 1: {store:?}"),
    };
    assert_error(&error, ErrorKind::Connection);
    assert!(error.is_retryable());
    // `(store.url)`, or with the TLS mode the URL sets: `(store.url, sslmode=require)`.
    let text = error.to_string();
    let head = format!("cannot reach {} at 127.0.0.1:1 (store.url", H::PRODUCT);
    assert!(
        text.starts_with(&head) && text.ends_with("): connection refused"),
        "{text}"
    );
    if !url.contains('?') {
        assert_eq!(text, format!("{head}): connection refused"));
    }
    assert!(!text.contains('\n') && !format!("{error:?}").contains("hunter2"));
}

/// A database that does not exist is a configuration error naming it.
pub async fn an_unknown_database_is_a_config_error_naming_it<H: LiveHarness>(harness: &H) {
    let url = test_url_with(harness, |url| {
        url.set_path("/no_such_database_for_outbox_tests")
    });
    let error = match harness.connect(H::Config::for_url(&url)).await {
        Err(error) => error,
        Ok(store) => panic!("connected to a database that does not exist: {store:?}"),
    };
    assert_error(&error, ErrorKind::Config);
    assert!(
        error
            .message()
            .starts_with("database \"no_such_database_for_outbox_tests\" does not exist"),
        "{error}"
    );
}

fn config_error<S: fmt::Debug>(result: Result<S>) -> Error {
    match result {
        Err(error) => error,
        Ok(store) => panic!("a bad configuration connected: {store:?}"),
    }
}

/// A bad table name or URL fails before connecting, naming its key.
pub async fn a_bad_configuration_fails_before_connecting<H: LiveHarness>(harness: &H) {
    let bad_table = harness.fresh_config().with_table("Bad Name");
    let error = config_error(harness.connect(bad_table).await);
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.table"), "{error}");
    let scheme = url::Url::parse(&harness.test_url())
        .expect("the test URL parses")
        .scheme()
        .to_owned();
    let bad_port = H::Config::for_url(&format!("{scheme}://db:notaport/x"));
    let error = config_error(harness.connect(bad_port).await);
    assert_eq!(error.kind(), ErrorKind::Config);
    assert!(error.message().starts_with("store.url"), "{error}");
    if H::TABLE_NEEDS_DATABASE {
        let url = test_url_with(harness, |url| url.set_path(""));
        let error = config_error(harness.connect(H::Config::for_url(&url)).await);
        assert_eq!(error.kind(), ErrorKind::Config);
        assert!(
            error.message().starts_with("store.table") && error.message().contains("database"),
            "{error}"
        );
    }
}

/// Neither `describe()`, nor `Debug` of the store or its settings, nor an error shows the
/// password.
pub async fn describe_and_debug_hide_the_password<H: LiveHarness>(harness: &H) {
    let url = test_url_with(harness, |url| {
        url.set_password(Some("wrong-password-never-shown"))
            .unwrap()
    });
    let config = H::Config::for_url(&url).with_table("app_x.outbox");
    let text = format!("{config:?}");
    assert!(!text.contains("wrong-password"), "{text}");
    match harness.connect(config).await {
        Err(error) if !H::ACCEPTS_ANY_PASSWORD => {
            // The server refuses the password: the error names the user, not the password.
            assert_error(&error, ErrorKind::Unauthorized);
            assert!(!error.to_string().contains("wrong-password"), "{error}");
        }
        Err(error) => panic!("{} is required for this test: {error}", H::PRODUCT),
        Ok(store) => {
            // A server that ignores passwords for this user.
            let text = format!("{} {store:?}", store.describe());
            assert!(!text.contains("wrong-password"), "{text}");
            assert!(
                store.describe().contains("table app_x.outbox"),
                "{}",
                store.describe()
            );
        }
    }
    let config = H::Config::for_url(&harness.test_url()).with_table("app_x.outbox");
    let store = connected(harness, config).await;
    assert!(
        store.describe().contains("table app_x.outbox"),
        "{}",
        store.describe()
    );
    assert_eq!(store.kind(), H::KIND);
}

/// Generate one `#[tokio::test]` per case of the inbox suite, each calling
/// `outboxkit_core::testkit::store_suite::inbox::<case>::<$harness>()`. The calling crate needs
/// `tokio` (macros, rt).
#[macro_export]
macro_rules! inbox_suite {
    ($harness:ty) => {
        $crate::inbox_suite!(@cases ($harness)
            the_same_event_delivered_twice_is_processed_once,
            a_rolled_back_transaction_leaves_no_mark,
            two_concurrent_consumers_process_an_event_once,
            purge_forgets_old_marks_only,
        );
    };
    (@cases ($harness:ty) $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                $crate::testkit::store_suite::inbox::$case::<$harness>().await;
            }
        )+
    };
}

/// The consumer-side inbox: an `(consumer, event_id)` mark taken in the consumer's own
/// transaction, so that an event delivered twice is processed once.
pub mod inbox {
    use std::time::Duration;

    use async_trait::async_trait;
    use uuid::Uuid;

    /// An inbox on its own table, with what it needs to run (a pool). Cheap to clone. Methods
    /// panic when the server fails them.
    #[async_trait]
    pub trait InboxHarness: Clone + Send + Sync + Sized + 'static {
        /// A consumer's open transaction.
        type Tx: Send;

        /// An inbox on a new table, migrated twice (migrating is idempotent).
        async fn fresh() -> Self;
        /// Begin a consumer's transaction.
        async fn begin(&self) -> Self::Tx;
        /// Commit it.
        async fn commit(&self, tx: Self::Tx);
        /// Roll it back.
        async fn rollback(&self, tx: Self::Tx);
        /// `try_mark_processed` in the transaction: `true` the first time.
        async fn try_mark_processed(&self, tx: &mut Self::Tx, consumer: &str, event: Uuid) -> bool;
        /// `try_mark_processed` on a connection outside any transaction.
        async fn mark_processed_now(&self, consumer: &str, event: Uuid) -> bool;
        /// `purge_processed`: how many marks were forgotten.
        async fn purge_processed(&self, older_than: Duration, limit: u32) -> u64;
        /// Drop the inbox table.
        async fn drop_table(&self);
    }

    /// The same event delivered twice is processed once per consumer.
    pub async fn the_same_event_delivered_twice_is_processed_once<H: InboxHarness>() {
        let inbox = H::fresh().await;
        let event = Uuid::now_v7();
        let mut effects = 0;
        for _delivery in 0..2 {
            let mut tx = inbox.begin().await;
            if inbox.try_mark_processed(&mut tx, "billing", event).await {
                effects += 1;
            }
            inbox.commit(tx).await;
        }
        assert_eq!(effects, 1);
        // Another consumer processes it on its own.
        let mut tx = inbox.begin().await;
        assert!(inbox.try_mark_processed(&mut tx, "shipping", event).await);
        inbox.commit(tx).await;
        inbox.drop_table().await;
    }

    /// A mark taken in a transaction that rolls back is gone with it.
    pub async fn a_rolled_back_transaction_leaves_no_mark<H: InboxHarness>() {
        let inbox = H::fresh().await;
        let event = Uuid::now_v7();
        let mut tx = inbox.begin().await;
        assert!(inbox.try_mark_processed(&mut tx, "billing", event).await);
        inbox.rollback(tx).await;
        let mut tx = inbox.begin().await;
        assert!(
            inbox.try_mark_processed(&mut tx, "billing", event).await,
            "processed again after the rollback"
        );
        inbox.commit(tx).await;
        inbox.drop_table().await;
    }

    async fn race<H: InboxHarness>(inbox: H, event: Uuid) -> bool {
        let mut tx = inbox.begin().await;
        let first = inbox.try_mark_processed(&mut tx, "billing", event).await;
        // Hold the transaction open a little, as a business effect would.
        tokio::time::sleep(Duration::from_millis(20)).await;
        inbox.commit(tx).await;
        first
    }

    /// Two consumers racing on one event: exactly one processes it.
    pub async fn two_concurrent_consumers_process_an_event_once<H: InboxHarness>() {
        let inbox = H::fresh().await;
        for _ in 0..20 {
            let event = Uuid::now_v7();
            let (a, b) = tokio::join!(
                tokio::spawn(race(inbox.clone(), event)),
                tokio::spawn(race(inbox.clone(), event))
            );
            let (a, b) = (a.unwrap(), b.unwrap());
            assert!(
                a ^ b,
                "exactly one consumer processes the event (got {a} and {b})"
            );
        }
        inbox.drop_table().await;
    }

    /// Purging forgets marks older than the retention only, at most `limit` per call.
    pub async fn purge_forgets_old_marks_only<H: InboxHarness>() {
        let inbox = H::fresh().await;
        for _ in 0..5 {
            inbox.mark_processed_now("billing", Uuid::now_v7()).await;
        }
        assert_eq!(
            inbox.purge_processed(Duration::from_secs(3600), 100).await,
            0
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(inbox.purge_processed(Duration::from_millis(10), 3).await, 3);
        assert_eq!(
            inbox.purge_processed(Duration::from_millis(10), 100).await,
            2
        );
        inbox.drop_table().await;
    }
}
