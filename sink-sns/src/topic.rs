//! Destinations: a topic name or ARN, and whether it is a FIFO topic.

pub use outboxkit_aws::sink::is_fifo_name;
use outboxkit_aws::sink::{check_name, malformed_destination};
use outboxkit_core::Result;

/// Longest topic name SNS allows, `.fifo` suffix included: 1 to 256 characters of
/// `A-Z a-z 0-9 - _`, plus the `.fifo` suffix of FIFO topics.
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
        let invalid = |why: &str| malformed_destination(&format!("SNS topic `{destination}`"), why);
        let check =
            |name: &str| check_name(name, "topic", MAX_TOPIC_NAME).map_err(|why| invalid(&why));
        if destination.starts_with("arn:") {
            // arn:<partition>:sns:<region>:<account>:<name>
            let parts: Vec<&str> = destination.split(':').collect();
            return match parts.as_slice() {
                ["arn", _partition, "sns", _region, _account, name] => {
                    check(name)?;
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
        check(destination)?;
        Ok(TopicRef::Name(destination.to_owned()))
    }

    /// The topic's name.
    pub(crate) fn name(&self) -> &str {
        match self {
            TopicRef::Arn { name, .. } | TopicRef::Name(name) => name,
        }
    }
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
        outboxkit_aws::testkit::assert_malformed_destinations(
            TopicRef::parse,
            &[
                "orders placed",
                "",
                ".fifo",
                "a.b",
                &"x".repeat(257),
                "arn:aws:sqs:eu-west-1:123456789012:queue",
                "arn:aws:sns:eu-west-1:topic",
            ],
            "SNS topic `",
        );
    }
}
