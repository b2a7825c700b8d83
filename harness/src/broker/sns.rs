//! SNS (LocalStack): one topic, standard or FIFO, read back through an SQS queue subscribed
//! to it with raw message delivery — the queue's consumer is the [`SqsSide`]'s, so what
//! arrives is checked the same way.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_sns::error::DisplayErrorContext;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::sqs::{aws_relay_env, aws_sdk_config, aws_sink_toml, localstack_version, SqsSide};
use super::BrokerSide;
use crate::delivery::{Committed, Delivered};

/// The SNS side: topic `<prefix>` (standard) or `<prefix>.fifo`, and an SQS queue of the same
/// name subscribed to it with `RawMessageDelivery` (a FIFO queue for a FIFO topic), consumed
/// by an [`SqsSide`]. The message attributes the sink sets arrive as the queue message's
/// attributes; on a FIFO topic the queue message's group is the topic message's.
#[derive(Debug)]
pub struct SnsSide {
    endpoint: String,
    topic: String,
    queue: SqsSide,
    client: aws_sdk_sns::Client,
    topic_arn: Mutex<String>,
}

impl SnsSide {
    /// A standard topic `<prefix>` on the test server ([`crate::sqs_endpoint`]).
    pub async fn standard(prefix: &str) -> Self {
        Self::standard_at(&crate::sqs_endpoint(), prefix).await
    }

    /// A standard topic `<prefix>` on the server at `endpoint`.
    pub async fn standard_at(endpoint: &str, prefix: &str) -> Self {
        Self::new(
            endpoint,
            prefix.to_owned(),
            SqsSide::standard_at(endpoint, prefix).await,
        )
    }

    /// A FIFO topic `<prefix>.fifo` on the test server.
    pub async fn fifo(prefix: &str) -> Self {
        Self::fifo_at(&crate::sqs_endpoint(), prefix).await
    }

    /// A FIFO topic `<prefix>.fifo` on the server at `endpoint`.
    pub async fn fifo_at(endpoint: &str, prefix: &str) -> Self {
        let queue = SqsSide::fifo_at(endpoint, prefix).await;
        Self::new(endpoint, format!("{prefix}.fifo"), queue)
    }

    fn new(endpoint: &str, topic: String, queue: SqsSide) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            topic,
            queue,
            client: aws_sdk_sns::Client::new(&aws_sdk_config(endpoint)),
            topic_arn: Mutex::default(),
        }
    }

    /// See [`SqsSide::json_attribute`].
    pub fn json_attribute(mut self, name: &str) -> Self {
        self.queue = self.queue.json_attribute(name);
        self
    }

    /// See [`SqsSide::attribute`] (of the subscribed queue).
    pub fn attribute(mut self, name: crate::QueueAttributeName, value: &str) -> Self {
        self.queue = self.queue.attribute(name, value);
        self
    }

    /// See [`SqsSide::consumers`].
    pub fn consumers(mut self, tasks: usize) -> Self {
        self.queue = self.queue.consumers(tasks);
        self
    }

    /// The queue side reading the topic.
    pub fn queue(&self) -> &SqsSide {
        &self.queue
    }

    /// Fail the test, saying what to start, when the server does not answer SNS within 20 s.
    pub async fn require_server(&self) {
        self.queue.require_server().await;
        let endpoint = &self.endpoint;
        let list = self.client.list_topics().send();
        match tokio::time::timeout(Duration::from_secs(20), list).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!(
                "the server at {endpoint} does not answer SNS ({}): start LocalStack with SNS \
                 (scripts/services.sh sqs) or set OUTBOX_TEST_SQS_ENDPOINT",
                DisplayErrorContext(&e)
            ),
            Err(_) => panic!("the server at {endpoint} did not answer SNS within 20s"),
        }
    }

    /// Create topic `name` (FIFO when it ends in `.fifo`) and its ARN, or fail the test.
    pub async fn create_topic(&self, name: &str) -> String {
        let mut request = self.client.create_topic().name(name);
        if name.ends_with(".fifo") {
            request = request.attributes("FifoTopic", "true");
        }
        match request.send().await {
            Ok(answer) => answer.topic_arn().expect("a topic ARN").to_owned(),
            Err(e) => panic!(
                "creating SNS topic {name} at {} failed ({}): is LocalStack up with SNS? start \
                 it with scripts/services.sh sqs",
                self.endpoint,
                DisplayErrorContext(&e)
            ),
        }
    }

    /// Subscribe the queue at `queue_url` to the topic `topic_arn`, raw message delivery.
    pub async fn subscribe(&self, topic_arn: &str, queue_url: &str) {
        let queue_arn = self.queue.queue_arn(queue_url).await;
        self.client
            .subscribe()
            .topic_arn(topic_arn)
            .protocol("sqs")
            .endpoint(queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .unwrap_or_else(|e| panic!("subscribing {queue_url}: {}", DisplayErrorContext(&e)));
    }

    /// Delete the topic `arn` (errors ignored).
    pub async fn delete_topic(&self, arn: &str) {
        let _ = self.client.delete_topic().topic_arn(arn).send().await;
    }
}

