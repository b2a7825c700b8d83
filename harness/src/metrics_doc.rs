//! The relay's metrics as the README's *Metrics* table documents them, and the check that a
//! relay's `/metrics` keeps to it: an alert or a dashboard written from the table must find
//! every series under the name, type and labels the table gives.

use std::collections::{BTreeMap, BTreeSet};

/// One documented metric: its type (`counter`, `gauge`, `histogram`) and its labels besides
/// `pipeline`, which every metric carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentedMetric {
    pub kind: String,
    pub labels: Vec<String>,
}

/// The metrics of a markdown table whose rows start `` | `outbox_name{label,label}` | type | ``.
pub fn metrics_table(markdown: &str) -> BTreeMap<String, DocumentedMetric> {
    let mut metrics = BTreeMap::new();
    for line in markdown.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let Some(metric) = cells.get(1).and_then(|c| c.strip_prefix("`outbox_")) else {
            continue;
        };
        let metric = format!("outbox_{}", metric.trim_end_matches('`'));
        let (name, labels) = match metric.split_once('{') {
            Some((name, labels)) => (
                name.to_owned(),
                labels
                    .trim_end_matches('}')
                    .split(',')
                    .map(|l| l.trim().to_owned())
                    .collect(),
            ),
            None => (metric, Vec::new()),
        };
        let kind = cells.get(2).copied().unwrap_or_default().to_owned();
        let previous = metrics.insert(name.clone(), DocumentedMetric { kind, labels });
        assert!(previous.is_none(), "{name} has two rows");
    }
    metrics
}

/// The README's *Metrics* table.
pub fn documented_metrics() -> BTreeMap<String, DocumentedMetric> {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("\n## Metrics\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README has a Metrics section");
    metrics_table(section)
}

/// The documented metric a series name belongs to: itself, or the histogram whose `_bucket`,
/// `_sum` or `_count` it is.
pub fn metric_of<'a>(
    series: &str,
    documented: &'a BTreeMap<String, DocumentedMetric>,
) -> Option<(&'a String, &'a DocumentedMetric)> {
    documented.get_key_value(series).or_else(|| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .filter_map(|suffix| series.strip_suffix(suffix))
            .filter_map(|base| documented.get_key_value(base))
            .find(|(_, m)| m.kind == "histogram")
    })
}

/// One sample line of the Prometheus text format: its series name and label names.
fn sample(line: &str) -> Option<(String, Vec<String>)> {
    let end = line.find(['{', ' '])?;
    let name = line[..end].to_owned();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut rest = &line[end + 1..];
        loop {
            rest = rest.trim_start_matches(',');
            if rest.starts_with('}') {
                break;
            }
            let (label, after) = rest.split_once("=\"")?;
            labels.push(label.to_owned());
            // The value, up to its closing quote: `\"` and `\\` are escapes inside it.
            let mut chars = after.char_indices();
            let close = loop {
                match chars.next()? {
                    (_, '\\') => {
                        chars.next()?;
                    }
                    (i, '"') => break i,
                    _ => {}
                }
            };
            rest = &after[close + 1..];
        }
    }
    Some((name, labels))
}

/// Panics unless every `outbox_` metric of `exposition` (a relay's `/metrics`) has a row in the
/// README's table, is of the type the row says, carries `pipeline` on every series, and no label
/// the row does not name (besides `le` on a histogram's buckets). Returns the names of the
/// documented metrics it holds, for a test to say which it saw.
pub fn assert_metrics_documented(exposition: &str) -> BTreeSet<String> {
    let documented = documented_metrics();
    let mut seen = BTreeSet::new();
    for line in exposition.lines().filter(|l| l.contains("outbox_")) {
        if let Some(typed) = line.strip_prefix("# TYPE ") {
            let (name, kind) = typed.split_once(' ').expect("# TYPE name kind");
            let metric = documented
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not in the README's Metrics table"));
            assert_eq!(metric.kind, kind, "the type of {name}");
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, labels) = sample(line).unwrap_or_else(|| panic!("not a sample line: {line}"));
        let (name, metric) = metric_of(&series, &documented)
            .unwrap_or_else(|| panic!("{series} is not in the README's Metrics table: {line}"));
        assert!(
            labels.iter().any(|l| l == "pipeline"),
            "{line}: every metric carries `pipeline`"
        );
        for label in &labels {
            let allowed = label == "pipeline"
                || metric.labels.contains(label)
                || (label == "le" && series.ends_with("_bucket"));
            assert!(
                allowed,
                "{line}: label `{label}` is not documented for {name} (README: {:?})",
                metric.labels
            );
        }
        seen.insert(name.clone());
    }
    seen
}

