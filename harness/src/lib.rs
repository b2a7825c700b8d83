//! The test harness of outbox relay: one copy of the end-to-end scenario and of the pieces it
//! is made of, for the tests, the demo (`outbox-demo`) and the benchmark (`outboxkit-bench`).
//!
//! - [`StoreSide`]: a database with its outbox table — connect, create and drop the tables, one
//!   business transaction that commits or rolls back, pending count, a bulk load, the server's
//!   version. [`PostgresSide`], [`MySqlSide`].
//! - [`BrokerSide`]: a broker with the destinations of one test — the sink's settings section,
//!   preparing the destinations, [`BrokerSide::read_back`] by an independent consumer (and
//!   [`BrokerSide::held`], [`BrokerSide::watch`] for counts and arrival times), and the
//!   broker's own checks of what arrived. [`RedisSide`], [`KafkaSide`], [`RabbitMqSide`],
//!   [`SqsSide`], [`SnsSide`], [`NatsSide`]. They use the brokers' client crates, never our
//!   sink crates.
//! - [`Scenario`]: real `outbox-relay run` processes between a store side and a broker side;
//!   [`Writers`] with a deterministic PRNG and rollbacks; SIGKILL and restart of a relay; a
//!   [`Fault`] (freeze or restart a broker or a database); drain; read back; [`check_delivery`].
//!
//! Each side is behind a cargo feature that brings in its client crate and nothing else
//! (`postgres`, `mysql`, `redis-streams`, `kafka`, `rabbitmq`, `sqs`, `sns`, `nats`; all on by
//! default). The crate's binary `outbox-demo` is the Quickstart demo (`scripts/demo.sh`), built
//! with only the features of the pair it runs. Feature `sink-suite` makes each broker side the consumer half
//! of `outboxkit-core`'s sink conformance suite (`SuiteConsumer`); the sink crates' own tests
//! use the sides that way, and for their broker's raw messages (`StreamEntry`, `KafkaRecord`...).
//!
//! Services are real. A test fails — never skips — when one is unreachable. Every test names its
//! own tables, streams, topics and queues ([`unique`]).

mod broker;
mod delivery;
mod metrics_doc;
mod netns;
#[cfg(any(
    feature = "kafka",
    feature = "nats",
    feature = "sqs",
    feature = "redis-streams"
))]
mod process;
pub mod proxy;
mod relay;
mod scenario;
mod store;
pub mod tls;
mod util;

#[cfg(feature = "sqs")]
pub use aws_sdk_sqs::types::QueueAttributeName;
#[cfg(feature = "kafka")]
pub use broker::kafka::{kafka_bootstrap, KafkaBrokerProcess, KafkaRecord, KafkaSide};
#[cfg(feature = "nats")]
pub use broker::nats::{
    nats_url, stream_name as nats_stream_name, NatsMessage, NatsSide, PrivateNats,
};
#[cfg(feature = "redis-streams")]
pub use broker::private_redis::PrivateRedis;
#[cfg(feature = "rabbitmq")]
pub use broker::rabbitmq::{
    amqp_headers, rabbitmq_address, rabbitmq_url, rabbitmqctl, RabbitMqApp, RabbitMqSide,
};
#[cfg(feature = "redis-streams")]
pub use broker::redis::{redis_behind_blackhole, redis_url, RedisSide, StreamEntry};
#[cfg(feature = "sns")]
pub use broker::sns::SnsSide;
#[cfg(feature = "sqs")]
pub use broker::sqs::{sqs_endpoint, OwnSqsServer, SqsMessage, SqsSide, AWS_ENV};
pub use broker::{BrokerSide, AGGREGATE_TYPES};
pub use delivery::{check_delivery, Committed, Delivered, DeliveryCheck};
pub use metrics_doc::{
    assert_metrics_documented, documented_metrics, metrics_table, scrape_documented,
    DocumentedMetric,
};
pub use netns::{Link, NetworkHost};
#[cfg(any(
    feature = "kafka",
    feature = "nats",
    feature = "sqs",
    feature = "redis-streams"
))]
pub use process::{OwnProcess, OwnServer};
pub use relay::{pipelines_config, relay_binary, relay_config, run_cli, RelayProcess, Settings};
pub use scenario::{
    aggregate_type, placed_events, scenario_event, Fault, Outage, Plan, Run, Scale, Scenario,
    WriteError, WriterPlan, Writers, Writes, TRACEPARENT,
};
#[cfg(feature = "postgres")]
pub use store::logical::LogicalSide;
#[cfg(feature = "mysql")]
pub use store::mysql::{mysql_url, MySqlSide, PrivateMariaDb};
#[cfg(feature = "postgres")]
pub use store::postgres::{postgres_url, PostgresSide};
#[cfg(feature = "postgres")]
pub use store::private_postgres::{ClientAuth, PrivatePgBouncer, PrivatePostgres};
pub use store::{DeadRow, StoreSide, TableLock, PENDING};
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub use store::{SqlOutbox, SqlSide};
pub use util::{
    assert_no_error_lines, free_port, http_get, http_get_at, metric_at, metric_value,
    one_pipeline_config, peak_rss_mib, running_as_root, scratch_dir, unique, wait_for,
    wait_for_metric, wait_for_ready, write_file,
};

/// One end-to-end test per SQL store for the case `$case(name, store)`: `$postgres` on a
/// [`PostgresSide`], `$mysql` on a [`MySqlSide`], each on tables named by [`unique`]`($prefix)`.
/// The calling crate needs `tokio` (macros, multi-threaded runtime).
#[cfg(all(feature = "postgres", feature = "mysql"))]
#[macro_export]
macro_rules! on_each_sql_store {
    ($case:ident, $prefix:literal, $postgres:ident, $mysql:ident) => {
        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $postgres() {
            let name = $crate::unique($prefix);
            let store = ::std::sync::Arc::new($crate::PostgresSide::open(&name).await);
            $case(&name, store).await;
        }

        #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $mysql() {
            let name = $crate::unique($prefix);
            let store = ::std::sync::Arc::new($crate::MySqlSide::open(&name).await);
            $case(&name, store).await;
        }
    };
}
