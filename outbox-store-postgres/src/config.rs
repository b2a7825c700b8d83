//! `[store]` settings of the PostgreSQL store, and the outbox table name.

use outboxkit_core::Result;
use outboxkit_store_sql::config::{Capture, NameRules, SqlStore, SqlStoreConfig, TableRules};

pub(crate) use outboxkit_store_sql::config::SCHEMA_TABLE;

/// The PostgreSQL store as the shared SQL code sees it: its kind of [`SqlStoreConfig`]
/// (`kind = "postgres"`), its wording and error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Postgres;

/// Settings of the PostgreSQL store (`[store]` with `kind = "postgres"`): the settings every SQL
/// store shares ([`SqlStoreConfig`]). `url` is `postgres://user:password@host:port/database`.
pub type PostgresStoreConfig = SqlStoreConfig<Postgres>;

/// Most shards a table may have: each owned shard is one advisory lock in PostgreSQL's shared
/// lock table, which is sized by `max_locks_per_transaction × max_connections`.
pub const MAX_SHARDS: u32 = outboxkit_store_sql::config::MAX_SHARDS;

impl SqlStore for Postgres {
    const KIND: &'static str = "postgres";
    const CONFIG_TYPE: &'static str = "PostgresStoreConfig";
    const SCHEMES: &'static [&'static str] = &["postgres://", "postgresql://"];
    const URL_FORM: &'static str = "postgres://user:password@host:port/database";
    /// What sqlx 0.9 reads (`sqlx_postgres::options::parse`), its TLS options under libpq's
    /// names only: the replication connection of log-based capture reads those, and would
    /// miss an alias (`ssl-mode`). libpq's other options, such as `connect_timeout` or
    /// `target_session_attrs`, sqlx ignores.
    const URL_OPTIONS: Option<&'static [&'static str]> = Some(&[
        "sslmode",
        "sslrootcert",
        "sslcert",
        "sslkey",
        "statement-cache-capacity",
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "password",
        "application_name",
        "options",
        "options[",
    ]);
    type Store = crate::PostgresStore;
    const LOG_CAPTURE: bool = true;

    fn check_table(table: &str) -> Result<()> {
        TableName::parse(table).map(drop)
    }

    /// `postgres <host>:<port>/<database> <schema>.<table>`; an unqualified table counts as
    /// `public.<table>`, where the default `search_path` finds it.
    fn table_identity(config: &PostgresStoreConfig) -> Option<String> {
        let options: sqlx::postgres::PgConnectOptions = config.url.parse().ok()?;
        let table = TableName::parse(&config.table).ok()?;
        Some(format!(
            "postgres {}/{} {}.{}",
            endpoint(&options),
            options.get_database().unwrap_or(options.get_username()),
            table.qualifier().unwrap_or("public"),
            table.name()
        ))
    }

    /// With log-based capture, also the server's `wal_level` checked, the capture set-up
    /// (bookkeeping table, publication, emit function) and, after the `COMMIT`, the slot and
    /// its bookkeeping row. Its table must name its schema: the slot's default name and the
    /// messages' prefix hold it, and the connection that would resolve it is not made.
    fn migration_sql(config: &PostgresStoreConfig) -> Result<Option<String>> {
        let Ok(table) = TableName::parse(&config.table) else {
            return Ok(None);
        };
        let (shards, payload_type) = (config.shards, config.payload_type);
        if config.capture == Capture::Poll {
            return Ok(Some(crate::migrate::script(
                &table,
                shards,
                payload_type,
                None,
                &[],
            )));
        }
        if table.qualifier().is_none() {
            return Err(outboxkit_core::Error::config(format!(
                "store.table: \"{}\" has no schema, and with store.capture = \"logical\" the \
                 script names it (in the slot and the messages): write it as schema.table (\
                 public.{0} when the default search_path finds it)",
                config.table
            )));
        }
        let names = crate::logical::LogicalNames::new(&table, &config.logical);
        let (check, inside, after) =
            crate::logical::setup::script_parts(&table, &names, payload_type.unwrap_or_default());
        let mut script = crate::migrate::script(&table, shards, payload_type, Some(check), &inside);
        for statement in after {
            script.push_str(&format!("\n{statement};\n"));
        }
        Ok(Some(script))
    }

    async fn connect(config: PostgresStoreConfig) -> Result<Self::Store> {
        crate::PostgresStore::connect(config).await
    }

    async fn list_tables(config: &PostgresStoreConfig) -> Result<Vec<(String, String)>> {
        crate::PostgresStore::list_tables(config).await
    }
}

/// How PostgreSQL qualifies, limits and quotes table names: index names add a suffix of up to
/// 14 bytes to a table name and PostgreSQL cuts identifiers at 63 bytes. Names are limited to
/// lowercase ASCII letters, digits and `_` (starting with a letter or `_`), so that the quoted
/// name used by the relay is the one writers get with plain unquoted SQL.
impl TableRules for Postgres {
    const NAME_RULES: NameRules = NameRules {
        qualifier: "schema",
        max_qualifier_len: 63,
        max_name_len: 49,
    };
    const RESERVED: &'static [&'static str] = &[SCHEMA_TABLE, crate::logical::setup::CAPTURE_TABLE];
    const RESERVED_WORDING: &'static str = "is the relay's own bookkeeping table";

    fn quote_ident(ident: &str) -> String {
        format!("\"{ident}\"")
    }
}

