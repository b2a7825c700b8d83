//! Shared by the RabbitMQ integration tests: the test broker's URL, an admin channel to declare
//! and bind queues, and a raw queue reader.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};

/// `OUTBOX_TEST_RABBITMQ_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`.
pub fn rabbitmq_url() -> String {
    std::env::var("OUTBOX_TEST_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned())
}

/// The durable topic exchange the tests publish to (each test uses its own routing keys).
pub const TEST_EXCHANGE: &str = "outbox.tests";

/// A fresh name prefix for one test's routing keys and queues.
pub fn unique_prefix() -> String {
    outboxkit_core::testkit::sink_suite::unique_prefix()
}

/// A plain connection and channel to the test broker, for setting up and reading back; the
/// test exchange is declared. Panics (fails the test) when RabbitMQ is unreachable.
pub struct Admin {
    pub connection: Connection,
    pub channel: Channel,
}

impl Admin {
    pub async fn connect() -> Self {
        let url = rabbitmq_url();
        let connect = Connection::connect(&url, ConnectionProperties::default());
        let connection = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => panic!(
                "RabbitMQ is unreachable at {} (set OUTBOX_TEST_RABBITMQ_URL, or start it with \
                 scripts/services.sh): {e}",
                redact(&url)
            ),
            Err(_) => panic!(
                "RabbitMQ at {} did not answer within 10s (set OUTBOX_TEST_RABBITMQ_URL)",
                redact(&url)
            ),
        };
        let channel = connection
            .create_channel()
            .await
            .expect("opening an admin channel");
        channel
            .exchange_declare(
                TEST_EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declaring the test exchange");
        Self {
            connection,
            channel,
        }
    }

    /// A queue named `queue`, expiring 10 minutes after its last use, bound to `exchange` for
    /// `routing_key`; `arguments` add queue arguments (e.g. `x-max-length`).
    pub async fn bind_queue(
        &self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
        arguments: &[(&str, AMQPValue)],
    ) {
        let mut args = FieldTable::default();
        args.insert("x-expires".into(), AMQPValue::LongInt(600_000));
        for (name, value) in arguments {
            args.insert((*name).into(), value.clone());
        }
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await
            .unwrap_or_else(|e| panic!("declaring queue {queue}: {e}"));
        self.channel
            .queue_bind(
                queue.into(),
                exchange.into(),
                routing_key.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap_or_else(|e| panic!("binding queue {queue} to {exchange}/{routing_key}: {e}"));
    }

    /// Every message in `queue` (removed from it), in queue order, waiting until `expected`
    /// arrived or `timeout` passed.
    pub async fn drain(&self, queue: &str, expected: usize, timeout: Duration) -> Vec<Delivery> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let got = self
                .channel
                .basic_get(queue.into(), BasicGetOptions { no_ack: true })
                .await
                .unwrap_or_else(|e| panic!("basic.get from {queue}: {e}"));
            match got {
                Some(message) => out.push(message.delivery),
                None => {
                    if out.len() >= expected || Instant::now() >= deadline {
                        return out;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    pub async fn delete_queue(&self, queue: &str) {
        let _ = self
            .channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await;
    }
}

/// A header of a delivery as text (AMQP long strings).
pub fn header(delivery: &Delivery, name: &str) -> Option<String> {
    headers(delivery).get(name).cloned()
}

/// Every string header of a delivery.
pub fn headers(delivery: &Delivery) -> BTreeMap<String, String> {
    let Some(table) = delivery.properties.headers() else {
        return BTreeMap::new();
    };
    table
        .inner()
        .iter()
        .filter_map(|(name, value)| {
            let text = match value {
                AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok()?,
                AMQPValue::ShortString(s) => s.as_str().to_owned(),
                _ => return None,
            };
            Some((name.as_str().to_owned(), text))
        })
        .collect()
}

fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// Run `rabbitmqctl` with `args`; panics with its output on failure.
pub fn rabbitmqctl(args: &[&str]) -> String {
    let out = std::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running rabbitmqctl {args:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}
