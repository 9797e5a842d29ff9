-- Saga timeouts: a key per instance, and a timeout whose message was dead-lettered.

-- The key a timeout was requested under (by default its message's wire name). At most
-- one pending timeout per (instance, key): requesting one again replaces it. NULL for
-- rows stored before keys existed (they replace nothing).
ALTER TABLE courier.saga_timeout ADD COLUMN timeout_key text;
-- When its message was dead-lettered and why. Such a row is never sent again; it leaves
-- when an operator resubmits the dead letter (whose handling takes it) or the saga
-- completes.
ALTER TABLE courier.saga_timeout ADD COLUMN dead_lettered_at timestamptz;
ALTER TABLE courier.saga_timeout ADD COLUMN dead_letter_reason text;

CREATE UNIQUE INDEX saga_timeout_key ON courier.saga_timeout (saga_type, correlation, timeout_key)
    WHERE timeout_key IS NOT NULL AND dead_lettered_at IS NULL;
-- Claimed rows the dispatcher may take back: not the dead-lettered ones.
DROP INDEX courier.saga_timeout_sent;
CREATE INDEX saga_timeout_sent ON courier.saga_timeout (endpoint, dispatched_at)
    WHERE dispatched_at IS NOT NULL AND dead_lettered_at IS NULL;
