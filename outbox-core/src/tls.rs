//! TLS for adapters built on rustls (feature `tls`): one crypto provider for the process, and
//! a refused handshake explained to people.
//!
//! **The provider.** The relay uses ring: it needs no C toolchain beyond what `cc` builds, and
//! sqlx hands it to rustls explicitly. Some client crates (redis) build their rustls
//! configuration from the process default, and checking a server against the system's CA
//! certificates does too. rustls picks a default by itself only when exactly one provider is
//! compiled in; a full relay build also has aws-lc-rs (through lapin and the AWS SDK), so there
//! is none and those calls would panic. [`install_ring_provider`] is called before any TLS
//! client is built.
//!
//! **The errors.** A refused server certificate or a TLS alert is a configuration error at
//! start — never retried as if the server were down — that says what the server presented and
//! which setting to fix ([`certificate_error`]).

use std::error::Error as StdError;
use std::io;
use std::sync::Arc;

use crate::Error;

/// Make ring the process's default rustls crypto provider, unless one is installed already.
pub fn install_ring_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread installing one is as good as winning it.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The rustls error inside a client's error, wherever the chain holds it: directly, inside an
/// `io::Error` (what tokio-rustls returns from a handshake), or behind an `Arc` (redis).
pub fn rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next: Option<&'a (dyn StdError + 'static)> = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = error.downcast_ref::<io::Error>().and_then(|e| e.get_ref()) {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
        }
        if let Some(arc) = error.downcast_ref::<Arc<dyn StdError + Send + Sync>>() {
            let inner: &'a (dyn StdError + 'static) = arc.as_ref();
            if let Some(tls) = rustls_error(inner) {
                return Some(tls);
            }
        }
        next = error.source();
    }
    None
}

/// How an adapter's messages name the server and its TLS settings.
#[derive(Debug, Clone, Copy)]
pub struct TlsSettings<'a> {
    /// The server: `PostgreSQL at db:5432`.
    pub at: &'a str,
    /// The key of the server's URL: `store.url`.
    pub url_key: &'a str,
    /// The TLS settings as a whole, for other failures: `store.url, sslmode`.
    pub tls_key: &'a str,
    /// The CA setting as a place: `store.url's sslrootcert`.
    pub ca_key: &'a str,
    /// The CA setting as something to set: `sslrootcert in store.url`.
    pub ca_setting: &'a str,
    /// The CA file in use, if one is set.
    pub ca_file: Option<&'a str>,
    /// The client certificate settings: `store.url: sslcert and sslkey`.
    pub client_cert: &'a str,
    /// The URL option that gives the name the certificate must hold, when the URL sets one
    /// apart from its host (MySQL's `tls-sni-servername`); `None`: the URL's host.
    pub name_option: Option<&'a str>,
}

