//! The sink conformance suite of `outboxkit-core` against the real Mosquitto
//! (`OUTBOX_TEST_MQTT_ADDR`, default `127.0.0.1:1883`). Fails, never skips, when it is down.
//!
//! MQTT keeps nothing for a topic nobody subscribes to, so `prepare_destination` subscribes
//! (QoS 1) before the suite publishes, and `read_back` returns what that subscriber got.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use common::{Received, Subscriber};
use outboxkit_core::testkit::sink_suite::{ConfigHarness, ReceivedMessage, SuiteConsumer};
use outboxkit_mqtt_sink::MqttConfig;
use rumqttc::v5::mqttbytes::QoS;
use uuid::Uuid;

/// The user properties the sink sets itself; every other one is an event header.
const FIELDS: [&str; 4] = ["event_id", "aggregate_type", "aggregate_id", "event_type"];

/// The sink under test, built by its configuration (it connects in the background), read back
/// by a subscriber of the test broker.
async fn harness() -> ConfigHarness<MqttConfig, Subscribed> {
    let unreachable = MqttConfig {
        url: "mqtt://127.0.0.1:1".into(),
        publish_timeout: Duration::from_secs(5),
        ..MqttConfig::default()
    };
    let subscriber = Subscribed(Subscriber::connect().await);
    ConfigHarness::built_by_config(common::config(""), unreachable, subscriber)
}

/// What a subscriber of the suite's topics received.
struct Subscribed(Subscriber);

fn received(message: &Received) -> ReceivedMessage {
    assert_eq!(message.qos, QoS::AtLeastOnce, "{}: QoS", message.topic);
    assert!(!message.retain, "{}: retained", message.topic);
    let event_id = message.property("event_id");
    ReceivedMessage {
        event_id: Uuid::parse_str(event_id).expect("event_id is a UUID"),
        aggregate_id: message.property("aggregate_id").to_owned(),
        event_type: message.property("event_type").to_owned(),
        payload: message.payload.clone(),
        headers: message
            .user_properties
            .iter()
            .filter(|(k, _)| !FIELDS.contains(&k.as_str()))
            .cloned()
            .collect::<BTreeMap<_, _>>(),
    }
}

#[async_trait]
impl SuiteConsumer for Subscribed {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let messages = self.0.wait_for(|topic| topic == to, expected, wait).await;
        messages.iter().map(received).collect()
    }

    async fn prepare_destination(&self, to: &str) {
        self.0.subscribe(to).await;
    }
}

outboxkit_core::sink_suite!(harness().await);
