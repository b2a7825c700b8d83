//! Every statement the store runs, built once per table. Values are always bound, never
//! formatted in; only the (validated, quoted) table name is.

use outboxkit_core::PayloadType;
use outboxkit_store_sql::pause::{PauseSql, PAUSE_TABLE};
use outboxkit_store_sql::rows::Listings;
use outboxkit_store_sql::Statement;

use crate::config::TableName;

/// Columns of a claimed row, in the order `session::decode_event` reads them; `{payload}` is
/// the payload as [`payload_column`] reads it.
const EVENT_COLUMNS: &str = "o.id, o.event_id, o.aggregate_type, o.aggregate_id, o.event_type, \
     {payload}, o.headers::text AS headers, o.destination, o.created_at, \
     o.attempts, o.shard::int4 AS shard";

/// How a claim reads the payload of a table of `payload_type`: `jsonb` as its text, `text` and
/// `bytea` as they are.
fn payload_column(payload_type: PayloadType) -> &'static str {
    match payload_type {
        PayloadType::Json => "o.payload::text AS payload",
        PayloadType::Text | PayloadType::Binary => "o.payload",
    }
}

/// Rows that are advisory locks of this database with two int4 keys.
const ADVISORY_LOCKS: &str = "l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
     AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())";

#[derive(Debug)]
pub(crate) struct Sql {
    /// The claim of a table of each payload type, in [`PayloadType::ALL`] order.
    claims: [Statement; 3],
    pub mark_delete: Statement,
    pub mark_keep: Statement,
    pub record_failures: Statement,
    pub purge: Statement,
    pub status: Statement,
    pub oldest_kept: Statement,
    pub cluster: Statement,
    pub owners: Statement,
    /// `find_events` and the dead list, with and without the payload and headers.
    pub listings: Listings,
    pub dead_retry_ids: Statement,
    pub dead_retry_all: Statement,
    pub dead_discard: Statement,
    pub dead_discard_all: Statement,
    pub held_back: Statement,
    pub replay_count: Statement,
    pub replay: Statement,
    /// The replay of log-based capture in table style: the rows written again.
    pub replay_rewrite: Statement,
    /// `outbox-relay pause` and `resume`, and the relays' reading of it.
    pub pause: PauseSql,
}

/// A statement that writes the rows `which` selects again, as new rows with new ids (in the old
/// rows' id order) and the same `event_id`, `created_at` and payload, copied inside the server:
/// log-based capture in table style then reads them from the log again.
pub(crate) fn written_again(table: &str, which: &str) -> Statement {
    let columns = "event_id, aggregate_type, aggregate_id, event_type, payload, headers, \
                   destination, created_at";
    Statement::from(format!(
        "WITH gone AS (DELETE FROM {table} WHERE {which} RETURNING id, {columns}) \
         INSERT INTO {table} ({columns}) SELECT {columns} FROM gone ORDER BY id"
    ))
}

/// The kept events a replay selects: $1 published since, $2 published until or NULL, $3
/// aggregate_type or NULL, $4 aggregate_id or NULL. Served by the `published_at` index.
const REPLAYED: &str = "published_at IS NOT NULL AND dead_at IS NULL \
     AND published_at >= $1 AND ($2::timestamptz IS NULL OR published_at < $2) \
     AND ($3::text IS NULL OR aggregate_type = $3) AND ($4::text IS NULL OR aggregate_id = $4)";

impl Sql {
    /// The claim of a table of `payload_type`.
    pub fn claim(&self, payload_type: PayloadType) -> &Statement {
        &self.claims[payload_type as usize]
    }

