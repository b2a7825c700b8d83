//! `outbox-webhook-relay`: the `outbox-relay` command line (`run`, `migrate`, `status`...)
//! with every built-in adapter plus the webhook sink.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut registry = outboxkit_relay::Registry::builtin();
    outboxkit_webhook_sink::register(&mut registry);
    outboxkit_relay::main(registry)
}
