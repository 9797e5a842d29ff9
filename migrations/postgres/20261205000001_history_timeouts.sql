-- A workflow's history tells of saga timeouts too (issue 33): the endpoint's dispatcher
-- writes a `timeout_dispatched` event for each due timeout it sends, and a
-- `timeout_dead_lettered` one for a timeout sent its most times and never settled.
-- The check on `kind` (named by Postgres for its column) grows by those two names.
ALTER TABLE courier.history DROP CONSTRAINT history_kind_check;
ALTER TABLE courier.history ADD CONSTRAINT history_kind_check CHECK (
    kind IN ('handled', 'retried', 'dead_lettered', 'duplicate', 'timeout_dispatched', 'timeout_dead_lettered')
);
