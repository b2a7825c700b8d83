#![doc = include_str!("../README.md")]

#[cfg(test)]
mod adapters;
mod check;
pub mod cli;
pub mod dead;
mod effective;
pub mod events;
mod out;
pub mod pause;
pub mod pipeline;
pub mod registry;
pub mod replay;
pub mod server;
pub mod settings;
pub mod status;
pub mod supervisor;

pub use cli::{main, main_with_version};
pub use registry::{
    sink_config, sink_config_in_file, store_config, BoxFuture, FactoryContext, Registry,
};
