//! The relay engine (being written).
#[derive(Debug)]
pub struct Relay;
#[derive(Debug)]
pub struct RelayHandle;
#[derive(Debug)]
pub struct Shutdown;
