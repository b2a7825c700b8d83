//! Configuration of the SQS sink (`[sink.sqs]`).
//!
//! Credentials are deliberately not configuration keys: they come from the standard AWS chain
//! (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, the shared profile files, web identity, ECS
//! or EC2 instance roles...), so they never sit in a relay configuration file or its logs.

use std::fmt;
use std::time::Duration;

use outboxkit_aws::batch::validate_limits;
pub use outboxkit_aws::batch::MAX_ENTRIES_PER_REQUEST;
pub(crate) use outboxkit_aws::client::redact_url;
use outboxkit_aws::client::ClientSettings;
use outboxkit_core::cloudevents::{CloudEvents, Format, DEFAULT_SOURCE};
use outboxkit_core::{DestinationTemplate, Error, Result};
use serde::Deserialize;

/// Where this configuration lives in the relay's configuration file; error messages name it.
pub const CONFIG_SECTION: &str = "sink.sqs";

/// The largest request (and message) SQS accepts at all: 1 MiB.
pub const SQS_MAX_REQUEST_BYTES: usize = 1024 * 1024;

/// The classic SQS limit for one `SendMessageBatch` request and one message: 256 KiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 256 * 1024;

/// Configuration of [`SqsSink`](crate::SqsSink).
///
/// Every key has a default; unknown keys are errors. There are no credential keys (see the
/// module documentation), and `Debug` hides the user-info part of an endpoint URL.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqsConfig {
    /// Destination template naming the queue: a queue name (`orders`, `orders.fifo`), a queue
    /// URL or a queue ARN; a row's `destination` overrides it. Names ending in `.fifo` are
    /// FIFO queues.
    pub queue: String,
    /// Endpoint override, e.g. `http://127.0.0.1:4566` for LocalStack. Default: the AWS chain
    /// (`AWS_ENDPOINT_URL_SQS`, `AWS_ENDPOINT_URL`, the profile), else the regional endpoint.
    pub endpoint: Option<String>,
    /// AWS region, e.g. `eu-west-1`. Default: the AWS chain (`AWS_REGION`, the profile...).
    pub region: Option<String>,
    /// A named profile of the shared AWS config files. Default: `AWS_PROFILE`, else `default`.
    pub profile: Option<String>,
    /// Account owning the queues, for queues given by name that another account owns.
    pub queue_owner_account_id: Option<String>,
    /// On standard queues, set `MessageGroupId = aggregate_id` (SQS fair queues: one noisy
    /// aggregate cannot delay the others' consumers). FIFO queues always get it.
    pub fair_queue_group: bool,
    /// Most events in one `publish` call; the sink splits a call into `SendMessageBatch`
    /// requests of at most 10 entries and `max_request_bytes` each, sent concurrently.
    pub max_batch_len: usize,
    /// Most bytes in one `SendMessageBatch` request (bodies plus attributes). 256 KiB works on
    /// every SQS; AWS accepts up to 1 MiB since 2025.
    pub max_request_bytes: usize,
    /// Most `SendMessageBatch` requests in flight at once within one call.
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
    /// `raw` (the payload as the body, the event's fields and headers as message attributes) or
    /// `cloudevents` (CloudEvents 1.0 JSON event format, structured content mode, as the body).
    pub format: Format,
    /// The CloudEvents `source` template (`format = "cloudevents"` only).
    pub cloudevents_source: String,
}

impl Default for SqsConfig {
    fn default() -> Self {
        Self {
            queue: "{aggregate_type}".to_owned(),
            endpoint: None,
            region: None,
            profile: None,
            queue_owner_account_id: None,
            fair_queue_group: false,
            max_batch_len: 100,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_concurrent_requests: 10,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            retry_attempts: 3,
            format: Format::Raw,
            cloudevents_source: DEFAULT_SOURCE.to_owned(),
        }
    }
}

impl fmt::Debug for SqsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsConfig")
            .field("queue", &self.queue)
            .field("endpoint", &self.redacted_endpoint())
            .field("region", &self.region)
            .field("profile", &self.profile)
            .field("queue_owner_account_id", &self.queue_owner_account_id)
            .field("fair_queue_group", &self.fair_queue_group)
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

impl SqsConfig {
    /// The CloudEvents mapping (`None` with `format = "raw"`); a `cloudevents_source` that is
    /// not a URI-reference is refused naming `sink.sqs.cloudevents_source`.
    pub fn cloudevents(&self) -> Result<Option<CloudEvents>> {
        CloudEvents::for_section(self.format, &self.cloudevents_source, CONFIG_SECTION)
    }

    /// A configuration routing to `queue` (a template) with every other key at its default.
    pub fn new(queue: impl Into<String>) -> Self {
        Self {
            queue: queue.into(),
            ..Self::default()
        }
    }

    /// The endpoint override without any user-info part, fit for logs.
    pub fn redacted_endpoint(&self) -> Option<String> {
        self.endpoint.as_deref().map(redact_url)
    }

