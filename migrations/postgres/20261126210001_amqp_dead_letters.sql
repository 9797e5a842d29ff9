-- Dead letters of the RabbitMQ transport parked by the operations API
-- (courier::admin::AmqpAdmin, `courier --rabbitmq`, the console): before it lists, shows,
-- resubmits or deletes the dead letters of a queue, the admin moves every message of the
-- queue's `<queue>::dlq` here (insert, commit, then acknowledge; a redelivery after a crash
-- meets the unique key and is skipped). RabbitMQ cannot page a queue, and a quorum queue
-- hands one consumer at most 2,000 unacknowledged messages and puts requeued ones at its
-- back; a table pages and changes one message at a time. See docs/operations.md.
CREATE TABLE courier.amqp_dead_letter (
    -- The number the admin shows as the dead letter's sequence number, in park order.
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The RabbitMQ queue the DLQ belongs to (`billing`, or a subscription's `topic::name`):
    -- a resubmit publishes there.
    queue          text        NOT NULL,
    -- The message's identity: its `x-courier-sequence-number`, or a hash of its message
    -- id, timestamp and body (another producer's message): parking it twice is a no-op.
    identity       bigint      NOT NULL,
    parked_at      timestamptz NOT NULL,
    -- What a listing shows, decoded once when parked.
    message_id     text        NOT NULL,
    message_type   text,
    reason         text,
    description    text,
    error          text,
    delivery_count integer     NOT NULL,
    enqueued_at    timestamptz NOT NULL,
    size           integer     NOT NULL,
    UNIQUE (queue, identity)
);
-- A page of a queue's dead letters, and their count.
CREATE INDEX amqp_dead_letter_page ON courier.amqp_dead_letter (queue, id);
-- The message as RabbitMQ delivered it: its AMQP basic properties (headers included) in
-- their wire encoding, and its body. A table of its own, so the rows a page's count
-- reads stay narrow (about 200 bytes: 100,000 dead letters are a few MB to count, not
-- every body); deleted with its dead letter.
CREATE TABLE courier.amqp_dead_letter_message (
    id         bigint PRIMARY KEY REFERENCES courier.amqp_dead_letter (id) ON DELETE CASCADE,
    properties bytea  NOT NULL,
    body       bytea  NOT NULL
);
