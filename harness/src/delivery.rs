//! What an independent consumer read back, and the delivery check.

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

/// Committed events: event id → (outbox row id, aggregate id).
pub type Committed = HashMap<Uuid, (i64, String)>;

/// One message as a broker side's independent consumer read it back.
#[derive(Debug, Clone, Default)]
pub struct Delivered {
    pub event_id: Uuid,
    pub aggregate_id: String,
    /// Where it was read: the stream, topic or queue.
    pub destination: String,
    /// The message body, byte for byte (decoded where the broker needs text: SQS `base64`).
    pub payload: Vec<u8>,
    /// What the broker carries beside the payload: stream entry fields, Kafka or AMQP headers,
    /// SQS message attributes.
    pub headers: HashMap<String, String>,
    /// What the consumer saw of the broker's own bookkeeping, by the side's names: Redis
    /// `entry_id`; Kafka `partition`, `offset`; RabbitMQ `routing_key`; SQS
    /// `message_group_id`.
    pub meta: HashMap<String, String>,
}

impl Delivered {
    /// A header (or field, or attribute), or "".
    pub fn header(&self, name: &str) -> &str {
        entry(&self.headers, name)
    }

    /// A `meta` entry, or "".
    pub fn meta(&self, name: &str) -> &str {
        entry(&self.meta, name)
    }
}

/// The entry `name` of a message's headers (fields, attributes...), or "" when it has none.
pub(crate) fn entry<'a>(entries: &'a HashMap<String, String>, name: &str) -> &'a str {
    entries.get(name).map(String::as_str).unwrap_or_default()
}

/// The result of checking delivered messages against what was committed.
#[derive(Debug, Default)]
pub struct DeliveryCheck {
    pub messages: usize,
    pub distinct: usize,
    pub duplicates: usize,
    pub missing: Vec<Uuid>,
    pub unexpected: Vec<Uuid>,
    pub order_violations: Vec<String>,
    /// What was found out about the missing events (see `Scenario::look_for_missing`), shown
    /// with the failure.
    pub findings: Vec<String>,
}

/// Every committed `event_id` must be delivered, nothing else may be, and per aggregate the
/// first occurrences must come in `id` order. `delivered` is in the order the consumer read it
/// (per destination, or per partition).
pub fn check_delivery(committed: &Committed, delivered: &[Delivered]) -> DeliveryCheck {
    let mut check = DeliveryCheck {
        messages: delivered.len(),
        ..DeliveryCheck::default()
    };
    let mut seen = HashSet::new();
    let mut last_id: HashMap<&str, i64> = HashMap::new();
    for m in delivered {
        if !seen.insert(m.event_id) {
            check.duplicates += 1;
            continue;
        }
        let Some((id, aggregate)) = committed.get(&m.event_id) else {
            check.unexpected.push(m.event_id);
            continue;
        };
        if let Some(prev) = last_id.insert(aggregate.as_str(), *id) {
            if prev > *id {
                check.order_violations.push(format!(
                    "aggregate {aggregate}: id {id} arrived after {prev}"
                ));
            }
        }
    }
    check.distinct = seen.len();
    check.missing = committed
        .keys()
        .filter(|id| !seen.contains(*id))
        .copied()
        .collect();
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(event_id: Uuid) -> Delivered {
        Delivered {
            event_id,
            ..Delivered::default()
        }
    }

    #[test]
    fn check_finds_missing_unexpected_duplicates_and_order_violations() {
        let ids: Vec<Uuid> = (0..4).map(|_| Uuid::now_v7()).collect();
        let committed: Committed = [
            (ids[0], (1, "a".to_owned())),
            (ids[1], (2, "a".to_owned())),
            (ids[2], (3, "b".to_owned())),
        ]
        .into_iter()
        .collect();
        // a: 2 before 1 (violation); 1 again (duplicate, not a violation); b missing; ids[3]
        // never committed.
        let delivered = [ids[1], ids[0], ids[1], ids[3]].map(message);
        let check = check_delivery(&committed, &delivered);
        assert_eq!(check.messages, 4);
        assert_eq!(check.distinct, 3);
        assert_eq!(check.duplicates, 1);
        assert_eq!(check.missing, vec![ids[2]]);
        assert_eq!(check.unexpected, vec![ids[3]]);
        assert_eq!(
            check.order_violations.len(),
            1,
            "{:?}",
            check.order_violations
        );
    }
}
