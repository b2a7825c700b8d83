//! [`Statement`]: SQL text the stores build once and run many times.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

/// The text of a statement built from the store's own templates and validated, quoted names
/// (table names, schemas) — never from a value, which is always bound. sqlx asks dynamic SQL to
/// be vouched for ([`AssertSqlSafe`]); a `Statement` is that promise, made where the text is
/// built. It keeps the `String` it was built as (no copy, which matters for the statements a
/// store builds per call) and hands sqlx a shared reference to it, so running it again copies
/// nothing either.
#[derive(Clone, PartialEq, Eq)]
pub struct Statement(Arc<String>);

impl Statement {
    /// `text`, built from the store's templates and validated names only.
    pub fn new(text: impl Into<String>) -> Self {
        Statement(Arc::new(text.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for Statement {
    fn from(text: String) -> Self {
        Statement::new(text)
    }
}

impl Deref for Statement {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl SqlSafeStr for Statement {
    fn into_sql_str(self) -> SqlStr {
        AssertSqlSafe(self.0).into_sql_str()
    }
}

impl SqlSafeStr for &Statement {
    fn into_sql_str(self) -> SqlStr {
        AssertSqlSafe(Arc::clone(&self.0)).into_sql_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_keeps_its_text_and_hands_sqlx_it_without_copying() {
        let text = "SELECT 1".to_owned();
        let built_at = text.as_ptr();
        let statement = Statement::new(text);
        assert!(
            std::ptr::eq(statement.as_ptr(), built_at),
            "the String was copied"
        );
        let sql = (&statement).into_sql_str();
        assert_eq!(sql.as_str(), "SELECT 1");
        assert!(std::ptr::eq(sql.as_str(), statement.as_str()));
        assert_eq!(statement.to_string(), "SELECT 1");
        assert_eq!(format!("{statement:?}"), "\"SELECT 1\"");
    }
}
