//! What the stores' writers' API shares: the columns an insert sets, the JSON text of payloads
//! and headers, and the errors of an insert.

use outboxkit_core::{Error, ErrorKind, Result};

use crate::classify::{classify, Dialect, Target};

/// The columns an insert into an outbox table sets, in the order of its values.
pub const INSERT_COLUMNS: &str =
    "event_id, aggregate_type, aggregate_id, event_type, payload, headers, destination";

/// An event's `payload` or `headers` (`what`) as JSON text.
pub fn to_json(value: &impl serde::Serialize, what: &str) -> Result<String> {
    serde_json::to_string(value).map_err(|e| {
        Error::new(
            ErrorKind::InvalidMessage,
            format!("event {what} cannot be serialized as JSON: {e}"),
        )
    })
}

/// The relay's error for a sqlx error of an insert into `target`'s table.
pub fn insert_error<D: Dialect>(error: sqlx::Error, target: &Target) -> Error {
    classify::<D>(error, target).context(format!("enqueueing into {}", target.table))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_that_are_not_json_are_invalid_messages() {
        assert_eq!(
            to_json(&serde_json::json!({"a": 1}), "payload").unwrap(),
            r#"{"a":1}"#
        );
        let not_json = std::collections::HashMap::from([((1, 2), "x")]);
        let e = to_json(&not_json, "headers").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidMessage);
        assert!(
            e.message()
                .starts_with("event headers cannot be serialized as JSON: "),
            "{e}"
        );
    }
}
