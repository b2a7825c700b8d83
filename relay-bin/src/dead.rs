//! `outbox-relay dead list | retry | discard`: the operator's handle on parked events.

use clap::{Args, Subcommand};
use outboxkit_core::{DeadEvent, DeadFilter, DeadSelection, EventContent, Store};

use crate::cli::Failure;
use crate::events::{content_lines, json_rows};
use crate::out::{outln, printable};
use crate::status::{counted, explained};

/// `outbox-relay dead ...`
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead events, oldest first: id, event, attempts, last error, when.
    List {
        /// Only this aggregate type.
        #[arg(long)]
        aggregate_type: Option<String>,
        /// Only this aggregate.
        #[arg(long)]
        aggregate_id: Option<String>,
        /// Most rows shown.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// Also show each event's payload and headers, what the broker refused (binary
        /// payloads in base64).
        #[arg(long)]
        payload: bool,
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
    /// Send dead events back to pending (attempts reset). With polling each keeps its place in
    /// its aggregate's order; with log-based capture each is written again (same event id),
    /// after what its aggregate committed since. An id that is not a dead event is reported
    /// and the command exits 1 (after retrying the others).
    Retry {
        #[command(flatten)]
        chosen: Chosen,
    },
    /// Delete dead events for good. An id that is not a dead event is reported and the command
    /// exits 1 (after discarding the others).
    Discard {
        #[command(flatten)]
        chosen: Chosen,
        /// Confirm: without it nothing is deleted.
        #[arg(long)]
        yes: bool,
    },
}

/// The dead events `retry` and `discard` work on: ids, or `--all` (of one aggregate).
#[derive(Debug, Args)]
pub struct Chosen {
    /// Row ids (as `dead list` shows them).
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    ids: Vec<i64>,
    /// Every dead event (of one aggregate with --aggregate-id).
    #[arg(long)]
    all: bool,
    /// With --all: only this aggregate.
    // `conflicts_with` too: `requires` alone lets it pass beside ids, `all` having a default.
    #[arg(long, requires = "all", conflicts_with = "ids")]
    aggregate_id: Option<String>,
}

