//! Sessions: accepting (locking) a session, waiting for one to become available, renewing
//! and releasing a session lock, and a session's state.
//!
//! Holds: `accept`, `try_accept` (and `next_session`, the session `SessionSelector::Next`
//! gets), `session_lock`, `renew_session` and `session_op`.
//! Receiving the messages of a locked session is in `receive.rs`.

use bytes::Bytes;
use chrono::{DateTime, Utc};

use crate::checks::{MAX_MESSAGE_ID_LEN, quoted};
use crate::error::{Error, ErrorKind, Result};
use crate::message::reasons::INVALID_WIRE_FORMAT;
use crate::transport::SessionSelector;
use sqlx::Row;

use super::commands::{AcceptRequest, EntityInfo, Outcome, SessionKey, SessionOp, outcome};
use super::receive::Waiter;
use super::rows::{Sql, after_ms, from_micros, row_id};
use super::{Engine, State};

/// The most sessions no receiver can name that one accept dead-letters before it answers
/// that no session is available (the next accept goes on).
const MAX_UNNAMEABLE_SKIPPED: usize = 16;

impl Engine {
    /// A session lock's locked-until time, if it is still held.
    pub(super) async fn session_lock(&mut self, entity: i64, key: &SessionKey, now: i64) -> Sql<Option<i64>> {
        sqlx::query_scalar::<_, i64>(
            "SELECT locked_until FROM courier_session WHERE entity_id = ?1 AND session_id = ?2 AND lock_gen = ?3 \
             AND locked_until > ?4",
        )
        .bind(entity)
        .bind(&key.id)
        .bind(key.generation)
        .bind(now)
        .fetch_optional(self.conn.get()?)
        .await
    }

