-- The RabbitMQ operations API no longer moves a dead-letter queue to read it: a listing,
-- a show, a dry run and a confirmation page read the DLQ without acknowledging anything
-- (RabbitMQ gives every message back, in order), and a resubmit or delete takes from the
-- DLQ only the messages it changes. The table keeps, for each dead letter seen in the
-- DLQ, the number the admin shows (its id, stable across listings) and what the listing
-- showed, with `in_rabbitmq` true and no row in amqp_dead_letter_message: the message is
-- in RabbitMQ. Rows that an earlier Courier parked (moved here) keep `in_rabbitmq` false
-- and their message, and are listed, shown, resubmitted and deleted as before.
ALTER TABLE courier.amqp_dead_letter ADD COLUMN in_rabbitmq boolean NOT NULL DEFAULT false;
