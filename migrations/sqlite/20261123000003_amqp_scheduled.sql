-- Scheduled messages of the RabbitMQ transport (SQLite). Times are milliseconds since the
-- Unix epoch from the transport's clock. See the Postgres migration of the same name.
CREATE TABLE courier_amqp_scheduled (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    destination TEXT    NOT NULL,
    is_topic    INTEGER NOT NULL,
    due_at      INTEGER NOT NULL,
    envelope    TEXT    NOT NULL,
    body        BLOB    NOT NULL,
    created_at  INTEGER NOT NULL
);
CREATE INDEX courier_amqp_scheduled_due ON courier_amqp_scheduled (due_at);
CREATE INDEX courier_amqp_scheduled_destination ON courier_amqp_scheduled (destination);
