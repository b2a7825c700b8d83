//! An outbox relay sink for a broker the project does not ship, an HTTP webhook (one `POST`
//! of a JSON document per event, `Idempotency-Key` = `event_id`), and its relay binary
//! `outbox-webhook-relay`. `README.md` walks through it as a guide to writing a sink.
//!
//! - [`WebhookSinkConfig`] is `[sink.webhook]` and implements
//!   [`SinkConfig`](outboxkit_core::SinkConfig): the relay's registry does the rest;
//! - [`WebhookSink`] is the [`Sink`](outboxkit_core::Sink);
//! - [`classify`] turns HTTP answers and transport failures into error kinds.

pub mod classify;
mod config;
mod sink;

pub use config::{is_reserved, redact, WebhookSinkConfig, RESERVED_HEADERS};
pub use sink::WebhookSink;
