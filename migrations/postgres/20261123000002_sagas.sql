-- Saga instances and their timeouts (Postgres, schema `courier`).

CREATE TABLE courier.saga (
    saga_type   text        NOT NULL,
    correlation text        NOT NULL,
    state       jsonb       NOT NULL,
    -- 1 when created, one more at each update: the optimistic concurrency check.
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    -- One instance per correlation: two racing starts make one instance.
    PRIMARY KEY (saga_type, correlation)
);

-- Completed instances, kept when the saga is configured to archive them.
CREATE TABLE courier.saga_archive (
    saga_type    text        NOT NULL,
    correlation  text        NOT NULL,
    state        jsonb       NOT NULL,
    version      bigint      NOT NULL,
    created_at   timestamptz NOT NULL,
    completed_at timestamptz NOT NULL
);
CREATE INDEX saga_archive_instance ON courier.saga_archive (saga_type, correlation);

-- Requested timeouts. A row lives until its message is handled (or it is cancelled, or its
-- saga completes): a timeout message whose row is gone is discarded, never handled.
CREATE TABLE courier.saga_timeout (
    id            text        NOT NULL PRIMARY KEY,
    endpoint      text        NOT NULL,
    saga_type     text        NOT NULL,
    correlation   text        NOT NULL,
    due_at        timestamptz NOT NULL,
    -- When the dispatcher sent it (NULL: not yet).
    dispatched_at timestamptz,
    envelope      jsonb       NOT NULL,
    body          bytea       NOT NULL,
    created_at    timestamptz NOT NULL
);
CREATE INDEX saga_timeout_due ON courier.saga_timeout (endpoint, due_at) WHERE dispatched_at IS NULL;
CREATE INDEX saga_timeout_sent ON courier.saga_timeout (endpoint, dispatched_at) WHERE dispatched_at IS NOT NULL;
CREATE INDEX saga_timeout_instance ON courier.saga_timeout (saga_type, correlation);
