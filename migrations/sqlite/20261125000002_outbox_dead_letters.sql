-- Outbox messages the transport refused for good at dispatch (too large, a field or a
-- schedule out of range, ...): moved here from courier_outbox in one transaction, with
-- why, instead of being retried forever. Operators read them here (or through
-- Store::dead_lettered_outbox); to send one again after fixing the cause, insert it back
-- into courier_outbox (same columns but the last three) and delete it here.
CREATE TABLE courier_outbox_dead_letters (
    -- The outbox row's id.
    id               INTEGER PRIMARY KEY,
    endpoint         TEXT    NOT NULL,
    source_id        TEXT    NOT NULL,
    destination      TEXT    NOT NULL,
    is_topic         INTEGER NOT NULL,
    envelope         TEXT    NOT NULL,
    body             BLOB    NOT NULL,
    -- Microseconds since the Unix epoch, from the endpoint's clock.
    created_at       INTEGER NOT NULL,
    dead_lettered_at INTEGER NOT NULL,
    reason           TEXT    NOT NULL,
    description      TEXT    NOT NULL
);
CREATE INDEX courier_outbox_dead_letters_endpoint ON courier_outbox_dead_letters (endpoint, id);
