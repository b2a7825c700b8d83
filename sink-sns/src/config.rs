//! Configuration of the SNS sink (`[sink.sns]`).
//!
//! Credentials are deliberately not configuration keys: they come from the standard AWS chain
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, the shared profile files, web identity, ECS
//! or EC2 instance roles...), so they never sit in a relay configuration file or its logs.

use std::fmt;
use std::time::Duration;

use outboxkit_aws::batch::validate_limits;
use outboxkit_aws::client::{redact_url, ClientSettings};
use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::{DestinationTemplate, Error, Result};
use serde::Deserialize;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.sns";

/// The largest `PublishBatch` request (and message) SNS accepts: 256 KiB.
pub const SNS_MAX_REQUEST_BYTES: usize = 256 * 1024;

/// Configuration of [`SnsSink`](crate::SnsSink).
///
/// Every key has a default; unknown keys are errors. There are no credential keys (see the
/// module documentation), and `Debug` hides the user-info part of an endpoint URL.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SnsConfig {
    /// Destination template naming the topic: a topic name (`orders`, `orders.fifo`) or a topic
    /// ARN; a row's `destination` overrides it. Names ending in `.fifo` are FIFO topics.
    pub topic: String,
    /// The ARN of topic names without the name (`arn:aws:sns:eu-west-1:123456789012:`): a name
    /// is then this prefix and the name, with no lookup. Default: names are looked up once each
    /// with `ListTopics`.
    pub topic_arn_prefix: Option<String>,
    /// Endpoint override, e.g. `http://127.0.0.1:4566` for LocalStack. Default: the AWS chain
    /// (`AWS_ENDPOINT_URL_SNS`, `AWS_ENDPOINT_URL`, the profile), else the regional endpoint.
    pub endpoint: Option<String>,
    /// AWS region, e.g. `eu-west-1`. Default: the AWS chain (`AWS_REGION`, the profile...).
    pub region: Option<String>,
    /// A named profile of the shared AWS config files. Default: `AWS_PROFILE`, else `default`.
    pub profile: Option<String>,
    /// Most events in one `publish` call; the sink splits a call into `PublishBatch` requests of
    /// at most 10 entries and `max_request_bytes` each, sent concurrently.
    pub max_batch_len: usize,
    /// Most bytes in one `PublishBatch` request (messages plus attributes), at most 256 KiB.
    pub max_request_bytes: usize,
    /// Most `PublishBatch` requests in flight at once within one call.
    pub max_concurrent_requests: usize,
    /// How long opening a connection may take.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one attempt of one request may take before it is abandoned.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Attempts the AWS SDK makes per request (first try included) on throttling and transient
    /// errors, before the relay's own backoff takes over.
    pub retry_attempts: u32,
    /// `raw` (the payload as the message, the event's fields and headers as message attributes)
    /// or `cloudevents` (CloudEvents 1.0 JSON event format, structured content mode).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
}

impl Default for SnsConfig {
    fn default() -> Self {
        Self {
            topic: "{aggregate_type}".to_owned(),
            topic_arn_prefix: None,
            endpoint: None,
            region: None,
            profile: None,
            max_batch_len: 100,
            max_request_bytes: SNS_MAX_REQUEST_BYTES,
            max_concurrent_requests: 10,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_attempts: 3,
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
        }
    }
}

impl fmt::Debug for SnsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnsConfig")
            .field("topic", &self.topic)
            .field("topic_arn_prefix", &self.topic_arn_prefix)
            .field("endpoint", &self.endpoint.as_deref().map(redact_url))
            .field("region", &self.region)
            .field("profile", &self.profile)
            .field("max_batch_len", &self.max_batch_len)
            .field("max_request_bytes", &self.max_request_bytes)
            .field("max_concurrent_requests", &self.max_concurrent_requests)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("retry_attempts", &self.retry_attempts)
            .field("format", &self.format)
            .field("cloudevents_source", &self.cloudevents_source)
            .finish()
    }
}

