//! An operator's resubmit: dead letters moved back into the queue or subscription whose
//! dead-letter sub-queue holds them, in place (one `UPDATE` for a whole batch), as part
//! of the transaction of the lease that chose them.
//!
//! A message goes back where it was: same row, same sequence number (so it is received
//! before the messages sent after it, as an abandoned message is), same message id, body,
//! ids, session id and properties (without the failure and retry headers a handling wrote,
//! see [`FAILURE_HEADERS`]); its enqueued time is the clock's now, its time-to-live counts
//! from then, its delivery count starts again at zero. A subscription's message goes back
//! to that subscription alone.
//!
//! Why in place: a move (delete the dead letter, insert a new message) writes twice what a
//! send writes, and could not reach half the send rate (measured by
//! `cargo bench -p courier --bench admin`); an update of the row writes about what a send
//! writes, and the body never leaves the database.

use std::sync::LazyLock;

use crate::error::Result;
use crate::message::SequenceNumber;
use crate::recoverability::headers::FAILURE_HEADERS;

use super::rows::{SEQ_BITS, Sql};
use super::{Engine, State};

static UPDATE: LazyLock<String> = LazyLock::new(|| {
    let remove = FAILURE_HEADERS
        .iter()
        .map(|h| format!("'$.\"{h}\"'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "UPDATE courier_message SET state = 0, delivery_count = 0, locked_until = NULL, enqueued_at = ?2, \
         expires_at = CASE WHEN ttl_ms IS NULL THEN NULL \
           WHEN ttl_ms > (9223372036854775807 - ?2) / 1000 THEN 9223372036854775807 ELSE ?2 + ttl_ms * 1000 END, \
         properties = CASE WHEN properties IS NOT NULL AND json_valid(properties) \
           THEN json_remove(properties, {remove}) ELSE properties END, \
         dl_reason = NULL, dl_description = NULL, dl_source = NULL \
         WHERE state = 3 AND id IN (SELECT (?1 << {SEQ_BITS}) | value FROM json_each(?3))"
    )
});

static SHORTEST: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT MIN(expires_at) FROM courier_message \
         WHERE id IN (SELECT (?1 << {SEQ_BITS}) | value FROM json_each(?2))"
    )
});

impl Engine {
    /// Moves the dead letters `seqs` of `entity` (checked by the caller, in this
    /// transaction: dead-lettered, not locked) back to it.
    pub(super) async fn put_back(&mut self, entity: i64, seqs: &[SequenceNumber], now: i64) -> Sql<Result<()>> {
        if seqs.is_empty() {
            return Ok(Ok(()));
        }
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let wanted = serde_json::to_string(seqs).unwrap_or_else(|_| "[]".into());
        sqlx::query(UPDATE.as_str())
            .bind(entity)
            .bind(now)
            .bind(&wanted)
            .execute(self.conn.get()?)
            .await?;
        // One row back, not one a message (each row crosses the driver's channel).
        let shortest: Option<i64> = sqlx::query_scalar(SHORTEST.as_str())
            .bind(entity)
            .bind(&wanted)
            .fetch_one(self.conn.get()?)
            .await?;
        State::note(&mut self.state.next_expiry, shortest);
        self.state.touched.insert(entity);
        Ok(Ok(()))
    }
}