    pub(super) async fn renew_session(
        &mut self,
        entity: i64,
        key: &SessionKey,
        now: i64,
    ) -> Sql<Result<DateTime<Utc>>> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let until = after_ms(now, info.lock_ms);
        let r = sqlx::query(
            "UPDATE courier_session SET locked_until = ?5 WHERE entity_id = ?1 AND session_id = ?2 AND lock_gen = ?3 \
             AND locked_until > ?4",
        )
        .bind(entity)
        .bind(&key.id)
        .bind(key.generation)
        .bind(now)
        .bind(until)
        .execute(self.conn.get()?)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(Err(Error::new(ErrorKind::SessionLockLost)));
        }
        sqlx::query(
            "UPDATE courier_message SET locked_until = ?4 WHERE id >= ?1 AND id < ?5 AND session_id = ?2 \
             AND locked_until > ?3",
        )
        .bind(row_id(entity, 0))
        .bind(&key.id)
        .bind(now)
        .bind(until)
        .bind(row_id(entity + 1, 0))
        .execute(self.conn.get()?)
        .await?;
        State::note(&mut self.state.next_session_unlock, Some(until));
        State::note(&mut self.state.next_unlock, Some(until));
        Ok(Ok(from_micros(until)))
    }

    pub(super) async fn accept(&mut self, req: AcceptRequest, now: i64) -> Sql<Option<Outcome>> {
        match self.try_accept(&req, now).await? {
            Some(r) => Ok(Some(outcome(req.reply, r))),
            None if req.deadline.is_some() => {
                self.state
                    .waiters
                    .entry(req.entity)
                    .or_default()
                    .push_back(Waiter::Accept(req));
                Ok(None)
            }
            None => {
                let reason = match &req.selector {
                    SessionSelector::Next => "no unlocked session has messages".to_owned(),
                    SessionSelector::Named(s) => format!("session {s:?} is held by another receiver"),
                };
                Ok(Some(outcome(
                    req.reply,
                    Err(Error::new(ErrorKind::SessionNotAvailable { reason })),
                )))
            }
        }
    }

    /// Locks a session if one is available; `None` if none is (yet).
    pub(super) async fn try_accept(
        &mut self,
        req: &AcceptRequest,
        now: i64,
    ) -> Sql<Option<Result<(String, i64, DateTime<Utc>)>>> {
        let info = match self.state.entity(req.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Some(Err(e))),
        };
        if !info.requires_session {
            return Ok(Some(Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{} does not require sessions: use a plain receiver", info.display),
            }))));
        }
        let session = match &req.selector {
            SessionSelector::Named(s) => {
                let held: Option<i64> = sqlx::query_scalar(
                    "SELECT locked_until FROM courier_session WHERE entity_id = ?1 AND session_id = ?2 \
                     AND locked_until > ?3",
                )
                .bind(req.entity)
                .bind(s)
                .bind(now)
                .fetch_optional(self.conn.get()?)
                .await?;
                if held.is_some() {
                    return Ok(None);
                }
                s.clone()
            }
            SessionSelector::Next => match self.next_session(&info, now).await? {
                Some(s) => s,
                None => return Ok(None),
            },
        };
        let until = after_ms(now, info.lock_ms);
        let generation: i64 = sqlx::query_scalar(
            "INSERT INTO courier_session (entity_id, session_id, locked_until, lock_gen) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (entity_id, session_id) DO UPDATE SET locked_until = excluded.locked_until, \
             lock_gen = lock_gen + 1 RETURNING lock_gen",
        )
        .bind(req.entity)
        .bind(&session)
        .bind(until)
        .fetch_one(self.conn.get()?)
        .await?;
        State::note(&mut self.state.next_session_unlock, Some(until));
        Ok(Some(Ok((session, generation, from_micros(until)))))
    }

    /// The session of the first message a receive in it would take (ready, under the max
    /// delivery count, not expired) whose session is not locked. A session id no receiver
    /// can name (not UTF-8, empty, over 128 bytes: another program's row) is never offered:
    /// its messages are dead-lettered on the way (`courier.InvalidWireFormat`, the
    /// session id named), and the next session is looked for.
    async fn next_session(&mut self, info: &EntityInfo, now: i64) -> Sql<Option<String>> {
        for _ in 0..MAX_UNNAMEABLE_SKIPPED {
            let found: Option<Vec<u8>> = sqlx::query_scalar(
                "SELECT CAST(m.session_id AS BLOB) FROM courier_message m WHERE m.entity_id = ?1 AND m.state = 0 \
                 AND m.session_id IS NOT NULL AND m.delivery_count < ?3 \
                 AND (m.expires_at IS NULL OR m.expires_at > ?2) AND NOT EXISTS (SELECT 1 FROM courier_session s \
                 WHERE s.entity_id = ?1 AND s.session_id = m.session_id AND s.locked_until > ?2) \
                 ORDER BY m.seq LIMIT 1",
            )
            .bind(info.id)
            .bind(now)
            .bind(info.max_delivery_count)
            .fetch_optional(self.conn.get()?)
            .await?;
            let Some(bytes) = found else {
                return Ok(None);
            };
            let problem = match std::str::from_utf8(&bytes) {
                Ok(s) if !s.is_empty() && s.len() <= MAX_MESSAGE_ID_LEN => return Ok(Some(s.to_owned())),
                Ok(_) => format!(
                    "session_id has {} bytes; Courier's session ids have 1 to {MAX_MESSAGE_ID_LEN}: \"{}\"",
                    bytes.len(),
                    quoted(&bytes)
                ),
                Err(_) => format!("session_id is not UTF-8: \"{}\"", quoted(&bytes)),
            };
            let why = format!("no receiver can accept the message's session: {problem}");
            let moved = sqlx::query(
                "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?4, dl_description = ?5, \
                 dl_source = ?6 WHERE id >= ?1 AND id < ?2 AND state IN (0, 2) AND session_id IS NOT NULL \
                 AND CAST(session_id AS BLOB) = ?3 RETURNING CAST(message_id AS BLOB)",
            )
            .bind(row_id(info.id, 0))
            .bind(row_id(info.id + 1, 0))
            .bind(&bytes)
            .bind(INVALID_WIRE_FORMAT)
            .bind(&why)
            .bind(&info.display)
            .fetch_all(self.conn.get()?)
            .await?;
            // Counted and logged after the commit (`report.rs`).
            let ids: Vec<String> = moved
                .iter()
                .map(|r| {
                    let b: Option<Vec<u8>> = r.try_get_unchecked(0).unwrap_or_default();
                    b.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
                })
                .collect();
            let n = u64::try_from(ids.len()).unwrap_or(u64::MAX);
            let (first, last) = (
                ids.first().map_or("", String::as_str),
                ids.last().map_or("", String::as_str),
            );
            self.state
                .dead_lettered(&info.display, INVALID_WIRE_FORMAT, n, first, last, &why);
            self.state.touched.insert(info.id);
        }
        Ok(None)
    }

    pub(super) async fn session_op(
        &mut self,
        entity: i64,
        key: &SessionKey,
        op: SessionOp,
        now: i64,
    ) -> Sql<Option<Outcome>> {
        fn lost<T>() -> Result<T> {
            Err(Error::new(ErrorKind::SessionLockLost))
        }
        Ok(match op {
            SessionOp::Renew(reply) => {
                let r = self.renew_session(entity, key, now).await?;
                Some(outcome(reply, r))
            }
            SessionOp::GetState(reply) => {
                if self.session_lock(entity, key, now).await?.is_none() {
                    return Ok(Some(outcome(reply, lost())));
                }
                let state: Option<Vec<u8>> =
                    sqlx::query_scalar("SELECT state FROM courier_session WHERE entity_id = ?1 AND session_id = ?2")
                        .bind(entity)
                        .bind(&key.id)
                        .fetch_optional(self.conn.get()?)
                        .await?
                        .flatten();
                Some(outcome(reply, Ok(state.map(Bytes::from))))
            }
            SessionOp::SetState(state, reply) => {
                if self.session_lock(entity, key, now).await?.is_none() {
                    return Ok(Some(outcome(reply, lost())));
                }
                sqlx::query("UPDATE courier_session SET state = ?3 WHERE entity_id = ?1 AND session_id = ?2")
                    .bind(entity)
                    .bind(&key.id)
                    .bind(state.as_deref())
                    .execute(self.conn.get()?)
                    .await?;
                Some(outcome(reply, Ok(())))
            }
            SessionOp::Release(reply) => {
                if self.session_lock(entity, key, now).await?.is_some() {
                    sqlx::query(
                        "UPDATE courier_session SET locked_until = NULL WHERE entity_id = ?1 AND session_id = ?2 \
                         AND lock_gen = ?3",
                    )
                    .bind(entity)
                    .bind(&key.id)
                    .bind(key.generation)
                    .execute(self.conn.get()?)
                    .await?;
                    // Messages still locked under the session go back, as if abandoned.
                    sqlx::query(
                        "UPDATE courier_message SET locked_until = NULL, state = CASE WHEN state = 4 THEN 0 ELSE state END \
                         WHERE id >= ?1 AND id < ?4 AND session_id = ?2 AND locked_until > ?3",
                    )
                    .bind(row_id(entity, 0))
                    .bind(&key.id)
                    .bind(now)
                    .bind(row_id(entity + 1, 0))
                    .execute(self.conn.get()?)
                    .await?;
                    self.state.touched.insert(entity);
                }
                reply.map(|r| outcome(r, Ok(())))
            }
        })
    }
}
