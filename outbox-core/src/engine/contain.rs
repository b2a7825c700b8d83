//! Panics in code the relay calls but does not own end as errors, and so do sink calls that
//! never return. A panic in a sink (a third party's too: one bad event may trigger it), or a
//! call that does not answer within its limit, fails the call as a whole, like an outage: the
//! relay backs off and tries again, dead-letters nothing and loses nothing. A panic in a store
//! call of the background loops is one failed round of that loop. Any other panic in the
//! relay's loop stops the relay with an error, its session dropped (its shards go to the
//! other relays) and its handle no longer alive, instead of leaving a relay that does nothing
//! and still says it runs.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Poll;
use std::time::Duration;

use crate::error::{panic_message, Error, ErrorKind, Result};

/// How long a sink call may take: the limit, where it is set, and what follows when it passes.
pub(super) struct Limit<'a> {
    pub(super) limit: Duration,
    pub(super) set_by: &'a str,
    pub(super) then: &'a str,
}

/// The `kind` sink's `call` (`publish`, `check`) within `limit`: a panic in it, or no answer
/// in time, is an error of the whole call.
pub(super) async fn sink_call<T>(
    kind: &str,
    call: &str,
    limit: &Limit<'_>,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit.limit, caught(future)).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(panic)) => Err(sink_panicked(kind, call, &panic)),
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!(
                "the {kind} sink did not answer {call} within {} ({}): {}",
                humantime::format_duration(limit.limit),
                limit.set_by,
                limit.then
            ),
        )),
    }
}

/// A store call off the worker's path (`what`: `purging published rows`): a panic in it is
/// an error, so that one bad round does not end its loop for good.
pub(super) async fn store_call<T>(
    what: &str,
    future: impl Future<Output = Result<T>>,
) -> Result<T> {
    caught(future).await.unwrap_or_else(|panic| {
        Err(Error::new(
            ErrorKind::Other,
            format!("the store panicked {what}: {panic} (a bug in the store)"),
        ))
    })
}

/// Run `future`; a panic in it is `Err` with the panic's message.
pub(super) async fn caught<F: Future>(future: F) -> Result<F::Output, String> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(panic.as_ref()).to_owned())),
        },
    )
    .await
}

/// The error for a panic in the `kind` sink's `call` (`publish`, `check`): the call failed as
/// a whole, and is tried again after the backoff.
fn sink_panicked(kind: &str, call: &str, panic: &str) -> Error {
    Error::new(
        ErrorKind::Other,
        format!(
            "the {kind} sink panicked in {call}: {panic} (a bug in the sink; its events stay \
             pending and are tried again)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_in_a_future_is_its_message() {
        assert_eq!(caught(async { 7 }).await, Ok(7));
        let fixed = caught(async { panic!("fixed text") }).await;
        assert_eq!(fixed, Err("fixed text".to_owned()));
        let n = 3;
        let formatted = caught(async move {
            tokio::task::yield_now().await;
            panic!("after a wait: {n}")
        })
        .await;
        assert_eq!(formatted, Err("after a wait: 3".to_owned()));
        let other = caught(async { std::panic::panic_any(42u8) }).await;
        assert_eq!(other, Err("a panic with no message".to_owned()));
    }
}
