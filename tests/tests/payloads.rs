//! End to end: payloads of `text` and `binary` tables reach every shipped broker byte for byte,
//! from PostgreSQL and from MariaDB, through a real `outbox-relay run` process: every byte value
//! 0–255 (not valid UTF-8) with and without a content type of its own, and JSON no database
//! rendered (key order, spaces, `1.0`, a trailing newline) and XML.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use outboxkit_core::{NewEvent, Payload, PayloadType};
use outboxkit_harness::*;
use uuid::Uuid;

/// `store: StoreSide constructor, broker: BrokerSide constructor;` makes the tests
/// `store_broker::binary` and `store_broker::text`.
macro_rules! pairs {
    ($($pair:ident: $store:path, $broker:path;)*) => {$(
        mod $pair {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn binary_payloads_arrive_byte_for_byte() {
                let name = unique(concat!(stringify!($pair), "_bin"));
                let store = Arc::new($store(&name).await);
                run(store, Arc::new($broker(&name).await), PayloadType::Binary).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn text_payloads_arrive_byte_for_byte() {
                let name = unique(concat!(stringify!($pair), "_txt"));
                let store = Arc::new($store(&name).await);
                run(store, Arc::new($broker(&name).await), PayloadType::Text).await;
            }
        }
    )*};
}

pairs! {
    postgres_redis: PostgresSide::open, RedisSide::open;
    mysql_redis: MySqlSide::open, RedisSide::open;
    postgres_kafka: PostgresSide::open, KafkaSide::open;
    mysql_kafka: MySqlSide::open, KafkaSide::open;
    postgres_rabbitmq: PostgresSide::open, RabbitMqSide::open;
    mysql_rabbitmq: MySqlSide::open, RabbitMqSide::open;
    postgres_sqs: PostgresSide::open, SqsSide::standard;
    mysql_sqs: MySqlSide::open, SqsSide::standard;
}

/// The payloads of a table of `payload_type`.
fn payloads(payload_type: PayloadType) -> Vec<Payload> {
    match payload_type {
        PayloadType::Binary => vec![
            Payload::Binary((0..=255).collect()),
            Payload::Binary((0..=255).rev().collect()),
            Payload::Binary(vec![0, 0, 0, 0, 42, 2, 0x80, 0xff]),
        ],
        _ => vec![
            Payload::Text("{\"z\": 1.0,   \"a\" : [ 1 ,2 ],\"caf\u{e9}\": null}\n".into()),
            Payload::Text("<order id='42'>caf\u{e9} \u{2713}</order>".into()),
            Payload::Json(r#"{"b":2,"a":1}"#.into()),
        ],
    }
}

async fn run(store: Arc<dyn StoreSide>, broker: Arc<dyn BrokerSide>, payload_type: PayloadType) {
    let mut scenario = Scenario::prepare(
        store,
        broker.clone(),
        Settings::default().store(&format!("payload_type = \"{payload_type}\"")),
    )
    .await;
    let events: Vec<NewEvent> = payloads(payload_type)
        .into_iter()
        .enumerate()
        .map(|(i, payload)| {
            let event = NewEvent::new("order", "o-1", "Changed", payload).event_id(Uuid::now_v7());
            // The first keeps its table's default content type.
            match i {
                0 => event,
                _ => event.content_type("application/vnd.test+x"),
            }
        })
        .collect();
    scenario.store.enqueue_many(&events).await;
    scenario.start_relay("relay-payloads", &[]);
    scenario
        .drain("every event published", Duration::from_secs(60))
        .await;

    let expected: HashSet<Uuid> = events.iter().filter_map(|e| e.event_id).collect();
    let delivered = broker.read_back(&expected, Duration::from_secs(30)).await;
    let by_id: HashMap<Uuid, &Delivered> = delivered.iter().map(|d| (d.event_id, d)).collect();
    for event in &events {
        let id = event.event_id.unwrap();
        let message = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("{}: event {id} never arrived", broker.name()));
        assert_eq!(
            message.payload,
            event.payload.as_bytes(),
            "{}, {payload_type} table: the payload of {id} is not byte for byte what was written",
            broker.name()
        );
    }
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    scenario.cleanup().await;
}
