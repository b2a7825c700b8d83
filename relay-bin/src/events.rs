//! `outbox-relay events`: find events whatever their state, to answer "did this event go out,
//! and if not, why?" without SQL.

use clap::Args;
use outboxkit_core::{EventFilter, EventRecord, EventState, Retention, Store};
use uuid::Uuid;

use crate::cli::Failure;
use crate::out::{outln, utc_second};
use crate::status::explained;

/// `outbox-relay events ...`
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// The event with this event id.
    #[arg(long, value_name = "UUID")]
    event_id: Option<Uuid>,
    /// Only this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Only this aggregate.
    #[arg(long)]
    aggregate_id: Option<String>,
    /// Most events shown, the newest.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    limit: u32,
    /// Print JSON for machines.
    #[arg(long)]
    json: bool,
}

/// Run `events` on `store`, whose pipeline keeps published rows as `retention` says.
pub async fn run(
    store: &dyn Store,
    args: &EventsArgs,
    retention: &Retention,
) -> Result<(), Failure> {
    // One row more than shown tells whether there are more.
    let filter = EventFilter {
        event_id: args.event_id,
        aggregate_type: args.aggregate_type.clone(),
        aggregate_id: args.aggregate_id.clone(),
        limit: args.limit.saturating_add(1),
    };
    let mut rows = explained(store, store.find_events(&filter).await).await?;
    let more = rows.len() > args.limit as usize;
    rows.truncate(args.limit as usize);
    if args.json {
        let text = serde_json::to_string_pretty(&rows)
            .map_err(|e| Failure::runtime(format!("encoding events as JSON: {e}")))?;
        outln!("{text}");
        return Ok(());
    }
    if rows.is_empty() {
        outln!("{}", nothing_found(args, retention));
        return Ok(());
    }
    outln!(
        "{:>10}  {:<36}  {:<24}  {:<20}  {:<36}  {:>8}  last error",
        "id",
        "event_id",
        "aggregate",
        "event_type",
        "state (UTC)",
        "attempts"
    );
    for r in &rows {
        outln!(
            "{:>10}  {:<36}  {:<24}  {:<20}  {:<36}  {:>8}  {}",
            r.id,
            r.event_id,
            format!("{}/{}", r.aggregate_type, r.aggregate_id),
            r.event_type,
            state(r),
            r.attempts,
            r.last_error.as_deref().unwrap_or("").replace('\n', " ")
        );
    }
    if more {
        outln!(
            "(the newest {}; there are more: raise --limit to see them)",
            args.limit
        );
    }
    Ok(())
}

/// A row's state with its time: `published 2026-12-06 20:01:02`, `pending`, `retrying at ...`,
/// `dead since ...`.
fn state(r: &EventRecord) -> String {
    match (r.state, r.published_at, r.dead_at, r.next_attempt_at) {
        (EventState::Published, Some(at), _, _) => format!("published {}", utc_second(at)),
        (EventState::Dead, _, Some(at), _) => format!("dead since {}", utc_second(at)),
        (EventState::Pending, _, _, Some(at)) if r.attempts > 0 => {
            format!("retrying at {}", utc_second(at))
        }
        (EventState::Pending, ..) => "pending".to_owned(),
        (EventState::Published, ..) => "published".to_owned(),
        (EventState::Dead, ..) => "dead".to_owned(),
    }
}

/// What an empty answer means: a published event's row is deleted at once (retention
/// `"delete"`) or purged once the retention has passed.
fn nothing_found(args: &EventsArgs, retention: &Retention) -> String {
    let what = match args.event_id {
        Some(id) => format!("no event {id}"),
        None => "no event".to_owned(),
    };
    match retention {
        Retention::Delete => format!(
            "{what}: never written, rolled back, or published (relay.retention = \"delete\" \
             deletes each row once published)"
        ),
        Retention::Keep(kept) => format!(
            "{what}: never written, rolled back, or published more than {} ago \
             (relay.retention keeps published rows that long)",
            humantime::format_duration(*kept)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(event_id: Option<Uuid>) -> EventsArgs {
        EventsArgs {
            event_id,
            aggregate_type: None,
            aggregate_id: None,
            limit: 20,
            json: false,
        }
    }

    #[test]
    fn an_empty_answer_says_what_the_retention_leaves() {
        let id = Uuid::nil();
        assert_eq!(
            nothing_found(&args(Some(id)), &Retention::Delete),
            format!(
                "no event {id}: never written, rolled back, or published (relay.retention = \
                 \"delete\" deletes each row once published)"
            )
        );
        let week = Retention::Keep(std::time::Duration::from_secs(7 * 86_400));
        assert_eq!(
            nothing_found(&args(None), &week),
            "no event: never written, rolled back, or published more than 7days ago \
             (relay.retention keeps published rows that long)"
        );
    }
}
