//! `outbox-relay events`: find events whatever their state, to answer "did this event go out,
//! and if not, why?" without SQL.

use clap::Args;
use outboxkit_core::{EventFilter, EventRecord, EventState, Retention};
use serde::Serialize;
use uuid::Uuid;

use crate::cli::{failed_for, Failure, Target};
use crate::out::{outln, utc_second};
use crate::status::{counted, explained};

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

/// One table searched: its label (`billing`, `tenants/t7.outbox`), its store, and how its
/// pipeline keeps published rows.
pub(crate) struct Searched {
    pub(crate) target: Target,
    pub(crate) retention: Retention,
}

/// One row of the JSON answer: the event and the table it was found in.
#[derive(Serialize)]
struct Found<'a> {
    pipeline: &'a str,
    #[serde(flatten)]
    event: &'a EventRecord,
}

/// Run `events` on every table of the selection (one, with `--pipeline`), the newest `--limit`
/// of each. `failed` holds the pipelines whose tables could not even be listed. One table: its
/// rows, or what an empty answer means under its retention. Several: a heading per table that
/// has rows; a table that cannot be searched has its line at the end (on standard error with
/// `--json`) and the command exits with its error's code, after searching the others.
pub(crate) async fn run(
    searched: Vec<Searched>,
    mut failed: Vec<(String, Failure)>,
    args: &EventsArgs,
) -> Result<(), Failure> {
    // One row more than shown tells whether there are more.
    let filter = EventFilter {
        event_id: args.event_id,
        aggregate_type: args.aggregate_type.clone(),
        aggregate_id: args.aggregate_id.clone(),
        limit: args.limit.saturating_add(1),
    };
    let several = searched.len() + failed.len() > 1;
    if searched.is_empty() && failed.is_empty() {
        return Err(Failure::runtime(
            "events: the pipelines selected relay no table now (their patterns match none)",
        ));
    }
    let tables = searched.len();
    let mut found: Vec<(String, Vec<EventRecord>, bool)> = Vec::new();
    let mut retention = None;
    for Searched {
        target,
        retention: kept,
    } in searched
    {
        let rows = match target.store {
            Ok(store) => explained(store.as_ref(), store.find_events(&filter).await).await,
            Err(e) => Err(e),
        };
        match rows {
            Ok(mut rows) => {
                let more = rows.len() > args.limit as usize;
                rows.truncate(args.limit as usize);
                retention = Some(kept);
                found.push((target.label, rows, more));
            }
            Err(e) if !several => return Err(e.into()),
            Err(e) => failed.push((target.label, e.into())),
        }
    }
    if args.json {
        let rows: Vec<Found<'_>> = found
            .iter()
            .flat_map(|(label, rows, _)| {
                rows.iter().map(|event| Found {
                    pipeline: label,
                    event,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&rows)
            .map_err(|e| Failure::runtime(format!("encoding events as JSON: {e}")))?;
        outln!("{text}");
    } else if found.iter().all(|(_, rows, _)| rows.is_empty()) {
        match (several, retention) {
            (false, Some(retention)) => outln!("{}", nothing_found(args, &retention)),
            _ => outln!("{}", nothing_found_in(args, tables)),
        }
    } else {
        for (label, rows, more) in found.iter().filter(|(_, rows, _)| !rows.is_empty()) {
            if several {
                outln!("-- pipeline {label}");
            }
            print_rows(rows, *more, args.limit);
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    for (label, failure) in &failed {
        // With --json, standard output holds the document alone.
        let line = format!("pipeline {label}: not searched: {}", failure.message);
        if args.json {
            eprintln!("{line}");
        } else {
            outln!("{line}");
        }
    }
    let failed: Vec<(String, u8)> = failed.into_iter().map(|(l, f)| (l, f.code)).collect();
    Err(failed_for("events", &failed))
}

/// The rows as a table, and a note when `--limit` left some out.
fn print_rows(rows: &[EventRecord], more: bool, limit: u32) {
    outln!(
        "{:>10}  {:<36}  {:<24}  {:<20}  {:<36}  {:>8}  last error",
        "id",
        "event_id",
        "aggregate",
        "event_type",
        "state (UTC)",
        "attempts"
    );
    for r in rows {
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
        outln!("(the newest {limit}; there are more: raise --limit to see them)");
    }
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

/// `no event <id>`, or `no event` without `--event-id`.
fn no_event(args: &EventsArgs) -> String {
    match args.event_id {
        Some(id) => format!("no event {id}"),
        None => "no event".to_owned(),
    }
}

/// What an empty answer means: a published event's row is deleted at once (retention
/// `"delete"`) or purged once the retention has passed.
fn nothing_found(args: &EventsArgs, retention: &Retention) -> String {
    let what = no_event(args);
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

/// What an empty answer from several tables means.
fn nothing_found_in(args: &EventsArgs, tables: usize) -> String {
    format!(
        "{} in the {} searched: never written, rolled back, or published (a published event's \
         row is deleted at once with relay.retention = \"delete\", or purged once the \
         retention has passed)",
        no_event(args),
        counted(tables, "table")
    )
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
        assert!(nothing_found_in(&args(Some(id)), 1)
            .starts_with(&format!("no event {id} in the 1 table searched: ")),);
    }
}
