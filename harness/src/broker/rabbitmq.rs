//! RabbitMQ: the relay publishes to a topic exchange (publisher confirms); the side binds one
//! queue per aggregate type and consumes it; and the machine's broker stopped and started
//! again through `rabbitmqctl`, always started again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicGetOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::mpsc;
use uuid::Uuid;

use super::{sink_tables, BrokerSide, AGGREGATE_TYPES};
use crate::delivery::{Committed, Delivered};
use crate::scenario::{Fault, TRACEPARENT};
use crate::util::{first_line, unique};
#[cfg(feature = "sink-suite")]
use outboxkit_core::testkit::sink_suite::ReceivedMessage;

/// RabbitMQ for tests: `OUTBOX_TEST_RABBITMQ_URL`, default the machine's local broker.
pub fn rabbitmq_url() -> String {
    std::env::var("OUTBOX_TEST_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// `host:port` of [`rabbitmq_url`], for a test's own proxy in front of the broker.
pub fn rabbitmq_address() -> String {
    let url = rabbitmq_url();
    let uri: lapin::uri::AMQPUri = url
        .parse()
        .unwrap_or_else(|e| panic!("{url} is not an amqp:// URL: {e}"));
    format!("{}:{}", uri.authority.host, uri.authority.port)
}

/// The RabbitMQ side: the relay declares and publishes to the durable topic exchange
/// `<prefix>` with the default routing key `{aggregate_type}.{event_type}`; the side binds a
/// durable queue `<prefix>.<aggregate_type>s` to it for `<aggregate_type>.*` (expiring an hour
/// after its last use) and consumes it. `meta["routing_key"]` is the routing key; `headers` are
/// the AMQP headers; the event id is the `message_id`.
#[derive(Debug, Clone)]
pub struct RabbitMqSide {
    url: String,
    exchange: String,
}

impl RabbitMqSide {
    /// Exchange `<prefix>` on the test broker ([`rabbitmq_url`]).
    pub async fn open(prefix: &str) -> Self {
        Self::open_at(&rabbitmq_url(), prefix).await
    }

    /// The broker at `url`.
    pub async fn open_at(url: &str, prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            exchange: prefix.to_owned(),
        }
    }

    /// The exchange the relay publishes to.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// A connection and a channel (a new one each time: the broker may have restarted), or
    /// fail the test saying what to start.
    pub async fn channel(&self) -> (lapin::Connection, lapin::Channel) {
        let connect = lapin::Connection::connect(&self.url, lapin::ConnectionProperties::default());
        let connection = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => panic!("RabbitMQ is unreachable ({e}): start it (scripts/services.sh)"),
            Err(_) => panic!("RabbitMQ did not answer within 10s: start it (scripts/services.sh)"),
        };
        let channel = connection
            .create_channel()
            .await
            .expect("opening a RabbitMQ channel");
        (connection, channel)
    }

    /// Consume everything `queue` holds now, in queue order (`basic.consume`, no ack: the
    /// messages leave the queue).
    pub async fn consume(&self, queue: &str) -> Vec<Delivered> {
        let (_connection, channel) = self.channel().await;
        consume_queue(&channel, queue).await
    }

    /// Declare the exchange: durable, of type topic.
    pub async fn declare_exchange(&self) {
        let (_connection, channel) = self.channel().await;
        let exchange = self.exchange.as_str();
        channel
            .exchange_declare(
                exchange.into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("declaring exchange {exchange}: {e}"));
    }

    /// Declare the durable queue `queue` (expiring an hour after its last use; `arguments` add
    /// queue arguments such as `x-max-length`) and bind it to the exchange for `routing_key`.
    pub async fn bind_queue(
        &self,
        queue: &str,
        routing_key: &str,
        arguments: &[(&str, AMQPValue)],
    ) {
        let (_connection, channel) = self.declare_queue(queue, arguments).await;
        let exchange = self.exchange.as_str();
        channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("binding queue {queue} to {exchange} ({routing_key}): {e}"));
    }

    /// Declare the durable queue `queue` as [`bind_queue`](Self::bind_queue) does, bound to
    /// nothing but the default exchange (which routes by queue name). Returns the connection
    /// and channel it used.
    pub async fn declare_queue(
        &self,
        queue: &str,
        arguments: &[(&str, AMQPValue)],
    ) -> (lapin::Connection, lapin::Channel) {
        let (connection, channel) = self.channel().await;
        let mut table = FieldTable::default();
        table.insert("x-expires".into(), AMQPValue::LongInt(3_600_000));
        for (name, value) in arguments {
            table.insert((*name).into(), value.clone());
        }
        let options = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        channel
            .queue_declare(queue.into(), options, table)
            .await
            .unwrap_or_else(|e| panic!("declaring queue {queue}: {e}"));
        (connection, channel)
    }

    /// Take every message of `queue` (`basic.get`, no ack: they leave the queue), in queue
    /// order, until `expected` arrived and the queue is empty, or `timeout` passed (then what
    /// arrived). The raw deliveries: properties, routing key, body.
    pub async fn drain(&self, queue: &str, expected: usize, timeout: Duration) -> Vec<Delivery> {
        let (_connection, channel) = self.channel().await;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let got = channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap_or_else(|e| panic!("basic.get from {queue}: {e}"));
            match got {
                Some(message) => out.push(message.delivery),
                None if out.len() >= expected || Instant::now() >= deadline => return out,
                None => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Delete the exchange (errors ignored).
    pub async fn delete_exchange(&self) {
        let (_connection, channel) = self.channel().await;
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }

    /// Delete `queue` (errors ignored).
    pub async fn delete_queue(&self, queue: &str) {
        let (_connection, channel) = self.channel().await;
        let _ = channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
    }
}

/// The text headers of a delivery (AMQP long and short strings), by name.
pub fn amqp_headers(delivery: &Delivery) -> BTreeMap<String, String> {
    let Some(table) = delivery.properties.headers() else {
        return BTreeMap::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| {
            let text = match value {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                AMQPValue::ShortString(s) => s.as_str().to_owned(),
                _ => return None,
            };
            Some((name.as_str().to_owned(), text))
        })
        .collect()
}

#[async_trait]
impl BrokerSide for RabbitMqSide {
    fn name(&self) -> String {
        "RabbitMQ".to_owned()
    }

    /// The Debian package's version of the machine's server.
    fn server_version(&self) -> String {
        let version = first_line("dpkg-query", &["-W", "-f", "${Version}", "rabbitmq-server"]);
        format!("RabbitMQ {version}")
    }

    fn sink_toml(&self) -> String {
        sink_tables(
            "rabbitmq",
            None,
            &format!(
                "url = \"{}\"\nexchange = \"{}\"\ndeclare_exchange = true\n\
                 exchange_type = \"topic\"\nconnect_timeout = \"5s\"\nconfirm_timeout = \"15s\"\n",
                self.url, self.exchange
            ),
        )
    }

    /// Declare the exchange (as the relay does) and bind the queues, before anything is
    /// published.
    async fn prepare(&self) {
        self.declare_exchange().await;
        for t in AGGREGATE_TYPES {
            self.bind_queue(&self.destination(t), &format!("{t}.*"), &[])
                .await;
        }
    }

    fn destination(&self, aggregate_type: &str) -> String {
        format!("{}.{aggregate_type}s", self.exchange)
    }

    async fn read_back(&self, _expected: &HashSet<Uuid>, _timeout: Duration) -> Vec<Delivered> {
        let (_connection, channel) = self.channel().await;
        let mut out = Vec::new();
        for t in AGGREGATE_TYPES {
            out.extend(consume_queue(&channel, &self.destination(t)).await);
        }
        out
    }

    /// The queues' depths, every 200 ms until `expected` or `timeout`.
    async fn held(&self, expected: u64, timeout: Duration) -> u64 {
        let (_connection, channel) = self.channel().await;
        let deadline = Instant::now() + timeout;
        loop {
            let mut n = 0;
            for t in AGGREGATE_TYPES {
                n += queue_len(&channel, &self.destination(t)).await;
            }
            if n >= expected || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `basic.consume` of the queues, no ack, on a connection of its own, closed once the
    /// receiver is dropped.
    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        let (connection, channel) = self.channel().await;
        let (tx, rx) = mpsc::unbounded_channel();
        for t in AGGREGATE_TYPES {
            let queue = self.destination(t);
            let consumer = consume_no_ack(&channel, &queue, &unique("watch")).await;
            let tx = tx.clone();
            consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
                let now = Instant::now();
                let tx = tx.clone();
                async move {
                    if let Ok(Some(delivery)) = delivery {
                        if let Some(id) = message_id(&delivery.properties) {
                            let _ = tx.send((id, now));
                        }
                    }
                }
            });
        }
        tokio::spawn(async move {
            tx.closed().await;
            let _ = connection.close(200, "done".into()).await;
        });
        rx
    }

    /// The routing key `{aggregate_type}.{event_type}`, the writer's headers and the event id
    /// as AMQP headers.
    fn check_messages(&self, delivered: &[Delivered], committed: &Committed) {
        for m in delivered {
            let (_, aggregate) = &committed[&m.event_id];
            let is_order = aggregate.parse::<u64>().expect("a numbered aggregate") % 2 == 0;
            let expected_key = if is_order {
                "order.Changed"
            } else {
                "customer.Changed"
            };
            assert_eq!(m.meta("routing_key"), expected_key, "{m:?}");
            assert_eq!(m.header("traceparent"), TRACEPARENT, "{m:?}");
            assert_eq!(m.header("event_id"), m.event_id.to_string(), "{m:?}");
        }
    }

    /// Delete the queues and the exchange (errors ignored).
    async fn cleanup(&self) {
        let (_connection, channel) = self.channel().await;
        for t in AGGREGATE_TYPES {
            let _ = channel
                .queue_delete(
                    self.destination(t).as_str().into(),
                    QueueDeleteOptions::default(),
                )
                .await;
        }
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
    }
}

