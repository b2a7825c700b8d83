//! An MQTT 5 sink on `rumqttc`, the worked example of "Writing your own sink" (see README.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::{fmt, time::Duration};

use outboxkit_core::{DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink};
use rumqttc::v5::mqttbytes::v5::{ConnectReturnCode as Code, PubAckReason, Publish};
use rumqttc::v5::mqttbytes::{v5::DisconnectReasonCode, v5::PublishProperties, QoS};
use rumqttc::v5::StateError;
use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, Incoming, MqttOptions};
use tokio::{sync::oneshot, time::Instant};

/// `[sink.mqtt]` (`kind = "mqtt"`); every key has a default.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MqttConfig {
    /// `mqtt://host[:port]` (port 1883 by default; plain TCP).
    pub url: String,
    /// Default: `outbox-relay-<random>`, fresh for each sink.
    pub client_id: Option<String>,
    pub username: Option<String>,
    pub password: Option<Secret>,
    pub topic: String,
    #[serde(with = "humantime_serde")]
    pub publish_timeout: Duration,
}

impl Default for MqttConfig {
    fn default() -> Self {
        Self {
            url: "mqtt://127.0.0.1:1883".into(),
            client_id: None,
            username: None,
            password: None,
            topic: "{aggregate_type}/{event_type}".into(),
            publish_timeout: Duration::from_secs(10),
        }
    }
}

/// A password; `Debug` shows `***`.
#[derive(Clone, serde::Deserialize)]
pub struct Secret(pub String);
impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl MqttConfig {
    /// Host and port of `url`.
    fn address(&self) -> Result<(String, u16)> {
        let why = "expected mqtt://host[:port] (plain TCP; credentials in username, password)";
        let bad = || Error::config(format!("sink.mqtt.url: {why}"));
        let url = url::Url::parse(&self.url).map_err(|_| bad())?;
        let plain = matches!(url.scheme(), "mqtt" | "tcp") && url.username().is_empty();
        match url.host_str() {
            Some(host) if plain && url.password().is_none() && !host.is_empty() => {
                Ok((host.to_owned(), url.port().unwrap_or(1883)))
            }
            _ => Err(bad()),
        }
    }
}

impl outboxkit_core::SinkConfig for MqttConfig {
    const KIND: &'static str = "mqtt";
    type Sink = MqttSink;
    fn destination_mut(&mut self) -> &mut String {
        &mut self.topic
    }
    fn validate(&self) -> Result<()> {
        self.address()?;
        DestinationTemplate::parse(&self.topic).map_err(|e| e.context("sink.mqtt.topic"))?;
        let timeout = [("publish_timeout", self.publish_timeout)];
        outboxkit_core::plugin::refuse_zero_durations("sink.mqtt", &timeout)
    }
    /// Connects in the background: `check` waits for the CONNACK.
    async fn build(self) -> Result<MqttSink> {
        let ((host, port), topic) = (self.address()?, DestinationTemplate::parse(&self.topic)?);
        let random = || format!("outbox-relay-{}", uuid::Uuid::new_v4().simple());
        let fixed = self.client_id.is_some();
        let id = self.client_id.unwrap_or_else(random);
        let mut options = MqttOptions::new(id, host, port);
        options.set_keep_alive(Duration::from_secs(15));
        if self.username.is_some() || self.password.is_some() {
            let password = self.password.map(|p| p.0).unwrap_or_default();
            options.set_credentials(self.username.unwrap_or_default(), password);
        }
        let (client, events) = AsyncClient::new(options, 10_000);
        let shared = Arc::default();
        tokio::spawn(drive(events, Arc::downgrade(&shared), fixed));
        Ok(MqttSink {
            client,
            topic,
            timeout: self.publish_timeout,
            shared,
        })
    }
}

