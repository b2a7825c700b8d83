//! The error table: every HTTP answer and every transport failure becomes an
//! [`outboxkit_core::Error`] with a kind and a retryability, decided here once. The engine never
//! looks at status codes or messages.
//!
//! | answer | kind | outcome | whole call when every event of the call failed so |
//! |---|---|---|---|
//! | 2xx | — | `Published` | — |
//! | 3xx (redirects are not followed) | `Config` | `Reject` | yes |
//! | 401, 403, 407 | `Unauthorized` | `Reject` | yes |
//! | 404, 410 | `Unroutable` | `Reject` | no |
//! | 408 | `Timeout` | `Retry` | yes |
//! | 409 (`Idempotency-Key` still in use, IETF draft) | `Other` | `Retry` | no |
//! | 413 | `MessageTooLarge` | `Reject` | no |
//! | 425 | `Other` | `Retry` | no |
//! | 429 | `Unavailable` | `Retry` (`Retry-After` honoured) | yes |
//! | any other 4xx (400, 405, 422...) | `InvalidMessage` | `Reject` | no |
//! | 502, 503 | `Unavailable` | `Retry` (`Retry-After` honoured) | yes |
//! | 504 | `Timeout` | `Retry` | yes |
//! | 500 and any other 5xx | `Other` | `Retry` | no |
//! | 1xx or unknown status | `Other` | `Retry` | no |
//! | connection refused, reset, DNS, TLS | `Connection` | `Retry` | yes |
//! | connect or response timeout | `Timeout` | `Retry` | yes |
//! | request could not be built | `InvalidMessage` | `Reject` | no |
//!
//! "Whole call": when no event of a `publish` call was published and every failure is of such a
//! kind, the endpoint as a whole is down, throttling or refusing the credentials, and the call
//! returns `Err` — the engine backs off without counting an attempt against any event, so an
//! outage never parks good events as dead. A 500 stays per event: it is what a consumer that
//! chokes on one particular event answers, and that event must eventually be parked.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outboxkit_core::{Error, ErrorKind, Outcome, Result};
use reqwest::StatusCode;

use crate::config::{WebhookSinkConfig, CONFIG_SECTION};

/// What the endpoint answered, as far as classification needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    /// `Retry-After`, parsed (seconds or HTTP date).
    pub retry_after: Option<Duration>,
    /// `Location` of a redirect, redacted.
    pub location: Option<String>,
    /// The start of the response body, on one line.
    pub body_excerpt: String,
}

/// The relay error kind of a non-2xx status; `None` for 2xx.
pub fn status_kind(status: StatusCode) -> Option<ErrorKind> {
    let code = status.as_u16();
    Some(match code {
        200..=299 => return None,
        300..=399 => ErrorKind::Config,
        401 | 403 | 407 => ErrorKind::Unauthorized,
        404 | 410 => ErrorKind::Unroutable,
        408 | 504 => ErrorKind::Timeout,
        409 | 425 => ErrorKind::Other,
        413 => ErrorKind::MessageTooLarge,
        429 | 502 | 503 => ErrorKind::Unavailable,
        400..=499 => ErrorKind::InvalidMessage,
        _ => ErrorKind::Other,
    })
}

/// The error for a non-2xx answer to `request` (`POST <redacted url>`); `None` for 2xx.
/// Retryability: 408, 409, 425, 429 and 5xx are retried, every other 4xx and 3xx is not.
pub fn classify_status(answer: &Answer, request: &str) -> Option<Error> {
    let kind = status_kind(answer.status)?;
    let code = answer.status.as_u16();
    let retryable = !(300..=499).contains(&code) || matches!(code, 408 | 409 | 425 | 429);
    let mut message = format!("{request}: HTTP {}", answer.status);
    if let Some(after) = answer.retry_after {
        message.push_str(&format!(
            " (Retry-After {})",
            humantime::format_duration(after)
        ));
    }
    let hint = match kind {
        ErrorKind::Config => format!(
            "redirects are not followed (a POST must not turn into a GET): point \
             {CONFIG_SECTION}.url at the final address{}",
            answer
                .location
                .as_deref()
                .map(|l| format!(" (Location: {l})"))
                .unwrap_or_default()
        ),
        ErrorKind::Unauthorized => {
            format!("credentials refused: check {CONFIG_SECTION}.headers (e.g. Authorization)")
        }
        ErrorKind::Unroutable => "no endpoint at this URL for the event's destination".to_owned(),
        ErrorKind::MessageTooLarge => "the endpoint refuses a body this large".to_owned(),
        _ if code == 409 => "the endpoint is still processing this Idempotency-Key".to_owned(),
        _ => String::new(),
    };
    if !hint.is_empty() {
        message.push_str(": ");
        message.push_str(&hint);
    }
    if !answer.body_excerpt.is_empty() {
        message.push_str(": ");
        message.push_str(&answer.body_excerpt);
    }
    let error = Error::new(kind, message);
    Some(if retryable {
        error.temporary()
    } else {
        error.permanent()
    })
}