/// The messages `queue` holds (a passive `queue.declare`).
async fn queue_len(channel: &lapin::Channel, queue: &str) -> u64 {
    let declared = channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("queue {queue}: {e}"));
    u64::from(declared.message_count())
}

/// `basic.consume` of `queue` with consumer tag `tag`, without acknowledgements.
async fn consume_no_ack(channel: &lapin::Channel, queue: &str, tag: &str) -> lapin::Consumer {
    channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("consuming {queue}: {e}"))
}

/// The event id a message carries as its `message_id`.
fn message_id(properties: &lapin::BasicProperties) -> Option<Uuid> {
    properties
        .message_id()
        .as_ref()
        .and_then(|id| Uuid::parse_str(id.as_str()).ok())
}

/// Consume everything `queue` holds now, in queue order, as an independent consumer.
async fn consume_queue(channel: &lapin::Channel, queue: &str) -> Vec<Delivered> {
    let expected = queue_len(channel, queue).await as usize;
    let tag = unique("reader");
    let consumer = consume_no_ack(channel, queue, &tag).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    consumer.set_delegate(move |delivery: lapin::message::DeliveryResult| {
        let tx = tx.clone();
        async move {
            if let Ok(Some(delivery)) = delivery {
                let _ = tx.send(delivery);
            }
        }
    });
    // lapin runs the delegate as one task per delivery, so deliveries reach the channel in
    // any order: collect them all, then restore the queue order by delivery tag.
    let mut deliveries = Vec::with_capacity(expected);
    let deadline = Instant::now() + Duration::from_secs(60);
    while deliveries.len() < expected {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(delivery)) = tokio::time::timeout(left, rx.recv()).await else {
            panic!(
                "{queue}: got {} of its {expected} messages within 60s",
                deliveries.len()
            );
        };
        deliveries.push(delivery);
    }
    let _ = channel
        .basic_cancel(tag.as_str().into(), BasicCancelOptions::default())
        .await;
    deliveries.sort_by_key(|d: &lapin::message::Delivery| d.delivery_tag);
    deliveries
        .into_iter()
        .map(|delivery| {
            let headers: HashMap<String, String> = amqp_headers(&delivery).into_iter().collect();
            Delivered {
                event_id: message_id(&delivery.properties).unwrap_or_default(),
                aggregate_id: headers.get("aggregate_id").cloned().unwrap_or_default(),
                destination: queue.to_owned(),
                payload: delivery.data.clone(),
                headers,
                meta: HashMap::from([("routing_key".to_owned(), delivery.routing_key.to_string())]),
            }
        })
        .collect()
}

