//! What the `[store]` settings of the SQL stores share: defaults, checks, the password-free
//! URL, and the rules of table names.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use outboxkit_core::{Error, PayloadType, Result};
use serde::{Deserialize, Serialize};

use crate::classify::{Dialect, Target};

/// What a SQL store fills in of the shared `[store]` settings: its kind, the URLs it takes, the
/// rules of its table names, and how it connects.
pub trait SqlStore: Sized + Clone + Eq + Send + Sync + 'static {
    /// `store.kind`: `postgres`, `mysql`.
    const KIND: &'static str;
    /// The settings type as `Debug` names it: `PostgresStoreConfig`.
    const CONFIG_TYPE: &'static str;
    /// The URL schemes `store.url` may start with.
    const SCHEMES: &'static [&'static str];
    /// The whole form of `store.url`, shown when it has another scheme.
    const URL_FORM: &'static str;
    /// The query options of `store.url` the store takes (one ending in `[` stands for every key
    /// it starts): what its driver reads, under the names the relay itself reads. Any other is
    /// refused: the driver would ignore it (a misspelt `sslmode` would connect without the TLS
    /// it asks for), or the relay would (an alias). `None`: not checked.
    const URL_OPTIONS: Option<&'static [&'static str]> = None;
    /// The query option of `store.url` that names the server for TLS apart from the host it
    /// connects to (MySQL's `tls-sni-servername`), if the store has one: it must be a host name
    /// or an IP address, and a certificate for another name blames it.
    const TLS_NAME_OPTION: Option<&'static str> = None;
    /// The store [`SqlStoreConfig::build`](outboxkit_core::StoreConfig::build) returns.
    type Store: outboxkit_core::Store;
    /// Whether the store can read its events from the database's log (`store.capture =
    /// "logical"`); a store that cannot refuses the setting.
    const LOG_CAPTURE: bool = false;

    /// Check `store.table` (errors without the key; the caller adds it).
    fn check_table(table: &str) -> Result<()>;
    /// The table `config` names, as [`StoreConfig::table_identity`](outboxkit_core::StoreConfig::table_identity)
    /// describes: equal for the same host, port, database and qualified table.
    fn table_identity(_config: &SqlStoreConfig<Self>) -> Option<String> {
        None
    }
    /// The SQL that creates the table `config` names (one table) at the current schema
    /// version, as `migrate` does, with what its `capture` needs: see
    /// [`StoreConfig::migration_sql`](outboxkit_core::StoreConfig::migration_sql).
    fn migration_sql(_config: &SqlStoreConfig<Self>) -> Result<Option<String>> {
        Ok(None)
    }
    /// Connect and return the store; called after `validate` passed.
    fn connect(config: SqlStoreConfig<Self>) -> impl Future<Output = Result<Self::Store>> + Send;
    /// Every table the configuration's user can see, as (schema or database, table), system
    /// ones aside: what a pattern `store.table` is matched against. One short connection.
    fn list_tables(
        config: &SqlStoreConfig<Self>,
    ) -> impl Future<Output = Result<Vec<(String, String)>>> + Send;
}

/// The `[store]` settings of a SQL store, `kind` aside: one type for every SQL store, so that a
/// setting (and its check) is written once. Each store names it: `PostgresStoreConfig`,
/// `MySqlStoreConfig`.
///
/// Durations are human strings (`"5s"`). The `Debug` output hides the password.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, bound = "")]
pub struct SqlStoreConfig<S: SqlStore> {
    /// `postgres://user:password@host:port/database?sslmode=...`,
    /// `mysql://user:password@host:port/database?ssl-mode=...` (`mariadb://` is accepted too).
    pub url: String,
    /// The password, when it is not in `url` (it then replaces the URL's). Usually given as
    /// `password_file`, a file read at start (the binary's loader resolves every `*password_file`
    /// key). Never logged: `Debug` shows `***`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Outbox table, optionally qualified by its schema (PostgreSQL) or database (MySQL):
    /// `app.outbox`; an unqualified name lives in the connection's default one. Lowercase
    /// letters, digits, `_`.
    #[serde(default = "default_table")]
    pub table: String,
    /// Number of shards, used only when `migrate` creates the table (then read from the database).
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// How the table stores payloads: `json` (validated and normalized by the database),
    /// `text` or `binary` (both delivered byte for byte). `migrate` creates the table with it
    /// (`json` when unset); the relay reads the table's real type from the catalog, and when this
    /// is set and differs, refuses to start, saying how to convert the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_type: Option<PayloadType>,
    /// Connections of the pool used for migrations, inserts, purge and status (sessions that
    /// hold shard locks have a dedicated connection each).
    #[serde(default = "default_pool_size")]
    pub pool_size: u32,
    /// Longest wait for a connection.
    #[serde(default = "default_connect_timeout", with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Longest a single call on a shard session may take. Past it the session is given up (the
    /// server releases its locks) and the relay opens a new one. Also set as the session's
    /// statement time limit (`statement_timeout` on PostgreSQL, `max_statement_time` on
    /// MariaDB, `max_execution_time` on MySQL) and lock wait timeouts.
    #[serde(default = "default_session_timeout", with = "humantime_serde")]
    pub session_timeout: Duration,
    /// With a pattern `table` (`*.outbox`, `tenant_*.outbox`): how often to look for new and
    /// dropped tables.
    #[serde(default = "default_discovery_interval", with = "humantime_serde")]
    pub discovery_interval: Duration,
    /// With a pattern `table`: refuse to start when it matches no table (otherwise a warning).
    #[serde(default)]
    pub require_match: bool,
    /// How the relay learns of new events: `poll` (claims on the table, the default) or
    /// `logical` (the database's log, through a replication slot; PostgreSQL).
    #[serde(default)]
    pub capture: Capture,
    /// `[store.logical]`: settings of `capture = "logical"`.
    #[serde(default)]
    pub logical: LogicalSettings,
    #[serde(skip)]
    store: PhantomData<S>,
}

