//! The privileges the relay's database user needs, checked before the relay starts: each with a
//! statement that needs it and changes nothing (`DELETE FROM t WHERE 1 = 0`), so that a user
//! who lacks one is told at start which ones to grant, all at once, instead of a relay that
//! starts, then fails and retries its first claim, mark or membership row for ever.

use std::fmt;

use sqlx::Database;

use outboxkit_core::{Error, ErrorKind, Result};

use crate::classify::{classify, Target};

/// The privileges the relay needs on one table: `SELECT, UPDATE, DELETE ON "app"."outbox"`.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The table, quoted as the statements name it.
    table: String,
    /// Each privilege and a statement that needs it (and no other) and changes nothing.
    probes: Vec<(&'static str, String)>,
}

impl Grant {
    /// No privilege yet on `table` (quoted).
    pub fn on(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            probes: Vec::new(),
        }
    }

    /// What the relay needs on its outbox table: it claims rows (`SELECT ... FOR UPDATE`),
    /// marks and retries them (`UPDATE`) and deletes published ones (`DELETE`).
    pub fn outbox(table: impl Into<String>) -> Self {
        Self::on(table).select().update("attempts", "0").delete()
    }

    /// `SELECT`.
    pub fn select(self) -> Self {
        let sql = format!("SELECT 1 FROM {} WHERE 1 = 0", self.table);
        self.probe("SELECT", sql)
    }

    /// `INSERT`, probed by inserting `values` (literals of their types) into `columns` (every
    /// column without a default: MySQL checks them even for no row).
    pub fn insert(self, columns: &str, values: &str) -> Self {
        let sql = format!(
            "INSERT INTO {} ({columns}) SELECT {values} FROM (SELECT 1 AS one) AS nothing \
             WHERE 1 = 0",
            self.table
        );
        self.probe("INSERT", sql)
    }

    /// `UPDATE`, probed by setting `column` to `value` (a literal of its type).
    pub fn update(self, column: &str, value: &str) -> Self {
        let sql = format!("UPDATE {} SET {column} = {value} WHERE 1 = 0", self.table);
        self.probe("UPDATE", sql)
    }

    /// `DELETE`.
    pub fn delete(self) -> Self {
        let sql = format!("DELETE FROM {} WHERE 1 = 0", self.table);
        self.probe("DELETE", sql)
    }

    fn probe(mut self, privilege: &'static str, sql: String) -> Self {
        self.probes.push((privilege, sql));
        self
    }

    /// The privileges, as `GRANT` lists them: `SELECT, UPDATE, DELETE`.
    pub fn privileges(&self) -> String {
        let names: Vec<&str> = self.probes.iter().map(|(p, _)| *p).collect();
        names.join(", ")
    }
}

impl fmt::Display for Grant {
    /// `GRANT SELECT, UPDATE, DELETE ON "app"."outbox"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GRANT {} ON {}", self.privileges(), self.table)
    }
}

/// Run every probe of `grants` on `conn`. Ok unless the server refuses one for a privilege:
/// then one error listing every privilege missing and the `GRANT` statements that give them.
/// A table that does not exist or is not the relay's is left to the table checks, which say
/// what to do about it; a failed call (the connection broke) is returned as it is.
pub async fn check<S>(
    conn: &mut <S::Database as Database>::Connection,
    grants: &[Grant],
    target: &Target,
) -> Result<()>
where
    S: crate::migrate::TableCatalog,
{
    let mut missing: Vec<(&Grant, Vec<&'static str>)> = Vec::new();
    let mut first_refusal = None;
    for grant in grants {
        let mut lacking = Vec::new();
        for (privilege, sql) in &grant.probes {
            let Err(e) = S::execute(&mut *conn, sql).await else {
                continue;
            };
            let said = e.as_database_error().map(|d| d.message().to_owned());
            let error = classify::<S>(e, target);
            match error.kind() {
                ErrorKind::Unauthorized => {
                    lacking.push(*privilege);
                    first_refusal.get_or_insert(said.unwrap_or_else(|| error.message().into()));
                }
                // The call failed (the connection broke): nothing is known.
                _ if error.is_retryable() => return Err(error),
                // No such table, or not the relay's (a column missing): for the table checks.
                _ => break,
            }
        }
        if !lacking.is_empty() {
            missing.push((grant, lacking));
        }
    }
    match first_refusal {
        None => Ok(()),
        Some(refusal) => Err(refused(target, &missing, &refusal)),
    }
}

/// The error of a user who lacks privileges: which, on which tables, and the statements to run.
fn refused(target: &Target, missing: &[(&Grant, Vec<&'static str>)], refusal: &str) -> Error {
    let user = target.user.as_deref().unwrap_or("?");
    let lacking: Vec<String> = missing
        .iter()
        .map(|(grant, privileges)| format!("{} on {}", privileges.join(", "), grant.table))
        .collect();
    let statements: Vec<String> = missing
        .iter()
        .map(|(grant, _)| format!("{grant} TO {user};"))
        .collect();
    Error::new(
        ErrorKind::Unauthorized,
        format!(
            "user \"{user}\" lacks privileges the relay needs for table {}: {} (the server said: \
             {}). Grant them: {} (the store README lists them under \"Privileges\")",
            target.table,
            lacking.join("; "),
            refusal,
            statements.join(" ")
        ),
    )
    .permanent()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_privilege_has_a_statement_that_changes_nothing() {
        let grant = Grant::outbox("\"app\".\"outbox\"").insert("aggregate_type", "''");
        assert_eq!(grant.privileges(), "SELECT, UPDATE, DELETE, INSERT");
        assert_eq!(
            grant.to_string(),
            "GRANT SELECT, UPDATE, DELETE, INSERT ON \"app\".\"outbox\""
        );
        for (_, sql) in &grant.probes {
            assert!(sql.ends_with("WHERE 1 = 0"), "{sql}");
        }
    }

    #[test]
    fn the_error_lists_what_is_missing_and_the_statements() {
        let target = Target {
            user: Some("relay".into()),
            table: "app.outbox".into(),
            ..Target::default()
        };
        let outbox = Grant::outbox("`app`.`outbox`");
        let members = Grant::on("`app`.`outbox_relay_members`").select().delete();
        let e = refused(
            &target,
            &[
                (&outbox, vec!["UPDATE", "DELETE"]),
                (&members, vec!["DELETE"]),
            ],
            "DELETE command denied",
        );
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert!(!e.is_retryable());
        assert_eq!(
            e.message(),
            "user \"relay\" lacks privileges the relay needs for table app.outbox: UPDATE, DELETE \
             on `app`.`outbox`; DELETE on `app`.`outbox_relay_members` (the server said: DELETE \
             command denied). Grant them: GRANT SELECT, UPDATE, DELETE ON `app`.`outbox` TO \
             relay; GRANT SELECT, DELETE ON `app`.`outbox_relay_members` TO relay; (the store \
             README lists them under \"Privileges\")"
        );
    }
}
