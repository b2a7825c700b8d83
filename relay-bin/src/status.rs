//! `outbox-relay status`.

use std::collections::BTreeMap;

use outboxkit_core::{
    BacklogStatus, Error, ErrorKind, HeldBack, Pause, RelayConfig, ShardOwner, Store,
};
use serde::Serialize;

use crate::cli::Failure;
use crate::out::{outln, printable};

#[derive(Debug, Serialize)]
struct StatusReport {
    store: String,
    #[serde(flatten)]
    backlog: BacklogStatus,
    shards_owned: usize,
    owners: BTreeMap<String, Vec<i32>>,
    /// Aggregates waiting for a retry (the first [`HELD_BACK_LISTED`]).
    held_back: Vec<HeldBack>,
    /// When the oldest published event `relay.retention` kept was published: how far back
    /// `replay` reaches (`null`: none kept).
    oldest_kept_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What the store's check finds wrong with the table (a dropped replication slot, a
    /// schema `migrate` must bring up to date): what `run` would stop with.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// `relay.max_events_per_second`, when set: the pace each relay drains the table at.
    #[serde(skip_serializing_if = "Option::is_none")]
    max_events_per_second: Option<u32>,
    /// The operator's pause of the table (`outbox-relay pause`; `null`: not paused).
    paused: Option<Pause>,
}

/// How many held-back aggregates `status` lists, those waiting longest.
const HELD_BACK_LISTED: u32 = 20;

/// Print backlog figures and shard owners, as text or JSON, and what the store's check finds
/// wrong with the table, if anything. `dead_list` is the command that lists its dead events;
/// `relay` the pipeline's engine settings (the pace it drains at, when limited).
pub async fn print(
    store: &dyn Store,
    json: bool,
    dead_list: &str,
    relay: &RelayConfig,
) -> Result<(), Failure> {
    let (backlog, problem) = backlog(store).await?;
    let owners: Vec<ShardOwner> = explained(store, store.shard_owners().await).await?;
    let mut by_owner: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for o in &owners {
        by_owner.entry(o.owner.clone()).or_default().push(o.shard);
    }
    let held_back = if backlog.held_back_aggregates > 0 {
        explained(store, store.held_back(HELD_BACK_LISTED).await).await?
    } else {
        Vec::new()
    };
    let oldest_kept_at = explained(store, store.oldest_kept().await).await?;
    let paused = explained(store, store.paused().await).await?;
    let report = StatusReport {
        store: store.describe(),
        backlog,
        shards_owned: owners.len(),
        owners: by_owner,
        held_back,
        oldest_kept_at,
        problem: problem.as_ref().map(Error::full_message),
        max_events_per_second: relay.max_events_per_second,
        paused,
    };
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::runtime(format!("encoding status as JSON: {e}")))?;
        outln!("{text}");
        return Ok(());
    }
    let b = &report.backlog;
    outln!("store                {}", report.store);
    if let Some(pause) = &report.paused {
        outln!(
            "PAUSED               {}: no relay publishes until `{} resume`",
            crate::pause::who(pause),
            outboxkit_core::command::name()
        );
    }
    outln!("pending              {}", b.pending);
    if let Some(rate) = report.max_events_per_second {
        outln!(
            "pace                 at most {rate} events/s per relay (relay.max_events_per_second)"
        );
    }
    if b.pending == 0 {
        outln!("oldest pending age   none pending");
    } else {
        outln!("oldest pending age   {:.3}s", b.oldest_pending_age_secs);
    }
    outln!(
        "retrying             {} in {}",
        counted(b.retrying, "event"),
        counted(b.held_back_aggregates, "held-back aggregate")
    );
    for h in &report.held_back {
        let when = h
            .next_attempt_at
            .map(|t| format!("next try {} UTC", crate::out::utc_second(t)))
            .unwrap_or_else(|| "due now".to_owned());
        outln!(
            "  held back {}/{}: row {} after {}, {when}, {} waiting behind; {}",
            printable(&h.aggregate_type),
            printable(&h.aggregate_id),
            h.id,
            counted(h.attempts, "attempt"),
            h.waiting_behind,
            printable(h.last_error.as_deref().unwrap_or(""))
        );
    }
    // Two queries: only a full list can leave some out (the count may be a moment older).
    let listed = report.held_back.len();
    let unlisted = b.held_back_aggregates - listed as i64;
    if listed == HELD_BACK_LISTED as usize && unlisted > 0 {
        outln!(
            "  and {} (the {HELD_BACK_LISTED} waiting longest are listed)",
            counted(unlisted, "more held-back aggregate")
        );
    }
    outln!("dead                 {} (see `{dead_list}`)", b.dead);
    match report.oldest_kept_at {
        Some(at) => outln!(
            "kept                 published since {} UTC, {} ago (what `{} replay` can publish \
             again)",
            crate::out::utc_second(at),
            ago(at),
            outboxkit_core::command::name()
        ),
        None => outln!("kept                 none"),
    }
    if let Some(slot) = &b.slot {
        // Log-based capture: the slot is the one unit of ownership.
        outln!(
            "replication slot     {}: {} behind the server's log{}{}",
            slot.name,
            human_bytes(slot.lag_bytes),
            match (slot.unsettled, slot.lag_secs) {
                (Some(n), Some(s)) => format!(
                    "; the reader holds {}, the oldest {s:.3}s old",
                    counted(n, "event")
                ),
                _ => String::new(),
            },
            match slot.wal_status.as_deref() {
                Some("lost") =>
                    ", LOST: the server removed log it needs (see docs/OPERATIONS.md)".to_owned(),
                Some(status) => format!(", wal_status {status}"),
                None => String::new(),
            }
        );
        match &slot.reader {
            Some(reader) => outln!("  read by {reader}"),
            None => outln!("  read by nobody (no relay is running)"),
        }
    } else if report.owners.is_empty() {
        outln!("shard owners         none (no relay is running)");
    } else {
        outln!(
            "shard owners         {} owned by {}",
            counted(report.shards_owned, "shard"),
            counted(report.owners.len(), "relay")
        );
        for (owner, shards) in &report.owners {
            outln!("  {owner:<40} {}", counted(shards.len(), "shard"));
        }
    }
    if let Some(problem) = &report.problem {
        outln!("problem              {problem}");
    }
    Ok(())
}

