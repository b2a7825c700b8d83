//! sqlx errors → relay errors: the kind and retryability are decided here, once.
//!
//! Server errors are classified by their MySQL / MariaDB error number, then (for numbers not in
//! the table) by SQLSTATE class.
//!
//! | sqlx error | kind | retryable |
//! |---|---|---|
//! | I/O, TLS, protocol, crashed worker, pool timed out / closed | `Connection` | yes |
//! | 1053 server shutdown, 1152/1184 aborted connection, 1159/1161 network read/write interrupted, 1927 connection killed (MariaDB), 4031 disconnected for inactivity (MySQL), SQLSTATE `08xxx` | `Connection` | yes |
//! | 1045 access denied, 1044 no access to the database, 1130 host not allowed, 1251 auth plugin not supported, 1820 password expired, SQLSTATE `28xxx` | `Unauthorized` | no |
//! | 1142 / 1143 / 1227 missing privilege | `Unauthorized` | no |
//! | 1049 unknown database | `Config` | no |
//! | 3159 secure transport required | `Config` | no |
//! | 1146 unknown table, 1054 unknown column, SQLSTATE `42S02` | `Schema` | no |
//! | 1040 / 1203 / 1226 too many connections, 1041 / 1037 / 1038 out of memory, 1021 disk full, 1114 table full, 1461 too many prepared statements, 1637 too many transactions, 1129 host blocked, 1290 / 1792 read-only server (failover) | `Unavailable` | yes |
//! | 1205 lock wait timeout, 1317 query interrupted, 1969 max_statement_time (MariaDB), 3024 max_execution_time (MySQL) | `Timeout` | yes |
//! | 1213 deadlock, 1615 statement needs re-preparing (table changed) | `Other` | yes |
//! | 1153 packet larger than max_allowed_packet | `MessageTooLarge` | no |
//! | 1406 data too long, 3140 invalid JSON, 3819 / 4025 CHECK constraint violated, SQLSTATE `22xxx` | `InvalidMessage` | no |
//! | sqlx configuration error | `Config` | no |
//! | anything else (1062 duplicate key, 1064 syntax...) | `Other` | no |

use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;

use outboxkit_core::{Error, ErrorKind};
use outboxkit_store_sql::classify::{read_only, with_retryability};
pub(crate) use outboxkit_store_sql::Target;

pub(crate) use crate::config::MySql;

impl outboxkit_store_sql::Dialect for MySql {
    const PRODUCT: &'static str = "MySQL";
    const TLS_OPTION: &'static str = "ssl-mode";
    const TLS_MODES: &'static [&'static str] = &[
        "DISABLED",
        "PREFERRED",
        "REQUIRED",
        "VERIFY_CA",
        "VERIFY_IDENTITY",
    ];
    const CA_OPTION: &'static str = "ssl-ca";
    const CLIENT_CERT_OPTIONS: &'static str = "ssl-cert and ssl-key";
    const UNREACHABLE: &'static str = "server";

    fn database_error(e: Box<dyn DatabaseError>, target: &Target) -> Error {
        let at = target.at::<Self>();
        let table = &target.table;
        let number = e
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number);
        let sqlstate = e.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = e.message().to_owned();
        let code = match number {
            Some(number) => format!("error {number}, SQLSTATE {sqlstate}"),
            None => format!("SQLSTATE {sqlstate}"),
        };
        let (kind, retryable) = kind_of_server_error(number, &sqlstate);
        let user = target.user.as_deref().unwrap_or("?");
        let text = match kind {
            ErrorKind::Schema => format!(
                "table {table} does not exist or is not as expected (not migrated?): run {} \
                 ({message})",
                outboxkit_core::command::line("migrate")
            ),
            ErrorKind::Config if number == Some(1049) => format!(
                "database \"{}\" does not exist on {at} (store.url): create it or fix the URL",
                target.database.as_deref().unwrap_or("?")
            ),
            ErrorKind::Config => format!(
                "{at} refused the connection (store.url): {message} — set ssl-mode in the URL"
            ),
            ErrorKind::Unauthorized if matches!(number, Some(1142 | 1143 | 1227)) => format!(
                "user \"{user}\" lacks a privilege (relaying table {table}): {message} — grant \
                 what the store README lists under \"Privileges\""
            ),
            ErrorKind::Unauthorized => format!(
                "{at} refused user \"{user}\" ({}): {message}",
                target.credentials_key()
            ),
            ErrorKind::Connection => format!("{at} ended the connection: {message} ({code})"),
            ErrorKind::Unavailable if is_read_only(number, &message) => {
                return read_only::<Self>(target, &format!("{message} ({code})"));
            }
            ErrorKind::Unavailable => {
                format!("{at} cannot serve right now: {message} ({code})")
            }
            ErrorKind::Timeout => format!(
                "a statement on table {table} was interrupted: {message} ({code}; raise \
                 store.session_timeout if it is the statement time limit)"
            ),
            ErrorKind::MessageTooLarge => format!(
                "{at} refused a statement on table {table} as too large: {message} (raise the \
                 server's max_allowed_packet)"
            ),
            ErrorKind::InvalidMessage => {
                format!("{at} refused a value for table {table}: {message} ({code})")
            }
            _ => format!("{at}, table {table}: {message} ({code})"),
        };
        with_retryability(Error::new(kind, text), retryable)
    }
}

