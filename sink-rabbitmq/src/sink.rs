//! The [`Sink`] implementation: a batch is published pipelined on one confirm-mode channel and
//! every publisher confirm is awaited.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use chrono::SecondsFormat;
use lapin::message::BasicReturnMessage;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::tcp::OwnedTLSConfig;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::AMQPUri;
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use outboxkit_core::cloudevents::{is_mapped_header, CloudEvents};
use outboxkit_core::{
    DestinationTemplate, Error, ErrorKind, OutboxEvent, Outcome, Result, Sink, SinkCapabilities,
    CONTENT_TYPE_HEADER,
};
use tracing::{debug, info, warn};

use crate::classify::{self, Scope};
use crate::config::{RabbitMqConfig, UnroutablePolicy, CONFIG_SECTION, MAX_SHORT_STRING_BYTES};

/// AMQP `delivery_mode` of persistent messages.
const PERSISTENT: u8 = 2;

/// Publishes outbox events to a RabbitMQ exchange with publisher confirms.
///
/// With `format = "cloudevents"` (CloudEvents 1.0, AMQP protocol binding, binary content
/// mode) the body is still the payload and the properties are unchanged; the headers are every
/// attribute but `datacontenttype` as `cloudEvents:<name>` (the content type is the
/// `content_type` property), the event's headers that are not attributes, then the event's
/// fields.
///
/// Holds one connection with one dedicated confirm-mode channel. Calls are serialized on that
/// channel (so each call's confirms and returns belong to it). A call that finds the connection
/// broken before any answer fails with `Err`; the next call reconnects, re-enables confirms and
/// re-declares the exchange (when configured) — after a broker restart the sink recovers by
/// itself. Every answered message gets its own outcome, classified by kind: whether the call
/// failed as a whole is the engine's decision ([`outboxkit_core::whole_call_failure`]).
pub struct RabbitMqSink {
    config: RabbitMqConfig,
    template: DestinationTemplate,
    cloudevents: Option<CloudEvents>,
    uri: AMQPUri,
    tls: OwnedTLSConfig,
    host_port: String,
    exchange_display: String,
    link: tokio::sync::Mutex<Option<Link>>,
}

/// A live connection and its publishing channel.
struct Link {
    connection: Connection,
    channel: Channel,
    /// The broker closed the channel (a channel-level error): open a new one before use.
    channel_broken: bool,
}

impl fmt::Debug for RabbitMqSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RabbitMqSink")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One event ready to go: routing key and properties built, checked against AMQP limits.
struct Prepared {
    /// Index in the batch.
    index: usize,
    routing_key: ShortString,
    properties: BasicProperties,
    message_id: String,
}

/// What the broker answered for one message.
enum Answer {
    Ack,
    Nack,
    /// The message got no confirm: the channel or the connection failed first.
    Failed(lapin::Error),
}

impl RabbitMqSink {
    /// The sink kind as named in configuration.
    pub const KIND: &'static str = "rabbitmq";

    /// Validate `config`, connect (within `connect_timeout`), open the confirm channel,
    /// declare the exchange when configured and check that it exists.
    ///
    /// Fails fast with a one-line error naming the server and the key, e.g.
    /// `cannot reach RabbitMQ at 127.0.0.1:5673 (sink.rabbitmq.url): IO error: Connection refused`.
    pub async fn connect(config: RabbitMqConfig) -> Result<Self> {
        let sink = Self::connect_lazy(config)?;
        sink.check().await?;
        Ok(sink)
    }

    /// Validate `config` and read the TLS files, without any network I/O: the connection is
    /// made on first use (errors surface from [`Sink::check`] and [`Sink::publish`]).
    pub fn connect_lazy(config: RabbitMqConfig) -> Result<Self> {
        config.validate()?;
        let template = config.template()?;
        let cloudevents = config.cloudevents()?;
        let uri = config.amqp_uri()?;
        let tls = config.tls_config()?;
        Ok(Self {
            host_port: config.host_port(),
            exchange_display: config.exchange_display(),
            template,
            cloudevents,
            uri,
            tls,
            config,
            link: tokio::sync::Mutex::new(None),
        })
    }

