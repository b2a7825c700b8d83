//! `outbox-relay check`: what `run` needs before it relays, checked once and reported, with an
//! exit code a deploy pipeline or an init container can act on, relaying nothing. `run` is no
//! such test: it relays as soon as it connects (taking shards from the running relays), and
//! with several pipelines it starts those that connect and keeps trying the others.
//!
//! The configuration first, as `run` reads it (every pipeline, no connection); then, unless
//! `--offline`, each pipeline's store and sink as `run` connects them: the database answers, the
//! table is migrated and the user may relay it ([`Store::check`](outboxkit_core::Store::check)),
//! and the broker answers and takes the credentials ([`Sink::check`](outboxkit_core::Sink::check)).
//! One pipeline that fails does not stop the others: each gets its lines, and the command fails
//! at the end naming those that did not pass.

use std::sync::Arc;

use outboxkit_core::{Error, RelayConfig, Sink};

use crate::cli::{self, Failure, Loaded, Target};
use crate::out::outln;
use crate::pipeline::Pipeline;
use crate::registry::Registry;

/// `check` of the selected pipelines (`--pipeline NAME/TABLE`: one table of a pattern pipeline).
pub async fn run(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&Pipeline],
    wanted_table: Option<&str>,
    offline: bool,
) -> Result<(), Failure> {
    if offline {
        outln!(
            "configuration valid: {}; connections not checked (--offline)",
            summary(pipelines)
        );
        return Ok(());
    }
    let several = loaded.pipelines.len() > 1;
    let mut failed: Vec<(String, u8)> = Vec::new();
    for pipeline in pipelines {
        let prefix = if several {
            format!("pipeline {}: ", pipeline.name)
        } else {
            String::new()
        };
        let ctx = loaded.context(pipeline);
        let stores = cli::targets(registry, loaded, pipeline, wanted_table);
        let sink = async {
            let sink: Arc<dyn Sink> = registry.build_sink(ctx).await?;
            sink.check().await?;
            Ok::<_, Error>(sink.kind())
        };
        let (stores, sink) = tokio::join!(stores, sink);
        let mut codes = Vec::new();
        match stores {
            Ok((targets, elsewhere)) if targets.is_empty() => {
                let why = cli::no_table(&elsewhere);
                // As `run`: a pattern that must match something fails, else it waits.
                if registry.discovery(ctx)?.is_some_and(|d| d.require_match) {
                    outln!(
                        "{prefix}store: FAILED: {why}, and {}.require_match is true",
                        pipeline.store_key
                    );
                    codes.push(2);
                } else {
                    outln!("{prefix}store: {why} (`run` waits for one)");
                }
            }
            Ok((targets, _)) => {
                for target in targets {
                    // A table a pattern matched: `store tenant_7.outbox: ...`.
                    let of_table = match target.label.split_once('/') {
                        Some((_, table)) => format!(" {table}"),
                        None => String::new(),
                    };
                    match checked(target, &pipeline.relay).await {
                        Ok(store) => outln!("{prefix}store{of_table}: ok: {store}"),
                        Err(e) => {
                            let e = Failure::from(pipeline.rekey_error(e));
                            outln!("{prefix}store{of_table}: FAILED: {}", e.message);
                            codes.push(e.code);
                        }
                    }
                }
            }
            Err(e) => {
                outln!("{prefix}store: FAILED: {}", e.message);
                codes.push(e.code);
            }
        }
        match sink {
            Ok(kind) => outln!("{prefix}sink: ok: {kind}"),
            Err(e) => {
                let e = Failure::from(pipeline.rekey_error(e));
                outln!("{prefix}sink: FAILED: {}", e.message);
                codes.push(e.code);
            }
        }
        if let Some(code) = codes.into_iter().max() {
            failed.push((pipeline.name.clone(), code));
        }
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

/// A target's store, checked as `run` checks it: its description, or why it cannot relay (the
/// relay settings it cannot honour first, then the database).
async fn checked(target: Target, relay: &RelayConfig) -> outboxkit_core::Result<String> {
    let store = target.store?;
    store.check_relay_settings(relay)?;
    store.check().await?;
    Ok(store.describe())
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