impl<S: SqlStore> SqlStoreConfig<S> {
    /// A configuration with every default and this URL.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            password: None,
            table: default_table(),
            shards: default_shards(),
            payload_type: None,
            pool_size: default_pool_size(),
            connect_timeout: default_connect_timeout(),
            session_timeout: default_session_timeout(),
            discovery_interval: default_discovery_interval(),
            require_match: false,
            capture: Capture::Poll,
            logical: LogicalSettings::default(),
            store: PhantomData,
        }
    }

    /// Whether `table` is a pattern (it holds a `*`).
    pub fn is_pattern(&self) -> bool {
        self.table.contains('*')
    }

    /// The tables of `tables` (as [`SqlStore::list_tables`] gives them) that the pattern
    /// `table` matches and that are valid outbox table names, each as its qualified name and
    /// this configuration with `table` set to it, in name order.
    pub fn matching(&self, tables: Vec<(String, String)>) -> Vec<(String, Self)> {
        let mut found: Vec<(String, Self)> = tables
            .into_iter()
            .map(|(qualifier, name)| format!("{qualifier}.{name}"))
            .filter(|qualified| glob_match(&self.table, qualified))
            .filter(|qualified| S::check_table(qualified).is_ok())
            .map(|qualified| (qualified.clone(), self.clone().table(qualified)))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.dedup_by(|a, b| a.0 == b.0);
        found
    }

    /// Use this table (optionally qualified).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// Create the table with this many shards.
    pub fn shards(mut self, shards: u32) -> Self {
        self.shards = shards;
        self
    }

    /// The options of the store's pool: at most `pool_size` connections, opened when needed,
    /// waited for at most `connect_timeout`.
    pub fn pool_options<DB: sqlx::Database>(&self) -> sqlx::pool::PoolOptions<DB> {
        sqlx::pool::PoolOptions::new()
            .max_connections(self.pool_size)
            .min_connections(0)
            .acquire_timeout(self.connect_timeout)
    }

    /// The store as `status` describes it: `PostgreSQL <URL without password>, table
    /// public.outbox, TLS TLSv1.3 (sslmode=verify-full)`.
    pub fn describe(&self, product: &str, table: &dyn fmt::Display, tls: &str) -> String {
        format!("{product} {}, table {table}, {tls}", self.redacted_url())
    }

    /// What errors name of the server this configuration connects to, about `table`: where it
    /// is (`endpoint`, `database`, `user`, as the driver's options read them) and the URL's TLS
    /// options under the names the store's dialect gives them.
    pub fn target(
        &self,
        endpoint: String,
        database: Option<String>,
        user: String,
        table: String,
    ) -> Target
    where
        S: Dialect,
    {
        Target {
            endpoint: Some(endpoint),
            database,
            user: Some(user),
            table,
            ca_file: url_option(&self.url, S::CA_OPTION),
            tls_mode: url_option(&self.url, S::TLS_OPTION),
            password_key: self.password.is_some(),
            product: None,
            tls_name_option: S::TLS_NAME_OPTION
                .filter(|option| url_option(&self.url, option).is_some()),
        }
    }

    /// The URL with its password replaced by `***`, for logs.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Check what serde cannot; each error names its key under `store.`.
    pub fn validate(&self) -> Result<()> {
        check_url(&self.url, S::SCHEMES, S::URL_FORM)?;
        if let Some(known) = S::URL_OPTIONS {
            check_url_options(&self.url, known)?;
        }
        if let Some(option) = S::TLS_NAME_OPTION {
            check_tls_name(&self.url, option)?;
        }
        if self.is_pattern() {
            check_pattern::<S>(&self.table)?;
            if self.discovery_interval < Duration::from_secs(1) {
                return Err(Error::config(
                    "store.discovery_interval: must be at least 1s",
                ));
            }
        } else {
            S::check_table(&self.table).map_err(|e| e.context("store.table"))?;
        }
        check_limits(
            self.shards,
            self.pool_size,
            self.connect_timeout,
            self.session_timeout,
        )?;
        if self.capture == Capture::Logical {
            if !S::LOG_CAPTURE {
                return Err(Error::config(format!(
                    "store.capture: \"logical\" is not available for {} stores (PostgreSQL only); \
                     use \"poll\"",
                    S::KIND
                )));
            }
            self.logical.validate()?;
            if self.is_pattern()
                && (self.logical.slot.is_some() || self.logical.publication.is_some())
            {
                return Err(Error::config(
                    "store.logical.slot: cannot be set with a pattern store.table: each table \
                     found gets its own slot and publication, outbox_relay_<schema>_<table> \
                     (cut to 63 bytes with a hash of the name when longer)",
                ));
            }
        }
        Ok(())
    }

    /// Use this capture mode.
    pub fn capture(mut self, capture: Capture) -> Self {
        self.capture = capture;
        self
    }
}

impl<S: SqlStore + Dialect> SqlStoreConfig<S> {
    /// The driver's options of `url`, given `password` (through `with_password`) when it is
    /// set; a URL the driver refuses is a `store.url` error.
    pub fn connect_options<O: sqlx::ConnectOptions>(
        &self,
        with_password: impl FnOnce(O, &str) -> O,
    ) -> Result<O> {
        let options = O::from_str(&self.url).map_err(|e| {
            if let Some(refused) = unknown_tls_mode::<S>(&self.url) {
                return Error::config(refused);
            }
            // sqlx wraps its own configuration error in another: say "error with
            // configuration" once.
            let e = e.to_string();
            let prefix = "error with configuration: ";
            let mut reason = e.as_str();
            while reason.starts_with(prefix) && reason[prefix.len()..].starts_with(prefix) {
                reason = &reason[prefix.len()..];
            }
            Error::config(format!(
                "store.url: \"{}\" is not a valid {} URL: {reason}{}",
                self.redacted_url(),
                S::PRODUCT,
                outboxkit_core::redact::reserved_characters_hint(&self.url)
            ))
        })?;
        Ok(match &self.password {
            Some(password) => with_password(options, password),
            None => options,
        })
    }
}

