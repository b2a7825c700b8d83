//! The broker of a pair: the harness's broker side (settings section, destinations, counts and
//! the live consumer), made anew at each reset so every run starts from empty destinations,
//! and our sink crate's sink to them for the article's run and the broker ceiling.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use outboxkit_core::Sink;
use outboxkit_harness::{
    BrokerSide, KafkaBrokerProcess, KafkaSide, NatsSide, QueueAttributeName, RabbitMqSide,
    RedisSide, SnsSide, SqsSide,
};
use outboxkit_sink_kafka::{KafkaSink, KafkaSinkConfig};
use outboxkit_sink_nats::{NatsConfig, NatsSink};
use outboxkit_sink_rabbitmq::{RabbitMqConfig, RabbitMqSink};
use outboxkit_sink_redis_streams::{RedisStreamsConfig, RedisStreamsSink};
use outboxkit_sink_sns::{SnsConfig, SnsSink};
use outboxkit_sink_sqs::{SqsConfig, SqsSink};

use crate::Args;

/// Names of the destinations: stream and topic `bench.order`, exchange `bench`.
const PREFIX: &str = "bench";
/// Partitions of the Kafka topic.
const PARTITIONS: i32 = 8;
const REGION: &str = "us-east-1";

enum Kind {
    /// Redis at this URL.
    Redis(String),
    /// A private tansu broker (in-memory storage) of this binary, replaced at each reset so the
    /// runs do not pile messages up in its memory.
    Kafka(PathBuf),
    /// RabbitMQ at this URL: topic exchange `bench`, durable queue, persistent and confirmed
    /// messages.
    RabbitMq(String),
    /// A standard queue on LocalStack at this endpoint, a new one (`bench-order-N`) at each
    /// reset.
    Sqs(String, Box<aws_config::SdkConfig>),
    /// A standard topic on LocalStack at this endpoint and the standard queue subscribed to it
    /// (raw delivery), new ones (`bench-order-N`) at each reset.
    Sns(String, Box<aws_config::SdkConfig>),
    /// NATS at this URL (`OUTBOX_TEST_NATS_URL`): stream `bench` capturing `bench.>`, file
    /// storage, deleted at each reset.
    Nats(String),
}

struct Current {
    side: Arc<dyn BrokerSide>,
    sink: Arc<dyn Sink>,
    _kafka: Option<KafkaBrokerProcess>,
}

/// The broker side of a pair.
pub struct Broker {
    kind: Kind,
    max_events: Option<u64>,
    dir: PathBuf,
    current: Mutex<Option<Current>>,
    resets: AtomicU32,
}

impl Broker {
    /// The broker of sink kind `sink`, reset once.
    pub async fn open(args: &Args, sink: &str, dir: PathBuf) -> Result<Self, String> {
        let (kind, max_events) = match sink {
            "redis-streams" => (Kind::Redis(args.redis_url.clone()), None),
            "kafka" => {
                if !args.tansu_bin.exists() {
                    return Err(format!(
                        "{} does not exist: install the Kafka-API broker with scripts/services.sh \
                         kafka (or pass --tansu-bin)",
                        args.tansu_bin.display()
                    ));
                }
                (Kind::Kafka(args.tansu_bin.clone()), None)
            }
            "rabbitmq" => (
                Kind::RabbitMq(args.rabbitmq_url.clone()),
                Some(args.rabbitmq_events),
            ),
            "sqs" => (
                Kind::Sqs(
                    args.sqs_endpoint.clone(),
                    Box::new(sdk_config(&args.sqs_endpoint).await),
                ),
                Some(args.sqs_events),
            ),
            "sns" => (
                Kind::Sns(
                    args.sqs_endpoint.clone(),
                    Box::new(sdk_config(&args.sqs_endpoint).await),
                ),
                Some(args.sqs_events),
            ),
            "nats" => (Kind::Nats(outboxkit_harness::nats_url()), None),
            other => {
                return Err(format!(
                    "--pairs: sink \"{other}\" is not benchmarked (known: redis-streams, kafka, rabbitmq, sqs, sns, nats)"
                ))
            }
        };
        let broker = Self {
            kind,
            max_events,
            dir,
            current: Mutex::new(None),
            resets: AtomicU32::new(0),
        };
        broker.reset().await?;
        Ok(broker)
    }

