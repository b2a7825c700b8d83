//! Store conformance suite (being written).