/// A publish's waiter is queued, under the lock, as its request goes to rumqttc; rumqttc writes
/// requests in order and says `Outgoing::Publish(pkid)` for each, which moves the first queued
/// waiter to `sent`, where its PUBACK finds it by packet id.
#[derive(Debug, Default)]
struct Shared {
    queued: VecDeque<oneshot::Sender<Result<()>>>,
    sent: HashMap<u16, oneshot::Sender<Result<()>>>,
    /// `None` until the first CONNACK or connection error, then the latest.
    state: Option<Result<()>>,
    max_packet: Option<u32>,
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Polls the connection until the sink is dropped. On an error, fails every waiter, drops
/// everything not yet acknowledged and reconnects after 1 s. `fixed`: the client id was
/// configured (two relays may share it).
async fn drive(mut events: EventLoop, shared: Weak<Mutex<Shared>>, fixed: bool) {
    let (host, port) = events.options.broker_address();
    let broker = format!("mqtt broker {host}:{port}");
    let id = fixed.then(|| events.options.client_id());
    while let Some(shared) = shared.upgrade() {
        let event = events.poll().await;
        {
            let mut w = lock(&shared);
            let error = match event {
                Ok(Event::Incoming(Incoming::ConnAck(ack))) => {
                    w.max_packet = ack.properties.and_then(|p| p.max_packet_size);
                    w.state = Some(Ok(()));
                    continue;
                }
                Ok(Event::Outgoing(rumqttc::Outgoing::Publish(pkid))) => {
                    if let Some(tx) = w.queued.pop_front() {
                        w.sent.insert(pkid, tx);
                    }
                    continue;
                }
                Ok(Event::Incoming(Incoming::PubAck(ack))) => {
                    if let Some(tx) = w.sent.remove(&ack.pkid) {
                        let _ = tx.send(puback(ack.reason));
                    }
                    continue;
                }
                Ok(_) => continue,
                Err(e) => classify(&e, &broker, id.as_deref()),
            };
            // Drop what was not acknowledged (its waiter fails now), so that no request of
            // this connection goes out again under a waiter of the next one.
            events.clean();
            events.pending.clear();
            events.state.events.clear();
            events.state.collision = None;
            let w = &mut *w;
            for tx in w.queued.drain(..).chain(w.sent.drain().map(|(_, tx)| tx)) {
                let _ = tx.send(Err(error.clone()));
            }
            w.state = Some(Err(error));
        }
        drop(shared);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `id`: the configured client id. A broker closes a connection when another one connects
/// with its client id: two relays given the same one take turns, each closing the other.
fn classify(e: &ConnectionError, broker: &str, id: Option<&str>) -> Error {
    use StateError::{ConnectionAborted, ServerDisconnect};
    let kind = match e {
        ConnectionError::Timeout(_) => ErrorKind::Timeout,
        ConnectionError::ConnectionRefused(Code::NotAuthorized | Code::BadUserNamePassword) => {
            ErrorKind::Unauthorized
        }
        _ => ErrorKind::Connection,
    };
    let fix = "give each relay its own sink.mqtt.client_id, or leave it unset";
    let message = match (e, id) {
        (ConnectionError::MqttState(ServerDisconnect { reason_code, .. }), Some(id))
            if *reason_code == DisconnectReasonCode::SessionTakenOver =>
        {
            format!(
                "{broker} closed the connection: another client connected with client_id \
                 \"{id}\": {fix}"
            )
        }
        // Mosquitto closes the older connection without saying why.
        (ConnectionError::MqttState(ConnectionAborted), Some(id)) => format!(
            "{broker}: {e} (the broker closes a connection when another client connects with \
             its client_id, \"{id}\": if another relay has it too, {fix})"
        ),
        _ => format!("{broker}: {e}"),
    };
    Error::new(kind, message)
}

fn puback(reason: PubAckReason) -> Result<()> {
    let kind = match reason {
        PubAckReason::Success | PubAckReason::NoMatchingSubscribers => return Ok(()),
        PubAckReason::NotAuthorized => ErrorKind::Unauthorized,
        PubAckReason::TopicNameInvalid => ErrorKind::InvalidMessage,
        PubAckReason::QuotaExceeded => ErrorKind::Unavailable,
        _ => ErrorKind::Other,
    };
    Err(Error::new(kind, format!("mqtt: PUBACK {reason:?}")))
}

/// Characters for which Mosquitto closes the connection instead of refusing one message.
fn unsendable(s: &str) -> bool {
    let bad = |c: char| matches!(c as u32, 0xFDD0..=0xFDEF) || c as u32 & 0xFFFE == 0xFFFE;
    s.chars().any(|c| c.is_control() || bad(c))
}

/// The MQTT sink: QoS 1, no retain, published means PUBACKed.
#[derive(Debug)]
pub struct MqttSink {
    client: AsyncClient,
    topic: DestinationTemplate,
    timeout: Duration,
    shared: Arc<Mutex<Shared>>,
}

impl MqttSink {
    /// Hands one event to rumqttc and returns its waiter, or says why it cannot go.
    fn send(&self, w: &mut Shared, event: &OutboxEvent) -> Result<oneshot::Receiver<Result<()>>> {
        let (topic, e) = (self.destination(event), event.clone());
        let mut properties = vec![("event_id".into(), e.event_id.to_string())];
        properties.push(("aggregate_type".into(), e.aggregate_type));
        properties.push(("aggregate_id".into(), e.aggregate_id));
        properties.push(("event_type".into(), e.event_type));
        properties.extend(e.headers);
        let invalid = properties
            .iter()
            .any(|(k, v)| unsendable(k) || unsendable(v));
        if invalid || topic.is_empty() || topic.contains(['+', '#']) || unsendable(&topic) {
            let why = format!("mqtt: topic `{topic}` or a header name or value is invalid");
            return Err(Error::new(ErrorKind::InvalidMessage, why));
        }
        let props = PublishProperties {
            user_properties: properties,
            ..Default::default()
        };
        let p = Publish::new(&topic, QoS::AtLeastOnce, e.payload, Some(props));
        if p.size() + 2 > w.max_packet.unwrap_or(u32::MAX) as usize {
            let why = format!("mqtt: {} bytes, over the broker's maximum", p.size() + 2);
            return Err(Error::new(ErrorKind::MessageTooLarge, why));
        }
        let (payload, props) = (p.payload, p.properties.unwrap_or_default());
        self.client
            .try_publish_with_properties(topic, p.qos, false, payload, props)
            .map_err(|_| Error::new(ErrorKind::Unavailable, "mqtt: too many messages queued"))?;
        let (tx, rx) = oneshot::channel();
        w.queued.push_back(tx);
        Ok(rx)
    }
}

#[async_trait::async_trait]
impl Sink for MqttSink {
    fn kind(&self) -> &'static str {
        <MqttConfig as outboxkit_core::SinkConfig>::KIND
    }
    fn destination(&self, event: &OutboxEvent) -> String {
        self.topic.render(event)
    }
    /// The latest CONNACK or connection error (waiting for the first).
    async fn check(&self) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while Instant::now() < deadline {
            if let Some(state) = lock(&self.shared).state.clone() {
                return state;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(Error::new(ErrorKind::Timeout, "mqtt: no CONNACK in time"))
    }
    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if !batch.is_empty() {
            self.check().await?;
        }
        let acks: Vec<_> = {
            let mut w = lock(&self.shared);
            batch.iter().map(|event| self.send(&mut w, event)).collect()
        };
        let (deadline, mut outcomes) = (Instant::now() + self.timeout, Vec::new());
        for ack in acks {
            let result = async {
                let ack = tokio::time::timeout_at(deadline, ack?).await;
                ack.map_err(|_| Error::new(ErrorKind::Timeout, "mqtt: no PUBACK in time"))?
                    .map_err(|_| Error::new(ErrorKind::Connection, "mqtt: connection lost"))?
            };
            let result = result.await;
            outcomes.push(result.map_or_else(Outcome::from_error, |()| Outcome::Published));
        }
        Ok(outcomes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_taken_over_names_the_client_id_and_the_key() {
        let e = ConnectionError::MqttState(StateError::ServerDisconnect {
            reason_code: DisconnectReasonCode::SessionTakenOver,
            reason_string: None,
        });
        let error = classify(&e, "mqtt broker b:1883", Some("relay"));
        assert_eq!(
            error.message(),
            "mqtt broker b:1883 closed the connection: another client connected with client_id \
             \"relay\": give each relay its own sink.mqtt.client_id, or leave it unset"
        );
        // A random client id is the relay's own: no other client has it.
        assert!(!classify(&e, "b", None).message().contains("client_id"));
    }
}