#[async_trait]
impl BrokerSide for SnsSide {
    fn name(&self) -> String {
        let fifo = self.topic.ends_with(".fifo");
        format!("SNS {} topic", if fifo { "FIFO" } else { "standard" })
    }

    fn server_version(&self) -> String {
        format!(
            "LocalStack {} (SNS and SQS API emulator, Python)",
            localstack_version(&self.endpoint)
        )
    }

    fn sink_toml(&self) -> String {
        aws_sink_toml("sns", "topic", &self.topic, &self.endpoint)
    }

    fn relay_env(&self) -> Vec<(String, String)> {
        aws_relay_env()
    }

    /// Create the topic, the queue (and start its consumer), and subscribe the queue.
    async fn prepare(&self) {
        self.require_server().await;
        let arn = self.create_topic(&self.topic).await;
        self.queue.prepare().await;
        self.subscribe(&arn, &self.queue.url()).await;
        *self.topic_arn.lock().unwrap() = arn;
    }

    fn destination(&self, _aggregate_type: &str) -> String {
        self.topic.clone()
    }

    fn ordered(&self) -> bool {
        self.queue.ordered()
    }

    async fn read_back(&self, expected: &HashSet<Uuid>, timeout: Duration) -> Vec<Delivered> {
        self.queue.read_back(expected, timeout).await
    }

    async fn held(&self, expected: u64, timeout: Duration) -> u64 {
        self.queue.held(expected, timeout).await
    }

    async fn watch(&self) -> mpsc::UnboundedReceiver<(Uuid, Instant)> {
        self.queue.watch().await
    }

    /// The queue's checks: the writer's `traceparent` attribute and, FIFO, the group.
    fn check_messages(&self, delivered: &[Delivered], committed: &Committed) {
        self.queue.check_messages(delivered, committed);
    }

    async fn cleanup(&self) {
        self.queue.cleanup().await;
        let arn = self.topic_arn.lock().unwrap().clone();
        self.delete_topic(&arn).await;
    }
}

/// The sink conformance suite's consumer: a destination is a topic name;
/// `prepare_destination` creates the topic and a queue of the same name subscribed to it,
/// `read_back` reads the queue (see [`SqsSide`]'s).
#[cfg(feature = "sink-suite")]
#[async_trait]
impl outboxkit_core::testkit::sink_suite::SuiteConsumer for SnsSide {
    /// Standard topics delivered to standard queues promise no order.
    fn keeps_order(&self) -> bool {
        self.queue.ordered()
    }

    async fn read_back(
        &self,
        to: &str,
        expected: usize,
        wait: Duration,
    ) -> Vec<outboxkit_core::testkit::sink_suite::ReceivedMessage> {
        outboxkit_core::testkit::sink_suite::SuiteConsumer::read_back(
            &self.queue,
            to,
            expected,
            wait,
        )
        .await
    }

    async fn prepare_destination(&self, to: &str) {
        let arn = self.create_topic(to).await;
        let url = self.queue.create_queue(to, &[]).await;
        self.subscribe(&arn, &url).await;
    }
}
