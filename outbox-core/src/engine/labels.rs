//! The `destination` label of the per-destination counters, bounded.
//!
//! A template with `{aggregate_id}` in it (a NATS subject or a Redis stream per aggregate) has
//! as many destinations as aggregates. Every label value is a series the metrics recorder keeps
//! for the life of the process and writes at every scrape, so an unbounded label would grow
//! the relay's memory and its `/metrics` page with every new aggregate. The first
//! `relay.destination_labels` destinations a relay counts keep a label of their own; the
//! others are counted together under [`OTHER`].

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tracing::warn;

/// The label of the destinations past the limit.
pub(crate) const OTHER: &str = "(other)";

#[derive(Debug)]
pub(crate) struct DestinationLabels {
    limit: usize,
    /// The destinations that have a label of their own; full once it holds `limit`.
    labelled: Mutex<HashSet<String>>,
    /// Whether the warning that the limit is reached was logged.
    warned: AtomicBool,
}

impl DestinationLabels {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit,
            labelled: Mutex::new(HashSet::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// The label `destination` is counted under.
    pub(crate) fn label(&self, destination: String) -> String {
        let mut labelled = self.labelled.lock().unwrap_or_else(|p| p.into_inner());
        if labelled.contains(&destination) {
            return destination;
        }
        if labelled.len() < self.limit {
            labelled.insert(destination.clone());
            return destination;
        }
        drop(labelled);
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(
                limit = self.limit,
                destination = %destination,
                "more destinations than relay.destination_labels: the metrics count this one \
                 and every further one under destination=\"{OTHER}\" (a template with \
                 {{aggregate_id}} has one destination per aggregate)"
            );
        }
        OTHER.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_destinations_keep_their_label_the_rest_share_one() {
        let labels = DestinationLabels::new(2);
        assert_eq!(labels.label("orders.1".into()), "orders.1");
        assert_eq!(labels.label("orders.2".into()), "orders.2");
        assert_eq!(labels.label("orders.3".into()), OTHER);
        assert_eq!(labels.label("orders.4".into()), OTHER);
        // A destination labelled before the limit keeps its label.
        assert_eq!(labels.label("orders.1".into()), "orders.1");
        // An empty destination is a destination like any other before the limit...
        let labels = DestinationLabels::new(1);
        assert_eq!(labels.label(String::new()), "");
        assert_eq!(labels.label("a".into()), OTHER);
        assert_eq!(labels.label(String::new()), "");
        // ...and zero labels every destination `(other)`.
        let labels = DestinationLabels::new(0);
        assert_eq!(labels.label("orders".into()), OTHER);
    }
}
