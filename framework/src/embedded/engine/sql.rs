//! The SQL the engine builds from literals: the columns a message is read with, the
//! filters of ready, session and dead-lettered messages, the lock, take and settlement
//! statements, and the multi-row INSERTs of a send. SQL is built only from literals
//! (`concat!`) and numbers, never from input.

use std::sync::LazyLock;

/// The columns a message is read with, in the order `row_to_message` expects. SQL is built
/// only from literals (`concat!`) and numbers, never from input.
macro_rules! columns {
    () => {
        "id, seq, state, delivery_count, locked_until, session_id, enqueued_at, scheduled_at, expires_at, ttl_ms, \
         message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties, dl_reason, \
         dl_description, dl_source, body"
    };
}

/// Ready messages of entity `?2` at time `?3` under max delivery count `?4` (and session `?6`).
macro_rules! ready_filter {
    () => {
        "entity_id = ?2 AND state = 0 AND delivery_count < ?4 AND (expires_at IS NULL OR expires_at > ?3)"
    };
}
macro_rules! session_filter {
    () => {
        "entity_id = ?2 AND state = 0 AND session_id = ?6 AND delivery_count < ?4 \
         AND (expires_at IS NULL OR expires_at > ?3)"
    };
}
macro_rules! dead_filter {
    () => {
        "entity_id = ?2 AND state = 3 AND (locked_until IS NULL OR locked_until <= ?3)"
    };
}
/// Locks up to `?5` receivable messages until `?1`.
macro_rules! lock_sql {
    ($filter:ident, $new_state:literal) => {
        concat!(
            "UPDATE courier_message SET state = ",
            $new_state,
            ", locked_until = ?1, delivery_count = delivery_count + 1 WHERE id IN (SELECT id FROM courier_message \
             WHERE ",
            $filter!(),
            " ORDER BY seq LIMIT ?5) RETURNING ",
            columns!()
        )
    };
}
/// Takes (deletes) up to `?5` receivable messages.
macro_rules! take_sql {
    ($filter:ident) => {
        concat!(
            "DELETE FROM courier_message WHERE id IN (SELECT id FROM courier_message WHERE ",
            $filter!(),
            " ORDER BY seq LIMIT ?5) RETURNING ",
            columns!()
        )
    };
}
/// The condition of a settlement: lock `(?1, ?2)` still held at `?3`.
macro_rules! lock_cond {
    ($states:literal) => {
        concat!(
            " WHERE id = ?1 AND delivery_count = ?2 AND locked_until IS NOT NULL AND locked_until > ?3 AND state IN ",
            $states
        )
    };
}
/// Merges the properties `$n` (JSON) into a row's. A row whose properties are not JSON
/// (another program's, kept as written in the dead-letter sub-queue) keeps them: patching
/// them would fail the statement, and with it every command of the batch.
///
/// Properties that hold `courier.failure.endpoint` are an endpoint's record of a failure
/// (`runtime/failures.rs`): they replace every `courier.failure.*` property the row has,
/// so that none a producer wrote stays beside Courier's (issue 31, point 6). The others
/// are kept with their JSON types (`json_each` gives a boolean as 0 or 1: written back
/// as `true` or `false`).
macro_rules! patch_props {
    ($n:literal) => {
        concat!(
            "properties = CASE WHEN ",
            $n,
            " IS NULL THEN properties WHEN json_valid(COALESCE(properties, '{}')) \
             THEN json_patch(CASE WHEN json_type(COALESCE(properties, '{}')) = 'object' \
               AND json_extract(",
            $n,
            ", '$.\"courier.failure.endpoint\"') IS NOT NULL \
             THEN (SELECT json_group_object(key, CASE type WHEN 'true' THEN json('true') \
                 WHEN 'false' THEN json('false') WHEN 'object' THEN json(value) WHEN 'array' THEN json(value) \
                 ELSE value END) FROM json_each(properties) WHERE substr(key, 1, 16) <> 'courier.failure.') \
             ELSE COALESCE(properties, '{}') END, ",
            $n,
            ") ELSE properties END"
        )
    };
}

/// Columns written by an insert, in order.
pub(super) const INSERT_COLUMNS: usize = 20;

/// `INSERT` statements for 256, 128, 64, 32 and 16 down to 1 rows: the sends of a batch go
/// in as few statements as these sizes allow (one for up to 16 rows), each size prepared
/// once and kept in the connection's statement cache.
pub(super) static INSERTS: LazyLock<[(usize, String); 20]> = LazyLock::new(|| {
    let sizes: [usize; 20] = [256, 128, 64, 32, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1];
    sizes.map(|rows| {
        let mut sql = String::from(
            "INSERT INTO courier_message (id, entity_id, seq, state, session_id, enqueued_at, scheduled_at, \
             expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
             properties, dl_reason, dl_description, dl_source, body) VALUES ",
        );
        for r in 0..rows {
            if r > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            for c in 0..INSERT_COLUMNS {
                if c > 0 {
                    sql.push_str(", ");
                }
                sql.push('?');
            }
            sql.push(')');
        }
        (rows, sql)
    })
});
