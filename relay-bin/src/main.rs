fn main() -> std::process::ExitCode {
    outboxkit_relay::main(outboxkit_relay::Registry::builtin())
}
