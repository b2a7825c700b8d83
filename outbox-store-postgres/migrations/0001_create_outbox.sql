-- outbox relay, schema version 1: the outbox table (DESIGN.md section 2).
-- Placeholders, replaced by the relay: {table} the quoted table, {name} the bare table name
-- (for index names), {shards} the shard count, {payload} the payload column's type (jsonb,
-- text or bytea, from store.payload_type).

CREATE TABLE {table} (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid NOT NULL UNIQUE DEFAULT gen_random_uuid(),
    aggregate_type  text NOT NULL,
    aggregate_id    text NOT NULL,
    event_type      text NOT NULL,
    payload         {payload} NOT NULL,
    headers         jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    destination     text NULL,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at    timestamptz NULL,
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NULL,
    last_error      text NULL,
    dead_at         timestamptz NULL,
    shard           smallint GENERATED ALWAYS AS
                        (((hashtext(aggregate_id) & 2147483647) % {shards})::smallint) STORED
);

COMMENT ON TABLE {table} IS
    'Transactional outbox published by outbox-relay. Writers insert aggregate_type, aggregate_id, event_type, payload (and optionally headers, destination) in their business transaction.';

-- What the relay claims: only pending rows, so claims stay fast however large history grows.
CREATE INDEX "{name}_pending_idx" ON {table} (id)
    WHERE published_at IS NULL AND dead_at IS NULL;

-- Rows waiting for a retry (or dead): they hold back the later rows of their aggregate.
CREATE INDEX "{name}_retry_idx" ON {table} (aggregate_id, id)
    WHERE published_at IS NULL AND attempts > 0;

-- Purge of published rows past the retention.
CREATE INDEX "{name}_published_idx" ON {table} (published_at)
    WHERE published_at IS NOT NULL;

-- The dead list.
CREATE INDEX "{name}_dead_idx" ON {table} (id)
    WHERE dead_at IS NOT NULL;

-- Constant insert/delete churn: vacuum and analyze after a fixed number of changes rather than
-- a fraction of a (small, fluctuating) table.
ALTER TABLE {table} SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 1
);
