//! Receiving: PeekLock and ReceiveAndDelete with `FOR UPDATE SKIP LOCKED` (competing
//! receivers in any number of processes take disjoint messages), receive-deferred, and
//! the time-driven work a receive does first for its entity: activating due scheduled
//! messages and dead-lettering expired ones and those whose lock expired at the max
//! delivery count (skipped for up to 250 ms by a receiver whose claims are filled, see
//! `Upkeep`). A receive that finds nothing waits for a notification of its entity
//! (`LISTEN/NOTIFY`, a hint only) or the fallback poll, whichever comes first. A
//! PeekLock claim commits asynchronously (see `lock_sql!`); ReceiveAndDelete's does not
//! (its claim is the deletion).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::sync::oneshot;

use super::Shared;
use super::entities::EntityInfo;
use super::rows::{ReadMessage, columns, read_row, read_rows, rows_to_messages};
use super::upkeep::dead_lettered;
use crate::checks::{Refusal, stored_refusal};
use crate::entity::{EntityPath, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::{LockToken, ReceivedMessage, SequenceNumber, reasons};
use crate::store::db_error;
use crate::transport::{Delivery, Receiver, Settlement, Settler};

/// The most messages one receive takes.
const MAX_RECEIVE: usize = 5000;
/// How long, by the transport's clock, a receiver whose last claim was filled goes on
/// claiming without running the maintenance first (see [`Upkeep`]).
const UPKEEP_EVERY_MS: i64 = 250;

/// A session held by a session receiver: its id and the generation of its lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SessionKey {
    pub(crate) id: String,
    pub(crate) generation: i64,
}

/// What a receiver and its deliveries share.
pub(crate) struct Link {
    pub(crate) shared: Arc<Shared>,
    pub(crate) entity: EntityInfo,
    pub(crate) path: EntityPath,
    pub(crate) session: Option<SessionKey>,
    upkeep: std::sync::Mutex<Upkeep>,
}

/// When a receiver last ran the maintenance before its claim, and whether its last
/// claim took all it asked for.
///
/// A receiver of a busy entity (its claims filled) skips the maintenance for up to
/// `UPKEEP_EVERY_MS` of the transport's clock: run before every claim it was half of the
/// receive side's transactions and a tenth of the statements' execution time per message
/// (`pg_stat_statements`, docs/measurements.md). The claim's filter never takes an expired
/// message, one at the max delivery count or one still locked, so skipping it delays only
/// its bookkeeping: a due scheduled message is activated (and so numbered, at the end of
/// the entity's order) up to that much later, a lock whose holder is gone is ended up to
/// that much later, and expired or exhausted messages reach the dead-letter sub-queue up
/// to that much later. A claim that comes back short after a skip runs the maintenance
/// and claims again at once, so a receive never returns less than it would have found
/// with the maintenance first, and an entity that is not busy runs it before every claim,
/// as before.
#[derive(Debug, Default)]
struct Upkeep {
    last: Option<DateTime<Utc>>,
    filled: bool,
}

