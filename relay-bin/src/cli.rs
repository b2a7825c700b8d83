//! The command line: `run`, `migrate`, `status`, `dead`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use outboxkit_core::{ErrorKind, Store};

use crate::out::outln;
use crate::pipeline::Pipeline;
use crate::registry::{Claimed, Discovered, FactoryContext, Registry};
use crate::settings::{self, LogFormat, Settings};

/// Relay outbox rows to a broker, at least once, in order per aggregate.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay")]
pub struct Cli {
    /// Configuration file (TOML); `OUTBOX_*` environment variables override it (`__` nests).
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log format, overriding `log.format`.
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Only this pipeline (`[pipelines.<NAME>]`, or `default` for a top-level `[store]`); every
    /// pipeline when not given. `dead` and `replay` need it when there are several.
    #[arg(long, global = true, value_name = "NAME")]
    pub pipeline: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Relay until SIGTERM/SIGINT; serves /metrics, /healthz and /readyz.
    Run {
        /// With one pipeline too, keep trying a database or broker that does not answer at
        /// start (not ready on /readyz meanwhile) instead of exiting, as several pipelines do.
        /// Configuration errors still stop it.
        #[arg(long)]
        wait: bool,
    },
    /// Create or upgrade the outbox table of every pipeline (idempotent).
    Migrate {
        /// Print the SQL that creates each pipeline's table instead (with log-based capture,
        /// its publication, emit function and slot too), for a database administrator to
        /// review and apply; connect to nothing.
        #[arg(long)]
        print_sql: bool,
    },
    /// Backlog figures, shard owners and what `run` would stop with.
    ///
    /// What `run` would stop with: a dropped replication slot, a table to migrate. One line
    /// per pipeline when there are several, the whole report of one (with --pipeline, or when
    /// there is only one).
    Status {
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
    /// Check once what `run` needs (configuration, database, broker), and exit.
    ///
    /// The configuration, then each pipeline's database (answers, table migrated, privileges)
    /// and broker (answers, takes the credentials), a line per side (one JSON document with
    /// --json). Exit code 0 when all pass, 2 for configuration, 1 otherwise: for a deploy
    /// pipeline's gate or an init container.
    Check {
        /// Check the configuration only; connect to nothing.
        #[arg(long)]
        offline: bool,
        /// Print one JSON document for machines (every side's result and exit code).
        #[arg(long)]
        json: bool,
    },
    /// Dead events: list, retry, discard.
    Dead {
        #[command(subcommand)]
        command: crate::dead::DeadCommand,
    },
    /// Publish again the events `relay.retention` kept, for consumers that lost them.
    ///
    /// Those published in a time window, of an aggregate type or an aggregate. With polling
    /// each is pending again in its place in its aggregate's order; with log-based capture
    /// (table style) each is written again, after what its aggregate committed since. They
    /// keep their event ids. Asks for --yes; --dry-run counts them.
    Replay(crate::replay::ReplayArgs),
    /// Find events whatever their state: pending, retrying, published (while kept), dead.
    ///
    /// Newest first: id, event id, aggregate, event type, state and when (UTC), attempts, last
    /// error. By event id, aggregate type and aggregate; with none, the newest events. A
    /// published event's row is gone unless `relay.retention` keeps it.
    Events(crate::events::EventsArgs),
    /// Stop every relay of the selected tables from publishing, until `resume`.
    ///
    /// Within `relay.rebalance_interval` each relay marks what the broker acknowledged and
    /// claims nothing more; it keeps its shards and stays ready. Nothing is lost: the events
    /// wait, in order, and writers go on writing. The pause is the table's, in the database:
    /// relays started meanwhile stay paused. `status` shows it.
    Pause(crate::pause::PauseArgs),
    /// Lift the pause of the selected tables: their relays publish again, where they stopped.
    Resume,
    /// Print the configuration as the relay reads it: the file with the OUTBOX_ environment
    /// variables over it, as TOML, each value with where it was set, secrets hidden.
    ///
    /// Only what is set (keys left out take their defaults); the adapters' keys are read, not
    /// checked (`check --offline` checks them). With --pipeline, of the pipelines only that one.
    Config,
}

/// A failure of a command: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    /// Bad configuration or usage: exit code 2.
    pub fn config(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 2,
        }
    }

    /// Anything else: exit code 1.
    pub fn runtime(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }
}

