-- outbox relay, schema version 1: the outbox table (DESIGN.md section 2), MySQL 8.0.16+ and
-- MariaDB 10.6+. Placeholders, replaced by the relay: {table} the quoted table, {name} the bare
-- table name (for constraint names, unique per database), {shards} the shard count, {payload}
-- the payload column's type (JSON, LONGTEXT or LONGBLOB, from store.payload_type).
--
-- MySQL has no partial index. The relay's scans still stay constant-time as history grows:
-- `pending` is 1 for pending rows and NULL otherwise, so pending_idx keeps every pending row at
-- its front (`pending = 1`, in id order) and history out of the scanned range; likewise
-- `retry_aggregate_id` holds a key only for rows waiting for a retry (or dead). Both are
-- computed by the server: writers never set them.
CREATE TABLE {table} (
    id                 BIGINT NOT NULL AUTO_INCREMENT,
    event_id           CHAR(36) CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL DEFAULT (UUID()),
    aggregate_type     VARCHAR(255) NOT NULL,
    aggregate_id       VARCHAR(255) NOT NULL,
    event_type         VARCHAR(255) NOT NULL,
    payload            {payload} NOT NULL,
    headers            JSON NOT NULL DEFAULT ('{}'),
    destination        VARCHAR(1024) NULL,
    created_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    published_at       DATETIME(6) NULL,
    attempts           INT NOT NULL DEFAULT 0,
    next_attempt_at    DATETIME(6) NULL,
    last_error         TEXT NULL,
    dead_at            DATETIME(6) NULL,
    shard              SMALLINT GENERATED ALWAYS AS (CRC32(aggregate_id) % {shards}) STORED,
    pending            TINYINT GENERATED ALWAYS AS
                           (IF(published_at IS NULL AND dead_at IS NULL, 1, NULL)) STORED,
    retry_aggregate_id VARCHAR(255) GENERATED ALWAYS AS
                           (IF(published_at IS NULL AND attempts > 0, aggregate_id, NULL)) STORED,
    PRIMARY KEY (id),
    UNIQUE KEY event_id_key (event_id),
    -- What the relay claims: pending rows in id order, shard checked inside the index.
    KEY pending_idx (pending, id, shard),
    -- Rows waiting for a retry (or dead): they hold back the later rows of their aggregate.
    KEY retry_idx (retry_aggregate_id, id),
    -- Purge of published rows past the retention.
    KEY published_idx (published_at),
    -- The dead list.
    KEY dead_idx (dead_at),
    CONSTRAINT {name}_event_id_uuid CHECK (event_id REGEXP
        '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'),
    CONSTRAINT {name}_headers_object CHECK (JSON_TYPE(headers) = 'OBJECT')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
  COMMENT = 'outbox-relay schema=1 shards={shards}: transactional outbox. Writers insert aggregate_type, aggregate_id, event_type, payload (and optionally headers, destination) in their business transaction.'
