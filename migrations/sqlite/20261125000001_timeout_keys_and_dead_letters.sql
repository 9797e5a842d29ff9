-- Saga timeouts: a key per instance, and a timeout whose message was dead-lettered.

-- The key a timeout was requested under (by default its message's wire name). At most
-- one pending timeout per (instance, key): requesting one again replaces it. NULL for
-- rows stored before keys existed (they replace nothing).
ALTER TABLE courier_saga_timeout ADD COLUMN timeout_key TEXT;
-- When its message was dead-lettered (microseconds) and why. Such a row is never sent
-- again; it leaves when an operator resubmits the dead letter (whose handling takes it)
-- or the saga completes.
ALTER TABLE courier_saga_timeout ADD COLUMN dead_lettered_at INTEGER;
ALTER TABLE courier_saga_timeout ADD COLUMN dead_letter_reason TEXT;

CREATE UNIQUE INDEX courier_saga_timeout_key ON courier_saga_timeout (saga_type, correlation, timeout_key)
    WHERE timeout_key IS NOT NULL AND dead_lettered_at IS NULL;
-- Claimed rows the dispatcher may take back: not the dead-lettered ones.
DROP INDEX courier_saga_timeout_sent;
CREATE INDEX courier_saga_timeout_sent ON courier_saga_timeout (endpoint, dispatched_at)
    WHERE dispatched_at IS NOT NULL AND dead_lettered_at IS NULL;
