//! The driver-error table: every `async-nats` error the sink meets becomes an
//! [`outboxkit_core::Error`] with a kind and a retryability, decided here once.
//!
//! | NATS error | kind | retryable |
//! |---|---|---|
//! | publish: no responders (no stream captures the subject) | `Unroutable` | yes |
//! | JetStream: stream not found (10059), JetStream not enabled (10076, 10039) | `Config` | no |
//! | JetStream: message size exceeds maximum (10054, the stream's `max_msg_size`) | `MessageTooLarge` | no |
//! | JetStream: storage/memory/resources exceeded, store failed (stream full with `discard = new`), cluster not available (10047, 10028, 10023, 10077, 10008), or status 503 | `Unavailable` | yes |
//! | publish: no `PubAck` within `request_timeout`; request timed out; connect timed out | `Timeout` | yes |
//! | publish: connection lost (broken pipe); connect: refused, DNS, I/O | `Connection` | yes |
//! | publish: too many acks pending in the client | `Unavailable` | yes |
//! | connect: authentication / authorization violation | `Unauthorized` | no |
//! | connect: TLS failure, unparsable server address | `Config` | no |
//! | anything else (other JetStream codes, unreadable `PubAck`) | `Other` | yes |
//!
//! A message larger than the server's `max_payload` is never sent (the server would close the
//! connection): the sink rejects it itself as `MessageTooLarge`, naming the server's limit.
//! Whether a call failed as a whole (`Config`, `Unauthorized`; or `Connection`, `Timeout`,
//! `Unavailable` on every event) is the engine's decision:
//! [`outboxkit_core::whole_call_failure`].

use std::error::Error as StdError;

use async_nats::jetstream::context::{
    CreateStreamError, CreateStreamErrorKind, GetStreamByNameError, GetStreamByNameErrorKind,
    PublishError, PublishErrorKind, RequestError, RequestErrorKind,
};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{ConnectError, ConnectErrorKind};
use outboxkit_core::error::{find_source, source_chain as chain};
use outboxkit_core::{Error, ErrorKind};

use crate::config::CONFIG_SECTION;

fn error(kind: ErrorKind, retryable: bool, message: impl Into<String>) -> Error {
    let error = Error::new(kind, message);
    if retryable {
        error.temporary()
    } else {
        error.permanent()
    }
}

/// Kind and retryability of a JetStream API error (a `PubAck` or an API answer with `error`).
pub fn jetstream_kind(err: &jetstream::Error) -> (ErrorKind, bool) {
    const STREAM_FULL: [ErrorCode; 5] = [
        ErrorCode::STORAGE_RESOURCES_EXCEEDED,
        ErrorCode::MEMORY_RESOURCES_EXCEEDED,
        ErrorCode::INSUFFICIENT_RESOURCES,
        ErrorCode::STREAM_STORE_FAILED,
        ErrorCode::CLUSTER_NOT_AVAILABLE,
    ];
    let code = err.error_code();
    if code == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM {
        (ErrorKind::MessageTooLarge, false)
    } else if code == ErrorCode::STREAM_NOT_FOUND
        || code == ErrorCode::JETSTREAM_NOT_ENABLED
        || code == ErrorCode::JETSTREAM_NOT_ENABLED_FOR_ACCOUNT
    {
        (ErrorKind::Config, false)
    } else if STREAM_FULL.contains(&code) || err.code() == 503 {
        (ErrorKind::Unavailable, true)
    } else {
        (ErrorKind::Other, true)
    }
}

/// The error of one event's publish (sending it, or its `PubAck`) to `subject`.
pub fn classify_publish(err: &PublishError, subject: &str) -> Error {
    match err.kind() {
        // About this subject only (a row's destination, another `{aggregate_type}`): the
        // event's aggregate waits, the others flow, as for a missing topic or queue.
        PublishErrorKind::StreamNotFound => error(
            ErrorKind::Unroutable,
            true,
            format!(
                "no stream for subject `{subject}` (no responders): create a JetStream stream \
                 capturing it, or declare one in [{CONFIG_SECTION}.declare_stream]; the event \
                 is retried"
            ),
        ),
        PublishErrorKind::TimedOut => error(
            ErrorKind::Timeout,
            true,
            format!("no PubAck for subject `{subject}` in time ({CONFIG_SECTION}.request_timeout)"),
        ),
        PublishErrorKind::BrokenPipe => error(
            ErrorKind::Connection,
            true,
            format!("the connection was lost before the PubAck for subject `{subject}`"),
        ),
        PublishErrorKind::MaxAckPending => error(
            ErrorKind::Unavailable,
            true,
            format!("too many PubAcks pending in the client for subject `{subject}`"),
        ),
        _ => match err
            .source()
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
        {
            Some(js) => {
                let (kind, retryable) = jetstream_kind(js);
                error(kind, retryable, format!("subject `{subject}`: {js}"))
            }
            None => error(
                ErrorKind::Other,
                true,
                format!("publishing to subject `{subject}`: {err}"),
            ),
        },
    }
}