impl From<outboxkit_core::Error> for Failure {
    fn from(e: outboxkit_core::Error) -> Self {
        if e.kind() == ErrorKind::Config {
            Self::config(format!("invalid configuration: {}", e.full_message()))
        } else {
            Self::runtime(e.full_message())
        }
    }
}

impl From<settings::ConfigError> for Failure {
    fn from(e: settings::ConfigError) -> Self {
        Self::config(e.to_string())
    }
}

/// The message on one line (the binary prints exactly one `error: ...` line).
fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The command's name: the file name the binary was started as, without a path (and without
/// `.exe`), else `outbox-relay`.
fn command_name(argv0: Option<std::ffi::OsString>) -> String {
    argv0
        .as_deref()
        .map(std::path::Path::new)
        .and_then(std::path::Path::file_name)
        .and_then(|name| name.to_str())
        .map(|name| {
            name.strip_suffix(std::env::consts::EXE_SUFFIX)
                .unwrap_or(name)
        })
        .filter(|name| !name.is_empty())
        .unwrap_or(outboxkit_core::command::DEFAULT)
        .to_owned()
}

/// This library's version, which `outbox-relay --version` prints.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `outbox-relay --version`: the version and the adapters compiled in.
pub fn long_version(registry: &Registry) -> String {
    format!("{VERSION} ({})", adapters(registry))
}

/// `--version` of a binary with a version of its own: `1.4.2 (outboxkit-relay 0.1.0; stores:
/// ...; sinks: ...)`.
fn own_long_version(version: &str, registry: &Registry) -> String {
    format!(
        "{version} (outboxkit-relay {VERSION}; {})",
        adapters(registry)
    )
}

/// `stores: postgres, mysql; sinks: kafka, ...`
fn adapters(registry: &Registry) -> String {
    format!(
        "stores: {}; sinks: {}",
        registry.store_kinds().join(", "),
        registry.sink_kinds().join(", ")
    )
}

/// The binary's `main`: parse the command line, run the command, map failures to exit codes.
/// A custom binary calls this with its own registry. Its help, `--version` and every message
/// that says what to run name the binary as it was started (`outbox-mqtt-relay`); `--version`
/// gives this library's version ([`main_with_version`] gives the binary's own as well).
pub fn main(registry: Registry) -> ExitCode {
    let version = long_version(&registry);
    run_main(registry, version)
}

/// [`main`] for a binary with a version of its own, `env!("CARGO_PKG_VERSION")` from the
/// binary's crate: `--version` prints `outbox-mqtt-relay 1.4.2 (outboxkit-relay 0.1.0; stores:
/// ...; sinks: ...)`, so that a report names both the team's build and the relay it is built on.
pub fn main_with_version(registry: Registry, version: &str) -> ExitCode {
    let version = own_long_version(version, &registry);
    run_main(registry, version)
}

fn run_main(registry: Registry, version: String) -> ExitCode {
    // Built once per process; clap wants 'static strings.
    let name: &'static str = Box::leak(command_name(std::env::args_os().next()).into_boxed_str());
    outboxkit_core::command::set_name(name);
    let version: &'static str = Box::leak(version.into_boxed_str());
    let command = Cli::command()
        .name(name)
        .bin_name(name)
        .version(version)
        .long_version(version);
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The flag wins over `log.format`, and says what the last line is written in even when the
    // configuration cannot be read.
    if let Some(format) = cli.log_format {
        let _ = LOG_FORMAT.set(format);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = contained(&runtime, execute(cli, registry));
    // Tasks a command left behind log as they end (a broker client's connection task says it
    // closed): end them first, so that the line saying why the command failed is the last.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            report(&failure, LOG_FORMAT.get() == Some(&LogFormat::Json));
            ExitCode::from(failure.code)
        }
    }
}

