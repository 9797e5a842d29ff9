-- See the Postgres migration of the same name. A row seen in RabbitMQ's dead-letter queue
-- (`in_rabbitmq` 1) has empty `properties` and `body`: the message is in RabbitMQ.
ALTER TABLE courier_amqp_dead_letter ADD COLUMN in_rabbitmq INTEGER NOT NULL DEFAULT 0 CHECK (in_rabbitmq IN (0, 1));
