//! `outbox-relay events`: find events whatever their state, to answer "did this event go out,
//! and if not, why?" without SQL.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use clap::Args;
use outboxkit_core::{EventContent, EventFilter, EventRecord, EventState, PayloadType, Retention};
use serde::Serialize;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::cli::{failed_for, Failure, Target};
use crate::out::{outln, printable, utc_second};
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
    /// Also show each event's payload and headers as the table holds them: what a sink sends
    /// (binary payloads in base64).
    #[arg(long)]
    payload: bool,
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
    event: EventRecord,
}

/// A row of a JSON answer, its content taken out of it, with the content's fields
/// ([`ContentJson`]) beside the row's.
#[derive(Serialize)]
struct WithContent<'a, T> {
    #[serde(flatten)]
    row: &'a T,
    #[serde(flatten)]
    content: Option<ContentJson<'a>>,
}

/// `rows`, each with the content taken out of it, as the pretty JSON array `events` and `dead
/// list` print: a row's own fields, then with `--payload` its content's.
pub(crate) fn json_rows<T: Serialize>(
    rows: &[(T, Option<EventContent>)],
) -> serde_json::Result<String> {
    let rows: Vec<WithContent<'_, T>> = rows
        .iter()
        .map(|(row, content)| WithContent {
            row,
            content: content.as_ref().map(ContentJson::of),
        })
        .collect();
    serde_json::to_string_pretty(&rows)
}

