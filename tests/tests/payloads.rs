//! End to end: payloads of `text` and `binary` tables reach every shipped broker byte for byte,
//! from PostgreSQL and from MariaDB, through a real `outbox-relay run` process: every byte value
//! 0–255 (not valid UTF-8) with and without a content type of its own, and JSON no database
//! rendered (key order, spaces, `1.0`, a trailing newline) and XML; large payloads in bounded
//! memory; and an empty payload as a Kafka tombstone.

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

/// Large payloads pass a block at a time: the relay claims as many rows as `relay.batch_bytes`
/// holds (8 MiB), not `relay.batch_size` (500). 400 events of 512 KiB, 200 MiB in all, were
/// one claim before (the relay peaked near 390 MiB); now the peak does not depend on the
/// backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_payloads_pass_through_bounded_memory() {
    let name = unique("large_payloads");
    let broker = Arc::new(RedisSide::open(&name).await);
    let mut scenario = Scenario::prepare(
        Arc::new(PostgresSide::open(&name).await),
        broker.clone(),
        Settings::default().store("payload_type = \"text\""),
    )
    .await;
    let events: Vec<NewEvent> = (0..400)
        .map(|i| {
            let payload = Payload::Text(format!("{i:08}").repeat(64 * 1024));
            NewEvent::new("order", format!("o-{}", i % 20), "Changed", payload)
                .event_id(Uuid::now_v7())
        })
        .collect();
    let delivered = relay_all(&mut scenario, broker.as_ref(), &events).await;
    let peak = peak_rss_mib(scenario.relays[0].id());
    let expected: HashSet<Uuid> = events.iter().filter_map(|e| e.event_id).collect();
    let arrived: HashSet<Uuid> = delivered
        .iter()
        .filter(|d| d.payload.len() == 512 * 1024)
        .map(|d| d.event_id)
        .collect();
    assert_eq!(arrived, expected, "every event, its whole payload");
    // A debug build's relay holding two claims of about 8 MiB peaks near 100 MiB here
    // (its payloads are copied on their way to the broker, and the allocator keeps freed
    // blocks); one claim of the whole backlog took it to 390 MiB.
    assert!(peak > 0.0 && peak < 160.0, "peak RSS {peak:.1} MiB");
    let relay = &mut scenario.relays[0];
    let exit = relay.terminate(Duration::from_secs(20));
    assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
    scenario.cleanup().await;
}

/// With `sink.kafka.tombstone_on_empty_payload`, an event whose payload a writer left empty — the
/// JSON `null` in a `json` table — reaches Kafka as a tombstone (its aggregate's key, its
/// headers, no value), from PostgreSQL and from MariaDB (each renders the document its own way);
/// the events around it arrive as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_json_payload_reaches_kafka_as_a_tombstone() {
    for postgres in [true, false] {
        let name = unique(if postgres { "tomb_pg" } else { "tomb_my" });
        let store: Arc<dyn StoreSide> = if postgres {
            Arc::new(PostgresSide::open(&name).await)
        } else {
            Arc::new(MySqlSide::open(&name).await)
        };
        let kafka = Arc::new(KafkaSide::open(&name).await);
        let mut scenario = Scenario::prepare(
            store,
            kafka.clone(),
            Settings::default().sink("tombstone_on_empty_payload = true"),
        )
        .await;
        let events: Vec<NewEvent> = [
            serde_json::json!({"name": "Ada"}),
            serde_json::Value::Null,
            serde_json::json!({"name": "Grace"}),
        ]
        .into_iter()
        .map(|payload| NewEvent::new("order", "o-1", "Changed", payload).event_id(Uuid::now_v7()))
        .collect();
        relay_all(&mut scenario, kafka.as_ref(), &events).await;
        let records = kafka
            .read_topic(&kafka.destination("order"), 3, Duration::from_secs(30))
            .await;
        let store_name = scenario.store.name().to_owned();
        let tombstones: Vec<(String, bool, usize)> = events
            .iter()
            .map(|event| {
                let id = event.event_id.unwrap().to_string();
                let m = records
                    .iter()
                    .find(|m| m.header("event_id") == Some(id.as_str()))
                    .unwrap_or_else(|| panic!("{store_name}: event {id} never reached Kafka"));
                (m.key_text(), m.tombstone, m.payload.len())
            })
            .collect();
        assert_eq!(
            tombstones
                .iter()
                .map(|t| (t.0.as_str(), t.1))
                .collect::<Vec<_>>(),
            [("o-1", false), ("o-1", true), ("o-1", false)],
            "{store_name}: (key, tombstone) of each event"
        );
        assert!(tombstones[0].2 > 0 && tombstones[2].2 > 0, "{tombstones:?}");
        let relay = &mut scenario.relays[0];
        let exit = relay.terminate(Duration::from_secs(20));
        assert!(exit.success(), "exit {exit}; log:\n{}", relay.log_text());
        scenario.cleanup().await;
    }
}

/// Write `events`, start a relay, wait until it published them all, and read them back.
async fn relay_all(
    scenario: &mut Scenario,
    broker: &dyn BrokerSide,
    events: &[NewEvent],
) -> Vec<Delivered> {
    scenario.store.enqueue_many(events).await;
    scenario.start_relay("relay-payloads", &[]);
    scenario
        .drain("every event published", Duration::from_secs(120))
        .await;
    let expected: HashSet<Uuid> = events.iter().filter_map(|e| e.event_id).collect();
    broker.read_back(&expected, Duration::from_secs(30)).await
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
    let delivered = relay_all(&mut scenario, broker.as_ref(), &events).await;
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
