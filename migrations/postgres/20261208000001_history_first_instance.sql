-- A history event's first saga instance is kept in the event's own row (issue 33,
-- docs/history.md "Cost"): `saga_type` and `correlation`, both set or neither. Nearly
-- every event touches one instance, and its row in courier.history_instance cost a second
-- insert, two more index entries and a second table's executor set-up in every event's
-- statement. courier.history_instance now holds the instances past the first (an event
-- of a handling that touched two sagas), in the order of `HistoryEvent::instances`, and
-- every event older than this migration.
--
-- courier.history_instance_all is what every read of an instance's timeline goes
-- through: the first instances and the others, one row per (event, instance). A row
-- another writer inserts with only one of the two columns set names no instance; no read
-- shows it as one.
--
-- No table is rewritten: the columns are NULL for existing rows. The index is built on
-- the rows that name an instance, which are none yet.
ALTER TABLE courier.history ADD COLUMN saga_type text, ADD COLUMN correlation text;

CREATE INDEX history_saga ON courier.history (saga_type, correlation)
    WHERE saga_type IS NOT NULL AND correlation IS NOT NULL;

CREATE VIEW courier.history_instance_all (history_id, saga_type, correlation) AS
    SELECT id, saga_type, correlation FROM courier.history
    WHERE saga_type IS NOT NULL AND correlation IS NOT NULL
    UNION ALL
    SELECT history_id, saga_type, correlation FROM courier.history_instance;