impl<S: SqlStore> fmt::Debug for SqlStoreConfig<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(S::CONFIG_TYPE)
            .field("url", &self.redacted_url())
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("table", &self.table)
            .field("shards", &self.shards)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("session_timeout", &self.session_timeout)
            .field("discovery_interval", &self.discovery_interval)
            .field("require_match", &self.require_match)
            .field("capture", &self.capture)
            .field("logical", &self.logical)
            .finish()
    }
}

/// `kind = S::KIND`: the rest of `[store]` is this type.
impl<S: SqlStore> outboxkit_core::StoreConfig for SqlStoreConfig<S> {
    const KIND: &'static str = S::KIND;
    type Store = S::Store;

    fn validate(&self) -> Result<()> {
        SqlStoreConfig::validate(self)
    }

    fn table_identity(&self) -> Option<String> {
        if self.is_pattern() {
            return None;
        }
        S::table_identity(self)
    }

    fn relays_table(&self, table: &str, identity: &str) -> bool {
        if !self.is_pattern() {
            return S::table_identity(self).as_deref() == Some(identity);
        }
        glob_match(&self.table, table)
            && S::table_identity(&self.clone().table(table)).as_deref() == Some(identity)
    }

    fn discovery(&self) -> Option<outboxkit_core::Discovery> {
        self.is_pattern().then_some(outboxkit_core::Discovery {
            interval: self.discovery_interval,
            require_match: self.require_match,
        })
    }

    async fn discover(&self) -> Result<Vec<(String, Self)>> {
        Ok(self.matching(S::list_tables(self).await?))
    }

    /// A pattern names no one table: refused naming the key.
    fn migration_sql(&self) -> Result<Option<String>> {
        if self.is_pattern() {
            return Err(Error::config(format!(
                "store.table: `{}` is a pattern; --print-sql writes one table's SQL: set \
                 store.table to that table for the command",
                self.table
            )));
        }
        S::migration_sql(self)
    }

    fn build(self) -> impl Future<Output = Result<Self::Store>> + Send {
        S::connect(self)
    }
}

/// What every SQL store checks of its settings in its tests (feature `testkit`): `config`, whose
/// URL has the password `s3cr3t`, is valid and its `Debug` names the store's settings type
/// without the password; a URL of each of the store's schemes is valid; a URL of another store
/// (`other_url`), a table name that is not valid and the relay's bookkeeping table are refused,
/// each under its key.
#[cfg(feature = "testkit")]
pub fn check_store_settings<S: SqlStore>(config: &SqlStoreConfig<S>, other_url: &str) {
    config.validate().unwrap();
    let debug = format!("{config:?}");
    assert!(
        debug.starts_with(&format!("{} {{", S::CONFIG_TYPE)) && !debug.contains("s3cr3t"),
        "{debug}"
    );
    let in_scheme = |scheme: &str| SqlStoreConfig::<S>::new(format!("{scheme}db/app"));
    for scheme in S::SCHEMES {
        in_scheme(scheme).table("app.events").validate().unwrap();
    }
    let base = || in_scheme(S::SCHEMES[0]);
    let bad = [
        (SqlStoreConfig::<S>::new(other_url), "store.url"),
        (base().table("Outbox"), "store.table"),
        (base().table("a.b.c"), "store.table"),
        (base().table("outbox_relay_schema"), "store.table"),
    ];
    for (config, key) in bad {
        let e = config.validate().unwrap_err();
        assert_eq!(e.kind(), outboxkit_core::ErrorKind::Config);
        assert!(e.message().starts_with(key), "{key}: {e}");
    }
    // The options the driver reads pass; one it would ignore is refused, the closest named.
    let with_query =
        |query: &str| SqlStoreConfig::<S>::new(format!("{}db/app?{query}", S::SCHEMES[0]));
    let Some(known) = S::URL_OPTIONS else { return };
    for option in known {
        let key = option.replace('[', "[search_path]");
        with_query(&format!("{key}=x")).validate().unwrap();
    }
    let tls_mode = known
        .iter()
        .find(|k| k.contains("mode"))
        .expect("a TLS mode option");
    let misspelt = tls_mode.replacen('e', "", 1);
    let e = with_query(&format!("{misspelt}=x")).validate().unwrap_err();
    assert_eq!(
        e.message(),
        format!("store.url: unknown option `{misspelt}`: did you mean `{tls_mode}`?")
    );
    let e = with_query("connect_timeout=10").validate().unwrap_err();
    assert!(
        e.message().starts_with(
            "store.url: unknown option `connect_timeout`, which would be ignored: remove it \
             (the options the relay takes: "
        ) && e.message().contains(tls_mode),
        "{e}"
    );
}

/// Most shards a table may have.
pub const MAX_SHARDS: u32 = 1024;

/// `store.capture`: how the relay learns of new events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Capture {
    /// Claim pending rows of the table (works everywhere).
    #[default]
    Poll,
    /// Read committed events from the database's log through a replication slot.
    Logical,
}

/// `store.logical.style`: what writers write when the relay reads the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CaptureStyle {
    /// Rows inserted into the outbox table, as with polling; the relay deletes (or marks) them.
    #[default]
    Table,
    /// Messages written into the log by the table's emit function; no row per event.
    Message,
}

impl CaptureStyle {
    /// `table` or `message`.
    pub fn as_str(self) -> &'static str {
        match self {
            CaptureStyle::Table => "table",
            CaptureStyle::Message => "message",
        }
    }
}

