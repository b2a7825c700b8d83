//! The command line: `run`, `migrate`, `status`, `dead`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use outboxkit_core::{ErrorKind, Relay, Shutdown, Store};
use tracing::{info, warn};

use crate::registry::{FactoryContext, Registry};
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
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Relay until SIGTERM/SIGINT; serves /metrics, /healthz and /readyz.
    Run,
    /// Create or upgrade the outbox table (idempotent).
    Migrate,
    /// Backlog figures and shard owners.
    Status {
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
    /// Dead events: list, retry, discard.
    Dead {
        #[command(subcommand)]
        command: crate::dead::DeadCommand,
    },
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

/// `outbox-relay --version`: the version and the adapters compiled in.
pub fn long_version(registry: &Registry) -> String {
    format!(
        "{} (stores: {}; sinks: {})",
        env!("CARGO_PKG_VERSION"),
        registry.store_kinds().join(", "),
        registry.sink_kinds().join(", ")
    )
}

/// The binary's `main`: parse the command line, run the command, map failures to exit codes.
/// A custom binary calls this with its own registry.
pub fn main(registry: Registry) -> ExitCode {
    // Built once per process; clap wants 'static strings.
    let version: &'static str = Box::leak(long_version(&registry).into_boxed_str());
    let command = Cli::command().version(version).long_version(version);
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
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
    match runtime.block_on(execute(cli, registry)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("error: {}", one_line(&failure.message));
            ExitCode::from(failure.code)
        }
    }
}

/// Run one parsed command.
pub async fn execute(cli: Cli, registry: Registry) -> Result<(), Failure> {
    match cli.command {
        Command::Run => {
            let (settings, figment) = load(&cli)?;
            let ctx = FactoryContext {
                settings: &settings,
                figment: &figment,
                file: cli.config.as_ref(),
            };
            // Every configuration error before anything connects.
            registry.check_config(ctx)?;
            check_listen(&settings.server.listen, &figment, &cli)?;
            let store = connect_store(&registry, &settings, &figment, &cli).await?;
            let sink = registry.build_sink(ctx).await?;
            store.check().await?;
            sink.check().await?;
            run(store, sink, &settings).await
        }
        Command::Migrate => {
            let (settings, figment) = load(&cli)?;
            let store = connect_store(&registry, &settings, &figment, &cli).await?;
            store.migrate().await?;
            println!("migrated {}", store.describe());
            Ok(())
        }
        Command::Status { json } => {
            let (settings, figment) = load(&cli)?;
            let store = connect_store(&registry, &settings, &figment, &cli).await?;
            crate::status::print(store.as_ref(), json).await
        }
        Command::Dead { ref command } => {
            let (settings, figment) = load(&cli)?;
            let store = connect_store(&registry, &settings, &figment, &cli).await?;
            crate::dead::run(store.as_ref(), command).await
        }
    }
}

fn load(cli: &Cli) -> Result<(Settings, figment::Figment), Failure> {
    let (settings, figment) = settings::load(cli.config.as_deref())?;
    init_logging(
        cli.log_format.unwrap_or(settings.log.format),
        &settings.log.level,
    );
    Ok((settings, figment))
}

/// Build the store; its configuration errors (`store.table: ...`) say where the key was set.
async fn connect_store(
    registry: &Registry,
    settings: &Settings,
    figment: &figment::Figment,
    cli: &Cli,
) -> Result<Arc<dyn Store>, Failure> {
    let ctx = FactoryContext {
        settings,
        figment,
        file: cli.config.as_ref(),
    };
    Ok(registry.build_store(ctx).await?)
}

/// `server.listen` must be an address (checked before connecting to anything).
fn check_listen(listen: &str, figment: &figment::Figment, cli: &Cli) -> Result<(), Failure> {
    if listen.is_empty() || listen.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(());
    }
    let message = format!("server.listen: \"{listen}\" is not an address like 127.0.0.1:9464");
    Err(Failure::config(format!(
        "invalid configuration: {}",
        settings::locate(&message, figment, cli.config.as_deref())
    )))
}

async fn run(
    store: Arc<dyn Store>,
    sink: Arc<dyn outboxkit_core::Sink>,
    settings: &Settings,
) -> Result<(), Failure> {
    let metrics = crate::server::install_recorder().map_err(Failure::runtime)?;
    let relay = Relay::new(store, sink, settings.relay.clone())?;
    let handle = relay.handle();
    let (trigger, shutdown) = Shutdown::channel();

    if !settings.server.listen.is_empty() {
        let listener = crate::server::bind(&settings.server.listen)
            .await
            .map_err(Failure::config)?;
        tokio::spawn(crate::server::serve(
            listener,
            handle.clone(),
            metrics,
            shutdown.clone(),
        ));
    }

    tokio::spawn(async move {
        wait_for_signal().await;
        info!("shutdown requested: finishing in-flight work");
        trigger.trigger();
        wait_for_signal().await;
        warn!("second signal: exiting now; unacknowledged events stay pending");
        std::process::exit(130);
    });

    relay.run(shutdown).await?;
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Colour only on a terminal, and not when `NO_COLOR` is set to anything non-empty
/// (<https://no-color.org>): files and container logs get plain text.
fn use_colour(stderr_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_logging(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    // lapin logs every returned message at WARN with its payload and headers: keep event
    // contents out of the relay's logs unless RUST_LOG asks for them.
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(format!("{level},lapin=error")))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::use_colour;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(use_colour(true, Some("".into())));
        assert!(!use_colour(true, Some("1".into())));
        assert!(!use_colour(false, None));
        assert!(!use_colour(false, Some("1".into())));
    }
}
