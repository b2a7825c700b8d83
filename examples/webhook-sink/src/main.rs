//! `outbox-webhook-relay`: the `outbox-relay` command line (`run`, `migrate`, `status`...)
//! with every built-in adapter plus the webhook sink.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut registry = outbox_relay::Registry::builtin();
    outbox_webhook_sink::register(&mut registry);
    outbox_relay::main(registry)
}
