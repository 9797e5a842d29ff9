-- Scheduled messages of the RabbitMQ transport (Postgres, schema `courier`). RabbitMQ has
-- no scheduled delivery without a plugin, so a scheduled message waits here until it is
-- due, then is published (with publisher confirms) and its row deleted in the same
-- transaction: a process that dies in between publishes it again, with the same message
-- id, and receivers with an inbox drop the copy. `seq` is the sequence number that
-- `Sender::schedule` returns and `cancel_scheduled` takes.
CREATE TABLE courier.amqp_scheduled (
    seq         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The queue or topic (exchange) to publish to.
    destination text        NOT NULL,
    is_topic    boolean     NOT NULL,
    due_at      timestamptz NOT NULL,
    envelope    jsonb       NOT NULL,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL
);
CREATE INDEX amqp_scheduled_due ON courier.amqp_scheduled (due_at);
CREATE INDEX amqp_scheduled_destination ON courier.amqp_scheduled (destination);