    pub fn new(table: &TableName) -> Self {
        let t = table.quoted();
        // $1 aggregate_type or NULL, $2 aggregate_id or NULL, $3 limit.
        let dead_list = |columns: &str| {
            format!(
                "SELECT {columns} FROM {t} o \
                 WHERE dead_at IS NOT NULL AND published_at IS NULL \
                   AND ($1::text IS NULL OR aggregate_type = $1) \
                   AND ($2::text IS NULL OR aggregate_id = $2) \
                 ORDER BY id LIMIT $3"
            )
        };
        // $1 event_id or NULL, $2 aggregate_type or NULL, $3 aggregate_id or NULL, $4 limit.
        // Newest first. By event id: the unique index; otherwise the primary key, backwards.
        let find_events = |columns: &str| {
            format!(
                "SELECT {columns} FROM {t} o \
                 WHERE ($1::uuid IS NULL OR event_id = $1) \
                   AND ($2::text IS NULL OR aggregate_type = $2) \
                   AND ($3::text IS NULL OR aggregate_id = $3) \
                 ORDER BY id DESC LIMIT $4"
            )
        };
        Self {
            pause: PauseSql::new::<crate::classify::Postgres>(
                &table.quoted_sibling(PAUSE_TABLE),
                ["$1", "$2", "$3"],
                "INSERT INTO",
                " ON CONFLICT (table_name) DO NOTHING",
            ),
            // $1 owned shards, $2 excluded ids, $3 dead rows hold their aggregate, $4 limit.
            // No row locks: the shard locks give this session exclusivity.
            //
            // `held` is the first retrying (or, with $3, dead) row of each aggregate, read once
            // per claim from the retry index. Its WHERE clause leaves `dead_at` out on purpose:
            // with `dead_at IS NULL` there, the pending index also matches it, and on a table
            // whose statistics are stale the planner took that index for a per-row anti-join —
            // a walk of every pending row for every candidate, 4–6 s per claim at 30,000
            // pending rows while writers kept inserting (the relay fell further behind each
            // claim). No other index can answer `held`, so no statistics can make it slow.
            claims: PayloadType::ALL.map(|payload_type| {
                let columns = EVENT_COLUMNS.replace("{payload}", payload_column(payload_type));
                format!(
                    "WITH held AS MATERIALIZED (\
                         SELECT b.aggregate_id, \
                                min(b.id) FILTER (WHERE b.dead_at IS NULL OR $3::bool) AS first_id \
                         FROM {t} b \
                         WHERE b.published_at IS NULL AND b.attempts > 0 \
                         AND b.shard = ANY($1::int2[]) \
                         GROUP BY b.aggregate_id) \
                     SELECT {columns} FROM {t} o \
                     WHERE o.published_at IS NULL AND o.dead_at IS NULL \
                     AND o.shard = ANY($1::int2[]) \
                     AND (o.next_attempt_at IS NULL OR o.next_attempt_at <= now()) \
                     AND o.id <> ALL($2::int8[]) \
                     AND NOT EXISTS (SELECT 1 FROM held h \
                         WHERE h.aggregate_id = o.aggregate_id AND h.first_id < o.id) \
                     ORDER BY o.id LIMIT $4"
                )
                .into()
            }),
            mark_delete: format!("DELETE FROM {t} WHERE id = ANY($1::int8[])").into(),
            mark_keep: format!(
                "UPDATE {t} SET published_at = now() \
                 WHERE id = ANY($1::int8[]) AND published_at IS NULL"
            )
            .into(),
            // $1 ids, $2 errors, $3 delay in milliseconds or NULL = dead.
            record_failures: format!(
                "UPDATE {t} AS o SET attempts = o.attempts + 1, last_error = f.error, \
                 next_attempt_at = CASE WHEN f.delay_ms IS NULL THEN o.next_attempt_at \
                     ELSE now() + f.delay_ms * interval '1 millisecond' END, \
                 dead_at = CASE WHEN f.delay_ms IS NULL THEN now() END \
                 FROM UNNEST($1::int8[], $2::text[], $3::int8[]) AS f(id, error, delay_ms) \
                 WHERE o.id = f.id AND o.published_at IS NULL"
            )
            .into(),
            // $1 retention in seconds, $2 limit.
            purge: format!(
                "DELETE FROM {t} WHERE id IN (SELECT id FROM {t} \
                 WHERE published_at IS NOT NULL \
                 AND published_at < now() - make_interval(secs => $1::float8) \
                 ORDER BY published_at LIMIT $2)"
            )
            .into(),
            status: format!(
                "SELECT \
                 (SELECT count(*) FROM {t} WHERE published_at IS NULL AND dead_at IS NULL) AS pending, \
                 coalesce((SELECT greatest(extract(epoch FROM clock_timestamp() - created_at), 0)::float8 \
                     FROM {t} WHERE published_at IS NULL AND dead_at IS NULL ORDER BY id LIMIT 1), 0) \
                     AS oldest_pending_age_secs, \
                 (SELECT count(*) FROM {t} WHERE dead_at IS NOT NULL) AS dead, \
                 (SELECT count(DISTINCT aggregate_id) FROM {t} \
                     WHERE published_at IS NULL AND attempts > 0 AND dead_at IS NULL) \
                     AS held_back_aggregates, \
                 (SELECT count(*) FROM {t} \
                     WHERE published_at IS NULL AND attempts > 0 AND dead_at IS NULL) AS retrying"
            )
            .into(),
            // The first entry of the published_at index.
            oldest_kept: format!(
                "SELECT min(published_at) FROM {t} WHERE published_at IS NOT NULL"
            )
            .into(),
            // $1 shard lock key, $2 membership lock key: (key, value) of every matching lock.
            cluster: format!(
                "SELECT l.classid::int8 AS key, l.objid::int8 AS value FROM pg_locks l \
                 WHERE {ADVISORY_LOCKS} AND l.classid::int8 IN ($1, $2)"
            )
            .into(),
            // $1 shard lock key.
            owners: format!(
                "SELECT l.objid::int8 AS shard, l.pid, a.application_name FROM pg_locks l \
                 LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE {ADVISORY_LOCKS} AND l.classid::int8 = $1 ORDER BY 1"
            )
            .into(),
            listings: Listings::new(
                find_events,
                dead_list,
                payload_column,
                "o.headers::text AS headers",
            ),
            // $1 ids. The row keeps its id, so its place in its aggregate's order.
            dead_retry_ids: format!(
                "UPDATE {t} SET dead_at = NULL, attempts = 0, next_attempt_at = NULL \
                 WHERE id = ANY($1) AND dead_at IS NOT NULL AND published_at IS NULL"
            )
            .into(),
            // $1 aggregate_id or NULL.
            dead_retry_all: format!(
                "UPDATE {t} SET dead_at = NULL, attempts = 0, next_attempt_at = NULL \
                 WHERE dead_at IS NOT NULL AND published_at IS NULL \
                   AND ($1::text IS NULL OR aggregate_id = $1)"
            )
            .into(),
            // $1 ids.
            dead_discard: format!(
                "DELETE FROM {t} WHERE id = ANY($1) AND dead_at IS NOT NULL AND published_at IS NULL"
            )
            .into(),
            // $1 aggregate_id or NULL.
            dead_discard_all: format!(
                "DELETE FROM {t} WHERE dead_at IS NOT NULL AND published_at IS NULL \
                   AND ($1::text IS NULL OR aggregate_id = $1)"
            )
            .into(),
            // $1 limit. The first retrying row of each aggregate, and how many wait behind it.
            held_back: format!(
                "SELECT * FROM (\
                   SELECT DISTINCT ON (h.aggregate_id) h.aggregate_type, h.aggregate_id, h.id, \
                          h.attempts, h.next_attempt_at, h.last_error, \
                          (SELECT count(*) FROM {t} w WHERE w.aggregate_id = h.aggregate_id \
                             AND w.id > h.id AND w.published_at IS NULL AND w.dead_at IS NULL) AS waiting \
                   FROM {t} h WHERE h.published_at IS NULL AND h.dead_at IS NULL AND h.attempts > 0 \
                   ORDER BY h.aggregate_id, h.id) first_waiting \
                 ORDER BY id LIMIT $1"
            )
            .into(),
            replay_count: format!("SELECT count(*) FROM {t} WHERE {REPLAYED}").into(),
            // $5 most rows. Each row keeps its id, so its place in its aggregate's order; the
            // first ids first, so a replay in several statements keeps that order too.
            replay: format!(
                "UPDATE {t} SET published_at = NULL, attempts = 0, next_attempt_at = NULL, \
                        last_error = NULL \
                 WHERE id IN (SELECT id FROM {t} WHERE {REPLAYED} ORDER BY id LIMIT $5)"
            )
            .into(),
            // $5 most rows, as `replay`.
            replay_rewrite: written_again(
                &t,
                &format!("id IN (SELECT id FROM {t} WHERE {REPLAYED} ORDER BY id LIMIT $5)"),
            ),
        }
    }
}

