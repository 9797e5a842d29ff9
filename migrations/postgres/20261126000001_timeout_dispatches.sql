-- Saga timeouts: how many times each was sent. A timeout whose message the broker itself
-- dead-lettered (its max delivery count reached: a handler that kills the process, a
-- RabbitMQ delivery limit) never tells the endpoint, so its row stayed claimed and the
-- dispatcher sent it again after each reclaim wait, forever. The dispatcher now counts
-- its sends and, at the limit (`TimeoutClaim::max_dispatches`), marks the row
-- dead-lettered instead of sending it again. Rows stored before count from 0.
ALTER TABLE courier.saga_timeout ADD COLUMN dispatches integer NOT NULL DEFAULT 0;
