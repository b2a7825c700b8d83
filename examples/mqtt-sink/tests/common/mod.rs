//! Shared by the MQTT tests: where Mosquitto is, and a subscriber that records what arrives.
//! Every helper panics (fails the test, never skips it) when Mosquitto is unreachable.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outboxkit_mqtt_sink::MqttConfig;
use rumqttc::v5::mqttbytes::v5::{Publish, SubscribeReasonCode};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event, Incoming, MqttOptions};
use uuid::Uuid;

/// `OUTBOX_TEST_MQTT_ADDR` (`host:port`), default `127.0.0.1:1883`.
pub fn mosquitto() -> (String, u16) {
    let addr =
        std::env::var("OUTBOX_TEST_MQTT_ADDR").unwrap_or_else(|_| "127.0.0.1:1883".to_owned());
    let (host, port) = addr
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("OUTBOX_TEST_MQTT_ADDR={addr} is not host:port"));
    let port = port
        .parse()
        .unwrap_or_else(|_| panic!("OUTBOX_TEST_MQTT_ADDR={addr}: bad port"));
    (host.to_owned(), port)
}

/// A sink configuration for the test broker, with `topic` as its template.
pub fn config(topic: &str) -> MqttConfig {
    let (host, port) = mosquitto();
    MqttConfig {
        url: format!("mqtt://{host}:{port}"),
        topic: topic.to_owned(),
        publish_timeout: Duration::from_secs(10),
        ..MqttConfig::default()
    }
}

/// One message as the subscriber got it.
#[derive(Debug, Clone)]
pub struct Received {
    pub topic: String,
    pub qos: QoS,
    pub retain: bool,
    pub payload: Vec<u8>,
    pub user_properties: Vec<(String, String)>,
}

impl Received {
    fn from_publish(publish: Publish) -> Self {
        Self {
            topic: String::from_utf8(publish.topic.to_vec()).expect("topic is UTF-8"),
            qos: publish.qos,
            retain: publish.retain,
            payload: publish.payload.to_vec(),
            user_properties: publish
                .properties
                .map(|p| p.user_properties)
                .unwrap_or_default(),
        }
    }

    /// The value of user property `name`; panics when it is absent or repeated.
    pub fn property(&self, name: &str) -> &str {
        let mut values = self.user_properties.iter().filter(|(k, _)| k == name);
        let (_, value) = values
            .next()
            .unwrap_or_else(|| panic!("{}: no user property `{name}`: {self:?}", self.topic));
        assert!(
            values.next().is_none(),
            "{}: user property `{name}` repeated",
            self.topic
        );
        value
    }
}

#[derive(Debug, Default)]
struct Inbox {
    messages: Vec<Received>,
    subacks: Vec<Vec<SubscribeReasonCode>>,
    error: Option<String>,
}

/// An MQTT 5 client of the test broker that subscribes with QoS 1 and records every message.
#[derive(Debug)]
pub struct Subscriber {
    client: AsyncClient,
    inbox: Arc<Mutex<Inbox>>,
    task: tokio::task::JoinHandle<()>,
}

impl Subscriber {
    /// Connects; panics with how to fix it when Mosquitto does not answer within 5 s.
    pub async fn connect() -> Self {
        let (host, port) = mosquitto();
        let id = format!("outbox-test-sub-{}", Uuid::new_v4().simple());
        let mut options = MqttOptions::new(id, host.clone(), port);
        options.set_max_packet_size(Some(16 << 20));
        let (client, mut events) = AsyncClient::new(options, 100);
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let (connected_tx, connected) = tokio::sync::oneshot::channel();
        let task = {
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let mut connected_tx = Some(connected_tx);
                loop {
                    match events.poll().await {
                        Ok(Event::Incoming(Incoming::ConnAck(_))) => {
                            if let Some(tx) = connected_tx.take() {
                                let _ = tx.send(Ok(()));
                            }
                        }
                        Ok(Event::Incoming(Incoming::Publish(publish))) => {
                            let message = Received::from_publish(publish);
                            inbox.lock().unwrap().messages.push(message);
                        }
                        Ok(Event::Incoming(Incoming::SubAck(ack))) => {
                            inbox.lock().unwrap().subacks.push(ack.return_codes);
                        }
                        Ok(_) => {}
                        Err(e) => {
                            if let Some(tx) = connected_tx.take() {
                                let _ = tx.send(Err(e.to_string()));
                                return;
                            }
                            // A test subscriber never reconnects: a lost message would make
                            // a case fail for the wrong reason.
                            inbox.lock().unwrap().error = Some(e.to_string());
                            return;
                        }
                    }
                }
            })
        };
        match tokio::time::timeout(Duration::from_secs(5), connected).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => panic!(
                "Mosquitto is unreachable at {host}:{port} ({e}): start it \
                 (`mosquitto -d`, or set OUTBOX_TEST_MQTT_ADDR)"
            ),
            _ => panic!(
                "Mosquitto at {host}:{port} did not answer within 5s: start it \
                 (`mosquitto -d`, or set OUTBOX_TEST_MQTT_ADDR)"
            ),
        }
        Self {
            client,
            inbox,
            task,
        }
    }

    /// Subscribes to `filter` with QoS 1 and waits for the SUBACK.
    pub async fn subscribe(&self, filter: &str) {
        let before = self.inbox.lock().unwrap().subacks.len();
        self.client
            .subscribe(filter, QoS::AtLeastOnce)
            .await
            .expect("queueing SUBSCRIBE");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            {
                let inbox = self.inbox.lock().unwrap();
                if let Some(codes) = inbox.subacks.get(before) {
                    assert_eq!(
                        codes,
                        &[SubscribeReasonCode::Success(QoS::AtLeastOnce)],
                        "SUBACK for {filter}"
                    );
                    return;
                }
                if let Some(e) = &inbox.error {
                    panic!("subscriber connection lost: {e}");
                }
            }
            assert!(Instant::now() < deadline, "no SUBACK for {filter} in 5s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Messages received so far whose topic `keep` accepts, in arrival order.
    pub fn received(&self, keep: impl Fn(&str) -> bool) -> Vec<Received> {
        let inbox = self.inbox.lock().unwrap();
        if let Some(e) = &inbox.error {
            panic!("subscriber connection lost: {e}");
        }
        inbox
            .messages
            .iter()
            .filter(|m| keep(&m.topic))
            .cloned()
            .collect()
    }

    /// Waits until `expected` messages on topics `keep` accepts arrived or `timeout` passed,
    /// then returns them (never fewer than arrived).
    pub async fn wait_for(
        &self,
        keep: impl Fn(&str) -> bool,
        expected: usize,
        timeout: Duration,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let received = self.received(&keep);
            if received.len() >= expected || Instant::now() >= deadline {
                return received;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.task.abort();
    }
}
