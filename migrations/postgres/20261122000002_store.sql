-- Courier's store on Postgres: the inbox of processed message ids and the outbox of
-- messages waiting to be dispatched. Every table lives in the schema `courier` (created
-- by `PostgresStore::migrate` before this runs), so nothing collides with the
-- application's own tables or its migrations table.

-- One row per (endpoint, message id) whose effects were committed.
CREATE TABLE courier.inbox (
    endpoint     text        NOT NULL,
    message_id   text        NOT NULL,
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (endpoint, message_id)
);
-- The retention cleanup deletes by age.
CREATE INDEX inbox_processed_at ON courier.inbox (processed_at);

-- Messages a handler sent, stored in its transaction, deleted once dispatched.
CREATE TABLE courier.outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint    text        NOT NULL,
    -- The handled message whose transaction stored this row.
    source_id   text        NOT NULL,
    destination text        NOT NULL,
    is_topic    boolean     NOT NULL,
    -- The envelope without its body, as JSON; the body as bytes.
    envelope    jsonb       NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX outbox_source ON courier.outbox (endpoint, source_id);
CREATE INDEX outbox_created_at ON courier.outbox (created_at);