/// 1792: a write in a read-only transaction; 1290 with the server's `--read-only` (or
/// `--super-read-only`) option, not another option that prevents a statement.
fn is_read_only(number: Option<u16>, message: &str) -> bool {
    match number {
        Some(1792) => true,
        Some(1290) => message.contains("read-only") || message.contains("read_only"),
        _ => false,
    }
}

/// The server variables that make a server or a connection take no writes, with what each
/// means. A user with SUPER (MySQL) or READ_ONLY ADMIN (MariaDB) may still write under
/// `read_only`, but on a replica that breaks its replication and marks rows the primary still
/// holds as pending; so the relay refuses them whoever it connects as.
const READ_ONLY_VARIABLES: [(&str, &str); 5] = [
    (
        "read_only",
        "read_only is ON: a replica, or a primary being failed over",
    ),
    (
        "super_read_only",
        "super_read_only is ON: a replica, or a primary being failed over",
    ),
    (
        "innodb_read_only",
        "innodb_read_only is ON: a read-only instance, such as a reader of a cluster",
    ),
    (
        "transaction_read_only",
        "transaction_read_only is ON: transactions are read-only by default",
    ),
    (
        "tx_read_only",
        "tx_read_only is ON: transactions are read-only by default",
    ),
];

/// Refuse a server that takes no writes, before a session claims anything (the variables of
/// [`READ_ONLY_VARIABLES`] the server has: MariaDB has no super_read_only, MySQL 8 no
/// tx_read_only).
pub(crate) async fn refuse_read_only(
    conn: &mut sqlx::MySqlConnection,
    target: &Target,
) -> outboxkit_core::Result<()> {
    let names = READ_ONLY_VARIABLES
        .map(|(name, _)| format!("'{name}'"))
        .join(", ");
    let on: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SHOW VARIABLES WHERE Variable_name IN ({names}) AND Value IN ('ON', '1')"
    )))
    .fetch_all(conn)
    .await
    .map_err(|e| classify(e, target))?;
    match READ_ONLY_VARIABLES
        .iter()
        .find(|(name, _)| on.iter().any(|(variable, _)| variable == name))
    {
        Some((_, why)) => Err(read_only::<MySql>(target, why)),
        None => Ok(()),
    }
}

/// The kind and retryability of a server error by its error number (when known) and SQLSTATE.
pub(crate) fn kind_of_server_error(number: Option<u16>, sqlstate: &str) -> (ErrorKind, bool) {
    if let Some(number) = number {
        let by_number = match number {
            1053 | 1152 | 1184 | 1159 | 1161 | 1927 | 4031 => Some((ErrorKind::Connection, true)),
            1045 | 1044 | 1130 | 1251 | 1820 => Some((ErrorKind::Unauthorized, false)),
            1142 | 1143 | 1227 => Some((ErrorKind::Unauthorized, false)),
            1049 | 3159 => Some((ErrorKind::Config, false)),
            1146 | 1054 => Some((ErrorKind::Schema, false)),
            1040 | 1203 | 1226 | 1041 | 1037 | 1038 | 1021 | 1114 | 1461 | 1637 | 1129 | 1290
            | 1792 => Some((ErrorKind::Unavailable, true)),
            1205 | 1317 | 1969 | 3024 => Some((ErrorKind::Timeout, true)),
            1213 | 1615 => Some((ErrorKind::Other, true)),
            1153 => Some((ErrorKind::MessageTooLarge, false)),
            1406 | 3140 | 3819 | 4025 => Some((ErrorKind::InvalidMessage, false)),
            _ => None,
        };
        if let Some(kind) = by_number {
            return kind;
        }
    }
    let class = sqlstate.get(..2).unwrap_or("");
    match (class, sqlstate) {
        ("08", _) => (ErrorKind::Connection, true),
        ("28", _) => (ErrorKind::Unauthorized, false),
        (_, "42S02") => (ErrorKind::Schema, false),
        (_, "40001") => (ErrorKind::Other, true),
        ("22", _) => (ErrorKind::InvalidMessage, false),
        _ => (ErrorKind::Other, false),
    }
}