/// `[store.logical]`: the settings of `capture = "logical"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogicalSettings {
    /// `table` (writers insert rows) or `message` (writers call the emit function).
    #[serde(default)]
    pub style: CaptureStyle,
    /// The replication slot; default `outbox_relay_<schema>_<table>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<String>,
    /// The publication (table style); default the slot's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publication: Option<String>,
    /// Most events read from the log and not yet settled (acknowledged or dead) that the relay
    /// keeps in memory; past it, it stops reading (in the middle of a transaction too) and the
    /// server waits.
    #[serde(default = "default_max_unsettled")]
    pub max_unsettled: usize,
    /// Most payload bytes of those events: the bound that holds for large payloads, where
    /// `max_unsettled` events would take gigabytes. Past it, it stops reading as well.
    #[serde(default = "default_max_unsettled_bytes")]
    pub max_unsettled_bytes: usize,
    /// A standby relay takes the slot over when the relay reading it has not reported to the
    /// server for this long (it is partitioned away or hung): it ends that reader's connection.
    #[serde(default = "default_takeover_after", with = "humantime_serde")]
    pub takeover_after: Duration,
}

impl Default for LogicalSettings {
    fn default() -> Self {
        Self {
            style: CaptureStyle::Table,
            slot: None,
            publication: None,
            max_unsettled: default_max_unsettled(),
            max_unsettled_bytes: default_max_unsettled_bytes(),
            takeover_after: default_takeover_after(),
        }
    }
}

impl LogicalSettings {
    fn validate(&self) -> Result<()> {
        for (key, name) in [("slot", &self.slot), ("publication", &self.publication)] {
            let Some(name) = name else { continue };
            let valid = !name.is_empty()
                && name.len() <= 63
                && name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !valid {
                return Err(Error::config(format!(
                    "store.logical.{key}: \"{name}\" is not a valid name: 1 to 63 lowercase \
                     letters, digits and `_`"
                )));
            }
        }
        if self.max_unsettled < 100 {
            return Err(Error::config(format!(
                "store.logical.max_unsettled: must be at least 100, got {}",
                self.max_unsettled
            )));
        }
        if self.max_unsettled_bytes < MIN_UNSETTLED_BYTES {
            return Err(Error::config(format!(
                "store.logical.max_unsettled_bytes: must be at least {MIN_UNSETTLED_BYTES} \
                 (1 MiB), got {}",
                self.max_unsettled_bytes
            )));
        }
        if self.takeover_after < Duration::from_secs(2) {
            return Err(Error::config(
                "store.logical.takeover_after: must be at least 2s",
            ));
        }
        Ok(())
    }
}

/// Default `store.logical.max_unsettled`.
pub fn default_max_unsettled() -> usize {
    10_000
}
/// Default `store.logical.max_unsettled_bytes`: 64 MiB.
pub fn default_max_unsettled_bytes() -> usize {
    64 << 20
}
/// The least `store.logical.max_unsettled_bytes`: below it, reading small events would stop
/// every few hundred.
pub const MIN_UNSETTLED_BYTES: usize = 1 << 20;
/// Default `store.logical.takeover_after`.
pub fn default_takeover_after() -> Duration {
    Duration::from_secs(10)
}

/// Default `store.table`.
pub fn default_table() -> String {
    "outbox".to_owned()
}
/// Default `store.shards`.
pub fn default_shards() -> u32 {
    64
}
/// Default `store.pool_size`.
pub fn default_pool_size() -> u32 {
    4
}
/// Default `store.connect_timeout`.
pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
/// Default `store.session_timeout`.
pub fn default_session_timeout() -> Duration {
    Duration::from_secs(30)
}
/// Default `store.discovery_interval`.
pub fn default_discovery_interval() -> Duration {
    Duration::from_secs(30)
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters (none too).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let Some((first, rest)) = pattern.split_once('*') else {
        return pattern == text;
    };
    let Some(mut remaining) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('*').collect();
    let (last, middle) = parts.split_last().expect("split yields one part at least");
    for part in middle {
        match remaining.find(part) {
            Some(at) => remaining = &remaining[at + part.len()..],
            None => return false,
        }
    }
    remaining.len() >= last.len() && remaining.ends_with(last)
}

/// A pattern `store.table` names both parts, each a valid name where `*` stands for any run of
/// name characters: `*.outbox`, `tenant_*.outbox`, `app.outbox_*`.
fn check_pattern<S: SqlStore>(pattern: &str) -> Result<()> {
    let example = pattern.replace('*', "x");
    let qualified = pattern.split('.').count() == 2;
    if !qualified || S::check_table(&example).is_err() {
        return Err(Error::config(format!(
            "store.table: \"{pattern}\" is not a valid pattern: write it as qualifier.table              where `*` stands for any run of lowercase letters, digits and `_`, like *.outbox              or tenant_*.outbox"
        )));
    }
    Ok(())
}

/// `store.url` must be given and start with one of `schemes`; `expected` shows the whole form.
pub fn check_url(url: &str, schemes: &[&str], expected: &str) -> Result<()> {
    if url.trim().is_empty() {
        return Err(Error::config("store.url: must not be empty"));
    }
    if schemes.iter().any(|scheme| url.starts_with(scheme)) {
        return Ok(());
    }
    Err(Error::config(format!(
        "store.url: expected {expected}, got \"{}\"",
        redact_url(url)
    )))
}

/// Refuse a query option of `url` that is not one of `known` (see [`SqlStore::URL_OPTIONS`]).
/// A URL that does not parse is left to the driver's error.
pub fn check_url_options(url: &str, known: &[&str]) -> Result<()> {
    match url::Url::parse(url) {
        Ok(parsed) => {
            outboxkit_core::plugin::refuse_unknown_url_options("store.url", &parsed, known)
        }
        Err(_) => Ok(()),
    }
}

