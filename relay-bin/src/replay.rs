//! `outbox-relay replay`: publish again the published events `relay.retention` kept, for
//! consumers that lost them (a purged queue, a flushed stream, a bug to reprocess).

use chrono::{DateTime, SecondsFormat, Utc};
use clap::Args;
use outboxkit_core::{ReplaySelection, Retention, Store};

use crate::cli::Failure;
use crate::out::outln;
use crate::status::{counted, explained};

/// `outbox-relay replay ...`
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Events published at or after this time: RFC 3339 (`2026-12-01T10:00:00Z`) or that long
    /// ago (`90m`, `2h`, `7d`).
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    since: DateTime<Utc>,
    /// Events published before this time (the same forms); default: when the replay starts (by
    /// the database's clock), so that what it sends back is not selected again once published.
    #[arg(long, value_name = "TIME", value_parser = parse_time)]
    until: Option<DateTime<Utc>>,
    /// Only this aggregate type.
    #[arg(long)]
    aggregate_type: Option<String>,
    /// Only this aggregate.
    #[arg(long)]
    aggregate_id: Option<String>,
    /// Count the events only; send nothing.
    #[arg(long, conflicts_with = "yes")]
    dry_run: bool,
    /// Confirm: without it (or --dry-run) nothing is sent, and the command says how many
    /// events it would send.
    #[arg(long)]
    yes: bool,
}

/// A time on the command line: RFC 3339, or a duration before now.
fn parse_time(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(time) = DateTime::parse_from_rfc3339(text.trim()) {
        return Ok(time.with_timezone(&Utc));
    }
    let ago = humantime::parse_duration(text.trim()).map_err(|_| {
        format!(
            "`{text}` is neither an RFC 3339 time (2026-12-01T10:00:00Z) nor a duration ago \
             (90m, 2h, 7d)"
        )
    })?;
    chrono::Duration::from_std(ago)
        .ok()
        .and_then(|ago| Utc::now().checked_sub_signed(ago))
        .ok_or_else(|| format!("`{text}` ago is before any time there is"))
}

impl ReplayArgs {
    fn selection(&self) -> Result<ReplaySelection, Failure> {
        if let Some(until) = self.until.filter(|until| *until <= self.since) {
            return Err(Failure::config(format!(
                "replay: --until {} is not after --since {}",
                stamp(until),
                stamp(self.since)
            )));
        }
        Ok(ReplaySelection {
            published_since: self.since,
            published_until: self.until,
            aggregate_type: self.aggregate_type.clone(),
            aggregate_id: self.aggregate_id.clone(),
        })
    }
}

fn stamp(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// What a selection names, for the command's lines: `published since ... until ..., of
/// aggregate type order, aggregate 42`.
fn describe(selection: &ReplaySelection) -> String {
    let mut text = format!("published since {}", stamp(selection.published_since));
    if let Some(until) = selection.published_until {
        text.push_str(&format!(" until {}", stamp(until)));
    }
    if let Some(aggregate_type) = &selection.aggregate_type {
        text.push_str(&format!(", of aggregate type {aggregate_type}"));
    }
    if let Some(aggregate_id) = &selection.aggregate_id {
        text.push_str(&format!(", of aggregate {aggregate_id}"));
    }
    text
}

/// Run `replay` on `store`, whose pipeline keeps published events by `retention`.
pub async fn run(
    store: &dyn Store,
    args: &ReplayArgs,
    retention: &Retention,
) -> Result<(), Failure> {
    let selection = args.selection()?;
    let what = describe(&selection);
    let dry_run = args.dry_run || !args.yes;
    // Before the replay, which sends the oldest kept events back to pending.
    let oldest = explained(store, store.oldest_kept().await).await?;
    let n = explained(store, store.replay(&selection, dry_run).await).await?;
    let kept_note = match (n, retention, oldest) {
        (0, Retention::Delete, _) => {
            " (relay.retention is \"delete\": published events are deleted once acknowledged, \
             so none is kept to publish again; set a retention such as \"7d\" to keep them)"
                .to_owned()
        }
        // A window that starts before what is kept: say where the kept events begin.
        (_, _, Some(oldest)) if oldest > selection.published_since => format!(
            " (the oldest kept event was published at {}: a replay reaches no further back)",
            stamp(oldest)
        ),
        _ => String::new(),
    };
    let events = counted(n, "kept event");
    if args.dry_run {
        outln!(
            "{events} of {} {what}{kept_note}; `--yes` instead of `--dry-run` publishes them again",
            store.describe()
        );
        return Ok(());
    }
    if !args.yes {
        return Err(Failure::config(format!(
            "replay sends {events} of {} {what} to the broker again, and consumers receive them a \
             second time{kept_note}: add --yes to confirm (--dry-run counts them only)",
            store.describe()
        )));
    }
    match n {
        0 => outln!("0 kept events {what}{kept_note}: nothing to publish again"),
        _ => outln!(
            "{events} {what}{kept_note} back to pending: the relay publishes them again (same \
             event ids; consumers that deduplicate by event_id skip them)"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<ReplayArgs, clap::Error> {
        let cli = Cli::try_parse_from([&["outbox-relay", "replay"], args].concat())?;
        match cli.command {
            Command::Replay(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn times_are_rfc3339_or_a_duration_ago() {
        let args = parse(&[
            "--since",
            "2026-12-01T10:00:00Z",
            "--until",
            "2026-12-01T12:30:00+01:00",
        ])
        .unwrap();
        assert_eq!(stamp(args.since), "2026-12-01T10:00:00Z");
        assert_eq!(
            args.until.map(stamp).as_deref(),
            Some("2026-12-01T11:30:00Z")
        );
        let before = Utc::now();
        let args = parse(&["--since", "2h"]).unwrap();
        let ago = before - args.since;
        assert!(
            (chrono::Duration::minutes(119)..=chrono::Duration::minutes(121)).contains(&ago),
            "{ago}"
        );
        for bad in [
            &["--since", "yesterday"][..],
            &[],
            &["--since", "1h", "--dry-run", "--yes"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        let e = parse(&["--since", "yesterday"]).unwrap_err().to_string();
        assert!(e.contains("neither an RFC 3339 time"), "{e}");
    }

    #[test]
    fn the_window_must_be_open_and_is_described() {
        let args = parse(&["--since", "1h", "--until", "2h"]).unwrap();
        let e = args.selection().unwrap_err();
        assert_eq!(e.code, 2);
        assert!(e.message.contains("is not after --since"), "{}", e.message);
        let args = parse(&[
            "--since",
            "2026-12-01T10:00:00Z",
            "--until",
            "2026-12-01T11:00:00Z",
            "--aggregate-type",
            "order",
            "--aggregate-id",
            "42",
        ])
        .unwrap();
        assert_eq!(
            describe(&args.selection().unwrap()),
            "published since 2026-12-01T10:00:00Z until 2026-12-01T11:00:00Z, of aggregate type \
             order, of aggregate 42"
        );
    }
}