    /// Server and version.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Kafka(bin) => format!(
                "{} (Kafka API, in-memory storage)",
                KafkaBrokerProcess::version(bin)
            ),
            _ => self.side().server_version(),
        }
    }

    /// Most events per drain this broker can take in reasonable time.
    pub fn max_events(&self) -> Option<u64> {
        self.max_events
    }

    /// The harness's side of the current destinations.
    pub fn side(&self) -> Arc<dyn BrokerSide> {
        self.current().0
    }

    /// The sink as the relay builds it, to the current destinations.
    pub fn sink(&self) -> Arc<dyn Sink> {
        self.current().1
    }

    fn current(&self) -> (Arc<dyn BrokerSide>, Arc<dyn Sink>) {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let current = current.as_ref().expect("the broker is reset before use");
        (current.side.clone(), current.sink.clone())
    }

    /// Forget everything delivered: delete the destinations and prepare them anew.
    pub async fn reset(&self) -> Result<(), String> {
        let old = self
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(old) = old {
            old.side.cleanup().await;
        }
        let mut kafka = None;
        let side: Arc<dyn BrokerSide> = match &self.kind {
            Kind::Redis(url) => Arc::new(RedisSide::open_at(url, PREFIX).await),
            Kind::Kafka(bin) => {
                let broker = KafkaBrokerProcess::start_binary(bin, &self.dir, &[]);
                let side = KafkaSide::open_at(&broker.bootstrap, PREFIX).await;
                kafka = Some(broker);
                Arc::new(side.partitions(PARTITIONS))
            }
            Kind::RabbitMq(url) => Arc::new(RabbitMqSide::open_at(url, PREFIX).await),
            Kind::Nats(url) => Arc::new(NatsSide::open_at(url, PREFIX).await),
            Kind::Sqs(endpoint, _) => {
                let side = SqsSide::standard_at(endpoint, &self.fresh_name()).await;
                // Nothing consumes during a drain; the latency runs' receivers delete nothing.
                Arc::new(
                    side.attribute(QueueAttributeName::VisibilityTimeout, "3600")
                        .consumers(0),
                )
            }
            Kind::Sns(endpoint, _) => {
                let side = SnsSide::standard_at(endpoint, &self.fresh_name()).await;
                Arc::new(
                    side.attribute(QueueAttributeName::VisibilityTimeout, "3600")
                        .consumers(0),
                )
            }
        };
        side.prepare().await;
        let sink = self.connect_sink(side.as_ref(), kafka.as_ref()).await?;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Current {
            side,
            sink,
            _kafka: kafka,
        });
        Ok(())
    }

    /// A destination name of this reset (a queue deleted on SQS cannot be created again for
    /// 60 s).
    fn fresh_name(&self) -> String {
        let n = self.resets.fetch_add(1, Ordering::Relaxed);
        format!("bench-order-{}-{n}", std::process::id())
    }

    /// Our sink crate's sink to the destination of aggregate type `order`.
    async fn connect_sink(
        &self,
        side: &dyn BrokerSide,
        kafka: Option<&KafkaBrokerProcess>,
    ) -> Result<Arc<dyn Sink>, String> {
        let destination = side.destination("order");
        Ok(match &self.kind {
            Kind::Redis(url) => {
                let mut config = RedisStreamsConfig::new(url);
                config.stream = destination;
                shared(RedisStreamsSink::connect(config).await)?
            }
            Kind::Kafka(_) => {
                let bootstrap = kafka.map(|k| k.bootstrap.clone()).unwrap_or_default();
                let mut config = KafkaSinkConfig::new(bootstrap);
                config.topic = destination;
                shared(KafkaSink::connect(config).await)?
            }
            Kind::RabbitMq(url) => {
                let mut config = RabbitMqConfig::new(url, PREFIX);
                config.declare_exchange = true;
                config.exchange_type = "topic".to_owned();
                shared(RabbitMqSink::connect(config).await)?
            }
            Kind::Sqs(endpoint, sdk) => {
                let mut config = SqsConfig::new(destination);
                config.endpoint = Some(endpoint.clone());
                config.region = Some(REGION.to_owned());
                shared(SqsSink::from_sdk_config(config, sdk))?
            }
            Kind::Sns(endpoint, sdk) => {
                let mut config = SnsConfig::new(destination);
                config.endpoint = Some(endpoint.clone());
                config.region = Some(REGION.to_owned());
                shared(SnsSink::from_sdk_config(config, sdk))?
            }
            Kind::Nats(url) => {
                let config = NatsConfig {
                    subject: destination,
                    ..NatsConfig::new(url)
                };
                let sink = NatsSink::connect_lazy(config).map_err(|e| e.to_string())?;
                sink.check().await.map_err(|e| e.to_string())?;
                Arc::new(sink)
            }
        })
    }
}

/// A sink as the pair holds it, or the error's text.
fn shared<S: Sink + 'static>(
    sink: Result<S, impl std::fmt::Display>,
) -> Result<Arc<dyn Sink>, String> {
    match sink {
        Ok(sink) => Ok(Arc::new(sink)),
        Err(e) => Err(e.to_string()),
    }
}

/// LocalStack's region and test credentials.
async fn sdk_config(endpoint: &str) -> aws_config::SdkConfig {
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new(REGION))
        .credentials_provider(aws_sdk_sqs::config::Credentials::new(
            "test",
            "test",
            None,
            None,
            "outboxkit-bench",
        ))
        .endpoint_url(endpoint)
        .load()
        .await
}