impl Upkeep {
    /// Whether a claim at `now` may go without the maintenance first.
    fn may_skip(&self, now: DateTime<Utc>) -> bool {
        self.filled
            && self.last.is_some_and(|last| {
                // A clock set back runs it too.
                last <= now && now - last < chrono::Duration::milliseconds(UPKEEP_EVERY_MS)
            })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    PeekLock,
    ReceiveAndDelete,
}

/// The filter of the messages a receive may take: `$1` entity, `$2` now, `$3` max
/// delivery count, `$5` session. Every statement is bound with the same seven parameters;
/// sqlx declares their types, so a statement need not use them all.
macro_rules! active_filter {
    () => {
        "entity_id = $1 AND state = 0 AND (locked_until IS NULL OR locked_until <= $2) AND delivery_count < $3 \
         AND (expires_at IS NULL OR expires_at > $2)"
    };
}
macro_rules! session_filter {
    () => {
        concat!(active_filter!(), " AND session_id = $5")
    };
}
macro_rules! dead_filter {
    () => {
        "entity_id = $1 AND state = 3 AND (locked_until IS NULL OR locked_until <= $2)"
    };
}
/// Locks up to `$6` messages until `$4` for holder `$7`, only while the holder's advisory
/// lock is held: a lock stamped with a holder that is gone (its connection ended, the
/// keeper not yet back) would be ended by the next receive at once, and a busy receiver
/// would take the same message again and again until its delivery count ran out.
///
/// The claim commits without waiting for its WAL flush (`synchronous_commit = off` for
/// its own transaction, set by `set_config(.., true)` in the statement): an asynchronous
/// commit is visible at once, so a consumer that crashes after the claim leaves the raised
/// delivery count behind (a crash loop reaches the dead-letter sub-queue). Only a crash of
/// the Postgres server within about three `wal_writer_delay`s (600 ms by default) can lose
/// the claim: the message is then as before it, receivable, its count one lower, and no
/// settlement of the lost lock can match. The handler's transaction commits synchronously,
/// and its flush covers every WAL record before it, the claim's included. See
/// docs/postgres-reference.md ("Receive claims commit asynchronously").
macro_rules! lock_sql {
    ($filter:ident) => {
        concat!(
            "UPDATE courier.message m SET locked_until = $4, delivery_count = m.delivery_count + 1, holder = $7 \
             FROM (SELECT id FROM courier.message WHERE ",
            $filter!(),
            " AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted \
               AND l.objsubid = 1 AND l.classid::bigint = $7 >> 32 AND l.objid::bigint = $7 & 2147483647) \
             ORDER BY seq LIMIT $6 FOR UPDATE SKIP LOCKED) c WHERE m.id = c.id \
             AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL RETURNING ",
            columns!()
        )
    };
}
/// Takes (deletes) up to `$6` messages.
macro_rules! take_sql {
    ($filter:ident) => {
        concat!(
            "DELETE FROM courier.message m WHERE m.id IN (SELECT id FROM courier.message WHERE ",
            $filter!(),
            " ORDER BY seq LIMIT $6 FOR UPDATE SKIP LOCKED) RETURNING ",
            columns!()
        )
    };
}

impl Link {
    pub(crate) fn new(shared: Arc<Shared>, entity: EntityInfo, path: EntityPath, session: Option<SessionKey>) -> Self {
        Self {
            shared,
            entity,
            path,
            session,
            upkeep: std::sync::Mutex::new(Upkeep::default()),
        }
    }

    fn upkeep(&self) -> std::sync::MutexGuard<'_, Upkeep> {
        self.upkeep.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs the maintenance for this link's entity at `now`.
    async fn maintain(&self, now: DateTime<Utc>) -> Result<()> {
        super::upkeep::run(&self.shared, &self.entity, now).await?;
        self.upkeep().last = Some(now);
        Ok(())
    }

    /// The session lock's end, if this link's session is still held.
    pub(crate) async fn session_lock(&self, key: &SessionKey, now: DateTime<Utc>) -> Result<Option<DateTime<Utc>>> {
        sqlx::query_scalar(
            "SELECT locked_until FROM courier.session WHERE entity_id = $1 AND session_id = $2 AND lock_gen = $3 \
             AND locked_until > $4",
        )
        .bind(self.entity.id)
        .bind(&key.id)
        .bind(key.generation)
        .bind(now)
        .fetch_optional(&self.shared.pool)
        .await
        .map_err(|e| self.shared.closed_or(db_error("cannot read the session lock", e)))
    }

