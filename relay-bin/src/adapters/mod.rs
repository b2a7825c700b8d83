//! Tests of the shipped adapters' settings as the registry reads them: defaults, the
//! environment, `sink.destination`, and errors that name the key and where it was set.

#[cfg(feature = "sink-kafka")]
mod kafka;
#[cfg(feature = "sink-rabbitmq")]
mod rabbitmq;
#[cfg(feature = "sink-sqs")]
mod sqs;
