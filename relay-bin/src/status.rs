//! `outbox-relay status`.

use std::collections::BTreeMap;

use outboxkit_core::{BacklogStatus, HeldBack, ShardOwner, Store};
use serde::Serialize;

use crate::cli::Failure;

#[derive(Debug, Serialize)]
struct StatusReport {
    store: String,
    #[serde(flatten)]
    backlog: BacklogStatus,
    shards_owned: usize,
    owners: BTreeMap<String, Vec<i32>>,
    /// Aggregates waiting for a retry (the first 20).
    held_back: Vec<HeldBack>,
}

/// Print backlog figures and shard owners, as text or JSON.
pub async fn print(store: &dyn Store, json: bool) -> Result<(), Failure> {
    let backlog = store.status().await?;
    let owners: Vec<ShardOwner> = store.shard_owners().await?;
    let mut by_owner: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for o in &owners {
        by_owner.entry(o.owner.clone()).or_default().push(o.shard);
    }
    let held_back = if backlog.held_back_aggregates > 0 {
        store.held_back(20).await?
    } else {
        Vec::new()
    };
    let report = StatusReport {
        store: store.describe(),
        backlog,
        shards_owned: owners.len(),
        owners: by_owner,
        held_back,
    };
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::runtime(format!("encoding status as JSON: {e}")))?;
        println!("{text}");
        return Ok(());
    }
    let b = &report.backlog;
    println!("store                {}", report.store);
    println!("pending              {}", b.pending);
    println!("oldest pending age   {:.3}s", b.oldest_pending_age_secs);
    println!(
        "retrying             {} events in {} held-back aggregates",
        b.retrying, b.held_back_aggregates
    );
    for h in &report.held_back {
        let when = h
            .next_attempt_at
            .map(|t| format!("next try {}", t.format("%H:%M:%S")))
            .unwrap_or_else(|| "due now".to_owned());
        println!(
            "  held back {}/{}: row {} after {} attempts, {when}, {} waiting behind; {}",
            h.aggregate_type,
            h.aggregate_id,
            h.id,
            h.attempts,
            h.waiting_behind,
            h.last_error.as_deref().unwrap_or("")
        );
    }
    println!(
        "dead                 {} (see `outbox-relay dead list`)",
        b.dead
    );
    if report.owners.is_empty() {
        println!("shard owners         none (no relay is running)");
    } else {
        println!(
            "shard owners         {} shards owned by {} relays",
            report.shards_owned,
            report.owners.len()
        );
        for (owner, shards) in &report.owners {
            println!("  {owner:<40} {} shards", shards.len());
        }
    }
    Ok(())
}
