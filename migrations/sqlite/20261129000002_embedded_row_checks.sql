-- The embedded broker's file refuses what no Courier sender writes (issue 30, "Make the
-- class impossible"). courier_message and courier_entity become STRICT tables, so a
-- column holds only its own type (an integer where a time, a count, a state or an id
-- belongs; text in a text column; a blob as the body), with CHECK constraints named for
-- their rules. Another program that writes a row breaking one gets SQLITE_CONSTRAINT at
-- its INSERT ("CHECK constraint failed: message_ttl_in_range", "cannot store TEXT value in
-- INTEGER column courier_message.scheduled_at"). docs/embedded-broker.md, "Rows written
-- by another program", lists the rules and what the broker does with the rest.
--
-- SQLite cannot add a constraint to a table: both tables are built anew and their rows
-- copied (the engine's indexes are made again below; no trigger or view refers to them).
-- On a file only Courier wrote, every row is copied as it is. A row another program wrote
-- that breaks a rule is mended as it is copied:
--   * a value of another type in a text column is kept as text (its bytes: a receiver
--     dead-letters text that is not UTF-8, naming the column); a body that is not a blob
--     is kept as a blob of its bytes;
--   * a row waiting to be received whose state, delivery count, time-to-live or times
--     break a rule is dead-lettered (courier.InvalidWireFormat, each column and value
--     named in the description) and the value is brought into range or cleared; a row
--     already dead-lettered keeps its reason and gets the same list appended to its
--     description (or a reason and a description if it had none);
--   * a row whose id is not entity_id * 2^40 + seq gets a new sequence number of its
--     entity, after the ones in use (as a send would give it);
--   * DELETED: a row whose id is not entity_id * 2^40 + seq and whose entity_id names no
--     queue, topic or subscription (no queue holds it, no receive could ever read it), and
--     an entity of an unknown kind (the broker never loaded one).

-- ---------------------------------------------------------------------------------------
-- Entities: Courier's own rows (QueueOptions' limits, framework/src/entity.rs).
-- ---------------------------------------------------------------------------------------

CREATE TABLE courier_entity_checked (
    id                  INTEGER PRIMARY KEY,
    kind                INTEGER NOT NULL,
    parent              INTEGER NOT NULL DEFAULT 0,
    name                TEXT    NOT NULL,
    lock_duration_ms    INTEGER NOT NULL,
    max_delivery_count  INTEGER NOT NULL,
    default_ttl_ms      INTEGER,
    requires_session    INTEGER NOT NULL DEFAULT 0,
    -- the next sequence number to hand out (queues and topics; a subscription's messages
    -- take its topic's numbers); 2^40 when all are used
    next_seq            INTEGER NOT NULL DEFAULT 1,
    created_at          INTEGER NOT NULL,
    UNIQUE (parent, name),
    CONSTRAINT entity_kind_known CHECK (kind IN (0, 1, 2)),
    CONSTRAINT entity_lock_duration_positive CHECK (lock_duration_ms >= 1),
    CONSTRAINT entity_max_delivery_count_in_range CHECK (max_delivery_count BETWEEN 1 AND 4294967295),
    CONSTRAINT entity_default_ttl_in_range
        CHECK (default_ttl_ms IS NULL OR default_ttl_ms BETWEEN 1 AND 3162240000000),
    CONSTRAINT entity_requires_session_is_boolean CHECK (requires_session IN (0, 1)),
    CONSTRAINT entity_next_seq_in_range CHECK (next_seq BETWEEN 1 AND 1099511627776)
) STRICT;

INSERT INTO courier_entity_checked (id, kind, parent, name, lock_duration_ms, max_delivery_count, default_ttl_ms,
                                    requires_session, next_seq, created_at)
SELECT id, kind,
       CASE WHEN typeof(parent) = 'integer' THEN parent ELSE 0 END,
       CAST(name AS TEXT),
       CASE WHEN typeof(lock_duration_ms) = 'integer' AND lock_duration_ms >= 1 THEN lock_duration_ms ELSE 60000 END,
       CASE WHEN typeof(max_delivery_count) = 'integer' AND max_delivery_count BETWEEN 1 AND 4294967295
            THEN max_delivery_count ELSE 10 END,
       CASE WHEN typeof(default_ttl_ms) = 'integer' AND default_ttl_ms BETWEEN 1 AND 3162240000000
            THEN default_ttl_ms END,
       CASE WHEN requires_session THEN 1 ELSE 0 END,
       CASE WHEN typeof(next_seq) = 'integer' AND next_seq BETWEEN 1 AND 1099511627776 THEN next_seq ELSE 1 END,
       CASE WHEN typeof(created_at) = 'integer' THEN created_at ELSE 0 END
FROM courier_entity
WHERE typeof(kind) = 'integer' AND kind IN (0, 1, 2);

-- ---------------------------------------------------------------------------------------
-- Messages.
-- ---------------------------------------------------------------------------------------

CREATE TABLE courier_message_checked (
    id              INTEGER PRIMARY KEY,
    entity_id       INTEGER NOT NULL,
    seq             INTEGER NOT NULL,
    state           INTEGER NOT NULL,
    delivery_count  INTEGER NOT NULL DEFAULT 0,
    locked_until    INTEGER,
    session_id      TEXT,
    enqueued_at     INTEGER NOT NULL,
    scheduled_at    INTEGER,
    expires_at      INTEGER,
    ttl_ms          INTEGER,
    message_id      TEXT    NOT NULL,
    correlation_id  TEXT,
    causation_id    TEXT,
    message_type    TEXT,
    content_type    TEXT,
    reply_to        TEXT,
    properties      TEXT,
    dl_reason       TEXT,
    dl_description  TEXT,
    dl_source       TEXT,
    body            BLOB    NOT NULL,
    -- The row id orders the table by entity and sequence number (entity ids below 2^22,
    -- sequence numbers 1 to 2^40 - 1).
    CONSTRAINT message_id_is_entity_and_seq CHECK (entity_id BETWEEN 1 AND 4194303
        AND seq BETWEEN 1 AND 1099511627775 AND id = entity_id * 1099511627776 + seq),
    -- 0 ready, 1 scheduled, 2 deferred, 3 dead-lettered, 4 locked.
    CONSTRAINT message_state_known CHECK (state BETWEEN 0 AND 4),
    -- A producer leaves it at 0; every lock adds one (a lock token holds 32 bits of it).
    CONSTRAINT message_delivery_count_in_range CHECK (delivery_count BETWEEN 0 AND 4294967295),
    -- 1 ms to 100 years (MAX_TIME_TO_LIVE in framework/src/entity.rs).
    CONSTRAINT message_ttl_in_range CHECK (ttl_ms IS NULL OR ttl_ms BETWEEN 1 AND 3162240000000),
    CONSTRAINT message_scheduled_has_time CHECK (state <> 1 OR scheduled_at IS NOT NULL),
    -- Only a receiver defers, and it holds a lock: a deferred message was delivered.
    CONSTRAINT message_deferred_was_delivered CHECK (state <> 2 OR delivery_count >= 1),
    CONSTRAINT message_dead_letter_has_reason CHECK (state <> 3
        OR (coalesce(dl_reason, '') <> '' AND coalesce(dl_description, '') <> ''))
) STRICT;

-- Each row's key: its own when the id is entity_id * 2^40 + seq; `entity` and
-- `numbering` (the entity whose counter numbers it: a subscription's topic) when its
-- entity_id names an entity.
CREATE TEMP TABLE courier_message_key AS
SELECT m.id AS old_id,
       (typeof(m.entity_id) = 'integer' AND typeof(m.seq) = 'integer'
        AND m.entity_id BETWEEN 1 AND 4194303 AND m.seq BETWEEN 1 AND 1099511627775
        AND m.id = m.entity_id * 1099511627776 + m.seq) AS good,
       m.entity_id AS entity_id,
       m.seq AS seq,
       e.id AS entity,
       CASE WHEN e.kind = 2 THEN e.parent ELSE e.id END AS numbering
FROM courier_message m
LEFT JOIN courier_entity_checked e ON typeof(m.entity_id) = 'integer' AND e.id = m.entity_id;

-- Every counter past the numbers its entity's rows (and its subscriptions' rows) hold.
UPDATE courier_entity_checked SET next_seq = min(1099511627776, max(next_seq,
    coalesce((SELECT max(k.seq) + 1 FROM courier_message_key k
              WHERE k.good AND k.numbering = courier_entity_checked.id), 1)))
WHERE kind <> 2;

-- A row whose id does not say its entity and sequence number: the next numbers of its
-- entity's counter, in the order of the old ids.
CREATE TEMP TABLE courier_message_rekey AS
SELECT k.old_id AS old_id, k.entity AS entity, k.numbering AS numbering,
       c.next_seq + row_number() OVER (PARTITION BY k.numbering ORDER BY k.old_id) - 1 AS seq
FROM courier_message_key k JOIN courier_entity_checked c ON c.id = k.numbering
WHERE NOT k.good;

UPDATE courier_entity_checked SET next_seq = min(1099511627776, max(next_seq,
    coalesce((SELECT max(r.seq) + 1 FROM courier_message_rekey r WHERE r.numbering = courier_entity_checked.id), 1)))
WHERE kind <> 2;

INSERT INTO courier_message_checked (id, entity_id, seq, state, delivery_count, locked_until, session_id,
                                     enqueued_at, scheduled_at, expires_at, ttl_ms, message_id, correlation_id,
                                     causation_id, message_type, content_type, reply_to, properties, dl_reason,
                                     dl_description, dl_source, body)
WITH k AS (
    SELECT old_id, entity_id AS entity, seq FROM courier_message_key WHERE good
    UNION ALL
    SELECT old_id, entity, seq FROM courier_message_rekey WHERE seq <= 1099511627775
),
p AS (
    SELECT m.*, k.entity AS new_entity, k.seq AS new_seq,
           (typeof(m.state) = 'integer' AND m.state = 3) AS was_dead,
           nullif(concat_ws('; ',
               CASE WHEN typeof(m.state) <> 'integer' OR m.state NOT BETWEEN 0 AND 4
                    THEN 'state was ' || substr(quote(m.state), 1, 64) || ', which is no state (0 to 4)' END,
               CASE WHEN typeof(m.delivery_count) <> 'integer' OR m.delivery_count NOT BETWEEN 0 AND 4294967295
                    THEN 'delivery_count was ' || substr(quote(m.delivery_count), 1, 64)
                         || ', a delivery count is 0 to 4294967295' END,
               CASE WHEN m.ttl_ms IS NOT NULL
                         AND (typeof(m.ttl_ms) <> 'integer' OR m.ttl_ms NOT BETWEEN 1 AND 3162240000000)
                    THEN 'ttl_ms was ' || substr(quote(m.ttl_ms), 1, 64) || ', a time-to-live is 1 ms to 100 years' END,
               CASE WHEN typeof(m.enqueued_at) <> 'integer'
                    THEN 'enqueued_at was ' || substr(quote(m.enqueued_at), 1, 64)
                         || ', not a time in microseconds (now 0)' END,
               CASE WHEN m.scheduled_at IS NOT NULL AND typeof(m.scheduled_at) <> 'integer'
                    THEN 'scheduled_at was ' || substr(quote(m.scheduled_at), 1, 64)
                         || ', not a time in microseconds' END,
               CASE WHEN m.expires_at IS NOT NULL AND typeof(m.expires_at) <> 'integer'
                    THEN 'expires_at was ' || substr(quote(m.expires_at), 1, 64)
                         || ', not a time in microseconds' END,
               CASE WHEN typeof(m.state) = 'integer' AND m.state = 1 AND m.scheduled_at IS NULL
                    THEN 'the row is scheduled without a scheduled_at, so it would never become due' END,
               CASE WHEN typeof(m.state) = 'integer' AND m.state = 2
                         AND (typeof(m.delivery_count) <> 'integer' OR m.delivery_count < 1)
                    THEN 'the row is deferred but was never delivered (only a receiver defers)' END
           ), '') AS problems
    FROM courier_message m JOIN k ON k.old_id = m.id
),
q AS (
    SELECT p.*,
           (p.was_dead OR p.problems IS NOT NULL) AS dead,
           (SELECT CASE WHEN e.kind = 2
                        THEN coalesce((SELECT t.name FROM courier_entity_checked t WHERE t.id = e.parent), '')
                             || '/subscriptions/' || e.name
                        ELSE e.name END
            FROM courier_entity_checked e WHERE e.id = p.new_entity) AS display
    FROM p
)
SELECT new_entity * 1099511627776 + new_seq, new_entity, new_seq,
       CASE WHEN dead THEN 3 ELSE state END,
       CASE WHEN typeof(delivery_count) = 'integer' THEN max(0, min(delivery_count, 4294967295)) ELSE 0 END,
       CASE WHEN typeof(locked_until) = 'integer' THEN locked_until END,
       CAST(session_id AS TEXT),
       CASE WHEN typeof(enqueued_at) = 'integer' THEN enqueued_at ELSE 0 END,
       CASE WHEN typeof(scheduled_at) = 'integer' THEN scheduled_at END,
       CASE WHEN typeof(expires_at) = 'integer' THEN expires_at END,
       CASE WHEN typeof(ttl_ms) = 'integer' AND ttl_ms BETWEEN 1 AND 3162240000000 THEN ttl_ms END,
       CAST(message_id AS TEXT),
       CAST(correlation_id AS TEXT),
       CAST(causation_id AS TEXT),
       CAST(message_type AS TEXT),
       CAST(content_type AS TEXT),
       CAST(reply_to AS TEXT),
       CAST(properties AS TEXT),
       CASE WHEN was_dead THEN coalesce(nullif(CAST(dl_reason AS TEXT), ''), 'courier.InvalidWireFormat')
            WHEN dead THEN 'courier.InvalidWireFormat'
            ELSE CAST(dl_reason AS TEXT) END,
       CASE WHEN was_dead THEN coalesce(nullif(concat_ws('; ', nullif(CAST(dl_description AS TEXT), ''),
                                   'found when the rules of courier_message were added: ' || problems), ''),
                               'the row was written in the dead-letter state without a description (found when '
                               || 'the rules of courier_message were added)')
            WHEN dead THEN 'the row broke a rule of courier_message (found when the rule was added): ' || problems
            ELSE CAST(dl_description AS TEXT) END,
       CASE WHEN dead AND NOT was_dead THEN display ELSE CAST(dl_source AS TEXT) END,
       CASE WHEN typeof(body) = 'blob' THEN body ELSE CAST(body AS BLOB) END
FROM q;

DROP TABLE courier_message_rekey;
DROP TABLE courier_message_key;
DROP TABLE courier_message;
DROP TABLE courier_entity;
ALTER TABLE courier_entity_checked RENAME TO courier_entity;
ALTER TABLE courier_message_checked RENAME TO courier_message;

-- The indexes of 20261122000001_embedded_broker.sql, as they were.
CREATE INDEX courier_message_ready ON courier_message (entity_id, seq) WHERE state = 0;
CREATE INDEX courier_message_session ON courier_message (entity_id, session_id, seq)
    WHERE state = 0 AND session_id IS NOT NULL;
CREATE INDEX courier_message_locked ON courier_message (locked_until) WHERE locked_until IS NOT NULL;
CREATE INDEX courier_message_scheduled ON courier_message (scheduled_at) WHERE state = 1;
CREATE INDEX courier_message_expiry ON courier_message (expires_at)
    WHERE expires_at IS NOT NULL AND state IN (0, 2);
CREATE INDEX courier_message_dead ON courier_message (entity_id, seq) WHERE state = 3;
