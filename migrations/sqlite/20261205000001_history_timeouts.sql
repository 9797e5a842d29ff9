-- A workflow's history tells of saga timeouts too (issue 33): the endpoint's dispatcher
-- writes a `timeout_dispatched` event for each due timeout it sends, and a
-- `timeout_dead_lettered` one for a timeout sent its most times and never settled.
--
-- SQLite cannot change a table's CHECK: courier_history is built anew with the wider
-- check on `kind` and its rows copied, ids kept. Its id is now the table's rowid without
-- AUTOINCREMENT (a new row takes the largest id plus one): the counter table's upkeep
-- was a sixth of an event's cost, and the janitor deletes the oldest rows first, so ids
-- still grow in the order rows are written. Its instance index refers to it with ON
-- DELETE CASCADE, and dropping the old table (foreign keys on) would empty the index:
-- the index's rows are set aside first, and the index made again once the new table has
-- the name.
CREATE TABLE courier_history_wider (
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
INSERT INTO courier_history_wider
    (id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, enqueued_at,
     received_at, detail)
SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, enqueued_at,
       received_at, detail
FROM courier_history;

CREATE TABLE courier_history_instance_kept (
    history_id  INTEGER NOT NULL,
    saga_type   TEXT    NOT NULL,
    correlation TEXT    NOT NULL
);
INSERT INTO courier_history_instance_kept SELECT history_id, saga_type, correlation FROM courier_history_instance;

DROP TABLE courier_history_instance;
DROP TABLE courier_history;
ALTER TABLE courier_history_wider RENAME TO courier_history;
CREATE INDEX courier_history_at ON courier_history (endpoint, at);
CREATE INDEX courier_history_message ON courier_history (message_id);
CREATE INDEX courier_history_causation ON courier_history (causation_id) WHERE causation_id IS NOT NULL;
CREATE INDEX courier_history_conversation ON courier_history (conversation_id) WHERE conversation_id IS NOT NULL;

CREATE TABLE courier_history_instance (
    history_id  INTEGER NOT NULL REFERENCES courier_history (id) ON DELETE CASCADE,
    saga_type   TEXT    NOT NULL,
    correlation TEXT    NOT NULL,
    PRIMARY KEY (saga_type, correlation, history_id)
) WITHOUT ROWID;
CREATE INDEX courier_history_instance_row ON courier_history_instance (history_id);
INSERT INTO courier_history_instance SELECT history_id, saga_type, correlation FROM courier_history_instance_kept;
DROP TABLE courier_history_instance_kept;
