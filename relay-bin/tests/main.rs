//! The integration tests, one module per file, in one test binary: a binary per file would
//! link the drivers again for each.

mod binary;
mod commands_doc;
mod config_command;
mod config_errors;
mod configuration_doc;
mod panics;
