//! `rediss://`: the rustls crypto provider, and failed handshakes explained to people.
//!
//! The `redis` crate builds its rustls `ClientConfig` with `ClientConfig::builder()`, which uses
//! the process-default crypto provider. rustls picks one by itself only when exactly one
//! provider is compiled in; in a full relay build both aws-lc-rs (from lapin and the AWS SDK)
//! and ring are, so there is no automatic default and the builder panics. Before a TLS client
//! is built, ring is installed as the process default unless some provider already is. Ring,
//! because it needs no C toolchain beyond what `cc` builds, and the SQL stores' sqlx
//! (`tls-rustls-ring-native-roots`) uses it too: one provider for the whole process.

use outboxkit_core::Error;
use redis::RedisError;

use crate::config::RedisStreamsConfig;
use crate::config::CONFIG_SECTION;

/// Install ring as rustls' process-default crypto provider unless one is installed already.
pub(crate) use outboxkit_core::tls::install_ring_provider as install_crypto_provider;

/// The rustls error of a failed TLS handshake inside a Redis error (behind the `Arc` its
/// `source()` returns, inside the handshake's `io::Error`).
pub(crate) fn rustls_error(error: &RedisError) -> Option<&rustls::Error> {
    outboxkit_core::tls::rustls_error(error)
}

/// A failed TLS handshake with Redis at `host_port`: a configuration error (not retried as if
/// the server were down), saying what the server presented and which key to fix.
pub(crate) fn certificate_error(
    error: &rustls::Error,
    config: &RedisStreamsConfig,
    host_port: &str,
) -> Error {
    outboxkit_core::tls::sink_certificate_error(
        error,
        CONFIG_SECTION,
        &format!("Redis at {host_port}"),
        config.tls.ca_file.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use std::io;

    use rustls::pki_types::{ServerName, UnixTime};

    use super::*;

    fn handshake(error: rustls::Error) -> RedisError {
        io::Error::new(io::ErrorKind::InvalidData, error).into()
    }

    fn config(ca_file: Option<&str>) -> RedisStreamsConfig {
        let mut config = RedisStreamsConfig::new("rediss://cache:6380");
        config.tls.ca_file = ca_file.map(Into::into);
        config
    }

    fn message(error: rustls::Error, config: &RedisStreamsConfig) -> String {
        let redis = handshake(error);
        let tls = rustls_error(&redis).expect("the rustls error is found");
        let e = certificate_error(tls, config, "cache:6380");
        assert_eq!(e.kind(), outboxkit_core::ErrorKind::Config, "{e}");
        assert!(!e.is_retryable());
        e.to_string()
    }

    #[test]
    fn the_rustls_error_is_found_in_the_redis_error() {
        assert!(rustls_error(&io::Error::other("plain").into()).is_none());
        let e: RedisError = rustls::Error::DecryptError.into();
        assert!(matches!(
            rustls_error(&e),
            Some(rustls::Error::DecryptError)
        ));
    }

    #[test]
    fn untrusted_certificates_name_the_ca_file() {
        let unknown = || rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let e = message(unknown(), &config(Some("/etc/relay/ca.pem")));
        assert_eq!(
            e,
            "the certificate of Redis at cache:6380 is not trusted by \
             sink.redis_streams.tls.ca_file (/etc/relay/ca.pem): that file does not hold the CA \
             that signed it; set sink.redis_streams.tls.ca_file to the server's CA"
        );
        let e = message(unknown(), &config(None));
        assert!(
            e.contains(
                "not trusted by the system's CA certificates: set sink.redis_streams.tls.ca_file"
            ),
            "{e}"
        );
    }

    #[test]
    fn wrong_names_and_dates_are_spelled_out() {
        let e = message(
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForNameContext {
                expected: ServerName::try_from("cache").unwrap(),
                presented: vec!["DnsName(\"db.elsewhere.test\")".to_owned()],
            }),
            &config(None),
        );
        assert!(
            e.contains(
                "is for db.elsewhere.test, not for cache (the host of sink.redis_streams.url)"
            ),
            "{e}"
        );
        let e = message(
            rustls::Error::InvalidCertificate(rustls::CertificateError::ExpiredContext {
                time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_700_000_000)),
                not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                    1_609_459_200,
                )),
            }),
            &config(None),
        );
        assert!(e.contains("expired on 2021-01-01"), "{e}");
        let e = message(
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
            &config(None),
        );
        assert!(e.contains("sink.redis_streams.tls.client_cert_file"), "{e}");
    }
}
