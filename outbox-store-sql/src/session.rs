//! The fencing of a shard session, whatever the server.
//!
//! A relay's shard session is one dedicated connection holding the shard locks, through which
//! every claim and mark of those shards goes. [`Fence`] owns that connection and the set of
//! owned shards. Each statement runs within the session's timeout and its outcome goes through
//! [`Fence::settle`]: once the connection failed (I/O error, killed backend, no answer in time)
//! the session is poisoned — its locks are gone with the connection, it owns nothing, and every
//! call fails with [`ErrorKind::LeaseLost`], so a relay never marks rows of a shard another relay
//! may hold by now.
//!
//! The statements themselves (lock, unlock, claim, mark) stay in each store, and run through
//! [`Fence::run`]:
//!
//! ```text
//! fence.ensure_live()?;
//! let rows = fence.run("claiming rows", async |conn| query.fetch_all(conn).await).await?;
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use outboxkit_core::{Error, ErrorKind, Headers, Result};

use crate::classify::{classify, Dialect, Target};
use crate::format_duration;

/// How much longer than the server's statement limit (`store.session_timeout`) the client
/// waits before giving the session up.
pub const CLIENT_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// How long the server lets a shard session stay silent before it ends it, and its locks with
/// it: four times `store.session_timeout`, at least two minutes. A relay that stops answering
/// while its connection stays up (a paused VM or container, a stopped process: its kernel still
/// answers TCP keepalives) gives its shards back after it. Live relays talk to their session at
/// least every `relay.rebalance_interval`, and otherwise are silent only while one publish call
/// runs (the sinks' timeouts are 30 s by default).
pub fn idle_session_limit(session_timeout: Duration) -> Duration {
    (session_timeout * 4).max(Duration::from_secs(120))
}

/// Longest `last_error` stored.
pub const MAX_ERROR_LEN: usize = 8 * 1024;

/// The outcome of a statement run within the session's timeout.
pub type Outcome<T> =
    std::result::Result<std::result::Result<T, sqlx::Error>, tokio::time::error::Elapsed>;

/// The connection of a shard session, the shards it owns, and whether it was lost.
pub struct Fence<C, D> {
    conn: Option<C>,
    target: Target,
    relay_id: String,
    shard_count: u32,
    owned: BTreeSet<i32>,
    timeout: Duration,
    poisoned: Option<String>,
    dialect: PhantomData<fn() -> D>,
}

impl<C, D: Dialect> fmt::Debug for Fence<C, D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("server", &D::PRODUCT)
            .field("table", &self.target.table)
            .field("relay_id", &self.relay_id)
            .field("shard_count", &self.shard_count)
            .field("owned", &self.owned)
            .field("poisoned", &self.poisoned)
            .finish()
    }
}

impl<C, D: Dialect> Fence<C, D> {
    /// The fence of a session just opened on `conn`, owning no shard yet. Calls wait
    /// `session_timeout` plus [`CLIENT_TIMEOUT_MARGIN`]: the server's own statement limit fires
    /// first and leaves a usable session; this one is for a server that does not answer at all.
    pub fn new(
        conn: C,
        target: Target,
        relay_id: &str,
        shard_count: u32,
        session_timeout: Duration,
    ) -> Self {
        Self {
            conn: Some(conn),
            target,
            relay_id: relay_id.to_owned(),
            shard_count,
            owned: BTreeSet::new(),
            timeout: session_timeout + CLIENT_TIMEOUT_MARGIN,
            poisoned: None,
            dialect: PhantomData,
        }
    }

    /// The `Debug` of a store's shard session `name`: its table and relay, the server's own
    /// `fields` (`backend_pid`), then its shards and whether it was lost.
    pub fn debug_session(
        &self,
        f: &mut fmt::Formatter<'_>,
        name: &str,
        fields: &[(&str, &dyn fmt::Debug)],
    ) -> fmt::Result {
        let mut session = f.debug_struct(name);
        session
            .field("table", &self.target.table)
            .field("relay_id", &self.relay_id);
        for (field, value) in fields {
            session.field(field, value);
        }
        session
            .field("shard_count", &self.shard_count)
            .field("owned", &self.owned)
            .field("poisoned", &self.poisoned)
            .finish()
    }