/// The URL option `option`, if set, names a server TLS can check a certificate against: a host
/// name or an IP address.
fn check_tls_name(url: &str, option: &str) -> Result<()> {
    match url_option(url, option) {
        Some(name) if rustls::pki_types::ServerName::try_from(name.as_str()).is_err() => {
            Err(Error::config(format!(
                "store.url: {option}={name:?} is not a host name or an IP address: set it to the \
                 name the server's certificate holds, or leave it out to check the URL's host"
            )))
        }
        _ => Ok(()),
    }
}

/// Longest `store.session_timeout`.
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Check the numbers of `[store]`; each error names its key under `store.`.
pub fn check_limits(
    shards: u32,
    pool_size: u32,
    connect_timeout: Duration,
    session_timeout: Duration,
) -> Result<()> {
    if shards == 0 || shards > MAX_SHARDS {
        return Err(Error::config(format!(
            "store.shards: must be between 1 and {MAX_SHARDS}, got {shards}"
        )));
    }
    if pool_size == 0 {
        return Err(Error::config("store.pool_size: must be at least 1"));
    }
    if connect_timeout.is_zero() {
        return Err(Error::config("store.connect_timeout: must be above 0"));
    }
    // PostgreSQL takes a statement_timeout of at most 2^31 - 1 ms (24.8 days): above it, every
    // session would fail to open; and a relay whose host vanished can hold its shards for a
    // few times this on MySQL.
    if session_timeout < Duration::from_millis(100) || session_timeout > MAX_SESSION_TIMEOUT {
        return Err(Error::config(format!(
            "store.session_timeout: must be between 100ms and 24h, got {}",
            crate::format_duration(session_timeout)
        )));
    }
    Ok(())
}

/// The error for a TLS mode the driver does not know (`sslmode=verify_full`, `ssl-mode=verify-ca`),
/// naming the option as written and the modes there are, with the one meant (case, `-` and `_`
/// aside, two edits away at most); `None` when the URL's mode (if any) is one of them.
fn unknown_tls_mode<D: Dialect>(url: &str) -> Option<String> {
    let mode = url_option(url, D::TLS_OPTION)?;
    if D::TLS_MODES.iter().any(|m| m.eq_ignore_ascii_case(&mode)) {
        return None;
    }
    let folded = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let modes: Vec<String> = D::TLS_MODES.iter().map(|m| folded(m)).collect();
    let names: Vec<&str> = modes.iter().map(String::as_str).collect();
    let meant = outboxkit_core::plugin::closest(&folded(&mode), &names)
        .and_then(|near| names.iter().position(|m| *m == near))
        .map(|i| format!(": did you mean {}={}?", D::TLS_OPTION, D::TLS_MODES[i]))
        .unwrap_or_default();
    Some(format!(
        "store.url: {}={mode} is not a TLS mode {} knows (one of {}){meant}",
        D::TLS_OPTION,
        D::PRODUCT,
        D::TLS_MODES.join(", "),
    ))
}

/// The value of the query option `key` of a URL (`sslrootcert`), if set.
pub fn url_option(url: &str, key: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    url.query_pairs()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// Whether a connection uses TLS, as the status line says it: `TLS TLSv1.3 (sslmode=verify-full)`
/// or `no TLS (sslmode=prefer)`. `version` is the protocol the server reports for the
/// connection (none without TLS); the mode is the URL's `mode_option`, or the driver's default.
pub fn tls_summary(url: &str, version: Option<&str>, mode_option: &str, default: &str) -> String {
    let mode = url_option(url, mode_option).unwrap_or_else(|| default.to_owned());
    match version.filter(|v| !v.is_empty()) {
        Some(version) => format!("TLS {version} ({mode_option}={mode})"),
        None => format!("no TLS ({mode_option}={mode})"),
    }
}

/// Replace the password of a URL (user-info part and `password=` query parameter) by `***`;
/// nothing of an unparsable value is shown.
pub fn redact_url(raw: &str) -> String {
    outboxkit_core::redact::redact_url(raw).unwrap_or_else(|| "<unparsable URL>".to_owned())
}

/// How a server qualifies and limits table names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameRules {
    /// What qualifies a table: `schema`, `database`.
    pub qualifier: &'static str,
    /// Longest qualifier, in bytes.
    pub max_qualifier_len: usize,
    /// Longest table name, in bytes.
    pub max_name_len: usize,
}

/// A validated table name, `table` or `qualifier.table`.
///
/// Names are limited to lowercase ASCII letters, digits and `_` (starting with a letter or `_`),
/// so that the name used by the relay is the one writers get with plain unquoted SQL. A
/// qualifier added later ([`QualifiedName::or_in`]) may hold anything: it comes from the
/// server or the URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QualifiedName {
    qualifier: Option<String>,
    name: String,
}

impl QualifiedName {
    /// Parse `table` or `qualifier.table` (surrounding blanks ignored).
    pub fn parse(text: &str, rules: &NameRules) -> Result<Self> {
        let text = text.trim();
        let (qualifier, name) = match text.split_once('.') {
            Some((qualifier, name)) => (Some(qualifier), name),
            None => (None, text),
        };
        if let Some(qualifier) = qualifier {
            check_identifier(text, qualifier, rules.max_qualifier_len, rules)?;
        }
        check_identifier(text, name, rules.max_name_len, rules)?;
        Ok(Self {
            qualifier: qualifier.map(str::to_owned),
            name: name.to_owned(),
        })
    }

    /// The schema or database, when qualified.
    pub fn qualifier(&self) -> Option<&str> {
        self.qualifier.as_deref()
    }

