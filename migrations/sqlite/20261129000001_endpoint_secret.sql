-- Each endpoint's secret: 32 random bytes, made by the first process of the endpoint that
-- starts (INSERT ... ON CONFLICT DO NOTHING, then read) and shared by all its processes.
-- The endpoint seals the count of each delayed retry (`courier.retry.delayed`) with it
-- (HMAC-SHA256 in `courier.retry.seal`), and trusts a count only with a valid seal, so a
-- producer cannot make a message skip its retries by writing a count. Deleting a row
-- makes a new secret at the endpoint's next start (messages waiting for a delayed retry
-- then start their retries again).
CREATE TABLE courier_endpoint_secret (
    endpoint   TEXT    NOT NULL PRIMARY KEY,
    secret     BLOB    NOT NULL CHECK (typeof(secret) = 'blob' AND length(secret) = 32),
    -- Microseconds since the Unix epoch, from the clock of the endpoint that made it.
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