/// A validated outbox table name, `table` or `schema.table` ([`TableRules`] of [`Postgres`]).
pub type TableName = outboxkit_store_sql::config::TableName<Postgres>;

/// Where `options` connect, as sqlx does: the Unix socket file (`host=/run/postgresql` in the
/// URL, or a socket directory sqlx found by default when the URL names no host:
/// `/run/postgresql/.s.PGSQL.5432`), else `host:port` (the host in lowercase).
pub(crate) fn endpoint(options: &sqlx::postgres::PgConnectOptions) -> String {
    let port = options.get_port();
    match host(options) {
        dir if dir.starts_with('/') => format!("{dir}/.s.PGSQL.{port}"),
        host => format!("{}:{port}", host.to_ascii_lowercase()),
    }
}

/// The host `options` connect to, or the directory of their Unix socket: a socket given as
/// `host=/dir` in the URL is not `get_host()`, which keeps the default sqlx found.
pub(crate) fn host(options: &sqlx::postgres::PgConnectOptions) -> String {
    match options.get_socket() {
        Some(dir) => dir.display().to_string(),
        None => options.get_host().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::config::check_store_settings;
    use outboxkit_store_sql::testkit::check_table_names;

    use super::*;

    /// A TLS mode the driver does not know is named as written, with the modes there are and
    /// the one meant; other URLs the driver refuses say its reason once.
    #[test]
    fn urls_the_driver_refuses_say_what_to_write() {
        use outboxkit_store_sql::testkit::check_url_refused;
        use sqlx::postgres::PgConnectOptions;
        let modes = "(one of disable, allow, prefer, require, verify-ca, verify-full)";
        check_url_refused::<Postgres, PgConnectOptions>(
            "postgres://app@db/app?sslmode=verify_full",
            &format!(
                "store.url: sslmode=verify_full is not a TLS mode PostgreSQL knows {modes}: did \
                 you mean sslmode=verify-full?"
            ),
        );
        check_url_refused::<Postgres, PgConnectOptions>(
            "postgres://app@db/app?sslmode=bogus",
            &format!("store.url: sslmode=bogus is not a TLS mode PostgreSQL knows {modes}"),
        );
        check_url_refused::<Postgres, PgConnectOptions>(
            "postgres://app@db:99999/app",
            "store.url: \"<unparsable URL>\" is not a valid PostgreSQL URL: error with \
             configuration: invalid port number",
        );
    }

    /// The settings themselves are tested in `outboxkit-store-sql`; here, what is this store's.
    #[test]
    fn urls_tables_and_debug_are_this_stores() {
        let c: PostgresStoreConfig =
            serde_json::from_str(r#"{"url": "postgres://u:s3cr3t@db:5432/app?sslmode=require"}"#)
                .unwrap();
        check_store_settings(&c, "mysql://db/app");
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        check_table_names::<Postgres>(
            &[
                ("outbox", None, "\"outbox\"", "outbox"),
                (
                    "outbox",
                    Some("public"),
                    "\"public\".\"outbox\"",
                    "public.outbox",
                ),
                ("app.outbox_2", None, "\"app\".\"outbox_2\"", "app.outbox_2"),
            ],
            "\"app\".\"outbox_relay_schema\"",
            &["out\"box", "outbox_relay_schema"],
            49,
        );
    }

    #[test]
    fn a_table_is_relayed_by_the_configurations_that_name_or_match_it_on_its_database() {
        use outboxkit_core::StoreConfig;
        let config = |url: &str, table: &str| PostgresStoreConfig::new(url).table(table);
        let identity = config("postgres://db/app", "t1.outbox")
            .table_identity()
            .unwrap();
        let relays =
            |url: &str, table: &str| config(url, table).relays_table("t1.outbox", &identity);
        assert!(relays("postgres://u:pw@DB:5432/app", "t1.outbox"));
        assert!(relays("postgres://db/app", "*.outbox"));
        assert!(relays("postgres://db/app", "t*.*"));
        assert!(!relays("postgres://db/app", "t2.outbox"));
        assert!(!relays("postgres://db/app", "a*.outbox"), "does not match");
        assert!(
            !relays("postgres://db/other", "*.outbox"),
            "another database"
        );
        assert!(
            !relays("postgres://db:5433/app", "*.outbox"),
            "another server"
        );
        let public = config("postgres://db/app", "outbox")
            .table_identity()
            .unwrap();
        assert!(config("postgres://db/app", "*.outbox").relays_table("public.outbox", &public));
    }

    /// Errors named `/var/run/postgresql:5432` for a socket at `host=/nonexistent`: the host
    /// sqlx found by default, not the socket it connected to.
    #[test]
    fn the_endpoint_is_the_socket_or_host_sqlx_connects_to() {
        let endpoint = |url: &str| endpoint(&url.parse().unwrap());
        assert_eq!(
            endpoint("postgres:///app?host=/nonexistent&user=u"),
            "/nonexistent/.s.PGSQL.5432"
        );
        assert_eq!(
            endpoint("postgres://u@%2Frun%2Fpg:5433/app"),
            "/run/pg/.s.PGSQL.5433"
        );
        assert_eq!(
            endpoint("postgres://u@DB.example:6432/app"),
            "db.example:6432"
        );
    }
}
