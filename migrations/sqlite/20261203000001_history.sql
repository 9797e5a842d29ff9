-- A workflow's history (issue 33, docs/history.md), for endpoints that turn it on
-- (EndpointBuilder::history): one row per handling attempt of a message. A handled row
-- commits in the transaction of the effects it describes (the inbox record, the saga
-- state, the outbox); retried, dead-lettered and duplicate rows are written on their own.
-- `detail` is the JSON of courier::HistoryDetail. Times are microseconds since the Unix
-- epoch from the endpoint's clock. Rows older than the endpoint's retention are deleted a
-- batch at a time by its janitor, oldest first.
CREATE TABLE courier_history (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint        TEXT    NOT NULL CHECK (typeof(endpoint) = 'text' AND endpoint <> ''),
    kind            TEXT    NOT NULL CHECK (kind IN ('handled', 'retried', 'dead_lettered', 'duplicate')),
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
CREATE INDEX courier_history_at ON courier_history (endpoint, at);
CREATE INDEX courier_history_message ON courier_history (message_id);
CREATE INDEX courier_history_causation ON courier_history (causation_id) WHERE causation_id IS NOT NULL;
CREATE INDEX courier_history_conversation ON courier_history (conversation_id) WHERE conversation_id IS NOT NULL;

-- The saga instances each row touched. Deleted with its row (the janitor deletes both).
CREATE TABLE courier_history_instance (
    history_id  INTEGER NOT NULL REFERENCES courier_history (id) ON DELETE CASCADE,
    saga_type   TEXT    NOT NULL,
    correlation TEXT    NOT NULL,
    PRIMARY KEY (saga_type, correlation, history_id)
) WITHOUT ROWID;
CREATE INDEX courier_history_instance_row ON courier_history_instance (history_id);
