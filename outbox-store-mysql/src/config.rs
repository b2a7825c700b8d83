//! `[store]` settings of the MySQL / MariaDB store, and the outbox table name.

use std::fmt;

use outboxkit_core::{Error, Result};
use outboxkit_store_sql::config::{NameRules, QualifiedName, SqlStore, SqlStoreConfig};

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
    type Store = crate::MySqlStore;

    fn check_table(table: &str) -> Result<()> {
        TableName::parse(table).map(drop)
    }

    /// `mysql <host>:<port> <database>.<table>`; an unqualified table is in the URL's database.
    fn table_identity(config: &MySqlStoreConfig) -> Option<String> {
        let options: sqlx::mysql::MySqlConnectOptions = config.url.parse().ok()?;
        let table = TableName::parse(&config.table).ok()?;
        Some(format!(
            "mysql {}:{} {}.{}",
            options.get_host().to_ascii_lowercase(),
            options.get_port(),
            table.database().or(options.get_database())?,
            table.name()
        ))
    }

    async fn connect(config: MySqlStoreConfig) -> Result<Self::Store> {
        crate::MySqlStore::connect(config).await
    }

    async fn list_tables(config: &MySqlStoreConfig) -> Result<Vec<(String, String)>> {
        crate::MySqlStore::list_tables(config).await
    }
}

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

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::config::check_store_settings;

    use super::*;
    use outboxkit_core::ErrorKind;

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
