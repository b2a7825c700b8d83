//! The skeleton of an AWS sink's error table: every failure of an SDK call or of one batch
//! entry becomes an [`outboxkit_core::Error`] with a kind and a retryability, decided here once
//! from the codes every AWS service shares ([`ErrorCodes`]'s generic lists) plus the service's
//! own (its [`ErrorCodes`] value). Each sink's `classify` module documents its full table.

use aws_credential_types::provider::error::CredentialsError;
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;
use outboxkit_core::error::{find_source, source_chain as chain};
use outboxkit_core::{Error, ErrorKind, Result};

/// Throttling codes of every AWS service.
const THROTTLING: &[&str] = &[
    "RequestThrottled",
    "RequestThrottledException",
    "ThrottlingException",
    "Throttling",
    "ThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
];

const SERVER: &[&str] = &[
    "InternalError",
    "InternalFailure",
    "InternalServerError",
    "ServiceUnavailable",
    "ServiceUnavailableException",
];

const CREDENTIALS: &[&str] = &[
    "InvalidClientTokenId",
    "InvalidAccessKeyId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "MissingAuthenticationTokenException",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "InvalidSecurity",
    "AccessDenied",
    "AccessDeniedException",
    "AuthFailure",
    "AuthorizationError",
    "NotAuthorized",
    "OptInRequired",
];

const ACCESS_DENIED: &[&str] = &[
    "AccessDenied",
    "AccessDeniedException",
    "AuthorizationError",
    "NotAuthorized",
];

const TOO_LARGE: &[&str] = &["BatchRequestTooLong", "RequestEntityTooLarge"];

const INVALID_MESSAGE: &[&str] = &[
    "InvalidParameterValue",
    "InvalidParameterValueException",
    "InvalidParameterException",
    "InvalidParameterCombination",
    "MissingParameter",
    "ValidationError",
    "ValidationException",
];

/// Codes that mean the sink built a malformed batch: a bug, retried.
const SINK_BUG: &[&str] = &[
    "TooManyEntriesInBatchRequest",
    "BatchEntryIdsNotDistinct",
    "InvalidBatchEntryId",
    "EmptyBatchRequest",
];

const UNSUPPORTED: &[&str] = &[
    "UnsupportedOperation",
    "InvalidAction",
    "UnknownOperationException",
];

/// A service's own error codes, on top of the ones every AWS service shares.
#[derive(Debug, Clone, Copy)]
pub struct ErrorCodes {
    /// The service as messages name it (`SQS`, `SNS`).
    pub service: &'static str,
    /// Throttling: `Unavailable`, retryable.
    pub throttling: &'static [&'static str],
    /// Server errors: `Unavailable`, retryable.
    pub server: &'static [&'static str],
    /// Credentials, permissions and KMS keys refused: `Unauthorized`, not retryable.
    pub unauthorized: &'static [&'static str],
    /// The destination does not exist (now): `Unroutable`, retryable.
    pub missing_destination: &'static [&'static str],
    /// The destination is malformed: `Unroutable`, not retryable.
    pub bad_address: &'static [&'static str],
    /// `MessageTooLarge`, not retryable.
    pub too_large: &'static [&'static str],
    /// `InvalidMessage`, not retryable.
    pub invalid_message: &'static [&'static str],
    /// Malformed batches (a sink bug): `Other`, retryable.
    pub sink_bug: &'static [&'static str],
    /// `Config`, not retryable.
    pub unsupported: &'static [&'static str],
}

impl ErrorCodes {
    /// The kind and retryability of an error code (service error or batch entry), with the HTTP
    /// status of the answer when there was one. Unknown codes are `Other` and retryable: never
    /// dead-letter an event on an error nobody understood.
    pub fn classify_code(&self, code: Option<&str>, status: Option<u16>) -> (ErrorKind, bool) {
        if let Some(code) = code {
            let is = |shared: &[&str], own: &[&str]| shared.contains(&code) || own.contains(&code);
            if is(THROTTLING, self.throttling) || is(SERVER, self.server) {
                return (ErrorKind::Unavailable, true);
            }
            if is(CREDENTIALS, self.unauthorized) {
                return (ErrorKind::Unauthorized, false);
            }
            if is(&[], self.missing_destination) {
                return (ErrorKind::Unroutable, true);
            }
            if is(&[], self.bad_address) {
                return (ErrorKind::Unroutable, false);
            }
            if is(TOO_LARGE, self.too_large) {
                return (ErrorKind::MessageTooLarge, false);
            }
            if is(INVALID_MESSAGE, self.invalid_message) {
                return (ErrorKind::InvalidMessage, false);
            }
            if is(SINK_BUG, self.sink_bug) {
                return (ErrorKind::Other, true);
            }
            if is(UNSUPPORTED, self.unsupported) {
                return (ErrorKind::Config, false);
            }
        }
        match status {
            Some(429) => (ErrorKind::Unavailable, true),
            Some(401 | 403) => (ErrorKind::Unauthorized, false),
            Some(s) if s >= 500 => (ErrorKind::Unavailable, true),
            _ => (ErrorKind::Other, true),
        }
    }

