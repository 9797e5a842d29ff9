//! The oracle: the classes of failure, and judging what is left of a case after the
//! receives (every row of its entities, read with what the oracle asks of it computed in
//! SQL): dead-lettered with a reason, scheduled within the horizon, locked by a live holder
//! within bounds, or deferred and reachable by its sequence number; anything else fails.

use std::sync::Arc;

use courier::{Clock, Receiver};
use sqlx::Row as _;
use sqlx::postgres::PgRow;

use super::LOCK_GRACE_MS;
use super::env::{Case, Env};
use super::receive::take_deferred;
use super::row::Row;

/// The classes of failure (the survey groups by them).
pub(crate) mod class {
    pub(crate) const INSERT_OTHER: &str = "the INSERT failed without a constraint violation";
    pub(crate) const SEND_FAILED: &str = "the valid message could not be sent";
    pub(crate) const RECEIVE_FAILED: &str = "a receive returned an error";
    pub(crate) const COMPLETE_FAILED: &str = "completing a received message failed";
    pub(crate) const VALID_MISSING: &str = "the valid message was never received";
    pub(crate) const VALID_TWICE: &str = "the valid message was received more than once";
    pub(crate) const DEAD_NO_REASON: &str = "dead-lettered without a reason or description";
    pub(crate) const BAD_SCHEDULE: &str = "scheduled, but not for a time after now and within 100 years";
    pub(crate) const LOCK_GONE_HOLDER: &str = "locked by a holder that is gone";
    pub(crate) const LOCK_TOO_LONG: &str = "locked past the lock duration + 5 min";
    pub(crate) const DEFERRED_ZERO: &str = "deferred with delivery count 0";
    pub(crate) const DEFERRED_UNREACHABLE: &str =
        "deferred, but receive_deferred by its sequence number does not get it";
    pub(crate) const STUCK_ACTIVE: &str = "active and unlocked, but no receive takes it";
    pub(crate) const LOST: &str = "gone without being received";
    pub(crate) const SESSION_SPIN: &str = "accept_session(Next) offers a session whose receive gets nothing";
    pub(crate) const RETRIED_BEYOND: &str = "handled more times than the retry policy allows";
    pub(crate) const DELAY_SKIPPED: &str = "a delayed retry came back before its delay";
    pub(crate) const AFTER_EXHAUSTED: &str = "handled again after the retry policy was exhausted";
    pub(crate) const HANDLED_TWICE: &str = "handled again after a successful handling";
    pub(crate) const SEEN_COUNT_ZERO: &str = "a handler saw delivery count 0 (the retry policy counts from it)";
    pub(crate) const DEAD_BEFORE_POLICY: &str = "dead-lettered before the retry policy was used up";
}

#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) class: &'static str,
    pub(crate) detail: String,
}

pub(crate) fn fail(class: &'static str, detail: impl Into<String>) -> Failure {
    Failure {
        class,
        detail: detail.into(),
    }
}

/// What one case found, for the tally.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) refused: Option<String>,
    pub(crate) received: usize,
    pub(crate) ends: Vec<&'static str>,
}

/// A row of the case as the oracle reads it after the receives.
#[derive(Debug, Clone)]
pub(super) struct Found {
    pub(super) entity_id: i64,
    pub(super) state: i16,
    pub(super) delivery_count: i32,
    pub(super) seq: i64,
    pub(super) session_id: Option<String>,
    pub(super) is_valid: bool,
    pub(super) dl_reason: Option<String>,
    pub(super) dl_ok: bool,
    pub(super) schedule_ok: bool,
    pub(super) locked: bool,
    pub(super) lock_in_bounds: bool,
    pub(super) holder_alive: bool,
    pub(super) shown: String,
}

impl Found {
    fn read(r: &PgRow) -> Self {
        Self {
            entity_id: r.get("entity_id"),
            state: r.get("state"),
            delivery_count: r.get("delivery_count"),
            seq: r.get("seq"),
            session_id: r.get("session_id"),
            is_valid: r.get("is_valid"),
            dl_reason: r.get("dl_reason"),
            dl_ok: r.get("dl_ok"),
            schedule_ok: r.get("schedule_ok"),
            locked: r.get("locked"),
            lock_in_bounds: r.get("lock_in_bounds"),
            holder_alive: r.get("holder_alive"),
            shown: r.get("shown"),
        }
    }
}

