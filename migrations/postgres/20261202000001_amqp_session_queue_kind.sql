-- Session queues of the RabbitMQ transport (issue 35) are recorded too, as kind 3: their
-- RabbitMQ queues are the partitions `<queue>::session-<i>-of-16`, and `queue` holds the
-- session queue's own name (there is no RabbitMQ queue of that name). See docs/rabbitmq.md.
ALTER TABLE courier.amqp_entity DROP CONSTRAINT IF EXISTS amqp_entity_kind_check;
ALTER TABLE courier.amqp_entity ADD CONSTRAINT amqp_entity_kind_check CHECK (kind IN (0, 1, 2, 3));
COMMENT ON COLUMN courier.amqp_entity.kind IS '0 queue, 1 topic, 2 subscription, 3 session queue';