/// The error for a request that got no HTTP answer.
pub fn classify_transport(err: reqwest::Error, request: &str, config: &WebhookSinkConfig) -> Error {
    // reqwest's messages include the URL, which may carry credentials: drop it.
    let err = err.without_url();
    let reason = root_cause(&err);
    if err.is_builder() {
        return Error::new(
            ErrorKind::InvalidMessage,
            format!("{request}: the request could not be built: {reason}"),
        )
        .permanent();
    }
    if err.is_timeout() {
        let message = if err.is_connect() {
            format!(
                "{request}: connecting to {} took longer than {} ({CONFIG_SECTION}.connect_timeout)",
                config.host_port(),
                humantime::format_duration(config.connect_timeout)
            )
        } else {
            format!(
                "{request}: no answer within {} ({CONFIG_SECTION}.timeout)",
                humantime::format_duration(config.timeout)
            )
        };
        return Error::new(ErrorKind::Timeout, message);
    }
    let message = if err.is_connect() {
        format!(
            "{request}: cannot reach the webhook at {} ({CONFIG_SECTION}.url): {reason}",
            config.host_port()
        )
    } else {
        format!("{request}: the connection failed before an answer arrived: {reason}")
    };
    Error::new(ErrorKind::Connection, message)
}

/// The innermost cause's text (`Connection refused (os error 111)`).
fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    let text = last.to_string();
    if text.is_empty() {
        err.to_string()
    } else {
        text
    }
}

/// Whether a failure of this kind, on every event of a call, fails the call as a whole: the
/// endpoint is unreachable, overloaded or refusing the credentials, not the events.
pub fn fails_whole_call(error: &Error) -> bool {
    matches!(
        error.kind(),
        ErrorKind::Connection
            | ErrorKind::Timeout
            | ErrorKind::Unavailable
            | ErrorKind::Unauthorized
            | ErrorKind::Config
    )
}

/// What happened to one event's request.
#[derive(Debug)]
pub struct Attempt {
    /// `Ok` when the endpoint answered 2xx.
    pub result: Result<()>,
    /// The endpoint's `Retry-After`, if it sent one with a failure.
    pub retry_after: Option<Duration>,
}

impl Attempt {
    /// A 2xx answer.
    pub fn published() -> Self {
        Self {
            result: Ok(()),
            retry_after: None,
        }
    }

    /// A failure without `Retry-After`.
    pub fn failed(error: Error) -> Self {
        Self {
            result: Err(error),
            retry_after: None,
        }
    }
}

/// The result of a whole `publish` call.
#[derive(Debug)]
pub struct Decision {
    /// One outcome per event, or the call's failure.
    pub outcomes: Result<Vec<Outcome>>,
    /// When the call failed as a whole and the endpoint asked to wait: how long (the longest
    /// `Retry-After` of the call).
    pub pause: Option<Duration>,
}

/// Turn the attempts of one call into its result: outcomes per event, or `Err` when nothing was
/// published and every failure [fails the whole call](fails_whole_call).
pub fn decide(attempts: Vec<Attempt>) -> Decision {
    let total = attempts.len();
    let all_whole_call = total > 0
        && attempts
            .iter()
            .all(|a| matches!(&a.result, Err(e) if fails_whole_call(e)));
    if all_whole_call {
        let pause = attempts.iter().filter_map(|a| a.retry_after).max();
        let first = attempts
            .into_iter()
            .find_map(|a| a.result.err())
            .unwrap_or_else(|| Error::new(ErrorKind::Other, "no attempt"));
        let error = if total > 1 {
            first.context(format!("all {total} requests of the call failed, first"))
        } else {
            first
        };
        return Decision {
            outcomes: Err(error),
            pause,
        };
    }
    let outcomes = attempts
        .into_iter()
        .map(|a| match a.result {
            Ok(()) => Outcome::Published,
            Err(e) => Outcome::from_error(e),
        })
        .collect();
    Decision {
        outcomes: Ok(outcomes),
        pause: None,
    }
}

