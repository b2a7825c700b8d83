//! `[store]` settings of the MySQL / MariaDB store, and the outbox table name.

use std::fmt;
use std::time::Duration;

use outboxkit_core::{Error, Result};
use outboxkit_store_sql::config::{self, NameRules, QualifiedName};
use serde::{Deserialize, Serialize};

/// Settings of the MySQL / MariaDB store (`[store]` with `kind = "mysql"`).
///
/// Durations are human strings (`"5s"`). The `Debug` output hides the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MySqlStoreConfig {
    /// `mysql://user:password@host:port/database?ssl-mode=...` (`mariadb://` is accepted too).
    pub url: String,
    /// Outbox table, optionally qualified by its database (`app.outbox`); an unqualified name
    /// lives in the URL's database. Lowercase letters, digits, `_`.
    #[serde(default = "outboxkit_store_sql::config::default_table")]
    pub table: String,
    /// Number of shards, used only when `migrate` creates the table (then read from the database).
    #[serde(default = "outboxkit_store_sql::config::default_shards")]
    pub shards: u32,
    /// Connections of the pool used for migrations, inserts, purge and status (sessions that
    /// hold shard locks have a dedicated connection each).
    #[serde(default = "outboxkit_store_sql::config::default_pool_size")]
    pub pool_size: u32,
    /// Longest wait for a connection.
    #[serde(
        default = "outboxkit_store_sql::config::default_connect_timeout",
        with = "humantime_serde"
    )]
    pub connect_timeout: Duration,
    /// Longest a single call on a shard session may take. Past it the session is given up (the
    /// server releases its locks) and the relay opens a new one. Also set as the session's
    /// statement time limit (`max_statement_time` on MariaDB, `max_execution_time` on MySQL) and
    /// lock wait timeouts.
    #[serde(
        default = "outboxkit_store_sql::config::default_session_timeout",
        with = "humantime_serde"
    )]
    pub session_timeout: Duration,
}

/// Most shards a table may have: a relay holding every shard holds one named lock per shard,
/// and `cluster()` asks the server about every shard in one statement.
pub const MAX_SHARDS: u32 = outboxkit_store_sql::config::MAX_SHARDS;

impl MySqlStoreConfig {
    /// A configuration with every default and this URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            table: config::default_table(),
            shards: config::default_shards(),
            pool_size: config::default_pool_size(),
            connect_timeout: config::default_connect_timeout(),
            session_timeout: config::default_session_timeout(),
        }
    }

    /// Use this table (optionally `database.table`).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Create the table with this many shards.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// The URL with its password replaced by `***`, for logs.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Check what serde cannot; each error names its key under `store.`.
    pub fn validate(&self) -> Result<()> {
        config::check_url(
            &self.url,
            &["mysql://", "mariadb://"],
            "mysql://user:password@host:port/database",
        )?;
        TableName::parse(&self.table).map_err(|e| e.context("store.table"))?;
        config::check_limits(
            self.shards,
            self.pool_size,
            self.connect_timeout,
            self.session_timeout,
        )
    }
}

impl fmt::Debug for MySqlStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStoreConfig")
            .field("url", &self.redacted_url())
            .field("table", &self.table)
            .field("shards", &self.shards)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("session_timeout", &self.session_timeout)
            .finish()
    }
}

pub(crate) use outboxkit_store_sql::config::redact_url;

/// How MySQL qualifies and limits table names: the names of a table's CHECK constraints (unique
/// per database in MySQL) add a suffix of up to 16 bytes to it, and MySQL identifiers are at
/// most 64 bytes.
const NAME_RULES: NameRules = NameRules {
    qualifier: "database",
    max_qualifier_len: 64,
    max_name_len: 48,
};

/// The bookkeeping table of migrations, in the outbox table's database.
pub(crate) const SCHEMA_TABLE: &str = "outbox_relay_schema";
/// Which relay holds which membership slot (so `status` can name shard owners).
pub(crate) const MEMBERS_TABLE: &str = "outbox_relay_members";

/// A validated outbox table name, `table` or `database.table`.
///
/// Names are limited to lowercase ASCII letters, digits and `_` (starting with a letter or `_`),
/// so that the name used by the relay is the one writers get with plain unquoted SQL, whatever
/// the server's `lower_case_table_names`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(QualifiedName);

impl TableName {
    /// Parse `table` or `database.table`.
    pub fn parse(text: &str) -> Result<Self> {
        let parsed = QualifiedName::parse(text, &NAME_RULES)?;
        let name = parsed.name();
        if name == SCHEMA_TABLE || name == MEMBERS_TABLE {
            return Err(Error::config(format!(
                "\"{}\": {name} is one of the relay's own bookkeeping tables, choose another name",
                text.trim()
            )));
        }
        Ok(Self(parsed))
    }

    /// The database, when qualified.
    pub fn database(&self) -> Option<&str> {
        self.0.qualifier()
    }

    /// The table name without database.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The same table in `database` (when it had none). The database name comes from the URL
    /// and may hold any character: it is always quoted.
    pub(crate) fn in_database(self, database: &str) -> Self {
        Self(self.0.or_in(database))
    }

    /// `` `database`.`table` `` or `` `table` ``, for SQL.
    pub fn quoted(&self) -> String {
        self.quoted_sibling(self.name())
    }

