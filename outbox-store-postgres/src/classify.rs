//! sqlx errors → relay errors: the kind and retryability are decided here, once.
//!
//! | sqlx error | kind | retryable |
//! |---|---|---|
//! | I/O, TLS, protocol, crashed worker, pool timed out / closed | `Connection` | yes |
//! | SQLSTATE `08xxx`, `57P01`, `57P02`, `57P03`, `57P05` (connection lost, server shutting down, session idle too long) | `Connection` | yes |
//! | SQLSTATE `28xxx` (authentication) | `Unauthorized` | no |
//! | SQLSTATE `42501` (insufficient privilege) | `Unauthorized` | no |
//! | SQLSTATE `3D000` (unknown database) | `Config` | no |
//! | SQLSTATE `42P01` (undefined table) | `Schema` | no |
//! | SQLSTATE `53xxx` (too many connections, out of memory or disk) | `Unavailable` | yes |
//! | SQLSTATE `25006` (a write on a read-only server: a hot standby) | `Unavailable` | yes |
//! | SQLSTATE `57014` (statement timeout, cancelled) | `Timeout` | yes |
//! | SQLSTATE `40001`, `40P01` (serialization failure, deadlock) | `Other` | yes |
//! | SQLSTATE `08P01` "unsupported startup parameter", `42P05` / `26000` on sqlx's prepared statements (a connection pooler that is not in session mode) | `Config` | no |
//! | sqlx configuration error | `Config` | no |
//! | anything else | `Other` | no |

use sqlx::error::DatabaseError;

use outboxkit_core::{Error, ErrorKind};
use outboxkit_store_sql::classify::{read_only, with_retryability};
pub(crate) use outboxkit_store_sql::Target;

pub(crate) use crate::config::Postgres;

impl outboxkit_store_sql::Dialect for Postgres {
    const PRODUCT: &'static str = "PostgreSQL";
    const TLS_OPTION: &'static str = "sslmode";
    const TLS_MODES: &'static [&'static str] = &[
        "disable",
        "allow",
        "prefer",
        "require",
        "verify-ca",
        "verify-full",
    ];
    const CA_OPTION: &'static str = "sslrootcert";
    const CLIENT_CERT_OPTIONS: &'static str = "sslcert and sslkey";
    const UNREACHABLE: &'static str = "database";

    fn database_error(e: Box<dyn DatabaseError>, target: &Target) -> Error {
        let at = target.at::<Self>();
        let table = &target.table;
        let code = e.code().map(|c| c.into_owned()).unwrap_or_default();
        let message = e.message().to_owned();
        if let Some(error) = pooler_error(&code, &message, target) {
            return error;
        }
        let (kind, retryable) = kind_of_sqlstate(&code);
        let text = match kind {
            ErrorKind::Schema => format!(
                "table {table} does not exist (or is not migrated): run {} ({message})",
                outboxkit_core::command::line("migrate")
            ),
            ErrorKind::Config => format!(
                "database \"{}\" does not exist on {at} (store.url): create it or fix the URL",
                target.database.as_deref().unwrap_or("?")
            ),
            ErrorKind::Unauthorized if code.starts_with("28") => format!(
                "{at} refused user \"{}\" ({}): {message}",
                target.user.as_deref().unwrap_or("?"),
                target.credentials_key()
            ),
            ErrorKind::Unauthorized => format!(
                "user \"{}\" lacks a privilege (relaying table {table}): {message} — grant \
                 what the store README lists under \"Privileges\"",
                target.user.as_deref().unwrap_or("?")
            ),
            ErrorKind::Connection => {
                format!("{at} ended the connection: {message} (SQLSTATE {code})")
            }
            ErrorKind::Unavailable if code == READ_ONLY => {
                return read_only::<Postgres>(target, &format!("{message} (SQLSTATE {code})"));
            }
            ErrorKind::Unavailable => {
                format!("{at} is out of resources: {message} (SQLSTATE {code})")
            }
            ErrorKind::Timeout => format!(
                "a statement on table {table} was cancelled: {message} (raise \
                 store.session_timeout if it is the statement timeout)"
            ),
            _ => format!("{at}, table {table}: {message} (SQLSTATE {code})"),
        };
        with_retryability(Error::new(kind, text), retryable)
    }
}

