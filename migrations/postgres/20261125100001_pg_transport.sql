-- The Postgres transport (PostgresTransport): queues, topics, subscriptions, sessions and
-- their messages in the schema `courier`. Times are bound from the transport's Clock
-- (never now()), so tests can drive them with a virtual clock. See docs/postgres.md.

-- The tag of this database's lock tokens: a token whose first four bytes differ was not
-- issued by a transport on this database (UnknownLockToken rather than LockLost).
CREATE TABLE courier.transport_instance (
    only_row  boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    token_tag integer NOT NULL
);
INSERT INTO courier.transport_instance (token_tag)
VALUES ((floor(random() * 2147483647))::integer);

-- Queues (kind 0), topics (kind 1) and subscriptions (kind 2, parent = the topic's id).
-- Queues and topics share one namespace (parent 0). `path` is the name shown in errors
-- and in dead-letter sources (`topic/subscriptions/name` for a subscription).
CREATE TABLE courier.entity (
    id                 bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind               smallint    NOT NULL CHECK (kind IN (0, 1, 2)),
    parent             bigint      NOT NULL DEFAULT 0,
    name               text        NOT NULL,
    path               text        NOT NULL,
    lock_duration_ms   bigint      NOT NULL,
    max_delivery_count integer     NOT NULL,
    default_ttl_ms     bigint,
    requires_session   boolean     NOT NULL DEFAULT false,
    created_at         timestamptz NOT NULL,
    UNIQUE (parent, name)
);
-- Fan-out at send reads a topic's subscriptions.
CREATE INDEX entity_subscriptions ON courier.entity (parent) WHERE kind = 2;

-- Sequence numbers of every queue and topic: stamped by the database at send (and again
-- at activation, S5.4). One sequence for all entities, so senders never wait for each
-- other; numbers are unique and increase, but are not gap-free per queue (the bent rule
-- S3.1, declared by the transport).
CREATE SEQUENCE courier.message_seq AS bigint;

-- Messages of queues and subscriptions, and scheduled messages of topics (fanned out to
-- the subscriptions when they activate). `id` names the row (lock tokens carry it);
-- copies of one topic message share `seq`.
-- state: 0 active, 1 scheduled, 2 deferred, 3 dead-lettered. A message of any state but
-- scheduled is locked while `locked_until` is after the clock's now; every lock raises
-- `delivery_count`, which therefore names the lock (token fencing).
CREATE TABLE courier.message (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_id      bigint      NOT NULL REFERENCES courier.entity (id) ON DELETE CASCADE,
    seq            bigint      NOT NULL,
    state          smallint    NOT NULL CHECK (state IN (0, 1, 2, 3)),
    delivery_count integer     NOT NULL DEFAULT 0,
    locked_until   timestamptz,
    session_id     text,
    enqueued_at    timestamptz NOT NULL,
    scheduled_at   timestamptz,
    expires_at     timestamptz,
    ttl_ms         bigint,
    message_id     text        NOT NULL,
    correlation_id text,
    causation_id   text,
    message_type   text,
    content_type   text,
    reply_to       text,
    properties     jsonb,
    dl_reason      text,
    dl_description text,
    dl_source      text,
    body           bytea       NOT NULL
);
-- Receive and browse: an entity's messages of one state in sequence order.
CREATE INDEX message_active ON courier.message (entity_id, seq) WHERE state = 0;
CREATE INDEX message_sessions ON courier.message (entity_id, session_id, seq)
    WHERE state = 0 AND session_id IS NOT NULL;
CREATE INDEX message_by_seq ON courier.message (entity_id, seq);
-- Activation of scheduled messages, expiry of locks and of time-to-live.
CREATE INDEX message_scheduled ON courier.message (entity_id, scheduled_at) WHERE state = 1;
CREATE INDEX message_locked ON courier.message (entity_id, locked_until) WHERE locked_until IS NOT NULL;
CREATE INDEX message_expiry ON courier.message (entity_id, expires_at)
    WHERE expires_at IS NOT NULL AND state IN (0, 2);

-- Completed messages are deleted at once, so the table stays small under a steady load;
-- vacuum it more eagerly than the defaults would.
ALTER TABLE courier.message SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02
);

-- Session locks and state (S4). A lock is named by its generation, raised at each accept.
CREATE TABLE courier.session (
    entity_id    bigint      NOT NULL REFERENCES courier.entity (id) ON DELETE CASCADE,
    session_id   text        NOT NULL,
    locked_until timestamptz,
    lock_gen     bigint      NOT NULL DEFAULT 0,
    state        bytea,
    PRIMARY KEY (entity_id, session_id)
);