/// `command` run to its end on `runtime`. A panic that reaches here (an adapter's, building a
/// store or sink for `migrate`, `status` or `dead`) is a failure like the others: the last line
/// says so and the exit code is 1, where the panic would end the process with code 101 and no
/// `error:` line.
fn contained(
    runtime: &tokio::runtime::Runtime,
    command: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(command)))
        .unwrap_or_else(|panic| {
            Err(Failure::runtime(format!(
                "{} panicked: {} (a bug, most likely in an adapter; the `panicked` log line \
                 before says where)",
                outboxkit_core::command::name(),
                outboxkit_core::error::panic_message(panic.as_ref())
            )))
        })
}

/// The log format: `--log-format`, else `log.format` once the configuration has been read.
static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

/// The line a failed command ends with, on stderr: `error: ...`, or with JSON logs a log record
/// like the others (level `ERROR`, the exit code in `fields`), so that a collector parsing
/// every line as JSON keeps the one that says why the relay stopped. Whatever `log.level` says.
fn report(failure: &Failure, json: bool) {
    let message = one_line(&failure.message);
    if !json {
        eprintln!("error: {message}");
        return;
    }
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        tracing::error!(exit_code = failure.code, "{message}");
    });
}

/// Run one parsed command.
pub async fn execute(cli: Cli, registry: Registry) -> Result<(), Failure> {
    let mut loaded = load(&cli)?;
    registry.name_destinations(&mut loaded.pipelines);
    // `--pipeline tenants/t7.outbox`: one table of a pattern pipeline.
    let (wanted, wanted_table) = match cli.pipeline.as_deref() {
        Some(wanted) => match wanted.split_once('/') {
            Some((name, table)) => (Some(name), Some(table)),
            None => (Some(wanted), None),
        },
        None => (None, None),
    };
    let pipelines = crate::pipeline::select(&loaded.pipelines, wanted).map_err(Failure::config)?;
    match cli.command {
        Command::Run { wait } => {
            check_config(&registry, &loaded, &pipelines, &cli)?;
            let pipelines = pipelines.into_iter().cloned().collect();
            crate::supervisor::run(&registry, std::sync::Arc::new(loaded), pipelines, wait).await
        }
        Command::Config => {
            let file = loaded.file.as_deref();
            let document = crate::effective::render(&loaded.figment, file, wanted);
            outln!("{}", document.trim_end());
            Ok(())
        }
        Command::Check { offline, json } => {
            check_config(&registry, &loaded, &pipelines, &cli)?;
            crate::check::run(&registry, &loaded, &pipelines, wanted_table, offline, json).await
        }
        Command::Migrate { print_sql: true } => print_migration_sql(&registry, &loaded, &pipelines),
        Command::Migrate { print_sql: false } => {
            each_table(
                &registry,
                &loaded,
                &pipelines,
                wanted_table,
                TableAction::Migrate,
            )
            .await
        }
        Command::Pause(ref args) => {
            let action = TableAction::Pause(args);
            each_table(&registry, &loaded, &pipelines, wanted_table, action).await
        }
        Command::Resume => {
            each_table(
                &registry,
                &loaded,
                &pipelines,
                wanted_table,
                TableAction::Resume,
            )
            .await
        }
        Command::Status { json } => {
            let mut all = Vec::new();
            let mut unmatched = Vec::new();
            for pipeline in &pipelines {
                let (found, elsewhere) =
                    targets(&registry, &loaded, pipeline, wanted_table).await?;
                if found.is_empty() {
                    unmatched.push((pipeline.name.clone(), no_table(&elsewhere)));
                }
                all.extend(found);
            }
            let one = cli.pipeline.is_some() || loaded.pipelines.len() == 1;
            if all.len() == 1 && unmatched.is_empty() && one {
                let target = all.remove(0);
                let dead_list = dead_list(&loaded, &target.label);
                // One pipeline is selected, or there is only one.
                let relay = &pipelines[0].relay;
                return crate::status::print(target.store?.as_ref(), json, &dead_list, relay).await;
            }
            crate::status::print_each(all, &unmatched, json).await
        }
        Command::Dead { ref command } => {
            let (target, _) =
                one_target(&registry, &loaded, &pipelines, wanted_table, "dead").await?;
            let dead_list = dead_list(&loaded, &target.label);
            crate::dead::run(target.store?.as_ref(), command, &dead_list).await
        }
        Command::Events(ref args) => {
            let mut searched = Vec::new();
            let mut failed = Vec::new();
            for pipeline in &pipelines {
                match targets(&registry, &loaded, pipeline, wanted_table).await {
                    Ok((found, _)) => {
                        searched.extend(found.into_iter().map(|target| crate::events::Searched {
                            target,
                            retention: pipeline.relay.retention,
                        }))
                    }
                    Err(failure) if pipelines.len() > 1 => {
                        failed.push((pipeline.name.clone(), failure))
                    }
                    Err(failure) => return Err(failure),
                }
            }
            crate::events::run(searched, failed, args).await
        }
        Command::Replay(ref args) => {
            let (target, pipeline) =
                one_target(&registry, &loaded, &pipelines, wanted_table, "replay").await?;
            crate::replay::run(target.store?.as_ref(), args, &pipeline.relay.retention).await
        }
    }
}