/// Run `rabbitmqctl -q` with `args` on the machine's broker: its output, or why it failed.
pub fn rabbitmqctl(args: &[&str]) -> Result<String, String> {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .map_err(|e| format!("running rabbitmqctl {args:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("rabbitmqctl {args:?} failed: {text}"))
    }
}

fn start_app() -> Result<(), String> {
    rabbitmqctl(&["start_app"])?;
    rabbitmqctl(&["await_startup", "--timeout", "120"]).map(drop)
}

/// The machine's RabbitMQ application (`rabbitmqctl stop_app` / `start_app`) as a [`Fault`].
/// Started again when dropped while stopped — on success and on failure (panics unwind through
/// it). It disturbs every other user of the local broker: run such a test alone.
#[derive(Debug, Default)]
pub struct RabbitMqApp {
    stopped: AtomicBool,
}

#[async_trait]
impl Fault for RabbitMqApp {
    fn describe(&self) -> String {
        "RabbitMQ stopped (stop_app) and started again".to_owned()
    }

    async fn begin(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Err(e) = tokio::task::block_in_place(|| rabbitmqctl(&["stop_app"])) {
            panic!("{e}");
        }
    }

    async fn end(&self) {
        if let Err(e) = tokio::task::block_in_place(start_app) {
            panic!("{e}");
        }
        self.stopped.store(false, Ordering::SeqCst);
    }
}

impl Drop for RabbitMqApp {
    fn drop(&mut self) {
        if self.stopped.load(Ordering::SeqCst) {
            if let Err(e) = start_app() {
                eprintln!("could not start RabbitMQ again ({e}): run scripts/services.sh");
            }
        }
    }
}

/// The sink conformance suite's consumer: a destination is a routing key on the side's exchange
/// (declared as the side is made); [`SuiteConsumer::prepare_destination`] binds a queue of the
/// same name for it, and `read_back` drains that queue. The event id is the `message_id`, the
/// event type the `type` property.
///
/// [`SuiteConsumer::prepare_destination`]: outboxkit_core::testkit::sink_suite::SuiteConsumer::prepare_destination
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for RabbitMqSide {
    async fn read_back(&self, to: &str, expected: usize, wait: Duration) -> Vec<ReceivedMessage> {
        let received = |delivery: &Delivery| {
            let mut headers = amqp_headers(delivery);
            // The sink sends an event's `content-type` header as the `content_type` property.
            if let Some(content_type) = delivery.properties.content_type() {
                headers.insert("content-type".to_owned(), content_type.to_string());
            }
            let message_id = delivery.properties.message_id().as_ref();
            let event_type = delivery.properties.kind().as_ref().expect("type property");
            ReceivedMessage {
                event_id: Uuid::parse_str(message_id.expect("message_id is set").as_str())
                    .expect("message_id is a UUID"),
                aggregate_id: headers["aggregate_id"].clone(),
                event_type: event_type.to_string(),
                payload: delivery.data.clone(),
                headers,
            }
        };
        self.drain(to, expected, wait)
            .await
            .iter()
            .map(received)
            .collect()
    }

    async fn prepare_destination(&self, to: &str) {
        self.bind_queue(to, to, &[]).await;
    }
}