    /// The configuration this sink was built with.
    pub fn config(&self) -> &RabbitMqConfig {
        &self.config
    }

    /// Whether the sink holds an open connection right now (diagnostics).
    pub async fn is_connected(&self) -> bool {
        self.link
            .lock()
            .await
            .as_ref()
            .is_some_and(|link| link.connection.status().connected())
    }

    fn vhost(&self) -> &str {
        &self.uri.vhost
    }

    /// A usable link: the current one, with a fresh channel if the broker closed the old one,
    /// or a new connection.
    async fn ensure_link<'a>(&self, slot: &'a mut Option<Link>) -> Result<&'a mut Link> {
        let usable = matches!(slot, Some(link) if link.connection.status().connected());
        if !usable {
            if slot.take().is_some() {
                warn!(host = %self.host_port, "the RabbitMQ connection was lost; reconnecting");
            }
            let link = tokio::time::timeout(self.config.connect_timeout, self.open_link())
                .await
                .map_err(|_| self.connect_timeout_error("connecting"))??;
            info!(
                host = %self.host_port,
                vhost = %self.vhost(),
                exchange = %self.exchange_display,
                "connected to RabbitMQ (publisher confirms on)"
            );
            return Ok(slot.insert(link));
        }
        let Some(link) = slot.as_mut() else {
            return Err(Error::new(ErrorKind::Other, "no RabbitMQ connection"));
        };
        if link.channel_broken || !link.channel.status().connected() {
            let channel = tokio::time::timeout(
                self.config.connect_timeout,
                self.open_channel(&link.connection),
            )
            .await
            .map_err(|_| self.connect_timeout_error("opening a channel"));
            match channel {
                Ok(Ok(channel)) => {
                    link.channel = channel;
                    link.channel_broken = false;
                }
                // Right after the broker closed a channel it may refuse the next one on the same
                // connection (`504 CHANNEL_ERROR - expected 'channel.open'`, which also closes
                // the connection): start over on a new connection, once.
                Ok(Err(e)) | Err(e) => {
                    warn!(host = %self.host_port, error = %e, "opening a channel failed; reconnecting");
                    let link = tokio::time::timeout(self.config.connect_timeout, self.open_link())
                        .await
                        .map_err(|_| self.connect_timeout_error("connecting"))??;
                    return Ok(slot.insert(link));
                }
            }
        }
        let Some(link) = slot.as_mut() else {
            return Err(Error::new(ErrorKind::Other, "no RabbitMQ connection"));
        };
        Ok(link)
    }

    async fn open_link(&self) -> Result<Link> {
        let properties = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.config.connection_name.clone()));
        let runtime = lapin::runtime::default_runtime()
            .map_err(|e| classify::classify(e).context("starting the RabbitMQ client"))?;
        let connection = Connection::connect_uri_with_config(
            self.uri.clone(),
            properties,
            self.tls.clone(),
            runtime,
        )
        .await
        .map_err(|e| self.connect_error(e))?;
        let channel = self.open_channel(&connection).await?;
        Ok(Link {
            connection,
            channel,
            channel_broken: false,
        })
    }

    /// A channel in confirm mode, with the exchange declared when configured.
    async fn open_channel(&self, connection: &Connection) -> Result<Channel> {
        let at = format!("on RabbitMQ at {}", self.host_port);
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| classify::classify(e).context(format!("opening a channel {at}")))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| {
                classify::classify(e).context(format!("enabling publisher confirms {at}"))
            })?;
        if self.config.declare_exchange {
            let options = ExchangeDeclareOptions {
                durable: self.config.exchange_durable,
                ..ExchangeDeclareOptions::default()
            };
            channel
                .exchange_declare(
                    self.config.exchange.as_str().into(),
                    self.config.exchange_kind(),
                    options,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| self.declare_error(e))?;
        }
        Ok(channel)
    }

    fn declare_error(&self, e: lapin::Error) -> Error {
        let error = classify::classify(e);
        let context = format!(
            "declaring exchange {} (type {}, durable {}) on RabbitMQ at {}",
            self.exchange_display,
            self.config.exchange_type,
            self.config.exchange_durable,
            self.host_port
        );
        if error.kind() == ErrorKind::InvalidMessage {
            // 406 PRECONDITION_FAILED: it exists with other settings.
            return Error::new(
                ErrorKind::Config,
                format!(
                    "{context} ({CONFIG_SECTION}.exchange_type, {CONFIG_SECTION}.exchange_durable): \
                     it exists with other settings: {}",
                    error.full_message()
                ),
            );
        }
        error.context(context)
    }

    /// The one-line error of a failed connection, naming server and key. A refused TLS
    /// handshake (a certificate not trusted, for another host, expired; a plain-text server on
    /// the port) is a configuration error saying which key to fix, as for every adapter.
    fn connect_error(&self, e: lapin::Error) -> Error {
        if let Some(tls) = outboxkit_core::tls::rustls_error(&e) {
            return self.tls_error(tls);
        }
        let error = classify::classify(e);
        let user = &self.uri.authority.userinfo.username;
        let message = match error.kind() {
            ErrorKind::Unauthorized => format!(
                "RabbitMQ at {} refused user `{user}` on vhost `{}` ({}): {} \
                 (check the user name, password and the user's permissions on the vhost)",
                self.host_port,
                self.vhost(),
                self.config.credential_keys(),
                error.full_message()
            ),
            ErrorKind::Config => format!(
                "RabbitMQ at {} refused vhost `{}` ({CONFIG_SECTION}.url): {}",
                self.host_port,
                self.vhost(),
                error.full_message()
            ),
            _ => format!(
                "cannot reach RabbitMQ at {} ({CONFIG_SECTION}.url): {}",
                self.host_port,
                error.full_message()
            ),
        };
        let out = Error::new(error.kind(), message);
        if error.is_retryable() {
            out.temporary()
        } else {
            out.permanent()
        }
    }

    /// A failed TLS handshake with the broker, explained.
    fn tls_error(&self, error: &rustls::Error) -> Error {
        outboxkit_core::tls::sink_certificate_error(
            error,
            CONFIG_SECTION,
            &format!("RabbitMQ at {}", self.host_port),
            self.config.tls.ca_file.as_deref(),
        )
    }

    fn connect_timeout_error(&self, what: &str) -> Error {
        Error::new(
            ErrorKind::Timeout,
            format!(
                "{what} to RabbitMQ at {}: no answer within {} ({CONFIG_SECTION}.connect_timeout)",
                self.host_port,
                humanize(self.config.connect_timeout)
            ),
        )
    }

    /// The error of a call that broke off with `e` (for the messages without an answer), with
    /// what to do about it.
    fn call_error(&self, e: lapin::Error, what: &str) -> Error {
        let error = classify::classify(e);
        match error.kind() {
            ErrorKind::Unroutable => Error::new(
                ErrorKind::Unroutable,
                format!(
                    "{what}: exchange {} does not exist on RabbitMQ at {} vhost `{}` \
                     ({CONFIG_SECTION}.exchange): declare it, or set \
                     {CONFIG_SECTION}.declare_exchange = true ({})",
                    self.exchange_display,
                    self.host_port,
                    self.vhost(),
                    error.full_message()
                ),
            ),
            ErrorKind::Unauthorized => Error::new(
                ErrorKind::Unauthorized,
                format!(
                    "{what}: user `{}` may not publish to exchange {} on RabbitMQ at {} \
                     (grant it write permission on the vhost `{}`): {}",
                    self.uri.authority.userinfo.username,
                    self.exchange_display,
                    self.host_port,
                    self.vhost(),
                    error.full_message()
                ),
            ),
            _ => error.context(format!("{what} on RabbitMQ at {}", self.host_port)),
        }
    }

    /// Build the message of `event`, or say why it can never be sent as it is.
    fn prepare(&self, index: usize, event: &OutboxEvent) -> Result<Prepared> {
        let routing_key = self.destination(event);
        // AMQP short strings: checked here, because lapin panics on longer ones.
        let short = |what: &dyn fmt::Display, value: &str| {
            ShortString::try_new(value).map_err(|_| {
                Error::new(
                    ErrorKind::InvalidMessage,
                    format!(
                        "{what} is {} bytes long; AMQP allows at most {MAX_SHORT_STRING_BYTES}",
                        value.len()
                    ),
                )
            })
        };
        let key = short(
            &format_args!("routing key `{routing_key:.60}...`"),
            &routing_key,
        )?;
        let message_id = event.event_id.to_string();
        let mut headers = FieldTable::default();
        // With CloudEvents, every attribute but the content type is a `cloudEvents:` header,
        // and the event's headers that are attributes are not sent again.
        let attributes = self
            .cloudevents
            .as_ref()
            .map(|ce| ce.binary_headers(event, "cloudEvents:"));
        // The content type travels as the `content_type` property, not as a header.
        let own = event.headers.iter().filter(|(n, _)| match &attributes {
            None => *n != CONTENT_TYPE_HEADER,
            Some(_) => !is_mapped_header(n),
        });
        for (name, value) in attributes.iter().flatten().map(|(n, v)| (n, v)).chain(own) {
            let name = short(&format_args!("header name `{name:.40}...`"), name)?;
            headers.insert(name, AMQPValue::LongString(value.as_str().into()));
        }
        for (name, value) in [
            ("event_id", message_id.as_str()),
            ("aggregate_type", event.aggregate_type.as_str()),
            ("aggregate_id", event.aggregate_id.as_str()),
            ("event_type", event.event_type.as_str()),
        ] {
            headers.insert(name.into(), AMQPValue::LongString(value.into()));
        }
        headers.insert(
            "created_at".into(),
            AMQPValue::LongString(
                event
                    .created_at
                    .to_rfc3339_opts(SecondsFormat::Micros, true)
                    .into(),
            ),
        );
        let properties = BasicProperties::default()
            .with_message_id(message_id.as_str().into())
            .with_type(short(&"event_type", &event.event_type)?)
            .with_timestamp(u64::try_from(event.created_at.timestamp()).unwrap_or(0))
            .with_content_type(short(&"content type", event.content_type())?)
            .with_delivery_mode(PERSISTENT)
            .with_app_id("outbox-relay".into())
            .with_headers(headers);
        Ok(Prepared {
            index,
            routing_key: key,
            properties,
            message_id,
        })
    }

    /// Write every message, then await every confirm. Messages are written in batch order on
    /// one channel, so RabbitMQ routes them in that order.
    async fn send_all(
        &self,
        channel: &Channel,
        batch: &[OutboxEvent],
        items: &[&Prepared],
    ) -> (Vec<Answer>, HashMap<String, BasicReturnMessage>) {
        let options = BasicPublishOptions {
            mandatory: self.config.mandatory,
            immediate: false,
        };
        let exchange = ShortString::from(self.config.exchange.as_str());
        let mut confirms = Vec::with_capacity(items.len());
        let mut write_error = None;
        for item in items {
            let sent = channel
                .basic_publish(
                    exchange.clone(),
                    item.routing_key.clone(),
                    options,
                    batch[item.index].payload_bytes(),
                    item.properties.clone(),
                )
                .await;
            match sent {
                Ok(confirm) => confirms.push(confirm),
                Err(e) => {
                    // The channel or connection is gone; the confirms already pending tell why.
                    write_error = Some(e);
                    break;
                }
            }
        }
        let mut answers = Vec::with_capacity(items.len());
        let mut returned = HashMap::new();
        for confirm in confirms {
            let answer = match confirm.await {
                Ok(Confirmation::Ack(message)) => {
                    note_returned(&mut returned, message);
                    Answer::Ack
                }
                Ok(Confirmation::Nack(message)) => {
                    note_returned(&mut returned, message);
                    Answer::Nack
                }
                Ok(Confirmation::NotRequested) => {
                    Answer::Failed(lapin::Error::from(lapin::ErrorKind::InvalidChannelState(
                        lapin::ChannelState::Error,
                        "channel is not in confirm mode",
                    )))
                }
                Err(e) => Answer::Failed(e),
            };
            answers.push(answer);
        }
        if let Some(e) = write_error {
            while answers.len() < items.len() {
                answers.push(Answer::Failed(e.clone()));
            }
        }
        (answers, returned)
    }

    /// The outcome of a message the broker answered (not `Answer::Failed`).
    fn outcome(
        &self,
        item: &Prepared,
        answer: &Answer,
        returned: &HashMap<String, BasicReturnMessage>,
    ) -> Outcome {
        let routing_key = item.routing_key.as_str();
        if let Some(message) = returned.get(&item.message_id) {
            let retry = self.config.unroutable == UnroutablePolicy::Retry;
            let error = classify::returned(
                message.reply_code,
                message.reply_text.as_str(),
                &self.exchange_display,
                routing_key,
                retry,
            );
            debug!(routing_key, error = %error, "message returned by RabbitMQ");
            return Outcome::from_error(error);
        }
        match answer {
            Answer::Ack => Outcome::Published,
            Answer::Nack => Outcome::Retry(classify::nacked(&self.exchange_display, routing_key)),
            Answer::Failed(e) => Outcome::from_error(classify::classify(e.clone())),
        }
    }

    /// Publish `items` on the link in `slot`; one outcome per item, or `Err` when no message
    /// got an answer before the call broke off (see [`broken_off`]).
    async fn publish_on(
        &self,
        slot: &mut Option<Link>,
        batch: &[OutboxEvent],
        items: &[Prepared],
    ) -> Result<Vec<Outcome>> {
        let what = publishing(items.len());
        let link = self.ensure_link(slot).await?;
        let all: Vec<&Prepared> = items.iter().collect();
        let (answers, returned) = self.send_all(&link.channel, batch, &all).await;
        let mut outcomes: Vec<Option<Outcome>> = Vec::with_capacity(items.len());
        let mut failure: Option<lapin::Error> = None;
        for (item, answer) in items.iter().zip(&answers) {
            match answer {
                Answer::Failed(e) => {
                    failure.get_or_insert_with(|| e.clone());
                    outcomes.push(None);
                }
                answered => outcomes.push(Some(self.outcome(item, answered, &returned))),
            }
        }
        let Some(failure) = failure else {
            return Ok(outcomes.into_iter().flatten().collect());
        };
        if let Err(error) = self.after_failure(slot, &failure, &what) {
            return broken_off(outcomes, error);
        }

        // One message closed the channel (too large, bad property...): the messages without a
        // confirm go again one at a time, so that exactly the faulty one gets the error.
        warn!(
            host = %self.host_port,
            error = %classify::classify(failure.clone()),
            unconfirmed = outcomes.iter().filter(|o| o.is_none()).count(),
            "RabbitMQ closed the channel because of a message; sending the unconfirmed messages one at a time"
        );
        for (k, item) in items.iter().enumerate() {
            if outcomes[k].is_some() {
                continue;
            }
            let link = match self.ensure_link(slot).await {
                Ok(link) => link,
                Err(error) => return broken_off(outcomes, error),
            };
            let (answers, returned) = self.send_all(&link.channel, batch, &[item]).await;
            match answers.into_iter().next() {
                Some(Answer::Failed(e)) => {
                    if let Err(error) = self.after_failure(slot, &e, "publishing a message") {
                        return broken_off(outcomes, error);
                    }
                    let error = classify::classify(e).context(format!(
                        "RabbitMQ refused the message for routing key `{}`",
                        item.routing_key
                    ));
                    outcomes[k] = Some(Outcome::from_error(error));
                }
                Some(answer) => outcomes[k] = Some(self.outcome(item, &answer, &returned)),
                None => {
                    return Err(Error::new(
                        ErrorKind::Other,
                        "a message got no answer from the RabbitMQ client",
                    ))
                }
            }
        }
        Ok(outcomes.into_iter().flatten().collect())
    }

    /// After a message got no confirm because of `e`: `Err` when the sink cannot tell which
    /// message is at fault — the connection broke, or the broker closed the channel for a
    /// reason that is not the message's (access refused, the exchange missing...), so every
    /// unconfirmed message would meet it alike; `Ok` when only that message is at fault (its
    /// neighbours are then sent again one at a time), also when the connection went after the
    /// message's refusal. Marks what must be rebuilt before the next use.
    fn after_failure(&self, slot: &mut Option<Link>, e: &lapin::Error, what: &str) -> Result<()> {
        let connection_alive = slot
            .as_ref()
            .is_some_and(|link| link.connection.status().connected());
        let scope = classify::scope(e);
        if scope == Scope::Connection || !connection_alive {
            if slot.take().is_some() {
                info!(host = %self.host_port, "dropped the RabbitMQ connection; the next call reconnects");
            }
            // The broker closed the channel because of a message, and the connection went
            // with it (frames of the next messages, already sent on the closed channel, make
            // RabbitMQ close the connection): the faulty message is still known, so its
            // neighbours go again one at a time, on a new connection.
            if scope == Scope::Message {
                return Ok(());
            }
            return Err(self.call_error(e.clone(), what));
        }
        if let Some(link) = slot.as_mut() {
            link.channel_broken = true;
        }
        match scope {
            Scope::Message => Ok(()),
            _ => Err(self.call_error(e.clone(), what)),
        }
    }

    /// The error of a call that did not finish within `confirm_timeout`.
    fn confirm_timeout_error(&self, blocked: bool, count: usize) -> Error {
        if blocked {
            return Error::new(
                ErrorKind::Unavailable,
                format!(
                    "{} to RabbitMQ at {}: the broker blocks publishers (connection.blocked: a \
                     memory or disk alarm); nothing confirmed within {} \
                     ({CONFIG_SECTION}.confirm_timeout)",
                    publishing(count),
                    self.host_port,
                    humanize(self.config.confirm_timeout)
                ),
            );
        }
        Error::new(
            ErrorKind::Timeout,
            format!(
                "{} to RabbitMQ at {}: not every publisher confirm arrived within {} \
                 ({CONFIG_SECTION}.confirm_timeout)",
                publishing(count),
                self.host_port,
                humanize(self.config.confirm_timeout)
            ),
        )
    }

    /// Check that the configured exchange exists (passive declare, on a channel of its own:
    /// a failed passive declare closes the channel).
    /// `call`, or a timeout error saying `what` got no answer within `confirm_timeout`.
    async fn answered(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        match tokio::time::timeout(self.config.confirm_timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what} on RabbitMQ at {}: no answer within {} \
                     ({CONFIG_SECTION}.confirm_timeout)",
                    self.host_port,
                    humanize(self.config.confirm_timeout)
                ),
            )),
        }
    }

    /// That `queue` exists (a passive declare), for a fixed routing key on the default
    /// exchange.
    async fn check_queue(&self, connection: &Connection, queue: &str) -> Result<()> {
        let at = format!("on RabbitMQ at {}", self.host_port);
        let channel = self.check_channel(connection).await?;
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let declared = channel
            .queue_declare(queue.into(), options, FieldTable::default())
            .await;
        let Err(e) = declared else {
            let _ = channel.close(200, "OK".into()).await;
            return Ok(());
        };
        let e = classify::classify(e);
        if e.kind() != ErrorKind::Unroutable {
            return Err(e.context(format!("checking queue `{queue}` {at}")));
        }
        Err(Error::new(
            ErrorKind::Unroutable,
            format!(
                "queue `{queue}` does not exist {at} vhost `{}`: the default exchange \
                 ({CONFIG_SECTION}.exchange = \"\") routes by queue name and \
                 {CONFIG_SECTION}.routing_key names this queue: declare it, or fix the key \
                 ({})",
                self.vhost(),
                e.full_message()
            ),
        ))
    }

    /// A channel of its own for a check (a refusal closes it).
    async fn check_channel(&self, connection: &Connection) -> Result<Channel> {
        connection.create_channel().await.map_err(|e| {
            classify::classify(e).context(format!(
                "opening a channel on RabbitMQ at {}",
                self.host_port
            ))
        })
    }

    async fn check_exchange(&self, connection: &Connection) -> Result<()> {
        let channel = self.check_channel(connection).await?;
        let options = ExchangeDeclareOptions {
            passive: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = channel
            .exchange_declare(
                self.config.exchange.as_str().into(),
                self.config.exchange_kind(),
                options,
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = channel.close(200, "OK".into()).await;
                Ok(())
            }
            Err(e) => Err(self.call_error(e, "checking the exchange")),
        }
    }
}