/// What a connection pooler in front of the server (PgBouncer) answers when it cannot serve
/// the relay as it is set up: a startup parameter it does not know (sqlx sends
/// `extra_float_digits`), or, in transaction or statement mode, a connection's statements run
/// on different server sessions (sqlx's prepared statements are missing or there twice). The
/// relay's shard sessions hold session locks, so they need one server session each: a
/// configuration error, with what to change.
fn pooler_error(code: &str, message: &str, target: &Target) -> Option<Error> {
    let at = target.at::<Postgres>();
    let text = match code {
        "08P01" if message.starts_with("unsupported startup parameter") => format!(
            "{at} refused a startup parameter ({message}): a connection pooler such as PgBouncer \
             answers there. Polling works through it with `ignore_startup_parameters = \
             extra_float_digits` in its configuration and this database's pool in session mode \
             (`pool_mode = session`); logical capture (store.capture = \"logical\") needs a \
             replication connection, so point store.url at PostgreSQL itself"
        ),
        "42P05" | "26000" if message.contains("\"sqlx_s_") => format!(
            "{at} ran this connection's statements on different server sessions ({message} \
             (SQLSTATE {code})): a connection pooler in transaction or statement mode answers \
             there; the relay holds session locks, so run this database's pool in session mode \
             (PgBouncer `pool_mode = session`), or point store.url at PostgreSQL itself"
        ),
        _ => return None,
    };
    Some(Error::config(text))
}

/// `read_only_sql_transaction`: a write on a hot standby, or with read-only transactions.
const READ_ONLY: &str = "25006";

/// Refuse a server that takes no writes, before a session claims anything.
pub(crate) async fn refuse_read_only(
    conn: &mut sqlx::PgConnection,
    target: &Target,
) -> outboxkit_core::Result<()> {
    let (standby, read_only_transactions): (bool, bool) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), current_setting('transaction_read_only') = 'on'",
    )
    .fetch_one(conn)
    .await
    .map_err(|e| classify(e, target))?;
    match (standby, read_only_transactions) {
        (true, _) => Err(read_only::<Postgres>(
            target,
            "a hot standby: pg_is_in_recovery() is true",
        )),
        (false, true) => Err(read_only::<Postgres>(
            target,
            "default_transaction_read_only is on for this user or database",
        )),
        (false, false) => Ok(()),
    }
}

/// The kind and retryability of a database error by its SQLSTATE.
pub(crate) fn kind_of_sqlstate(code: &str) -> (ErrorKind, bool) {
    let class = code.get(..2).unwrap_or("");
    match (class, code) {
        (_, "42501") | ("28", _) => (ErrorKind::Unauthorized, false),
        (_, "3D000") => (ErrorKind::Config, false),
        (_, "42P01") => (ErrorKind::Schema, false),
        (_, "57P01" | "57P02" | "57P03" | "57P05") | ("08", _) => (ErrorKind::Connection, true),
        ("53", _) | (_, READ_ONLY) => (ErrorKind::Unavailable, true),
        (_, "57014") => (ErrorKind::Timeout, true),
        (_, "40001" | "40P01") => (ErrorKind::Other, true),
        _ => (ErrorKind::Other, false),
    }
}

