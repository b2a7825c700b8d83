//! NATS subjects: what may be published to, and the wildcard a subject template stands for.
//!
//! A subject is tokens separated by `.`: no empty token, no whitespace. `*` (one token) and
//! `>` (the rest) are wildcards: a stream's subjects may use them, a published message's
//! subject may not.

use outboxkit_core::DestinationTemplate;

/// Stands for a placeholder while a template is looked at token by token.
const PLACEHOLDER: &str = "\u{0}";

/// Why `subject` cannot be published to, if it cannot.
pub fn check_publish(subject: &str) -> Result<(), String> {
    check(subject, false)
}

/// Why `subject` cannot be a stream's subject (wildcards allowed), if it cannot.
pub fn check_filter(subject: &str) -> Result<(), String> {
    check(subject, true)
}

fn check(subject: &str, wildcards: bool) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is empty".to_owned());
    }
    if subject.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("holds whitespace or a control character".to_owned());
    }
    let tokens: Vec<&str> = subject.split('.').collect();
    if tokens.iter().any(|t| t.is_empty()) {
        return Err("has an empty token (a leading, trailing or doubled `.`)".to_owned());
    }
    for (i, token) in tokens.iter().enumerate() {
        let wildcard = *token == "*" || *token == ">";
        if wildcard && !wildcards {
            return Err(format!(
                "holds the wildcard `{token}`, which a message cannot be published to"
            ));
        }
        if *token == ">" && i + 1 != tokens.len() {
            return Err("has `>` before its last token".to_owned());
        }
    }
    Ok(())
}

/// The template with every token that holds a placeholder as `*`: the subjects it renders to
/// (when the events' fields hold no `.`) are among those of this wildcard.
/// `{aggregate_type}.{event_type}` → `*.*`, `app.{aggregate_type}_v1` → `app.*`.
pub fn wildcard(template: &DestinationTemplate) -> String {
    let marked = template.with_placeholders_as(PLACEHOLDER);
    let tokens: Vec<&str> = marked
        .split('.')
        .map(|t| if t.contains(PLACEHOLDER) { "*" } else { t })
        .collect();
    tokens.join(".")
}

/// Why the template's literal parts can never make a subject to publish to, if so.
pub fn check_template(template: &DestinationTemplate) -> Result<(), String> {
    check_publish(&template.with_placeholders_as("x"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(text: &str) -> DestinationTemplate {
        DestinationTemplate::parse(text).unwrap()
    }

    #[test]
    fn publish_subjects() {
        check_publish("orders.OrderPlaced").unwrap();
        check_publish("a").unwrap();
        check_publish("a*b.c>").unwrap();
        for bad in [
            "", "a..b", ".a", "a.", "a b", "a\tb", "a.*", "a.>", "a\u{1}",
        ] {
            assert!(check_publish(bad).is_err(), "{bad:?}");
        }
        check_filter("a.*.b").unwrap();
        check_filter("a.>").unwrap();
        assert!(check_filter("a.>.b").is_err());
        assert!(check_filter("a..b").is_err());
    }

    #[test]
    fn templates_become_wildcards() {
        assert_eq!(wildcard(&template("{aggregate_type}.{event_type}")), "*.*");
        assert_eq!(wildcard(&template("app.{aggregate_type}_v1.x")), "app.*.x");
        assert_eq!(wildcard(&template("orders")), "orders");
        assert_eq!(
            wildcard(&template("a.{aggregate_type}.{aggregate_id}")),
            "a.*.*"
        );
    }

    #[test]
    fn template_literals_are_checked() {
        check_template(&template("{aggregate_type}.{event_type}")).unwrap();
        check_template(&template("suite_{aggregate_type}")).unwrap();
        for bad in ["a..{event_type}", "a b.{event_type}", ">", "{event_type}.*"] {
            assert!(check_template(&template(bad)).is_err(), "{bad}");
        }
    }
}