/// Every row of the case's entities, with what the oracle asks of it computed in SQL (the
/// times may be ones chrono cannot hold). `$1` entities, `$2` now, `$3` the lock
/// duration + 5 min in ms, `$4` the valid message's id.
const INSPECT: &str = "SELECT m.id, m.entity_id, m.state, m.delivery_count, m.seq, m.session_id, \
       m.message_id = $4 AS is_valid, m.dl_reason, \
       m.dl_reason IS NOT NULL AND m.dl_description IS NOT NULL AS dl_ok, \
       coalesce(m.scheduled_at > $2 AND m.scheduled_at <= $2 + interval '36600 days', false) AS schedule_ok, \
       coalesce(m.locked_until > $2, false) AS locked, \
       coalesce(m.locked_until <= $2 + $3 * interval '1 millisecond', false) AS lock_in_bounds, \
       m.holder IS NOT NULL AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
         AND l.objsubid = 1 AND l.classid::bigint = m.holder >> 32 AND l.objid::bigint = m.holder & 2147483647) \
         AS holder_alive, \
       format('row %s of %s %s: state %s, delivery_count %s, seq %s, locked_until %s, holder %s, \
scheduled_at %s, expires_at %s, ttl_ms %s, enqueued_at %s, message_id %s (%s bytes), session_id %s, \
dl_reason %s, dl_description %s', m.id, \
         (SELECT CASE e.kind WHEN 0 THEN 'queue' WHEN 1 THEN 'topic' ELSE 'subscription' END \
          FROM courier.entity e WHERE e.id = m.entity_id), m.entity_id, m.state, m.delivery_count, m.seq, \
         coalesce(m.locked_until::text, 'NULL'), coalesce(m.holder::text, 'NULL'), \
         coalesce(m.scheduled_at::text, 'NULL'), coalesce(m.expires_at::text, 'NULL'), \
         coalesce(m.ttl_ms::text, 'NULL'), m.enqueued_at::text, quote_literal(left(m.message_id, 24)), \
         octet_length(m.message_id), coalesce(quote_literal(left(m.session_id, 24)), 'NULL'), \
         coalesce(quote_literal(m.dl_reason), 'NULL'), coalesce(quote_literal(left(m.dl_description, 160)), 'NULL')) \
         AS shown \
     FROM courier.message m WHERE m.entity_id = ANY($1) ORDER BY m.id";

impl Env {
    pub(super) async fn inspect(&self, case: &Case) -> Vec<Found> {
        let rows = sqlx::query(INSPECT)
            .bind(&case.ids)
            .bind(self.clock.now())
            .bind(case.lock_ms + LOCK_GRACE_MS)
            .bind(&case.valid_id)
            .fetch_all(&self.pool)
            .await
            .unwrap();
        rows.iter().map(Found::read).collect()
    }

    /// Judges the rows left after the receives: each must be dead-lettered with a reason,
    /// scheduled within the horizon, locked by a live holder within bounds, or deferred and
    /// reachable by its sequence number. Returns how each ended (for the tally).
    pub(super) async fn judge(
        &self,
        row: &Row,
        case: &Case,
        receiver: &Arc<dyn Receiver>,
        left: &[Found],
        failures: &mut Vec<Failure>,
    ) -> Vec<&'static str> {
        let mut ends = Vec::new();
        for f in left.iter().filter(|f| !f.is_valid) {
            let end = if f.state == 3 {
                if !f.dl_ok {
                    failures.push(fail(class::DEAD_NO_REASON, f.shown.clone()));
                }
                "dead-lettered"
            } else if f.state == 1 {
                if !f.schedule_ok {
                    failures.push(fail(class::BAD_SCHEDULE, f.shown.clone()));
                }
                "scheduled"
            } else if f.locked {
                if !f.holder_alive {
                    failures.push(fail(class::LOCK_GONE_HOLDER, f.shown.clone()));
                } else if !f.lock_in_bounds {
                    failures.push(fail(class::LOCK_TOO_LONG, f.shown.clone()));
                }
                "locked by a live holder"
            } else if f.state == 2 {
                if f.delivery_count < 1 {
                    failures.push(fail(class::DEFERRED_ZERO, f.shown.clone()));
                } else if f.entity_id != case.receiving {
                    failures.push(fail(
                        class::DEFERRED_UNREACHABLE,
                        format!("{}: it is not on an entity a receiver reads", f.shown),
                    ));
                } else if let Err(e) = take_deferred(
                    &*self.transport,
                    row.shape,
                    &case.path,
                    receiver,
                    f.session_id.as_deref(),
                    f.seq,
                )
                .await
                {
                    failures.push(fail(class::DEFERRED_UNREACHABLE, format!("{}: {e}", f.shown)));
                }
                "deferred, received by sequence number"
            } else {
                failures.push(fail(class::STUCK_ACTIVE, f.shown.clone()));
                "active"
            };
            ends.push(end);
        }
        ends
    }
}
