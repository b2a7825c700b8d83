//! The [`Sink`] implementation: every event of a batch published at once, then every `PubAck`
//! awaited.

use std::fmt;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use async_nats::{Client, ConnectOptions, HeaderMap, ServerAddr};
use async_trait::async_trait;
use chrono::SecondsFormat;
use futures_util::future::join_all;
use outboxkit_core::cloudevents::{is_mapped_header, CloudEvents};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
};
use tokio::sync::OnceCell;
use tracing::Instrument;

use crate::classify::{
    classify_connect, classify_declare, classify_lookup, classify_publish, overlaps,
};
use crate::config::{NatsConfig, Storage, CONFIG_SECTION};
use crate::subject;

/// The header JetStream deduplicates on.
pub const MSG_ID_HEADER: &str = "Nats-Msg-Id";

/// Headers the sink sets from the event's fields, after the event's own headers.
pub const EVENT_HEADERS: [&str; 5] = [
    "event_id",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "created_at",
];

/// Publishes outbox events to NATS JetStream streams.
///
/// Subject from the template (default `{aggregate_type}.{event_type}`) or the row's
/// `destination`; data = the payload bytes; headers = the event's own headers, then
/// `event_id`, `event_type`, `aggregate_type`, `aggregate_id`, `created_at` and
/// `Nats-Msg-Id` = `event_id` (JetStream drops a re-publish of the same id within the stream's
/// duplicate window). With `format = "cloudevents"` (binary content mode): every attribute but
/// `datacontenttype` as `ce-<name>`, `datacontenttype` as `content-type`, the event's headers
/// that are not attributes, then the relay's headers as above.
///
/// The connection is made on first use and then kept: the client reconnects by itself.
pub struct NatsSink {
    config: NatsConfig,
    template: DestinationTemplate,
    cloudevents: Option<CloudEvents>,
    urls: Vec<url::Url>,
    servers: Vec<ServerAddr>,
    connection: OnceCell<Connection>,
    declared: OnceCell<()>,
}

struct Connection {
    client: Client,
    jetstream: jetstream::Context,
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One event of a call: decided already, or waiting for its `PubAck`.
enum Slot {
    Done(Outcome),
    Waiting(String, jetstream::context::PublishAckFuture),
}

impl NatsSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "nats";

    /// Validate `config` and build the sink without any network I/O: the connection is made
    /// on first use ([`Sink::check`] at start).
    pub fn connect_lazy(config: NatsConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let urls = config.servers()?;
        let servers = urls
            .iter()
            .map(|url| {
                url.as_str().parse::<ServerAddr>().map_err(|e| {
                    Error::config(format!(
                        "{CONFIG_SECTION}.url: `{}`: {e}",
                        config.redacted_url()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            template,
            cloudevents,
            urls,
            servers,
            connection: OnceCell::new(),
            declared: OnceCell::new(),
        })
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &NatsConfig {
        &self.config
    }

    async fn connection(&self) -> Result<&Connection> {
        self.connection.get_or_try_init(|| self.connect()).await
    }

    async fn connect(&self) -> Result<Connection> {
        let config = &self.config;
        let shown = config.redacted_url();
        let span = tracing::Span::current();
        let mut options = match &config.credentials_file {
            Some(path) => ConnectOptions::with_credentials_file(path)
                .await
                .map_err(|e| {
                    Error::config(format!(
                        "{CONFIG_SECTION}.credentials_file: `{}` is not a NATS credentials file: {e}",
                        path.display()
                    ))
                })?,
            None => ConnectOptions::new(),
        };
        options = options
            .name("outbox-relay")
            .connection_timeout(config.connect_timeout)
            .request_timeout(Some(config.request_timeout))
            .event_callback(move |event| {
                // In the span the connection was made in (the pipeline's, in the relay).
                let span = span.clone();
                async move {
                    match event {
                        async_nats::Event::Connected => {
                            tracing::info!("NATS connection (re)established")
                        }
                        async_nats::Event::Disconnected => {
                            tracing::warn!("NATS connection lost; reconnecting")
                        }
                        other => tracing::debug!(event = %other, "NATS client event"),
                    }
                }
                .instrument(span)
            });
        // async-nats does not read credentials from the URL: the first server's user and
        // password (or a user alone, NATS's token form) are passed on.
        if let Some(url) = self.urls.iter().find(|url| !url.username().is_empty()) {
            let decode = |text: &str| {
                percent_encoding::percent_decode_str(text)
                    .decode_utf8_lossy()
                    .into_owned()
            };
            options = match url.password() {
                Some(password) => {
                    options.user_and_password(decode(url.username()), decode(password))
                }
                None => options.token(decode(url.username())),
            };
        }
        if let Some(token) = &config.token {
            options = options.token(token.clone());
        }
        if let Some(seed) = &config.nkey {
            options = options.nkey(seed.clone());
        }
        let tls = &config.tls;
        if config.tls_required() || tls.ca_file.is_some() || tls.client_cert_file.is_some() {
            // async-nats builds its rustls configuration from the process-default provider.
            outboxkit_core::tls::install_ring_provider();
        }
        if tls.required {
            options = options.require_tls(true);
        }
        if let Some(ca) = &tls.ca_file {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&tls.client_cert_file, &tls.client_key_file) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        let connect = options.connect(self.servers.clone());
        let client = match tokio::time::timeout(config.connect_timeout, connect).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                return Err(classify_connect(&e, &shown, tls.ca_file.as_deref()));
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "cannot reach NATS at {shown} ({CONFIG_SECTION}.url): no answer within {} \
                         ({CONFIG_SECTION}.connect_timeout)",
                        humantime::format_duration(config.connect_timeout)
                    ),
                ))
            }
        };
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(config.request_timeout);
        Ok(Connection { client, jetstream })
    }

