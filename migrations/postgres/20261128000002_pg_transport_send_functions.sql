-- The way in for producers that are not Courier (issue 30): courier.send (a queue),
-- courier.publish (a topic) and courier.schedule (a queue, at a time). Each checks every
-- argument as Courier's own senders do (framework/src/checks.rs) and raises a clear
-- error instead of inserting a row no receiver could handle, then inserts the message as
-- Courier's sender does (framework/src/postgres/send.rs) and returns its sequence number.
-- They run in the caller's transaction: the message is receivable when it commits.
--
-- Errors: SQLSTATE CL100 for an argument out of range (the message names the argument and
-- its limit), CL101 for a queue or topic that does not exist. See docs/postgres.md
-- ("Messages from other producers").

CREATE FUNCTION courier.enqueue(
    kind smallint,
    destination text,
    message_id text,
    message_type text,
    body bytea,
    content_type text,
    correlation_id text,
    causation_id text,
    session_id text,
    reply_to text,
    properties jsonb,
    time_to_live interval,
    scheduled_at timestamptz,
    max_message_size integer
) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    what text := CASE WHEN kind = 1 THEN 'topic' ELSE 'queue' END;
    target courier.entity%ROWTYPE;
    ttl numeric;
    ttl_ms bigint;
    size bigint;
    bad record;
    sent_at timestamptz := now();
    next_seq bigint;
    notified bigint;
