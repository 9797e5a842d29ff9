//! Receiving, and the receivers that wait: receives of one entity, sub-queue, session and
//! mode share one statement; a receive that finds nothing waits inside the engine (a
//! `Waiter`) and is served as soon as a send, an abandon, an activation or a lock expiry
//! makes a message ready, or answered empty at its deadline.
//!
//! Holds: `Waiter`, `receive_all`, `take_messages`, `serve_waiters`, `expire_waiters` and
//! `receive_deferred` (receiving deferred messages by sequence number). Waiting for a
//! session (accept) is in `sessions.rs`; settling what was received in `settle.rs`.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::time::Instant;

use crate::checks::{Refusal, stored_refusal};
use crate::entity::SubQueue;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{ReceivedMessage, SequenceNumber};

use super::commands::EntityInfo;
use super::commands::{AcceptRequest, Outcome, ReceiveMode, ReceiveRequest, SessionKey, outcome};
use super::rows::{DeadMark, Fields, MAX_STORED_DELIVERY_COUNT, NewRow, ReadMessage, Sql, after_ms, micros, row_id};
use super::{DEAD, Engine, State};

/// The most messages one receive statement locks.
pub(super) const MAX_RECEIVE: usize = 5000;

pub(super) enum Waiter {
    Receive(ReceiveRequest),
    Accept(AcceptRequest),
}

impl Waiter {
    pub(super) fn deadline(&self) -> Option<Instant> {
        match self {
            Waiter::Receive(r) => r.deadline,
            Waiter::Accept(a) => a.deadline,
        }
    }
    pub(super) fn is_abandoned(&self) -> bool {
        match self {
            Waiter::Receive(r) => r.reply.is_closed(),
            Waiter::Accept(a) => a.reply.is_closed(),
        }
    }
    pub(super) fn time_out(self) {
        match self {
            Waiter::Receive(r) => {
                let _ = r.reply.send(Ok(Vec::new()));
            }
            Waiter::Accept(a) => {
                let _ = a.reply.send(Err(Error::new(ErrorKind::SessionNotAvailable {
                    reason: "no session became available within the wait".into(),
                })));
            }
        }
    }
    pub(super) fn fail(self, make: impl Fn() -> Error) {
        match self {
            Waiter::Receive(r) => {
                let _ = r.reply.send(Err(make()));
            }
            Waiter::Accept(a) => {
                let _ = a.reply.send(Err(make()));
            }
        }
    }
}

