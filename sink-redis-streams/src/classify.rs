//! The driver-error table: every `redis::RedisError` becomes an [`outboxkit_core::Error`] with a
//! kind and a retryability, decided here once. The engine never looks at Redis messages.
//!
//! | Redis error | kind | retryable |
//! |---|---|---|
//! | I/O: refused, reset, broken pipe, EOF, DNS | `Connection` | yes |
//! | I/O timed out, tokio timeout | `Timeout` | yes |
//! | `LOADING`, `BUSY`, `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `READONLY`, `OOM` | `Unavailable` | yes |
//! | `NOAUTH`, `WRONGPASS`, `NOPERM`, authentication failed | `Unauthorized` | no |
//! | `WRONGTYPE` | `InvalidMessage` | no |
//! | invalid client configuration, RESP3 not supported | `Config` | no |
//! | `ERR ...`, parse / unexpected reply, anything else | `Other` | yes |
//!
//! An error reply to one `XADD` of a pipeline becomes that event's outcome. Whether the call
//! failed as a whole (`Unauthorized`, `Config`; or `Connection`, `Timeout`, `Unavailable` on
//! every event) is the engine's decision, from these kinds:
//! [`outboxkit_core::whole_call_failure`]. A pipeline that gets no replies at all (connection
//! refused or dropped, no answer within `response_timeout`) fails the call with `Err`.

use outboxkit_core::{Error, ErrorKind};
use redis::{RedisError, ServerErrorKind};

/// The relay error kind of a Redis error.
pub fn error_kind(err: &RedisError) -> ErrorKind {
    use redis::ErrorKind as R;
    match err.kind() {
        R::Io => {
            if err.is_timeout() {
                ErrorKind::Timeout
            } else {
                ErrorKind::Connection
            }
        }
        R::AuthenticationFailed => ErrorKind::Unauthorized,
        R::Server(kind) => match kind {
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly => ErrorKind::Unavailable,
            ServerErrorKind::NoPerm => ErrorKind::Unauthorized,
            _ => ErrorKind::Other,
        },
        // Error replies the driver does not know by name: match the reply's code (the first
        // word of the protocol error line), never its human text.
        R::Extension => match err.code() {
            Some("OOM" | "BUSY") => ErrorKind::Unavailable,
            Some("NOAUTH" | "WRONGPASS") => ErrorKind::Unauthorized,
            Some("WRONGTYPE") => ErrorKind::InvalidMessage,
            _ => ErrorKind::Other,
        },
        R::InvalidClientConfig | R::RESP3NotSupported => ErrorKind::Config,
        R::ClusterConnectionNotFound
        | R::MasterNameNotFoundBySentinel
        | R::NoValidReplicasFoundBySentinel => ErrorKind::Connection,
        _ => ErrorKind::Other,
    }
}

/// Turn a Redis error into the relay's error: kind and retryability from [`error_kind`], the
/// Redis reply (`WRONGTYPE Operation against a key ...`) or driver message as text.
pub fn classify(err: RedisError) -> Error {
    let kind = error_kind(&err);
    match err.code() {
        // A server reply: its code and detail are the whole story, as Redis printed them.
        Some(code) => {
            let message = match err.detail() {
                Some(detail) => format!("{code} {detail}"),
                None => code.to_owned(),
            };
            Error::new(kind, message)
        }
        None => Error::new(kind, err.to_string()).with_source(err),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use outboxkit_core::testkit::sink_suite::{assert_classified, CONNECTION_IO_ERRORS};

    use super::*;

    /// A server error reply as it arrives on the wire, e.g. `-WRONGTYPE Operation ...`.
    fn reply(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap() {
            redis::Value::ServerError(e) => e.into(),
            other => panic!("not an error reply: {other:?}"),
        }
    }

    fn io(kind: io::ErrorKind) -> RedisError {
        io::Error::new(kind, "test").into()
    }

    fn check(err: RedisError, kind: ErrorKind, retryable: bool) -> Error {
        assert_classified(classify(err), kind, retryable)
    }

    #[test]
    fn io_errors_are_connection_errors() {
        for kind in CONNECTION_IO_ERRORS {
            check(io(kind), ErrorKind::Connection, true);
        }
    }

    #[test]
    fn dropped_connection_is_a_connection_error() {
        let dropped: RedisError = (redis::ErrorKind::Io, "Connection dropped").into();
        assert!(dropped.is_connection_dropped());
        check(dropped, ErrorKind::Connection, true);
    }

    #[test]
    fn timeouts_are_timeouts() {
        check(io(io::ErrorKind::TimedOut), ErrorKind::Timeout, true);
    }

    #[test]
    fn busy_server_replies_are_unavailable() {
        for line in [
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script",
            "TRYAGAIN Multiple keys request during rehashing of slot",
            "CLUSTERDOWN The cluster is down",
            "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'",
            "READONLY You can't write against a read only replica.",
            "OOM command not allowed when used memory > 'maxmemory'.",
        ] {
            check(reply(line), ErrorKind::Unavailable, true);
        }
    }

    #[test]
    fn refused_credentials_are_unauthorized() {
        for line in [
            "NOAUTH Authentication required.",
            "WRONGPASS invalid username-password pair or user is disabled.",
            "NOPERM User relay has no permissions to run the 'xadd' command",
        ] {
            check(reply(line), ErrorKind::Unauthorized, false);
        }
        let failed: RedisError = (
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into();
        check(failed, ErrorKind::Unauthorized, false);
    }

    #[test]
    fn wrongtype_rejects_the_message() {
        let e = check(
            reply("WRONGTYPE Operation against a key holding the wrong kind of value"),
            ErrorKind::InvalidMessage,
            false,
        );
        assert_eq!(
            e.full_message(),
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        );
    }

    #[test]
    fn response_and_parse_errors_are_other() {
        check(
            reply("ERR wrong number of arguments for 'xadd' command"),
            ErrorKind::Other,
            true,
        );
        check(reply("NOSCRIPT No matching script"), ErrorKind::Other, true);
        check(
            reply("SOMETHINGNEW never seen before"),
            ErrorKind::Other,
            true,
        );
        let parse: RedisError = redis::ParsingError::from("invalid bulk string").into();
        check(parse, ErrorKind::Other, true);
        let unexpected: RedisError =
            (redis::ErrorKind::UnexpectedReturnType, "not a stream id").into();
        check(unexpected, ErrorKind::Other, true);
    }

    #[test]
    fn client_misconfiguration_is_a_config_error() {
        let invalid: RedisError = (
            redis::ErrorKind::InvalidClientConfig,
            "can't connect with TLS, the feature is not enabled",
        )
            .into();
        check(invalid, ErrorKind::Config, false);
    }
}