/// A name the certificate presents, as rustls writes it (`DnsName("db.example")`,
/// `IpAddress(10.0.0.5)`), bare.
fn san(name: &str) -> &str {
    if let (Some(start), Some(end)) = (name.find('"'), name.rfind('"')) {
        if end > start {
            return &name[start + 1..end];
        }
    }
    match (name.find('('), name.strip_suffix(')')) {
        (Some(start), Some(inner)) => &inner[start + 1..],
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

/// [`certificate_error`] for a sink whose TLS is set by its URL `<section>.url` and the table
/// `[<section>.tls]` (`ca_file`, `client_cert_file` and `client_key_file`); `at` is the
/// server (`Redis at cache:6380`), `ca_file` the CA file in use.
pub fn sink_certificate_error(
    error: &rustls::Error,
    section: &str,
    at: &str,
    ca_file: Option<&std::path::Path>,
) -> Error {
    let ca = format!("{section}.tls.ca_file");
    let ca_file = ca_file.map(|f| f.display().to_string());
    certificate_error(
        error,
        &TlsSettings {
            at,
            url_key: &format!("{section}.url"),
            tls_key: &format!("{section}.tls"),
            ca_key: &ca,
            ca_setting: &ca,
            ca_file: ca_file.as_deref(),
            client_cert: &format!(
                "{section}.tls.client_cert_file and {section}.tls.client_key_file"
            ),
            name_option: None,
        },
    )
}

/// A refused TLS handshake as a configuration error naming what to fix: a certificate not
/// trusted by the CA file (or the system's CAs), issued for another host, expired or not yet
/// valid, or an alert from the server (most likely a missing client certificate).
pub fn certificate_error(error: &rustls::Error, s: &TlsSettings<'_>) -> Error {
    use rustls::CertificateError as C;
    let TlsSettings {
        at, url_key: url, ..
    } = *s;
    // Where the name checked against the certificate comes from, and what to change.
    let (name_from, fix) = match s.name_option {
        Some(option) => (
            format!("{url}'s {option}"),
            format!(
                "set {option} to a name the certificate holds, or have it reissued for that name"
            ),
        ),
        None => (
            format!("the host of {url}"),
            "connect by a name the certificate holds, or have it reissued for this host".to_owned(),
        ),
    };
    let text = match error {
        rustls::Error::InvalidCertificate(cert) => match cert {
            C::UnknownIssuer | C::BadSignature | C::InvalidPurpose => match s.ca_file {
                Some(file) => format!(
                    "the certificate of {at} is not trusted by {} ({file}): that file does not \
                     hold the CA that signed it; set {} to the server's CA",
                    s.ca_key, s.ca_setting
                ),
                None => format!(
                    "the certificate of {at} is not trusted by the system's CA certificates: \
                     set {} to the CA that signed it",
                    s.ca_setting
                ),
            },
            C::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the certificate of {at} is for {}, not for {} ({name_from}): {fix}",
                presented
                    .iter()
                    .map(|name| san(name))
                    .collect::<Vec<_>>()
                    .join(", "),
                expected.to_str(),
            ),
            C::NotValidForName => {
                format!("the certificate of {at} is not for {name_from}: {fix}")
            }
            C::ExpiredContext { not_after, .. } => format!(
                "the certificate of {at} expired on {} ({url}): renew the server's certificate \
                 (docs/OPERATIONS.md, certificate rotation)",
                day(*not_after)
            ),
            C::Expired => format!(
                "the certificate of {at} has expired ({url}): renew the server's certificate \
                 (docs/OPERATIONS.md, certificate rotation)"
            ),
            C::NotValidYetContext { not_before, .. } => format!(
                "the certificate of {at} is not valid before {} ({url}): check the clocks of \
                 this machine and of the server",
                day(*not_before)
            ),
            other => format!(
                "the certificate of {at} was refused ({}): {other:?}",
                s.tls_key
            ),
        },
        rustls::Error::AlertReceived(alert) => format!(
            "{at} refused the TLS handshake ({alert:?}): it may require a client certificate \
             signed by a CA it trusts ({})",
            s.client_cert
        ),
        rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType) => format!(
            "{at} answered in plain text, not TLS ({}): connect to the port where it takes TLS, \
             or without TLS",
            s.tls_key
        ),
        other => format!("TLS with {at} failed ({}): {other}", s.tls_key),
    };
    Error::config(text)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::pki_types::{ServerName, UnixTime};
    use rustls::CertificateError as C;

    use super::*;
    use crate::ErrorKind;

    const SETTINGS: TlsSettings<'static> = TlsSettings {
        at: "PostgreSQL at db:5432",
        url_key: "store.url",
        tls_key: "store.url, sslmode",
        ca_key: "store.url's sslrootcert",
        ca_setting: "sslrootcert in store.url",
        ca_file: Some("/etc/relay/ca.pem"),
        client_cert: "store.url: sslcert and sslkey",
        name_option: None,
    };

    fn message(error: rustls::Error, settings: &TlsSettings<'_>) -> String {
        let e = certificate_error(&error, settings);
        assert_eq!(e.kind(), ErrorKind::Config, "{e}");
        assert!(!e.is_retryable());
        e.message().to_owned()
    }

    #[test]
    fn the_rustls_error_is_found_wherever_the_chain_holds_it() {
        let plain = io::Error::other("plain");
        assert!(rustls_error(&plain).is_none());
        let direct = rustls::Error::DecryptError;
        assert!(matches!(
            rustls_error(&direct),
            Some(rustls::Error::DecryptError)
        ));
        let in_io = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert!(rustls_error(&in_io).is_some());
        let arc: Arc<dyn StdError + Send + Sync> = Arc::new(in_io);
        assert!(rustls_error(&arc).is_some());
    }

    #[test]
    fn untrusted_certificates_name_the_ca_setting() {
        let unknown = || rustls::Error::InvalidCertificate(C::UnknownIssuer);
        assert_eq!(
            message(unknown(), &SETTINGS),
            "the certificate of PostgreSQL at db:5432 is not trusted by store.url's sslrootcert \
             (/etc/relay/ca.pem): that file does not hold the CA that signed it; set sslrootcert \
             in store.url to the server's CA"
        );
        let system = TlsSettings {
            ca_file: None,
            ..SETTINGS
        };
        assert!(message(unknown(), &system)
            .contains("not trusted by the system's CA certificates: set sslrootcert in store.url"));
    }

    #[test]
    fn names_dates_and_alerts_are_spelled_out() {
        let e = message(
            rustls::Error::InvalidCertificate(C::NotValidForNameContext {
                expected: ServerName::try_from("db").unwrap(),
                presented: vec![
                    "DnsName(\"db.elsewhere.test\")".to_owned(),
                    "IpAddress(10.0.0.5)".to_owned(),
                ],
            }),
            &SETTINGS,
        );
        assert!(
            e.contains("is for db.elsewhere.test, 10.0.0.5, not for db (the host of store.url)"),
            "{e}"
        );
        // A URL that names the certificate's name apart from its host (MySQL's SNI option).
        let sni = TlsSettings {
            name_option: Some("tls-sni-servername"),
            ..SETTINGS
        };
        let e = message(
            rustls::Error::InvalidCertificate(C::NotValidForNameContext {
                expected: ServerName::try_from("db.example").unwrap(),
                presented: vec!["DnsName(\"db.elsewhere.test\")".to_owned()],
            }),
            &sni,
        );
        assert!(
            e.contains(
                "is for db.elsewhere.test, not for db.example (store.url's tls-sni-servername): \
                 set tls-sni-servername to a name the certificate holds"
            ),
            "{e}"
        );
        let e = message(
            rustls::Error::InvalidCertificate(C::ExpiredContext {
                time: UnixTime::since_unix_epoch(Duration::from_secs(1_700_000_000)),
                not_after: UnixTime::since_unix_epoch(Duration::from_secs(1_609_459_200)),
            }),
            &SETTINGS,
        );
        assert!(e.contains("expired on 2021-01-01 (store.url)"), "{e}");
        let e = message(
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
            &SETTINGS,
        );
        assert!(
            e.contains("(CertificateRequired)") && e.contains("(store.url: sslcert and sslkey)"),
            "{e}"
        );
        let e = message(rustls::Error::DecryptError, &SETTINGS);
        assert!(
            e.starts_with("TLS with PostgreSQL at db:5432 failed (store.url, sslmode)"),
            "{e}"
        );
        // TLS to a port that speaks plain text (amqps:// to 5672).
        let e = message(
            rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
            &SETTINGS,
        );
        assert_eq!(
            e,
            "PostgreSQL at db:5432 answered in plain text, not TLS (store.url, sslmode): connect \
             to the port where it takes TLS, or without TLS"
        );
    }
}