impl Engine {
    /// Serves receive requests: those for the same entity, sub-queue, session and mode
    /// share one statement; the messages go to the requests in arrival order. Requests
    /// left empty wait (until their deadline) or get an empty answer.
    pub(super) async fn receive_all(
        &mut self,
        requests: Vec<ReceiveRequest>,
        now: i64,
        outcomes: &mut Vec<Outcome>,
    ) -> Sql {
        type Key = (i64, SubQueue, Option<SessionKey>, ReceiveMode);
        let mut groups: Vec<(Key, Vec<ReceiveRequest>)> = Vec::new();
        for r in requests {
            let key = (r.entity, r.sub_queue, r.session.clone(), r.mode);
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, g)) => g.push(r),
                None => groups.push((key, vec![r])),
            }
        }
        for ((entity, sub_queue, session, mode), group) in groups {
            let wanted: usize = group.iter().map(|r| r.max.max(1)).sum();
            let taken = self
                .take_messages(entity, sub_queue, session.as_ref(), mode, wanted, now)
                .await?;
            let mut messages = match taken {
                Ok(m) => m.into_iter(),
                Err(e) => {
                    let kind = e.kind().clone();
                    for r in group {
                        outcomes.push(outcome(r.reply, Err(Error::new(kind.clone()))));
                    }
                    continue;
                }
            };
            for r in group {
                let mine: Vec<ReceivedMessage> = messages.by_ref().take(r.max.max(1)).collect();
                if mine.is_empty() && r.deadline.is_some() {
                    self.state
                        .waiters
                        .entry(entity)
                        .or_default()
                        .push_back(Waiter::Receive(r));
                } else {
                    outcomes.push(Outcome::Received {
                        locked: mode == ReceiveMode::PeekLock,
                        reply: r.reply,
                        messages: mine,
                    });
                }
            }
        }
        Ok(())
    }

    /// Locks (or takes) up to `max` messages of an entity.
    pub(super) async fn take_messages(
        &mut self,
        entity: i64,
        sub_queue: SubQueue,
        session: Option<&SessionKey>,
        mode: ReceiveMode,
        max: usize,
        now: i64,
    ) -> Sql<Result<Vec<ReceivedMessage>>> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let dead = sub_queue == SubQueue::DeadLetter;
        let mut lock_until = after_ms(now, info.lock_ms);
        match (session, info.requires_session && !dead) {
            (None, true) => {
                return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                    reason: format!("{} requires sessions: accept a session to receive", info.display),
                })));
            }
            (Some(key), _) => match self.session_lock(entity, key, now).await? {
                // In a session, a message's lock is the session's lock.
                Some(until) => lock_until = until,
                None => return Ok(Err(Error::new(ErrorKind::SessionLockLost))),
            },
            (None, false) => {}
        }
        let sql: &'static str = match (mode, dead, session.is_some()) {
            (ReceiveMode::PeekLock, true, _) => lock_sql!(dead_filter, "3"),
            (ReceiveMode::PeekLock, false, true) => lock_sql!(session_filter, "4"),
            (ReceiveMode::PeekLock, false, false) => lock_sql!(ready_filter, "4"),
            (ReceiveMode::ReceiveAndDelete, true, _) => take_sql!(dead_filter),
            (ReceiveMode::ReceiveAndDelete, false, true) => take_sql!(session_filter),
            (ReceiveMode::ReceiveAndDelete, false, false) => take_sql!(ready_filter),
        };
        let rows = sqlx::query(sql)
            .bind(lock_until)
            .bind(entity)
            .bind(now)
            .bind(info.max_delivery_count)
            .bind(i64::try_from(max.clamp(1, MAX_RECEIVE)).unwrap_or(1))
            .bind(session.map(|k| k.id.as_str()))
            .fetch_all(self.conn.get()?)
            .await?;
        let locked = mode == ReceiveMode::PeekLock;
        let read = match self.state.rows_to_messages(&rows, now, locked) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e)),
        };
        // A row that cannot be read as written (text that is not UTF-8, properties that
        // are not a JSON object), or that breaks a rule every Courier sender keeps (an id
        // over 128 bytes, a message over the size limit), is dead-lettered now: failing
        // the receive would fail every receive of the queue, and the messages behind it
        // would never be handled. The dead-letter sub-queue itself is always read as it is.
        let mut messages = Vec::with_capacity(read.len());
        let mut refused = Vec::new();
        for r in read {
            if dead {
                messages.push(r.message);
                continue;
            }
            let max = self.state.max_message_size;
            match stored_refusal(
                r.unreadable,
                &r.message.envelope,
                max,
                "EmbeddedBuilder::max_message_size",
            ) {
                Some(refusal) => refused.push((r.message, refusal)),
                None => messages.push(r.message),
            }
        }
        if !refused.is_empty() {
            self.dead_letter_refused(&info, refused, locked).await?;
        }
        if locked {
            if !rows.is_empty() {
                State::note(&mut self.state.next_unlock, Some(lock_until));
            }
        } else {
            for m in &mut messages {
                m.broker.delivery_count = m.broker.delivery_count.saturating_add(1);
            }
        }
        Ok(Ok(messages))
    }

    /// Dead-letters messages a receive refused (`courier.InvalidWireFormat` or
    /// `courier.MessageTooLarge`, the description naming each problem): a locked row in
    /// place, a taken (deleted) row by inserting it again, as read, with its sequence number.
    async fn dead_letter_refused(
        &mut self,
        info: &EntityInfo,
        refused: Vec<(ReceivedMessage, Refusal)>,
        locked: bool,
    ) -> Sql {
        let mut taken = Vec::new();
        for (
            message,
            Refusal {
                reason,
                description: why,
            },
        ) in refused
        {
            let seq = message.broker.sequence_number;
            if locked {
                // Counted and logged after the commit (`report.rs`); a taken one by
                // `insert_rows`.
                let id = message.envelope.message_id.as_str();
                self.state.dead_lettered(&info.display, reason, 1, id, id, &why);
                sqlx::query(
                    "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?2, dl_description = ?3, \
                     dl_source = ?4 WHERE id = ?1",
                )
                .bind(row_id(info.id, seq))
                .bind(reason)
                .bind(&why)
                .bind(&info.display)
                .execute(self.conn.get()?)
                .await?;
            } else {
                taken.push(NewRow {
                    id: row_id(info.id, seq),
                    entity: info.id,
                    seq,
                    state: DEAD,
                    enqueued_at: micros(message.broker.enqueued_time),
                    scheduled_at: None,
                    expires_at: None,
                    ttl_ms: message
                        .envelope
                        .time_to_live
                        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
                    dead: Some(DeadMark {
                        reason: reason.into(),
                        description: Some(why),
                        source: info.display.clone(),
                    }),
                    fields: Arc::new(Fields::from_message(message)),
                });
            }
        }
        self.insert_rows(&taken).await?;
        // Receivers of the dead-letter sub-queue may be waiting.
        self.state.touched.insert(info.id);
        Ok(())
    }

    pub(super) async fn serve_waiters(&mut self, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
        let touched: Vec<i64> = std::mem::take(&mut self.state.touched).into_iter().collect();
        for entity in touched {
            let Some(queue) = self.state.waiters.remove(&entity) else {
                continue;
            };
            let mut receives = Vec::new();
            for w in queue {
                if w.is_abandoned() {
                    continue;
                }
                match w {
                    Waiter::Receive(r) => receives.push(r),
                    Waiter::Accept(a) => match self.try_accept(&a, now).await? {
                        Some(r) => outcomes.push(outcome(a.reply, r)),
                        None => self
                            .state
                            .waiters
                            .entry(entity)
                            .or_default()
                            .push_back(Waiter::Accept(a)),
                    },
                }
            }
            // Requests still empty are parked again by receive_all.
            self.receive_all(receives, now, outcomes).await?;
        }
        Ok(())
    }

    pub(super) async fn receive_deferred(
        &mut self,
        entity: i64,
        seqs: &[SequenceNumber],
        session: Option<&SessionKey>,
        now: i64,
    ) -> Sql<Result<Vec<ReceivedMessage>>> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let mut lock_until = after_ms(now, info.lock_ms);
        if let Some(key) = session {
            match self.session_lock(entity, key, now).await? {
                Some(until) => lock_until = until,
                None => return Ok(Err(Error::new(ErrorKind::SessionLockLost))),
            }
        }
        // Check all first: either every message is locked or none. A lock adds one to the
        // delivery count, which a row holds up to MAX_STORED_DELIVERY_COUNT (the broker
        // dead-letters a deferred row at it when it opens).
        for seq in seqs {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM courier_message WHERE id = ?1 AND state = 2 \
                 AND (locked_until IS NULL OR locked_until <= ?2) AND (?3 IS NULL OR session_id = ?3) \
                 AND delivery_count < ?4",
            )
            .bind(row_id(entity, *seq))
            .bind(now)
            .bind(session.map(|k| k.id.as_str()))
            .bind(MAX_STORED_DELIVERY_COUNT)
            .fetch_optional(self.conn.get()?)
            .await?;
            if found.is_none() {
                return Ok(Err(Error::new(ErrorKind::MessageNotFound {
                    sequence_number: *seq,
                    expected: "deferred (and unlocked)",
                })));
            }
        }
        State::note(&mut self.state.next_unlock, Some(lock_until));
        let mut rows = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let row = sqlx::query(concat!(
                "UPDATE courier_message SET locked_until = ?1, delivery_count = delivery_count + 1 \
                 WHERE id = ?2 RETURNING ",
                columns!()
            ))
            .bind(lock_until)
            .bind(row_id(entity, *seq))
            .fetch_one(self.conn.get()?)
            .await?;
            rows.push(row);
        }
        Ok(self.state.rows_to_messages(&rows, now, true).map(ReadMessage::lossy))
    }

    pub(super) fn expire_waiters(&mut self) {
        let now = Instant::now();
        for queue in self.state.waiters.values_mut() {
            let mut keep = VecDeque::with_capacity(queue.len());
            for w in queue.drain(..) {
                if w.is_abandoned() {
                    continue;
                }
                if w.deadline().is_some_and(|d| d <= now) {
                    w.time_out();
                } else {
                    keep.push_back(w);
                }
            }
            *queue = keep;
        }
        self.state.waiters.retain(|_, q| !q.is_empty());
    }
}
