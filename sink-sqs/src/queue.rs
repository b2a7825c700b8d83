//! Destinations: a queue name, URL or ARN, and whether it is a FIFO queue.

pub use outboxkit_aws::sink::is_fifo_name;
use outboxkit_aws::sink::{check_name, malformed_destination};
use outboxkit_core::Result;

/// Longest queue name SQS allows, `.fifo` suffix included: 1 to 80 characters of
/// `A-Z a-z 0-9 - _`, plus the `.fifo` suffix of FIFO queues.
const MAX_QUEUE_NAME: usize = 80;

/// A destination as written in the template or a row's `destination` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum QueueRef {
    /// A queue URL, used as it is.
    Url { url: String, name: String },
    /// A queue name, resolved once with `GetQueueUrl` (for `owner`'s account when given).
    Name { name: String, owner: Option<String> },
}

impl QueueRef {
    /// Parse a destination: `https://...` / `http://...` is a queue URL, `arn:...:sqs:...` a
    /// queue ARN, anything else a queue name. A malformed destination is a permanent error
    /// for the events routed to it.
    pub(crate) fn parse(destination: &str) -> Result<Self> {
        let invalid = |why: &str| malformed_destination(&format!("SQS queue `{destination}`"), why);
        let check =
            |name: &str| check_name(name, "queue", MAX_QUEUE_NAME).map_err(|why| invalid(&why));
        if destination.starts_with("https://") || destination.starts_with("http://") {
            let url = url::Url::parse(destination)
                .map_err(|e| invalid(&format!("not a valid queue URL ({e})")))?;
            let name = url
                .path_segments()
                .and_then(|mut segments| segments.next_back())
                .unwrap_or_default()
                .to_owned();
            check_name(&name, "queue", MAX_QUEUE_NAME).map_err(|why| {
                invalid(&format!(
                    "the last path segment of a queue URL must be the queue name: {why}"
                ))
            })?;
            return Ok(QueueRef::Url {
                url: destination.to_owned(),
                name,
            });
        }
        if let Some(rest) = destination.strip_prefix("arn:") {
            // arn:<partition>:sqs:<region>:<account>:<name>
            let parts: Vec<&str> = rest.split(':').collect();
            match parts.as_slice() {
                [_partition, "sqs", _region, account, name] => {
                    check(name)?;
                    let owner = (!account.is_empty()).then(|| (*account).to_owned());
                    return Ok(QueueRef::Name {
                        name: (*name).to_owned(),
                        owner,
                    });
                }
                _ => {
                    return Err(invalid(
                        "not an SQS queue ARN (expected arn:aws:sqs:REGION:ACCOUNT:NAME)",
                    ))
                }
            }
        }
        check(destination)?;
        Ok(QueueRef::Name {
            name: destination.to_owned(),
            owner: None,
        })
    }

    /// The queue's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            QueueRef::Url { name, .. } | QueueRef::Name { name, .. } => name,
        }
    }

    /// FIFO queues are the ones whose name ends in `.fifo`.
    pub(crate) fn is_fifo(&self) -> bool {
        is_fifo_name(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_urls_and_arns() {
        assert_eq!(
            QueueRef::parse("orders").unwrap(),
            QueueRef::Name {
                name: "orders".into(),
                owner: None
            }
        );
        let fifo = QueueRef::parse("orders.fifo").unwrap();
        assert!(fifo.is_fifo());
        assert!(!QueueRef::parse("orders").unwrap().is_fifo());
        let url = "http://127.0.0.1:4566/queue/us-east-1/000000000000/orders.fifo";
        let parsed = QueueRef::parse(url).unwrap();
        assert_eq!(parsed.name(), "orders.fifo");
        assert!(parsed.is_fifo());
        assert!(matches!(parsed, QueueRef::Url { url: u, .. } if u == url));
        let aws = "https://sqs.eu-west-1.amazonaws.com/123456789012/billing";
        assert_eq!(QueueRef::parse(aws).unwrap().name(), "billing");
        assert_eq!(
            QueueRef::parse("arn:aws:sqs:eu-west-1:123456789012:billing.fifo").unwrap(),
            QueueRef::Name {
                name: "billing.fifo".into(),
                owner: Some("123456789012".into())
            }
        );
    }

    #[test]
    fn malformed_destinations_are_permanent_errors_naming_the_queue() {
        outboxkit_aws::testkit::assert_malformed_destinations(
            QueueRef::parse,
            &[
                "orders placed",
                "",
                ".fifo",
                "caf\u{e9}",
                "a.b",
                &"x".repeat(81),
                "arn:aws:sns:eu-west-1:123456789012:topic",
                "https://sqs.eu-west-1.amazonaws.com/",
            ],
            "SQS queue `",
        );
        let longest = format!("{}.fifo", "x".repeat(75));
        assert!(QueueRef::parse(&longest).is_ok());
    }
}
