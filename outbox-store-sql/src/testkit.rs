//! What every SQL store checks of its [`Dialect`] in its tests (feature `testkit`): the errors
//! all servers share, classified with the store's wording.

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::io;

use sqlx::error::{DatabaseError, ErrorKind as SqlxErrorKind};

use outboxkit_core::ErrorKind;

use crate::classify::{classify, Dialect, Target};

/// A database error with a given SQLSTATE and nothing driver-specific (no MySQL error number),
/// as the server would send it through another driver layer.
#[derive(Debug)]
pub struct FakeDbError(pub &'static str);

impl fmt::Display for FakeDbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "server says {}", self.0)
    }
}

impl StdError for FakeDbError {}

impl DatabaseError for FakeDbError {
    fn message(&self) -> &str {
        "server says no"
    }
    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(self.0))
    }
    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> SqlxErrorKind {
        SqlxErrorKind::Other
    }
}

/// `sqlx::Error::Database` carrying [`FakeDbError`].
pub fn database_error(sqlstate: &'static str) -> sqlx::Error {
    sqlx::Error::Database(Box::new(FakeDbError(sqlstate)))
}

/// Check what `D` classifies the way every server does, for a `target` with an endpoint: I/O,
/// TLS, protocol and pool errors are retryable connection errors naming the server and its
/// endpoint; a bad URL is a configuration error; rows that do not decode are permanent errors
/// naming the table.
pub fn check_shared_errors<D: Dialect>(target: &Target) {
    let endpoint = target
        .endpoint
        .as_deref()
        .expect("a target with an endpoint");
    let io = |kind, text: &str| sqlx::Error::Io(io::Error::new(kind, text.to_owned()));

    let e = classify::<D>(io(io::ErrorKind::ConnectionRefused, "os error 111"), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.is_retryable());
    assert_eq!(
        e.full_message(),
        format!(
            "cannot reach {} at {endpoint} (store.url): connection refused",
            D::PRODUCT
        )
    );
    let e = classify::<D>(io(io::ErrorKind::UnexpectedEof, "eof"), target);
    assert!(
        e.message().ends_with("connection closed by the server"),
        "{e}"
    );
    let e = classify::<D>(sqlx::Error::Io(io::Error::other("weird failure")), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.message().contains("weird failure"), "{e}");

    let e = classify::<D>(sqlx::Error::Tls("bad certificate".into()), target);
    assert_eq!(e.kind(), ErrorKind::Connection);
    assert!(e.message().contains("bad certificate") && e.message().contains(D::TLS_OPTION));

    for error in [sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
        let e = classify::<D>(error, target);
        assert_eq!(e.kind(), ErrorKind::Connection);
        assert!(e.is_retryable());
        assert!(e.message().contains(endpoint), "{e}");
    }
    for error in [
        sqlx::Error::Protocol("unexpected message".into()),
        sqlx::Error::WorkerCrashed,
    ] {
        assert_eq!(classify::<D>(error, target).kind(), ErrorKind::Connection);
    }

    let bad = format!("bad {}", D::TLS_OPTION);
    let e = classify::<D>(sqlx::Error::Configuration(bad.into()), target);
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.message().starts_with("store.url"), "{e}");

    let e = classify::<D>(sqlx::Error::ColumnNotFound("shard".into()), target);
    assert_eq!(e.kind(), ErrorKind::Other);
    assert!(!e.is_retryable());
    assert!(e.message().contains(&target.table), "{e}");
    assert_eq!(
        classify::<D>(sqlx::Error::RowNotFound, target).kind(),
        ErrorKind::Other
    );
}

/// The settings the store suite's live cases vary, once for every SQL store.
impl<S: crate::SqlStore> outboxkit_core::testkit::store_suite::SuiteConfig
    for crate::SqlStoreConfig<S>
{
    fn for_url(url: &str) -> Self {
        Self::new(url)
    }

    fn with_table(self, table: &str) -> Self {
        self.table(table)
    }

    fn with_shards(self, shards: u32) -> Self {
        self.shards(shards)
    }

    fn with_session_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    fn table_setting(&self) -> String {
        self.table.clone()
    }
}
