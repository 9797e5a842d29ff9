-- A workflow's history on SQLite, written at a cost the handling can bear (issue 33,
-- docs/history.md "Cost"): a handling's event is written in its transaction to
-- courier_history_recent, a table with no index but its row id, and the saga instances it
-- names to courier_history_instance_recent, keyed by event id; a commit adds a page or two
-- to the write-ahead log instead of one per index of courier_history and its instance
-- table. The store moves the recent rows into courier_history and courier_history_instance
-- (ids kept) in one transaction of their own every few hundred events, so the index pages
-- are written once per move instead of once per handling; the janitor's purge reads both.
--
-- Ids are one sequence over both event tables: every writer takes the largest id of
-- either plus one, so a moved row keeps its id and no two events share one. The checks
-- are those of courier_history, so that any row the recent table holds can be moved. The
-- recent instance rows have no foreign key: their event is in the recent table.
--
-- Readers read courier_history_all and courier_history_instance_all, both tables as one.
CREATE TABLE courier_history_recent (
    id              INTEGER PRIMARY KEY,
    endpoint        TEXT    NOT NULL CHECK (typeof(endpoint) = 'text' AND endpoint <> ''),
    kind            TEXT    NOT NULL CHECK (kind IN ('handled', 'retried', 'dead_lettered', 'duplicate',
                                                     'timeout_dispatched', 'timeout_dead_lettered')),
    at              INTEGER NOT NULL CHECK (typeof(at) = 'integer'),
    message_id      TEXT    NOT NULL CHECK (typeof(message_id) = 'text'),
    message_type    TEXT    CHECK (message_type IS NULL OR typeof(message_type) = 'text'),
    conversation_id TEXT    CHECK (conversation_id IS NULL OR typeof(conversation_id) = 'text'),
    causation_id    TEXT    CHECK (causation_id IS NULL OR typeof(causation_id) = 'text'),
    attempt         INTEGER NOT NULL CHECK (typeof(attempt) = 'integer' AND attempt >= 0),
    enqueued_at     INTEGER CHECK (enqueued_at IS NULL OR typeof(enqueued_at) = 'integer'),
    received_at     INTEGER CHECK (received_at IS NULL OR typeof(received_at) = 'integer'),
    detail          TEXT    NOT NULL CHECK (json_valid(detail) AND json_type(detail) = 'object')
);

CREATE VIEW courier_history_all AS
    SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt,
           enqueued_at, received_at, detail
    FROM courier_history
    UNION ALL
    SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt,
           enqueued_at, received_at, detail
    FROM courier_history_recent;

CREATE TABLE courier_history_instance_recent (
    history_id  INTEGER NOT NULL,
    saga_type   TEXT    NOT NULL,
    correlation TEXT    NOT NULL,
    PRIMARY KEY (history_id, saga_type, correlation)
) WITHOUT ROWID;

CREATE VIEW courier_history_instance_all AS
    SELECT history_id, saga_type, correlation FROM courier_history_instance
    UNION ALL
    SELECT history_id, saga_type, correlation FROM courier_history_instance_recent;
