fn main() -> std::process::ExitCode {
    outbox_relay::main(outbox_relay::Registry::builtin())
}
