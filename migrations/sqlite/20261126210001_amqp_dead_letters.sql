-- Dead letters of the RabbitMQ transport parked by the operations API (SQLite schedule
-- store). Times are milliseconds since the Unix epoch. See the Postgres migration of the
-- same name.
CREATE TABLE courier_amqp_dead_letter (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    queue          TEXT    NOT NULL,
    identity       INTEGER NOT NULL,
    parked_at      INTEGER NOT NULL,
    message_id     TEXT    NOT NULL,
    message_type   TEXT,
    reason         TEXT,
    description    TEXT,
    error          TEXT,
    delivery_count INTEGER NOT NULL,
    enqueued_at    INTEGER NOT NULL,
    size           INTEGER NOT NULL,
    properties     BLOB    NOT NULL,
    body           BLOB    NOT NULL,
    UNIQUE (queue, identity)
);
CREATE INDEX courier_amqp_dead_letter_page ON courier_amqp_dead_letter (queue, id);