/// A shard session's settings, set once it is connected: as statements rather than startup
/// options, which a pooler in session mode (PgBouncer) refuses or drops. Bound: $1
/// `statement_timeout` (store.session_timeout) and $2 `idle_session_timeout`, in milliseconds.
///
/// - The session only claims and marks through the partial indexes. A queue table's statistics
///   are often stale (analyzed while nearly empty, then a burst arrives); the planner could then
///   pick a nested-loop anti-join over sequential scans — quadratic in the backlog (seen: 9 s
///   per claim at 15,000 pending rows). Ruling out sequential scans, bitmap scans and sorts on
///   this connection keeps every claim an ordered walk of the pending index whatever the
///   statistics say.
/// - A mark that is lost in a database crash only makes its events be published again (at
///   least once still holds), so marks need not wait for the WAL flush. Writers' transactions
///   are untouched: this applies to this connection only.
/// - Keepalives and a TCP user timeout: the server drops the session (and its locks) about
///   25 s after this client stops answering, instead of after the kernel's two-hour
///   keepalive. The keepalives tell while the server has nothing to send; once it has sent
///   something the client never acknowledged (an answer sent into a partition), TCP stops
///   them, and only `tcp_user_timeout` (PostgreSQL 12 and later) ends the connection before
///   the idle limit or the kernel's retransmission limit (about 15 minutes).
/// - The server ends the session (and its locks) once it stayed silent for
///   `idle_session_limit`, so a relay that hangs with its connection up gives its shards back
///   (PostgreSQL 14 and later; 13 has no idle_session_timeout).
pub(crate) const SESSION_SETTINGS: &str = "SELECT set_config('enable_seqscan', 'off', false), \
     set_config('enable_bitmapscan', 'off', false), set_config('enable_sort', 'off', false), \
     set_config('synchronous_commit', 'off', false), set_config('statement_timeout', $1, false), \
     set_config('tcp_keepalives_idle', '10', false), \
     set_config('tcp_keepalives_interval', '5', false), \
     set_config('tcp_keepalives_count', '3', false), \
     CASE WHEN current_setting('server_version_num')::int >= 120000 \
     THEN set_config('tcp_user_timeout', '25000', false) END, \
     CASE WHEN current_setting('server_version_num')::int >= 140000 \
     THEN set_config('idle_session_timeout', $2, false) END";

/// Lock statements (independent of the table: the keys are bound).
pub(crate) const TRY_LOCK: &str = "SELECT pg_try_advisory_lock($1, $2)";
pub(crate) const UNLOCK: &str = "SELECT pg_advisory_unlock($1, $2)";
pub(crate) const UNLOCK_ALL: &str = "SELECT pg_advisory_unlock_all()";
pub(crate) const JOIN_MEMBERS: &str =
    "SELECT pg_try_advisory_lock($1, pg_backend_pid()), pg_backend_pid()";
