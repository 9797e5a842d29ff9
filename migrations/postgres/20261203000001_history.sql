-- A workflow's history (issue 33, docs/history.md), for endpoints that turn it on
-- (EndpointBuilder::history): one row per handling attempt of a message. A handled row
-- commits in the transaction of the effects it describes (the inbox record, the saga
-- state, the outbox); retried, dead-lettered and duplicate rows are written on their own.
-- `detail` is the JSON of courier::HistoryDetail (the messages sent, the saga states
-- before and after, the timeouts). Rows older than the endpoint's retention are deleted
-- a batch at a time by its janitor, oldest first (index history_at).
CREATE TABLE courier.history (
    id              bigserial   PRIMARY KEY,
    endpoint        text        NOT NULL CHECK (endpoint <> ''),
    kind            text        NOT NULL CHECK (kind IN ('handled', 'retried', 'dead_lettered', 'duplicate')),
    at              timestamptz NOT NULL,
    message_id      text        NOT NULL,
    message_type    text,
    conversation_id text,
    causation_id    text,
    attempt         integer     NOT NULL CHECK (attempt >= 0),
    enqueued_at     timestamptz,
    received_at     timestamptz,
    detail          jsonb       NOT NULL CHECK (jsonb_typeof(detail) = 'object')
);
CREATE INDEX history_at ON courier.history (endpoint, at);
CREATE INDEX history_message ON courier.history (message_id);
CREATE INDEX history_causation ON courier.history (causation_id) WHERE causation_id IS NOT NULL;
CREATE INDEX history_conversation ON courier.history (conversation_id) WHERE conversation_id IS NOT NULL;

-- The saga instances each row touched: `courier history saga TYPE CORRELATION` reads an
-- instance's timeline through it. Deleted with its row.
CREATE TABLE courier.history_instance (
    history_id  bigint NOT NULL REFERENCES courier.history (id) ON DELETE CASCADE,
    saga_type   text   NOT NULL,
    correlation text   NOT NULL,
    PRIMARY KEY (saga_type, correlation, history_id)
);
CREATE INDEX history_instance_row ON courier.history_instance (history_id);
