-- The entities the RabbitMQ transport declared (queues, topics, subscriptions), recorded
-- in its schedule store's database when it declares them and removed when it deletes
-- them. AMQP 0-9-1 cannot list a broker's queues (the management plugin can, and is often
-- off), so the operations API (courier::admin::AmqpAdmin, `courier --rabbitmq`) lists
-- these. `queue` is the RabbitMQ name: the queue (`billing`, `shop.OrderPlaced::billing`)
-- or, for a topic, its exchange. See docs/operations.md.
CREATE TABLE courier.amqp_entity (
    queue       text        PRIMARY KEY,
    -- 0 queue, 1 topic, 2 subscription
    kind        smallint    NOT NULL CHECK (kind IN (0, 1, 2)),
    -- The Courier name: `billing`, `shop.OrderPlaced`, `shop.OrderPlaced/subscriptions/billing`.
    name        text        NOT NULL,
    declared_at timestamptz NOT NULL
);
