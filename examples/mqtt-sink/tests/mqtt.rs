//! What the MQTT sink sends and how it fails, against the real Mosquitto
//! (`OUTBOX_TEST_MQTT_ADDR`, default `127.0.0.1:1883`); the connection cases go through a
//! small TCP proxy in this test that can hold back the broker's answers or cut the connection.

mod common;

use std::time::Duration;

use common::{Received, Subscriber};
use outboxkit_core::testkit::sink_suite::{
    assert_refused, sample_batch, sample_event, unique_prefix,
};
use outboxkit_core::{ErrorKind, OutboxEvent, Outcome, Sink, SinkConfig};
use outboxkit_mqtt_sink::{MqttConfig, MqttSink};
use rumqttc::v5::mqttbytes::QoS;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

async fn sink(config: MqttConfig) -> MqttSink {
    config.validate().expect("a valid configuration");
    config.build().await.expect("building the sink")
}

fn kinds(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Published => "published".to_owned(),
            Outcome::Retry(e) => format!("retry:{}", e.kind()),
            Outcome::Reject(e) => format!("reject:{}", e.kind()),
        })
        .collect()
}

/// Publish `batch` with `sink`, every event published; then what `subscriber` received on the
/// topics under `prefix`, once `total` messages there arrived (or 10 s passed).
async fn publish_and_receive(
    sink: &MqttSink,
    batch: &[OutboxEvent],
    subscriber: &Subscriber,
    prefix: &str,
    total: usize,
) -> Vec<Received> {
    let outcomes = sink.publish(batch).await.expect("publishing");
    assert_eq!(kinds(&outcomes), vec!["published"; batch.len()]);
    subscriber
        .wait_for(|t| t.starts_with(prefix), total, Duration::from_secs(10))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_qos1_with_event_fields_and_headers_as_user_properties() {
    let subscriber = Subscriber::connect().await;
    let aggregate_type = format!("{}_order", unique_prefix());
    subscriber.subscribe(&format!("{aggregate_type}/#")).await;
    // The default template, `{aggregate_type}/{event_type}`.
    let sink = sink(common::config(&MqttConfig::default().topic)).await;
    let mut events = vec![
        sample_event(1, &aggregate_type, "o-1", "OrderPlaced"),
        sample_event(2, &aggregate_type, "o-1", "OrderConfirmed"),
    ];
    events[1].headers.insert("tenant".into(), "zürich ✓".into());

    let outcomes = sink.publish(&events).await.expect("publishing");
    assert_eq!(kinds(&outcomes), ["published", "published"]);

    let received = subscriber
        .wait_for(
            |t| t.starts_with(&aggregate_type),
            2,
            Duration::from_secs(10),
        )
        .await;
    assert_eq!(received.len(), 2, "{received:?}");
    for (event, message) in events.iter().zip(&received) {
        assert_eq!(
            message.topic,
            format!("{aggregate_type}/{}", event.event_type)
        );
        assert_eq!(message.qos, QoS::AtLeastOnce);
        assert!(!message.retain);
        assert_eq!(message.payload, event.payload_bytes(), "payload as is");
        let mut expected = vec![
            ("event_id".to_owned(), event.event_id.to_string()),
            ("aggregate_type".to_owned(), event.aggregate_type.clone()),
            ("aggregate_id".to_owned(), event.aggregate_id.clone()),
            ("event_type".to_owned(), event.event_type.clone()),
        ];
        expected.extend(event.headers.clone());
        assert_eq!(message.user_properties, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_what_mosquitto_would_close_the_connection_for() {
    let subscriber = Subscriber::connect().await;
    let prefix = unique_prefix();
    subscriber.subscribe(&format!("{prefix}/#")).await;
    let sink = sink(common::config(&format!("{prefix}/{{aggregate_type}}"))).await;
    let mut batch = sample_batch(1, 6, "order", 6);
    batch[1].headers.insert("note".into(), "two\nlines".into());
    batch[3].destination = Some(format!("{prefix}/+/wildcard"));
    batch[4].aggregate_type = "non\u{FFFF}character".into();

    let outcomes = sink.publish(&batch).await.expect("publishing");
    assert_eq!(
        kinds(&outcomes),
        [
            "published",
            "reject:invalid_message",
            "published",
            "reject:invalid_message",
            "reject:invalid_message",
            "published"
        ]
    );
    // The connection survived: the good events arrived and the next batch goes through.
    let more = sample_batch(7, 3, "order", 3);
    let received = publish_and_receive(&sink, &more, &subscriber, &prefix, 6).await;
    let ids: Vec<&str> = received.iter().map(|m| m.property("event_id")).collect();
    let expected: Vec<String> = [0, 2, 5]
        .iter()
        .map(|&i| &batch[i])
        .chain(&more)
        .map(|e: &OutboxEvent| e.event_id.to_string())
        .collect();
    assert_eq!(ids, expected);
}

/// What the proxy does with the bytes between the sink and Mosquitto.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    Open,
    /// Forward the sink's packets but hold back the broker's (CONNACK, PUBACK...).
    HoldReplies,
    /// Close every connection and refuse new ones.
    Cut,
}

/// A TCP proxy to Mosquitto on a free port.
struct Proxy {
    port: u16,
    gate: watch::Sender<Gate>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start() -> Self {
        let (host, port) = common::mosquitto();
        if let Err(e) = TcpStream::connect((host.as_str(), port)).await {
            panic!(
                "Mosquitto is unreachable at {host}:{port} ({e}): start it \
                 (`mosquitto -d`, or set OUTBOX_TEST_MQTT_ADDR)"
            );
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (gate, _) = watch::channel(Gate::Open);
        let gates = gate.clone();
        let task = tokio::spawn(async move {
            loop {
                let (client, _) = listener.accept().await.unwrap();
                if *gates.borrow() == Gate::Cut {
                    continue;
                }
                let (host, port) = common::mosquitto();
                let broker = TcpStream::connect((host.as_str(), port))
                    .await
                    .expect("the proxy cannot reach Mosquitto");
                let (client_read, client_write) = client.into_split();
                let (broker_read, broker_write) = broker.into_split();
                tokio::spawn(pipe(client_read, broker_write, gates.subscribe(), false));
                tokio::spawn(pipe(broker_read, client_write, gates.subscribe(), true));
            }
        });
        Self { port, gate, task }
    }

    fn set(&self, gate: Gate) {
        self.gate.send_replace(gate);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.set(Gate::Cut);
        self.task.abort();
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<Gate>,
    replies: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = gate.wait_for(|g| *g == Gate::Cut) => return,
        };
        if replies {
            let Ok(gate) = gate.wait_for(|g| *g != Gate::HoldReplies).await else {
                return;
            };
            if *gate == Gate::Cut {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A sink connected through `proxy`, publishing to `<prefix>/<aggregate_type>`.
async fn sink_via(proxy: &Proxy, prefix: &str, publish_timeout: Duration) -> MqttSink {
    let sink = sink(MqttConfig {
        url: format!("mqtt://127.0.0.1:{}", proxy.port),
        publish_timeout,
        ..common::config(&format!("{prefix}/{{aggregate_type}}"))
    })
    .await;
    sink.check().await.expect("connected through the proxy");
    sink
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_puback_is_a_retryable_timeout() {
    let proxy = Proxy::start().await;
    let prefix = unique_prefix();
    let sink = sink_via(&proxy, &prefix, Duration::from_secs(1)).await;

    proxy.set(Gate::HoldReplies);
    let outcomes = sink
        .publish(&sample_batch(1, 3, "order", 3))
        .await
        .expect("outcomes");
    assert_eq!(kinds(&outcomes), ["retry:timeout"; 3]);

    proxy.set(Gate::Open);
    let outcomes = sink
        .publish(&sample_batch(4, 3, "order", 3))
        .await
        .expect("outcomes");
    assert_eq!(
        kinds(&outcomes),
        ["published"; 3],
        "after the held PUBACKs came"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_fails_the_waiting_events_then_the_sink_reconnects() {
    let subscriber = Subscriber::connect().await;
    let prefix = unique_prefix();
    subscriber.subscribe(&format!("{prefix}/#")).await;
    let proxy = Proxy::start().await;
    let sink = sink_via(&proxy, &prefix, Duration::from_secs(10)).await;

    // PUBACKs held, then the connection cut: every waiting event fails as a connection error
    // (retryable; the engine then fails the call as a whole), well before publish_timeout.
    proxy.set(Gate::HoldReplies);
    let batch = sample_batch(1, 5, "order", 5);
    let cut = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        proxy.set(Gate::Cut);
    };
    let started = std::time::Instant::now();
    let (outcomes, ()) = tokio::join!(sink.publish(&batch), cut);
    assert_eq!(kinds(&outcomes.expect("outcomes")), ["retry:connection"; 5]);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // While the broker cannot be reached, check and publish fail as a whole, retryably.
    let e = sink.check().await.expect_err("check while cut");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let e = sink.publish(&batch).await.expect_err("publish while cut");
    assert!(e.is_retryable(), "{e}");

    // Back: the sink reconnects on its own.
    proxy.set(Gate::Open);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sink.check().await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "no reconnection in 10s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = sample_batch(6, 5, "order", 5);
    let received = publish_and_receive(&sink, &again, &subscriber, &prefix, 10).await;
    for event in &again {
        let id = event.event_id.to_string();
        assert!(
            received.iter().any(|m| m.property("event_id") == id),
            "{id} did not arrive"
        );
    }
}

#[test]
fn configuration_defaults_keys_and_errors() {
    let config: MqttConfig = toml::from_str("").unwrap();
    assert_eq!(config.url, "mqtt://127.0.0.1:1883");
    assert_eq!(config.topic, "{aggregate_type}/{event_type}");
    assert_eq!(config.publish_timeout, Duration::from_secs(10));
    assert!(config.client_id.is_none() && config.username.is_none());
    config.validate().unwrap();

    let config: MqttConfig = toml::from_str(
        r#"
        url = "tcp://broker"
        client_id = "relay-1"
        username = "relay"
        password = "s3cr3t"
        topic = "app/{aggregate_type}"
        publish_timeout = "1500ms"
        "#,
    )
    .unwrap();
    assert_eq!(config.publish_timeout, Duration::from_millis(1500));
    assert_eq!(config.password.as_ref().unwrap().0, "s3cr3t");
    let debug = format!("{config:?}");
    assert!(
        !debug.contains("s3cr3t") && debug.contains("***"),
        "{debug}"
    );
    config.validate().unwrap();

    let e = toml::from_str::<MqttConfig>("host = \"broker\"").unwrap_err();
    assert!(e.to_string().contains("unknown field `host`"), "{e}");
    // Each invalid value is refused naming its key (outboxkit-core's testkit checks that).
    let errors = assert_refused(
        &MqttConfig::default(),
        &[
            ("url: ", |c| c.url = "broker:1883".into()),
            ("url: ", |c| c.url = "mqtts://broker".into()),
            ("url: ", |c| c.url = "http://broker".into()),
            ("url: ", |c| c.url = "mqtt://".into()),
            ("url: ", |c| c.url = "mqtt://relay:s3cr3t@broker".into()),
            ("topic: ", |c| c.topic = "{aggregate}".into()),
            ("publish_timeout: ", |c| c.publish_timeout = Duration::ZERO),
        ],
    );
    for e in &errors {
        assert!(!e.contains("s3cr3t"), "{e}");
    }
    assert_eq!(MqttConfig::KIND, "mqtt");
}

/// Two relays given the same `sink.mqtt.client_id`: each connection takes the other's session
/// over, and the broker closes the older one. The error says so, names the client_id and the key
/// to change; "connection closed" alone would send the operator looking at the network.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_id_taken_over_by_another_connection_says_so() {
    let mut config = common::config(&format!("{}/{{aggregate_type}}", unique_prefix()));
    let id = format!("shared-{}", unique_prefix());
    config.client_id = Some(id.clone());
    let first = sink(config.clone()).await;
    first.check().await.expect("the first connection");
    let second = sink(config).await;
    second.check().await.expect("the second connection");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let e = loop {
        match first.check().await {
            Err(e) => break e,
            Ok(()) => {
                assert!(std::time::Instant::now() < deadline, "never taken over");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    println!("{e}");
    assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
    let says = format!("connects with its client_id, \"{id}\": if another relay has it too");
    assert!(
        e.message().contains(&says) && e.message().contains("sink.mqtt.client_id"),
        "{e}"
    );
}
