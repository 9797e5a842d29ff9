-- Courier's store on SQLite: the inbox of processed message ids and the outbox of
-- messages waiting to be dispatched. Tables carry the prefix `courier_` so they never
-- collide with the application's; the migrations table is `courier_migrations`.

CREATE TABLE courier_inbox (
    endpoint     TEXT    NOT NULL,
    message_id   TEXT    NOT NULL,
    -- Microseconds since the Unix epoch, from the endpoint's clock.
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (endpoint, message_id)
) WITHOUT ROWID;
CREATE INDEX courier_inbox_processed_at ON courier_inbox (processed_at);

CREATE TABLE courier_outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    endpoint    TEXT    NOT NULL,
    source_id   TEXT    NOT NULL,
    destination TEXT    NOT NULL,
    is_topic    INTEGER NOT NULL,
    envelope    TEXT    NOT NULL,
    body        BLOB    NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX courier_outbox_source ON courier_outbox (endpoint, source_id);
CREATE INDEX courier_outbox_created_at ON courier_outbox (created_at);
