//! The demo on Redis Streams.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::Sink;
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
use redis::AsyncCommands;
use uuid::Uuid;

use super::{DemoArgs, DemoBroker, DESTINATION};
use crate::cli::Failure;

struct RedisDemo {
    sink: Arc<RedisStreamsSink>,
    connection: redis::aio::MultiplexedConnection,
    stream: String,
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoBroker>, Failure> {
    let url = args
        .broker_url
        .clone()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let stream = format!("{DESTINATION}.order");
    let mut config = RedisStreamsConfig::new(url.clone());
    config.stream = stream.clone();
    let sink = Arc::new(RedisStreamsSink::connect(config).await?);
    let client = redis::Client::open(url.as_str())
        .map_err(|e| Failure::config(format!("--broker-url: {e}")))?;
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Failure::runtime(format!("connecting to Redis: {e}")))?;
    let _: () = connection
        .del(&stream)
        .await
        .map_err(|e| Failure::runtime(format!("clearing stream {stream}: {e}")))?;
    Ok(Arc::new(RedisDemo {
        sink,
        connection,
        stream,
    }))
}

#[async_trait]
impl DemoBroker for RedisDemo {
    fn describe(&self) -> String {
        format!("Redis stream {}", self.stream)
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
        let mut connection = self.connection.clone();
        loop {
            let mut messages = Vec::with_capacity(expected);
            let mut cursor = "-".to_owned();
            loop {
                let reply: redis::streams::StreamRangeReply = connection
                    .xrange_count(&self.stream, &cursor, "+", 5000)
                    .await
                    .map_err(|e| {
                        Failure::runtime(format!("reading stream {} back: {e}", self.stream))
                    })?;
                for entry in &reply.ids {
                    let event_id: String = entry.get("event_id").unwrap_or_default();
                    let payload: String = entry.get("payload").unwrap_or_default();
                    messages.push((Uuid::parse_str(&event_id).unwrap_or_default(), payload));
                }
                match reply.ids.last() {
                    Some(last) if reply.ids.len() == 5000 => cursor = format!("({}", last.id),
                    _ => break,
                }
            }
            if messages.len() >= expected || Instant::now() > deadline {
                return Ok(messages);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}
