-- Outbox messages the transport refused for good at dispatch (too large, a field or a
-- schedule out of range, ...): moved here from courier.outbox in one transaction, with
-- why, instead of being retried forever. Operators read them here (or through
-- Store::dead_lettered_outbox); to send one again after fixing the cause, insert it back
-- into courier.outbox (same columns but the last three) and delete it here.
CREATE TABLE courier.outbox_dead_letters (
    -- The outbox row's id.
    id               bigint      PRIMARY KEY,
    endpoint         text        NOT NULL,
    source_id        text        NOT NULL,
    destination      text        NOT NULL,
    is_topic         boolean     NOT NULL,
    envelope         jsonb       NOT NULL,
    body             bytea       NOT NULL,
    created_at       timestamptz NOT NULL,
    dead_lettered_at timestamptz NOT NULL,
    reason           text        NOT NULL,
    description      text        NOT NULL
);
CREATE INDEX outbox_dead_letters_endpoint ON courier.outbox_dead_letters (endpoint, id);
