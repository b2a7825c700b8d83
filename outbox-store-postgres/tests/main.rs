//! The integration tests, one module per file, in one test binary: a binary per file would
//! link the drivers again for each.

mod common;
mod inbox;
mod postgres;
mod store_suite;