/// The outcomes of a call that broke off with `error` before every message was answered: the
/// messages the broker answered (acknowledged, returned, nacked) keep their outcome; the
/// others, whose fate is unknown, are to be sent again with `error`. `Err(error)` when no
/// message was answered — nothing is known per message. (Whether the call failed as a whole
/// is then the engine's decision, from the outcomes' kinds.)
fn broken_off(outcomes: Vec<Option<Outcome>>, error: Error) -> Result<Vec<Outcome>> {
    if outcomes.iter().all(Option::is_none) {
        return Err(error);
    }
    Ok(outcomes
        .into_iter()
        .map(|o| o.unwrap_or_else(|| Outcome::Retry(error.clone())))
        .collect())
}

fn note_returned(
    returned: &mut HashMap<String, BasicReturnMessage>,
    message: Option<BasicReturnMessage>,
) {
    // lapin hands a `basic.return` to whichever confirm completes next, which with `multiple`
    // acks need not be the returned message's own: match it to its event by message id.
    if let Some(message) = message {
        match message.delivery.properties.message_id() {
            Some(id) => {
                returned.insert(id.to_string(), message);
            }
            None => debug!(
                routing_key = %message.delivery.routing_key,
                "RabbitMQ returned a message without message id; not one of this sink's"
            ),
        }
    }
}