/// The error of a failed connection to `servers` (already redacted); `ca_file` is
/// `tls.ca_file`, named when the server's certificate is not trusted.
pub fn classify_connect(
    err: &ConnectError,
    servers: &str,
    ca_file: Option<&std::path::Path>,
) -> Error {
    let at = format!("NATS at {servers} ({CONFIG_SECTION}.url)");
    if let Some(tls) = outboxkit_core::tls::rustls_error(err) {
        return outboxkit_core::tls::sink_certificate_error(
            tls,
            CONFIG_SECTION,
            &format!("NATS at {servers}"),
            ca_file,
        );
    }
    match err.kind() {
        ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => error(
            ErrorKind::Unauthorized,
            false,
            format!(
                "{at} refused the credentials: {err} (check the URL's user and password, \
                 {CONFIG_SECTION}.token, {CONFIG_SECTION}.nkey or {CONFIG_SECTION}.credentials_file)"
            ),
        ),
        ConnectErrorKind::Tls => error(
            ErrorKind::Config,
            false,
            format!("TLS with {at} failed: {} (check {CONFIG_SECTION}.tls)", chain(err)),
        ),
        ConnectErrorKind::ServerParse => error(
            ErrorKind::Config,
            false,
            format!("{CONFIG_SECTION}.url: {err}"),
        ),
        ConnectErrorKind::TimedOut => error(
            ErrorKind::Timeout,
            true,
            format!("cannot reach {at}: no answer in time ({CONFIG_SECTION}.connect_timeout)"),
        ),
        _ => error(
            ErrorKind::Connection,
            true,
            format!("cannot reach {at}: {}", chain(err)),
        ),
    }
}

/// The error of a JetStream API request (`what`: "looking up the stream of `orders.*`").
pub fn classify_request(err: &RequestError, what: &str) -> Error {
    match err.kind() {
        RequestErrorKind::NoResponders => error(
            ErrorKind::Config,
            false,
            format!("{what}: JetStream does not answer (no responders): is JetStream enabled on the server (-js) and for this account?"),
        ),
        RequestErrorKind::TimedOut => error(
            ErrorKind::Timeout,
            true,
            format!("{what}: no answer in time ({CONFIG_SECTION}.request_timeout)"),
        ),
        RequestErrorKind::Other => error(ErrorKind::Connection, true, format!("{what}: {}", chain(err))),
    }
}

/// The error of looking up the stream that captures `subject` (a wildcard of the template).
pub fn classify_lookup(err: &GetStreamByNameError, subject: &str, template: &str) -> Error {
    let what = format!("looking up the stream of subject `{subject}`");
    match err.kind() {
        GetStreamByNameErrorKind::NotFound => error(
            ErrorKind::Config,
            false,
            format!(
                "no stream for subject `{subject}` ({CONFIG_SECTION}.subject = `{template}`): \
                 create a JetStream stream capturing it, or declare one in \
                 [{CONFIG_SECTION}.declare_stream]"
            ),
        ),
        GetStreamByNameErrorKind::JetStream(js) => {
            let (kind, retryable) = jetstream_kind(&js);
            error(kind, retryable, format!("{what}: {js}"))
        }
        GetStreamByNameErrorKind::InvalidSubject => error(
            ErrorKind::Config,
            false,
            format!("{CONFIG_SECTION}.subject: `{subject}` is not a valid subject"),
        ),
        GetStreamByNameErrorKind::Request => {
            match err.source().and_then(|s| find_source::<RequestError>(s)) {
                Some(request) => classify_request(request, &what),
                None => error(
                    ErrorKind::Connection,
                    true,
                    format!("{what}: {}", chain(err)),
                ),
            }
        }
    }
}

