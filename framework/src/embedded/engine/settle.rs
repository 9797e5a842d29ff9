//! Settling a received message: complete, abandon, dead-letter and defer, and renewing a
//! message's lock ("where is a lock renewed?": `renew`, here).
//!
//! Holds: `complete_all` (the completes of a batch in one statement), `settle` (one
//! settlement of any kind) and `renew`. Every settlement checks that the lock is still
//! held; a lost lock answers `LockLost`. Session locks are renewed in `sessions.rs`.

use std::collections::HashSet;

use chrono::{DateTime, Utc};

use crate::entity::SubQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::message::reasons;
use crate::transport::Settlement;

use super::Engine;
use super::commands::{LockRef, Outcome, Reply, outcome};
use super::rows::{Sql, after_ms, from_micros, lock_lost, lossy_text, props_json};

/// The reason stored for a dead-lettering whose reason is empty.
pub(super) const NO_REASON_GIVEN: &str = "courier.NoReasonGiven";
/// The description stored for a dead-lettering whose description is empty.
pub(super) const NO_DESCRIPTION_GIVEN: &str = "the receiver gave no description when it dead-lettered the message";

impl Engine {
    /// Completes many locks with one statement.
    pub(super) async fn complete_all(
        &mut self,
        completes: Vec<(LockRef, Reply<()>)>,
        now: i64,
        outcomes: &mut Vec<Outcome>,
    ) -> Sql {
        if completes.is_empty() {
            return Ok(());
        }
        let mut json = String::from("[");
        for (i, (lock, _)) in completes.iter().enumerate() {
            if i > 0 {
                json.push(',');
            }
            json.push_str(&format!("[{},{}]", lock.id, lock.delivery_count));
        }
        json.push(']');
        // The set holds (id, delivery count) pairs: a stale lock of a message that was
        // locked again (same id, lower count) completed in the same group as the current
        // lock must still get LockLost.
        let done: HashSet<(i64, i64)> = sqlx::query_as(
            "DELETE FROM courier_message WHERE (id, delivery_count) IN \
             (SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1)) \
             AND state IN (2, 4) AND locked_until > ?2 RETURNING id, delivery_count",
        )
        .bind(json)
        .bind(now)
        .fetch_all(self.conn.get()?)
        .await?
        .into_iter()
        .collect();
        for (lock, reply) in completes {
            let r = if done.contains(&(lock.id, lock.delivery_count)) {
                Ok(())
            } else {
                Err(lock_lost())
            };
            outcomes.push(outcome(reply, r));
        }
        Ok(())
    }

