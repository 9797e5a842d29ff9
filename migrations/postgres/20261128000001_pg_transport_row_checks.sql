-- What no Courier sender ever writes into courier.message is refused at INSERT (issue 30):
-- a row another program writes that breaks one of these rules would otherwise sit in its
-- queue for ever or defeat the retry policy. See docs/postgres.md ("Messages from other
-- producers", the valid range of every column).
--
-- A table that already holds such rows is mended first: a waiting row that breaks a rule
-- is dead-lettered (courier.InvalidWireFormat, the column and its value named), a lock
-- without a holder (taken before holders were recorded) is ended, and the values of rows
-- already dead-lettered are brought into range (their description says what was there).

-- The longest time-to-live Courier accepts: 100 years of 366 days, in milliseconds
-- (MAX_TIME_TO_LIVE in framework/src/entity.rs).
UPDATE courier.message m SET
    state = 3,
    locked_until = NULL,
    dl_reason = 'courier.InvalidWireFormat',
    dl_description = 'the row broke a rule of courier.message (found when the rule was added): ' || concat_ws('; ',
        CASE WHEN m.delivery_count < 0
             THEN 'delivery_count was ' || m.delivery_count || ', a count is never negative' END,
        CASE WHEN m.ttl_ms < 1 OR m.ttl_ms > 3162240000000
             THEN 'ttl_ms was ' || m.ttl_ms || ', a time-to-live is 1 ms to 100 years' END,
        CASE WHEN m.state = 2 AND m.delivery_count < 1
             THEN 'the row was deferred but never delivered (delivery_count ' || m.delivery_count || ')' END),
    dl_source = coalesce((SELECT e.path FROM courier.entity e WHERE e.id = m.entity_id), ''),
    delivery_count = greatest(m.delivery_count, 0),
    ttl_ms = CASE WHEN m.ttl_ms BETWEEN 1 AND 3162240000000 THEN m.ttl_ms END
WHERE m.state <> 3
  AND (m.delivery_count < 0 OR m.ttl_ms < 1 OR m.ttl_ms > 3162240000000 OR (m.state = 2 AND m.delivery_count < 1));

UPDATE courier.message m SET
    dl_description = coalesce(m.dl_description || '; ', '') || concat_ws('; ',
        CASE WHEN m.delivery_count < 0 THEN 'delivery_count was ' || m.delivery_count END,
        CASE WHEN m.ttl_ms < 1 OR m.ttl_ms > 3162240000000 THEN 'ttl_ms was ' || m.ttl_ms END),
    delivery_count = greatest(m.delivery_count, 0),
    ttl_ms = CASE WHEN m.ttl_ms BETWEEN 1 AND 3162240000000 THEN m.ttl_ms END
WHERE m.state = 3 AND (m.delivery_count < 0 OR m.ttl_ms < 1 OR m.ttl_ms > 3162240000000);

-- A scheduled row without a time would never become due (the maintenance dead-letters
-- one already; from now on it is refused).
UPDATE courier.message SET state = 3, locked_until = NULL, dl_reason = 'courier.InvalidWireFormat',
    dl_description = 'the message is stored as scheduled but has no scheduled time, so it would never become due'
WHERE state = 1 AND scheduled_at IS NULL;

-- Locks are volatile: a lock without a holder ends now (the message is receivable again,
-- its delivery count kept).
UPDATE courier.message SET locked_until = NULL WHERE locked_until IS NOT NULL AND holder IS NULL;

ALTER TABLE courier.message
    ADD CONSTRAINT message_delivery_count_not_negative CHECK (delivery_count >= 0),
    ADD CONSTRAINT message_ttl_in_range CHECK (ttl_ms IS NULL OR ttl_ms BETWEEN 1 AND 3162240000000),
    ADD CONSTRAINT message_scheduled_has_time CHECK (state <> 1 OR scheduled_at IS NOT NULL),
    ADD CONSTRAINT message_deferred_was_delivered CHECK (state <> 2 OR delivery_count >= 1),
    ADD CONSTRAINT message_lock_has_holder CHECK (locked_until IS NULL OR holder IS NOT NULL);

-- The entities are Courier's own rows; their limits are QueueOptions' (entity.rs).
UPDATE courier.entity SET default_ttl_ms = NULL WHERE default_ttl_ms < 1 OR default_ttl_ms > 3162240000000;
ALTER TABLE courier.entity
    ADD CONSTRAINT entity_default_ttl_in_range
        CHECK (default_ttl_ms IS NULL OR default_ttl_ms BETWEEN 1 AND 3162240000000),
    ADD CONSTRAINT entity_lock_duration_positive CHECK (lock_duration_ms >= 1),
    ADD CONSTRAINT entity_max_delivery_count_positive CHECK (max_delivery_count >= 1);
