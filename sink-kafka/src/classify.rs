//! The driver-error table: every librdkafka error becomes an [`outboxkit_core::Error`] with a
//! kind and a retryability, decided here once. The engine never looks at Kafka messages.
//!
//! | librdkafka error (code) | kind | retryable |
//! |---|---|---|
//! | `MSG_SIZE_TOO_LARGE` (local or broker), `RECORD_LIST_TOO_LARGE`, `INVALID_MSG_SIZE` | `MessageTooLarge` | no |
//! | `CORRUPT_MESSAGE`, `INVALID_RECORD`, `INVALID_TIMESTAMP`, `UNSUPPORTED_FOR_MESSAGE_FORMAT`, `POLICY_VIOLATION`, local `BAD_MSG`, `INVALID_ARG`, `KEY/VALUE_SERIALIZATION` | `InvalidMessage` | no |
//! | `INVALID_TOPIC_EXCEPTION` (a name Kafka cannot have) | `Unroutable` | no |
//! | `UNKNOWN_TOPIC_OR_PART`, local `UNKNOWN_TOPIC`, `UNKNOWN_PARTITION`, `UNKNOWN_TOPIC_ID` | `Unroutable` | **yes** (create the topic and it flows) |
//! | local `QUEUE_FULL`, `NOT_ENOUGH_REPLICAS(_AFTER_APPEND)`, `LEADER_NOT_AVAILABLE`, `NOT_LEADER_FOR_PARTITION`, `KAFKA_STORAGE_ERROR`, `THROTTLING_QUOTA_EXCEEDED`, `BROKER_NOT_AVAILABLE`, `REPLICA_NOT_AVAILABLE`, `FENCED_LEADER_EPOCH`, `UNKNOWN_LEADER_EPOCH`, `REBOOTSTRAP_REQUIRED` | `Unavailable` | yes |
//! | idempotence state: `OUT_OF_ORDER_SEQUENCE_NUMBER`, `INVALID_PRODUCER_EPOCH`, `UNKNOWN_PRODUCER_ID`, `INVALID_PRODUCER_ID_MAPPING`, `PRODUCER_FENCED`, local `FATAL`, `FENCED`, `GAPLESS_GUARANTEE`, `INCONSISTENT` | `Unavailable` | yes; **the producer is recreated** |
//! | local `MSG_TIMED_OUT`, `TIMED_OUT`, `TIMED_OUT_QUEUE`, `REQUEST_TIMED_OUT`, local `PURGE_QUEUE`, `PURGE_INFLIGHT` | `Timeout` | yes |
//! | local `TRANSPORT`, `ALL_BROKERS_DOWN`, `RESOLVE`, `DESTROY`, `NETWORK_EXCEPTION`, local `SSL` | `Connection` | yes |
//! | `TOPIC_AUTHORIZATION_FAILED`, `CLUSTER_AUTHORIZATION_FAILED`, `TRANSACTIONAL_ID_AUTHORIZATION_FAILED`, `SASL_AUTHENTICATION_FAILED`, `UNSUPPORTED_SASL_MECHANISM`, `ILLEGAL_SASL_STATE`, local `AUTHENTICATION`, `UNACCEPTABLE_CREDENTIAL`, `SECURITY_DISABLED`, `DELEGATION_TOKEN_*` | `Unauthorized` | no |
//! | `INVALID_REQUIRED_ACKS`, `UNSUPPORTED_COMPRESSION_TYPE`, `UNSUPPORTED_VERSION`, local `UNSUPPORTED_FEATURE`, `NOT_CONFIGURED`, client creation / configuration errors | `Config` | no |
//! | anything else | `Other` | yes |
//!
//! Each event of a call gets its own outcome from its delivery report. Whether the call failed
//! as a whole is the engine's decision, from these kinds
//! ([`outboxkit_core::whole_call_failure`]): `Unauthorized` or `Config` on any event, or
//! `Connection`, `Timeout`, `Unavailable` on every event (the broker is down or overloaded) —
//! then nothing is dead-lettered and no attempt is counted against the events.