/// [`assert_metrics_documented`] on the `/metrics` of the relay listening on `port`.
pub fn scrape_documented(port: u16) -> BTreeSet<String> {
    let (code, exposition) = crate::http_get(port, "/metrics").expect("GET /metrics");
    assert_eq!(code, 200, "{exposition}");
    assert_metrics_documented(&exposition)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_table_is_read_with_types_and_labels() {
        let documented = documented_metrics();
        let published = &documented["outbox_events_published_total"];
        assert_eq!(published.kind, "counter");
        assert_eq!(published.labels, ["sink", "destination"]);
        assert!(documented["outbox_pending_events"].labels.is_empty());
        assert_eq!(documented["outbox_commit_to_ack_seconds"].kind, "histogram");
    }

    #[test]
    fn samples_give_their_labels_whatever_their_values_hold() {
        assert_eq!(
            sample(r#"outbox_x{pipeline="a,b",error="say \"no\", \\ then }"} 1"#),
            Some((
                "outbox_x".to_owned(),
                vec!["pipeline".to_owned(), "error".to_owned()]
            ))
        );
        assert_eq!(sample("outbox_y 2"), Some(("outbox_y".to_owned(), vec![])));
    }

    #[test]
    fn an_undocumented_label_or_metric_fails() {
        let documented = "outbox_pending_events{pipeline=\"p\"} 1\n\
             outbox_commit_to_ack_seconds_bucket{pipeline=\"p\",le=\"0.1\"} 3\n";
        assert_eq!(
            assert_metrics_documented(documented)
                .into_iter()
                .collect::<Vec<_>>(),
            ["outbox_commit_to_ack_seconds", "outbox_pending_events"]
        );
        for bad in [
            "outbox_pending_events{pipeline=\"p\",shard=\"3\"} 1",
            "outbox_pending_events 1",
            "outbox_not_a_metric{pipeline=\"p\"} 1",
            "# TYPE outbox_pending_events counter",
        ] {
            let failed = std::panic::catch_unwind(|| assert_metrics_documented(bad));
            assert!(failed.is_err(), "accepted: {bad}");
        }
    }

    /// The OPERATIONS metrics table (its section *Metrics*, whatever follows).
    fn operations() -> &'static str {
        include_str!("../../docs/OPERATIONS.md")
    }

    #[test]
    fn the_readme_operations_and_the_code_name_the_same_metrics() {
        let readme = documented_metrics();
        let operations = metrics_table(operations());
        assert_eq!(
            readme.keys().collect::<Vec<_>>(),
            operations.keys().collect::<Vec<_>>(),
            "the README's and OPERATIONS' metrics tables"
        );
        for (name, metric) in &readme {
            assert_eq!(metric, &operations[name], "{name}: README and OPERATIONS");
        }
        let code: BTreeSet<&str> = outboxkit_core::metrics::ALL.iter().copied().collect();
        assert_eq!(
            readme.keys().map(String::as_str).collect::<BTreeSet<_>>(),
            code,
            "the README's table and outboxkit_core::metrics::ALL"
        );
    }

    /// Every `expr` of the alerts in OPERATIONS names documented metrics (a histogram's series
    /// by their suffixes), and groups or matches only by labels those metrics carry.
    #[test]
    fn the_documented_alerts_use_documented_metrics_and_labels() {
        let documented = documented_metrics();
        let rules = operations()
            .split("```yaml")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("OPERATIONS has the alert rules in a yaml block");
        let exprs: Vec<&str> = rules
            .lines()
            .filter_map(|l| l.trim().strip_prefix("expr: "))
            .collect();
        assert!(exprs.len() >= 10, "{rules}");
        for expr in exprs {
            let words: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .collect();
            let series: Vec<&str> = words
                .iter()
                .copied()
                .filter(|w| w.starts_with("outbox_"))
                .collect();
            assert!(!series.is_empty(), "{expr}");
            let mut labels: BTreeSet<&str> = ["pipeline"].into();
            for name in series {
                let (_, metric) = metric_of(name, &documented)
                    .unwrap_or_else(|| panic!("{expr}: {name} is not a documented metric"));
                labels.extend(metric.labels.iter().map(String::as_str));
                if name.ends_with("_bucket") {
                    labels.insert("le");
                }
            }
            // `by (a, b)` and `{a=~"..."}`: the labels it groups or matches by.
            let grouped = expr
                .split("by (")
                .skip(1)
                .flat_map(|rest| rest.split(')').next().unwrap_or_default().split(','));
            let matched = expr.split('{').skip(1).flat_map(|rest| {
                let inside = rest.split('}').next().unwrap_or_default();
                inside
                    .split(',')
                    .map(|m| m.split(['=', '!']).next().unwrap_or_default())
            });
            for label in grouped.chain(matched).map(str::trim) {
                assert!(
                    labels.contains(label),
                    "{expr}: label `{label}` is not one the metric carries ({labels:?})"
                );
            }
        }
    }
}
