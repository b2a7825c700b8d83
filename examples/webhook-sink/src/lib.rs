//! A custom outbox relay sink for a broker the project does not ship: an HTTP webhook (one
//! `POST` of a JSON document per event, `Idempotency-Key` = `event_id`), and the relay binary
//! built on it, `outbox-webhook-relay`. `README.md` walks through it as a guide to writing your
//! own sink.
//!
//! The binary is `main` plus one registration call:
//!
//! ```rust,no_run
//! fn main() -> std::process::ExitCode {
//!     let mut registry = outboxkit_relay::Registry::builtin();
//!     outboxkit_webhook_sink::register(&mut registry);
//!     outboxkit_relay::main(registry)
//! }
//! ```
//!
//! Used as a library, [`WebhookSink::new`] builds the sink from a [`WebhookSinkConfig`]:
//!
//! ```rust,no_run
//! use outboxkit_core::Sink;
//! use outboxkit_webhook_sink::{WebhookSink, WebhookSinkConfig};
//!
//! # async fn run() -> outboxkit_core::Result<()> {
//! let mut config = WebhookSinkConfig::new("https://hooks.example.com/outbox");
//! config.path = "{aggregate_type}/{event_type}".to_owned();
//! let sink = WebhookSink::new(config)?;
//! sink.check().await?;
//! # Ok(())
//! # }
//! ```

pub mod classify;
mod config;
mod sink;

use std::sync::Arc;

use outboxkit_core::{DestinationTemplate, Error, Result};
use outboxkit_relay::settings::{locate, sink_section};
use outboxkit_relay::{BoxFuture, FactoryContext, Registry};

pub use config::{looks_secret, redact_url, WebhookSinkConfig, CONFIG_SECTION, RESERVED_HEADERS};
pub use sink::WebhookSink;

/// The `[sink]` sub-table of this sink: `[sink.webhook]`.
const SECTION: &str = "webhook";

/// Register `kind = "webhook"` (settings in `[sink.webhook]`) in a relay's registry, with a
/// check of those settings that runs before the relay connects to anything.
pub fn register(registry: &mut Registry) {
    registry.register_sink(WebhookSink::KIND, webhook_sink);
    registry.register_sink_check(WebhookSink::KIND, |ctx| webhook_config(ctx).map(drop));
}

/// `[sink.webhook]` with `[sink] destination` applied (it replaces `path`), checked; errors
/// name the key and where it was set.
pub fn webhook_config(ctx: FactoryContext<'_>) -> Result<WebhookSinkConfig> {
    let file = ctx.file.map(|p| p.as_path());
    let mut config: WebhookSinkConfig =
        sink_section(ctx.figment, SECTION, file).map_err(|e| Error::config(e.0))?;
    if let Some(destination) = &ctx.settings.sink.destination {
        DestinationTemplate::parse(destination).map_err(|e| {
            let e = e.context("sink.destination");
            Error::config(locate(e.message(), ctx.figment, file))
        })?;
        config.path = destination.clone();
    }
    config
        .validate()
        .map_err(|e| Error::config(locate(e.message(), ctx.figment, file)))?;
    Ok(config)
}

/// The factory: build the sink from its settings (no network I/O; the relay calls
/// [`Sink::check`](outboxkit_core::Sink::check) before it starts).
fn webhook_sink(ctx: FactoryContext<'_>) -> BoxFuture<'_, Result<Arc<dyn outboxkit_core::Sink>>> {
    Box::pin(async move {
        let config = webhook_config(ctx)?;
        let sink = WebhookSink::new(config)?;
        Ok(Arc::new(sink) as Arc<dyn outboxkit_core::Sink>)
    })
}
