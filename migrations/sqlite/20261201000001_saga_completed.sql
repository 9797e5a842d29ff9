-- Markers of completed saga instances (issue 34): kept for the retention a saga asks for
-- (SagaOptions::remember_completed), so that a start message arriving after its instance
-- completed (a client's retry) is recognised instead of starting a new instance. One
-- marker per instance; expired markers are ignored and deleted a few at a time by later
-- completions. Times are microseconds since the Unix epoch from the endpoint's clock.
CREATE TABLE courier_saga_completed (
    saga_type    TEXT    NOT NULL,
    correlation  TEXT    NOT NULL,
    completed_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (saga_type, correlation)
) WITHOUT ROWID;
CREATE INDEX courier_saga_completed_expiry ON courier_saga_completed (expires_at);
