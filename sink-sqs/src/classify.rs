//! The error table: every SQS failure becomes an [`outboxkit_core::Error`] with a kind and a
//! retryability, decided here once. The rest of the sink acts on [`ErrorKind`] only.
//!
//! **Whole requests** (an `SdkError` of `SendMessageBatch`, `GetQueueUrl`, `ListQueues`): each
//! event of the request gets the request's error as its outcome, unless the sink says otherwise
//! below.
//!
//! | failure | kind | retryable | the sink then |
//! |---|---|---|---|
//! | connection refused / reset, DNS, TLS (`DispatchFailure` I/O) | `Connection` | yes | retries the request's events |
//! | attempt or connect timeout (`TimeoutError`, connector timeout) | `Timeout` | yes | same |
//! | throttling (`RequestThrottled`, `ThrottlingException`, `KmsThrottled`, HTTP 429) | `Unavailable` | yes | same |
//! | server errors (`InternalError`, `ServiceUnavailable`, any HTTP 5xx) | `Unavailable` | yes | same |
//! | unparsable response (`ResponseError`) | `Other` | yes | same |
//! | batch-structure codes (`TooManyEntriesInBatchRequest`, `BatchEntryIdsNotDistinct`, `InvalidBatchEntryId`, `EmptyBatchRequest`): a sink bug | `Other` | yes | same |
//! | unknown code, HTTP 4xx | `Other` | yes | same |
//! | credentials or permission refused (`InvalidClientTokenId`, `SignatureDoesNotMatch`, `ExpiredToken`, `AccessDenied`, `InvalidSecurity`, ..., HTTP 401/403) | `Unauthorized` | no | reports it for the request's events |
//! | the queue's KMS key refused (`KmsAccessDenied`, `KmsDisabled`, `KmsNotFound`, `KmsInvalidState`, ...) | `Unauthorized` | no | same |
//! | no usable credentials in the AWS chain (`CredentialsError`) | `Unauthorized` | no | same |
//! | client misconfiguration (`ConstructionFailure`, connector "user" error, `UnsupportedOperation`) | `Config` | no | same |
//! | `QueueDoesNotExist` / `NonExistentQueue` | `Unroutable` | yes | retries the events of that queue (dead after `max_attempts`) |
//! | `InvalidAddress` (malformed queue URL) | `Unroutable` | no | rejects the events of that queue |
//! | `BatchRequestTooLong`, `InvalidParameterValue`, `InvalidMessageContents`, ... | `MessageTooLarge` / `InvalidMessage` | no | sends each entry alone; rejects an entry refused alone |
//!
//! **Entries** of a `SendMessageBatch` answer (`Failed` list):
//!
//! | entry | kind | retryable |
//! |---|---|---|
//! | `SenderFault = true` (too large, invalid attribute, ...) | `InvalidMessage` (or `MessageTooLarge` by code) | no: rejected, parked as dead with SQS's error |
//! | `SenderFault = false`, throttling / server codes | `Unavailable` | yes |
//! | `SenderFault = false`, anything else | `Other` | yes |
//! | a credentials, permission or KMS code, whatever `SenderFault` | `Unauthorized` | no |
//!
//! Whether a call failed as a whole is the engine's decision, from these kinds
//! ([`outboxkit_core::whole_call_failure`]): `Unauthorized` or `Config` on any event (never a
//! reason to dead-letter), or `Connection`, `Timeout`, `Unavailable` on every event (SQS
//! unreachable, slow or throttling) — then nothing is dead-lettered and no attempt is counted
//! against the events.

use aws_sdk_sqs::config::http::HttpResponse;
use aws_sdk_sqs::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_sqs::types::BatchResultErrorEntry;
use outboxkit_aws::classify::ErrorCodes;
pub use outboxkit_aws::classify::{is_access_denied, refuses_content};
use outboxkit_core::{Error, ErrorKind};

