//! Conformance suites (feature `testkit`): every `Store` runs the store suite, every `Sink` the
//! sink suite — a custom sink in a user's crate can run it too. And a custom relay binary run
//! end to end ([`relay_process`]).

pub mod cloudevents;
pub mod relay_process;
pub mod sink_suite;
pub mod store_suite;
