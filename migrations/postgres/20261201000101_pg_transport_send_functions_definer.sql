-- The send functions run with their owner's rights (issue 31): a producer that is not
-- Courier can be given USAGE on the schema and nothing else (no INSERT on courier.message),
-- and still send through courier.send, courier.publish and courier.schedule. A role that
-- may INSERT into courier.message can write any row, a dead letter's record (dl_reason,
-- dl_description) included, which the operations command would show as the transport's;
-- a role that may only call the functions cannot: they check every argument and write only
-- ready or scheduled rows. The search path is fixed, so that no object of the caller's can
-- stand in for one the functions use (every name in them is schema-qualified or in
-- pg_catalog). See docs/postgres.md, "Messages from other producers".

ALTER FUNCTION courier.enqueue(smallint, text, text, text, bytea, text, text, text, text, text, jsonb, interval,
    timestamptz, integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
