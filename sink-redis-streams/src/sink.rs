//! The [`Sink`] implementation: one pipelined `XADD` per event, one round trip per batch.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use chrono::SecondsFormat;
use outboxkit_core::cloudevents::{is_mapped_header, CloudEvents, STRUCTURED_CONTENT_TYPE};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{IntoConnectionInfo, RedisError, Value};

use crate::classify::{classify, error_kind};
use crate::config::{RedisStreamsConfig, CONFIG_SECTION};

/// Redis refuses bulk strings larger than `proto-max-bulk-len`, 512 MiB by default.
const MAX_PAYLOAD_BYTES: usize = 512 * 1024 * 1024;

/// Publishes outbox events to Redis streams with `XADD`, one pipeline per batch.
///
/// Holds one multiplexed connection that reconnects by itself (after a Redis restart, a
/// killed client...): a call that hits a broken connection fails as a whole and a later call
/// goes through the new connection.
///
/// Entry fields: `event_id`, `aggregate_type`, `aggregate_id`, `event_type`, then in raw
/// format `payload` (the payload bytes), `headers` (JSON object) and `created_at`; with
/// `format = "cloudevents"` (CloudEvents 1.0, JSON event format, structured content mode)
/// `payload` (the event as one JSON document, which holds the time and the headers whose names
/// are CloudEvents attribute names), `content_type` = `application/cloudevents+json`, and,
/// when the event has other headers (`tenant-id`, `Tenant`...), `headers` (JSON object of
/// those), so none is lost.
pub struct RedisStreamsSink {
    config: RedisStreamsConfig,
    template: DestinationTemplate,
    cloudevents: Option<CloudEvents>,
    host_port: String,
    connection: ConnectionManager,
}