    /// Create or update the declared stream, once per sink.
    async fn declare(&self, connection: &Connection) -> Result<()> {
        let Some(declaration) = &self.config.declare_stream else {
            return Ok(());
        };
        self.declared
            .get_or_try_init(|| async {
                let subjects = match declaration.subjects.is_empty() {
                    true => vec![subject::wildcard(&self.template)],
                    false => declaration.subjects.clone(),
                };
                let stream_config = stream::Config {
                    name: declaration.name.clone(),
                    subjects,
                    storage: match declaration.storage {
                        Storage::File => stream::StorageType::File,
                        Storage::Memory => stream::StorageType::Memory,
                    },
                    duplicate_window: declaration.duplicate_window,
                    max_message_size: declaration.max_msg_size.unwrap_or(-1),
                    ..Default::default()
                };
                let subjects = stream_config.subjects.clone();
                let declared = connection
                    .jetstream
                    .create_or_update_stream(stream_config)
                    .await;
                if let Err(e) = declared {
                    let error = classify_declare(&e, &declaration.name);
                    return Err(match overlaps(&e) {
                        true => self.explain_overlap(connection, &subjects, error).await,
                        false => error,
                    });
                }
                tracing::info!(stream = %declaration.name, "JetStream stream declared");
                Ok(())
            })
            .await
            .map(drop)
    }

    /// The refused declaration's `error`, as a configuration error naming the stream that
    /// already has one of the `subjects` (a server says only that they overlap) and what to do.
    async fn explain_overlap(
        &self,
        connection: &Connection,
        subjects: &[String],
        error: Error,
    ) -> Error {
        let own = self.config.declare_stream.as_ref().map(|d| d.name.as_str());
        for subject in subjects {
            let Ok(other) = connection
                .jetstream
                .stream_by_subject(subject.as_str())
                .await
            else {
                continue;
            };
            if Some(other.as_str()) != own {
                return Error::config(format!(
                    "{}: stream `{other}` already captures subjects of `{subject}`; leave \
                     {CONFIG_SECTION}.declare_stream out to publish into `{other}`, or give \
                     {CONFIG_SECTION}.declare_stream.subjects that no other stream has",
                    error.message()
                ));
            }
        }
        error
    }

