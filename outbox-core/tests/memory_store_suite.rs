//! The store conformance suite on the engine's test double, `MemoryStore`: the engine's tests
//! only mean something if their store keeps the same contract as the real ones.
#![cfg(feature = "testkit")]

use async_trait::async_trait;
use outboxkit_core::memory::MemoryStore;
use outboxkit_core::testkit::store_suite::StoreFactory;
use outboxkit_core::Store;

/// Each case gets a store of its own, not migrated, with 4 shards (the suite's minimum).
struct MemoryFactory;

#[async_trait]
impl StoreFactory for MemoryFactory {
    async fn fresh_store(&self) -> Box<dyn Store> {
        Box::new(MemoryStore::unmigrated(4))
    }
}

outboxkit_core::store_suite!(MemoryFactory);