impl fmt::Debug for RedisStreamsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStreamsSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RedisStreamsSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "redis-streams";

    /// Validate `config`, connect and `PING` within `connect_timeout`.
    ///
    /// Fails fast with a one-line error naming the server and the key, e.g.
    /// `cannot reach Redis at 127.0.0.1:6399 (sink.redis_streams.url): connection refused`.
    pub async fn connect(config: RedisStreamsConfig) -> Result<Self> {
        let connect_timeout = config.connect_timeout;
        let sink = Self::connect_lazy(config)?;
        let ping = redis::cmd("PING");
        match tokio::time::timeout(connect_timeout, sink.query::<String>(&ping)).await {
            Ok(Ok(_)) => Ok(sink),
            Ok(Err(e)) => {
                if let Some(tls) = crate::tls::rustls_error(&e) {
                    return Err(crate::tls::certificate_error(
                        tls,
                        &sink.config,
                        &sink.host_port,
                    ));
                }
                let reason = if e.is_connection_refusal() {
                    "connection refused".to_owned()
                } else if e.kind() == redis::ErrorKind::AuthenticationFailed {
                    "authentication failed (check the user name and password)".to_owned()
                } else if e.is_timeout() {
                    sink.no_answer(connect_timeout)
                } else if e.code().is_some() && error_kind(&e) == ErrorKind::Other {
                    // The server answered, with an error no other row explains (`SELECT` of a
                    // database it does not have, `HELLO 3` on a Redis without RESP3).
                    return Err(Error::new(
                        ErrorKind::Config,
                        format!(
                            "Redis at {} refused to set up the connection ({CONFIG_SECTION}.url): \
                             {} (check the URL's database number, user and protocol)",
                            sink.host_port,
                            classify(e.clone()).full_message()
                        ),
                    ));
                } else {
                    classify(e.clone()).full_message()
                };
                Err(sink.connect_error(error_kind(&e), &reason))
            }
            Err(_) => {
                let reason = sink.no_answer(connect_timeout);
                Err(sink.connect_error(ErrorKind::Timeout, &reason))
            }
        }
    }

    /// Validate `config` and build the sink without any network I/O: the connection is made
    /// on first use (and errors surface from [`Sink::check`] and [`Sink::publish`]). Must be
    /// called within a Tokio runtime.
    pub fn connect_lazy(config: RedisStreamsConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let url = config.parse_url()?;
        let url_error = |e: RedisError| {
            Error::config(format!(
                "{CONFIG_SECTION}.url: `{}`: {e}",
                config.redacted_url()
            ))
        };
        let mut info = url.as_str().into_connection_info().map_err(url_error)?;
        if let Some(password) = &config.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        let client = match config.tls_certificates()? {
            Some(certificates) => {
                crate::tls::install_crypto_provider();
                redis::Client::build_with_tls(info, certificates).map_err(|e| {
                    Error::config(format!("{CONFIG_SECTION}.tls: {e}")).with_source(e)
                })?
            }
            None => redis::Client::open(info).map_err(url_error)?,
        };
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout))
            // Few, quick reconnection attempts inside one call: the relay's engine backs off
            // between calls, so a Redis that stays down fails the call promptly.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500));
        let connection = ConnectionManager::new_lazy_with_config(client, manager_config)
            .map_err(|e| classify(e).context(format!("{CONFIG_SECTION}.url")))?;
        Ok(Self {
            host_port: config.host_port(),
            template,
            cloudevents,
            config,
            connection,
        })
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &RedisStreamsConfig {
        &self.config
    }

    /// `CLIENT ID` of the connection the sink currently uses (diagnostics, `CLIENT KILL ID`).
    pub async fn client_id(&self) -> Result<i64> {
        let mut client_id = redis::cmd("CLIENT");
        client_id.arg("ID");
        self.within_response_timeout("CLIENT ID", self.query::<i64>(&client_id))
            .await
    }

    async fn query<T: redis::FromRedisValue>(&self, command: &redis::Cmd) -> redis::RedisResult<T> {
        let mut connection = self.connection.clone();
        command.query_async(&mut connection).await
    }

    /// `no answer within 5s`, and with a `rediss://` URL the likely cause: a server that does not
    /// take TLS on that port waits for a command and never answers the handshake.
    fn no_answer(&self, connect_timeout: Duration) -> String {
        let tls = self.config.url.starts_with("rediss:");
        format!(
            "no answer within {}{}",
            humanize(connect_timeout),
            if tls {
                " (the URL asks for TLS with rediss://: check that the server takes TLS on this \
                 port)"
            } else {
                ""
            }
        )
    }

    /// The one-line error of a failed [`connect`](Self::connect), naming server and keys (for
    /// refused credentials, also `password` when that key gave the password).
    fn connect_error(&self, kind: ErrorKind, reason: &str) -> Error {
        let message = if kind == ErrorKind::Unauthorized {
            let keys = match self.config.password {
                Some(_) => format!("{CONFIG_SECTION}.url, {CONFIG_SECTION}.password"),
                None => format!("{CONFIG_SECTION}.url"),
            };
            format!(
                "Redis at {} refused the credentials ({keys}): {reason}",
                self.host_port
            )
        } else {
            format!(
                "cannot reach Redis at {} ({CONFIG_SECTION}.url): {reason}",
                self.host_port
            )
        };
        Error::new(kind, message)
    }

    async fn within_response_timeout<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.config.response_timeout, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => match crate::tls::rustls_error(&e) {
                Some(tls) => Err(crate::tls::certificate_error(
                    tls,
                    &self.config,
                    &self.host_port,
                )),
                None => Err(classify(e).context(format!("{what} on Redis at {}", self.host_port))),
            },
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what} on Redis at {}: no answer within {} ({CONFIG_SECTION}.response_timeout)",
                    self.host_port,
                    humanize(self.config.response_timeout)
                ),
            )),
        }
    }

    /// How every `XADD` of a call trims its stream: `MAXLEN ~ <maxlen>`, or `MINID ~ <ms>` that
    /// drops the entries Redis added longer than `max_age` before now (entry ids start with
    /// Redis's clock in milliseconds; this is the relay's), or not at all.
    fn trim(&self) -> Option<(&'static str, u64)> {
        if let Some(maxlen) = self.config.maxlen {
            return Some(("MAXLEN", maxlen));
        }
        let age = self.config.max_age?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let oldest_kept = now.saturating_sub(age).as_millis();
        Some(("MINID", u64::try_from(oldest_kept).unwrap_or(u64::MAX)))
    }

    /// With `max_age`: that the server takes `XADD ... MINID` (Redis 6.2 or later), else a
    /// configuration error naming the key and the version: an older server would refuse every
    /// event's `XADD` as a syntax error. A user whose ACL refuses `INFO`, or a server that gives
    /// no version, passes, with a warning.
    async fn check_trim_support(&self) -> Result<()> {
        if self.config.max_age.is_none() {
            return Ok(());
        }
        let mut info = redis::cmd("INFO");
        info.arg("server");
        let text: String = match self
            .within_response_timeout("INFO server", self.query(&info))
            .await
        {
            Ok(text) => text,
            Err(e) if e.kind() == ErrorKind::Unauthorized => {
                tracing::warn!(
                    error = %e,
                    "cannot read the Redis version to check {CONFIG_SECTION}.max_age (trimming \
                     by age needs Redis 6.2 or later)"
                );
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let Some(version) = text
            .lines()
            .find_map(|line| line.strip_prefix("redis_version:"))
            .map(str::trim)
        else {
            tracing::warn!(
                "the server at {} gives no redis_version in INFO server: cannot check \
                 {CONFIG_SECTION}.max_age (trimming by age needs Redis 6.2 or later)",
                self.host_port
            );
            return Ok(());
        };
        let mut numbers = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        if (major, minor) >= (6, 2) {
            return Ok(());
        }
        Err(Error::config(format!(
            "{CONFIG_SECTION}.max_age: Redis at {} is version {version}, and trimming by age \
             (XADD ... MINID) needs 6.2 or later: upgrade Redis, or use \
             {CONFIG_SECTION}.maxlen instead",
            self.host_port
        )))
    }

    fn xadd(
        &self,
        pipe: &mut redis::Pipeline,
        stream: &str,
        trim: Option<(&str, u64)>,
        event: &OutboxEvent,
        body: &Body,
    ) {
        pipe.cmd("XADD").arg(stream);
        if let Some((by, threshold)) = trim {
            pipe.arg(by).arg("~").arg(threshold);
        }
        pipe.arg("*")
            .arg("event_id")
            .arg(event.event_id.to_string())
            .arg("aggregate_type")
            .arg(&event.aggregate_type)
            .arg("aggregate_id")
            .arg(&event.aggregate_id)
            .arg("event_type")
            .arg(&event.event_type);
        match body {
            Body::Raw { headers } => {
                pipe.arg("payload")
                    .arg(event.payload_bytes())
                    .arg("headers")
                    .arg(headers)
                    .arg("created_at")
                    .arg(
                        event
                            .created_at
                            .to_rfc3339_opts(SecondsFormat::Micros, true),
                    );
            }
            Body::CloudEvents { document, headers } => {
                pipe.arg("payload")
                    .arg(document.as_slice())
                    .arg("content_type")
                    .arg(STRUCTURED_CONTENT_TYPE);
                if let Some(headers) = headers {
                    pipe.arg("headers").arg(headers);
                }
            }
        }
    }

    /// What goes into the entry after the event's fields, or why the event cannot be sent.
    fn body(&self, event: &OutboxEvent) -> Result<Body> {
        let json = |headers: &BTreeMap<&String, &String>| {
            serde_json::to_string(headers).map_err(|e| {
                Error::new(ErrorKind::InvalidMessage, "headers are not serializable").with_source(e)
            })
        };
        let Some(cloudevents) = &self.cloudevents else {
            let headers = json(&event.headers.iter().collect())?;
            return Ok(Body::Raw { headers });
        };
        // Headers that are not extension attributes of the document.
        let unmapped: BTreeMap<&String, &String> = (event.headers.iter())
            .filter(|(name, _)| !is_mapped_header(name))
            .collect();
        let headers = match unmapped.is_empty() {
            true => None,
            false => Some(json(&unmapped)?),
        };
        let document = cloudevents.structured(event);
        if document.len() > MAX_PAYLOAD_BYTES {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "the CloudEvents document of {} bytes is larger than Redis's largest \
                     string ({MAX_PAYLOAD_BYTES} bytes)",
                    document.len()
                ),
            ));
        }
        Ok(Body::CloudEvents { document, headers })
    }
}