    /// Turn an SDK error of any operation of the service into the relay's error.
    pub fn classify_sdk_error<E>(&self, err: &SdkError<E, HttpResponse>) -> Error
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
    {
        if let Some(credentials) = find_source::<CredentialsError>(err) {
            let reason = chain(credentials);
            return error(
                ErrorKind::Unauthorized,
                false,
                format!(
                    "no usable AWS credentials ({reason}); provide them through the AWS chain: \
                     AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance/task role"
                ),
            );
        }
        match err {
            SdkError::ServiceError(service) => {
                let status = service.raw().status().as_u16();
                let inner = service.err();
                let code = inner.code();
                let (kind, retryable) = self.classify_code(code, Some(status));
                let text = match (code, inner.message()) {
                    (Some(code), Some(message)) => format!("{code}: {message}"),
                    (Some(code), None) => code.to_owned(),
                    (None, Some(message)) => message.to_owned(),
                    (None, None) => "the service refused the request".to_owned(),
                };
                error(kind, retryable, format!("{text} (HTTP {status})"))
            }
            SdkError::TimeoutError(_) => error(
                ErrorKind::Timeout,
                true,
                format!("no answer in time: {}", chain(err)),
            ),
            SdkError::DispatchFailure(dispatch) => {
                let (kind, retryable) = if dispatch.is_timeout() {
                    (ErrorKind::Timeout, true)
                } else if dispatch.is_user() {
                    (ErrorKind::Config, false)
                } else {
                    (ErrorKind::Connection, true)
                };
                error(
                    kind,
                    retryable,
                    format!("cannot reach {}: {}", self.service, chain(err)),
                )
            }
            SdkError::ResponseError(_) => error(
                ErrorKind::Other,
                true,
                format!("unreadable answer: {}", chain(err)),
            ),
            SdkError::ConstructionFailure(_) => error(
                ErrorKind::Config,
                false,
                format!("cannot build the request: {}", chain(err)),
            ),
            _ => error(ErrorKind::Other, true, chain(err)),
        }
    }

    /// Turn one failed entry of a batch answer (its `Code`, `Message` and `SenderFault`) into
    /// the relay's error, with the service's code and message as text (what is stored in
    /// `last_error`): a sender fault rejects the event, anything else retries it, and refused
    /// credentials or permissions are `Unauthorized` whatever the fault.
    pub fn classify_entry(&self, code: &str, message: Option<&str>, sender_fault: bool) -> Error {
        let (known, _) = self.classify_code(Some(code), None);
        let text = match message {
            Some(message) => format!("{code}: {message}"),
            None => code.to_owned(),
        };
        let text = if sender_fault {
            format!("{text} (sender fault)")
        } else {
            text
        };
        match known {
            ErrorKind::Unauthorized | ErrorKind::Config => error(known, false, text),
            _ if sender_fault => {
                let kind = match known {
                    ErrorKind::MessageTooLarge | ErrorKind::Unroutable => known,
                    _ => ErrorKind::InvalidMessage,
                };
                error(kind, false, text)
            }
            ErrorKind::Unavailable => error(ErrorKind::Unavailable, true, text),
            _ => error(ErrorKind::Other, true, text),
        }
    }
}

/// A new error of `kind`, temporary when `retryable`, else permanent.
pub fn error(kind: ErrorKind, retryable: bool, message: String) -> Error {
    let error = Error::new(kind, message);
    if retryable {
        error.temporary()
    } else {
        error.permanent()
    }
}

/// `error` with what to do appended (`... — create the queue`), same kind and retryability.
pub fn with_hint(error: Error, hint: &str) -> Error {
    let text = format!("{} — {hint}", error.full_message());
    self::error(error.kind(), error.is_retryable(), text)
}

/// What to do about the errors an operator must act on, per sink: appended to them (see
/// [`with_hint`]) by [`apply`](Hints::apply).
#[derive(Debug, Clone, Copy)]
pub struct Hints {
    /// For a destination that does not exist (now): `Unroutable`, retryable.
    pub missing_destination: &'static str,
    /// For refused credentials or permissions: `Unauthorized`.
    pub unauthorized: &'static str,
    /// For a client misconfiguration: `Config`.
    pub config: &'static str,
}

impl Hints {
    /// `error` with the hint of its kind appended; other errors as they are.
    pub fn apply(&self, error: Error) -> Error {
        let hint = match error.kind() {
            ErrorKind::Unroutable if error.is_retryable() => self.missing_destination,
            ErrorKind::Unauthorized => self.unauthorized,
            ErrorKind::Config => self.config,
            _ => return error,
        };
        with_hint(error, hint)
    }
}