use outboxkit_core::{Error, ErrorKind};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The relay error kind and retryability of a librdkafka error code.
pub fn code_kind(code: RDKafkaErrorCode) -> (ErrorKind, bool) {
    use RDKafkaErrorCode as C;
    match code {
        C::MessageSizeTooLarge | C::MessageBatchTooLarge | C::InvalidMessageSize => {
            (ErrorKind::MessageTooLarge, false)
        }
        C::InvalidMessage
        | C::InvalidRecord
        | C::InvalidTimestamp
        | C::UnsupportedForMessageFormat
        | C::PolicyViolation
        | C::BadMessage
        | C::InvalidArgument
        | C::KeySerialization
        | C::ValueSerialization => (ErrorKind::InvalidMessage, false),
        C::InvalidTopic => (ErrorKind::Unroutable, false),
        C::UnknownTopicOrPartition | C::UnknownTopic | C::UnknownPartition | C::UnknownTopicId => {
            (ErrorKind::Unroutable, true)
        }
        C::QueueFull
        | C::NotEnoughReplicas
        | C::NotEnoughReplicasAfterAppend
        | C::LeaderNotAvailable
        | C::NotLeaderForPartition
        | C::KafkaStorageError
        | C::ThrottlingQuotaExceeded
        | C::BrokerNotAvailable
        | C::ReplicaNotAvailable
        | C::FencedLeaderEpoch
        | C::UnknownLeaderEpoch
        | C::RebootstrapRequired
        | C::ISRInsufficient => (ErrorKind::Unavailable, true),
        c if needs_new_producer(c) => (ErrorKind::Unavailable, true),
        C::MessageTimedOut
        | C::OperationTimedOut
        | C::TimedOutQueue
        | C::RequestTimedOut
        | C::PurgeQueue
        | C::PurgeInflight => (ErrorKind::Timeout, true),
        C::BrokerTransportFailure
        | C::AllBrokersDown
        | C::Resolve
        | C::BrokerDestroy
        | C::DestroyBroker
        | C::NetworkException
        | C::SSL => (ErrorKind::Connection, true),
        C::TopicAuthorizationFailed
        | C::ClusterAuthorizationFailed
        | C::TransactionalIdAuthorizationFailed
        | C::GroupAuthorizationFailed
        | C::SaslAuthenticationFailed
        | C::UnsupportedSASLMechanism
        | C::IllegalSASLState
        | C::Authentication
        | C::UnacceptableCredential
        | C::SecurityDisabled
        | C::DelegationTokenAuthDisabled
        | C::DelegationTokenNotFound
        | C::DelegationTokenOwnerMismatch
        | C::DelegationTokenRequestNotAllowed
        | C::DelegationTokenAuthorizationFailed
        | C::DelegationTokenExpired => (ErrorKind::Unauthorized, false),
        C::InvalidRequiredAcks
        | C::UnsupportedCompressionType
        | C::UnsupportedVersion
        | C::UnsupportedFeature
        | C::NotConfigured => (ErrorKind::Config, false),
        _ => (ErrorKind::Other, true),
    }
}

/// Whether an error code means the producer's idempotence state is broken (or the client hit
/// a fatal error): the sink drops the producer and makes a new one (new producer id) before
/// the next call. Nothing is lost: every event of the failed call is retried.
pub fn needs_new_producer(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::Fatal
            | C::Fenced
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerEpoch
            | C::UnknownProducerId
            | C::InvalidProducerIdMapping
            | C::ProducerFenced
            | C::GaplessGuarantee
            | C::Inconsistent
    )
}

/// The librdkafka error code inside a client error, if it has one.
pub fn error_code(error: &KafkaError) -> Option<RDKafkaErrorCode> {
    match error {
        KafkaError::MessageProduction(code)
        | KafkaError::MetadataFetch(code)
        | KafkaError::Global(code)
        | KafkaError::Flush(code)
        | KafkaError::AdminOp(code) => Some(*code),
        KafkaError::Transaction(e) => Some(e.code()),
        _ => None,
    }
}

