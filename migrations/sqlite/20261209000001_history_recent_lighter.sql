-- courier_history_recent, the table every handling with a history writes its event to,
-- made lighter to write (issue 33, docs/history.md "Cost"), in two ways.
--
-- Its checks cost less to evaluate and accept exactly the rows they did (a row this table
-- takes and courier_history refuses would stop every move; tests/store/history_checks.rs
-- compares the two tables' checks over any value):
-- * `kind IN ('handled', ...)`: SQLite evaluates a list of more than two constants by
--   building a temporary b-tree of it at every statement that checks a row (a page cache,
--   a page and six inserts, about a tenth of an event's cost). The same six names are
--   now compared one after the other.
-- * `json_valid(detail) AND json_type(detail) = 'object'` parsed the detail twice. A text
--   json_valid accepts is RFC 8259 JSON, whose type is an object exactly when its first
--   character after JSON's white space (space, tab, line feed, carriage return) is `{`:
--   the detail is now parsed once. json_valid accepts no BLOB, so both forms reject every
--   BLOB.
--
-- And an event's first saga instance is two columns of its recent row (`saga_type`,
-- `correlation`, both set or both NULL), as on Postgres: a saga's event is one insert of
-- one row in a handling's transaction, where it was two statements and a page of
-- `courier_history_instance_recent` more in the commit. Its other instances (a handling
-- that touched two sagas), and every instance of the recent events written before this
-- migration, stay in `courier_history_instance_recent`. The move puts the first instance
-- into `courier_history_instance` with the others: the indexed tables do not change.
--
-- SQLite cannot change a table's CHECK: the recent table (a few hundred rows, unless its
-- moves failed) is built anew and its rows copied, ids kept, under its views.
-- courier_history keeps its checks: building it anew would rewrite every event, and the
-- move checks its rows once every few hundred events, not in a handling's transaction.
DROP VIEW courier_history_all;
DROP VIEW courier_history_instance_all;

CREATE TABLE courier_history_recent_checked (
    id              INTEGER PRIMARY KEY,
    endpoint        TEXT    NOT NULL CHECK (typeof(endpoint) = 'text' AND endpoint <> ''),
    kind            TEXT    NOT NULL CHECK (kind = 'handled' OR kind = 'retried' OR kind = 'dead_lettered'
                                            OR kind = 'duplicate' OR kind = 'timeout_dispatched'
                                            OR kind = 'timeout_dead_lettered'),
    at              INTEGER NOT NULL CHECK (typeof(at) = 'integer'),
    message_id      TEXT    NOT NULL CHECK (typeof(message_id) = 'text'),
    message_type    TEXT    CHECK (message_type IS NULL OR typeof(message_type) = 'text'),
    conversation_id TEXT    CHECK (conversation_id IS NULL OR typeof(conversation_id) = 'text'),
    causation_id    TEXT    CHECK (causation_id IS NULL OR typeof(causation_id) = 'text'),
    attempt         INTEGER NOT NULL CHECK (typeof(attempt) = 'integer' AND attempt >= 0),
    enqueued_at     INTEGER CHECK (enqueued_at IS NULL OR typeof(enqueued_at) = 'integer'),
    received_at     INTEGER CHECK (received_at IS NULL OR typeof(received_at) = 'integer'),
    detail          TEXT    NOT NULL CHECK (json_valid(detail)
                                            AND substr(ltrim(detail, char(32, 9, 10, 13)), 1, 1) = '{'),
    saga_type       TEXT,
    correlation     TEXT,
    CHECK ((saga_type IS NULL) = (correlation IS NULL))
);

INSERT INTO courier_history_recent_checked
    (id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, enqueued_at,
     received_at, detail)
SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt, enqueued_at,
       received_at, detail
FROM courier_history_recent;

DROP TABLE courier_history_recent;
ALTER TABLE courier_history_recent_checked RENAME TO courier_history_recent;

CREATE VIEW courier_history_all AS
    SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt,
           enqueued_at, received_at, detail
    FROM courier_history
    UNION ALL
    SELECT id, endpoint, kind, at, message_id, message_type, conversation_id, causation_id, attempt,
           enqueued_at, received_at, detail
    FROM courier_history_recent;

CREATE VIEW courier_history_instance_all AS
    SELECT history_id, saga_type, correlation FROM courier_history_instance
    UNION ALL
    SELECT history_id, saga_type, correlation FROM courier_history_instance_recent
    UNION ALL
    SELECT id, saga_type, correlation FROM courier_history_recent WHERE saga_type IS NOT NULL;
