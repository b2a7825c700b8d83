//! The driver-error table: every `lapin::Error` (and every negative broker answer) becomes an
//! [`outboxkit_core::Error`] with a kind and a retryability, and a [`Scope`] saying how much of
//! the sink it takes down — decided here once. The engine never looks at AMQP messages.
//!
//! | lapin error / broker answer | kind | retryable | scope |
//! |---|---|---|---|
//! | I/O: refused, reset, broken pipe, EOF, DNS | `Connection` | yes | connection |
//! | I/O timed out, no heartbeat from the broker | `Timeout` | yes | connection |
//! | connection or channel not open (closed, closing, errored), runtime shutting down | `Connection` | yes | connection |
//! | frame parsing failed | `Connection` | yes | connection |
//! | `320 CONNECTION_FORCED` (broker stopping, connection closed by an operator) | `Connection` | yes | connection |
//! | `506 RESOURCE_ERROR`, `541 INTERNAL_ERROR`, channel limit reached | `Unavailable` | yes | connection |
//! | `501`–`505`, `540` (protocol errors) | `Other` | yes | connection |
//! | `403 ACCESS_REFUSED` (login refused, no permission on the exchange), `530 NOT_ALLOWED` (vhost), auth provider | `Unauthorized` | no | call |
//! | `402 INVALID_PATH`, unsupported protocol version | `Config` | no | call |
//! | `404 NOT_FOUND` (the exchange does not exist) | `Unroutable` | no | call |
//! | `405 RESOURCE_LOCKED` | `Unavailable` | yes | call |
//! | `406 PRECONDITION_FAILED` (message larger than `max_message_size`, bad property) | `InvalidMessage` | no | message |
//! | `311 CONTENT_TOO_LARGE` | `MessageTooLarge` | no | message |
//! | `312 NO_ROUTE`, `313 NO_CONSUMERS` on a channel | `Unroutable` | no | message |
//! | frame serialisation failed | `InvalidMessage` | no | message |
//! | `basic.return` (mandatory message no queue took) | `Unroutable` | per `unroutable` | message |
//! | `basic.nack` (the broker could not take the message) | `Unavailable` | yes | message |
//! | anything else | `Other` | yes | connection |
//!
//! Scope says what the sink can still tell per message once a message got no confirm:
//! **connection** — the connection is unusable, the unanswered messages' fates are unknown; the
//! next call reconnects; **call** — the broker closed the channel for a reason that is not the
//! message's (access refused, the exchange missing, a lock), which every unanswered message
//! would meet alike; **message** — one message is at fault: it gets its own outcome and the
//! unanswered rest go again one at a time. With **connection** and **call**, the messages the
//! broker answered keep their outcome and the unanswered ones get the error, or the call
//! returns `Err` when no message was answered at all.
//!
//! Whether a call failed as a whole (nothing dead-lettered, no attempt counted) is the
//! engine's decision, from the outcomes' kinds: [`outboxkit_core::whole_call_failure`].

use std::io;

use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use outboxkit_core::{Error, ErrorKind};

/// How much of the sink an error takes down: what the sink can still tell per message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The connection is gone: the unanswered messages' fates are unknown; reconnect on the
    /// next call.
    Connection,
    /// The broker closed the channel for a reason that is not the message's: every unanswered
    /// message would meet it alike (they are not sent again one at a time).
    Call,
    /// One message is at fault: give it its own outcome (the unanswered rest go again one at
    /// a time).
    Message,
}