/// The answer to a sink's `check` request: it passes when the service answered, or refused
/// only for lack of permission (see [`is_access_denied`]: the endpoint and the credentials are
/// proven, and the relay needs no permission beyond sending); otherwise the error `explain`
/// makes of it.
pub fn check_answer<T, E: ProvideErrorMetadata>(
    answer: std::result::Result<T, SdkError<E, HttpResponse>>,
    explain: impl FnOnce(SdkError<E, HttpResponse>) -> Error,
) -> Result<()> {
    match answer {
        Ok(_) => Ok(()),
        Err(e) if is_access_denied(&e) => Ok(()),
        Err(e) => Err(explain(e)),
    }
}

/// Whether the service refused an operation for lack of permission (`AccessDenied`): the
/// endpoint answered and the credentials are valid — the caller may not do this particular
/// thing.
pub fn is_access_denied<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    err.as_service_error()
        .and_then(ProvideErrorMetadata::code)
        .is_some_and(|code| ACCESS_DENIED.contains(&code))
}

/// Whether a whole request was refused for its content (too long, an invalid entry): each of
/// its entries is then sent alone, so that only the bad one is rejected.
pub fn refuses_content(error: &Error) -> bool {
    !error.is_retryable()
        && matches!(
            error.kind(),
            ErrorKind::MessageTooLarge | ErrorKind::InvalidMessage
        )
}

#[cfg(test)]
mod tests {
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    const CODES: ErrorCodes = ErrorCodes {
        service: "TEST",
        throttling: &["Throttled"],
        server: &[],
        unauthorized: &["KMSAccessDenied"],
        missing_destination: &["NotFound"],
        bad_address: &["BadAddress"],
        too_large: &[],
        invalid_message: &["InvalidParameter"],
        sink_bug: &[],
        unsupported: &[],
    };

    fn service(code: &str, status: u16) -> SdkError<ErrorMetadata, HttpResponse> {
        SdkError::service_error(
            ErrorMetadata::builder()
                .code(code)
                .message("details")
                .build(),
            HttpResponse::new(StatusCode::try_from(status).unwrap(), SdkBody::empty()),
        )
    }

    #[test]
    fn shared_and_own_codes_are_both_known() {
        for (code, kind, retryable) in [
            ("ThrottlingException", ErrorKind::Unavailable, true),
            ("Throttled", ErrorKind::Unavailable, true),
            ("InternalError", ErrorKind::Unavailable, true),
            ("SignatureDoesNotMatch", ErrorKind::Unauthorized, false),
            ("KMSAccessDenied", ErrorKind::Unauthorized, false),
            ("NotFound", ErrorKind::Unroutable, true),
            ("BadAddress", ErrorKind::Unroutable, false),
            ("BatchRequestTooLong", ErrorKind::MessageTooLarge, false),
            ("InvalidParameter", ErrorKind::InvalidMessage, false),
            ("EmptyBatchRequest", ErrorKind::Other, true),
            ("InvalidAction", ErrorKind::Config, false),
            ("SomethingNew", ErrorKind::Other, true),
        ] {
            let e = CODES.classify_sdk_error(&service(code, 400));
            assert_eq!((e.kind(), e.is_retryable()), (kind, retryable), "{code}");
            assert_eq!(e.message(), format!("{code}: details (HTTP 400)"));
        }
    }

    #[test]
    fn entries_follow_the_sender_fault() {
        let e = CODES.classify_entry("InvalidParameter", Some("too long"), true);
        assert_eq!(e.kind(), ErrorKind::InvalidMessage);
        assert!(!e.is_retryable());
        assert_eq!(e.message(), "InvalidParameter: too long (sender fault)");
        let e = CODES.classify_entry("Throttled", None, false);
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Unavailable, true));
        let e = CODES.classify_entry("KMSAccessDenied", None, true);
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
    }

    #[test]
    fn hints_keep_kind_and_retryability() {
        let e = with_hint(
            error(ErrorKind::Unroutable, true, "gone".into()),
            "create it",
        );
        assert_eq!(e.message(), "gone — create it");
        assert!(e.is_retryable());
        assert!(is_access_denied(&service("AuthorizationError", 403)));
        assert!(!is_access_denied(&service("Throttled", 400)));
        let hints = Hints {
            missing_destination: "create it",
            unauthorized: "check the credentials",
            config: "check the endpoint",
        };
        let e = hints.apply(error(ErrorKind::Unroutable, true, "gone".into()));
        assert_eq!(e.message(), "gone — create it");
        let e = hints.apply(error(ErrorKind::Unroutable, false, "malformed".into()));
        assert_eq!(e.message(), "malformed");
        let e = hints.apply(error(ErrorKind::Config, false, "bad".into()));
        assert_eq!(e.message(), "bad — check the endpoint");
        let explain =
            |e: SdkError<ErrorMetadata, HttpResponse>| error(ErrorKind::Other, true, chain(&e));
        assert!(check_answer(Ok::<_, SdkError<ErrorMetadata, HttpResponse>>(()), explain).is_ok());
        assert!(check_answer::<(), _>(Err(service("AccessDenied", 403)), explain).is_ok());
        assert!(check_answer::<(), _>(Err(service("Throttled", 400)), explain).is_err());
    }
}
