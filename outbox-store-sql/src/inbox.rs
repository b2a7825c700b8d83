//! The consumer's half of at-least-once: an inbox of processed event ids.
//!
//! The relay delivers every event at least once, so a consumer may see an event twice (after a
//! relay crash, a broker redelivery, a consumer restart). Call
//! [`Inbox::try_mark_processed`] inside the consumer's own business transaction, before its
//! side effects: it returns `true` the first time an `(consumer, event_id)` pair is seen and
//! `false` afterwards. Because the mark is part of the business transaction, a rolled-back
//! transaction leaves no mark, and two consumers racing on the same event serialize on the
//! unique key: exactly one of them gets `true`.
//!
//! Each SQL store names it `Inbox` and gives its SQL ([`InboxSql`]).

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use outboxkit_core::{Error, Result};
use sqlx::types::Uuid;
use sqlx::{Database, Encode, Executor, IntoArguments, Pool, Type};

use crate::classify::{classify, Dialect, Target};
use crate::config::{TableName, TableRules};
use crate::Statement;

/// The statements of an inbox table.
#[derive(Debug, Clone)]
pub struct InboxStatements {
    /// Create the table (and what it needs) if it does not exist; may be several statements.
    pub create: Statement,
    /// Insert `(consumer, event id)` unless it is there.
    pub insert: Statement,
    /// Delete the marks older than an age, at most a number of them.
    pub purge: Statement,
}

/// What a SQL store's inbox is made of: its sqlx database, its statements, and how it binds an
/// event id and an age.
pub trait InboxSql: Dialect + TableRules + Sized {
    /// The sqlx database.
    type Database: Database;
    /// An event id as the insert binds it.
    type EventId: for<'q> Encode<'q, Self::Database> + Type<Self::Database> + Send;
    /// An age as the purge binds it.
    type Age: for<'q> Encode<'q, Self::Database> + Type<Self::Database> + Send;
    /// Longest consumer name, when the column limits it.
    const MAX_CONSUMER_CHARS: Option<usize> = None;

    /// The statements of the inbox table `table`.
    fn statements(table: &TableName<Self>) -> InboxStatements;
    /// `event_id` as the insert binds it.
    fn event_id(event_id: Uuid) -> Self::EventId;
    /// `older_than` as the purge binds it.
    fn age(older_than: Duration) -> Self::Age;
    /// How many rows a statement changed.
    fn rows_affected(done: &<Self::Database as Database>::QueryResult) -> u64;
}

/// A `processed_events` table: `(consumer, event_id)` unique, with the time it was processed.
pub struct Inbox<S> {
    target: Target,
    statements: InboxStatements,
    store: PhantomData<fn() -> S>,
}

impl<S> Clone for Inbox<S> {
    fn clone(&self) -> Self {
        Self {
            target: self.target.clone(),
            statements: self.statements.clone(),
            store: PhantomData,
        }
    }
}

impl<S> fmt::Debug for Inbox<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox")
            .field("target", &self.target)
            .field("create", &self.statements.create)
            .field("insert", &self.statements.insert)
            .field("purge", &self.statements.purge)
            .finish()
    }
}

/// The connection of the store `S`'s server.
type Connection<S> = <<S as InboxSql>::Database as Database>::Connection;

impl<S> Inbox<S>
where
    S: InboxSql,
    for<'c> &'c mut Connection<S>: Executor<'c, Database = S::Database>,
    <S::Database as Database>::Arguments: IntoArguments<S::Database>,
    for<'q> &'q str: Encode<'q, S::Database> + Type<S::Database>,
    i64: for<'q> Encode<'q, S::Database> + Type<S::Database>,
{
    /// The inbox table `table` or `qualifier.table` (e.g. `processed_events`).
    pub fn new(table: &str) -> Result<Self> {
        let name = TableName::<S>::parse(table)?;
        Ok(Self {
            target: Target::table(name.to_string()),
            statements: S::statements(&name),
            store: PhantomData,
        })
    }

    /// Create the table if it does not exist (idempotent).
    pub async fn migrate(&self, pool: &Pool<S::Database>) -> Result<()> {
        sqlx::raw_sql(&self.statements.create)
            .execute(pool)
            .await
            .map(drop)
            .map_err(|e| classify::<S>(e, &self.target))
    }

    /// Record that `consumer` processed `event_id`, inside the caller's transaction. `true`:
    /// first time — process it; `false`: already processed — skip it (and acknowledge it).
    pub async fn try_mark_processed(
        &self,
        conn: &mut Connection<S>,
        consumer: &str,
        event_id: Uuid,
    ) -> Result<bool> {
        if let Some(max) = S::MAX_CONSUMER_CHARS {
            if consumer.is_empty() || consumer.chars().count() > max {
                return Err(Error::config(format!(
                    "inbox consumer name must be 1 to {max} characters, got {}",
                    consumer.chars().count()
                )));
            }
        }
        let done = sqlx::query(&self.statements.insert)
            .bind(consumer)
            .bind(S::event_id(event_id))
            .execute(conn)
            .await
            .map_err(|e| classify::<S>(e, &self.target))?;
        Ok(S::rows_affected(&done) == 1)
    }

    /// Forget marks older than `older_than` (longer than any redelivery can take), at most
    /// `limit` per call; returns how many were deleted.
    pub async fn purge_processed(
        &self,
        pool: &Pool<S::Database>,
        older_than: Duration,
        limit: u32,
    ) -> Result<u64> {
        let done = sqlx::query(&self.statements.purge)
            .bind(S::age(older_than))
            .bind(i64::from(limit))
            .execute(pool)
            .await
            .map_err(|e| classify::<S>(e, &self.target))?;
        Ok(S::rows_affected(&done))
    }
}