/// The relay error kind and scope of a lapin error.
pub fn kind_and_scope(err: &lapin::Error) -> (ErrorKind, Scope) {
    use lapin::ErrorKind as L;
    match err.kind() {
        L::IOError(e) | L::RuntimeShutdownError(e) => match e.kind() {
            io::ErrorKind::TimedOut => (ErrorKind::Timeout, Scope::Connection),
            _ => (ErrorKind::Connection, Scope::Connection),
        },
        L::MissingHeartbeatError => (ErrorKind::Timeout, Scope::Connection),
        L::InvalidConnectionState(_) | L::InvalidChannel(_) | L::InvalidChannelState(..) => {
            (ErrorKind::Connection, Scope::Connection)
        }
        L::ParsingError(_) => (ErrorKind::Connection, Scope::Connection),
        L::ChannelsLimitReached => (ErrorKind::Unavailable, Scope::Connection),
        L::InvalidProtocolVersion(_) => (ErrorKind::Config, Scope::Call),
        L::AuthProviderError(_) => (ErrorKind::Unauthorized, Scope::Call),
        L::SerialisationError(_) => (ErrorKind::InvalidMessage, Scope::Message),
        L::ProtocolError(amqp) => match amqp.kind() {
            AMQPErrorKind::Soft(soft) => match soft {
                AMQPSoftError::ACCESSREFUSED => (ErrorKind::Unauthorized, Scope::Call),
                AMQPSoftError::NOTFOUND => (ErrorKind::Unroutable, Scope::Call),
                AMQPSoftError::RESOURCELOCKED => (ErrorKind::Unavailable, Scope::Call),
                AMQPSoftError::PRECONDITIONFAILED => (ErrorKind::InvalidMessage, Scope::Message),
                AMQPSoftError::CONTENTTOOLARGE => (ErrorKind::MessageTooLarge, Scope::Message),
                AMQPSoftError::NOROUTE | AMQPSoftError::NOCONSUMERS => {
                    (ErrorKind::Unroutable, Scope::Message)
                }
            },
            AMQPErrorKind::Hard(hard) => match hard {
                AMQPHardError::CONNECTIONFORCED => (ErrorKind::Connection, Scope::Connection),
                AMQPHardError::RESOURCEERROR | AMQPHardError::INTERNALERROR => {
                    (ErrorKind::Unavailable, Scope::Connection)
                }
                AMQPHardError::NOTALLOWED => (ErrorKind::Unauthorized, Scope::Call),
                AMQPHardError::INVALIDPATH => (ErrorKind::Config, Scope::Call),
                AMQPHardError::FRAMEERROR
                | AMQPHardError::SYNTAXERROR
                | AMQPHardError::COMMANDINVALID
                | AMQPHardError::CHANNELERROR
                | AMQPHardError::UNEXPECTEDFRAME
                | AMQPHardError::NOTIMPLEMENTED => (ErrorKind::Other, Scope::Connection),
            },
        },
        _ => (ErrorKind::Other, Scope::Connection),
    }
}

/// The relay error kind of a lapin error.
pub fn error_kind(err: &lapin::Error) -> ErrorKind {
    kind_and_scope(err).0
}

/// The scope of a lapin error.
pub fn scope(err: &lapin::Error) -> Scope {
    kind_and_scope(err).1
}

/// Turn a lapin error into the relay's error: kind and retryability from [`kind_and_scope`],
/// the broker's reply (`NOT_FOUND - no exchange 'orders' in vhost '/'`) or the driver's
/// message as text.
pub fn classify(err: lapin::Error) -> Error {
    let kind = error_kind(&err);
    match err.kind() {
        // A broker reply: its code and text are the whole story, as RabbitMQ wrote them.
        lapin::ErrorKind::ProtocolError(amqp) => Error::new(
            kind,
            format!("{} {}", amqp.get_id(), amqp.get_message().as_str()),
        ),
        _ => Error::new(kind, err.to_string()).with_source(err),
    }
}

/// The error of a message RabbitMQ returned (`basic.return`): no queue took it. `retry`
/// decides its retryability (`sink.rabbitmq.unroutable`).
pub fn returned(
    reply_code: u16,
    reply_text: &str,
    exchange: &str,
    routing_key: &str,
    retry: bool,
) -> Error {
    let error = Error::new(
        ErrorKind::Unroutable,
        format!(
            "RabbitMQ returned the message as unroutable ({reply_code} {reply_text}): no queue \
             is bound to exchange {exchange} for routing key `{routing_key}`; bind a queue, \
             or fix the routing key (sink.rabbitmq.routing_key or the row's destination)"
        ),
    );
    if retry {
        error.temporary()
    } else {
        error.permanent()
    }
}

