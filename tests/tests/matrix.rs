//! The end-to-end scenario on every store × broker pair: concurrent writers (business
//! transactions, about one in 50 rolled back), real `outbox-relay run` processes, one SIGKILLed
//! and restarted mid-run, drain, then an independent consumer reads everything back: every
//! committed `event_id` arrived, no rolled-back one did, and first deliveries kept each
//! aggregate's order (see `outboxkit_harness::Scenario::run`), plus each broker side's own
//! checks (routing, keys, partitions, headers).
//!
//! Adding a broker (or a store) is a side in the harness and a row here.

use std::sync::Arc;

use outboxkit_harness::*;

/// `pair: StoreSide constructor, BrokerSide constructor, scale => test name;` makes the test
/// `pair::test name`. Both constructors take the test's unique name (its tables, streams,
/// topics, queues).
macro_rules! matrix {
    ($($pair:ident: $store:path, $broker:path, $scale:expr => $test:ident;)*) => {$(
        mod $pair {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $test() {
                let name = unique(stringify!($pair));
                run(
                    Arc::new($store(&name).await),
                    Arc::new($broker(&name).await),
                    $scale,
                )
                .await;
            }
        }
    )*};
}

async fn run(store: Arc<dyn StoreSide>, broker: Arc<dyn BrokerSide>, scale: Scale) {
    let mut scenario = Scenario::prepare(store, broker, Settings::default()).await;
    scenario.run(Plan::new(scale)).await;
    scenario.cleanup().await;
}

matrix! {
    postgres_redis: PostgresSide::open, RedisSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    mysql_redis: MySqlSide::open, RedisSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    postgres_kafka: PostgresSide::open, KafkaSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    mysql_kafka: MySqlSide::open, KafkaSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    postgres_rabbitmq: PostgresSide::open, RabbitMqSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    mysql_rabbitmq: MySqlSide::open, RabbitMqSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    postgres_nats: PostgresSide::open, NatsSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    mysql_nats: MySqlSide::open, NatsSide::open, Scale::FULL
        => three_relays_one_sigkilled_deliver_every_event_in_order;
    postgres_sqs_standard: PostgresSide::open, SqsSide::standard, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event;
    mysql_sqs_standard: MySqlSide::open, SqsSide::standard, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event;
    postgres_sqs_fifo: PostgresSide::open, SqsSide::fifo, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event_in_group_order;
    mysql_sqs_fifo: MySqlSide::open, SqsSide::fifo, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event_in_group_order;
    postgres_sns_standard: PostgresSide::open, SnsSide::standard, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event;
    mysql_sns_standard: MySqlSide::open, SnsSide::standard, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event;
    postgres_sns_fifo: PostgresSide::open, SnsSide::fifo, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event_in_group_order;
    mysql_sns_fifo: MySqlSide::open, SnsSide::fifo, Scale::SQS
        => two_relays_one_sigkilled_deliver_every_event_in_group_order;
}