/// The one table a command that changes rows (`dead`, `replay`) works on, and its pipeline: an
/// error that says how to choose when the selection holds several, or none.
async fn one_target<'p>(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&'p Pipeline],
    wanted_table: Option<&str>,
    command: &str,
) -> Result<(Target, &'p Pipeline), Failure> {
    let [pipeline] = pipelines[..] else {
        return Err(Failure::config(format!(
            "{command}: there are {} pipelines ({}): choose one with --pipeline NAME",
            pipelines.len(),
            crate::pipeline::names(&loaded.pipelines)
        )));
    };
    let (mut targets, elsewhere) = targets(registry, loaded, pipeline, wanted_table).await?;
    if targets.is_empty() {
        return Err(Failure::runtime(format!(
            "{command}: pipeline {} has no table: {}",
            pipeline.name,
            no_table(&elsewhere)
        )));
    }
    if targets.len() != 1 {
        let labels: Vec<&str> = targets.iter().map(|t| t.label.as_str()).collect();
        return Err(Failure::config(format!(
            "{command}: pipeline {} relays {} tables ({}): choose one with --pipeline {}/<table>",
            pipeline.name,
            targets.len(),
            labels.join(", "),
            pipeline.name
        )));
    }
    Ok((targets.remove(0), pipeline))
}

/// `migrate --print-sql`: each selected pipeline's creation script, headed by its name when
/// the configuration has several; nothing connected to.
fn print_migration_sql(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&Pipeline],
) -> Result<(), Failure> {
    let mut scripts = Vec::with_capacity(pipelines.len());
    for pipeline in pipelines {
        let sql = registry.migration_sql(loaded.context(pipeline))?;
        let sql = sql.ok_or_else(|| {
            Failure::config(format!(
                "{}.kind = \"{}\": this store cannot print its SQL; run migrate",
                pipeline.store_key, pipeline.store_kind
            ))
        })?;
        scripts.push((pipeline.name.as_str(), sql));
    }
    for (name, sql) in scripts {
        if loaded.pipelines.len() > 1 {
            outln!("-- pipeline {name}");
        }
        outln!("{}", sql.trim_end());
    }
    Ok(())
}

/// What a command does to each table it selects.
#[derive(Debug, Clone, Copy)]
enum TableAction<'a> {
    Migrate,
    Pause(&'a crate::pause::PauseArgs),
    Resume,
}

impl TableAction<'_> {
    /// The command's name, and what a table it failed for is not.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Self::Migrate => ("migrate", "not migrated"),
            Self::Pause(_) => ("pause", "not paused"),
            Self::Resume => ("resume", "not resumed"),
        }
    }

    /// Do it to `store`'s table: the verb and the rest of its line.
    async fn on(self, store: &dyn Store) -> outboxkit_core::Result<(String, String)> {
        match self {
            Self::Migrate => {
                store.migrate().await?;
                Ok(("migrated".to_owned(), store.describe()))
            }
            Self::Pause(args) => crate::pause::pause(store, args).await,
            Self::Resume => crate::pause::resume(store).await,
        }
    }
}