impl SnsConfig {
    /// A configuration routing to `topic` (a template) with every other key at its default.
    pub fn new(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            ..Self::default()
        }
    }

    /// The CloudEvents mapping (`None` with `format = "raw"`); a `cloudevents_source` that is
    /// not a URI-reference is refused naming `sink.sns.cloudevents_source`.
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// Check every key; errors name the key (`sink.sns.endpoint: ...`).
    pub fn validate(&self) -> Result<()> {
        self.cloudevents()?;
        self.template()?;
        self.client_settings().validate()?;
        if let Some(prefix) = &self.topic_arn_prefix {
            let parts: Vec<&str> = prefix.split(':').collect();
            let valid = matches!(
                parts.as_slice(),
                ["arn", partition, "sns", region, account, ""]
                    if !partition.is_empty() && !region.is_empty()
                        && account.len() == 12 && account.chars().all(|c| c.is_ascii_digit())
            );
            if !valid {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.topic_arn_prefix: `{prefix}` is not a topic ARN without its \
                     name (expected arn:aws:sns:REGION:ACCOUNT:)"
                )));
            }
        }
        validate_limits(
            CONFIG_SECTION,
            "SNS",
            self.max_batch_len,
            self.max_request_bytes,
            SNS_MAX_REQUEST_BYTES,
            self.max_concurrent_requests,
        )
    }

    /// The keys that configure the AWS client.
    pub fn client_settings(&self) -> ClientSettings<'_> {
        ClientSettings {
            section: CONFIG_SECTION,
            endpoint_env: "AWS_ENDPOINT_URL_SNS",
            endpoint: self.endpoint.as_deref(),
            region: self.region.as_deref(),
            profile: self.profile.as_deref(),
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            retry_attempts: self.retry_attempts,
        }
    }

    /// The parsed topic template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.topic)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.topic")))
    }
}

/// `kind = "sns"`, settings in `[sink.sns]`; `sink.destination` is the topic template.
impl outboxkit_core::SinkConfig for SnsConfig {
    const KIND: &'static str = crate::SnsSink::KIND;
    type Sink = crate::SnsSink;
    const DESTINATION_KEY: Option<&'static str> = Some("topic");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.topic
    }

    fn validate(&self) -> Result<()> {
        SnsConfig::validate(self)
    }

    /// No request yet: `run` checks the sink (endpoint, credentials, topic) right after.
    async fn build(self) -> Result<Self::Sink> {
        crate::SnsSink::connect_lazy(self).await
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    #[test]
    fn defaults() {
        let config: SnsConfig = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, SnsConfig::default());
        assert_eq!(config.topic, "{aggregate_type}");
        assert_eq!(config.topic_arn_prefix, None);
        assert_eq!(config.max_batch_len, 100);
        assert_eq!(config.max_request_bytes, 262_144);
        assert_eq!(config.max_concurrent_requests, 10);
        assert_eq!(config.connect_timeout, Duration::from_secs(5));
        assert_eq!(config.request_timeout, Duration::from_secs(10));
        assert_eq!(config.retry_attempts, 3);
        config.validate().unwrap();
    }

    #[test]
    fn all_keys_and_human_durations() {
        let config: SnsConfig = from_json(serde_json::json!({
            "topic": "app-{aggregate_type}.fifo",
            "topic_arn_prefix": "arn:aws:sns:eu-west-1:123456789012:",
            "endpoint": "http://127.0.0.1:4566",
            "region": "eu-west-1",
            "profile": "relay",
            "max_batch_len": 500,
            "max_request_bytes": 65_536,
            "max_concurrent_requests": 4,
            "connect_timeout": "1500ms",
            "request_timeout": "1m",
            "retry_attempts": 5,
            "format": "cloudevents",
            "cloudevents_source": "/shop",
        }))
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.request_timeout, Duration::from_secs(60));
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = from_json::<SnsConfig>(serde_json::json!({ "topic_arn": "x" })).unwrap_err();
        assert!(e.contains("unknown field `topic_arn`"), "{e}");
        let e =
            from_json::<SnsConfig>(serde_json::json!({ "secret_access_key": "x" })).unwrap_err();
        assert!(e.contains("unknown field `secret_access_key`"), "{e}");
    }

    #[test]
    fn endpoint_user_info_never_shows() {
        let config = SnsConfig {
            endpoint: Some("https://key:s3cr3t@sns.internal:4566/".into()),
            ..SnsConfig::default()
        };
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("https://sns.internal:4566"), "{debug}");
    }

    #[test]
    fn invalid_values_name_the_key() {
        let errors = assert_refused(
            &SnsConfig::default(),
            &[
                ("topic: ", |c| c.topic = "{aggregate}".into()),
                ("endpoint: ", |c| c.endpoint = Some("127.0.0.1:4566".into())),
                ("topic_arn_prefix: ", |c| {
                    c.topic_arn_prefix = Some("arn:aws:sns:eu-west-1:123:".into())
                }),
                ("max_request_bytes: ", |c| c.max_request_bytes = 300 * 1024),
                ("retry_attempts: ", |c| c.retry_attempts = 0),
            ],
        );
        assert!(errors[3].contains("SNS's limit"), "{}", errors[3]);
    }
}