/// Map a sqlx error to the relay's error. Messages name the database or table and say what to do.
pub(crate) fn classify(error: sqlx::Error, target: &Target) -> Error {
    outboxkit_store_sql::classify::<Postgres>(error, target)
}

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::testkit::{check_kinds, check_shared_errors, database_error};

    use super::*;

    fn target() -> Target {
        Target {
            endpoint: Some("127.0.0.1:5999".to_owned()),
            database: Some("shop".to_owned()),
            user: Some("app".to_owned()),
            table: "public.outbox".to_owned(),
            ..Target::default()
        }
    }

    fn db(code: &'static str) -> Error {
        classify(database_error(code), &target())
    }

    #[test]
    fn errors_every_server_shares_name_this_one() {
        check_shared_errors::<Postgres>(&target());
    }

    /// The table of the module's documentation, row by row.
    #[test]
    fn a_write_on_a_read_only_server_asks_for_the_primary() {
        let e = db("25006");
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(
            e.message()
                .starts_with("PostgreSQL at 127.0.0.1:5999 is read-only (")
                && e.message().contains("point store.url at it"),
            "{e}"
        );
    }

    /// PgBouncer's answers, as the relay used to show them: `ended the connection:
    /// unsupported startup parameter: extra_float_digits`, or `prepared statement "sqlx_s_1"
    /// already exists`, retried for ever.
    #[test]
    fn a_pooler_that_cannot_serve_the_relay_says_how_to_set_it_up() {
        let e = pooler_error(
            "08P01",
            "unsupported startup parameter: extra_float_digits",
            &target(),
        )
        .unwrap();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(!e.is_retryable());
        assert!(
            e.message()
                .starts_with("PostgreSQL at 127.0.0.1:5999 refused a startup parameter")
                && e.message()
                    .contains("ignore_startup_parameters = extra_float_digits")
                && e.message().contains("pool_mode = session"),
            "{e}"
        );
        for (code, message) in [
            ("42P05", "prepared statement \"sqlx_s_1\" already exists"),
            ("26000", "prepared statement \"sqlx_s_3\" does not exist"),
        ] {
            let e = pooler_error(code, message, &target()).unwrap();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(
                e.message().contains("transaction or statement mode")
                    && e.message().contains("pool_mode = session"),
                "{e}"
            );
        }
        // The logical capture session's startup options: the message says it needs the server.
        let e = pooler_error("08P01", "unsupported startup parameter: options", &target()).unwrap();
        assert!(e.message().contains("logical capture"), "{e}");
        assert!(pooler_error("08P01", "invalid message length", &target()).is_none());
        assert!(pooler_error(
            "26000",
            "prepared statement \"mine\" does not exist",
            &target()
        )
        .is_none());
    }

    #[test]
    fn every_sqlstate_has_its_kind() {
        use ErrorKind::*;
        check_kinds(
            kind_of_sqlstate,
            &[
                (&["28P01", "28000"], Unauthorized, false),
                (&["42501"], Unauthorized, false),
                (&["3D000"], Config, false),
                (&["42P01"], Schema, false),
                (
                    &["57P01", "57P02", "57P03", "57P05", "08006", "08003"],
                    Connection,
                    true,
                ),
                (&["53300", "53100", "53200", "25006"], Unavailable, true),
                (&["57014"], Timeout, true),
                (&["40001", "40P01"], Other, true),
                (&["23505", "42601", "22P02", ""], Other, false),
            ],
        );
    }

    #[test]
    fn authentication_failures_are_unauthorized() {
        let e = db("28P01");
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert!(!e.is_retryable());
        assert!(e.message().contains("\"app\"") && e.message().contains("store.url"));
        // A password from `store.password` (or `password_file`) names that key too.
        let mut from_key = target();
        from_key.password_key = true;
        let e = classify(database_error("28P01"), &from_key).to_string();
        assert!(e.contains("\"app\" (store.url, store.password): "), "{e}");
    }

    #[test]
    fn missing_privileges_are_unauthorized() {
        assert!(db("42501").message().contains("grant"));
    }

    #[test]
    fn unknown_database_is_a_config_error_naming_it() {
        let e = db("3D000");
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(
            e.message().contains("database \"shop\" does not exist"),
            "{e}"
        );
    }

    #[test]
    fn undefined_table_is_a_schema_error_saying_to_migrate() {
        let e = db("42P01");
        assert_eq!(e.kind(), ErrorKind::Schema);
        assert!(
            e.message()
                .starts_with("table public.outbox does not exist (or is not migrated): run `outbox-relay migrate`"),
            "{e}"
        );
    }

    #[test]
    fn server_shutdown_and_lost_connections_are_connection_errors() {
        for code in ["57P01", "57P02", "57P03", "08006", "08003"] {
            assert_eq!(db(code).kind(), ErrorKind::Connection, "{code}");
        }
    }

    #[test]
    fn resource_shortages_are_unavailable() {
        assert!(db("53300").is_retryable());
    }

    #[test]
    fn cancelled_statements_are_timeouts() {
        assert_eq!(db("57014").kind(), ErrorKind::Timeout);
    }

    #[test]
    fn serialization_failures_and_deadlocks_are_retryable() {
        for code in ["40001", "40P01"] {
            let e = db(code);
            assert_eq!(e.kind(), ErrorKind::Other);
            assert!(e.is_retryable());
        }
    }

    #[test]
    fn other_sqlstates_are_permanent_other_errors() {
        let e = db("23505");
        assert!(!e.is_retryable());
        assert!(e.message().contains("SQLSTATE 23505") && e.message().contains("public.outbox"));
    }
}
