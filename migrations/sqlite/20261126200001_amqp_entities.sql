-- The entities the RabbitMQ transport declared (SQLite schedule store). Times are
-- milliseconds since the Unix epoch. See the Postgres migration of the same name.
CREATE TABLE courier_amqp_entity (
    queue       TEXT    PRIMARY KEY,
    kind        INTEGER NOT NULL CHECK (kind IN (0, 1, 2)),
    name        TEXT    NOT NULL,
    declared_at INTEGER NOT NULL
);
