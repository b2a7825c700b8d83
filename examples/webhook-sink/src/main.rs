//! `outbox-webhook-relay`: the `outbox-relay` command line with every built-in adapter plus
//! the webhook sink.

fn main() -> std::process::ExitCode {
    let mut registry = outboxkit_relay::Registry::builtin();
    registry.sink::<outboxkit_webhook_sink::WebhookSinkConfig>();
    outboxkit_relay::main_with_version(registry, env!("CARGO_PKG_VERSION"))
}
