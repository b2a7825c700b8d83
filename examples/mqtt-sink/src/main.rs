//! `outbox-mqtt-relay`: the `outbox-relay` command line (`run`, `migrate`, `status`...) with
//! the built-in adapters plus `kind = "mqtt"`.

fn main() -> std::process::ExitCode {
    let mut registry = outboxkit_relay::Registry::builtin();
    registry.sink::<outboxkit_mqtt_sink::MqttConfig>();
    outboxkit_relay::main_with_version(registry, env!("CARGO_PKG_VERSION"))
}
