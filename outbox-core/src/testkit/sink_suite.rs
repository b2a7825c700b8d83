//! Sink conformance suite (being written).
