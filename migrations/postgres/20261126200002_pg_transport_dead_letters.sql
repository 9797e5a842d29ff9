-- The dead letters of an entity in sequence order: what the operations API lists and counts
-- (`courier dlq list`, courier::admin::PostgresAdmin). Without it, counting a dead-letter
-- sub-queue of 100,000 messages read every row of the entity; with it the count is an
-- index-only scan of the dead letters alone. Dead letters are few next to the active
-- messages, so its cost at send and receive is nil; a dead-lettering writes one entry.
CREATE INDEX message_dead ON courier.message (entity_id, seq) WHERE state = 3;