/// SQS's own codes, on top of the ones every AWS service shares (see
/// [`outboxkit_aws::classify`]).
const CODES: ErrorCodes = ErrorCodes {
    service: "SQS",
    throttling: &[
        "AWS.SimpleQueueService.RequestThrottled",
        "KmsThrottled",
        "KMS.ThrottlingException",
    ],
    server: &["AWS.SimpleQueueService.InternalError"],
    unauthorized: &[
        "AWS.SimpleQueueService.InvalidSecurity",
        "KmsAccessDenied",
        "KMS.AccessDeniedException",
        "KmsDisabled",
        "KMS.DisabledException",
        "KmsInvalidState",
        "KMS.InvalidStateException",
        "KmsNotFound",
        "KMS.NotFoundException",
        "KmsInvalidKeyUsage",
        "KMS.InvalidKeyUsageException",
        "KmsOptInRequired",
        "KMS.OptInRequired",
    ],
    missing_destination: &[
        "QueueDoesNotExist",
        "AWS.SimpleQueueService.NonExistentQueue",
        "NonExistentQueue",
        "QueueDeletedRecently",
        "AWS.SimpleQueueService.QueueDeletedRecently",
    ],
    bad_address: &["InvalidAddress", "AWS.SimpleQueueService.InvalidAddress"],
    too_large: &[
        "AWS.SimpleQueueService.BatchRequestTooLong",
        "MessageTooLong",
    ],
    invalid_message: &[
        "InvalidMessageContents",
        "InvalidAttributeName",
        "InvalidAttributeValue",
    ],
    sink_bug: &[
        "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
        "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
        "AWS.SimpleQueueService.InvalidBatchEntryId",
        "AWS.SimpleQueueService.EmptyBatchRequest",
    ],
    unsupported: &["AWS.SimpleQueueService.UnsupportedOperation"],
};

/// The kind and retryability of an SQS error code (service error or batch entry), with the
/// HTTP status of the answer when there was one. Unknown codes are `Other` and retryable:
/// never dead-letter an event on an error nobody understood.
pub fn classify_code(code: Option<&str>, status: Option<u16>) -> (ErrorKind, bool) {
    CODES.classify_code(code, status)
}

/// Turn an SDK error of any SQS operation into the relay's error (see the module table).
pub fn classify_sdk_error<E>(err: &SdkError<E, HttpResponse>) -> Error
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
{
    CODES.classify_sdk_error(err)
}

/// Turn one `Failed` entry of a `SendMessageBatch` answer into the relay's error, with SQS's
/// code and message as text (what is stored in `last_error`).
pub fn classify_entry(entry: &BatchResultErrorEntry) -> Error {
    CODES.classify_entry(entry.code(), entry.message(), entry.sender_fault())
}

#[cfg(test)]
mod tests {
    use std::io;

    use aws_credential_types::provider::error::CredentialsError;
    use aws_sdk_sqs::error::ConnectorError;
    use aws_sdk_sqs::operation::send_message_batch::SendMessageBatchError;
    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use outboxkit_aws::testkit::service_error;
    use outboxkit_core::testkit::sink_suite::assert_classified;

    use super::*;

    type BatchSdkError = SdkError<SendMessageBatchError, HttpResponse>;

    fn service(code: &str, status: u16) -> BatchSdkError {
        service_error(
            SendMessageBatchError::generic,
            code,
            "details from SQS",
            status,
        )
    }

    fn check(err: BatchSdkError, kind: ErrorKind, retryable: bool) -> Error {
        assert_classified(classify_sdk_error(&err), kind, retryable)
    }

    fn entry(code: &str, sender_fault: bool) -> Error {
        let entry = BatchResultErrorEntry::builder()
            .id("e0")
            .code(code)
            .sender_fault(sender_fault)
            .message("details from SQS")
            .build()
            .unwrap();
        classify_entry(&entry)
    }

