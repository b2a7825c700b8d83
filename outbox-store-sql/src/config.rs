//! What the `[store]` settings of the SQL stores share: defaults, checks, the password-free
//! URL, and the rules of table names.

use std::fmt;
use std::time::Duration;

use outboxkit_core::{Error, Result};

/// Most shards a table may have.
pub const MAX_SHARDS: u32 = 1024;

/// Default `store.table`.
pub fn default_table() -> String {
    "outbox".to_owned()
}
/// Default `store.shards`.
pub fn default_shards() -> u32 {
    64
}
/// Default `store.pool_size`.
pub fn default_pool_size() -> u32 {
    4
}
/// Default `store.connect_timeout`.
pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
/// Default `store.session_timeout`.
pub fn default_session_timeout() -> Duration {
    Duration::from_secs(30)
}

/// `store.url` must be given and start with one of `schemes`; `expected` shows the whole form.
pub fn check_url(url: &str, schemes: &[&str], expected: &str) -> Result<()> {
    if url.trim().is_empty() {
        return Err(Error::config("store.url: must not be empty"));
    }
    if schemes.iter().any(|scheme| url.starts_with(scheme)) {
        return Ok(());
    }
    Err(Error::config(format!(
        "store.url: expected {expected}, got \"{}\"",
        redact_url(url)
    )))
}

/// Check the numbers of `[store]`; each error names its key under `store.`.
pub fn check_limits(
    shards: u32,
    pool_size: u32,
    connect_timeout: Duration,
    session_timeout: Duration,
) -> Result<()> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(Error::config(format!(
            "store.shards: must be between 1 and {MAX_SHARDS}, got {shards}"
        )));
    }
    if pool_size == 0 {
        return Err(Error::config("store.pool_size: must be at least 1"));
    }
    if connect_timeout.is_zero() {
        return Err(Error::config("store.connect_timeout: must be above 0"));
    }
    if session_timeout < Duration::from_millis(100) {
        return Err(Error::config(
            "store.session_timeout: must be at least 100ms",
        ));
    }
    Ok(())
}

/// Replace the password of a URL (user-info part and `password=` query parameter) by `***`;
/// nothing of an unparsable value is shown.
pub fn redact_url(raw: &str) -> String {
    outboxkit_core::redact::redact_url(raw).unwrap_or_else(|| "<unparsable URL>".to_owned())
}

/// How a server qualifies and limits table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameRules {
    /// What qualifies a table: `schema`, `database`.
    pub qualifier: &'static str,
    /// Longest qualifier, in bytes.
    pub max_qualifier_len: usize,
    /// Longest table name, in bytes.
    pub max_name_len: usize,
}

/// A validated table name, `table` or `qualifier.table`.
///
/// Names are limited to lowercase ASCII letters, digits and `_` (starting with a letter or `_`),
/// so that the name used by the relay is the one writers get with plain unquoted SQL. A
/// qualifier added later ([`QualifiedName::or_in`]) may hold anything: it comes from the
/// server or the URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    qualifier: Option<String>,
    name: String,
}

impl QualifiedName {
    /// Parse `table` or `qualifier.table` (surrounding blanks ignored).
    pub fn parse(text: &str, rules: &NameRules) -> Result<Self> {
        let text = text.trim();
        let (qualifier, name) = match text.split_once('.') {
            Some((qualifier, name)) => (Some(qualifier), name),
            None => (None, text),
        };
        if let Some(qualifier) = qualifier {
            check_identifier(text, qualifier, rules.max_qualifier_len, rules)?;
        }
        check_identifier(text, name, rules.max_name_len, rules)?;
        Ok(Self {
            qualifier: qualifier.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The schema or database, when qualified.
    pub fn qualifier(&self) -> Option<&str> {
        self.qualifier.as_deref()
    }

    /// The table name without qualifier.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same table in `qualifier` (when it had none).
    pub fn or_in(mut self, qualifier: &str) -> Self {
        if self.qualifier.is_none() {
            self.qualifier = Some(qualifier.to_owned());
        }
        self
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.qualifier {
            Some(qualifier) => write!(f, "{qualifier}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

fn check_identifier(whole: &str, ident: &str, max_len: usize, rules: &NameRules) -> Result<()> {
    let mut chars = ident.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_start || !valid_rest {
        return Err(Error::config(format!(
            "\"{whole}\" is not a valid table name: use `table` or `{}.table` made of \
             lowercase letters, digits and _ (not starting with a digit)",
            rules.qualifier
        )));
    }
    if ident.len() > max_len {
        return Err(Error::config(format!(
            "\"{whole}\": \"{ident}\" is longer than {max_len} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxkit_core::ErrorKind;

    #[test]
    fn an_empty_url_is_named_as_such() {
        for url in ["", "  "] {
            let e = check_url(url, &["postgres://"], "postgres://...").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert_eq!(e.message(), "store.url: must not be empty");
        }
        assert!(check_url("postgres://h/db", &["postgres://"], "postgres://...").is_ok());
    }

    const RULES: NameRules = NameRules {
        qualifier: "schema",
        max_qualifier_len: 10,
        max_name_len: 8,
    };

    #[test]
    fn names_are_checked_against_the_rules() {
        let t = QualifiedName::parse(" app.outbox ", &RULES).unwrap();
        assert_eq!((t.qualifier(), t.name()), (Some("app"), "outbox"));
        assert_eq!(t.to_string(), "app.outbox");
        let t = QualifiedName::parse("outbox", &RULES).unwrap();
        assert_eq!(t.qualifier(), None);
        assert_eq!(t.clone().or_in("We-ird").to_string(), "We-ird.outbox");
        assert_eq!(t.clone().or_in("a").or_in("b").qualifier(), Some("a"));

        let e = QualifiedName::parse("Outbox", &RULES).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("`table` or `schema.table`"), "{e}");
        let e = QualifiedName::parse("outbox_xy", &RULES).unwrap_err();
        assert_eq!(
            e.message(),
            "\"outbox_xy\": \"outbox_xy\" is longer than 8 bytes"
        );
        QualifiedName::parse("abcdefghij.t", &RULES).unwrap();
        assert!(QualifiedName::parse("abcdefghijk.t", &RULES).is_err());
        for bad in ["", "a.", ".a", "a.b.c", "1a", "a b", "a\"b"] {
            assert!(QualifiedName::parse(bad, &RULES).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_name_their_key() {
        let ok = (64, 4, Duration::from_secs(5), Duration::from_secs(30));
        check_limits(ok.0, ok.1, ok.2, ok.3).unwrap();
        for (shards, pool, connect, session, key) in [
            (0, 4, ok.2, ok.3, "store.shards"),
            (MAX_SHARDS + 1, 4, ok.2, ok.3, "store.shards"),
            (64, 0, ok.2, ok.3, "store.pool_size"),
            (64, 4, Duration::ZERO, ok.3, "store.connect_timeout"),
            (
                64,
                4,
                ok.2,
                Duration::from_millis(99),
                "store.session_timeout",
            ),
        ] {
            let e = check_limits(shards, pool, connect, session).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().starts_with(key), "{key}: {e}");
        }
    }

    #[test]
    fn a_wrong_scheme_is_refused_without_the_password() {
        check_url("pg://a", &["x://", "pg://"], "pg://...").unwrap();
        let e = check_url("http://u:s3cr3t@h/d", &["pg://"], "pg://host/db").unwrap_err();
        assert!(e
            .message()
            .starts_with("store.url: expected pg://host/db, got \""));
        assert!(!e.message().contains("s3cr3t"), "{e}");
    }
}
