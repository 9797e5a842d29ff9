-- Saga instances and their timeouts (SQLite). Times are microseconds since the Unix
-- epoch from the endpoint's clock.

CREATE TABLE courier_saga (
    saga_type   TEXT    NOT NULL,
    correlation TEXT    NOT NULL,
    -- The state as JSON.
    state       TEXT    NOT NULL,
    -- 1 when created, one more at each update: the optimistic concurrency check.
    version     INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    -- One instance per correlation: two racing starts make one instance.
    PRIMARY KEY (saga_type, correlation)
) WITHOUT ROWID;

-- Completed instances, kept when the saga is configured to archive them.
CREATE TABLE courier_saga_archive (
    saga_type    TEXT    NOT NULL,
    correlation  TEXT    NOT NULL,
    state        TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    completed_at INTEGER NOT NULL
);
CREATE INDEX courier_saga_archive_instance ON courier_saga_archive (saga_type, correlation);

-- Requested timeouts. A row lives until its message is handled (or it is cancelled, or its
-- saga completes): a timeout message whose row is gone is discarded, never handled.
CREATE TABLE courier_saga_timeout (
    id            TEXT    NOT NULL PRIMARY KEY,
    endpoint      TEXT    NOT NULL,
    saga_type     TEXT    NOT NULL,
    correlation   TEXT    NOT NULL,
    due_at        INTEGER NOT NULL,
    -- When the dispatcher sent it (NULL: not yet).
    dispatched_at INTEGER,
    envelope      TEXT    NOT NULL,
    body          BLOB    NOT NULL,
    created_at    INTEGER NOT NULL
);
CREATE INDEX courier_saga_timeout_due ON courier_saga_timeout (endpoint, due_at) WHERE dispatched_at IS NULL;
CREATE INDEX courier_saga_timeout_sent ON courier_saga_timeout (endpoint, dispatched_at) WHERE dispatched_at IS NOT NULL;
CREATE INDEX courier_saga_timeout_instance ON courier_saga_timeout (saga_type, correlation);
