//! An operator's resubmit: dead letters moved back into the queue or subscription whose
//! dead-letter sub-queue holds them, inside SQLite (one `INSERT ... SELECT` and one
//! `DELETE` for a whole batch), as part of the transaction of the lease that chose them.
//!
//! The bodies never leave the database: reading a thousand 1 KiB rows out through the
//! driver and writing them back cost three times a send of as many messages. The moved
//! copy keeps the message id, body, ids, session id and properties (without the failure
//! and retry headers a handling wrote, see [`FAILURE_HEADERS`]), and gets a new sequence
//! number (a subscription's from its topic, which numbers every subscription's rows), the
//! clock's time as its enqueued time, its time-to-live from now, and a delivery count of
//! zero.

use std::sync::LazyLock;

use crate::error::Result;
use crate::message::SequenceNumber;
use crate::recoverability::headers::FAILURE_HEADERS;

use super::rows::{SEQ_BITS, Sql, row_id};
use super::{Engine, Kind, State};

/// `json_remove` of every failure header, as SQL arguments (`'$."courier.failure.error"', ...`).
static REMOVE_FAILURE_HEADERS: LazyLock<String> = LazyLock::new(|| {
    FAILURE_HEADERS
        .iter()
        .map(|h| format!("'$.\"{h}\"'"))
        .collect::<Vec<_>>()
        .join(", ")
});

static INSERT: LazyLock<String> = LazyLock::new(|| {
    format!(
        "INSERT INTO courier_message (id, entity_id, seq, state, delivery_count, session_id, enqueued_at, \
         expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
         properties, body) \
         SELECT (?1 << {SEQ_BITS}) | (?2 + n), ?1, ?2 + n, 0, 0, session_id, ?3, \
           CASE WHEN ttl_ms IS NULL THEN NULL WHEN ttl_ms > (9223372036854775807 - ?3) / 1000 \
             THEN 9223372036854775807 ELSE ?3 + ttl_ms * 1000 END, \
           ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
           CASE WHEN properties IS NOT NULL AND json_valid(properties) \
             THEN json_remove(properties, {remove}) ELSE properties END, body \
         FROM (SELECT m.*, ROW_NUMBER() OVER (ORDER BY m.seq) - 1 AS n FROM courier_message m \
               WHERE m.id IN (SELECT (?1 << {SEQ_BITS}) | value FROM json_each(?4)))",
        remove = REMOVE_FAILURE_HEADERS.as_str()
    )
});

static DELETE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "DELETE FROM courier_message WHERE state = 3 AND id IN (SELECT (?1 << {SEQ_BITS}) | value FROM json_each(?2))"
    )
});

impl Engine {
    /// Moves the dead letters `seqs` of `entity` (checked by the caller, in this
    /// transaction: dead-lettered, not locked, in sequence order) back to it.
    pub(super) async fn put_back(&mut self, entity: i64, seqs: &[SequenceNumber], now: i64) -> Sql<Result<()>> {
        if seqs.is_empty() {
            return Ok(Ok(()));
        }
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let numbered_by = if info.kind == Kind::Subscription {
            info.parent
        } else {
            entity
        };
        let first = match self.state.alloc_seq(numbered_by, seqs.len() as i64) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let wanted = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        sqlx::query(INSERT.as_str())
            .bind(entity)
            .bind(first)
            .bind(now)
            .bind(&wanted)
            .execute(self.conn.get()?)
            .await?;
        sqlx::query(DELETE.as_str())
            .bind(entity)
            .bind(&wanted)
            .execute(self.conn.get()?)
            .await?;
        // Time-to-live from now: the earliest possible expiry is now plus the smallest.
        let shortest: Option<i64> =
            sqlx::query_scalar("SELECT MIN(expires_at) FROM courier_message WHERE id >= ?1 AND id < ?2")
                .bind(row_id(entity, first))
                .bind(row_id(entity, first + seqs.len() as i64))
                .fetch_one(self.conn.get()?)
                .await?;
        State::note(&mut self.state.next_expiry, shortest);
        self.state.touched.insert(entity);
        Ok(Ok(()))
    }
}
