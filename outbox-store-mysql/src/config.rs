//! `[store]` settings of the MySQL / MariaDB store, and the outbox table name.

use outboxkit_core::Result;
use outboxkit_store_sql::config::{NameRules, SqlStore, SqlStoreConfig, TableRules};

pub(crate) use outboxkit_store_sql::config::SCHEMA_TABLE;

/// The MySQL / MariaDB store as the shared SQL code sees it: its kind of [`SqlStoreConfig`]
/// (`kind = "mysql"`: MySQL 8.0.16+ and MariaDB 10.6+), its wording and error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MySql;

/// Settings of the MySQL / MariaDB store (`[store]` with `kind = "mysql"`): the settings every
/// SQL store shares ([`SqlStoreConfig`]). `url` is `mysql://user:password@host:port/database`
/// (`mariadb://` is accepted too); an unqualified `table` lives in the URL's database.
pub type MySqlStoreConfig = SqlStoreConfig<MySql>;

/// Most shards a table may have: a relay holding every shard holds one named lock per shard,
/// and `cluster()` asks the server about every shard in one statement.
pub const MAX_SHARDS: u32 = outboxkit_store_sql::config::MAX_SHARDS;

impl SqlStore for MySql {
    const KIND: &'static str = "mysql";
    const CONFIG_TYPE: &'static str = "MySqlStoreConfig";
    const SCHEMES: &'static [&'static str] = &["mysql://", "mariadb://"];
    const URL_FORM: &'static str = "mysql://user:password@host:port/database";
    /// What sqlx 0.9 reads (`sqlx_mysql::options::parse`; it ignores any other without a
    /// word), its TLS options under MySQL's names only: the status line and errors read those
    /// (an alias, `sslmode`, would be reported as the default mode). `tls-sni-servername`
    /// (new in sqlx 0.9) is the name sent as SNI and checked against the certificate, where the
    /// host is an address or another name; a certificate for another name blames it.
    const URL_OPTIONS: Option<&'static [&'static str]> = Some(&[
        "ssl-mode",
        "ssl-ca",
        "ssl-cert",
        "ssl-key",
        "tls-sni-servername",
        "charset",
        "collation",
        "statement-cache-capacity",
        "socket",
        "timezone",
    ]);
    const TLS_NAME_OPTION: Option<&'static str> = Some("tls-sni-servername");
    type Store = crate::MySqlStore;

    fn check_table(table: &str) -> Result<()> {
        TableName::parse(table).map(drop)
    }

    /// `mysql <host>:<port> <database>.<table>`; an unqualified table is in the URL's database.
    fn table_identity(config: &MySqlStoreConfig) -> Option<String> {
        let options: sqlx::mysql::MySqlConnectOptions = config.url.parse().ok()?;
        let table = TableName::parse(&config.table).ok()?;
        Some(format!(
            "mysql {} {}.{}",
            endpoint(&options),
            table.qualifier().or(options.get_database())?,
            table.name()
        ))
    }

    /// An unqualified table is written qualified by the URL's database (none: unqualified).
    fn migration_sql(config: &MySqlStoreConfig) -> Result<Option<String>> {
        let (Ok(options), Ok(table)) = (
            config.url.parse::<sqlx::mysql::MySqlConnectOptions>(),
            TableName::parse(&config.table),
        ) else {
            return Ok(None);
        };
        let table = match (table.qualifier(), options.get_database()) {
            (None, Some(database)) => table.or_in(database),
            _ => table,
        };
        Ok(Some(crate::migrate::script(
            &table,
            config.shards,
            config.payload_type,
        )))
    }

    async fn connect(config: MySqlStoreConfig) -> Result<Self::Store> {
        crate::MySqlStore::connect(config).await
    }

    async fn list_tables(config: &MySqlStoreConfig) -> Result<Vec<(String, String)>> {
        crate::MySqlStore::list_tables(config).await
    }
}

/// How MySQL qualifies, limits and quotes table names: the names of a table's CHECK
/// constraints (unique per database in MySQL) add a suffix of up to 16 bytes to it, and MySQL
/// identifiers are at most 64 bytes. Names are limited to lowercase ASCII letters, digits and
/// `_` (starting with a letter or `_`), so that the name used by the relay is the one writers
/// get with plain unquoted SQL, whatever the server's `lower_case_table_names`; a database name
/// from the URL may hold any character and is always quoted.
impl TableRules for MySql {
    const NAME_RULES: NameRules = NameRules {
        qualifier: "database",
        max_qualifier_len: 64,
        max_name_len: 48,
    };
    const RESERVED: &'static [&'static str] = &[SCHEMA_TABLE, MEMBERS_TABLE];
    const RESERVED_WORDING: &'static str = "is one of the relay's own bookkeeping tables";

    /// A MySQL identifier in backquotes, with backquotes doubled.
    fn quote_ident(ident: &str) -> String {
        format!("`{}`", ident.replace('`', "``"))
    }
}

