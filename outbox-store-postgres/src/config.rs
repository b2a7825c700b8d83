//! `[store]` settings of the PostgreSQL store, and the outbox table name.

use std::fmt;

use outboxkit_core::{Error, Result};
use outboxkit_store_sql::config::{NameRules, QualifiedName, SqlStore, SqlStoreConfig};

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
            "postgres {}:{}/{} {}.{}",
            options.get_host().to_ascii_lowercase(),
            options.get_port(),
            options.get_database().unwrap_or(options.get_username()),
            table.schema().unwrap_or("public"),
            table.name()
        ))
    }

    async fn connect(config: PostgresStoreConfig) -> Result<Self::Store> {
        crate::PostgresStore::connect(config).await
    }

    async fn list_tables(config: &PostgresStoreConfig) -> Result<Vec<(String, String)>> {
        crate::PostgresStore::list_tables(config).await
    }
}

/// How PostgreSQL qualifies and limits table names: index names add a suffix of up to 14 bytes
/// to a table name and PostgreSQL cuts identifiers at 63 bytes.
const NAME_RULES: NameRules = NameRules {
    qualifier: "schema",
    max_qualifier_len: 63,
    max_name_len: 49,
};

/// The bookkeeping table of migrations, in the outbox table's schema.
pub(crate) const SCHEMA_TABLE: &str = "outbox_relay_schema";

/// A validated outbox table name, `table` or `schema.table`.
///
/// Names are limited to lowercase ASCII letters, digits and `_` (starting with a letter or `_`),
/// so that the quoted name used by the relay is the one writers get with plain unquoted SQL.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(QualifiedName);

impl TableName {
    /// Parse `table` or `schema.table`.
    pub fn parse(text: &str) -> Result<Self> {
        let name = QualifiedName::parse(text, &NAME_RULES)?;
        if name.name() == SCHEMA_TABLE || name.name() == crate::logical::setup::CAPTURE_TABLE {
            return Err(Error::config(format!(
                "\"{}\": {} is the relay's own bookkeeping table, choose another name",
                text.trim(),
                name.name()
            )));
        }
        Ok(Self(name))
    }

    /// The schema, when qualified.
    pub fn schema(&self) -> Option<&str> {
        self.0.qualifier()
    }

    /// The table name without schema.
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// The same table in `schema` (when it had none).
    pub(crate) fn in_schema(self, schema: &str) -> Self {
        Self(self.0.or_in(schema))
    }

    /// `"schema"."table"` or `"table"`, for SQL.
    pub fn quoted(&self) -> String {
        self.quoted_sibling(self.name())
    }

    /// Another relation of the same schema, quoted.
    pub(crate) fn quoted_sibling(&self, name: &str) -> String {
        match self.schema() {
            Some(schema) => format!("\"{schema}\".\"{name}\""),
            None => format!("\"{name}\""),
        }
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableName")
            .field("schema", &self.schema())
            .field("name", &self.name())
            .finish()
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use outboxkit_store_sql::config::check_store_settings;

    use super::*;
    use outboxkit_core::ErrorKind;

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
        let t = TableName::parse("outbox").unwrap();
        assert_eq!((t.schema(), t.name()), (None, "outbox"));
        assert_eq!(t.quoted(), "\"outbox\"");
        let t = t.in_schema("public");
        assert_eq!(t.quoted(), "\"public\".\"outbox\"");
        assert_eq!(t.to_string(), "public.outbox");

        let t = TableName::parse("app.outbox_2").unwrap();
        assert_eq!(t.quoted(), "\"app\".\"outbox_2\"");
        assert_eq!(
            t.quoted_sibling(SCHEMA_TABLE),
            "\"app\".\"outbox_relay_schema\""
        );
        assert_eq!(t.clone().in_schema("public"), t);

        for bad in [
            "",
            "a.",
            ".a",
            "a.b.c",
            "Outbox",
            "1outbox",
            "out box",
            "out\"box",
            "outbox;drop table x",
            "outbox_relay_schema",
            &"x".repeat(50),
        ] {
            let e = TableName::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config, "{bad}");
        }
        TableName::parse(&"x".repeat(49)).unwrap();
    }
}
