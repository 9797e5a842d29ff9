-- Which transport instance holds a message's lock: the key of the session-level advisory
-- lock that instance holds on a connection of its own while it lives. A lock whose holder
-- no longer holds its advisory lock (the process died, or its connection dropped) is
-- released by the next receive of the entity, at once rather than after its lock
-- duration (locks are volatile, S2.7).
ALTER TABLE courier.message ADD COLUMN holder bigint;
