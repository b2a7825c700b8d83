//! Every HTTP answer and transport failure becomes an error kind, here and only here. The
//! retryability is the kind's default; whether a call failed as a whole is the engine's
//! decision (`outboxkit_core::whole_call_failure`), not the sink's.

use humantime::format_duration as human;
use outboxkit_core::{Error, ErrorKind};
use reqwest::StatusCode;

use crate::WebhookSinkConfig;

/// The kind of a non-2xx status; retryability follows the kind (`Config`, `Unauthorized`,
/// `Unroutable`, `MessageTooLarge` and `InvalidMessage` are not retried).
pub fn status_kind(status: StatusCode) -> ErrorKind {
    match status.as_u16() {
        300..=399 => ErrorKind::Config,
        401 | 403 | 407 => ErrorKind::Unauthorized,
        404 | 410 => ErrorKind::Unroutable,
        408 | 504 => ErrorKind::Timeout,
        413 => ErrorKind::MessageTooLarge,
        429 | 502 | 503 => ErrorKind::Unavailable,
        409 | 425 => ErrorKind::Other,
        400..=499 => ErrorKind::InvalidMessage,
        _ => ErrorKind::Other,
    }
}

/// The error for a non-2xx answer to `request` (`POST <redacted url>`), with a hint naming
/// the key to fix and the start of the response body.
pub fn status_error(status: StatusCode, request: &str, body: &str) -> Error {
    let kind = status_kind(status);
    let hint = match kind {
        ErrorKind::Config => {
            ": redirects are not followed: point sink.webhook.url at the final address"
        }
        ErrorKind::Unauthorized => ": credentials refused: check sink.webhook.headers",
        _ => "",
    };
    let sep = if body.is_empty() { "" } else { ": " };
    Error::new(kind, format!("{request}: HTTP {status}{hint}{sep}{body}"))
}

/// The error for a request that got no HTTP answer: `Timeout` or `Connection`.
pub fn transport_error(err: reqwest::Error, request: &str, config: &WebhookSinkConfig) -> Error {
    // reqwest's messages include the URL, which may carry credentials: drop it.
    let err = err.without_url();
    let mut cause: &dyn std::error::Error = &err;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let url = url::Url::parse(&config.url).ok();
    let host = url.and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)));
    let host = host.unwrap_or_default();
    let (kind, what) = match (err.is_timeout(), err.is_connect()) {
        (true, true) => {
            let limit = human(config.connect_timeout);
            let what = format!("connecting to {host} took longer than {limit}");
            (
                ErrorKind::Timeout,
                format!("{what} (sink.webhook.connect_timeout)"),
            )
        }
        (true, false) => {
            let limit = human(config.timeout);
            let what = format!("the answer took longer than {limit}");
            (ErrorKind::Timeout, format!("{what} (sink.webhook.timeout)"))
        }
        (false, true) => {
            let what = format!("cannot reach the webhook at {host} (sink.webhook.url)");
            (ErrorKind::Connection, format!("{what}: {cause}"))
        }
        (false, false) => {
            let what = "the connection failed before an answer arrived";
            (ErrorKind::Connection, format!("{what}: {cause}"))
        }
    };
    Error::new(kind, format!("{request}: {what}"))
}