/// The error of a message RabbitMQ negatively acknowledged (`basic.nack`): the broker could not
/// take it (e.g. a queue at its `x-max-length` with `x-overflow = reject-publish`, an internal
/// error). Worth retrying.
pub fn nacked(exchange: &str, routing_key: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!(
            "RabbitMQ refused the message (basic.nack) on exchange {exchange} for routing key \
             `{routing_key}`: a queue is full (x-max-length with reject-publish) or the broker \
             failed to store it"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use lapin::protocol::AMQPError;
    use lapin::{ChannelState, ConnectionState};
    use outboxkit_core::testkit::sink_suite::{assert_classified, CONNECTION_IO_ERRORS};

    use super::*;

    fn amqp(id: u16, text: &str) -> lapin::Error {
        let error = AMQPError::from_id(id, text.into()).expect("a known AMQP reply code");
        lapin::ErrorKind::ProtocolError(error).into()
    }

    fn io(kind: io::ErrorKind) -> lapin::Error {
        io::Error::new(kind, "test").into()
    }

    fn check(err: lapin::Error, kind: ErrorKind, retryable: bool, scope: Scope) -> Error {
        assert_eq!(super::scope(&err), scope, "{err}");
        assert_classified(classify(err), kind, retryable)
    }

    #[test]
    fn io_errors_are_connection_errors() {
        for kind in CONNECTION_IO_ERRORS {
            check(io(kind), ErrorKind::Connection, true, Scope::Connection);
        }
        let e = check(
            io(io::ErrorKind::ConnectionRefused),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
        assert!(e.full_message().contains("test"), "{e}");
    }

    #[test]
    fn timeouts_and_missing_heartbeats_are_timeouts() {
        check(
            io(io::ErrorKind::TimedOut),
            ErrorKind::Timeout,
            true,
            Scope::Connection,
        );
        check(
            lapin::ErrorKind::MissingHeartbeatError.into(),
            ErrorKind::Timeout,
            true,
            Scope::Connection,
        );
    }

    #[test]
    fn closed_connections_and_channels_are_connection_errors() {
        for state in [
            ConnectionState::Closed,
            ConnectionState::Closing,
            ConnectionState::Error,
        ] {
            check(
                lapin::ErrorKind::InvalidConnectionState(state).into(),
                ErrorKind::Connection,
                true,
                Scope::Connection,
            );
        }
        check(
            lapin::ErrorKind::InvalidChannelState(ChannelState::Closed, "basic.publish").into(),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
        check(
            lapin::ErrorKind::InvalidChannel(7).into(),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
        check(
            lapin::ErrorKind::RuntimeShutdownError(Arc::new(io::Error::other("shutdown"))).into(),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
    }

    #[test]
    fn parsing_errors_break_the_connection() {
        let parse_error = lapin::types::parsing::parse_short_uint(&b""[..]).unwrap_err();
        check(
            lapin::ErrorKind::ParsingError(parse_error).into(),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
    }

    #[test]
    fn broker_shutdown_is_a_connection_error() {
        let e = check(
            amqp(
                320,
                "CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'",
            ),
            ErrorKind::Connection,
            true,
            Scope::Connection,
        );
        assert_eq!(
            e.full_message(),
            "320 CONNECTION_FORCED - broker forced connection closure with reason 'shutdown'"
        );
    }

    #[test]
    fn broker_resource_errors_are_unavailable() {
        check(
            amqp(506, "RESOURCE_ERROR"),
            ErrorKind::Unavailable,
            true,
            Scope::Connection,
        );
        check(
            amqp(541, "INTERNAL_ERROR"),
            ErrorKind::Unavailable,
            true,
            Scope::Connection,
        );
        check(
            lapin::ErrorKind::ChannelsLimitReached.into(),
            ErrorKind::Unavailable,
            true,
            Scope::Connection,
        );
        check(
            amqp(405, "RESOURCE_LOCKED - cannot obtain exclusive access"),
            ErrorKind::Unavailable,
            true,
            Scope::Call,
        );
    }

    #[test]
    fn protocol_errors_are_other() {
        for id in [501, 502, 503, 504, 505, 540] {
            check(
                amqp(id, "protocol"),
                ErrorKind::Other,
                true,
                Scope::Connection,
            );
        }
        check(
            lapin::ErrorKind::FutureCompleted.into(),
            ErrorKind::Other,
            true,
            Scope::Connection,
        );
    }

    #[test]
    fn refused_credentials_and_permissions_are_unauthorized() {
        check(
            amqp(
                403,
                "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN",
            ),
            ErrorKind::Unauthorized,
            false,
            Scope::Call,
        );
        check(
            amqp(
                530,
                "NOT_ALLOWED - access to vhost 'prod' refused for user 'relay'",
            ),
            ErrorKind::Unauthorized,
            false,
            Scope::Call,
        );
        check(
            lapin::ErrorKind::AuthProviderError("token expired".into()).into(),
            ErrorKind::Unauthorized,
            false,
            Scope::Call,
        );
    }

    #[test]
    fn bad_paths_and_versions_are_config_errors() {
        check(
            amqp(402, "INVALID_PATH"),
            ErrorKind::Config,
            false,
            Scope::Call,
        );
        let version = lapin::ErrorKind::InvalidProtocolVersion(
            amq_protocol::frame::ProtocolVersion::amqp_0_9_1(),
        );
        check(version.into(), ErrorKind::Config, false, Scope::Call);
    }

    #[test]
    fn missing_exchange_fails_the_call() {
        let e = check(
            amqp(404, "NOT_FOUND - no exchange 'orders' in vhost '/'"),
            ErrorKind::Unroutable,
            false,
            Scope::Call,
        );
        assert!(e.message().contains("no exchange 'orders'"), "{e}");
    }

    #[test]
    fn message_faults_concern_one_message() {
        check(
            amqp(
                406,
                "PRECONDITION_FAILED - message size 200000 is larger than configured max size 131072",
            ),
            ErrorKind::InvalidMessage,
            false,
            Scope::Message,
        );
        check(
            amqp(311, "CONTENT_TOO_LARGE"),
            ErrorKind::MessageTooLarge,
            false,
            Scope::Message,
        );
        check(
            amqp(312, "NO_ROUTE"),
            ErrorKind::Unroutable,
            false,
            Scope::Message,
        );
        check(
            amqp(313, "NO_CONSUMERS"),
            ErrorKind::Unroutable,
            false,
            Scope::Message,
        );
        let gen = lapin::types::generation::GenError::InvalidOffset;
        check(
            lapin::ErrorKind::SerialisationError(Arc::new(gen)).into(),
            ErrorKind::InvalidMessage,
            false,
            Scope::Message,
        );
    }

    #[test]
    fn returned_messages_follow_the_unroutable_policy() {
        let retry = returned(312, "NO_ROUTE", "`events`", "order.Placed", true);
        assert_eq!(retry.kind(), ErrorKind::Unroutable);
        assert!(retry.is_retryable());
        assert!(
            retry
                .message()
                .contains("(312 NO_ROUTE): no queue is bound to exchange `events` for routing key `order.Placed`"),
            "{retry}"
        );
        let reject = returned(312, "NO_ROUTE", "`events`", "order.Placed", false);
        assert_eq!(reject.kind(), ErrorKind::Unroutable);
        assert!(!reject.is_retryable());
    }

    #[test]
    fn nacks_are_retried() {
        let e = nacked("`events`", "order.Placed");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(e.message().contains("basic.nack"), "{e}");
    }
}