    /// One attempt: maintenance (which a busy receiver may skip, see [`Upkeep`]), then
    /// lock (or take) up to `max` messages.
    async fn take(&self, max: usize, mode: Mode) -> Result<Vec<ReceivedMessage>> {
        self.shared.check_open()?;
        let now = self.shared.clock.now();
        let dead = self.path.sub_queue() == SubQueue::DeadLetter;
        // In a session, a message's lock is the session's lock.
        let mut session_until = None;
        match (&self.session, self.entity.requires_session && !dead) {
            (None, true) => {
                return Err(Error::new(ErrorKind::InvalidOperation {
                    reason: format!("{} requires sessions: accept a session to receive", self.entity.path),
                }));
            }
            (Some(key), _) => match self.session_lock(key, now).await? {
                Some(until) => session_until = Some(until),
                None => return Err(Error::new(ErrorKind::SessionLockLost)),
            },
            (None, false) => {}
        }
        let sql: &'static str = match (mode, dead, self.session.is_some()) {
            (Mode::PeekLock, true, _) => lock_sql!(dead_filter),
            (Mode::PeekLock, false, true) => lock_sql!(session_filter),
            (Mode::PeekLock, false, false) => lock_sql!(active_filter),
            (Mode::ReceiveAndDelete, true, _) => take_sql!(dead_filter),
            (Mode::ReceiveAndDelete, false, true) => take_sql!(session_filter),
            (Mode::ReceiveAndDelete, false, false) => take_sql!(active_filter),
        };
        let wanted = max.clamp(1, MAX_RECEIVE);
        let skipped = !dead && self.upkeep().may_skip(now);
        if !skipped {
            self.maintain(now).await?;
        }
        let mut read = self.claim(sql, wanted, mode, session_until).await?;
        if skipped && read.len() < wanted {
            // Short: what the maintenance would make receivable is taken now.
            self.maintain(self.shared.clock.now()).await?;
            read.extend(self.claim(sql, wanted - read.len(), mode, session_until).await?);
            read.sort_by_key(|r| r.message.broker.sequence_number);
        }
        self.upkeep().filled = read.len() >= wanted;
        let locked = mode == Mode::PeekLock;
        // A row another program wrote with properties Courier cannot read, or that breaks
        // a rule every Courier sender keeps (an id over 128 bytes, a message over the size
        // limit), is dead-lettered now: failing the receive would fail every receive of
        // the queue. The dead-letter sub-queue itself is always read as it is.
        let mut messages = Vec::with_capacity(read.len());
        for mut r in read {
            if dead {
                messages.push(r.message);
                continue;
            }
            let refusal = stored_refusal(
                r.unreadable.take(),
                &r.message.envelope,
                self.shared.max_message_size,
                "PgTransportBuilder::max_message_size",
            );
            match refusal {
                Some(refusal) => self.dead_letter_refused(r, refusal, locked).await?,
                None => messages.push(r.message),
            }
        }
        if !locked {
            for m in &mut messages {
                m.broker.delivery_count = m.broker.delivery_count.saturating_add(1);
            }
        }
        Ok(messages)
    }

    /// One claim of up to `max` messages with `sql`, locked until the session's lock ends
    /// (`session_until`) or for the entity's lock duration.
    async fn claim(
        &self,
        sql: &'static str,
        max: usize,
        mode: Mode,
        session_until: Option<DateTime<Utc>>,
    ) -> Result<Vec<ReadMessage>> {
        // The clock read here, after the maintenance's round trip: the lock is counted from
        // as late a reading as can be (a reading from before a wait would shorten it; a
        // test clock moved meanwhile would hand out a lock already expired).
        let now = self.shared.clock.now();
        let lock_until = session_until.unwrap_or_else(|| self.entity.lock_until(now));
        let rows: Vec<PgRow> = sqlx::query(sql)
            .bind(self.entity.id)
            .bind(now)
            .bind(self.entity.max_delivery_count)
            .bind((mode == Mode::PeekLock).then_some(lock_until))
            .bind(self.session.as_ref().map(|k| k.id.as_str()))
            .bind(i64::try_from(max).unwrap_or(1))
            .bind(self.shared.holder)
            .fetch_all(&self.shared.pool)
            .await
            .map_err(|e| self.shared.closed_or(db_error("cannot receive messages", e)))?;
        if mode == Mode::ReceiveAndDelete {
            return read_rows(&rows, now, None);
        }
        // Each row on its own: one that cannot be read is dead-lettered, not the claim
        // failed (which would fail every receive of the queue).
        let mut read = Vec::with_capacity(rows.len());
        for row in &rows {
            match read_row(row, now, Some(self.shared.tag)) {
                Ok(r) => read.push(r),
                Err(e) => self.dead_letter_unreadable(row, &e).await?,
            }
        }
        read.sort_by_key(|r| r.message.broker.sequence_number);
        Ok(read)
    }

