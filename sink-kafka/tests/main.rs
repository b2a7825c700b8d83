//! The integration tests, one module per file, in one test binary: a binary per file would
//! link the drivers again for each.

mod kafka;
mod mock_cluster;
mod sink_suite;