/// Which relay holds which membership slot (so `status` can name shard owners).
pub(crate) const MEMBERS_TABLE: &str = "outbox_relay_members";

/// A validated outbox table name, `table` or `database.table` ([`TableRules`] of [`MySql`]).
pub type TableName = outboxkit_store_sql::config::TableName<MySql>;

/// Where `options` connect: the Unix socket (`socket=/run/mysqld/mysqld.sock` in the URL),
/// else `host:port` (the host in lowercase).
pub(crate) fn endpoint(options: &sqlx::mysql::MySqlConnectOptions) -> String {
    match options.get_socket() {
        Some(socket) => socket.display().to_string(),
        None => format!(
            "{}:{}",
            options.get_host().to_ascii_lowercase(),
            options.get_port()
        ),
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::config::check_store_settings;
    use outboxkit_store_sql::testkit::check_table_names;

    use super::*;

    /// A TLS mode the driver does not know is named as written, with the modes there are and
    /// the one meant (`verify-ca`, as PostgreSQL writes it, is `VERIFY_CA` here).
    #[test]
    fn a_tls_mode_the_driver_does_not_know_says_what_to_write() {
        outboxkit_store_sql::testkit::check_url_refused::<MySql, sqlx::mysql::MySqlConnectOptions>(
            "mysql://app@db/app?ssl-mode=verify-ca",
            "store.url: ssl-mode=verify-ca is not a TLS mode MySQL knows (one of DISABLED, \
             PREFERRED, REQUIRED, VERIFY_CA, VERIFY_IDENTITY): did you mean ssl-mode=VERIFY_CA?",
        );
    }

    /// `tls-sni-servername` is taken when it is a host name or an IP address, refused naming
    /// it otherwise (TLS could never check a certificate against it).
    #[test]
    fn the_tls_name_option_must_be_a_host_name() {
        let with = |name: &str| {
            MySqlStoreConfig::new(format!(
                "mysql://app@10.0.0.5/app?ssl-mode=VERIFY_IDENTITY&tls-sni-servername={name}"
            ))
            .validate()
        };
        with("db.internal").unwrap();
        with("10.0.0.6").unwrap();
        for (bad, shown) in [("", "\"\""), ("db%20internal", "\"db internal\"")] {
            let e = with(bad).unwrap_err();
            assert_eq!(e.kind(), outboxkit_core::ErrorKind::Config, "{e}");
            assert_eq!(
                e.message(),
                format!(
                    "store.url: tls-sni-servername={shown} is not a host name or an IP address: \
                     set it to the name the server's certificate holds, or leave it out to check \
                     the URL's host"
                )
            );
        }
    }

    /// The settings themselves are tested in `outboxkit-store-sql`; here, what is this store's.
    #[test]
    fn urls_tables_and_debug_are_this_stores() {
        let c: MySqlStoreConfig =
            serde_json::from_str(r#"{"url": "mysql://u:s3cr3t@db:3306/app?ssl-mode=required"}"#)
                .unwrap();
        check_store_settings(&c, "postgres://db/app");
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        check_table_names::<MySql>(
            &[
                ("outbox", None, "`outbox`", "outbox"),
                ("outbox", Some("shop"), "`shop`.`outbox`", "shop.outbox"),
                ("app.outbox_2", None, "`app`.`outbox_2`", "app.outbox_2"),
                // A database name from the URL is quoted, whatever it holds.
                (
                    "outbox",
                    Some("we`ird-db"),
                    "`we``ird-db`.`outbox`",
                    "we`ird-db.outbox",
                ),
            ],
            "`app`.`outbox_relay_schema`",
            &["out`box", "outbox_relay_schema", "app.outbox_relay_members"],
            48,
        );
    }

    /// Two servers on one machine, each behind its own socket, are two servers: a pattern
    /// pipeline on one used to leave alone the tables another pipeline names on the other.
    #[test]
    fn a_table_is_relayed_by_the_configurations_on_its_server() {
        use outboxkit_core::StoreConfig;
        let socket = |path: &str| format!("mysql://u@localhost/app?socket={path}");
        let identity = MySqlStoreConfig::new(socket("/run/a.sock"))
            .table_identity()
            .unwrap();
        assert_eq!(identity, "mysql /run/a.sock app.outbox");
        for (url, same) in [
            (socket("/run/a.sock"), true),
            (socket("/run/b.sock"), false),
            ("mysql://u@localhost/app".to_owned(), false),
        ] {
            let pattern = MySqlStoreConfig::new(url.as_str()).table("*");
            assert_eq!(pattern.relays_table("app.outbox", &identity), same, "{url}");
        }
        let tcp = MySqlStoreConfig::new("mysql://u@DB:3307/app").table_identity();
        assert_eq!(tcp.as_deref(), Some("mysql db:3307 app.outbox"));
    }
}