    #[test]
    fn connection_failures_are_connection_errors() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        let e = check(
            SdkError::dispatch_failure(ConnectorError::io(Box::new(refused))),
            ErrorKind::Connection,
            true,
        );
        assert_eq!(
            e.message(),
            "cannot reach SQS: dispatch failure: io error: connection refused"
        );
        let other = ConnectorError::other("tls handshake eof".into(), None);
        check(
            SdkError::dispatch_failure(other),
            ErrorKind::Connection,
            true,
        );
    }

    #[test]
    fn timeouts_are_timeouts() {
        check(
            SdkError::timeout_error("operation attempt timeout"),
            ErrorKind::Timeout,
            true,
        );
        let connect = ConnectorError::timeout("connect timeout".into());
        check(
            SdkError::dispatch_failure(connect),
            ErrorKind::Timeout,
            true,
        );
    }

    #[test]
    fn throttling_is_unavailable() {
        for code in [
            "RequestThrottled",
            "AWS.SimpleQueueService.RequestThrottled",
            "ThrottlingException",
            "KmsThrottled",
        ] {
            check(service(code, 400), ErrorKind::Unavailable, true);
        }
        check(service("Whatever", 429), ErrorKind::Unavailable, true);
    }

    #[test]
    fn server_errors_are_unavailable() {
        check(service("InternalError", 500), ErrorKind::Unavailable, true);
        check(
            service("ServiceUnavailable", 503),
            ErrorKind::Unavailable,
            true,
        );
        check(service("SomethingNew", 502), ErrorKind::Unavailable, true);
    }

    #[test]
    fn refused_credentials_are_unauthorized() {
        for code in [
            "InvalidClientTokenId",
            "UnrecognizedClientException",
            "SignatureDoesNotMatch",
            "ExpiredToken",
            "AccessDenied",
            "AccessDeniedException",
            "InvalidSecurity",
        ] {
            let e = check(service(code, 403), ErrorKind::Unauthorized, false);
            assert!(e.message().starts_with(code), "{e}");
            assert!(e.message().contains("details from SQS"), "{e}");
        }
        check(service("Unknown", 401), ErrorKind::Unauthorized, false);
    }

    #[test]
    fn refused_kms_keys_are_unauthorized() {
        for code in [
            "KmsAccessDenied",
            "KmsDisabled",
            "KmsNotFound",
            "KmsInvalidState",
            "KmsInvalidKeyUsage",
            "KmsOptInRequired",
        ] {
            check(service(code, 400), ErrorKind::Unauthorized, false);
        }
    }

    #[test]
    fn missing_credentials_are_unauthorized() {
        let missing = CredentialsError::not_loaded("no providers in chain provided credentials");
        let dispatch = ConnectorError::other(Box::new(missing), None);
        let e = check(
            SdkError::dispatch_failure(dispatch),
            ErrorKind::Unauthorized,
            false,
        );
        assert!(e.message().contains("AWS_ACCESS_KEY_ID"), "{e}");
    }

    #[test]
    fn client_misconfiguration_is_a_config_error() {
        check(
            SdkError::construction_failure("no region configured"),
            ErrorKind::Config,
            false,
        );
        let user = ConnectorError::user("invalid endpoint URI".into());
        check(SdkError::dispatch_failure(user), ErrorKind::Config, false);
        check(
            service("UnsupportedOperation", 400),
            ErrorKind::Config,
            false,
        );
    }

    #[test]
    fn missing_queues_are_retryable_unroutable() {
        for code in [
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
        ] {
            check(service(code, 400), ErrorKind::Unroutable, true);
        }
        check(service("InvalidAddress", 404), ErrorKind::Unroutable, false);
    }

    #[test]
    fn refused_request_content_is_split() {
        let e = check(
            service("AWS.SimpleQueueService.BatchRequestTooLong", 400),
            ErrorKind::MessageTooLarge,
            false,
        );
        assert!(refuses_content(&e));
        let e = check(
            service("InvalidParameterValue", 400),
            ErrorKind::InvalidMessage,
            false,
        );
        assert!(refuses_content(&e));
    }

    #[test]
    fn batch_structure_errors_are_retryable_sink_bugs() {
        for code in [
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            "BatchEntryIdsNotDistinct",
            "InvalidBatchEntryId",
            "EmptyBatchRequest",
        ] {
            check(service(code, 400), ErrorKind::Other, true);
        }
    }

    #[test]
    fn access_denied_is_recognised_for_check() {
        assert!(is_access_denied(&service("AccessDenied", 403)));
        assert!(is_access_denied(&service("AccessDeniedException", 400)));
        assert!(!is_access_denied(&service("InvalidClientTokenId", 403)));
        assert!(!is_access_denied(&SdkError::<
            SendMessageBatchError,
            HttpResponse,
        >::timeout_error("t")));
    }

    #[test]
    fn unknown_client_errors_are_retried() {
        let e = check(service("SomethingNew", 400), ErrorKind::Other, true);
        assert_eq!(e.message(), "SomethingNew: details from SQS (HTTP 400)");
    }

    #[test]
    fn unreadable_answers_are_retried() {
        let raw = HttpResponse::new(StatusCode::try_from(200).unwrap(), SdkBody::from("<html>"));
        let err: BatchSdkError = SdkError::response_error("not JSON", raw);
        check(err, ErrorKind::Other, true);
    }

    #[test]
    fn sender_fault_entries_are_rejected_with_sqs_error() {
        let e = entry("InvalidParameterValueException", true);
        let e = assert_classified(e, ErrorKind::InvalidMessage, false);
        assert_eq!(
            e.message(),
            "InvalidParameterValueException: details from SQS (sender fault)"
        );
        assert_classified(
            entry("MessageTooLong", true),
            ErrorKind::MessageTooLarge,
            false,
        );
        assert_classified(
            entry("SomethingNew", true),
            ErrorKind::InvalidMessage,
            false,
        );
    }

    #[test]
    fn server_fault_entries_are_retried() {
        assert_classified(entry("InternalError", false), ErrorKind::Unavailable, true);
        assert_classified(
            entry("RequestThrottled", false),
            ErrorKind::Unavailable,
            true,
        );
        assert_classified(entry("SomethingNew", false), ErrorKind::Other, true);
    }

    #[test]
    fn permission_entries_are_unauthorized_whatever_the_fault() {
        for sender_fault in [true, false] {
            let e = entry("KMS.AccessDeniedException", sender_fault);
            assert_classified(e, ErrorKind::Unauthorized, false);
        }
    }
}