    /// The message of `event` for `subject`, or why it cannot be sent: an invalid subject or
    /// header, or more bytes than the server's `max_payload`.
    fn message(
        &self,
        event: &OutboxEvent,
        subject: &str,
        max_payload: usize,
    ) -> Result<PublishMessage> {
        if let Err(reason) = subject::check_publish(subject) {
            return Err(Error::new(
                ErrorKind::InvalidMessage,
                format!("subject `{subject}` {reason}"),
            )
            .permanent());
        }
        let headers = self.headers(event);
        let mut map = HeaderMap::new();
        // NATS/1.0\r\n, each `name: value\r\n`, then \r\n.
        let mut headers_size = 12;
        for (name, value) in &headers {
            check_header(name, value)?;
            headers_size += name.len() + value.len() + 4;
            map.insert(name.as_str(), value.as_str());
        }
        let size = headers_size + event.payload.len();
        if size > max_payload {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "message of {size} bytes (payload {} bytes, headers {headers_size} bytes) is \
                     larger than the server's max_payload ({max_payload} bytes) for subject \
                     `{subject}`; to send it, raise max_payload in the NATS server's configuration",
                    event.payload.len()
                ),
            )
            .permanent());
        }
        Ok(PublishMessage::build()
            .payload(bytes::Bytes::copy_from_slice(event.payload_bytes()))
            .headers(map))
    }

    /// The message's headers, in order: with CloudEvents the attributes (`ce-<name>`,
    /// `content-type`) and the event's headers that are not attributes, else the event's own
    /// headers; then the relay's headers and `Nats-Msg-Id`.
    fn headers(&self, event: &OutboxEvent) -> Vec<(String, String)> {
        let event_id = event.event_id.to_string();
        let mut out: Vec<(String, String)> = Vec::with_capacity(event.headers.len() + 8);
        if let Some(cloudevents) = &self.cloudevents {
            out.extend(cloudevents.binary_headers(event, "ce-"));
            out.push(("content-type".to_owned(), event.content_type().to_owned()));
        }
        for (name, value) in &event.headers {
            if self.cloudevents.is_none() || !is_mapped_header(name) {
                out.push((name.clone(), value.clone()));
            }
        }
        let created_at = event
            .created_at
            .to_rfc3339_opts(SecondsFormat::Micros, true);
        for (name, value) in EVENT_HEADERS.into_iter().zip([
            event_id.clone(),
            event.event_type.clone(),
            event.aggregate_type.clone(),
            event.aggregate_id.clone(),
            created_at,
        ]) {
            out.push((name.to_owned(), value));
        }
        out.push((MSG_ID_HEADER.to_owned(), event_id));
        out
    }
}

/// A header NATS can carry: a name of visible ASCII but `:`, a value without CR or LF.
fn check_header(name: &str, value: &str) -> Result<()> {
    let bad_name = name.is_empty() || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
    let reason = if bad_name {
        "is not a valid NATS header name (visible ASCII but `:`)"
    } else if value.contains(['\r', '\n']) {
        "has a value with a line break, which NATS headers cannot carry"
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::InvalidMessage,
        format!("header `{}` {reason}", name.escape_debug()),
    )
    .permanent())
}

#[async_trait]
impl Sink for NatsSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            // The size limit counts headers too: the sink checks it per event against the
            // server's max_payload.
            max_payload_bytes: None,
            // A publish whose PubAck timed out may not be stored while a later one of the same
            // call is (a reconnect between the two, a leader change): a later event of an
            // aggregate could land first. So the engine sends one event per aggregate per call.
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    /// Connect, declare the stream when configured, and check that a stream captures the
    /// subjects of the template (looked up with every token holding a placeholder as `*`).
    async fn check(&self) -> Result<()> {
        let connection = self.connection().await?;
        self.declare(connection).await?;
        let wildcard = subject::wildcard(&self.template);
        let stream = connection
            .jetstream
            .stream_by_subject(wildcard.clone())
            .await
            .map_err(|e| classify_lookup(&e, &wildcard, self.template.as_str()))?;
        tracing::debug!(%stream, subject = %wildcard, "JetStream stream found");
        Ok(())
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let connection = self.connection().await?;
        let max_payload = connection.client.server_info().max_payload;
        let mut slots = Vec::with_capacity(batch.len());
        // Once a send fails for the connection (full, gone), the rest of the batch is not sent:
        // each would wait as long.
        let mut send_failure: Option<Error> = None;
        for event in batch {
            let subject = self.destination(event);
            let message = match self.message(event, &subject, max_payload) {
                Ok(message) => message,
                Err(e) => {
                    slots.push(Slot::Done(Outcome::Reject(e)));
                    continue;
                }
            };
            if let Some(error) = &send_failure {
                slots.push(Slot::Done(Outcome::from_error(error.clone())));
                continue;
            }
            match connection
                .jetstream
                .send_publish(subject.clone(), message)
                .await
            {
                Ok(ack) => slots.push(Slot::Waiting(subject, ack)),
                Err(e) => {
                    let error = classify_publish(&e, &subject);
                    send_failure = Some(error.clone());
                    slots.push(Slot::Done(Outcome::from_error(error)));
                }
            }
        }
        let outcomes = join_all(slots.into_iter().map(|slot| async move {
            match slot {
                Slot::Done(outcome) => outcome,
                Slot::Waiting(subject, ack) => match ack.await {
                    Ok(ack) => {
                        if ack.duplicate {
                            tracing::debug!(%subject, stream = %ack.stream, "duplicate dropped by JetStream (Nats-Msg-Id seen in the duplicate window)");
                        }
                        Outcome::Published
                    }
                    Err(e) => Outcome::from_error(classify_publish(&e, &subject)),
                },
            }
        }))
        .await;
        Ok(outcomes)
    }
}
