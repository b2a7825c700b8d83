//! What the stores' migrations share: the checks of a table's schema version and their
//! messages, and the rendering of a migration's SQL.

use std::fmt;

use outboxkit_core::{Error, ErrorKind, Result};

/// A migration's SQL for one table: `{table}` becomes the quoted (qualified) table, `{name}` its
/// bare name, `{shards}` the shard count.
pub fn render(sql: &str, quoted_table: &str, name: &str, shards: i32) -> String {
    sql.replace("{table}", quoted_table)
        .replace("{name}", name)
        .replace("{shards}", &shards.to_string())
}

/// The table does not exist or has no schema row.
pub fn not_migrated(table: &dyn fmt::Display) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!("table {table} does not exist (or is not migrated): run `outbox-relay migrate`"),
    )
}

/// The table was migrated by a newer relay than this one (`known` is this relay's version).
pub fn newer_schema(table: &dyn fmt::Display, version: i32, known: i32) -> Error {
    Error::new(
        ErrorKind::Schema,
        format!(
            "table {table} is at schema version {version}, newer than this relay knows \
             ({known}): upgrade outbox-relay"
        ),
    )
}

/// `Ok` when the table is at `expected`, the version this relay creates and needs.
pub fn check_version(table: &dyn fmt::Display, version: i32, expected: i32) -> Result<()> {
    if version > expected {
        return Err(newer_schema(table, version, expected));
    }
    if version < expected {
        return Err(Error::new(
            ErrorKind::Schema,
            format!(
                "table {table} is at schema version {version}, this relay needs \
                 {expected}: run `outbox-relay migrate`"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_other_than_the_expected_one_are_schema_errors_saying_what_to_do() {
        check_version(&"app.outbox", 2, 2).unwrap();
        let e = check_version(&"app.outbox", 3, 2).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert_eq!(
            e.message(),
            "table app.outbox is at schema version 3, newer than this relay knows (2): \
             upgrade outbox-relay"
        );
        let e = check_version(&"app.outbox", 1, 2).unwrap_err();
        assert_eq!(
            e.message(),
            "table app.outbox is at schema version 1, this relay needs 2: run `outbox-relay \
             migrate`"
        );
        assert_eq!(
            not_migrated(&"t").message(),
            "table t does not exist (or is not migrated): run `outbox-relay migrate`"
        );
    }

    #[test]
    fn render_substitutes_every_placeholder() {
        let sql = render(
            "CREATE {table} {name}_idx % {shards} '{}'",
            "\"a\".\"t\"",
            "t",
            8,
        );
        assert_eq!(sql, "CREATE \"a\".\"t\" t_idx % 8 '{}'");
    }
}
