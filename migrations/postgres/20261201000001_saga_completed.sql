-- Markers of completed saga instances (issue 34): kept for the retention a saga asks for
-- (SagaOptions::remember_completed), so that a start message arriving after its instance
-- completed (a client's retry) is recognised instead of starting a new instance. One
-- marker per instance; expired markers are ignored and deleted a few at a time by later
-- completions.
CREATE TABLE courier.saga_completed (
    saga_type    text        NOT NULL,
    correlation  text        NOT NULL,
    completed_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (saga_type, correlation)
);
CREATE INDEX saga_completed_expiry ON courier.saga_completed (expires_at);
