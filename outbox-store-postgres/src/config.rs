//! `[store]` settings of the PostgreSQL store, and the outbox table name.

use std::fmt;
use std::time::Duration;

use outboxkit_core::{Error, Result};
use outboxkit_store_sql::config::{self, NameRules, QualifiedName};
use serde::{Deserialize, Serialize};

/// Settings of the PostgreSQL store (`[store]` with `kind = "postgres"`).
///
/// Durations are human strings (`"5s"`). The `Debug` output hides the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresStoreConfig {
    /// `postgres://user:password@host:port/database?sslmode=...`
    pub url: String,
    /// Outbox table, optionally schema-qualified (`app.outbox`). Lowercase letters, digits, `_`.
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
    /// Longest a single call on a shard session may take. Past it the session is given up (its
    /// locks are released by the server) and the relay opens a new one. Also set as the session's
    /// `statement_timeout`.
    #[serde(
        default = "outboxkit_store_sql::config::default_session_timeout",
        with = "humantime_serde"
    )]
    pub session_timeout: Duration,
}

/// Most shards a table may have: each owned shard is one advisory lock in PostgreSQL's shared
/// lock table, which is sized by `max_locks_per_transaction × max_connections`.
pub const MAX_SHARDS: u32 = outboxkit_store_sql::config::MAX_SHARDS;

impl PostgresStoreConfig {
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

    /// Use this table (optionally `schema.table`).
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
            &["postgres://", "postgresql://"],
            "postgres://user:password@host:port/database",
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

impl fmt::Debug for PostgresStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStoreConfig")
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
        if name.name() == SCHEMA_TABLE {
            return Err(Error::config(format!(
                "\"{}\": {SCHEMA_TABLE} is the relay's own bookkeeping table, choose another name",
                text.trim()
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

/// `kind = "postgres"`: the rest of `[store]` is this type.
impl outboxkit_core::StoreConfig for PostgresStoreConfig {
    const KIND: &'static str = "postgres";
    type Store = crate::PostgresStore;

    fn validate(&self) -> Result<()> {
        PostgresStoreConfig::validate(self)
    }

    async fn build(self) -> Result<Self::Store> {
        crate::PostgresStore::connect(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxkit_core::ErrorKind;

    #[test]
    fn defaults_apply_and_unknown_keys_are_refused() {
        let c: PostgresStoreConfig =
            serde_json::from_str(r#"{"url": "postgres://u:secret@db:5432/app"}"#).unwrap();
        assert_eq!(
            c,
            PostgresStoreConfig::new("postgres://u:secret@db:5432/app")
        );
        assert_eq!(c.table, "outbox");
        assert_eq!(c.shards, 64);
        assert_eq!(c.pool_size, 4);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        c.validate().unwrap();

        let c: PostgresStoreConfig = serde_json::from_str(
            r#"{"url": "postgres://db/app", "table": "app.events", "connect_timeout": "250ms",
                "session_timeout": "1m"}"#,
        )
        .unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.session_timeout, Duration::from_secs(60));

        let e = serde_json::from_str::<PostgresStoreConfig>(
            r#"{"url": "postgres://db/app", "tabel": "x"}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("tabel"), "{e}");
        let e = serde_json::from_str::<PostgresStoreConfig>(r#"{"table": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("url"), "{e}");
    }

    #[test]
    fn debug_and_redacted_url_hide_the_password() {
        let c =
            PostgresStoreConfig::new("postgres://app:s3cr3t@db.internal:6432/app?sslmode=require");
        assert_eq!(
            c.redacted_url(),
            "postgres://app:***@db.internal:6432/app?sslmode=require"
        );
        let debug = format!("{c:?}");
        assert!(
            !debug.contains("s3cr3t") && debug.contains("***"),
            "{debug}"
        );

        let c = PostgresStoreConfig::new("postgres://db/app?user=app&password=s3cr3t");
        assert!(!c.redacted_url().contains("s3cr3t"), "{}", c.redacted_url());
        assert_eq!(
            PostgresStoreConfig::new("postgres://db/app").redacted_url(),
            "postgres://db/app"
        );
        assert!(!redact_url("pos tgres://a:s3cr3t@").contains("s3cr3t"));
    }

    #[test]
    fn validate_names_the_key() {
        let bad = [
            (PostgresStoreConfig::new("mysql://db/app"), "store.url"),
            (
                PostgresStoreConfig::new("postgres://db/app").table("Outbox"),
                "store.table",
            ),
            (
                PostgresStoreConfig::new("postgres://db/app").table("a.b.c"),
                "store.table",
            ),
            (
                PostgresStoreConfig::new("postgres://db/app").shards(0),
                "store.shards",
            ),
            (
                PostgresStoreConfig::new("postgres://db/app").shards(5000),
                "store.shards",
            ),
            (
                PostgresStoreConfig {
                    pool_size: 0,
                    ..PostgresStoreConfig::new("postgres://db/app")
                },
                "store.pool_size",
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
