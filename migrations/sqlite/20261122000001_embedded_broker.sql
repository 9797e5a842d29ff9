-- The embedded broker's entities and messages. Times are microseconds since the UNIX
-- epoch (UTC), always bound from the broker's Clock, never CURRENT_TIMESTAMP.

-- Queues (kind 0), topics (kind 1) and subscriptions (kind 2, parent = the topic's id).
-- Queues and topics share one namespace (parent 0).
CREATE TABLE courier_entity (
    id                  INTEGER PRIMARY KEY,
    kind                INTEGER NOT NULL,
    parent              INTEGER NOT NULL DEFAULT 0,
    name                TEXT    NOT NULL,
    lock_duration_ms    INTEGER NOT NULL,
    max_delivery_count  INTEGER NOT NULL,
    default_ttl_ms      INTEGER,
    requires_session    INTEGER NOT NULL DEFAULT 0,
    -- the next sequence number to hand out (queues and topics; gap-free, S3.1)
    next_seq            INTEGER NOT NULL DEFAULT 1,
    created_at          INTEGER NOT NULL,
    UNIQUE (parent, name)
);

-- Messages of queues and subscriptions, and scheduled messages of topics.
-- id = entity_id * 2^40 + seq: the table itself is ordered by entity and sequence number.
-- state: 0 ready, 1 scheduled, 2 deferred, 3 dead-lettered, 4 locked (active, held by a
-- receiver until locked_until). A lock is named by (id, delivery_count) and the broker's
-- epoch: the delivery count rises with every lock.
CREATE TABLE courier_message (
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
    body            BLOB    NOT NULL
);

-- Receive: the first ready messages of an entity (or of one session) in sequence order.
CREATE INDEX courier_message_ready ON courier_message (entity_id, seq) WHERE state = 0;
CREATE INDEX courier_message_session ON courier_message (entity_id, session_id, seq)
    WHERE state = 0 AND session_id IS NOT NULL;
-- Lock expiry, activation of scheduled messages, time-to-live, the dead-letter sub-queue.
CREATE INDEX courier_message_locked ON courier_message (locked_until) WHERE locked_until IS NOT NULL;
CREATE INDEX courier_message_scheduled ON courier_message (scheduled_at) WHERE state = 1;
CREATE INDEX courier_message_expiry ON courier_message (expires_at)
    WHERE expires_at IS NOT NULL AND state IN (0, 2);
CREATE INDEX courier_message_dead ON courier_message (entity_id, seq) WHERE state = 3;

-- Session locks and state (S4). Locks are volatile: released when the broker opens.
CREATE TABLE courier_session (
    entity_id     INTEGER NOT NULL,
    session_id    TEXT    NOT NULL,
    locked_until  INTEGER,
    lock_gen      INTEGER NOT NULL DEFAULT 0,
    state         BLOB,
    PRIMARY KEY (entity_id, session_id)
) WITHOUT ROWID;