    /// Check every key; errors name the key (`sink.sqs.endpoint: ...`).
    pub fn validate(&self) -> Result<()> {
        self.cloudevents()?;
        self.template()?;
        self.client_settings().validate()?;
        if let Some(account) = &self.queue_owner_account_id {
            if account.len() != 12 || !account.chars().all(|c| c.is_ascii_digit()) {
                return Err(Error::config(format!(
                    "{CONFIG_SECTION}.queue_owner_account_id: `{account}` is not a 12-digit AWS account id \
                     (give it as a string in TOML: \"123456789012\")"
                )));
            }
        }
        validate_limits(
            CONFIG_SECTION,
            "SQS",
            self.max_batch_len,
            self.max_request_bytes,
            SQS_MAX_REQUEST_BYTES,
            self.max_concurrent_requests,
        )
    }

    /// The keys that configure the AWS client.
    pub fn client_settings(&self) -> ClientSettings<'_> {
        ClientSettings {
            section: CONFIG_SECTION,
            endpoint_env: "AWS_ENDPOINT_URL_SQS",
            endpoint: self.endpoint.as_deref(),
            region: self.region.as_deref(),
            profile: self.profile.as_deref(),
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            retry_attempts: self.retry_attempts,
        }
    }

    /// The parsed queue template.
    pub fn template(&self) -> Result<DestinationTemplate> {
        DestinationTemplate::parse(&self.queue)
            .map_err(|e| e.context(format!("{CONFIG_SECTION}.queue")))
    }
}

/// `kind = "sqs"`, settings in `[sink.sqs]`; `sink.destination` is the queue template.
impl outboxkit_core::SinkConfig for SqsConfig {
    const KIND: &'static str = crate::SqsSink::KIND;
    type Sink = crate::SqsSink;
    const DESTINATION_KEY: Option<&'static str> = Some("queue");

    fn destination_mut(&mut self) -> &mut String {
        &mut self.queue
    }

    fn validate(&self) -> Result<()> {
        SqsConfig::validate(self)
    }

    /// No request yet: `run` checks the sink (endpoint, credentials, queue) right after.
    async fn build(self) -> Result<Self::Sink> {
        crate::SqsSink::connect_lazy(self).await
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_core::testkit::sink_suite::{assert_refused, from_json};

    use super::*;

    #[test]
    fn defaults() {
        let config: SqsConfig = from_json(serde_json::json!({})).unwrap();
        assert_eq!(config, SqsConfig::default());
        assert_eq!(config.queue, "{aggregate_type}");
        assert_eq!(config.endpoint, None);
        assert_eq!(config.region, None);
        assert!(!config.fair_queue_group);
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
        let config: SqsConfig = from_json(serde_json::json!({
            "queue": "app-{aggregate_type}.fifo",
            "endpoint": "http://127.0.0.1:4566",
            "region": "eu-west-1",
            "profile": "relay",
            "queue_owner_account_id": "123456789012",
            "fair_queue_group": true,
            "max_batch_len": 500,
            "max_request_bytes": 1_048_576,
            "max_concurrent_requests": 4,
            "connect_timeout": "1500ms",
            "request_timeout": "1m",
            "retry_attempts": 5,
        }))
        .unwrap();
        config.validate().unwrap();
        assert_eq!(config.connect_timeout, Duration::from_millis(1500));
        assert_eq!(config.request_timeout, Duration::from_secs(60));
        assert_eq!(config.max_request_bytes, SQS_MAX_REQUEST_BYTES);
        assert!(config.fair_queue_group);
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = from_json::<SqsConfig>(serde_json::json!({ "queue_url": "x" })).unwrap_err();
        assert!(e.contains("unknown field `queue_url`"), "{e}");
        // Credentials are not configuration keys: they come from the AWS chain.
        let e =
            from_json::<SqsConfig>(serde_json::json!({ "secret_access_key": "x" })).unwrap_err();
        assert!(e.contains("unknown field `secret_access_key`"), "{e}");
    }

    #[test]
    fn endpoint_user_info_never_shows() {
        let config = SqsConfig {
            endpoint: Some("https://key:s3cr3t@sqs.internal:4566/".into()),
            ..SqsConfig::default()
        };
        let debug = format!("{config:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(!debug.contains("key:"), "{debug}");
        assert_eq!(
            config.redacted_endpoint().as_deref(),
            Some("https://sqs.internal:4566")
        );
        assert_eq!(redact_url("not a url:s3cr3t@host"), "***@host");
    }

    #[test]
    fn invalid_values_name_the_key() {
        assert_refused(
            &SqsConfig::default(),
            &[
                ("queue: ", |c| c.queue = "{aggregate}".into()),
                ("endpoint: ", |c| c.endpoint = Some("127.0.0.1:4566".into())),
                ("endpoint: unsupported scheme", |c| {
                    c.endpoint = Some("ftp://127.0.0.1:4566".into())
                }),
                ("region: ", |c| c.region = Some("EU West".into())),
                ("queue_owner_account_id: ", |c| {
                    c.queue_owner_account_id = Some("1234".into())
                }),
                ("max_batch_len: ", |c| c.max_batch_len = 0),
                ("max_request_bytes: ", |c| {
                    c.max_request_bytes = 2 * 1024 * 1024
                }),
                ("max_concurrent_requests: ", |c| {
                    c.max_concurrent_requests = 0
                }),
                ("retry_attempts: ", |c| c.retry_attempts = 0),
                ("request_timeout: ", |c| c.request_timeout = Duration::ZERO),
            ],
        );
    }
}
