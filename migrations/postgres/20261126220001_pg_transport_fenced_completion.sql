-- The start and the end of a handling on the Postgres transport with its own store, each
-- sent with BEGIN or COMMIT in one round trip (one simple query; see
-- framework/src/postgres/store.rs).
--
-- The inbox record of a handling: raises SQLSTATE CL002 when the endpoint recorded the
-- message before (a duplicate), so that the transaction the record opens is aborted and
-- the store, seeing the error, looks again the usual way (and completes the duplicate
-- without handling it). The message says so in the server's log.
CREATE FUNCTION courier.record_inbox(p_endpoint text, p_message_id text, p_at timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO courier.inbox (endpoint, message_id, processed_at) VALUES (p_endpoint, p_message_id, p_at)
        ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'endpoint % handled message % before: a duplicate, completed without handling it again',
            p_endpoint, p_message_id USING ERRCODE = 'CL002';
    END IF;
END
$$;

-- The fenced completion of a received message, as one function, so that the Postgres
-- transport's store can send it and the COMMIT of the handling in one round trip (one
-- simple query; see framework/src/postgres/store.rs). It deletes the message if the lock
-- (its row, entity and delivery count) is still the message's and unexpired at p_now,
-- and raises SQLSTATE CL001 when it is not: the error aborts the transaction, so the
-- COMMIT sent after it in the same query is skipped and nothing of the handling commits.
-- PL/pgSQL keeps the DELETE's plan for the session, as a prepared statement would.
CREATE FUNCTION courier.complete_fenced(p_id bigint, p_entity bigint, p_count integer, p_now timestamptz)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM courier.message
     WHERE id = p_id AND entity_id = p_entity AND (delivery_count & 65535) = p_count
       AND locked_until > p_now AND state <> 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the lock of message % is lost', p_id USING ERRCODE = 'CL001';
    END IF;
END
$$;
