//! The demo on Kafka: topic `outbox-demo.order` (recreated empty, 8 partitions), read back by
//! a plain consumer over every partition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use outboxkit_core::Sink;
use outboxkit_sink_kafka::{ensure_topics, KafkaSink, KafkaSinkConfig, TopicSpec};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use uuid::Uuid;

use super::{DemoArgs, DemoBroker, DESTINATION};
use crate::cli::Failure;

/// Partitions of the demo topic.
const PARTITIONS: i32 = 8;

struct KafkaDemo {
    sink: Arc<KafkaSink>,
    bootstrap: String,
    topic: String,
}

pub(super) async fn open(args: &DemoArgs) -> Result<Arc<dyn DemoBroker>, Failure> {
    let bootstrap = args
        .broker_url
        .clone()
        .unwrap_or_else(|| "127.0.0.1:9092".to_owned());
    let topic = format!("{DESTINATION}.order");
    let mut config = KafkaSinkConfig::new(bootstrap.clone());
    config.topic = topic.clone();
    let sink = Arc::new(KafkaSink::connect(config.clone()).await.map_err(|e| {
        Failure::runtime(format!(
            "{} (start a Kafka-API broker with scripts/services.sh, or give --broker-url host:port)",
            e.full_message()
        ))
    })?);
    recreate_topic(&config, &topic).await?;
    Ok(Arc::new(KafkaDemo {
        sink,
        bootstrap,
        topic,
    }))
}

/// Delete the demo topic if it exists and create it empty again.
async fn recreate_topic(config: &KafkaSinkConfig, topic: &str) -> Result<(), Failure> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", config.bootstrap_servers())
        .create()
        .map_err(|e| Failure::runtime(format!("creating a Kafka admin client: {e}")))?;
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let deleted = admin
        .delete_topics(&[topic], &options)
        .await
        .map_err(|e| Failure::runtime(format!("deleting topic {topic}: {e}")))?;
    for result in deleted {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((name, code)) => {
                return Err(Failure::runtime(format!("deleting topic {name}: {code}")));
            }
        }
    }
    // A deleted topic may take a moment to disappear; retry the creation until it is fresh.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let created = ensure_topics(
            config,
            &[TopicSpec::new(topic, PARTITIONS)],
            Duration::from_secs(10),
        )
        .await;
        match (created, topic_state(config, topic).await) {
            (Ok(()), Ok(Some((partitions, 0)))) if partitions > 0 => return Ok(()),
            (Err(e), _) if Instant::now() > deadline => {
                return Err(Failure::runtime(format!("creating topic {topic}: {e}")))
            }
            (_, Err(e)) if Instant::now() > deadline => return Err(e),
            (Ok(()), Ok(state)) if Instant::now() > deadline => {
                return Err(Failure::runtime(format!(
                    "topic {topic} is not empty and new after being recreated ({state:?})"
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// `(partitions, partitions holding messages)` of `topic`, `None` when it does not exist.
async fn topic_state(
    config: &KafkaSinkConfig,
    topic: &str,
) -> Result<Option<(usize, usize)>, Failure> {
    let bootstrap = config.bootstrap_servers().to_owned();
    let topic = topic.to_owned();
    tokio::task::spawn_blocking(move || {
        let consumer = consumer(&bootstrap)?;
        let metadata = consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(10))
            .map_err(|e| Failure::runtime(format!("metadata of topic {topic}: {e}")))?;
        let Some(t) = metadata
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none())
        else {
            return Ok(None);
        };
        let mut with_data = 0;
        for p in t.partitions() {
            let (low, high) = consumer
                .fetch_watermarks(&topic, p.id(), Duration::from_secs(10))
                .map_err(|e| Failure::runtime(format!("offsets of topic {topic}: {e}")))?;
            if high > low {
                with_data += 1;
            }
        }
        Ok(Some((t.partitions().len(), with_data)))
    })
    .await
    .map_err(|e| Failure::runtime(format!("reading topic offsets: {e}")))?
}

fn consumer(bootstrap: &str) -> Result<BaseConsumer, Failure> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("outbox-demo-reader-{}", Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| Failure::runtime(format!("creating a Kafka consumer: {e}")))
}

#[async_trait]
impl DemoBroker for KafkaDemo {
    fn describe(&self) -> String {
        format!(
            "Kafka topic {} ({PARTITIONS} partitions) at {}",
            self.topic, self.bootstrap
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
        let (bootstrap, topic) = (self.bootstrap.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + timeout;
            let consumer = consumer(&bootstrap)?;
            let mut assignment = TopicPartitionList::new();
            for p in 0..PARTITIONS {
                assignment
                    .add_partition_offset(&topic, p, Offset::Beginning)
                    .map_err(|e| Failure::runtime(format!("assigning {topic}: {e}")))?;
            }
            consumer
                .assign(&assignment)
                .map_err(|e| Failure::runtime(format!("assigning {topic}: {e}")))?;
            let mut messages = Vec::with_capacity(expected);
            let mut distinct = std::collections::HashSet::new();
            while distinct.len() < expected && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(200)) {
                    Some(Ok(m)) => {
                        let event_id = m
                            .headers()
                            .and_then(|h| {
                                h.iter()
                                    .filter(|h| h.key == "event_id")
                                    .filter_map(|h| h.value)
                                    .last()
                                    .map(|v| String::from_utf8_lossy(v).into_owned())
                            })
                            .and_then(|s| Uuid::parse_str(&s).ok())
                            .unwrap_or_default();
                        let payload =
                            String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                        distinct.insert(event_id);
                        messages.push((event_id, payload));
                    }
                    Some(Err(e)) => {
                        return Err(Failure::runtime(format!("reading topic {topic} back: {e}")))
                    }
                    None => {}
                }
            }
            Ok(messages)
        })
        .await
        .map_err(|e| Failure::runtime(format!("reading the topic back: {e}")))?
    }
}