    /// Dead-letters a claimed row that could not be read (`courier.InvalidWireFormat`,
    /// the error as its description).
    async fn dead_letter_unreadable(&self, row: &PgRow, error: &Error) -> Result<()> {
        let id: i64 = row
            .try_get(0)
            .map_err(|e| db_error("cannot read the id of a claimed message", e))?;
        let why = format!("the stored message could not be read: {error}");
        let row_text = format!("row {id}");
        if dead_lettered(
            &self.shared,
            &self.entity,
            reasons::INVALID_WIRE_FORMAT,
            1,
            &row_text,
            &row_text,
        ) {
            tracing::warn!(
                queue = %Escaped(&self.entity.path),
                row = id,
                description = %Escaped(&why),
                "a stored message could not be read: it was dead-lettered"
            );
        }
        self.dead_letter_in_place(id, reasons::INVALID_WIRE_FORMAT, &why)
            .await
            .map(|_| ())
            .map_err(|e| {
                self.shared
                    .closed_or(db_error("cannot dead-letter an unreadable message", e))
            })
    }

    /// Dead-letters the locked row `id` where it is, with `reason` and `why`.
    async fn dead_letter_in_place(
        &self,
        id: i64,
        reason: &str,
        why: &str,
    ) -> std::result::Result<sqlx::postgres::PgQueryResult, sqlx::Error> {
        sqlx::query(
            "UPDATE courier.message SET state = 3, locked_until = NULL, dl_reason = $2, dl_description = $3, \
             dl_source = $4 WHERE id = $1 RETURNING pg_notify('courier_transport', entity_id::text)",
        )
        .bind(id)
        .bind(reason)
        .bind(why)
        .bind(&self.entity.path)
        .execute(&self.shared.pool)
        .await
    }