/// The entry's fields after the event's: the raw format's, or the CloudEvents document.
enum Body {
    Raw {
        headers: String,
    },
    CloudEvents {
        document: Vec<u8>,
        headers: Option<String>,
    },
}

#[async_trait]
impl Sink for RedisStreamsSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: Some(MAX_PAYLOAD_BYTES),
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    async fn check(&self) -> Result<()> {
        let ping = redis::cmd("PING");
        self.within_response_timeout("PING", self.query::<String>(&ping))
            .await?;
        self.check_trim_support().await
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut streams: Vec<String> = Vec::with_capacity(batch.len());
        // Which event each pipelined command belongs to.
        let mut sent: Vec<usize> = Vec::with_capacity(batch.len());
        let mut pipe = redis::pipe();
        // Per-command error replies come back as values instead of failing the whole query.
        pipe.ignore_errors();
        let trim = self.trim();
        for (index, event) in batch.iter().enumerate() {
            let stream = self.destination(event);
            // Redis takes an empty key: the events would land in a stream named "".
            let body = match stream.is_empty() {
                true => Err(Error::new(
                    ErrorKind::InvalidMessage,
                    "the stream name is empty (the stream template rendered with empty fields)",
                )),
                false => self.body(event),
            };
            match body {
                Ok(body) => {
                    self.xadd(&mut pipe, &stream, trim, event, &body);
                    sent.push(index);
                }
                Err(e) => {
                    outcomes[index] = Some(Outcome::Reject(
                        e.context(format!("XADD to stream `{stream}`")),
                    ));
                }
            }
            streams.push(stream);
        }
        if !sent.is_empty() {
            let mut connection = self.connection.clone();
            let what = publishing(sent.len());
            let query = pipe.query_async::<Vec<Value>>(&mut connection);
            let replies = self.within_response_timeout(&what, query).await?;
            if replies.len() != sent.len() {
                return Err(Error::new(
                    ErrorKind::Other,
                    format!(
                        "{what} on Redis at {}: {} replies for {} commands",
                        self.host_port,
                        replies.len(),
                        sent.len()
                    ),
                ));
            }
            let replies = replies.into_iter().map(|value| match value {
                Value::ServerError(e) => Err(RedisError::from(e)),
                _ => Ok(()),
            });
            let per_command = outcomes_from_replies(replies, |i| &streams[sent[i]]);
            for (i, outcome) in per_command.into_iter().enumerate() {
                outcomes[sent[i]] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.ok_or_else(|| Error::new(ErrorKind::Other, "an event of the batch got no reply"))
            })
            .collect()
    }
}