    /// The table name without qualifier.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The same table in `qualifier` (when it had none).
    pub fn or_in(mut self, qualifier: &str) -> Self {
        if self.qualifier.is_none() {
            self.qualifier = Some(qualifier.to_owned());
        }
        self
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.qualifier {
            Some(qualifier) => write!(f, "{qualifier}.{}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The bookkeeping table of migrations, beside each outbox table (same schema or database).
pub const SCHEMA_TABLE: &str = "outbox_relay_schema";

/// What a server's outbox table names are: how they are qualified and limited, which names the
/// relay's own tables beside them take, and how an identifier is quoted in SQL.
pub trait TableRules: 'static {
    /// How names are qualified and limited.
    const NAME_RULES: NameRules;
    /// The relay's own tables beside an outbox table: no outbox table may take these names.
    const RESERVED: &'static [&'static str];
    /// What the error says of a reserved name: `is the relay's own bookkeeping table`.
    const RESERVED_WORDING: &'static str;

    /// `ident` quoted for SQL.
    fn quote_ident(ident: &str) -> String;
}

/// A validated outbox table name of a server `R`, `table` or `qualifier.table` (a schema in
/// PostgreSQL, a database in MySQL): [`QualifiedName`] under `R`'s rules, not one of the
/// relay's own tables, quoted the server's way. Each store names it `TableName`.
pub struct TableName<R> {
    name: QualifiedName,
    rules: PhantomData<fn() -> R>,
}

impl<R: TableRules> TableName<R> {
    /// Parse `table` or `qualifier.table`.
    pub fn parse(text: &str) -> Result<Self> {
        let name = QualifiedName::parse(text, &R::NAME_RULES)?;
        if R::RESERVED.contains(&name.name()) {
            return Err(Error::config(format!(
                "\"{}\": {} {}, choose another name",
                text.trim(),
                name.name(),
                R::RESERVED_WORDING
            )));
        }
        Ok(Self {
            name,
            rules: PhantomData,
        })
    }

    /// The schema or database, when qualified.
    pub fn qualifier(&self) -> Option<&str> {
        self.name.qualifier()
    }

    /// The table name without qualifier.
    pub fn name(&self) -> &str {
        self.name.name()
    }

    /// The same table in `qualifier` (when it had none). The qualifier may come from the
    /// server or the URL and hold any character: it is always quoted.
    pub fn or_in(self, qualifier: &str) -> Self {
        Self {
            name: self.name.or_in(qualifier),
            rules: PhantomData,
        }
    }

    /// The table quoted for SQL: `"schema"."table"`, `` `table` ``.
    pub fn quoted(&self) -> String {
        self.quoted_sibling(self.name())
    }

    /// Another table of the same schema or database, quoted.
    pub fn quoted_sibling(&self, name: &str) -> String {
        match self.qualifier() {
            Some(qualifier) => format!("{}.{}", R::quote_ident(qualifier), R::quote_ident(name)),
            None => R::quote_ident(name),
        }
    }
}

impl<R> Clone for TableName<R> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            rules: PhantomData,
        }
    }
}

impl<R> PartialEq for TableName<R> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl<R> Eq for TableName<R> {}

impl<R> std::hash::Hash for TableName<R> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

/// `TableName { schema: Some("app"), name: "outbox" }` (`database` for MySQL).
impl<R: TableRules> fmt::Debug for TableName<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TableName")
            .field(R::NAME_RULES.qualifier, &self.qualifier())
            .field("name", &self.name())
            .finish()
    }
}

impl<R> fmt::Display for TableName<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.name.fmt(f)
    }
}

