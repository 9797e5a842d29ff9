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
    -- The message as RabbitMQ delivered it: its AMQP basic properties (headers included)
    -- in their wire encoding, and its body.
    properties     bytea       NOT NULL,
    body           bytea       NOT NULL,
    UNIQUE (queue, identity)
) WITH (toast_tuple_target = 128);
-- The message itself out of line (in the table's TOAST, uncompressed): the table's own
-- rows stay about 200 bytes, so counting a queue's 100,000 dead letters for a page's total
-- reads a few MB, not every body.
ALTER TABLE courier.amqp_dead_letter ALTER COLUMN properties SET STORAGE EXTERNAL;
ALTER TABLE courier.amqp_dead_letter ALTER COLUMN body SET STORAGE EXTERNAL;
-- A page of a queue's dead letters, and their count.
CREATE INDEX amqp_dead_letter_page ON courier.amqp_dead_letter (queue, id);