    /// Another table of the same database, quoted.
    pub(crate) fn quoted_sibling(&self, name: &str) -> String {
        match self.database() {
            Some(database) => format!("{}.{}", quote_ident(database), quote_ident(name)),
            None => quote_ident(name),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableName")
            .field("database", &self.database())
            .field("name", &self.name())
            .finish()
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A MySQL identifier in backquotes, with backquotes doubled.
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

/// `kind = "mysql"` (MySQL 8.0.16+ and MariaDB 10.6+): the rest of `[store]` is this type.
impl outboxkit_core::StoreConfig for MySqlStoreConfig {
    const KIND: &'static str = "mysql";
    type Store = crate::MySqlStore;

    fn validate(&self) -> Result<()> {
        MySqlStoreConfig::validate(self)
    }

    async fn build(self) -> Result<Self::Store> {
        crate::MySqlStore::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxkit_core::ErrorKind;

    #[test]
    fn defaults_apply_and_unknown_keys_are_refused() {
        let c: MySqlStoreConfig =
            serde_json::from_str(r#"{"url": "mysql://u:secret@db:3306/app"}"#).unwrap();
        assert_eq!(c, MySqlStoreConfig::new("mysql://u:secret@db:3306/app"));
        assert_eq!(c.table, "outbox");
        assert_eq!(c.shards, 64);
        assert_eq!(c.pool_size, 4);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.session_timeout, Duration::from_secs(30));
        c.validate().unwrap();

        let c: MySqlStoreConfig = serde_json::from_str(
            r#"{"url": "mariadb://db/app", "table": "app.events", "connect_timeout": "250ms",
                "session_timeout": "1m"}"#,
        )
        .unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.session_timeout, Duration::from_secs(60));
        c.validate().unwrap();

        let e =
            serde_json::from_str::<MySqlStoreConfig>(r#"{"url": "mysql://db/app", "tabel": "x"}"#)
                .unwrap_err();
        assert!(e.to_string().contains("tabel"), "{e}");
        let e = serde_json::from_str::<MySqlStoreConfig>(r#"{"table": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("url"), "{e}");
    }

    #[test]
    fn debug_and_redacted_url_hide_the_password() {
        let c = MySqlStoreConfig::new("mysql://app:s3cr3t@db.internal:3307/app?ssl-mode=required");
        assert_eq!(
            c.redacted_url(),
            "mysql://app:***@db.internal:3307/app?ssl-mode=required"
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3cr3t") && debug.contains("***"),
            "{debug}"
        );
        let c = MySqlStoreConfig::new("mysql://db/app?user=app&password=s3cr3t");
        assert!(!c.redacted_url().contains("s3cr3t"), "{}", c.redacted_url());
        assert_eq!(
            MySqlStoreConfig::new("mysql://db/app").redacted_url(),
            "mysql://db/app"
        );
        assert!(!redact_url("my sql://a:s3cr3t@").contains("s3cr3t"));
    }

    #[test]
    fn validate_names_the_key() {
        let base = || MySqlStoreConfig::new("mysql://db/app");
        let bad = [
            (MySqlStoreConfig::new("postgres://db/app"), "store.url"),
            (base().table("Outbox"), "store.table"),
            (base().table("a.b.c"), "store.table"),
            (base().shards(0), "store.shards"),
            (base().shards(5000), "store.shards"),
            (
                MySqlStoreConfig {
                    pool_size: 0,
                    ..base()
                },
                "store.pool_size",
            ),
            (
                MySqlStoreConfig {
                    connect_timeout: Duration::ZERO,
                    ..base()
                },
                "store.connect_timeout",
            ),
            (
                MySqlStoreConfig {
                    session_timeout: Duration::from_millis(10),
                    ..base()
                },
                "store.session_timeout",
            ),
        ];
        for (config, key) in bad {
            let e = config.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().starts_with(key), "{key}: {e}");
        }
    }

    #[test]
    fn table_names_are_validated_and_quoted() {
        let t = TableName::parse("outbox").unwrap();
        assert_eq!((t.database(), t.name()), (None, "outbox"));
        assert_eq!(t.quoted(), "`outbox`");
        let t = t.in_database("shop");
        assert_eq!(t.quoted(), "`shop`.`outbox`");
        assert_eq!(t.to_string(), "shop.outbox");

        let t = TableName::parse("app.outbox_2").unwrap();
        assert_eq!(t.quoted(), "`app`.`outbox_2`");
        assert_eq!(
            t.quoted_sibling(SCHEMA_TABLE),
            "`app`.`outbox_relay_schema`"
        );
        assert_eq!(t.clone().in_database("other"), t);

        // A database name from the URL is quoted, whatever it holds.
        let t = TableName::parse("outbox").unwrap().in_database("we`ird-db");
        assert_eq!(t.quoted(), "`we``ird-db`.`outbox`");

        for bad in [
            "",
            "a.",
            ".a",
            "a.b.c",
            "Outbox",
            "1outbox",
            "out box",
            "out`box",
            "outbox;drop table x",
            "outbox_relay_schema",
            "app.outbox_relay_members",
            &"x".repeat(49),
        ] {
            let e = TableName::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
        }
        TableName::parse(&"x".repeat(48)).unwrap();
    }
}