    pub(super) async fn settle(&mut self, lock: &LockRef, settlement: Settlement, now: i64) -> Sql<Result<()>> {
        let info = match self.state.entity(lock.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        if let Some(key) = &lock.session
            && self.session_lock(lock.entity, key, now).await?.is_none()
        {
            return Ok(Err(Error::new(ErrorKind::SessionLockLost)));
        }
        let dead = lock.sub_queue == SubQueue::DeadLetter;
        let pick = |main: &'static str, dlq: &'static str| if dead { dlq } else { main };
        let invalid = |what: &str| {
            Ok(Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("a message in a dead-letter sub-queue cannot be {what}"),
            })))
        };
        let rows = match settlement {
            Settlement::Complete => sqlx::query(pick(
                concat!("DELETE FROM courier_message", lock_cond!("(2, 4)")),
                concat!("DELETE FROM courier_message", lock_cond!("(3)")),
            ))
            .bind(lock.id)
            .bind(lock.delivery_count)
            .bind(now)
            .execute(self.conn.get()?)
            .await?
            .rows_affected(),
            Settlement::Abandon { properties } => {
                use sqlx::Row;
                // Back to the front: a locked message is ready again; a deferred or
                // dead-lettered one stays where it is, unlocked. At the max delivery
                // count it is dead-lettered (S2.6).
                let row = sqlx::query(pick(
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, \
                         state = CASE WHEN state = 2 THEN 2 WHEN delivery_count >= ?5 THEN 3 ELSE 0 END, \
                         dl_reason = CASE WHEN state = 4 AND delivery_count >= ?5 THEN ?6 ELSE dl_reason END, \
                         dl_description = CASE WHEN state = 4 AND delivery_count >= ?5 THEN 'the message was delivered ' \
                             || delivery_count || ' times without being settled' ELSE dl_description END, \
                         dl_source = CASE WHEN state = 4 AND delivery_count >= ?5 THEN ?7 ELSE dl_source END, ",
                        patch_props!("?4"),
                        lock_cond!("(2, 4)"),
                        " RETURNING state, message_id, dl_description"
                    ),
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, ",
                        patch_props!("?4"),
                        lock_cond!("(3)"),
                        " AND ?5 = ?5 AND ?6 = ?6 AND ?7 = ?7 RETURNING state, message_id, dl_description"
                    ),
                ))
                .bind(lock.id)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .bind(info.max_delivery_count)
                .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
                .bind(&info.display)
                .fetch_optional(self.conn.get()?)
                .await?;
                let Some(row) = row else {
                    return Ok(Err(lock_lost()));
                };
                self.state.touched.insert(lock.entity);
                // An abandon at the max delivery count dead-letters the message (S2.6):
                // counted and logged as the broker's own dead-lettering.
                let state: i64 = row.try_get(0)?;
                if !dead && state == 3 {
                    let id = lossy_text(&row, 1)?;
                    let why = lossy_text(&row, 2)?;
                    self.state
                        .dead_lettered(&info.display, reasons::MAX_DELIVERY_COUNT_EXCEEDED, 1, &id, &id, &why);
                }
                1
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties,
            } => {
                if dead {
                    return invalid("dead-lettered again");
                }
                // A dead letter says why (`message_dead_letter_has_reason`): an empty
                // reason or description is stored as one that says none was given.
                let r = sqlx::query(concat!(
                    "UPDATE courier_message SET state = 3, locked_until = NULL, \
                     dl_reason = coalesce(nullif(?5, ''), ?8), dl_description = coalesce(nullif(?6, ''), ?9), \
                     dl_source = ?7, ",
                    patch_props!("?4"),
                    lock_cond!("(2, 4)")
                ))
                .bind(lock.id)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .bind(reason)
                .bind(description)
                .bind(&info.display)
                .bind(NO_REASON_GIVEN)
                .bind(NO_DESCRIPTION_GIVEN)
                .execute(self.conn.get()?)
                .await?
                .rows_affected();
                // Receivers of the dead-letter sub-queue may be waiting.
                self.state.touched.insert(lock.entity);
                r
            }
            Settlement::Defer { properties } => {
                if dead {
                    return invalid("deferred");
                }
                sqlx::query(concat!(
                    "UPDATE courier_message SET state = 2, locked_until = NULL, ",
                    patch_props!("?4"),
                    lock_cond!("(2, 4)")
                ))
                .bind(lock.id)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .execute(self.conn.get()?)
                .await?
                .rows_affected()
            }
        };
        Ok(if rows == 1 { Ok(()) } else { Err(lock_lost()) })
    }

    pub(super) async fn renew(&mut self, lock: &LockRef, now: i64) -> Sql<Result<DateTime<Utc>>> {
        if let Some(key) = &lock.session {
            // In a session, a message's lock is the session's lock.
            return self.renew_session(lock.entity, key, now).await;
        }
        let info = match self.state.entity(lock.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let until = after_ms(now, info.lock_ms);
        let r = sqlx::query(concat!(
            "UPDATE courier_message SET locked_until = ?4",
            lock_cond!("(2, 3, 4)")
        ))
        .bind(lock.id)
        .bind(lock.delivery_count)
        .bind(now)
        .bind(until)
        .execute(self.conn.get()?)
        .await?;
        Ok(if r.rows_affected() == 1 {
            Ok(from_micros(until))
        } else {
            Err(lock_lost())
        })
    }
}