    /// The relay this session belongs to.
    pub fn relay_id(&self) -> &str {
        &self.relay_id
    }

    /// The table's shard count.
    pub fn shard_count(&self) -> u32 {
        self.shard_count
    }

    /// The shards this session holds.
    pub fn owned(&self) -> &BTreeSet<i32> {
        &self.owned
    }

    /// The table and server, for messages.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Why the connection was lost, once it was.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Whether the connection was lost: the session owns nothing and every call fails.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// The error of every call once the connection is lost.
    pub fn lease_lost(&self) -> Error {
        lease_lost::<D>(self.poisoned.as_deref())
    }

    /// `Err(LeaseLost)` once poisoned.
    pub fn ensure_live(&self) -> Result<()> {
        match self.poisoned {
            Some(_) => Err(self.lease_lost()),
            None => Ok(()),
        }
    }

    /// The session's connection and the timeout of a call; `LeaseLost` once poisoned. Run the
    /// statement, then hand its outcome to [`Self::settle`].
    pub fn connection(&mut self) -> Result<(&mut C, Duration)> {
        let Self {
            conn,
            timeout,
            poisoned,
            ..
        } = self;
        match conn.as_mut() {
            Some(conn) => Ok((conn, *timeout)),
            None => Err(lease_lost::<D>(poisoned.as_deref())),
        }
    }

    /// Run `statement` on the session's connection within the timeout of a call and
    /// [`settle`](Self::settle) its outcome as `action` (`claiming rows`); `LeaseLost` once
    /// poisoned.
    pub async fn run<T>(
        &mut self,
        action: &str,
        statement: impl AsyncFnOnce(&mut C) -> std::result::Result<T, sqlx::Error>,
    ) -> Result<T> {
        let (conn, timeout) = self.connection()?;
        let outcome = tokio::time::timeout(timeout, statement(conn)).await;
        self.settle(outcome, action)
    }

    /// Classify the outcome of a statement; a broken connection or no answer in time poisons the
    /// session.
    pub fn settle<T>(&mut self, outcome: Outcome<T>, action: &str) -> Result<T> {
        let error = match outcome {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(e)) => self.classify(e).context(action),
            Err(_) => {
                let reason = format!(
                    "no answer while {action} within {} (store.session_timeout + 1s)",
                    format_duration(self.timeout)
                );
                return Err(self.poison(reason));
            }
        };
        if error.kind() == ErrorKind::Connection {
            return Err(self.poison(error.full_message()));
        }
        Err(error)
    }

    /// The rows of `action` decoded by `decode`; a row that does not decode fails `action`.
    pub fn decode<R, T>(
        &self,
        rows: &[R],
        decode: impl FnMut(&R) -> std::result::Result<T, sqlx::Error>,
        action: &str,
    ) -> Result<Vec<T>> {
        rows.iter()
            .map(decode)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| self.classify(e).context(action))
    }

    /// The relay's error for a sqlx error of this session (rows that do not decode, ...).
    pub fn classify(&self, error: sqlx::Error) -> Error {
        classify::<D>(error, &self.target)
    }

    /// The connection is unusable: drop it (the server releases its locks) and own nothing.
    fn poison(&mut self, reason: String) -> Error {
        tracing::warn!(
            table = %self.target.table,
            relay_id = %self.relay_id,
            shards = self.owned.len(),
            "shard session lost: {reason}"
        );
        self.poisoned = Some(reason);
        self.conn = None;
        self.owned.clear();
        self.lease_lost()
    }

    /// `Err` (permanent) for a shard the table does not have.
    pub fn check_shard(&self, shard: i32) -> Result<()> {
        if shard < 0 || i64::from(shard) >= i64::from(self.shard_count) {
            return Err(Error::new(
                ErrorKind::Other,
                format!(
                    "shard {shard} does not exist: table {} has shards 0 to {}",
                    self.target.table,
                    i64::from(self.shard_count) - 1
                ),
            )
            .permanent());
        }
        Ok(())
    }

    /// Whether the lock of `shard` is still to take: `false` when the session holds it already
    /// (locks stack within a session: never take one twice, one release must free it).
    /// `LeaseLost` once poisoned; `Err` (permanent) for a shard the table does not have.
    pub fn needs_lock(&self, shard: i32) -> Result<bool> {
        self.ensure_live()?;
        self.check_shard(shard)?;
        Ok(!self.owned.contains(&shard))
    }

    /// Whether the session holds the lock of `shard`, to release; `LeaseLost` once poisoned.
    pub fn holds_lock(&self, shard: i32) -> Result<bool> {
        self.ensure_live()?;
        Ok(self.owned.contains(&shard))
    }

    /// Whether a claim of at most `limit` rows can find any: the session owns shards and
    /// `limit` is not 0. `LeaseLost` once poisoned.
    pub fn may_claim(&self, limit: usize) -> Result<bool> {
        self.ensure_live()?;
        Ok(!self.owned.is_empty() && limit > 0)
    }

    /// The lock of `shard` was taken.
    pub fn acquired(&mut self, shard: i32) {
        self.owned.insert(shard);
    }

    /// The lock of `shard` was released.
    pub fn released(&mut self, shard: i32) {
        self.owned.remove(&shard);
    }
}