#[async_trait]
impl Sink for RabbitMqSink {
    fn kind(&self) -> &'static str {
        Self::KIND
    }

    fn capabilities(&self) -> SinkCapabilities {
        SinkCapabilities {
            max_batch_len: self.config.max_batch_len,
            max_payload_bytes: Some(self.config.max_message_bytes),
            // A returned or nacked message may be followed by an acked one for the same key:
            // the engine must send at most one event per aggregate per call.
            ordered_per_key: false,
        }
    }

    fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    async fn check(&self) -> Result<()> {
        let mut slot = self.link.lock().await;
        let link = self.ensure_link(&mut slot).await?;
        if !self.config.exchange.is_empty() {
            if self.config.declare_exchange {
                return Ok(());
            }
            let what = format!("checking exchange {}", self.exchange_display);
            return self
                .answered(&what, self.check_exchange(&link.connection))
                .await;
        }
        // The default exchange routes by queue name: a fixed routing key names the one queue
        // every event goes to. Without `mandatory` a message nothing takes is dropped, which
        // the configuration then accepts.
        match self.template.fixed().filter(|_| self.config.mandatory) {
            Some(queue) => {
                let what = format!("checking queue `{queue}`");
                self.answered(&what, self.check_queue(&link.connection, queue))
                    .await
            }
            None => Ok(()),
        }
    }

    async fn publish(&self, batch: &[OutboxEvent]) -> Result<Vec<Outcome>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        let mut items = Vec::with_capacity(batch.len());
        for (index, event) in batch.iter().enumerate() {
            if event.payload.len() > self.config.max_message_bytes {
                outcomes[index] = Some(Outcome::Reject(Error::new(
                    ErrorKind::MessageTooLarge,
                    format!(
                        "payload of {} bytes is larger than {CONFIG_SECTION}.max_message_bytes ({})",
                        event.payload.len(),
                        self.config.max_message_bytes
                    ),
                )));
                continue;
            }
            match self.prepare(index, event) {
                Ok(item) => items.push(item),
                Err(error) => {
                    outcomes[index] = Some(Outcome::Reject(error.context(format!(
                        "event {} cannot be sent to RabbitMQ",
                        event.event_id
                    ))))
                }
            }
        }
        if !items.is_empty() {
            let mut slot = self.link.lock().await;
            let sent = tokio::time::timeout(
                self.config.confirm_timeout,
                self.publish_on(&mut slot, batch, &items),
            )
            .await;
            let per_item = match sent {
                Ok(result) => result?,
                Err(_) => {
                    let blocked = slot
                        .as_ref()
                        .is_some_and(|link| link.connection.status().blocked());
                    // Confirms may still be in flight on this channel: start afresh.
                    if slot.take().is_some() {
                        info!(host = %self.host_port, "dropped the RabbitMQ connection after a confirm timeout; the next call reconnects");
                    }
                    return Err(self.confirm_timeout_error(blocked, items.len()));
                }
            };
            if per_item.len() != items.len() {
                return Err(Error::new(
                    ErrorKind::Other,
                    format!(
                        "{} answers for {} messages from the RabbitMQ client",
                        per_item.len(),
                        items.len()
                    ),
                ));
            }
            for (item, outcome) in items.iter().zip(per_item) {
                outcomes[item.index] = Some(outcome);
            }
        }
        outcomes
            .into_iter()
            .map(|o| {
                o.ok_or_else(|| {
                    Error::new(ErrorKind::Other, "an event of the batch got no outcome")
                })
            })
            .collect()
    }
}

