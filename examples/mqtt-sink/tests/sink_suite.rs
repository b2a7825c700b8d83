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
use outboxkit_core::testkit::sink_suite::{ReceivedMessage, SinkHarness};
use outboxkit_core::{Sink, SinkConfig};
use outboxkit_mqtt_sink::MqttConfig;
use rumqttc::v5::mqttbytes::QoS;
use uuid::Uuid;

/// The user properties the sink sets itself; every other one is an event header.
const FIELDS: [&str; 4] = ["event_id", "aggregate_type", "aggregate_id", "event_type"];

struct MqttHarness {
    subscriber: Subscriber,
}

impl MqttHarness {
    async fn new() -> Self {
        Self {
            subscriber: Subscriber::connect().await,
        }
    }
}

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
impl SinkHarness for MqttHarness {
    async fn sink(&self, destination_template: &str) -> Box<dyn Sink> {
        let config = common::config(destination_template);
        config.validate().expect("a valid configuration");
        let sink = config.build().await.expect("building the sink");
        sink.check()
            .await
            .unwrap_or_else(|e| panic!("the sink cannot reach Mosquitto: {e}"));
        Box::new(sink)
    }

    async fn unreachable_sink(&self) -> Box<dyn Sink> {
        let config = MqttConfig {
            url: "mqtt://127.0.0.1:1".into(),
            publish_timeout: Duration::from_secs(5),
            ..MqttConfig::default()
        };
        Box::new(config.build().await.expect("building never connects"))
    }

    async fn read_back(
        &self,
        destination: &str,
        expected: usize,
        timeout: Duration,
    ) -> Vec<ReceivedMessage> {
        let messages = self
            .subscriber
            .wait_for(|topic| topic == destination, expected, timeout)
            .await;
        messages.iter().map(received).collect()
    }

    async fn prepare_destination(&self, destination: &str) {
        self.subscriber.subscribe(destination).await;
    }
}

outboxkit_core::sink_suite!(MqttHarness::new().await);
