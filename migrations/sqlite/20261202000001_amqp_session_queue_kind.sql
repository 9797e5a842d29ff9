-- Session queues of the RabbitMQ transport (issue 35) are recorded too, as kind 3 (see the
-- Postgres migration of the same name). SQLite cannot change a CHECK constraint: the table
-- is made again with the wider one, and its rows copied.
CREATE TABLE courier_amqp_entity_new (
    queue       TEXT    PRIMARY KEY,
    -- 0 queue, 1 topic, 2 subscription, 3 session queue
    kind        INTEGER NOT NULL CHECK (kind IN (0, 1, 2, 3)),
    name        TEXT    NOT NULL,
    declared_at INTEGER NOT NULL
);
INSERT INTO courier_amqp_entity_new (queue, kind, name, declared_at)
    SELECT queue, kind, name, declared_at FROM courier_amqp_entity;
DROP TABLE courier_amqp_entity;
ALTER TABLE courier_amqp_entity_new RENAME TO courier_amqp_entity;