impl<C: sqlx::Connection, D: Dialect> Fence<C, D> {
    /// End the session: unless it is lost already (its locks went with the connection), run
    /// `leave` (unlock every shard, ...) as `releasing shard locks`, then [`Self::close`].
    pub async fn leave<T>(
        mut self,
        leave: impl AsyncFnOnce(&mut C) -> std::result::Result<T, sqlx::Error>,
    ) -> Result<()> {
        if self.is_poisoned() {
            return Ok(());
        }
        let left = self.run("releasing shard locks", leave).await.map(drop);
        self.close(left).await
    }

    /// End the session: `left` is the outcome of leaving (unlocking every shard, ...) through
    /// [`Self::settle`]. The connection is closed; a session already lost closes fine, since
    /// its locks went with the connection.
    pub async fn close(mut self, left: Result<()>) -> Result<()> {
        self.owned.clear();
        if let Some(conn) = self.conn.take() {
            if let Err(e) = conn.close().await {
                tracing::debug!("closing a shard session: {e}");
            }
        }
        match left {
            Ok(()) => Ok(()),
            // The connection is gone, and the locks with it.
            Err(e) if e.kind() == ErrorKind::LeaseLost => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn lease_lost<D: Dialect>(poisoned: Option<&str>) -> Error {
    Error::new(
        ErrorKind::LeaseLost,
        format!(
            "lost the {} session holding shard locks: {}",
            D::PRODUCT,
            poisoned.unwrap_or("session closed")
        ),
    )
}

/// Headers are a JSON object; values that are not strings become their JSON text.
pub fn parse_headers(text: &str) -> std::result::Result<Headers, serde_json::Error> {
    let object: serde_json::Map<String, serde_json::Value> = serde_json::from_str(text)?;
    Ok(object
        .into_iter()
        .map(|(name, value)| match value {
            serde_json::Value::String(s) => (name, s),
            other => (name, other.to_string()),
        })
        .collect())
}

/// `text` cut to [`MAX_ERROR_LEN`] bytes on a char boundary.
pub fn truncate_error(text: &str) -> &str {
    if text.len() <= MAX_ERROR_LEN {
        return text;
    }
    let mut end = MAX_ERROR_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::*;

    use crate::SomeSql;

    fn fence() -> Fence<(), SomeSql> {
        let mut fence = Fence::new(
            (),
            Target::table("app.outbox"),
            "relay-a",
            4,
            Duration::from_secs(1),
        );
        fence.acquired(0);
        fence.acquired(3);
        fence
    }

    fn assert_fenced_off(fence: &mut Fence<(), SomeSql>, reason: &str) {
        assert!(fence.is_poisoned());
        assert!(fence.owned().is_empty());
        let expected = format!("lost the SomeSQL session holding shard locks: {reason}");
        for error in [
            fence.ensure_live().unwrap_err(),
            fence.connection().unwrap_err(),
            fence.lease_lost(),
        ] {
            assert_eq!(error.kind(), ErrorKind::LeaseLost);
            assert_eq!(error.message(), expected);
        }
    }

    #[test]
    fn answers_and_server_errors_keep_the_session() {
        let mut fence = fence();
        assert_eq!(fence.settle(Ok(Ok(7)), "claiming rows").unwrap(), 7);
        let e = fence
            .settle::<()>(Ok(Err(sqlx::Error::RowNotFound)), "claiming rows")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Other);
        assert!(
            e.message().starts_with("claiming rows: unexpected answer"),
            "{e}"
        );
        assert!(!fence.is_poisoned());
        assert_eq!(fence.owned(), &BTreeSet::from([0, 3]));
        let (_, timeout) = fence.connection().unwrap();
        assert_eq!(timeout, Duration::from_secs(2));
        fence.ensure_live().unwrap();
        fence.released(0);
        assert_eq!(fence.owned(), &BTreeSet::from([3]));
        assert!(fence.needs_lock(0).unwrap() && !fence.needs_lock(3).unwrap());
        let e = fence.needs_lock(4).unwrap_err();
        assert!(e.message().contains("shards 0 to 3"), "{e}");
        assert!(fence.holds_lock(3).unwrap() && !fence.holds_lock(0).unwrap());
        assert!(fence.may_claim(1).unwrap() && !fence.may_claim(0).unwrap());
        fence.released(3);
        assert!(!fence.may_claim(1).unwrap());
    }

    #[test]
    fn a_broken_connection_poisons_the_session() {
        let mut fence = fence();
        let io = io::Error::from(io::ErrorKind::ConnectionReset);
        let e = fence
            .settle::<()>(Ok(Err(sqlx::Error::Io(io))), "marking rows published")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LeaseLost);
        assert_fenced_off(
            &mut fence,
            "marking rows published: cannot reach SomeSQL (store.url): connection reset",
        );
    }

    #[tokio::test]
    async fn no_answer_in_time_poisons_the_session() {
        let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
            .await
            .unwrap_err();
        let mut fence = fence();
        let e = fence
            .settle::<()>(Err(elapsed), "taking a shard lock")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LeaseLost);
        assert_fenced_off(
            &mut fence,
            "no answer while taking a shard lock within 2s (store.session_timeout + 1s)",
        );
    }

    #[test]
    fn shards_outside_the_table_are_refused_for_good() {
        let fence = fence();
        fence.check_shard(0).unwrap();
        fence.check_shard(3).unwrap();
        for shard in [-1, 4, i32::MAX] {
            let e = fence.check_shard(shard).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Other);
            assert!(!e.is_retryable());
            assert_eq!(
                e.message(),
                format!("shard {shard} does not exist: table app.outbox has shards 0 to 3")
            );
        }
    }

    #[test]
    fn headers_keep_strings_and_stringify_other_values() {
        let h = parse_headers(r#"{"a": "x", "n": 1, "o": {"k": true}, "z": null}"#).unwrap();
        assert_eq!(h["a"], "x");
        assert_eq!(h["n"], "1");
        assert_eq!(h["o"], r#"{"k":true}"#);
        assert_eq!(h["z"], "null");
        assert!(parse_headers("[1]").is_err());
    }

    #[test]
    fn long_errors_are_truncated_on_a_char_boundary() {
        let text = "é".repeat(MAX_ERROR_LEN);
        let cut = truncate_error(&text);
        assert!(cut.len() <= MAX_ERROR_LEN && text.starts_with(cut));
        assert_eq!(truncate_error("short"), "short");
    }
}
