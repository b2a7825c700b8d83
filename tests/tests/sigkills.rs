//! Relays SIGKILLed again and again: the matrix's scenario (writers with rollbacks, three
//! `outbox-relay run` processes, drain, an independent consumer's delivery check), with a relay
//! SIGKILLed and restarted every second from a third of the way on, each in turn, so shards
//! change hands many times while batches are in flight — on Kafka (delivery reports of an
//! idempotent producer, a new producer at each restart) from MariaDB, and on RabbitMQ
//! (publisher confirms) from PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use outboxkit_harness::*;

async fn run(store: Arc<dyn StoreSide>, broker: Arc<dyn BrokerSide>) {
    let mut scenario = Scenario::prepare(store, broker, Settings::default()).await;
    let run = scenario
        .run(Plan::new(Scale::FULL).sigkilling_every(Duration::from_secs(1)))
        .await;
    assert!(run.sigkills >= 3, "only {} SIGKILLs", run.sigkills);
    scenario.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mysql_kafka_survives_a_sigkill_every_second() {
    let name = unique("killk");
    run(
        Arc::new(MySqlSide::open(&name).await),
        Arc::new(KafkaSide::open(&name).await),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_rabbitmq_survives_a_sigkill_every_second() {
    let name = unique("killr");
    run(
        Arc::new(PostgresSide::open(&name).await),
        Arc::new(RabbitMqSide::open(&name).await),
    )
    .await;
}