/// What a call does, for its errors: "publishing 1 message", "publishing 3 messages".
fn publishing(count: usize) -> String {
    match count {
        1 => "publishing 1 message".to_owned(),
        n => format!("publishing {n} messages"),
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
    fn one_message_is_not_called_messages() {
        assert_eq!(publishing(1), "publishing 1 message");
        assert_eq!(publishing(0), "publishing 0 messages");
        assert_eq!(publishing(2), "publishing 2 messages");
    }

    #[test]
    fn a_call_broken_off_before_any_answer_is_an_err() {
        let error = Error::new(ErrorKind::Connection, "connection reset");
        let e = broken_off(vec![None, None], error).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Connection);
    }

    #[test]
    fn a_call_broken_off_keeps_the_answers_it_got() {
        let error = Error::new(ErrorKind::Connection, "connection reset");
        let nacked = Outcome::Retry(classify::nacked("`events`", "order.Placed"));
        let out = broken_off(vec![Some(Outcome::Published), Some(nacked), None], error).unwrap();
        assert!(out[0].is_published());
        assert!(matches!(&out[1], Outcome::Retry(e) if e.kind() == ErrorKind::Unavailable));
        assert!(matches!(&out[2], Outcome::Retry(e) if e.kind() == ErrorKind::Connection));
        // Something went through: the unconfirmed message is retried on its own.
        assert!(whole_call_failure(&out).is_none());

        // Refused access after an acknowledged message: the engine fails the call, keeping
        // the acknowledged one.
        let refused = Error::new(ErrorKind::Unauthorized, "403 ACCESS_REFUSED").permanent();
        let out = broken_off(vec![Some(Outcome::Published), None], refused).unwrap();
        assert!(out[0].is_published());
        let e = whole_call_failure(&out).expect("the engine fails the call");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
    }
}
