//! `outbox-relay check`: what `run` needs before it relays, checked once and reported, with an
//! exit code a deploy pipeline or an init container can act on, relaying nothing. `run` is no
//! such test: it relays as soon as it connects (taking shards from the running relays), and
//! with several pipelines it starts those that connect and keeps trying the others.
//!
//! The configuration first, as `run` reads it (every pipeline, no connection); then, unless
//! `--offline`, each pipeline's store and sink as `run` connects them: the database answers, the
//! table is migrated and the user may relay it ([`Store::check`](outboxkit_core::Store::check)),
//! and the broker answers and takes the credentials ([`Sink::check`](outboxkit_core::Sink::check)).
//! One pipeline that fails does not stop the others: each gets its lines (or, with `--json`, its
//! entry in one document printed at the end), and the command fails at the end naming those
//! that did not pass.

use std::collections::BTreeMap;
use std::sync::Arc;

use outboxkit_core::{Error, Pause, RelayConfig, Sink};
use serde::Serialize;

use crate::cli::{self, Failure, Loaded, Target};
use crate::out::outln;
use crate::pipeline::Pipeline;
use crate::registry::Registry;

/// What `check --json` prints: whether every selected pipeline can relay, and each one's sides.
#[derive(Debug, Serialize)]
struct CheckReport {
    ok: bool,
    /// `--offline`: the configuration was read, nothing was connected to.
    offline: bool,
    pipelines: BTreeMap<String, PipelineCheck>,
}

/// One pipeline's checks.
#[derive(Debug, Serialize)]
struct PipelineCheck {
    ok: bool,
    store_kind: String,
    sink_kind: String,
    /// One entry per table (several for a pattern that matched several); none offline, or when
    /// a pattern matched no table (then `store_note` says so).
    #[serde(skip_serializing_if = "Option::is_none")]
    stores: Option<Vec<SideCheck>>,
    /// Why a pattern pipeline has no table to check (`run` waits for one).
    #[serde(skip_serializing_if = "Option::is_none")]
    store_note: Option<String>,
    /// None offline.
    #[serde(skip_serializing_if = "Option::is_none")]
    sink: Option<SideCheck>,
}

/// One side's check: what answered, or why it cannot relay and the exit code that means.
#[derive(Debug, Serialize)]
struct SideCheck {
    ok: bool,
    /// The table a pattern matched (`tenant_7.outbox`), for a store of a pattern pipeline.
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<String>,
    /// The store's description, or the sink's kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    found: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<u8>,
    /// A store whose table an operator paused (`outbox-relay pause`): it passes (`run` can
    /// relay it), and publishes nothing until `resume`.
    #[serde(skip_serializing_if = "Option::is_none")]
    paused: Option<Pause>,
}

impl SideCheck {
    fn passed(table: Option<String>, found: String) -> Self {
        Self {
            ok: true,
            table,
            found: Some(found),
            error: None,
            exit_code: None,
            paused: None,
        }
    }

    fn failed(table: Option<String>, failure: &Failure) -> Self {
        Self {
            ok: false,
            table,
            found: None,
            error: Some(failure.message.clone()),
            exit_code: Some(failure.code),
            paused: None,
        }
    }

    /// `ok: <found>` (and whether it is paused) or `FAILED: <error>`.
    fn text(&self) -> String {
        match (&self.found, &self.error, &self.paused) {
            (Some(found), None, None) => format!("ok: {found}"),
            (Some(found), None, Some(pause)) => format!(
                "ok: {found}; PAUSED {}: no relay publishes until `{} resume`",
                crate::pause::who(pause),
                outboxkit_core::command::name()
            ),
            _ => format!("FAILED: {}", self.error.as_deref().unwrap_or_default()),
        }
    }
}

impl PipelineCheck {
    /// The exit code of its worst failure, if any failed.
    fn failure_code(&self) -> Option<u8> {
        let sides = self.stores.iter().flatten().chain(&self.sink);
        sides.filter_map(|side| side.exit_code).max()
    }

    /// Its lines, as `check` prints them without `--json`; `prefix` names the pipeline when
    /// the configuration has several.
    fn print(&self, prefix: &str) {
        if let Some(note) = &self.store_note {
            outln!("{prefix}store: {note}");
        }
        for store in self.stores.iter().flatten() {
            // A table a pattern matched: `store tenant_7.outbox: ...`.
            let of_table = store
                .table
                .as_ref()
                .map(|table| format!(" {table}"))
                .unwrap_or_default();
            outln!("{prefix}store{of_table}: {}", store.text());
        }
        if let Some(sink) = &self.sink {
            outln!("{prefix}sink: {}", sink.text());
        }
    }
}