    /// Dead-letters a message a receive refused (`courier.InvalidWireFormat` or
    /// `courier.MessageTooLarge`): a locked row in place, a taken (deleted) row by
    /// inserting it again, its properties as they were stored.
    async fn dead_letter_refused(&self, read: ReadMessage, refusal: Refusal, locked: bool) -> Result<()> {
        let m = &read.message;
        let Refusal {
            reason,
            description: why,
        } = refusal;
        let id = &m.envelope.message_id;
        if dead_lettered(&self.shared, &self.entity, reason, 1, id, id) {
            tracing::warn!(
                queue = %Escaped(&self.entity.path),
                sequence_number = m.broker.sequence_number,
                message_id = %Escaped(id),
                reason,
                description = %Escaped(&why),
                "a stored message was refused: it was dead-lettered"
            );
        }
        let done = if locked {
            self.dead_letter_in_place(read.id, reason, &why).await
        } else {
            let e = &m.envelope;
            sqlx::query(
                "INSERT INTO courier.message (entity_id, seq, state, delivery_count, session_id, enqueued_at, ttl_ms, \
                 message_id, correlation_id, causation_id, message_type, content_type, reply_to, properties, \
                 dl_reason, dl_description, dl_source, body) VALUES ($1, $2, 3, $3, $4, $5, $6, $7, $8, $9, $10, \
                 $11, $12, $13::jsonb, $14, $15, $16, $17) RETURNING pg_notify('courier_transport', entity_id::text)",
            )
            .bind(self.entity.id)
            .bind(m.broker.sequence_number)
            .bind(i32::try_from(m.broker.delivery_count).unwrap_or(i32::MAX))
            .bind(e.session_id.as_deref())
            .bind(m.broker.enqueued_time)
            .bind(e.time_to_live.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)))
            .bind(&e.message_id)
            .bind(e.correlation_id.as_deref())
            .bind(e.causation_id.as_deref())
            .bind(e.message_type.as_deref())
            .bind(e.content_type.as_deref())
            .bind(e.reply_to.as_deref())
            .bind(read.raw_properties.as_deref())
            .bind(reason)
            .bind(&why)
            .bind(&self.entity.path)
            .bind(&e.body[..])
            .execute(&self.shared.pool)
            .await
        };
        done.map(|_| ()).map_err(|e| {
            self.shared
                .closed_or(db_error("cannot dead-letter a refused message", e))
        })
    }

    /// Receives, waiting up to `max_wait` for the first message.
    async fn receive(self: &Arc<Self>, max: usize, max_wait: Duration, mode: Mode) -> Result<Vec<ReceivedMessage>> {
        let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
        let waker = self.shared.wakers.entity(self.entity.id);
        loop {
            // Registered before the attempt, so a notification that lands during it counts.
            let notified = waker.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let got = match mode {
                Mode::PeekLock => self.clone().take_guarded(max).await?,
                Mode::ReceiveAndDelete => self.take(max, mode).await?,
            };
            let now = tokio::time::Instant::now();
            if !got.is_empty() || now >= deadline {
                return Ok(got);
            }
            let poll = (now + self.shared.poll_interval).min(deadline);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(poll) => {}
            }
        }
    }

    /// A PeekLock attempt in a task of its own: if the caller's future is dropped before
    /// the answer is read, the task gives the locks back at once (delivery counts
    /// restored) instead of leaving them to expire.
    async fn take_guarded(self: Arc<Self>, max: usize) -> Result<Vec<ReceivedMessage>> {
        let (reply, answer) = oneshot::channel();
        let link = self.clone();
        tokio::spawn(async move {
            let got = link.take(max, Mode::PeekLock).await;
            if let Err(Ok(messages)) = reply.send(got) {
                link.release(&messages).await;
            }
        });
        answer.await.map_err(|_| Error::new(ErrorKind::Closed))?
    }

    /// Gives back locks no caller will settle, restoring the delivery counts.
    async fn release(&self, messages: &[ReceivedMessage]) {
        let (mut ids, mut counts) = (Vec::new(), Vec::new());
        for m in messages {
            if let Some(lock) = m
                .broker
                .lock_token
                .and_then(|t| super::rows::read_token(self.shared.tag, t))
            {
                ids.push(lock.id);
                counts.push(i32::try_from(m.broker.delivery_count).unwrap_or(i32::MAX));
            }
        }
        if ids.is_empty() {
            return;
        }
        let r = sqlx::query(
            "UPDATE courier.message m SET locked_until = NULL, delivery_count = m.delivery_count - 1 \
             FROM unnest($1::int8[], $2::int4[]) AS r(id, dc) \
             WHERE m.id = r.id AND m.delivery_count = r.dc AND m.locked_until IS NOT NULL \
             RETURNING pg_notify('courier_transport', m.entity_id::text)",
        )
        .bind(&ids)
        .bind(&counts)
        .execute(&self.shared.pool)
        .await;
        if let Err(e) = r {
            let e = db_error("cannot give back the locks of a cancelled receive", e);
            tracing::warn!(error = %e, "the locks of a cancelled receive will expire instead");
        }
    }

    /// Locks deferred messages by sequence number: all of them or none.
    async fn receive_deferred(&self, seqs: &[SequenceNumber]) -> Result<Vec<ReceivedMessage>> {
        self.shared.check_open()?;
        if self.path.sub_queue() == SubQueue::DeadLetter {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: "dead-letter sub-queues hold no deferred messages".into(),
            }));
        }
        let now = self.shared.clock.now();
        let mut lock_until = self.entity.lock_until(now);
        if let Some(key) = &self.session {
            match self.session_lock(key, now).await? {
                Some(until) => lock_until = until,
                None => return Err(Error::new(ErrorKind::SessionLockLost)),
            }
        }
        let mut wanted = seqs.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        let mut tx = self
            .shared
            .pool
            .begin()
            .await
            .map_err(|e| self.shared.closed_or(db_error("cannot begin a receive", e)))?;
        let rows: Vec<PgRow> = sqlx::query(concat!(
            "UPDATE courier.message m SET locked_until = $4, delivery_count = LEAST(m.delivery_count, 2147483646) + 1, \
             holder = $6 \
             WHERE m.entity_id = $1 AND m.seq = ANY($2) AND m.state = 2 \
             AND (m.locked_until IS NULL OR m.locked_until <= $3) AND ($5::text IS NULL OR m.session_id = $5) \
             RETURNING ",
            columns!()
        ))
        .bind(self.entity.id)
        .bind(&wanted)
        .bind(now)
        .bind(lock_until)
        .bind(self.session.as_ref().map(|k| k.id.as_str()))
        .bind(self.shared.holder)
        .fetch_all(&mut *tx)
        .await
        .map_err(|e| db_error("cannot receive deferred messages", e))?;
        let messages = rows_to_messages(&rows, now, Some(self.shared.tag))?;
        if let Some(missing) = wanted
            .iter()
            .find(|s| !messages.iter().any(|m| m.broker.sequence_number == **s))
        {
            // Dropping the transaction rolls the locks back.
            return Err(Error::new(ErrorKind::MessageNotFound {
                sequence_number: *missing,
                expected: "deferred (and unlocked)",
            }));
        }
        tx.commit()
            .await
            .map_err(|e| db_error("cannot commit a receive of deferred messages", e))?;
        Ok(messages)
    }

    pub(crate) fn deliveries(self: &Arc<Self>, messages: Vec<ReceivedMessage>) -> Vec<Delivery> {
        let settler: Arc<dyn Settler> = self.clone();
        messages
            .into_iter()
            .map(|m| Delivery::new(m, settler.clone()))
            .collect()
    }

    pub(crate) async fn receive_locked(self: &Arc<Self>, max: usize, max_wait: Duration) -> Result<Vec<Delivery>> {
        let messages = self.receive(max, max_wait, Mode::PeekLock).await?;
        Ok(self.deliveries(messages))
    }

    pub(crate) async fn receive_deleting(
        self: &Arc<Self>,
        max: usize,
        max_wait: Duration,
    ) -> Result<Vec<ReceivedMessage>> {
        self.receive(max, max_wait, Mode::ReceiveAndDelete).await
    }

    pub(crate) async fn receive_deferred_deliveries(
        self: &Arc<Self>,
        seqs: &[SequenceNumber],
    ) -> Result<Vec<Delivery>> {
        let messages = self.receive_deferred(seqs).await?;
        Ok(self.deliveries(messages))
    }
}

/// A receiver of a queue, subscription or dead-letter sub-queue.
pub(crate) struct PgReceiver {
    pub(crate) link: Arc<Link>,
}

/// Plain and session receivers receive the same way, through their link.
macro_rules! receive_through_link {
    ($ty:ty) => {
        #[async_trait]
        impl Receiver for $ty {
            fn path(&self) -> &EntityPath {
                &self.link.path
            }

            async fn receive(&self, max_count: usize, max_wait: Duration) -> Result<Vec<Delivery>> {
                self.link.receive_locked(max_count, max_wait).await
            }

            async fn receive_and_delete(&self, max_count: usize, max_wait: Duration) -> Result<Vec<ReceivedMessage>> {
                self.link.receive_deleting(max_count, max_wait).await
            }

            async fn receive_deferred(&self, sequence_numbers: &[SequenceNumber]) -> Result<Vec<Delivery>> {
                self.link.receive_deferred_deliveries(sequence_numbers).await
            }

            async fn settle_by_token(&self, token: LockToken, settlement: Settlement) -> Result<()> {
                self.link.settle_token(Some(token), settlement).await
            }
        }
    };
}
pub(crate) use receive_through_link;

receive_through_link!(PgReceiver);
