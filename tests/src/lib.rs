//! The end-to-end and chaos tests of outbox relay (`tests/`), against real services and real
//! `outbox-relay run` processes. Everything they share — store and broker sides, relay
//! processes, writers, the scenario and its delivery check — is in the `outboxkit-harness`
//! crate.