/// `check` of the selected pipelines (`--pipeline NAME/TABLE`: one table of a pattern pipeline).
pub async fn run(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&Pipeline],
    wanted_table: Option<&str>,
    offline: bool,
    json: bool,
) -> Result<(), Failure> {
    let several = loaded.pipelines.len() > 1;
    let mut report = CheckReport {
        ok: true,
        offline,
        pipelines: BTreeMap::new(),
    };
    let mut failed: Vec<(String, u8)> = Vec::new();
    for pipeline in pipelines {
        let checked = if offline {
            unchecked(pipeline)
        } else {
            pipeline_check(registry, loaded, pipeline, wanted_table).await?
        };
        if let Some(code) = checked.failure_code() {
            failed.push((pipeline.name.clone(), code));
        }
        if !json && !offline {
            let prefix = if several {
                format!("pipeline {}: ", pipeline.name)
            } else {
                String::new()
            };
            checked.print(&prefix);
        }
        report.pipelines.insert(pipeline.name.clone(), checked);
    }
    report.ok = failed.is_empty();
    if json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::runtime(format!("encoding the check as JSON: {e}")))?;
        outln!("{text}");
    } else if offline {
        outln!(
            "configuration valid: {}; connections not checked (--offline)",
            summary(pipelines)
        );
    }
    match failed.as_slice() {
        [] => Ok(()),
        [(_, code)] if !several => Err(Failure {
            message: "check failed (see above)".to_owned(),
            code: *code,
        }),
        _ => Err(cli::failed_for("check", &failed)),
    }
}

/// A pipeline `--offline` read and did not connect.
fn unchecked(pipeline: &Pipeline) -> PipelineCheck {
    PipelineCheck {
        ok: true,
        store_kind: pipeline.store_kind.clone(),
        sink_kind: pipeline.sink.kind.clone(),
        stores: None,
        store_note: None,
        sink: None,
    }
}

/// One pipeline's store (each table of a pattern) and sink, connected and checked at once.
async fn pipeline_check(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
    wanted_table: Option<&str>,
) -> Result<PipelineCheck, Failure> {
    let ctx = loaded.context(pipeline);
    let stores = cli::targets(registry, loaded, pipeline, wanted_table);
    let sink = async {
        let sink: Arc<dyn Sink> = registry.build_sink(ctx).await?;
        sink.check().await?;
        Ok::<_, Error>(sink.kind())
    };
    let (stores, sink) = tokio::join!(stores, sink);
    let mut checked = unchecked(pipeline);
    match stores {
        Ok((targets, elsewhere)) if targets.is_empty() => {
            let why = cli::no_table(&elsewhere);
            // As `run`: a pattern that must match something fails, else it waits.
            if registry.discovery(ctx)?.is_some_and(|d| d.require_match) {
                let failure = Failure::config(format!(
                    "{why}, and {}.require_match is true",
                    pipeline.store_key
                ));
                checked.stores = Some(vec![SideCheck::failed(None, &failure)]);
            } else {
                checked.store_note = Some(format!("{why} (`run` waits for one)"));
            }
        }
        Ok((targets, _)) => {
            let mut each = Vec::new();
            for target in targets {
                let table = target
                    .label
                    .split_once('/')
                    .map(|(_, table)| table.to_owned());
                each.push(match store_check(target, &pipeline.relay).await {
                    Ok((store, paused)) => SideCheck {
                        paused,
                        ..SideCheck::passed(table, store)
                    },
                    Err(e) => SideCheck::failed(table, &Failure::from(pipeline.rekey_error(e))),
                });
            }
            checked.stores = Some(each);
        }
        Err(e) => checked.stores = Some(vec![SideCheck::failed(None, &e)]),
    }
    checked.sink = Some(match sink {
        Ok(kind) => SideCheck::passed(None, kind.to_owned()),
        Err(e) => SideCheck::failed(None, &Failure::from(pipeline.rekey_error(e))),
    });
    checked.ok = checked.failure_code().is_none();
    Ok(checked)
}

/// A target's store, checked as `run` checks it: its description and an operator's pause of
/// its table, or why it cannot relay (the relay settings it cannot honour first, then the
/// database).
async fn store_check(
    target: Target,
    relay: &RelayConfig,
) -> outboxkit_core::Result<(String, Option<Pause>)> {
    let store = target.store?;
    store.check_relay_settings(relay)?;
    store.check().await?;
    Ok((store.describe(), store.paused().await?))
}

/// `1 pipeline (default: postgres → kafka)`, for the offline check's line.
fn summary(pipelines: &[&Pipeline]) -> String {
    let each: Vec<String> = pipelines
        .iter()
        .map(|p| format!("{}: {} → {}", p.name, p.store_kind, p.sink.kind))
        .collect();
    let count = match pipelines.len() {
        1 => "1 pipeline".to_owned(),
        n => format!("{n} pipelines"),
    };
    format!("{count} ({})", each.join(", "))
}
