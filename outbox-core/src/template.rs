//! Destination templates: `{aggregate_type}.{event_type}` and friends.

use crate::error::{Error, Result};
use crate::model::OutboxEvent;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    AggregateType,
    AggregateId,
    EventType,
}

/// A parsed destination template. Placeholders: `{aggregate_type}`, `{aggregate_id}`,
/// `{event_type}`; `{{` and `}}` are literal braces. A row's own `destination` wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationTemplate {
    source: String,
    parts: Vec<Part>,
}

impl DestinationTemplate {
    /// Parse a template; unknown placeholders and unbalanced braces are errors naming them.
    pub fn parse(template: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    let mut closed = false;
                    for c in chars.by_ref() {
                        if c == '}' {
                            closed = true;
                            break;
                        }
                        name.push(c);
                    }
                    if !closed {
                        return Err(Error::config(format!(
                            "destination template `{template}`: `{{` without a closing `}}`"
                        )));
                    }
                    let part = match name.trim() {
                        "aggregate_type" => Part::AggregateType,
                        "aggregate_id" => Part::AggregateId,
                        "event_type" => Part::EventType,
                        other => {
                            return Err(Error::config(format!(
                            "destination template `{template}`: unknown placeholder `{{{other}}}` \
                                 (known: {{aggregate_type}}, {{aggregate_id}}, {{event_type}})"
                        )))
                        }
                    };
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(part);
                }
                '}' => {
                    return Err(Error::config(format!(
                        "destination template `{template}`: `}}` without an opening `{{`"
                    )))
                }
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if parts.is_empty() {
            return Err(Error::config("destination template is empty"));
        }
        Ok(Self {
            source: template.to_owned(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.source
    }

    /// The destination of `event`: its own `destination` if set, else the rendered template.
    pub fn render(&self, event: &OutboxEvent) -> String {
        if let Some(dest) = event.destination.as_deref().filter(|d| !d.is_empty()) {
            return dest.to_owned();
        }
        self.render_fields(event, |value, out| out.push_str(value))
    }

    /// The template filled with `event`'s fields, each written by `write` (which may escape
    /// it); the event's own `destination` plays no part.
    pub fn render_fields(&self, event: &OutboxEvent, write: impl Fn(&str, &mut String)) -> String {
        let mut out = String::with_capacity(self.source.len() + 16);
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::AggregateType => write(&event.aggregate_type, &mut out),
                Part::AggregateId => write(&event.aggregate_id, &mut out),
                Part::EventType => write(&event.event_type, &mut out),
            }
        }
        out
    }

    /// The destination of every event without one of its own, when the template has no
    /// placeholder (`orders.fifo`): what a sink's `check` can look up before any event exists.
    pub fn fixed(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [Part::Literal(destination)] => Some(destination),
            _ => None,
        }
    }

    /// The template with every placeholder written as `stand_in`: what an adapter checks of the
    /// destinations it can render before any event exists (`orders/{aggregate_type}` with
    /// `"x"` gives `orders/x`, which no Kafka topic name can be).
    pub fn with_placeholders_as(&self, stand_in: &str) -> String {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Literal(s) => s.as_str(),
                Part::AggregateType | Part::AggregateId | Part::EventType => stand_in,
            })
            .collect()
    }
}

impl std::str::FromStr for DestinationTemplate {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn event(destination: Option<&str>) -> OutboxEvent {
        OutboxEvent {
            event_id: Uuid::nil(),
            destination: destination.map(Into::into),
            ..OutboxEvent::new(1, "order", "42", "OrderConfirmed", serde_json::json!({}))
        }
    }

    #[test]
    fn a_template_without_placeholders_is_fixed() {
        let t = |s: &str| DestinationTemplate::parse(s).unwrap();
        assert_eq!(t("orders.fifo").fixed(), Some("orders.fifo"));
        assert_eq!(t("{{literal}}").fixed(), Some("{literal}"));
        for varying in ["{aggregate_type}", "app-{event_type}", "q-{aggregate_id}"] {
            assert_eq!(t(varying).fixed(), None, "{varying}");
        }
    }

    #[test]
    fn renders_placeholders_and_literals() {
        let t = DestinationTemplate::parse("{aggregate_type}.{event_type}").unwrap();
        assert_eq!(t.render(&event(None)), "order.OrderConfirmed");
        let t = DestinationTemplate::parse("app-{aggregate_type}-{aggregate_id}").unwrap();
        assert_eq!(t.render(&event(None)), "app-order-42");
        let t = DestinationTemplate::parse("{{x}}{aggregate_type}").unwrap();
        assert_eq!(t.render(&event(None)), "{x}order");
    }

    #[test]
    fn row_destination_wins() {
        let t = DestinationTemplate::parse("{aggregate_type}").unwrap();
        assert_eq!(t.render(&event(Some("audit"))), "audit");
        assert_eq!(t.render(&event(Some(""))), "order");
    }

    #[test]
    fn bad_templates_name_the_problem() {
        let e = DestinationTemplate::parse("{aggregate}").unwrap_err();
        assert!(
            e.message().contains("unknown placeholder `{aggregate}`"),
            "{e}"
        );
        let e = DestinationTemplate::parse("{event_type").unwrap_err();
        assert!(e.message().contains("without a closing"), "{e}");
        let e = DestinationTemplate::parse("a}").unwrap_err();
        assert!(e.message().contains("without an opening"), "{e}");
        assert!(DestinationTemplate::parse("").is_err());
    }

    #[test]
    fn placeholders_can_be_written_as_a_stand_in() {
        let t = DestinationTemplate::parse("{{x}}.{aggregate_type}-{aggregate_id}.{event_type}")
            .unwrap();
        assert_eq!(t.with_placeholders_as("*"), "{x}.*-*.*");
        assert_eq!(t.with_placeholders_as(""), "{x}.-.");
    }
}