/// `action` on every table of the selected pipelines, a line each: `<verb> <rest>` for the one
/// table of a one-pipeline configuration, `<verb> pipeline <label>: <rest>` otherwise. With
/// several pipelines (or tables), one that fails does not stop the others: each gets its line
/// (`pipeline <label>: not migrated: <why>`), and the command fails at the end naming those it
/// failed for.
async fn each_table(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&Pipeline],
    wanted_table: Option<&str>,
    action: TableAction<'_>,
) -> Result<(), Failure> {
    let (command, not_done) = action.names();
    let several = loaded.pipelines.len() > 1;
    let mut failed: Vec<(String, Failure)> = Vec::new();
    for pipeline in pipelines {
        let (targets, elsewhere) = match targets(registry, loaded, pipeline, wanted_table).await {
            Ok(found) => found,
            Err(failure) if several => {
                failed.push((pipeline.name.clone(), failure));
                continue;
            }
            Err(failure) => return Err(failure),
        };
        if targets.is_empty() {
            outln!("pipeline {}: {}", pipeline.name, no_table(&elsewhere));
        }
        let one = !several && targets.len() == 1;
        for target in targets {
            let done = match target.store {
                Ok(store) => action.on(store.as_ref()).await,
                Err(e) => Err(e),
            };
            match done {
                Ok((verb, rest)) if target.label == pipeline.name && !several => {
                    outln!("{verb} {rest}")
                }
                Ok((verb, rest)) => outln!("{verb} pipeline {}: {rest}", target.label),
                Err(e) if one => return Err(e.into()),
                Err(e) => failed.push((target.label, e.into())),
            }
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    for (label, failure) in &failed {
        outln!("pipeline {label}: {not_done}: {}", failure.message);
    }
    let failed: Vec<(String, u8)> = failed.into_iter().map(|(l, f)| (l, f.code)).collect();
    Err(failed_for(command, &failed))
}

/// What a command over several pipelines ends with once each has its line: `<command> failed
/// for pipeline(s) a, b (see above)`, with the most serious of their exit codes.
pub(crate) fn failed_for(command: &str, failed: &[(String, u8)]) -> Failure {
    let labels: Vec<&str> = failed.iter().map(|(label, _)| label.as_str()).collect();
    Failure {
        message: format!(
            "{command} failed for pipeline(s) {} (see above)",
            labels.join(", ")
        ),
        code: failed.iter().map(|(_, code)| *code).max().unwrap_or(1),
    }
}

/// The command that lists the dead events of the target `label`, as `status` and `dead` tell
/// the operator to type it: with `--pipeline` when the configuration has several pipelines,
/// or the target is one table of a pattern pipeline.
fn dead_list(loaded: &Loaded, label: &str) -> String {
    let name = outboxkit_core::command::name();
    if loaded.pipelines.len() > 1 || label.contains('/') {
        format!("{name} --pipeline {label} dead list")
    } else {
        format!("{name} dead list")
    }
}

/// What `migrate`, `status` and `dead` say of a pattern pipeline that matches no table (a
/// tenants' pipeline before its first tenant).
pub(crate) const NO_MATCH: &str = "no table matches its pattern";

/// Why a pattern pipeline has no table: [`NO_MATCH`], or the tables it matches that other
/// pipelines relay.
pub(crate) fn no_table(elsewhere: &[Claimed]) -> String {
    if elsewhere.is_empty() {
        return NO_MATCH.to_owned();
    }
    let tables: Vec<String> = elsewhere
        .iter()
        .map(|c| format!("{} (pipeline {})", c.table, c.pipeline))
        .collect();
    format!(
        "its pattern matches only tables other pipelines relay: {}",
        tables.join(", ")
    )
}

/// One relay's worth of a pipeline: the pipeline's table, or one table its pattern matched
/// (`tenants/t7.outbox`), with its store or the error connecting it.
#[derive(Debug)]
pub struct Target {
    pub label: String,
    pub store: outboxkit_core::Result<std::sync::Arc<dyn Store>>,
}

/// The targets of `pipeline` (only `table` of a pattern pipeline when given), and the tables
/// its pattern matches that other pipelines relay.
pub(crate) async fn targets(
    registry: &Registry,
    loaded: &Loaded,
    pipeline: &Pipeline,
    table: Option<&str>,
) -> Result<(Vec<Target>, Vec<Claimed>), Failure> {
    let ctx = loaded.context(pipeline);
    if registry.discovery(ctx)?.is_none() {
        if let Some(table) = table {
            return Err(Failure::config(format!(
                "--pipeline {}/{table}: pipeline {} has one table, not a pattern: use --pipeline {}",
                pipeline.name, pipeline.name, pipeline.name
            )));
        }
        let target = Target {
            label: pipeline.name.clone(),
            store: registry.build_store(ctx).await,
        };
        return Ok((vec![target], Vec::new()));
    }
    let Discovered {
        tables: mut found,
        elsewhere,
    } = loaded.discover(registry, pipeline).await?;
    if let Some(table) = table {
        found.retain(|t| t.table == table);
        if let Some(claimed) = elsewhere.iter().find(|c| c.table == table) {
            return Err(Failure::config(format!(
                "--pipeline {}/{table}: the table is relayed by pipeline {}, not {}: use \
                 --pipeline {}",
                pipeline.name,
                claimed.pipeline,
                pipeline.name,
                claimed.label()
            )));
        }
        if found.is_empty() {
            return Err(Failure::config(format!(
                "--pipeline {}/{table}: the pattern of pipeline {} matches no such table",
                pipeline.name, pipeline.name
            )));
        }
    }
    let mut targets = Vec::new();
    for t in found {
        targets.push(Target {
            label: format!("{}/{}", pipeline.name, t.table),
            store: t.build().await,
        });
    }
    Ok((targets, elsewhere))
}

/// The configuration as loaded: settings, the figment they came from (for key paths and
/// origins in messages), the file, and the pipelines it declares.
#[derive(Debug)]
pub struct Loaded {
    pub settings: Settings,
    pub figment: figment::Figment,
    pub file: Option<PathBuf>,
    pub pipelines: Vec<Pipeline>,
}

impl Loaded {
    /// What the registry needs to read `pipeline`'s adapters.
    pub fn context<'a>(&'a self, pipeline: &'a Pipeline) -> FactoryContext<'a> {
        FactoryContext {
            pipeline,
            figment: &self.figment,
            file: self.file.as_ref(),
        }
    }

    /// The tables of pattern pipeline `pipeline` now: those it relays, and those it matches
    /// that another pipeline relays ([`Registry::discover`]).
    pub async fn discover(
        &self,
        registry: &Registry,
        pipeline: &Pipeline,
    ) -> outboxkit_core::Result<Discovered> {
        registry
            .discover(pipeline, &self.pipelines, |p| self.context(p))
            .await
    }
}

fn load(cli: &Cli) -> Result<Loaded, Failure> {
    let file = cli.config.as_deref();
    let (settings, figment) = settings::load(file)?;
    let format = cli.log_format.unwrap_or(settings.log.format);
    let _ = LOG_FORMAT.set(format);
    let filter = log_filter(&settings.log.level, std::env::var("RUST_LOG").ok()).map_err(|e| {
        Failure::config(format!(
            "invalid configuration: {}",
            settings::locate(&e, &figment, file)
        ))
    })?;
    init_logging(format, filter);
    let pipelines = crate::pipeline::resolve(&settings, &figment, file)?;
    Ok(Loaded {
        settings,
        figment,
        file: cli.config.clone(),
        pipelines,
    })
}

/// `server.listen` must be an address (checked before connecting to anything).
/// Every configuration error of every selected pipeline, before anything connects: what `run`
/// and `check` start with.
fn check_config(
    registry: &Registry,
    loaded: &Loaded,
    pipelines: &[&Pipeline],
    cli: &Cli,
) -> Result<(), Failure> {
    for pipeline in pipelines {
        registry.check_config(loaded.context(pipeline))?;
    }
    registry.check_distinct_tables(&loaded.pipelines, |p| loaded.context(p))?;
    check_listen(&loaded.settings.server.listen, &loaded.figment, cli)
}

fn check_listen(listen: &str, figment: &figment::Figment, cli: &Cli) -> Result<(), Failure> {
    if listen.is_empty() {
        return Ok(());
    }
    let Err(message) = crate::server::listen_address(listen) else {
        return Ok(());
    };
    Err(Failure::config(format!(
        "invalid configuration: {}",
        settings::locate(&message, figment, cli.config.as_deref())
    )))
}

/// Colour only on a terminal, and not when `NO_COLOR` is set to anything non-empty
/// (<https://no-color.org>): files and container logs get plain text.
fn use_colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Crates whose own lines are left out of the log unless the filter names them:
/// - lapin logs every message RabbitMQ returns at WARN with its payload and headers (event
///   contents stay out of the relay's logs), and a lost connection at ERROR, which the sink
///   reports itself at WARN when it reconnects;
/// - pgwire-replication logs the end of its slot reader at ERROR, without the pipeline, also
///   when another relay holds the slot (the expected race of log-based capture); the relay
///   reports each of those errors itself, with the slot and what to do.
const QUIETED: [(&str, &str); 2] = [("lapin", "off"), ("pgwire_replication", "off")];

/// The log filter: `RUST_LOG` when it is set and not empty, else `log.level`, with the
/// [`QUIETED`] crates left out unless it names them. Each directive without `=` must be a
/// level: tracing would read any other word (`warning`, `verbose`) as a target to log at every
/// level, and drop every line of the relay's own, silently. The error starts with the key or
/// the variable that holds the filter.
fn log_filter(
    level: &str,
    rust_log: Option<String>,
) -> Result<tracing_subscriber::EnvFilter, String> {
    let from_env = rust_log.as_deref().filter(|v| !v.trim().is_empty());
    let (source, shown) = match from_env {
        Some(value) => ("RUST_LOG", value),
        None => ("log.level", level),
    };
    if shown.trim().is_empty() {
        return Err(format!("{source}: must not be empty (e.g. \"info\")"));
    }
    let directives = shown.split(',').map(str::trim).filter(|d| !d.is_empty());
    for directive in directives {
        let is_level = directive
            .parse::<tracing_subscriber::filter::LevelFilter>()
            .is_ok();
        if !is_level && !directive.contains(['=', '[']) {
            return Err(format!(
                "{source}: `{directive}` is not a level (error, warn, info, debug, trace or off); \
                 for one crate's level write crate=level, e.g. \"info,outboxkit_core=debug\""
            ));
        }
    }
    let mut spec = shown.to_owned();
    for (target, quiet) in QUIETED {
        if !shown.contains(target) {
            spec.push_str(&format!(",{target}={quiet}"));
        }
    }
    tracing_subscriber::EnvFilter::try_new(&spec)
        .map_err(|e| format!("{source}: \"{shown}\" is not a log filter: {e}"))
}

fn init_logging(format: LogFormat, filter: tracing_subscriber::EnvFilter) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    let installed = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
    if installed.is_ok() {
        std::panic::set_hook(Box::new(log_panic));
    }
}

/// A panic, as a log line like the others (a JSON object with JSON logs), where the default
/// hook would write lines of its own to stderr. The relay contains a panic in a sink (the call
/// fails as a whole) or in a pipeline's loop (that relay stops with an error) and reports it;
/// this line says where it happened (and the backtrace, with `RUST_BACKTRACE=1`).
fn log_panic(info: &std::panic::PanicHookInfo<'_>) {
    let message = outboxkit_core::error::panic_message(info.payload());
    let location = info
        .location()
        .map(|l| format!("{}:{}", l.file(), l.line()))
        .unwrap_or_default();
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        tracing::error!(%location, %backtrace, "panicked: {message}");
    } else {
        tracing::error!(%location, "panicked: {message}");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::{command_name, contained, log_filter, log_panic, use_colour, Failure};

    /// A panic that reaches `main` (a store's `build` under `migrate`, say) ends the command
    /// with exit code 1 and the `error:` line, as any failure does; what the command returned
    /// otherwise is kept.
    #[test]
    fn a_panic_in_a_command_is_a_failure_with_exit_code_1() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        let failure = contained(&runtime, async {
            tokio::task::yield_now().await;
            panic!("the store cannot build its pool: {}", "bad option")
        })
        .unwrap_err();
        assert_eq!(failure.code, 1);
        assert!(
            failure.message.starts_with(
                "outbox-relay panicked: the store cannot build its pool: bad option (a bug, most \
                 likely in an adapter;"
            ),
            "{}",
            failure.message
        );
        let failure = contained(&runtime, async { Err(Failure::config("store.url: bad")) });
        assert_eq!(failure.unwrap_err().code, 2);
        assert!(contained(&runtime, async { Ok(()) }).is_ok());
    }

    /// A panic caught by the relay still leaves one line, in the log's own format.
    #[test]
    fn a_panic_is_one_log_line_in_the_log_format() {
        let written = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = written.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_ansi(false)
            .with_writer(move || WriteTo(sink.clone()))
            .finish();
        std::panic::set_hook(Box::new(log_panic));
        let caught = tracing::subscriber::with_default(subscriber, || {
            std::panic::catch_unwind(|| panic!("the sink broke on event {}", 7))
        });
        let _ = std::panic::take_hook();
        assert!(caught.is_err());
        let text = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).expect("a JSON line");
        assert_eq!(line["level"], "ERROR", "{line}");
        assert_eq!(
            line["fields"]["message"],
            "panicked: the sink broke on event 7"
        );
        let location = line["fields"]["location"].as_str().unwrap_or_default();
        assert!(location.starts_with("relay-bin/src/cli.rs:"), "{line}");
    }

    struct WriteTo(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for WriteTo {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_command_is_named_by_the_file_name_it_was_started_as() {
        let name = |argv0: Option<&str>| command_name(argv0.map(Into::into));
        assert_eq!(
            name(Some("/usr/local/bin/outbox-mqtt-relay")),
            "outbox-mqtt-relay"
        );
        assert_eq!(name(Some("./outbox-relay")), "outbox-relay");
        assert_eq!(name(Some("outbox-webhook-relay")), "outbox-webhook-relay");
        assert_eq!(name(None), "outbox-relay");
        assert_eq!(name(Some("")), "outbox-relay");
        assert_eq!(name(Some("/")), "outbox-relay");
    }

    #[test]
    fn a_log_filter_word_that_is_no_level_is_refused() {
        for good in [
            "info",
            "WARN",
            "off",
            "info,outboxkit_core=debug",
            "warn,lapin=info",
        ] {
            assert!(log_filter(good, None).is_ok(), "log.level {good:?}");
            assert!(
                log_filter("bogus", Some(good.into())).is_ok(),
                "RUST_LOG {good:?}"
            );
        }
        // An empty RUST_LOG is as good as none.
        assert!(log_filter("debug", Some(" ".into())).is_ok());
        let error = log_filter("warning", None).unwrap_err();
        assert!(
            error.starts_with("log.level: `warning` is not a level (error, warn, info,"),
            "{error}"
        );
        assert!(error.contains("crate=level"), "{error}");
        let error = log_filter("info", Some("info,outboxkit_core".into())).unwrap_err();
        assert!(
            error.starts_with("RUST_LOG: `outboxkit_core` is not a level"),
            "{error}"
        );
        let error = log_filter("", None).unwrap_err();
        assert_eq!(error, "log.level: must not be empty (e.g. \"info\")");
        let error = log_filter("info,outboxkit_core=loud", None).unwrap_err();
        assert!(
            error.starts_with("log.level: \"info,outboxkit_core=loud\" is not a log filter: "),
            "{error}"
        );
    }

    #[test]
    fn crates_that_log_payloads_or_expected_races_are_quiet_unless_named() {
        for (level, rust_log) in [("info", None), ("error", Some("debug".to_owned()))] {
            let filter = log_filter(level, rust_log).unwrap().to_string();
            assert!(
                filter.contains("lapin=off") && filter.contains("pgwire_replication=off"),
                "{filter}"
            );
        }
        let filter = log_filter("info", Some("debug,lapin=debug".into()))
            .unwrap()
            .to_string();
        assert!(
            filter.contains("lapin=debug") && !filter.contains("lapin=off"),
            "{filter}"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some("".into())));
        assert!(!use_colour(true, Some("1".into())));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some("1".into())));
    }
}
