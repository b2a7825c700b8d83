//! The demo on RabbitMQ: the relays publish to a topic exchange with publisher confirms; a
//! queue bound to it is read back.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::options::{
    BasicGetOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use outboxkit_core::Sink;
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink};
use uuid::Uuid;

use super::{DemoArgs, DemoBroker, DESTINATION};
use crate::cli::Failure;

struct RabbitMqDemo {
    sink: Arc<RabbitMqSink>,
    /// Kept open for the reader's channel.
    _connection: Connection,
    channel: Channel,
    queue: String,
    /// Everything read so far (basic.get removes messages from the queue).
    received: Mutex<Vec<(Uuid, String)>>,
}

fn runtime_error(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::runtime(format!("{what} on RabbitMQ: {e}"))
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoBroker>, Failure> {
    let url = args
        .broker_url
        .clone()
        .unwrap_or_else(|| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let exchange = DESTINATION.to_owned();
    let queue = format!("{DESTINATION}.order");
    let config = RabbitMqConfig {
        declare_exchange: true,
        exchange_type: "topic".to_owned(),
        connection_name: "outbox-relay demo".to_owned(),
        ..RabbitMqConfig::new(url.clone(), exchange.clone())
    };
    config
        .validate()
        .map_err(|e| Failure::config(format!("--broker-url: {}", e.message())))?;

    // The reader's side first: the exchange and a fresh queue bound for every order event, so
    // nothing the relays publish is unroutable.
    let connection = tokio::time::timeout(
        Duration::from_secs(10),
        Connection::connect(&url, ConnectionProperties::default()),
    )
    .await
    .map_err(|_| {
        Failure::runtime(format!(
            "RabbitMQ at {} did not answer within 10s",
            config.host_port()
        ))
    })?
    .map_err(|e| {
        Failure::runtime(format!(
            "connecting to RabbitMQ at {}: {e}",
            config.host_port()
        ))
    })?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| runtime_error("opening a channel", e))?;
    channel
        .exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| runtime_error(&format!("declaring exchange {exchange}"), e))?;
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await
        .map_err(|e| runtime_error(&format!("clearing queue {queue}"), e))?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| runtime_error(&format!("declaring queue {queue}"), e))?;
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.as_str().into(),
            "order.*".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| runtime_error(&format!("binding queue {queue}"), e))?;

    let sink = Arc::new(RabbitMqSink::connect(config).await?);
    Ok(Arc::new(RabbitMqDemo {
        sink,
        _connection: connection,
        channel,
        queue,
        received: Mutex::new(Vec::new()),
    }))
}

impl RabbitMqDemo {
    /// Everything read, once `expected` distinct events arrived or `deadline` passed.
    fn read_so_far(&self, expected: usize, deadline: Instant) -> Option<Vec<(Uuid, String)>> {
        let received = self.received.lock().unwrap_or_else(|p| p.into_inner());
        let distinct: HashSet<Uuid> = received.iter().map(|(id, _)| *id).collect();
        (distinct.len() >= expected || Instant::now() > deadline).then(|| received.clone())
    }
}

#[async_trait]
impl DemoBroker for RabbitMqDemo {
    fn describe(&self) -> String {
        format!(
            "RabbitMQ exchange {DESTINATION} (topic, publisher confirms) → queue {}",
            self.queue
        )
    }

    fn sink(&self) -> Arc<dyn Sink> {
        self.sink.clone()
    }

    async fn read_all(
        &self,
        expected: usize,
        timeout: Duration,
    ) -> Result<Vec<(Uuid, String)>, Failure> {
        let deadline = Instant::now() + timeout;
        loop {
            let got = self
                .channel
                .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .map_err(|e| runtime_error(&format!("reading queue {} back", self.queue), e))?;
            let Some(message) = got else {
                // The queue is empty for now.
                if let Some(all) = self.read_so_far(expected, deadline) {
                    return Ok(all);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            let delivery = message.delivery;
            let event_id = delivery
                .properties
                .message_id()
                .as_ref()
                .and_then(|id| Uuid::parse_str(id.as_str()).ok())
                .unwrap_or_default();
            let payload = String::from_utf8_lossy(&delivery.data).into_owned();
            self.received
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((event_id, payload));
        }
    }
}
