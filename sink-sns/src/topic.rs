//! Destinations: a topic name or ARN, and whether it is a FIFO topic.

pub use outboxkit_aws::sink::is_fifo_name;
use outboxkit_core::{Error, ErrorKind, Result};

/// Longest topic name SNS allows, `.fifo` suffix included.
const MAX_TOPIC_NAME: usize = 256;

/// A destination as written in the template or a row's `destination` column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicRef {
    /// A topic ARN, used as it is.
    Arn { arn: String, name: String },
    /// A topic name, resolved to its ARN once (`topic_arn_prefix`, or `ListTopics`).
    Name(String),
}

impl TopicRef {
    /// Parse a destination: `arn:...:sns:...` is a topic ARN, anything else a topic name. A
    /// malformed destination is a permanent error for the events routed to it.
    pub(crate) fn parse(destination: &str) -> Result<Self> {
        let invalid = |why: &str| {
            Error::new(
                ErrorKind::Unroutable,
                format!("SNS topic `{destination}`: {why}"),
            )
            .permanent()
        };
        if destination.starts_with("arn:") {
            // arn:<partition>:sns:<region>:<account>:<name>
            let parts: Vec<&str> = destination.split(':').collect();
            return match parts.as_slice() {
                ["arn", _partition, "sns", _region, _account, name] => {
                    check_name(name).map_err(|why| invalid(&why))?;
                    Ok(TopicRef::Arn {
                        arn: destination.to_owned(),
                        name: (*name).to_owned(),
                    })
                }
                _ => Err(invalid(
                    "not an SNS topic ARN (expected arn:aws:sns:REGION:ACCOUNT:NAME)",
                )),
            };
        }
        check_name(destination).map_err(|why| invalid(&why))?;
        Ok(TopicRef::Name(destination.to_owned()))
    }

    /// The topic's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            TopicRef::Arn { name, .. } | TopicRef::Name(name) => name,
        }
    }
}

/// SNS topic names: 1 to 256 characters of `A-Z a-z 0-9 - _`, plus the `.fifo`
/// suffix of FIFO topics (counted in the 256).
fn check_name(name: &str) -> std::result::Result<(), String> {
    outboxkit_aws::sink::check_name(name, "topic", MAX_TOPIC_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_arns() {
        assert_eq!(
            TopicRef::parse("orders").unwrap(),
            TopicRef::Name("orders".into())
        );
        assert!(is_fifo_name(TopicRef::parse("orders.fifo").unwrap().name()));
        let arn = "arn:aws:sns:eu-west-1:123456789012:billing.fifo";
        assert_eq!(
            TopicRef::parse(arn).unwrap(),
            TopicRef::Arn {
                arn: arn.into(),
                name: "billing.fifo".into()
            }
        );
    }

    #[test]
    fn malformed_destinations_are_permanent_errors_naming_the_topic() {
        for bad in [
            "orders placed",
            "",
            ".fifo",
            "a.b",
            &"x".repeat(257),
            "arn:aws:sqs:eu-west-1:123456789012:queue",
            "arn:aws:sns:eu-west-1:topic",
        ] {
            let e = TopicRef::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unroutable, "{bad}: {e}");
            assert!(!e.is_retryable(), "{bad}");
            assert!(e.message().starts_with("SNS topic `"), "{e}");
        }
    }
}