/// Whether the server refused a stream because another one has some of its subjects.
pub fn overlaps(err: &CreateStreamError) -> bool {
    matches!(err.kind(), CreateStreamErrorKind::JetStream(js)
        if js.error_code() == ErrorCode::STREAM_SUBJECT_OVERLAP)
}

/// The error of creating or updating the declared stream `name`.
pub fn classify_declare(err: &CreateStreamError, name: &str) -> Error {
    let what = format!("declaring stream `{name}` ({CONFIG_SECTION}.declare_stream)");
    match err.kind() {
        CreateStreamErrorKind::JetStream(js) => {
            let (kind, retryable) = jetstream_kind(&js);
            // The server refused the settings (subjects overlapping another stream's...).
            let (kind, retryable) = match kind {
                ErrorKind::Other => (ErrorKind::Config, false),
                _ => (kind, retryable),
            };
            error(kind, retryable, format!("{what}: {js}"))
        }
        CreateStreamErrorKind::TimedOut => error(
            ErrorKind::Timeout,
            true,
            format!("{what}: no answer in time ({CONFIG_SECTION}.request_timeout)"),
        ),
        CreateStreamErrorKind::JetStreamUnavailable => error(
            ErrorKind::Config,
            false,
            format!("{what}: JetStream does not answer: is JetStream enabled on the server (-js)?"),
        ),
        CreateStreamErrorKind::EmptyStreamName | CreateStreamErrorKind::InvalidStreamName => {
            error(ErrorKind::Config, false, format!("{what}: {err}"))
        }
        _ => error(
            ErrorKind::Connection,
            true,
            format!("{what}: {}", chain(err)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    fn js(code: usize, err_code: u64, description: &str) -> jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": code, "err_code": err_code, "description": description,
        }))
        .unwrap()
    }

    fn publish_other(code: usize, err_code: u64, description: &str) -> PublishError {
        PublishError::with_source(PublishErrorKind::Other, js(code, err_code, description))
    }

    fn check(e: Error, kind: ErrorKind, retryable: bool) -> Error {
        assert_eq!(e.kind(), kind, "{e}");
        assert_eq!(e.is_retryable(), retryable, "{e}");
        e
    }

    #[test]
    fn no_responders_is_unroutable_and_an_unknown_stream_a_configuration_error() {
        let e = classify_publish(&PublishError::new(PublishErrorKind::StreamNotFound), "a.b");
        let e = check(e, ErrorKind::Unroutable, true);
        assert!(
            e.message().starts_with("no stream for subject `a.b`"),
            "{e}"
        );
        let e = classify_publish(&publish_other(404, 10059, "stream not found"), "a.b");
        check(e, ErrorKind::Config, false);
        let e = classify_publish(&publish_other(503, 10076, "jetstream not enabled"), "a.b");
        check(e, ErrorKind::Config, false);
    }

    #[test]
    fn oversized_messages_are_rejected_with_the_server_error() {
        let e = classify_publish(
            &publish_other(400, 10054, "message size exceeds maximum allowed"),
            "orders.big",
        );
        let e = check(e, ErrorKind::MessageTooLarge, false);
        assert_eq!(
            e.message(),
            "subject `orders.big`: message size exceeds maximum allowed (code 400, error code 10054)"
        );
    }

    #[test]
    fn full_streams_are_unavailable() {
        for (code, err_code) in [
            (503, 10077),
            (500, 10047),
            (500, 10028),
            (503, 10008),
            (503, 1),
        ] {
            let e = classify_publish(&publish_other(code, err_code, "full"), "s");
            check(e, ErrorKind::Unavailable, true);
        }
        let e = classify_publish(&PublishError::new(PublishErrorKind::MaxAckPending), "s");
        check(e, ErrorKind::Unavailable, true);
    }

    #[test]
    fn lost_acks_are_timeouts_and_connection_errors() {
        let e = classify_publish(&PublishError::new(PublishErrorKind::TimedOut), "s");
        check(e, ErrorKind::Timeout, true);
        let e = classify_publish(&PublishError::new(PublishErrorKind::BrokenPipe), "s");
        check(e, ErrorKind::Connection, true);
    }

    #[test]
    fn unknown_answers_are_retried() {
        let e = classify_publish(&publish_other(400, 10999, "something new"), "s");
        check(e, ErrorKind::Other, true);
        let e = classify_publish(&PublishError::new(PublishErrorKind::WrongLastSequence), "s");
        check(e, ErrorKind::Other, true);
    }

    #[test]
    fn connect_errors() {
        let at = "nats://relay:***@a:4222";
        let e = classify_connect(
            &ConnectError::new(ConnectErrorKind::AuthorizationViolation),
            at,
            None,
        );
        let e = check(e, ErrorKind::Unauthorized, false);
        assert!(
            e.message().starts_with("NATS at nats://relay:***@a:4222"),
            "{e}"
        );
        let e = classify_connect(
            &ConnectError::new(ConnectErrorKind::Authentication),
            at,
            None,
        );
        check(e, ErrorKind::Unauthorized, false);
        let e = classify_connect(&ConnectError::new(ConnectErrorKind::Tls), at, None);
        check(e, ErrorKind::Config, false);
        let e = classify_connect(&ConnectError::new(ConnectErrorKind::ServerParse), at, None);
        check(e, ErrorKind::Config, false);
        let e = classify_connect(&ConnectError::new(ConnectErrorKind::TimedOut), at, None);
        check(e, ErrorKind::Timeout, true);
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        let e = classify_connect(
            &ConnectError::with_source(ConnectErrorKind::Io, refused),
            at,
            None,
        );
        let e = check(e, ErrorKind::Connection, true);
        assert!(e.message().ends_with("connection refused"), "{e}");
        let e = classify_connect(&ConnectError::new(ConnectErrorKind::Dns), at, None);
        check(e, ErrorKind::Connection, true);
    }

    #[test]
    fn untrusted_certificates_are_configuration_errors_naming_the_ca_file() {
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = io::Error::new(io::ErrorKind::InvalidData, unknown);
        let err = ConnectError::with_source(ConnectErrorKind::Io, io);
        let e = classify_connect(&err, "tls://a:4222", Some("/etc/relay/ca.pem".as_ref()));
        let e = check(e, ErrorKind::Config, false);
        assert!(
            e.message()
                .contains("not trusted by sink.nats.tls.ca_file (/etc/relay/ca.pem)"),
            "{e}"
        );
    }

    #[test]
    fn lookups() {
        let e = classify_lookup(
            &GetStreamByNameError::new(GetStreamByNameErrorKind::NotFound),
            "*.*",
            "{aggregate_type}.{event_type}",
        );
        let e = check(e, ErrorKind::Config, false);
        assert!(
            e.message().starts_with(
                "no stream for subject `*.*` (sink.nats.subject = `{aggregate_type}.{event_type}`)"
            ),
            "{e}"
        );
        let no_js = GetStreamByNameError::with_source(
            GetStreamByNameErrorKind::Request,
            RequestError::new(RequestErrorKind::NoResponders),
        );
        let e = check(
            classify_lookup(&no_js, "*.*", "t"),
            ErrorKind::Config,
            false,
        );
        assert!(e.message().contains("is JetStream enabled"), "{e}");
        let slow = GetStreamByNameError::with_source(
            GetStreamByNameErrorKind::Request,
            RequestError::new(RequestErrorKind::TimedOut),
        );
        check(classify_lookup(&slow, "*.*", "t"), ErrorKind::Timeout, true);
        let other = GetStreamByNameError::with_source(
            GetStreamByNameErrorKind::Request,
            RequestError::new(RequestErrorKind::Other),
        );
        check(
            classify_lookup(&other, "*.*", "t"),
            ErrorKind::Connection,
            true,
        );
    }

    #[test]
    fn refused_declarations_are_configuration_errors() {
        let overlap = CreateStreamError::new(CreateStreamErrorKind::JetStream(js(
            400,
            10065,
            "subjects overlap with an existing stream",
        )));
        let e = check(classify_declare(&overlap, "S"), ErrorKind::Config, false);
        assert!(e.message().contains("subjects overlap"), "{e}");
        let e = classify_declare(
            &CreateStreamError::new(CreateStreamErrorKind::TimedOut),
            "S",
        );
        check(e, ErrorKind::Timeout, true);
        let e = classify_declare(
            &CreateStreamError::new(CreateStreamErrorKind::JetStreamUnavailable),
            "S",
        );
        check(e, ErrorKind::Config, false);
    }
}