/// The backlog figures of `store`, and what its check finds wrong with the table when they
/// could be read: a replication slot that was dropped leaves the table's figures readable, and
/// the runbook needs them. When they cannot be read, the check's explanation (see
/// [`explained`]).
async fn backlog(store: &dyn Store) -> Result<(BacklogStatus, Option<Error>), Error> {
    let backlog = explained(store, store.status().await).await?;
    Ok((backlog, store.check().await.err()))
}

/// `result` of a command's query on `store`, or when it failed and the store's own check
/// finds the table missing or not the relay's, or privileges missing, what that check says
/// (`table app.outbox exists but was not created by outbox-relay ...`, `user "relay" lacks
/// privileges ...: GRANT ...`) rather than the query's SQL error. The check runs
/// only after a failure: `status` must still work when, say, a replication slot is gone.
pub(crate) async fn explained<T>(store: &dyn Store, result: Result<T, Error>) -> Result<T, Error> {
    let Err(failed) = result else {
        return result;
    };
    match store.check().await {
        Err(e) if matches!(e.kind(), ErrorKind::Schema | ErrorKind::Unauthorized) => Err(e),
        _ => Err(failed),
    }
}

/// How long ago `at` was, to the second: `6days 23h 59m 2s`.
fn ago(at: chrono::DateTime<chrono::Utc>) -> String {
    let secs = (chrono::Utc::now() - at).num_seconds().max(0);
    humantime::format_duration(std::time::Duration::from_secs(secs as u64)).to_string()
}

/// `n` and `noun`, plural unless `n` is 1: "1 relay", "2 relays".
pub(crate) fn counted<N: TryInto<i64> + Copy + std::fmt::Display>(n: N, noun: &str) -> String {
    let one = n.try_into().is_ok_and(|n| n == 1);
    format!("{n} {noun}{}", if one { "" } else { "s" })
}