/// An event's content in JSON, as CloudEvents carries data: a `json` payload as the document
/// itself, text as a string, bytes (or text that is not UTF-8) as `payload_base64`.
#[derive(Serialize)]
struct ContentJson<'a> {
    payload_type: PayloadType,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<PayloadJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
    headers: &'a outboxkit_core::Headers,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PayloadJson<'a> {
    Document(&'a RawValue),
    Text(&'a str),
}

impl<'a> ContentJson<'a> {
    fn of(content: &'a EventContent) -> Self {
        let text = std::str::from_utf8(&content.payload).ok();
        let payload = match (content.payload_type, text) {
            (PayloadType::Json, Some(text)) => serde_json::from_str::<&RawValue>(text)
                .map(PayloadJson::Document)
                .ok()
                .or(Some(PayloadJson::Text(text))),
            (PayloadType::Text, Some(text)) => Some(PayloadJson::Text(text)),
            _ => None,
        };
        Self {
            payload_type: content.payload_type,
            payload_base64: payload.is_none().then(|| BASE64.encode(&content.payload)),
            payload,
            headers: &content.headers,
        }
    }
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
        with_payload: args.payload,
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
        let rows: Vec<(Found<'_>, Option<EventContent>)> = found
            .iter_mut()
            .flat_map(|(label, rows, _)| rows.drain(..).map(|event| found_row(label, event)))
            .collect();
        let text = json_rows(&rows)
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

/// One row of the JSON answer.
fn found_row(pipeline: &str, mut event: EventRecord) -> (Found<'_>, Option<EventContent>) {
    let content = event.content.take();
    (Found { pipeline, event }, content)
}

/// An event's content under its row: the payload (text with its control characters escaped,
/// so that a payload cannot move the terminal or fake a line; bytes in base64) and headers.
pub(crate) fn content_lines(content: &EventContent) -> [String; 2] {
    let size = counted(content.payload.len(), "byte");
    let payload = match (content.payload_type, std::str::from_utf8(&content.payload)) {
        (PayloadType::Json | PayloadType::Text, Ok(text)) => {
            format!(
                "payload ({}, {size}): {}",
                content.payload_type,
                printable(text)
            )
        }
        _ => format!(
            "payload ({}, {size}, base64): {}",
            content.payload_type,
            BASE64.encode(&content.payload)
        ),
    };
    let headers = match content.headers.is_empty() {
        true => "headers: none".to_owned(),
        false => format!(
            "headers: {}",
            printable(&serde_json::to_string(&content.headers).unwrap_or_default())
        ),
    };
    [payload, headers]
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
        for line in row_lines(r) {
            outln!("{line}");
        }
    }
    if more {
        outln!("(the newest {limit}; there are more: raise --limit to see them)");
    }
}

/// A row's line, then its content's lines: what writers and brokers wrote made
/// [`printable`].
fn row_lines(r: &EventRecord) -> Vec<String> {
    let row = format!(
        "{:>10}  {:<36}  {:<24}  {:<20}  {:<36}  {:>8}  {}",
        r.id,
        r.event_id,
        printable(&format!("{}/{}", r.aggregate_type, r.aggregate_id)),
        printable(&r.event_type),
        state(r),
        r.attempts,
        printable(r.last_error.as_deref().unwrap_or(""))
    );
    let content = r.content.iter().flat_map(content_lines);
    std::iter::once(row)
        .chain(content.map(|line| format!("{:>10}  {line}", "")))
        .collect()
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
            payload: false,
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

    /// The JSON of one row, as text and parsed.
    fn found_json(pipeline: &str, event: &EventRecord) -> (String, serde_json::Value) {
        let (row, content) = found_row(pipeline, event.clone());
        let with = WithContent {
            row: &row,
            content: content.as_ref().map(ContentJson::of),
        };
        let text = serde_json::to_string(&with).unwrap();
        let value = serde_json::from_str(&text).unwrap();
        (text, value)
    }

    fn record(payload_type: PayloadType, payload: &[u8]) -> EventRecord {
        let created_at = chrono::DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        EventRecord {
            id: 7,
            event_id: Uuid::nil(),
            aggregate_type: "order".to_owned(),
            aggregate_id: "42".to_owned(),
            event_type: "Paid".to_owned(),
            destination: None,
            state: EventState::Pending,
            attempts: 0,
            last_error: None,
            created_at,
            next_attempt_at: None,
            published_at: None,
            dead_at: None,
            content: Some(EventContent {
                payload: payload.to_vec(),
                payload_type,
                headers: [("traceparent".to_owned(), "00-ab-01".to_owned())].into(),
            }),
        }
    }

    #[test]
    fn a_json_payload_is_the_document_as_stored_and_bytes_are_base64() {
        let (text, json) = found_json(
            "main",
            &record(PayloadType::Json, br#"{"z": 1.0, "a": [2]}"#),
        );
        assert_eq!(json["payload_type"], "json");
        assert_eq!(json["payload"], serde_json::json!({"z": 1.0, "a": [2]}));
        assert_eq!(json["headers"]["traceparent"], "00-ab-01");
        assert_eq!(
            (json["pipeline"].as_str(), json["id"].as_i64()),
            (Some("main"), Some(7))
        );
        assert!(
            json.get("content").is_none() && json.get("payload_base64").is_none(),
            "{json}"
        );
        // The document's own text, key order and spaces kept.
        assert!(text.contains(r#""payload":{"z": 1.0, "a": [2]}"#), "{text}");

        let (_, json) = found_json("main", &record(PayloadType::Text, b"<a>caf\xc3\xa9</a>"));
        assert_eq!(
            (json["payload_type"].as_str(), json["payload"].as_str()),
            (Some("text"), Some("<a>café</a>"))
        );

        let bytes = [0u8, 159, 255, b'\n'];
        for payload_type in [PayloadType::Binary, PayloadType::Text] {
            let (_, json) = found_json("main", &record(payload_type, &bytes));
            assert!(json.get("payload").is_none(), "{json}");
            let decoded = BASE64
                .decode(json["payload_base64"].as_str().unwrap())
                .unwrap();
            assert_eq!(decoded, bytes, "{payload_type}");
        }
        // Without --payload, no content fields at all.
        let bare = EventRecord {
            content: None,
            ..record(PayloadType::Json, b"{}")
        };
        let (_, json) = found_json("main", &bare);
        assert!(
            json.get("payload_type").is_none() && json.get("headers").is_none(),
            "{json}"
        );
    }

    #[test]
    fn payload_lines_escape_control_characters_and_show_bytes_in_base64() {
        let shown = content_lines(
            record(PayloadType::Text, b"line 1\nline 2\x1b[2J\tend")
                .content
                .as_ref()
                .unwrap(),
        );
        assert_eq!(
            shown[0],
            r"payload (text, 21 bytes): line 1\nline 2\u{1b}[2J\tend"
        );
        assert_eq!(shown[1], r#"headers: {"traceparent":"00-ab-01"}"#);
        let shown = content_lines(
            record(PayloadType::Binary, &[0, 1, 2, 255])
                .content
                .as_ref()
                .unwrap(),
        );
        assert_eq!(shown[0], "payload (binary, 4 bytes, base64): AAEC/w==");
        let mut one = record(PayloadType::Json, b"1");
        one.content.as_mut().unwrap().headers.clear();
        let shown = content_lines(one.content.as_ref().unwrap());
        assert_eq!(
            shown,
            [
                "payload (json, 1 byte): 1".to_owned(),
                "headers: none".to_owned()
            ]
        );
    }

    #[test]
    fn a_row_is_one_line_per_field_whatever_the_writer_put_in_it() {
        let mut hostile = record(PayloadType::Text, b"ok\n        99  forged row");
        hostile.aggregate_id = "42\u{1b}[2J".to_owned();
        hostile.event_type = "Paid\nforged".to_owned();
        hostile.last_error = Some("refused\r\nat broker".to_owned());
        let lines = row_lines(&hostile);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines.iter().all(|l| !l.chars().any(char::is_control)),
            "{lines:?}"
        );
        assert!(
            lines[0].contains(r"order/42\u{1b}[2J") && lines[0].contains(r"Paid\nforged"),
            "{}",
            lines[0]
        );
        assert!(lines[0].ends_with(r"refused\r\nat broker"), "{}", lines[0]);
        assert!(
            lines[1].ends_with(r"ok\n        99  forged row"),
            "{}",
            lines[1]
        );
    }
}
