//! The integration tests, one module per file, in one test binary: a binary per file would
//! link the drivers again for each.

mod redis;
mod sink_suite;
mod sink_suite_tls;
mod tls;