fn check_identifier(whole: &str, ident: &str, max_len: usize, rules: &NameRules) -> Result<()> {
    let mut chars = ident.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_start || !valid_rest {
        return Err(Error::config(format!(
            "\"{whole}\" is not a valid table name: use `table` or `{}.table` made of \
             lowercase letters, digits and _ (not starting with a digit)",
            rules.qualifier
        )));
    }
    if ident.len() > max_len {
        return Err(Error::config(format!(
            "\"{whole}\": \"{ident}\" is longer than {max_len} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use outboxkit_core::ErrorKind;

    /// A SQL store of tests: `some://` URLs, tables that are not `x` (in any qualifier).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct SomeSql;

    impl SqlStore for SomeSql {
        const KIND: &'static str = "some";
        const CONFIG_TYPE: &'static str = "SomeStoreConfig";
        const SCHEMES: &'static [&'static str] = &["some://", "somesql://"];
        const URL_FORM: &'static str = "some://user:password@host:port/database";
        type Store = outboxkit_core::memory::MemoryStore;

        fn check_table(table: &str) -> Result<()> {
            if table == "x" || table.ends_with(".x") {
                return Err(Error::config("x is taken"));
            }
            Ok(())
        }

        async fn connect(config: SqlStoreConfig<Self>) -> Result<Self::Store> {
            Ok(outboxkit_core::memory::MemoryStore::new(config.shards))
        }

        async fn list_tables(_: &SqlStoreConfig<Self>) -> Result<Vec<(String, String)>> {
            Ok([
                "t1.outbox",
                "t2.outbox",
                "t2.orders",
                "app.outbox_2",
                "t3.x",
            ]
            .iter()
            .map(|q| {
                let (a, b) = q.split_once('.').unwrap();
                (a.to_owned(), b.to_owned())
            })
            .collect())
        }
    }

    type SomeConfig = SqlStoreConfig<SomeSql>;

    /// A store that reads its log.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    struct LogSql;

    impl SqlStore for LogSql {
        const KIND: &'static str = "logsql";
        const CONFIG_TYPE: &'static str = "LogStoreConfig";
        const SCHEMES: &'static [&'static str] = &["log://"];
        const URL_FORM: &'static str = "log://host/db";
        const LOG_CAPTURE: bool = true;
        type Store = outboxkit_core::memory::MemoryStore;

        fn check_table(table: &str) -> Result<()> {
            SomeSql::check_table(table)
        }

        async fn connect(config: SqlStoreConfig<Self>) -> Result<Self::Store> {
            Ok(outboxkit_core::memory::MemoryStore::new(config.shards))
        }

        async fn list_tables(_: &SqlStoreConfig<Self>) -> Result<Vec<(String, String)>> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn log_capture_settings_are_checked_under_their_keys() {
        let logical = |toml: serde_json::Value| -> std::result::Result<(), String> {
            let mut value = serde_json::json!({"url": "log://h/db", "capture": "logical"});
            value["logical"] = toml;
            let config: SqlStoreConfig<LogSql> =
                serde_json::from_value(value).map_err(|e| e.to_string())?;
            config.validate().map_err(|e| e.to_string())
        };
        logical(serde_json::json!({})).unwrap();
        logical(serde_json::json!({"style": "message", "slot": "s_1", "takeover_after": "2s"}))
            .unwrap();
        for (bad, key) in [
            (
                serde_json::json!({"slot": "Bad-Name"}),
                "store.logical.slot",
            ),
            (
                serde_json::json!({"publication": ""}),
                "store.logical.publication",
            ),
            (
                serde_json::json!({"max_unsettled": 10}),
                "store.logical.max_unsettled",
            ),
            (
                serde_json::json!({"max_unsettled_bytes": 65_536}),
                "store.logical.max_unsettled_bytes",
            ),
            (
                serde_json::json!({"takeover_after": "1s"}),
                "store.logical.takeover_after",
            ),
        ] {
            let e = logical(bad.clone()).unwrap_err();
            assert!(e.starts_with(key), "{bad}: {e}");
        }
        assert!(logical(serde_json::json!({"styel": "table"}))
            .unwrap_err()
            .contains("unknown field"));
        let pattern: SqlStoreConfig<LogSql> = serde_json::from_value(serde_json::json!({
            "url": "log://h/db", "table": "*.outbox", "capture": "logical",
            "logical": {"slot": "one"}
        }))
        .unwrap();
        let e = pattern.validate().unwrap_err().to_string();
        assert!(e.starts_with("store.logical.slot"), "{e}");
        // A store that cannot read its log refuses the setting, naming the key.
        let e = SomeConfig::new("some://h/db")
            .capture(Capture::Logical)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("store.capture") && e.contains("poll"), "{e}");
    }

    #[test]
    fn glob_matches_runs_of_characters() {
        for (pattern, text) in [
            ("*.outbox", "t1.outbox"),
            ("tenant_*.outbox", "tenant_42.outbox"),
            ("tenant_*.outbox", "tenant_.outbox"),
            ("app.outbox_*", "app.outbox_2"),
            ("*_*.*", "a_b.c"),
            ("app.outbox", "app.outbox"),
        ] {
            assert!(glob_match(pattern, text), "{pattern} {text}");
        }
        for (pattern, text) in [
            ("*.outbox", "t1.outbox_orders"),
            ("tenant_*.outbox", "other.outbox"),
            ("app.outbox", "app.outbox2"),
            ("*ab*ab", "xab"),
        ] {
            assert!(!glob_match(pattern, text), "{pattern} {text}");
        }
    }

    #[tokio::test]
    async fn a_pattern_table_discovers_the_valid_tables_it_matches() {
        use outboxkit_core::StoreConfig;
        let c = SomeConfig::new("some://db/app").table("*.outbox");
        c.validate().unwrap();
        assert_eq!(
            c.discovery(),
            Some(outboxkit_core::Discovery {
                interval: Duration::from_secs(30),
                require_match: false
            })
        );
        assert_eq!(c.table_identity(), None);
        let found = c.discover().await.unwrap();
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["t1.outbox", "t2.outbox"]);
        assert_eq!(found[1].1.table, "t2.outbox");
        assert_eq!(
            found[1].1.discovery(),
            None,
            "each found table is one table"
        );

        let c = SomeConfig::new("some://db/app").table("t*.*");
        let found = c.discover().await.unwrap();
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["t1.outbox", "t2.orders", "t2.outbox"],
            "t3.x is not a valid name"
        );

        for bad in ["*", "outbox*", "a.b.*"] {
            let e = SomeConfig::new("some://db/app")
                .table(bad)
                .validate()
                .unwrap_err();
            assert!(e.message().starts_with("store.table: "), "{bad}: {e}");
        }
        let mut c = SomeConfig::new("some://db/app").table("*.outbox");
        c.discovery_interval = Duration::from_millis(10);
        let e = c.validate().unwrap_err();
        assert!(e.message().starts_with("store.discovery_interval"), "{e}");
        assert_eq!(SomeConfig::new("some://db/app").discovery(), None);
    }

    #[test]
    fn defaults_apply_and_unknown_keys_are_refused() {
        let c: SomeConfig =
            serde_json::from_str(r#"{"url": "some://u:secret@db:5432/app"}"#).unwrap();
        assert_eq!(c, SomeConfig::new("some://u:secret@db:5432/app"));
        assert_eq!(c.table, "outbox");
        assert_eq!(c.shards, 64);
        assert_eq!(c.pool_size, 4);
        assert_eq!(c.connect_timeout, Duration::from_secs(5));
        assert_eq!(c.session_timeout, Duration::from_secs(30));
        c.validate().unwrap();

        let c: SomeConfig = serde_json::from_str(
            r#"{"url": "somesql://db/app", "table": "app.events", "connect_timeout": "250ms",
                "session_timeout": "1m"}"#,
        )
        .unwrap();
        assert_eq!(c.connect_timeout, Duration::from_millis(250));
        assert_eq!(c.session_timeout, Duration::from_secs(60));
        c.validate().unwrap();

        let e = serde_json::from_str::<SomeConfig>(r#"{"url": "some://db/app", "tabel": "x"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("tabel"), "{e}");
        let e = serde_json::from_str::<SomeConfig>(r#"{"table": "x"}"#).unwrap_err();
        assert!(e.to_string().contains("url"), "{e}");
    }

    #[test]
    fn debug_and_redacted_url_hide_the_password() {
        let c = SomeConfig::new("some://app:s3cr3t@db.internal:6432/app?tls=require");
        assert_eq!(
            c.redacted_url(),
            "some://app:***@db.internal:6432/app?tls=require"
        );
        let debug = format!("{c:?}");
        assert!(
            debug.starts_with("SomeStoreConfig {")
                && !debug.contains("s3cr3t")
                && debug.contains("***"),
            "{debug}"
        );
        let c = SomeConfig::new("some://db/app?user=app&password=s3cr3t");
        assert!(!c.redacted_url().contains("s3cr3t"), "{}", c.redacted_url());
        assert_eq!(
            SomeConfig::new("some://db/app").redacted_url(),
            "some://db/app"
        );
        assert!(!redact_url("so me://a:s3cr3t@").contains("s3cr3t"));
    }

    #[test]
    fn validate_names_the_key() {
        let base = || SomeConfig::new("some://db/app");
        let with = |change: fn(&mut SomeConfig)| {
            let mut c = base();
            change(&mut c);
            c
        };
        let bad = [
            (SomeConfig::new("postgres://db/app"), "store.url"),
            (SomeConfig::new(""), "store.url"),
            (base().table("x"), "store.table"),
            (base().shards(0), "store.shards"),
            (base().shards(5000), "store.shards"),
            (with(|c| c.pool_size = 0), "store.pool_size"),
            (
                with(|c| c.connect_timeout = Duration::ZERO),
                "store.connect_timeout",
            ),
            (
                with(|c| c.session_timeout = Duration::from_millis(10)),
                "store.session_timeout",
            ),
        ];
        for (config, key) in bad {
            let e = config.validate().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().starts_with(key), "{key}: {e}");
        }
    }

    #[tokio::test]
    async fn the_kind_and_the_store_come_from_the_sql_store() {
        use outboxkit_core::{Store, StoreConfig};
        assert_eq!(<SomeConfig as StoreConfig>::KIND, "some");
        let store = StoreConfig::build(SomeConfig::new("some://db/app"))
            .await
            .unwrap();
        assert_eq!(store.kind(), "memory");
        assert!(StoreConfig::validate(&SomeConfig::new("other://db")).is_err());
    }

    #[test]
    fn an_empty_url_is_named_as_such() {
        for url in ["", "  "] {
            let e = check_url(url, &["postgres://"], "postgres://...").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert_eq!(e.message(), "store.url: must not be empty");
        }
        assert!(check_url("postgres://h/db", &["postgres://"], "postgres://...").is_ok());
    }

    const RULES: NameRules = NameRules {
        qualifier: "schema",
        max_qualifier_len: 10,
        max_name_len: 8,
    };

    #[test]
    fn names_are_checked_against_the_rules() {
        let t = QualifiedName::parse(" app.outbox ", &RULES).unwrap();
        assert_eq!((t.qualifier(), t.name()), (Some("app"), "outbox"));
        assert_eq!(t.to_string(), "app.outbox");
        let t = QualifiedName::parse("outbox", &RULES).unwrap();
        assert_eq!(t.qualifier(), None);
        assert_eq!(t.clone().or_in("We-ird").to_string(), "We-ird.outbox");
        assert_eq!(t.clone().or_in("a").or_in("b").qualifier(), Some("a"));

        let e = QualifiedName::parse("Outbox", &RULES).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(e.message().contains("`table` or `schema.table`"), "{e}");
        let e = QualifiedName::parse("outbox_xy", &RULES).unwrap_err();
        assert_eq!(
            e.message(),
            "\"outbox_xy\": \"outbox_xy\" is longer than 8 bytes"
        );
        QualifiedName::parse("abcdefghij.t", &RULES).unwrap();
        assert!(QualifiedName::parse("abcdefghijk.t", &RULES).is_err());
        for bad in ["", "a.", ".a", "a.b.c", "1a", "a b", "a\"b"] {
            assert!(QualifiedName::parse(bad, &RULES).is_err(), "{bad}");
        }
    }

    #[test]
    fn limits_name_their_key() {
        let ok = (64, 4, Duration::from_secs(5), Duration::from_secs(30));
        check_limits(ok.0, ok.1, ok.2, ok.3).unwrap();
        for (shards, pool, connect, session, key) in [
            (0, 4, ok.2, ok.3, "store.shards"),
            (MAX_SHARDS + 1, 4, ok.2, ok.3, "store.shards"),
            (64, 0, ok.2, ok.3, "store.pool_size"),
            (64, 4, Duration::ZERO, ok.3, "store.connect_timeout"),
            (
                64,
                4,
                ok.2,
                Duration::from_millis(99),
                "store.session_timeout",
            ),
            (
                64,
                4,
                ok.2,
                MAX_SESSION_TIMEOUT + Duration::from_millis(1),
                "store.session_timeout",
            ),
        ] {
            let e = check_limits(shards, pool, connect, session).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Config);
            assert!(e.message().starts_with(key), "{key}: {e}");
        }
    }

    #[test]
    fn a_wrong_scheme_is_refused_without_the_password() {
        check_url("pg://a", &["x://", "pg://"], "pg://...").unwrap();
        let e = check_url("http://u:s3cr3t@h/d", &["pg://"], "pg://host/db").unwrap_err();
        assert!(e
            .message()
            .starts_with("store.url: expected pg://host/db, got \""));
        assert!(!e.message().contains("s3cr3t"), "{e}");
    }
}
