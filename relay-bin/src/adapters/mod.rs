//! Factories of the adapters this project ships, one module each, behind its cargo feature.
//! Each module has `pub fn register(&mut Registry)`.

use crate::registry::Registry;

#[cfg(feature = "sink-kafka")]
pub mod kafka;
#[cfg(feature = "store-mysql")]
pub mod mysql;
#[cfg(feature = "store-postgres")]
pub mod postgres;
#[cfg(feature = "sink-rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "sink-redis-streams")]
pub mod redis_streams;
#[cfg(feature = "sink-sqs")]
pub mod sqs;

/// Register every adapter compiled in.
pub fn register_builtin(#[allow(unused_variables)] registry: &mut Registry) {
    #[cfg(feature = "store-mysql")]
    mysql::register(registry);
    #[cfg(feature = "store-postgres")]
    postgres::register(registry);
    #[cfg(feature = "sink-rabbitmq")]
    rabbitmq::register(registry);
    #[cfg(feature = "sink-redis-streams")]
    redis_streams::register(registry);
    #[cfg(feature = "sink-kafka")]
    kafka::register(registry);
    #[cfg(feature = "sink-sqs")]
    sqs::register(registry);
}