BEGIN
    IF destination IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100', MESSAGE = format('courier: the %s must be given', what);
    END IF;
    SELECT * INTO target FROM courier.entity e WHERE e.parent = 0 AND e.kind = enqueue.kind AND e.name = destination;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'CL101',
            MESSAGE = format('courier: %s %L does not exist', what, destination),
            HINT = CASE WHEN EXISTS (SELECT 1 FROM courier.entity e WHERE e.parent = 0 AND e.name = destination)
                        THEN format('%L is a %s: use courier.%s', destination,
                                    CASE WHEN kind = 1 THEN 'queue' ELSE 'topic' END,
                                    CASE WHEN kind = 1 THEN 'send' ELSE 'publish' END)
                        ELSE 'check the name (courier queues lists them); an endpoint creates its queue when it starts'
                   END;
    END IF;
    IF message_id IS NULL OR octet_length(message_id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = format('courier: message_id must have 1 to 128 bytes, it has %s',
                             coalesce(octet_length(message_id)::text, 'none (NULL)')),
            HINT = 'give every message an id of its own and keep it when the same message is sent again';
    END IF;
    IF body IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100', MESSAGE = 'courier: body must not be NULL (an empty body is ''''::bytea)';
    END IF;
    IF session_id IS NOT NULL AND octet_length(session_id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = format('courier: session_id must have 1 to 128 bytes, it has %s', octet_length(session_id));
    END IF;
    IF session_id IS NULL AND kind = 0 AND target.requires_session THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = format('courier: queue %L requires sessions: give a session_id', destination);
    END IF;
    IF time_to_live IS NOT NULL THEN
        ttl := extract(epoch FROM time_to_live) * 1000;
        IF ttl < 1 OR ttl > 3162240000000 THEN
            RAISE EXCEPTION USING ERRCODE = 'CL100',
                MESSAGE = format('courier: time_to_live %s must be between 1 millisecond and 100 years', time_to_live);
        END IF;
        ttl_ms := floor(ttl);
    END IF;
    IF scheduled_at IS NOT NULL AND (scheduled_at < '1970-01-01 00:00:00+00'
                                     OR scheduled_at > sent_at + interval '36600 days') THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = format('courier: scheduled_at %s must be from 1970 on and at most 100 years ahead', scheduled_at);
    END IF;
    IF properties IS NOT NULL THEN
        IF jsonb_typeof(properties) <> 'object' THEN
            RAISE EXCEPTION USING ERRCODE = 'CL100',
                MESSAGE = format('courier: properties must be a JSON object, not %s', jsonb_typeof(properties));
        END IF;
        SELECT p.key, jsonb_typeof(p.value) AS type INTO bad FROM jsonb_each(properties) p
        WHERE CASE jsonb_typeof(p.value)
                  WHEN 'number' THEN abs(p.value::text::numeric) > 1.7976931348623157e308
                  ELSE jsonb_typeof(p.value) NOT IN ('boolean', 'string') END
        LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION USING ERRCODE = 'CL100',
                MESSAGE = format('courier: property %L is %s; property values are booleans, numbers (within the '
                                 'range of a 64-bit float) and strings', bad.key,
                                 CASE WHEN bad.type = 'number' THEN 'a number beyond the range of a 64-bit float'
                                      ELSE 'of the JSON type ' || bad.type END);
        END IF;
    END IF;
    size := octet_length(body) + octet_length(message_id) + coalesce(octet_length(correlation_id), 0)
        + coalesce(octet_length(causation_id), 0) + coalesce(octet_length(message_type), 0)
        + coalesce(octet_length(content_type), 0) + coalesce(octet_length(session_id), 0)
        + coalesce(octet_length(reply_to), 0)
        + coalesce((SELECT sum(octet_length(p.key) + CASE jsonb_typeof(p.value)
                                  WHEN 'boolean' THEN 1 WHEN 'number' THEN 8
                                  ELSE octet_length(p.value #>> '{}') END)
                    FROM jsonb_each(properties) p), 0);
    IF size > coalesce(max_message_size, 1048576) THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = format('courier: the message has %s bytes (body, ids and properties); the limit is %s',
                             size, coalesce(max_message_size, 1048576)),
            HINT = 'max_message_size must not exceed the receiving transport''s (PgTransportBuilder::max_message_size)';
    END IF;

    next_seq := nextval('courier.message_seq');
    IF scheduled_at IS NOT NULL THEN
        -- Waits on the queue or topic itself until a receiver activates it.
        INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, scheduled_at, ttl_ms,
            message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties, body)
        VALUES (target.id, next_seq, 1, session_id, sent_at, scheduled_at, least(ttl_ms, target.default_ttl_ms),
            message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties, body);
        RETURN next_seq;
    END IF;
    -- A queue gets the message; a topic's subscriptions get a copy each (none: no copy).
    WITH t AS (SELECT e.id, e.path, e.default_ttl_ms, e.requires_session FROM courier.entity e
               WHERE (kind = 0 AND e.id = target.id) OR (kind = 1 AND e.parent = target.id AND e.kind = 2)),
         ins AS (INSERT INTO courier.message (entity_id, seq, state, session_id, enqueued_at, expires_at, ttl_ms,
                     message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties,
                     dl_reason, dl_description, dl_source, body)
                 SELECT t.id, next_seq, CASE WHEN t.requires_session AND session_id IS NULL THEN 3 ELSE 0 END,
                     session_id, sent_at, sent_at + least(ttl_ms, t.default_ttl_ms) * interval '1 millisecond',
                     least(ttl_ms, t.default_ttl_ms), message_id, correlation_id, causation_id, message_type,
                     content_type, reply_to, properties,
                     CASE WHEN t.requires_session AND session_id IS NULL THEN 'SessionIdMissing' END,
                     CASE WHEN t.requires_session AND session_id IS NULL
                          THEN 'the subscription requires sessions and the message has no session id' END,
                     CASE WHEN t.requires_session AND session_id IS NULL THEN t.path END,
                     body
                 FROM t RETURNING entity_id)
    SELECT count(pg_notify('courier_transport', ins.entity_id::text)) INTO notified FROM ins;
    RETURN next_seq;
END;
$$;

CREATE FUNCTION courier.send(
    queue text,
    message_id text,
    message_type text,
    body bytea,
    content_type text DEFAULT 'application/json',
    correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL,
    session_id text DEFAULT NULL,
    reply_to text DEFAULT NULL,
    properties jsonb DEFAULT NULL,
    time_to_live interval DEFAULT NULL,
    scheduled_at timestamptz DEFAULT NULL,
    max_message_size integer DEFAULT 1048576
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT courier.enqueue(0::smallint, queue, message_id, message_type, body, content_type, correlation_id,
        causation_id, session_id, reply_to, properties, time_to_live, scheduled_at, max_message_size)
$$;

CREATE FUNCTION courier.publish(
    topic text,
    message_id text,
    message_type text,
    body bytea,
    content_type text DEFAULT 'application/json',
    correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL,
    session_id text DEFAULT NULL,
    reply_to text DEFAULT NULL,
    properties jsonb DEFAULT NULL,
    time_to_live interval DEFAULT NULL,
    scheduled_at timestamptz DEFAULT NULL,
    max_message_size integer DEFAULT 1048576
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT courier.enqueue(1::smallint, topic, message_id, message_type, body, content_type, correlation_id,
        causation_id, session_id, reply_to, properties, time_to_live, scheduled_at, max_message_size)
$$;

CREATE FUNCTION courier.schedule(
    queue text,
    scheduled_at timestamptz,
    message_id text,
    message_type text,
    body bytea,
    content_type text DEFAULT 'application/json',
    correlation_id text DEFAULT NULL,
    causation_id text DEFAULT NULL,
    session_id text DEFAULT NULL,
    reply_to text DEFAULT NULL,
    properties jsonb DEFAULT NULL,
    time_to_live interval DEFAULT NULL,
    max_message_size integer DEFAULT 1048576
) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF scheduled_at IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'CL100',
            MESSAGE = 'courier: scheduled_at must be given (courier.send sends at once)';
    END IF;
    RETURN courier.enqueue(0::smallint, queue, message_id, message_type, body, content_type, correlation_id,
        causation_id, session_id, reply_to, properties, time_to_live, scheduled_at, max_message_size);
END;
$$;
