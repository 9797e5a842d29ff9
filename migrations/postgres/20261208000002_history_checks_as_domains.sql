-- The history's checks move from the table to the columns' types (issue 33,
-- docs/history.md "Cost"): the same four rules, as domains over the same base types.
-- Postgres reads a table's CHECK constraints back from their stored text and plans them
-- again at every INSERT statement: for courier.history's four, about 5% of the server's
-- CPU in the saga bench with history on, more than the checks themselves. A domain's
-- checks are read and planned once per connection (the type cache) and only evaluated
-- at each row.
--
-- Each column changes to a domain without constraints first (the same base type: no
-- rewrite, indexes kept), then the domain takes its constraint. It is added NOT VALID:
-- every existing row already passed the same rule as the table's CHECK, dropped in this
-- transaction; new and updated rows are checked. A value another writer inserts that
-- breaks a rule fails with the domain's name and the constraint's, which keeps the
-- name the table's check had.
CREATE DOMAIN courier.history_endpoint AS text;
CREATE DOMAIN courier.history_kind AS text;
CREATE DOMAIN courier.history_attempt AS integer;
CREATE DOMAIN courier.history_detail AS jsonb;

ALTER TABLE courier.history
    DROP CONSTRAINT history_endpoint_check,
    DROP CONSTRAINT history_kind_check,
    DROP CONSTRAINT history_attempt_check,
    DROP CONSTRAINT history_detail_check,
    ALTER COLUMN endpoint TYPE courier.history_endpoint,
    ALTER COLUMN kind TYPE courier.history_kind,
    ALTER COLUMN attempt TYPE courier.history_attempt,
    ALTER COLUMN detail TYPE courier.history_detail;

ALTER DOMAIN courier.history_endpoint ADD CONSTRAINT history_endpoint_check CHECK (VALUE <> '') NOT VALID;
ALTER DOMAIN courier.history_kind ADD CONSTRAINT history_kind_check CHECK (
    VALUE IN ('handled', 'retried', 'dead_lettered', 'duplicate', 'timeout_dispatched', 'timeout_dead_lettered')
) NOT VALID;
ALTER DOMAIN courier.history_attempt ADD CONSTRAINT history_attempt_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN courier.history_detail ADD CONSTRAINT history_detail_check CHECK (jsonb_typeof(VALUE) = 'object') NOT VALID;
