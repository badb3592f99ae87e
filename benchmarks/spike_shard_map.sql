-- The shard map in the control database (design sketch of docs/design/shard-moves.md, issue 31).
-- Portable on purpose (PostgreSQL, MariaDB, SQLite): BIGINT Unix milliseconds from the database
-- clock, VARCHAR states with CHECKs, no partial indexes (one active move per shard is a UNIQUE
-- column that is NULL once the move ends). Target URLs are never stored (they carry secrets):
-- the CLI takes NAME=URL, Django takes DATABASES aliases.

CREATE TABLE snowflake_shard_targets (
    name        VARCHAR(100) PRIMARY KEY,
    backend     VARCHAR(20)  NOT NULL CHECK (backend IN ('postgresql', 'mariadb'))
);

-- One row: the map's version, bumped in the same transaction as every change of the map.
CREATE TABLE snowflake_shard_map_version (
    singleton     INTEGER PRIMARY KEY DEFAULT 1 CHECK (singleton = 1),
    version       BIGINT       NOT NULL,
    layout        VARCHAR(200) NOT NULL,   -- e.g. "41/10/8/4@1288834974657": refused if another
    changed_at_ms BIGINT       NOT NULL
);
INSERT INTO snowflake_shard_map_version (singleton, version, layout, changed_at_ms)
VALUES (1, 1, '41/10/8/4', 0);

CREATE TABLE snowflake_shard_map (
    logical_shard INTEGER      PRIMARY KEY,
    target        VARCHAR(100) NOT NULL REFERENCES snowflake_shard_targets (name),
    state         VARCHAR(10)  NOT NULL DEFAULT 'serving'
                  CHECK (state IN ('serving', 'moving', 'cutover')),
    since_version BIGINT       NOT NULL    -- map version that last changed this row
);

CREATE TABLE snowflake_shard_moves (
    id              BIGINT PRIMARY KEY GENERATED ALWAYS AS IDENTITY,  -- AUTO_INCREMENT elsewhere
    logical_shard   INTEGER      NOT NULL,
    active_shard    INTEGER      UNIQUE,   -- = logical_shard while the move runs, NULL after:
                                           -- a second mover on the shard violates it
    source          VARCHAR(100) NOT NULL REFERENCES snowflake_shard_targets (name),
    target          VARCHAR(100) NOT NULL REFERENCES snowflake_shard_targets (name),
    backend         VARCHAR(20)  NOT NULL,  -- whose capture/fence implementation runs the steps
    state           VARCHAR(20)  NOT NULL DEFAULT 'planned' CHECK (state IN (
                        'planned', 'capturing', 'copying', 'catching_up', 'fenced', 'drained',
                        'verified', 'flipped', 'barrier', 'cleaning', 'done',
                        'aborting', 'aborted')),
    capture         VARCHAR(4000),          -- backend-specific JSON: slot/publication/
                                            -- subscription names and oid, fence LSN; for MariaDB
                                            -- binlog file/position or changelog table
    flipped_version BIGINT,
    mover_token     VARCHAR(32),            -- lease on the move itself (second mover refused)
    mover_expires_at_ms BIGINT,
    created_at_ms   BIGINT       NOT NULL,
    updated_at_ms   BIGINT       NOT NULL
);

-- The journal: append-only, one row per step attempt (started, then done or failed).
CREATE TABLE snowflake_shard_move_steps (
    move_id   BIGINT       NOT NULL REFERENCES snowflake_shard_moves (id),
    seq       INTEGER      NOT NULL,
    step      VARCHAR(40)  NOT NULL,
    status    VARCHAR(10)  NOT NULL CHECK (status IN ('started', 'done', 'failed')),
    detail    VARCHAR(4000),            -- numbers (rows, LSNs, seconds) or the error
    at_ms     BIGINT       NOT NULL,
    PRIMARY KEY (move_id, seq)
);

-- The cleanup barrier: the map version each live lease routes with, written at lease renewal.
CREATE TABLE snowflake_shard_map_seen (
    worker_id   INTEGER      PRIMARY KEY,  -- a slot of snowflake_worker_slots
    lease_token VARCHAR(32)  NOT NULL,     -- the holder's token: a new holder starts over
    map_version BIGINT       NOT NULL,
    seen_at_ms  BIGINT       NOT NULL
);
