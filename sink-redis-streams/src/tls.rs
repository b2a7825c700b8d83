//! `rediss://`: the rustls crypto provider, and failed handshakes explained to people.
//!
//! The `redis` crate builds its rustls `ClientConfig` with `ClientConfig::builder()`, which uses
//! the process-default crypto provider. rustls picks one by itself only when exactly one
//! provider is compiled in; in a full relay build both aws-lc-rs (from lapin and the AWS SDK)
//! and ring are, so there is no automatic default and the builder panics. Before a TLS client
//! is built, ring is installed as the process default unless some provider already is. Ring,
//! because it needs no C toolchain beyond what `cc` builds, and the SQL stores' sqlx
//! (`tls-rustls-ring-native-roots`) uses it too: one provider for the whole process.

use std::io;

use outboxkit_core::Error;
use redis::RedisError;

use crate::config::RedisStreamsConfig;
use crate::config::CONFIG_SECTION;

/// Install ring as rustls' process-default crypto provider unless one is installed already.
pub(crate) fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing the race to another thread that installed one is as good as winning it.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The rustls error of a failed TLS handshake inside a Redis error: the handshake's
/// `io::Error` (from tokio-rustls) holds it, and the Redis error holds that I/O error behind an
/// `Arc`, which is what its `source()` returns.
pub(crate) fn rustls_error(error: &RedisError) -> Option<&rustls::Error> {
    let source = std::error::Error::source(error)?;
    let inner: &(dyn std::error::Error + 'static) =
        match source.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>() {
            Some(arc) => arc.as_ref(),
            None => source,
        };
    if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    inner
        .downcast_ref::<io::Error>()
        .and_then(|e| e.get_ref())
        .and_then(|e| e.downcast_ref::<rustls::Error>())
}

/// A name the certificate presents, as rustls writes it (`DnsName("cache.example")`), bare.
fn san(name: &str) -> &str {
    match (name.find('"'), name.rfind('"')) {
        (Some(start), Some(end)) if end > start => &name[start + 1..end],
        _ => name,
    }
}

/// `YYYY-MM-DD` of a certificate time.
fn day(time: rustls::pki_types::UnixTime) -> String {
    let secs = i64::try_from(time.as_secs()).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.format("%Y-%m-%d").to_string())
        .unwrap_or_else(|| format!("{secs} s after 1970"))
}

/// A failed TLS handshake with Redis at `host_port`: a configuration error (not retried as if
/// the server were down), saying what the server presented and which key to fix.
pub(crate) fn certificate_error(
    error: &rustls::Error,
    config: &RedisStreamsConfig,
    host_port: &str,
) -> Error {
    use rustls::CertificateError as C;
    let at = format!("Redis at {host_port}");
    let ca = format!("{CONFIG_SECTION}.tls.ca_file");
    let url = format!("{CONFIG_SECTION}.url");
    let text = match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer | C::BadSignature | C::InvalidPurpose => match &config.tls.ca_file {
                Some(file) => format!(
                    "the certificate of {at} is not trusted by {ca} ({}): that file does not \
                     hold the CA that signed it; set {ca} to the server's CA",
                    file.display()
                ),
                None => format!(
                    "the certificate of {at} is not trusted by the system's CA certificates: \
                     set {ca} to the CA that signed it"
                ),
            },
            C::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the certificate of {at} is for {}, not for {} (the host of {url}): connect by a \
                 name the certificate holds",
                presented
                    .iter()
                    .map(|name| san(name))
                    .collect::<Vec<_>>()
                    .join(", "),
                expected.to_str(),
            ),
            C::NotValidForName => format!(
                "the certificate of {at} is not for the host of {url}: connect by a name the \
                 certificate holds"
            ),
            C::ExpiredContext { not_after, .. } => format!(
                "the certificate of {at} expired on {} ({url}): renew the server's certificate",
                day(*not_after)
            ),
            C::Expired => format!(
                "the certificate of {at} has expired ({url}): renew the server's certificate"
            ),
            C::NotValidYetContext { not_before, .. } => format!(
                "the certificate of {at} is not valid before {} ({url}): check the clocks of \
                 this machine and of the server",
                day(*not_before)
            ),
            other => format!("the certificate of {at} was refused ({ca}): {other:?}"),
        },
        rustls::Error::AlertReceived(alert) => format!(
            "{at} refused the TLS handshake ({alert:?}): it may require a client certificate \
             signed by a CA it trusts ({CONFIG_SECTION}.tls.client_cert_file and \
             {CONFIG_SECTION}.tls.client_key_file)"
        ),
        other => format!("TLS with {at} failed ({CONFIG_SECTION}.tls): {other}"),
    };
    Error::config(text)
}

#[cfg(test)]
mod tests {
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
