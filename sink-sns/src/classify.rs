//! The error table: every SNS failure becomes an [`outboxkit_core::Error`] with a kind and a
//! retryability, decided here once from the codes every AWS service shares
//! ([`outboxkit_aws::classify`]) and SNS's own. The rest of the sink acts on
//! [`ErrorKind`](outboxkit_core::ErrorKind) only.
//!
//! **Whole requests** (an `SdkError` of `PublishBatch`, `ListTopics`, `GetTopicAttributes`):
//! each event of the request gets the request's error as its outcome.
//!
//! | failure | kind | retryable | the sink then |
//! |---|---|---|---|
//! | connection refused / reset, DNS, TLS | `Connection` | yes | retries the request's events |
//! | attempt or connect timeout | `Timeout` | yes | same |
//! | throttling (`Throttled`, `ThrottlingException`, `KMSThrottling`, HTTP 429) | `Unavailable` | yes | same |
//! | server errors (`InternalError`, any HTTP 5xx) | `Unavailable` | yes | same |
//! | batch-structure codes (`TooManyEntriesInBatchRequest`, `BatchEntryIdsNotDistinct`, ...): a sink bug | `Other` | yes | same |
//! | unknown code, HTTP 4xx | `Other` | yes | same |
//! | credentials or permission refused (`AuthorizationError`, `InvalidClientTokenId`, `SignatureDoesNotMatch`, `InvalidSecurity`, HTTP 401/403) | `Unauthorized` | no | reports it for the request's events |
//! | the topic's KMS key refused (`KMSAccessDenied`, `KMSDisabled`, `KMSNotFound`, ...) | `Unauthorized` | no | same |
//! | no usable credentials in the AWS chain | `Unauthorized` | no | same |
//! | client misconfiguration | `Config` | no | same |
//! | `NotFound` (no such topic) | `Unroutable` | yes | retries the events of that topic (dead after `max_attempts`); at start, a configuration error naming the topic |
//! | `BatchRequestTooLong`, `InvalidParameter`, `ParameterValueInvalid`, `ValidationException` | `MessageTooLarge` / `InvalidMessage` | no | sends each entry alone; rejects an entry refused alone |
//!
//! **Entries** of a `PublishBatch` answer (`Failed` list): `SenderFault = true` → rejected,
//! parked as dead with SNS's error; otherwise retried; a credentials, permission or KMS code
//! is `Unauthorized` whatever the fault.

use aws_sdk_sns::config::http::HttpResponse;
use aws_sdk_sns::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sns::types::BatchResultErrorEntry;
use outboxkit_aws::classify::ErrorCodes;
pub use outboxkit_aws::classify::{is_access_denied, refuses_content};
use outboxkit_core::Error;

/// SNS's own codes, on top of the ones every AWS service shares.
const CODES: ErrorCodes = ErrorCodes {
    service: "SNS",
    throttling: &["Throttled", "KMSThrottling"],
    server: &["InternalErrorException"],
    unauthorized: &[
        "AuthorizationErrorException",
        "KMSAccessDenied",
        "KMSDisabled",
        "KMSInvalidState",
        "KMSNotFound",
        "KMSOptInRequired",
    ],
    missing_destination: &["NotFound", "NotFoundException"],
    bad_address: &[],
    too_large: &[],
    invalid_message: &["InvalidParameter", "ParameterValueInvalid"],
    sink_bug: &[],
    unsupported: &[],
};

/// Turn an SDK error of any SNS operation into the relay's error (see the module table).
pub fn classify_sdk_error<E>(err: &SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    CODES.classify_sdk_error(err)
}

/// Turn one `Failed` entry of a `PublishBatch` answer into the relay's error, with SNS's code
/// and message as text (what is stored in `last_error`).
pub fn classify_entry(entry: &BatchResultErrorEntry) -> Error {
    CODES.classify_entry(entry.code(), entry.message(), entry.sender_fault())
}

#[cfg(test)]
mod tests {
    use aws_sdk_sns::operation::publish_batch::PublishBatchError;
    use outboxkit_aws::testkit::service_error;
    use outboxkit_core::ErrorKind;

    use super::*;

    fn service(code: &str, status: u16) -> SdkError<PublishBatchError, HttpResponse> {
        service_error(PublishBatchError::generic, code, "details from SNS", status)
    }

    fn check(code: &str, status: u16, kind: ErrorKind, retryable: bool) {
        let e = classify_sdk_error(&service(code, status));
        assert_eq!(
            (e.kind(), e.is_retryable()),
            (kind, retryable),
            "{code}: {e}"
        );
        assert!(e.message().contains("details from SNS"), "{e}");
    }

    #[test]
    fn sns_codes() {
        check("Throttled", 400, ErrorKind::Unavailable, true);
        check("KMSThrottling", 400, ErrorKind::Unavailable, true);
        check("InternalError", 500, ErrorKind::Unavailable, true);
        check("AuthorizationError", 403, ErrorKind::Unauthorized, false);
        check("KMSDisabled", 400, ErrorKind::Unauthorized, false);
        check("NotFound", 404, ErrorKind::Unroutable, true);
        check(
            "BatchRequestTooLong",
            400,
            ErrorKind::MessageTooLarge,
            false,
        );
        check("InvalidParameter", 400, ErrorKind::InvalidMessage, false);
        check(
            "ParameterValueInvalid",
            400,
            ErrorKind::InvalidMessage,
            false,
        );
        check("TooManyEntriesInBatchRequest", 400, ErrorKind::Other, true);
        assert!(refuses_content(&classify_sdk_error(&service(
            "BatchRequestTooLong",
            400
        ))));
        assert!(is_access_denied(&service("AuthorizationError", 403)));
    }

    #[test]
    fn entries() {
        let entry = |code: &str, sender_fault: bool| {
            classify_entry(
                &BatchResultErrorEntry::builder()
                    .id("e0")
                    .code(code)
                    .message("details from SNS")
                    .sender_fault(sender_fault)
                    .build()
                    .unwrap(),
            )
        };
        let e = entry("InvalidParameter", true);
        assert_eq!(
            (e.kind(), e.is_retryable()),
            (ErrorKind::InvalidMessage, false)
        );
        assert_eq!(
            e.message(),
            "InvalidParameter: details from SNS (sender fault)"
        );
        let e = entry("InternalError", false);
        assert_eq!((e.kind(), e.is_retryable()), (ErrorKind::Unavailable, true));
        let e = entry("KMSAccessDenied", false);
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
    }
}
