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

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use serde_json::json;
use uuid::Uuid;

use crate::error::{ErrorKind, Result};
use crate::model::{NewEvent, OutboxEvent};
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
#[macro_export]
macro_rules! store_suite {
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
            status_reports_the_backlog,
            shard_owners_name_the_relay,
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
            serde_json::from_str(&row.payload).expect("payload is JSON text");
        assert_eq!(payload, written.payload);
        assert_eq!(row.payload_bytes(), row.payload.as_bytes());
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
    let store = migrated_store(factory).await;
    let events: Vec<NewEvent> = (0..20).map(|i| event(&format!("agg-{i}"), 0)).collect();
    ok(store.insert(&events).await, "insert");

    let mut session = open_with_all_shards(store.as_ref(), "suite-no-shard").await;
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
    let store = migrated_store(factory).await;
    let events: Vec<NewEvent> = (0..10).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let ids = ok(store.insert(&events).await, "insert");
    let mut session = open_with_all_shards(store.as_ref(), "suite-limit").await;

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
    let store = migrated_store(factory).await;
    let events: Vec<NewEvent> = (0..5).map(|i| event(&format!("agg-{i}"), 0)).collect();
    let ids = ok(store.insert(&events).await, "insert");
    let mut session = open_with_all_shards(store.as_ref(), "suite-mark").await;
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
    assert_eq!(claim_ids(session.as_mut(), false).await, ids[4..]);
    let status = ok(store.status().await, "status");
    assert_eq!((status.pending, status.dead), (1, 0));
    close(session).await;
    factory.cleanup().await;
}

/// A failed row waits until due and holds back the later rows of its aggregate only; it comes
/// back with `attempts = 1`.
pub async fn retry_holds_the_row_and_its_aggregate_only(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    let ids = ok(
        store
            .insert(&[event("A", 1), event("B", 1), event("A", 2), event("B", 2)])
            .await,
        "insert",
    );
    let (a1, b1, a2, b2) = (ids[0], ids[1], ids[2], ids[3]);
    let mut session = open_with_all_shards(store.as_ref(), "suite-retry").await;
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
    let store = migrated_store(factory).await;
    let ids = ok(
        store
            .insert(&[event("A", 1), event("A", 2), event("B", 1)])
            .await,
        "insert",
    );
    let (a1, a2, b1) = (ids[0], ids[1], ids[2]);
    let mut session = open_with_all_shards(store.as_ref(), "suite-dead").await;
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

/// Backlog figures: pending, age of the oldest pending row, dead, aggregates held back, rows
/// retrying.
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

    ok(
        session.mark_published(&[ids[1]], MarkMode::Delete).await,
        "mark",
    );
    let status = ok(store.status().await, "status");
    assert_eq!(
        (status.pending, status.retrying, status.held_back_aggregates),
        (4, 1, 1)
    );
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

/// All events of one aggregate share one shard; many aggregates use several shards.
pub async fn aggregates_keep_one_shard_and_spread(factory: &dyn StoreFactory) {
    let store = migrated_store(factory).await;
    let events: Vec<NewEvent> = (0..3)
        .flat_map(|n| (0..200).map(move |a| event(&format!("customer-{a}"), n)))
        .collect();
    ok(store.insert(&events).await, "insert");
    let mut session = open_with_all_shards(store.as_ref(), "suite-shards").await;
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