impl Chosen {
    /// The ids given, each once (`dead retry 4 4` asks for one event).
    fn ids(&self) -> Vec<i64> {
        let mut ids = self.ids.clone();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// What the command selects.
    fn selection(&self) -> DeadSelection {
        if self.all {
            DeadSelection::All {
                aggregate_id: self.aggregate_id.clone(),
            }
        } else {
            DeadSelection::Ids(self.ids())
        }
    }
}

/// Run a `dead` subcommand.
/// `dead_list` is the command that lists them, as the operator would type it for this store
/// (`outbox-relay --pipeline billing dead list` when there are several).
pub async fn run(store: &dyn Store, command: &DeadCommand, dead_list: &str) -> Result<(), Failure> {
    match command {
        DeadCommand::List {
            aggregate_type,
            aggregate_id,
            limit,
            payload,
            json,
        } => {
            // One row more than shown tells whether there are more.
            let filter = DeadFilter {
                aggregate_type: aggregate_type.clone(),
                aggregate_id: aggregate_id.clone(),
                limit: limit.saturating_add(1),
                with_payload: *payload,
            };
            let mut rows = explained(store, store.dead_list(&filter).await).await?;
            let more = rows.len() > *limit as usize;
            rows.truncate(*limit as usize);
            if *json {
                let rows: Vec<(DeadEvent, Option<EventContent>)> = rows
                    .into_iter()
                    .map(|mut event| {
                        let content = event.content.take();
                        (event, content)
                    })
                    .collect();
                let text = json_rows(&rows)
                    .map_err(|e| Failure::runtime(format!("encoding dead events as JSON: {e}")))?;
                outln!("{text}");
                return Ok(());
            }
            if rows.is_empty() {
                outln!("no dead events");
                return Ok(());
            }
            outln!(
                "{:>10}  {:<36}  {:<24}  {:<20}  {:>8}  {:<20}  last error",
                "id",
                "event_id",
                "aggregate",
                "event_type",
                "attempts",
                "dead since (UTC)"
            );
            for r in &rows {
                outln!(
                    "{:>10}  {:<36}  {:<24}  {:<20}  {:>8}  {:<20}  {}",
                    r.id,
                    r.event_id,
                    printable(&format!("{}/{}", r.aggregate_type, r.aggregate_id)),
                    printable(&r.event_type),
                    r.attempts,
                    crate::out::utc_second(r.dead_at),
                    printable(r.last_error.as_deref().unwrap_or(""))
                );
                for line in r.content.iter().flat_map(content_lines) {
                    outln!("{:>10}  {line}", "");
                }
            }
            if more {
                outln!("(the first {limit}; there are more: raise --limit to see them)");
            }
            Ok(())
        }
        DeadCommand::Retry { chosen } => {
            let selection = chosen.selection();
            let n = explained(store, store.dead_retry(&selection).await).await?;
            // Where a retried event goes in its aggregate's order depends on the capture
            // (`dead retry --help` says it): not said here.
            match n {
                0 => outln!("0 dead events back to pending"),
                1 => outln!("1 dead event back to pending: the relay publishes it again"),
                n => outln!("{n} dead events back to pending: the relay publishes them again"),
            }
            all_found(n, &selection, store, dead_list)
        }
        DeadCommand::Discard { chosen, yes } => {
            let selection = chosen.selection();
            if !yes {
                let what = match &selection {
                    DeadSelection::All {
                        aggregate_id: Some(aggregate),
                    } => format!(
                        "every dead event of aggregate {aggregate} (`{dead_list} --aggregate-id \
                         {aggregate}` shows them)"
                    ),
                    DeadSelection::All { aggregate_id: None } => {
                        format!("every dead event (`{dead_list}` shows them)")
                    }
                    DeadSelection::Ids(ids) => counted(ids.len(), "event"),
                };
                return Err(Failure::config(format!(
                    "dead discard deletes {what} for good: add --yes to confirm"
                )));
            }
            let n = explained(store, store.dead_discard(&selection).await).await?;
            outln!("{} discarded", counted(n, "dead event"));
            all_found(n, &selection, store, dead_list)
        }
    }
}

/// An error (exit code 1) when fewer than the ids selected were dead events: an id mistyped,
/// or an event retried or discarded already, must not pass as done (`--all` takes what there
/// is).
fn all_found(
    done: u64,
    selection: &DeadSelection,
    store: &dyn Store,
    dead_list: &str,
) -> Result<(), Failure> {
    let DeadSelection::Ids(ids) = selection else {
        return Ok(());
    };
    let missed = (ids.len() as u64).saturating_sub(done);
    if missed == 0 {
        return Ok(());
    }
    let which = match ids.as_slice() {
        [id] => format!("id {id} is"),
        _ => format!("{missed} of the {} ids given are", ids.len()),
    };
    Err(Failure::runtime(format!(
        "{which} not a dead event of {}: no such row, or not dead (retried or discarded already, \
         or never dead); `{dead_list}` shows the dead ones",
        store.describe()
    )))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::Cli;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from([&["outbox-relay", "dead"], args].concat())
    }

    /// `--aggregate-id` narrows `--all`; beside ids it would be ignored, so it is refused, as
    /// are ids beside `--all` and a command with neither.
    #[test]
    fn the_aggregate_goes_with_all_and_ids_without_it() {
        for command in ["retry", "discard"] {
            for good in [
                &[command, "4", "7"][..],
                &[command, "--all"],
                &[command, "--all", "--aggregate-id", "A"],
            ] {
                assert!(parse(good).is_ok(), "{good:?}");
            }
            for bad in [
                &[command][..],
                &[command, "4", "--aggregate-id", "A"],
                &[command, "--aggregate-id", "A"],
                &[command, "--all", "4"],
            ] {
                assert!(parse(bad).is_err(), "{bad:?}");
            }
        }
    }

    /// `--help` of every command speaks to the operator: no note to maintainers in it.
    #[test]
    fn help_texts_hold_no_notes_for_maintainers() {
        fn walk(command: &mut clap::Command, path: &str) {
            let help = command.render_long_help().to_string();
            assert!(!help.contains("clap"), "{path} --help:\n{help}");
            for sub in command.get_subcommands_mut() {
                let path = format!("{path} {}", sub.get_name());
                walk(sub, &path);
            }
        }
        walk(
            &mut <Cli as clap::CommandFactory>::command(),
            "outbox-relay",
        );
    }
}
