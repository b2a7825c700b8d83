//! What an AWS sink keeps besides its service's client: the template and the CloudEvents
//! mapping, where it sends (for messages), and the destinations it has resolved (a queue name to
//! its URL, a topic name to its ARN), cached; and the rules of queue and topic names.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard};

use outboxkit_core::cloudevents::CloudEvents;
use outboxkit_core::{DestinationTemplate, Error, ErrorKind, OutboxEvent, Result};

/// Resolved destinations kept at most; past it the cache starts over (rows with ever-new
/// destinations must not grow memory without bound).
pub const MAX_CACHED_TARGETS: usize = 10_000;

/// A destination resolved: what requests are sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The queue's or topic's name, for messages (`orders.fifo`).
    pub name: String,
    /// What requests are sent to, and are grouped by: a queue URL, a topic ARN.
    pub address: String,
    /// A FIFO queue or topic (its name ends in `.fifo`).
    pub fifo: bool,
}

/// The parts of an AWS sink that are not its service's.
#[derive(Debug)]
pub struct SinkCore {
    /// The destination template (`queue`, `topic`).
    pub template: DestinationTemplate,
    /// The CloudEvents mapping (`None` with `format = "raw"`).
    pub cloudevents: Option<CloudEvents>,
    /// The template's destination when it does not depend on the event.
    pub fixed_destination: Option<String>,
    /// `us-east-1 at http://127.0.0.1:4566`, for messages.
    pub location: String,
    targets: Mutex<HashMap<String, Target>>,
}

impl SinkCore {
    /// A sink's core, with no destination resolved yet.
    pub fn new(
        template: DestinationTemplate,
        cloudevents: Option<CloudEvents>,
        location: String,
    ) -> Self {
        Self {
            fixed_destination: template.fixed().map(str::to_owned),
            template,
            cloudevents,
            location,
            targets: Mutex::default(),
        }
    }

    /// The destination of `event`: the template rendered (or the row's `destination`).
    pub fn destination(&self, event: &OutboxEvent) -> String {
        self.template.render(event)
    }

    /// `destination` resolved: from the cache, else by `look_up` (then cached; a failed look-up
    /// is not).
    pub async fn resolve(
        &self,
        destination: &str,
        look_up: impl Future<Output = Result<Target>>,
    ) -> Result<Target> {
        if let Some(target) = self.targets().get(destination) {
            return Ok(target.clone());
        }
        let target = look_up.await?;
        let mut targets = self.targets();
        if targets.len() >= MAX_CACHED_TARGETS {
            targets.clear();
        }
        targets.insert(destination.to_owned(), target.clone());
        Ok(target)
    }

    /// Forget the resolution of `destination` (its target answered that it does not exist).
    pub fn forget(&self, destination: &str) {
        self.targets().remove(destination);
    }

    fn targets(&self) -> MutexGuard<'_, HashMap<String, Target>> {
        self.targets.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `name` names a FIFO queue or topic.
pub fn is_fifo_name(name: &str) -> bool {
    name.ends_with(".fifo")
}

/// The error of a destination the sink cannot use (`what` names it: ``SQS queue `a b` ``):
/// unroutable and permanent, so that the events routed to it are parked at once.
pub fn malformed_destination(what: &str, why: &str) -> Error {
    Error::new(ErrorKind::Unroutable, format!("{what}: {why}")).permanent()
}

/// SQS queue and SNS topic names (`noun`: `queue`, `topic`): 1 to `max_len` characters of
/// `A-Z a-z 0-9 - _`, plus the `.fifo` suffix of FIFO ones (counted in `max_len`).
pub fn check_name(name: &str, noun: &str, max_len: usize) -> std::result::Result<(), String> {
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    if base.is_empty() {
        return Err(format!("a {noun} name must not be empty"));
    }
    if name.len() > max_len {
        return Err(format!(
            "a {noun} name has at most {max_len} characters, this one {}",
            name.len()
        ));
    }
    if let Some(bad) = base
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '-' || *c == '_'))
    {
        return Err(format!(
            "a {noun} name may only hold letters, digits, `-` and `_` (and end in `.fifo`), not {bad:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(address: &str) -> Target {
        Target {
            name: "orders".to_owned(),
            address: address.to_owned(),
            fifo: false,
        }
    }

    #[tokio::test]
    async fn resolutions_are_cached_until_forgotten_and_failures_never() {
        let core = SinkCore::new(
            DestinationTemplate::parse("orders").unwrap(),
            None,
            "us-east-1".to_owned(),
        );
        assert_eq!(core.fixed_destination.as_deref(), Some("orders"));
        let missing = core
            .resolve("orders", async {
                Err(Error::new(ErrorKind::Unroutable, "no"))
            })
            .await;
        assert!(missing.is_err());
        let first = core.resolve("orders", async { Ok(target("a")) }).await;
        assert_eq!(first.unwrap(), target("a"));
        let cached = core.resolve("orders", async { Ok(target("b")) }).await;
        assert_eq!(cached.unwrap(), target("a"));
        core.forget("orders");
        let again = core.resolve("orders", async { Ok(target("b")) }).await;
        assert_eq!(again.unwrap(), target("b"));
    }

    #[test]
    fn malformed_destinations_are_unroutable_for_good() {
        let e = malformed_destination("SQS queue `a b`", "why");
        assert_eq!(e.kind(), ErrorKind::Unroutable);
        assert!(!e.is_retryable());
        assert_eq!(e.message(), "SQS queue `a b`: why");
    }

    #[test]
    fn names_are_checked_naming_the_noun() {
        assert_eq!(check_name("orders.fifo", "queue", 80), Ok(()));
        assert!(is_fifo_name("orders.fifo"));
        assert!(!is_fifo_name("orders"));
        assert_eq!(
            check_name(".fifo", "topic", 256).unwrap_err(),
            "a topic name must not be empty"
        );
        assert_eq!(
            check_name(&"x".repeat(81), "queue", 80).unwrap_err(),
            "a queue name has at most 80 characters, this one 81"
        );
        assert_eq!(
            check_name("a.b", "queue", 80).unwrap_err(),
            "a queue name may only hold letters, digits, `-` and `_` (and end in `.fifo`), not '.'"
        );
    }
}
