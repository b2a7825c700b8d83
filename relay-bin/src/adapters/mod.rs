//! Factories of the adapters this project ships, one module each, behind its cargo feature.
//! Each module has `pub fn register(&mut Registry)`.

use crate::registry::Registry;

#[cfg(feature = "store-postgres")]
pub mod postgres;
#[cfg(feature = "sink-redis-streams")]
pub mod redis_streams;

/// Register every adapter compiled in.
pub fn register_builtin(#[allow(unused_variables)] registry: &mut Registry) {
    #[cfg(feature = "store-postgres")]
    postgres::register(registry);
    #[cfg(feature = "sink-redis-streams")]
    redis_streams::register(registry);
}