/// One pipeline's line of `status` across pipelines.
#[derive(Debug, Serialize)]
struct PipelineLine {
    store: Option<String>,
    #[serde(flatten)]
    backlog: Option<BacklogStatus>,
    /// How many relays own shards (the single report's `owners` maps each to its shards).
    relays: Option<usize>,
    /// With the figures, as in the single report: when the oldest kept event was published
    /// (`null`: none kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    oldest_kept_at: Option<Option<chrono::DateTime<chrono::Utc>>>,
    /// With the figures, as in the single report: the operator's pause of the table (`null`:
    /// not paused).
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<Option<Pause>>,
    /// Why the figures are missing (the store could not be reached).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Beside the figures, what the store's check finds wrong with the table (a dropped
    /// replication slot, say).
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
    /// Why there are no figures, when nothing failed (a pattern that matches no table).
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

/// `status` of several pipelines: one line each (pending, oldest pending age, dead, relays
/// owning shards, when the oldest kept event was published), or JSON `{"pipelines": {name: {...}}}`. A pipeline whose store cannot be
/// reached gets its error on its line; the command then fails (exit 1) after printing all. A
/// pattern pipeline without a table of its own (`unmatched`: its name, and why) gets a line
/// that says so.
pub async fn print_each(
    targets: Vec<crate::cli::Target>,
    unmatched: &[(String, String)],
    json: bool,
) -> Result<(), Failure> {
    let mut lines: BTreeMap<String, PipelineLine> = BTreeMap::new();
    for (name, why) in unmatched {
        let line = PipelineLine {
            store: None,
            backlog: None,
            relays: None,
            oldest_kept_at: None,
            paused: None,
            error: None,
            problem: None,
            note: Some(why.clone()),
        };
        lines.insert(name.clone(), line);
    }
    let mut failed = Vec::new();
    for target in targets {
        let name = target.label.as_str();
        let store = target.store;
        let figures = async {
            let store = store?;
            // A table whose figures cannot be read (a discovered one never migrated, say) gets
            // its check's explanation instead; one that can be read gets its problem beside them.
            let (backlog, problem) = backlog(store.as_ref()).await?;
            let owners: Vec<ShardOwner> =
                explained(store.as_ref(), store.shard_owners().await).await?;
            let relays = owners
                .iter()
                .map(|o| o.owner.as_str())
                .collect::<std::collections::BTreeSet<_>>()
                .len();
            let kept = explained(store.as_ref(), store.oldest_kept().await).await?;
            let paused = explained(store.as_ref(), store.paused().await).await?;
            let store = store.describe();
            Ok::<_, outboxkit_core::Error>((store, backlog, relays, kept, paused, problem))
        };
        let line = match figures.await {
            Ok((store, backlog, relays, kept, paused, problem)) => PipelineLine {
                store: Some(store),
                backlog: Some(backlog),
                relays: Some(relays),
                oldest_kept_at: Some(kept),
                paused: Some(paused),
                error: None,
                problem: problem.as_ref().map(Error::full_message),
                note: None,
            },
            Err(e) => {
                failed.push(name.to_owned());
                PipelineLine {
                    store: None,
                    backlog: None,
                    relays: None,
                    oldest_kept_at: None,
                    paused: None,
                    error: Some(e.full_message()),
                    problem: None,
                    note: None,
                }
            }
        };
        lines.insert(name.to_owned(), line);
    }
    if json {
        let text = serde_json::to_string_pretty(&serde_json::json!({ "pipelines": lines }))
            .map_err(|e| Failure::runtime(format!("encoding status as JSON: {e}")))?;
        outln!("{text}");
    } else {
        let width = lines.keys().map(String::len).max().unwrap_or(0).max(8);
        outln!(
            "{:<width$}  {:>10}  {:>12}  {:>8}  {:>6}  {}",
            "pipeline",
            "pending",
            "oldest age",
            "dead",
            "relays",
            "kept since (UTC)"
        );
        for (name, line) in &lines {
            match (&line.backlog, &line.error) {
                (None, None) => outln!("{name:<width$}  {}", line.note.as_deref().unwrap_or("")),
                (Some(b), _) => {
                    // When the oldest event `replay` can publish again was published.
                    let kept = match line.oldest_kept_at.flatten() {
                        Some(at) => crate::out::utc_second(at).to_string(),
                        None => "none".to_owned(),
                    };
                    outln!(
                        "{name:<width$}  {:>10}  {:>11.3}s  {:>8}  {:>6}  {kept}",
                        b.pending,
                        b.oldest_pending_age_secs,
                        b.dead,
                        line.relays.unwrap_or(0)
                    );
                    if let Some(pause) = line.paused.as_ref().and_then(Option::as_ref) {
                        outln!("{:<width$}  PAUSED {}", "", crate::pause::who(pause));
                    }
                    if let Some(problem) = &line.problem {
                        outln!("{:<width$}  problem: {problem}", "");
                    }
                }
                (None, error) => outln!(
                    "{name:<width$}  unavailable: {}",
                    error.as_deref().unwrap_or("")
                ),
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::runtime(format!(
            "status of pipeline(s) {} unavailable (see above)",
            failed.join(", ")
        )))
    }
}

/// `1.5 MiB` style.
fn human_bytes(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