/// Map a sqlx error to the relay's error. Messages name the server or table and say what to do.
pub(crate) fn classify(error: sqlx::Error, target: &Target) -> Error {
    outboxkit_store_sql::classify::<MySql>(error, target)
}

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::testkit::{check_kinds, check_shared_errors, database_error};

    use super::*;

    fn target() -> Target {
        Target {
            endpoint: Some("127.0.0.1:3999".to_owned()),
            database: Some("shop".to_owned()),
            user: Some("app".to_owned()),
            table: "shop.outbox".to_owned(),
            ..Target::default()
        }
    }

    fn db(sqlstate: &'static str) -> Error {
        classify(database_error(sqlstate), &target())
    }

    fn number(n: u16) -> (ErrorKind, bool) {
        kind_of_server_error(Some(n), "HY000")
    }

    #[test]
    fn errors_every_server_shares_name_this_one() {
        check_shared_errors::<MySql>(&target());
    }

    /// The table of the module's documentation, row by row: by error number, then by SQLSTATE
    /// for errors without a number in the table.
    #[test]
    fn every_error_number_and_sqlstate_has_its_kind() {
        use ErrorKind::*;
        check_kinds(
            number,
            &[
                (
                    &[1053, 1152, 1184, 1159, 1161, 1927, 4031],
                    Connection,
                    true,
                ),
                (&[1045, 1044, 1130, 1251, 1820], Unauthorized, false),
                (&[1142, 1143, 1227], Unauthorized, false),
                (&[1049, 3159], Config, false),
                (&[1146, 1054], Schema, false),
                (
                    &[
                        1040, 1203, 1226, 1041, 1037, 1038, 1021, 1114, 1461, 1637, 1129, 1290,
                        1792,
                    ],
                    Unavailable,
                    true,
                ),
                (&[1205, 1317, 1969, 3024], Timeout, true),
                (&[1213, 1615], Other, true),
                (&[1153], MessageTooLarge, false),
                (&[1406, 3140, 3819, 4025], InvalidMessage, false),
            ],
        );
        check_kinds(
            |sqlstate| kind_of_server_error(None, sqlstate),
            &[
                (&["08S01"], Connection, true),
                (&["28000"], Unauthorized, false),
                (&["42S02"], Schema, false),
                (&["40001"], Other, true),
                (&["22001"], InvalidMessage, false),
                (&[""], Other, false),
            ],
        );
    }

    #[test]
    fn a_write_on_a_read_only_server_asks_for_the_primary() {
        let read_only_option = "The MariaDB server is running with the --read-only option so it \
                                cannot execute this statement";
        assert!(is_read_only(Some(1290), read_only_option));
        assert!(is_read_only(
            Some(1792),
            "Cannot execute statement in a READ ONLY transaction"
        ));
        let file_option = "The MySQL server is running with the --secure-file-priv option so it \
                           cannot execute this statement";
        assert!(!is_read_only(Some(1290), file_option));
        assert!(!is_read_only(Some(1040), "Too many connections"));
        let e = read_only::<MySql>(&target(), READ_ONLY_VARIABLES[0].1);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(
            e.message(),
            "MySQL at 127.0.0.1:3999 is read-only (read_only is ON: a replica, or a primary being \
             failed over): the relay marks and deletes rows of table shop.outbox, so it needs the \
             primary; point store.url at it (a replica's or a reader endpoint's address will not \
             do)"
        );
    }

    #[test]
    fn lost_connections_and_server_shutdown_are_connection_errors() {
        assert_eq!(db("08004").kind(), ErrorKind::Connection);
        assert!(db("08004").message().contains("127.0.0.1:3999"));
    }

    #[test]
    fn refused_logins_are_unauthorized() {
        let e = db("28000");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert!(!e.is_retryable());
        assert!(e.message().contains("\"app\"") && e.message().contains("store.url"));
        // A password from `store.password` (or `password_file`) names that key too.
        let mut from_key = target();
        from_key.password_key = true;
        let e = classify(database_error("28000"), &from_key).to_string();
        assert!(e.contains("\"app\" (store.url, store.password): "), "{e}");
    }

    #[test]
    fn unknown_tables_and_columns_are_schema_errors() {
        let e = db("42S02");
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(
            e.message().starts_with("table shop.outbox does not exist")
                && e.message().contains("outbox-relay migrate"),
            "{e}"
        );
    }

    #[test]
    fn deadlocks_and_stale_statements_are_retryable() {
        assert!(db("40001").is_retryable());
    }

    #[test]
    fn refused_values_are_invalid_messages() {
        assert_eq!(db("22032").kind(), ErrorKind::InvalidMessage);
    }

    #[test]
    fn other_errors_are_permanent_other_errors() {
        for n in [1062, 1064, 1105] {
            assert_eq!(kind_of_server_error(Some(n), "23000").0, ErrorKind::Other);
            assert!(!kind_of_server_error(Some(n), "42000").1, "{n}");
        }
        let e = db("23000");
        assert!(!e.is_retryable());
        assert!(e.message().contains("SQLSTATE 23000") && e.message().contains("shop.outbox"));
    }
}