/// One outcome per reply, classified by kind: whether the call failed as a whole (refused
/// credentials, or `OOM` / `LOADING`... on every command) is the engine's decision.
fn outcomes_from_replies<'a>(
    replies: impl IntoIterator<Item = redis::RedisResult<()>>,
    stream_of: impl Fn(usize) -> &'a String,
) -> Vec<Outcome> {
    replies
        .into_iter()
        .enumerate()
        .map(|(i, reply)| match reply {
            Ok(()) => Outcome::Published,
            Err(e) => {
                let error = classify(e).context(format!("XADD to stream `{}`", stream_of(i)));
                tracing::debug!(stream = %stream_of(i), error = %error, "event not published");
                Outcome::from_error(error)
            }
        })
        .collect()
}

/// What a pipeline of `XADD`s does, for its errors: "publishing 1 event", "publishing 3 events".
fn publishing(count: usize) -> String {
    match count {
        1 => "publishing 1 event".to_owned(),
        n => format!("publishing {n} events"),
    }
}

fn humanize(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use outboxkit_core::whole_call_failure;

    use super::*;

    #[test]
    fn one_event_is_not_called_events() {
        assert_eq!(publishing(1), "publishing 1 event");
        assert_eq!(publishing(2), "publishing 2 events");
    }

    fn reply(line: &str) -> redis::RedisResult<()> {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap() {
            Value::ServerError(e) => Err(e.into()),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    fn outcomes(replies: Vec<redis::RedisResult<()>>) -> Vec<Outcome> {
        let stream = "orders".to_owned();
        outcomes_from_replies(replies, |_| &stream)
    }

    const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

    #[test]
    fn per_message_errors_become_outcomes() {
        let out = outcomes(vec![Ok(()), reply(WRONGTYPE), Ok(())]);
        assert!(out[0].is_published() && out[2].is_published());
        match &out[1] {
            Outcome::Reject(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidMessage);
                assert!(
                    e.message()
                        .starts_with("XADD to stream `orders`: WRONGTYPE"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(whole_call_failure(&out).is_none());
    }

    #[test]
    fn server_wide_errors_after_some_success_are_retried_per_event() {
        let out = outcomes(vec![Ok(()), reply(OOM)]);
        assert!(out[0].is_published());
        assert!(matches!(&out[1], Outcome::Retry(e) if e.kind() == ErrorKind::Unavailable));
        assert!(whole_call_failure(&out).is_none());
    }

    #[test]
    fn server_wide_errors_on_every_event_fail_the_call() {
        let out = outcomes(vec![reply(OOM), reply("LOADING Redis is loading")]);
        assert!(out
            .iter()
            .all(|o| matches!(o, Outcome::Retry(e) if e.kind() == ErrorKind::Unavailable)));
        let e = whole_call_failure(&out).expect("the engine fails the call");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        // Mixed with a message error: outcomes per event, so the bad event can be parked.
        let out = outcomes(vec![reply(OOM), reply(WRONGTYPE)]);
        assert!(matches!(&out[0], Outcome::Retry(_)));
        assert!(matches!(&out[1], Outcome::Reject(_)));
        assert!(whole_call_failure(&out).is_none());
    }

    #[test]
    fn refused_credentials_fail_the_call() {
        let out = outcomes(vec![Ok(()), reply("NOPERM no permissions to run 'xadd'")]);
        assert!(out[0].is_published(), "what went through stays published");
        let e = whole_call_failure(&out).expect("the engine fails the call");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert!(!e.is_retryable());
        assert!(e.message().contains("NOPERM"), "{e}");
        let out = outcomes(vec![reply("NOAUTH Authentication required.")]);
        let e = whole_call_failure(&out).expect("the engine fails the call");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
    }
}