/// `Retry-After: 120` or `Retry-After: Wed, 21 Oct 2015 07:28:00 GMT`, as a duration from
/// `now` (a date in the past is zero); `None` when unparsable.
pub fn parse_retry_after(value: &str, now: DateTime<Utc>) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let date = DateTime::parse_from_rfc2822(value).ok()?;
    let delta = date.with_timezone(&Utc) - now;
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16) -> Answer {
        Answer {
            status: StatusCode::from_u16(code).unwrap(),
            retry_after: None,
            location: None,
            body_excerpt: String::new(),
        }
    }

    fn check(code: u16, kind: ErrorKind, retryable: bool, whole_call: bool) -> Error {
        let e = classify_status(&answer(code), "POST http://h/x")
            .unwrap_or_else(|| panic!("{code} is a failure"));
        assert_eq!(e.kind(), kind, "{code}: {e}");
        assert_eq!(e.is_retryable(), retryable, "{code}: {e}");
        assert_eq!(fails_whole_call(&e), whole_call, "{code}: {e}");
        assert!(e.message().starts_with("POST http://h/x: HTTP "), "{e}");
        e
    }

    #[test]
    fn success_statuses_are_published() {
        for code in [200, 201, 202, 204, 299] {
            assert!(classify_status(&answer(code), "POST x").is_none(), "{code}");
        }
    }

    #[test]
    fn redirects_are_configuration_errors() {
        for code in [301, 302, 303, 307, 308] {
            check(code, ErrorKind::Config, false, true);
        }
        let mut moved = answer(308);
        moved.location = Some("https://new.example.com/in".into());
        let e = classify_status(&moved, "POST http://h/x").unwrap();
        assert!(e.message().contains("sink.webhook.url"), "{e}");
        assert!(
            e.message().contains("Location: https://new.example.com/in"),
            "{e}"
        );
    }

    #[test]
    fn refused_credentials_are_unauthorized() {
        for code in [401, 403, 407] {
            let e = check(code, ErrorKind::Unauthorized, false, true);
            assert!(e.message().contains("sink.webhook.headers"), "{e}");
        }
    }

    #[test]
    fn missing_endpoints_are_unroutable() {
        for code in [404, 410] {
            check(code, ErrorKind::Unroutable, false, false);
        }
    }

    #[test]
    fn request_timeout_is_retried() {
        check(408, ErrorKind::Timeout, true, true);
    }

    #[test]
    fn conflict_is_retried() {
        let e = check(409, ErrorKind::Other, true, false);
        assert!(e.message().contains("Idempotency-Key"), "{e}");
    }

    #[test]
    fn payload_too_large_is_rejected() {
        check(413, ErrorKind::MessageTooLarge, false, false);
    }

    #[test]
    fn too_early_is_retried() {
        check(425, ErrorKind::Other, true, false);
    }

    #[test]
    fn too_many_requests_is_retried_and_keeps_retry_after() {
        let mut throttled = answer(429);
        throttled.retry_after = Some(Duration::from_secs(30));
        throttled.body_excerpt = "slow down".into();
        let e = classify_status(&throttled, "POST http://h/x").unwrap();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(fails_whole_call(&e));
        assert_eq!(
            e.message(),
            "POST http://h/x: HTTP 429 Too Many Requests (Retry-After 30s): slow down"
        );
    }

    #[test]
    fn other_client_errors_are_rejected() {
        for code in [400, 405, 411, 415, 418, 422, 451, 499] {
            check(code, ErrorKind::InvalidMessage, false, false);
        }
    }

    #[test]
    fn bad_gateway_and_unavailable_are_retried() {
        for code in [502, 503] {
            check(code, ErrorKind::Unavailable, true, true);
        }
    }

    #[test]
    fn gateway_timeout_is_retried() {
        check(504, ErrorKind::Timeout, true, true);
    }

    #[test]
    fn other_server_errors_are_retried_per_event() {
        for code in [500, 501, 505, 507, 599] {
            check(code, ErrorKind::Other, true, false);
        }
    }

    #[test]
    fn informational_and_unknown_statuses_are_retried() {
        for code in [102, 600, 999] {
            check(code, ErrorKind::Other, true, false);
        }
    }

    fn config() -> WebhookSinkConfig {
        WebhookSinkConfig {
            timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
            ..WebhookSinkConfig::new("http://127.0.0.1:1")
        }
    }

    fn client() -> reqwest::Client {
        reqwest::Client::builder()
            .timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .no_proxy()
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn refused_connection_is_a_connection_error() {
        // A port that was just free: nothing listens there.
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let url = format!("http://user:s3cr3t@127.0.0.1:{port}/x?token=s3cr3t");
        let err = client().post(&url).send().await.unwrap_err();
        let e = classify_transport(err, "POST http://127.0.0.1/x", &config());
        assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
        assert!(e.is_retryable());
        assert!(fails_whole_call(&e));
        assert!(e.message().contains("cannot reach the webhook"), "{e}");
        assert!(e.message().contains("sink.webhook.url"), "{e}");
        assert!(!e.full_message().contains("s3cr3t"), "{e}");
    }

    #[tokio::test]
    async fn silent_endpoint_is_a_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and read, never answer.
        let silent = tokio::spawn(async move {
            let (_socket, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let err = client()
            .post(format!("http://{addr}/x"))
            .send()
            .await
            .unwrap_err();
        let e = classify_transport(err, "POST x", &config());
        silent.abort();
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(e.is_retryable());
        assert!(fails_whole_call(&e));
        assert!(e.message().contains("sink.webhook.timeout"), "{e}");
    }

    #[tokio::test]
    async fn connection_closed_without_answer_is_a_connection_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let closer = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.unwrap();
            drop(socket);
        });
        let err = client()
            .post(format!("http://{addr}/x"))
            .body("{}")
            .send()
            .await
            .unwrap_err();
        closer.abort();
        let e = classify_transport(err, "POST x", &config());
        assert_eq!(e.kind(), ErrorKind::Connection, "{e}");
        assert!(e.is_retryable());
    }

    #[tokio::test]
    async fn unbuildable_request_is_rejected() {
        let err = client().post("http://").send().await.unwrap_err();
        let e = classify_transport(err, "POST x", &config());
        assert_eq!(e.kind(), ErrorKind::InvalidMessage, "{e}");
        assert!(!e.is_retryable());
        assert!(!fails_whole_call(&e));
    }

    fn status_attempt(code: u16, retry_after: Option<u64>) -> Attempt {
        let mut a = answer(code);
        a.retry_after = retry_after.map(Duration::from_secs);
        match classify_status(&a, "POST x") {
            None => Attempt::published(),
            Some(e) => Attempt {
                result: Err(e),
                retry_after: a.retry_after,
            },
        }
    }

    #[test]
    fn mixed_answers_give_one_outcome_per_event() {
        let decision = decide(vec![
            status_attempt(200, None),
            status_attempt(429, Some(5)),
            status_attempt(500, None),
            status_attempt(404, None),
        ]);
        let outcomes = decision.outcomes.unwrap();
        assert!(outcomes[0].is_published());
        assert!(matches!(&outcomes[1], Outcome::Retry(e) if e.kind() == ErrorKind::Unavailable));
        assert!(matches!(&outcomes[2], Outcome::Retry(e) if e.kind() == ErrorKind::Other));
        assert!(matches!(&outcomes[3], Outcome::Reject(e) if e.kind() == ErrorKind::Unroutable));
        assert_eq!(decision.pause, None, "only a call that failed whole pauses");
    }

    #[test]
    fn throttled_everywhere_fails_the_call_and_pauses() {
        let decision = decide(vec![
            status_attempt(429, Some(2)),
            status_attempt(503, Some(7)),
            status_attempt(503, None),
        ]);
        let e = decision.outcomes.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(
            e.message()
                .starts_with("all 3 requests of the call failed, first: POST x: HTTP 429"),
            "{e}"
        );
        assert_eq!(decision.pause, Some(Duration::from_secs(7)));
    }

    #[test]
    fn unreachable_everywhere_fails_the_call() {
        let refused = || Attempt::failed(Error::new(ErrorKind::Connection, "refused"));
        let decision = decide(vec![refused(), refused()]);
        assert_eq!(decision.outcomes.unwrap_err().kind(), ErrorKind::Connection);
        assert_eq!(decision.pause, None);
        let decision = decide(vec![refused()]);
        assert_eq!(decision.outcomes.unwrap_err().message(), "refused");
    }

    #[test]
    fn refused_credentials_everywhere_fail_the_call() {
        let decision = decide(vec![status_attempt(401, None), status_attempt(403, None)]);
        assert_eq!(
            decision.outcomes.unwrap_err().kind(),
            ErrorKind::Unauthorized
        );
    }

    #[test]
    fn server_errors_everywhere_stay_per_event() {
        // A consumer that fails on these very events: count attempts, park them eventually.
        let decision = decide(vec![status_attempt(500, None), status_attempt(500, None)]);
        let outcomes = decision.outcomes.unwrap();
        assert!(outcomes.iter().all(|o| matches!(o, Outcome::Retry(_))));
        // A whole-call failure mixed with a message failure: outcomes, so the bad one parks.
        let decision = decide(vec![status_attempt(503, None), status_attempt(422, None)]);
        let outcomes = decision.outcomes.unwrap();
        assert!(matches!(&outcomes[0], Outcome::Retry(_)));
        assert!(matches!(&outcomes[1], Outcome::Reject(_)));
    }

    #[test]
    fn empty_call_has_no_outcomes() {
        let decision = decide(Vec::new());
        assert!(decision.outcomes.unwrap().is_empty());
    }

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = DateTime::parse_from_rfc3339("2015-10-21T07:27:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
    }
}