/// The relay's error for an error code the broker or librdkafka gave: kind and retryability
/// from [`code_kind`], the librdkafka text (`Broker: Message size too large`) as message.
pub fn classify_code(code: RDKafkaErrorCode) -> Error {
    let (kind, retryable) = code_kind(code);
    let error = Error::new(kind, describe(code));
    if retryable {
        error.temporary()
    } else {
        error.permanent()
    }
}

/// Turn a client error into the relay's error: [`classify_code`] of its code, when it has one.
pub fn classify(error: &KafkaError) -> Error {
    match error_code(error) {
        Some(code) => classify_code(code),
        None => match error {
            KafkaError::Canceled => Error::new(
                ErrorKind::Connection,
                "the Kafka producer was closed before the broker answered",
            ),
            KafkaError::ClientConfig(_, description, _, _) => Error::config(format!(
                "librdkafka refused the configuration: {description}"
            )),
            KafkaError::ClientCreation(text) => {
                Error::config(format!("cannot create the Kafka producer: {text}"))
            }
            other => Error::new(ErrorKind::Other, other.to_string()).temporary(),
        },
    }
}

/// librdkafka's text for a code followed by its name, e.g.
/// `Broker: Message size too large (MSG_SIZE_TOO_LARGE)`.
pub fn describe(code: RDKafkaErrorCode) -> String {
    // rdkafka displays a code as `MessageSizeTooLarge (Broker: Message size too large)`.
    let shown = code.to_string();
    let text = shown
        .strip_prefix(&format!("{code:?} ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or(&shown)
        .to_owned();
    match rdkafka::types::RDKafkaRespErr::try_from(code as i32) {
        Ok(raw) => {
            let name = format!("{raw:?}");
            let name = name
                .trim_start_matches("RD_KAFKA_RESP_ERR_")
                .trim_start_matches('_');
            format!("{text} ({name})")
        }
        Err(_) => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    fn check(code: RDKafkaErrorCode, kind: ErrorKind, retryable: bool) -> Error {
        let e = classify(&KafkaError::MessageProduction(code));
        assert_eq!(e.kind(), kind, "{code:?}: {e}");
        assert_eq!(e.is_retryable(), retryable, "{code:?}: {e}");
        e
    }

    #[test]
    fn too_large_is_rejected() {
        for code in [
            C::MessageSizeTooLarge,
            C::MessageBatchTooLarge,
            C::InvalidMessageSize,
        ] {
            check(code, ErrorKind::MessageTooLarge, false);
        }
        let e = check(C::MessageSizeTooLarge, ErrorKind::MessageTooLarge, false);
        assert_eq!(
            e.message(),
            "Broker: Message size too large (MSG_SIZE_TOO_LARGE)"
        );
    }

    #[test]
    fn invalid_messages_are_rejected() {
        for code in [
            C::InvalidMessage,
            C::InvalidRecord,
            C::InvalidTimestamp,
            C::UnsupportedForMessageFormat,
            C::PolicyViolation,
            C::BadMessage,
            C::InvalidArgument,
            C::KeySerialization,
            C::ValueSerialization,
        ] {
            check(code, ErrorKind::InvalidMessage, false);
        }
    }

    #[test]
    fn an_invalid_topic_name_is_rejected() {
        check(C::InvalidTopic, ErrorKind::Unroutable, false);
    }

    #[test]
    fn a_missing_topic_is_retried_per_event() {
        for code in [
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::UnknownPartition,
            C::UnknownTopicId,
        ] {
            check(code, ErrorKind::Unroutable, true);
        }
    }

    #[test]
    fn busy_brokers_are_unavailable() {
        for code in [
            C::QueueFull,
            C::NotEnoughReplicas,
            C::NotEnoughReplicasAfterAppend,
            C::LeaderNotAvailable,
            C::NotLeaderForPartition,
            C::KafkaStorageError,
            C::ThrottlingQuotaExceeded,
            C::BrokerNotAvailable,
            C::ReplicaNotAvailable,
            C::FencedLeaderEpoch,
            C::UnknownLeaderEpoch,
            C::RebootstrapRequired,
            C::ISRInsufficient,
        ] {
            check(code, ErrorKind::Unavailable, true);
            assert!(!needs_new_producer(code), "{code:?}");
        }
    }

    #[test]
    fn broken_idempotence_state_recreates_the_producer() {
        for code in [
            C::Fatal,
            C::Fenced,
            C::OutOfOrderSequenceNumber,
            C::InvalidProducerEpoch,
            C::UnknownProducerId,
            C::InvalidProducerIdMapping,
            C::ProducerFenced,
            C::GaplessGuarantee,
            C::Inconsistent,
        ] {
            check(code, ErrorKind::Unavailable, true);
            assert!(needs_new_producer(code), "{code:?}");
        }
    }

    #[test]
    fn timeouts_are_timeouts() {
        for code in [
            C::MessageTimedOut,
            C::OperationTimedOut,
            C::TimedOutQueue,
            C::RequestTimedOut,
            C::PurgeQueue,
            C::PurgeInflight,
        ] {
            check(code, ErrorKind::Timeout, true);
        }
        let e = check(C::MessageTimedOut, ErrorKind::Timeout, true);
        assert_eq!(e.message(), "Local: Message timed out (MSG_TIMED_OUT)");
    }

    #[test]
    fn transport_failures_are_connection_errors() {
        for code in [
            C::BrokerTransportFailure,
            C::AllBrokersDown,
            C::Resolve,
            C::BrokerDestroy,
            C::DestroyBroker,
            C::NetworkException,
            C::SSL,
        ] {
            check(code, ErrorKind::Connection, true);
        }
    }

    #[test]
    fn refused_credentials_are_unauthorized() {
        for code in [
            C::TopicAuthorizationFailed,
            C::ClusterAuthorizationFailed,
            C::TransactionalIdAuthorizationFailed,
            C::GroupAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::UnsupportedSASLMechanism,
            C::IllegalSASLState,
            C::Authentication,
            C::UnacceptableCredential,
            C::SecurityDisabled,
            C::DelegationTokenAuthDisabled,
            C::DelegationTokenNotFound,
            C::DelegationTokenOwnerMismatch,
            C::DelegationTokenRequestNotAllowed,
            C::DelegationTokenAuthorizationFailed,
            C::DelegationTokenExpired,
        ] {
            check(code, ErrorKind::Unauthorized, false);
        }
    }

    #[test]
    fn producer_settings_the_broker_refuses_are_config_errors() {
        for code in [
            C::InvalidRequiredAcks,
            C::UnsupportedCompressionType,
            C::UnsupportedVersion,
            C::UnsupportedFeature,
            C::NotConfigured,
        ] {
            check(code, ErrorKind::Config, false);
        }
    }

    #[test]
    fn anything_else_is_retried_as_other() {
        for code in [C::Unknown, C::Fail, C::OffsetOutOfRange] {
            check(code, ErrorKind::Other, true);
        }
    }

    #[test]
    fn client_errors_without_a_code() {
        let e = classify(&KafkaError::Canceled);
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert!(e.is_retryable());
        let e = classify(&KafkaError::ClientCreation("bad ssl.ca.location".into()));
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("bad ssl.ca.location"), "{e}");
        let e = classify(&KafkaError::NoMessageReceived);
        assert_eq!(e.kind(), ErrorKind::Other);
        assert!(e.is_retryable());
    }

    #[test]
    fn codes_inside_other_client_errors_are_classified_alike() {
        let e = classify(&KafkaError::MetadataFetch(C::AllBrokersDown));
        assert_eq!(e.kind(), ErrorKind::Connection);
        let e = classify(&KafkaError::MetadataFetch(C::OperationTimedOut));
        assert_eq!(e.kind(), ErrorKind::Timeout);
        let e = classify(&KafkaError::Global(C::Fatal));
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(
            error_code(&KafkaError::Flush(C::QueueFull)),
            Some(C::QueueFull)
        );
        assert_eq!(error_code(&KafkaError::Canceled), None);
    }
}
