//! Group commit on Postgres: the handlings of several messages received together share
//! one transaction, so that one inbox statement, one outbox statement and one COMMIT serve
//! them all.
//!
//! The group opens at its first member's `begin`: BEGIN, then one INSERT records the ids
//! of all members in the inbox (sorted, so two groups never wait on each other's ids in
//! opposite orders). Members then take turns on the connection, each under a savepoint
//! of its own; a member that fails is rolled back to its savepoint by whoever takes the
//! connection next. A member that finishes keeps its outgoing messages in memory. When
//! every member has finished, failed or left, the group deletes the inbox records of
//! those that did not finish, stores the finished ones' outgoing messages in one INSERT,
//! and commits; each member's `commit` returns then.
//!
//! A member that reports success but left the transaction aborted (it swallowed the error
//! of a failed statement) is found by the next statement sent after it (SQLSTATE 25P02):
//! it is rolled back to its savepoint and its commit fails, and the others go on.
//!
//! On the Postgres transport's own store (`PostgresTransport::store`), a member whose
//! message that transport delivered ends differently: still holding the connection, under
//! its savepoint, it looks up and checks the destinations of the messages it sent and
//! deletes the received message, fenced by its lock token. The messages themselves go
//! into their queues at the group's commit, every member's to one destination in one
//! multi-row INSERT: Postgres plans a table's CHECK constraints again at every statement
//! that writes to it, so ten members' sends in one statement cost about a tenth of ten
//! (docs/measurements-postgres-gaps.md). The transport says how through
//! [`InTransaction`], defined here and implemented by `postgres::in_tx`, so that the
//! stores (`store/`) do not depend on the transport (`postgres/`). If the lock is not its
//! any more (`LockLost`), a destination is missing or refuses a message, or the
//! transaction was aborted by its handler, it fails like a member whose handler failed:
//! rolled back to its savepoint by whoever takes the connection next, its inbox record
//! deleted at the commit, the others untouched. Its commit then returns
//! `Committed::Settled` once the group commits. A destination deleted between a member's
//! turn and the commit fails the whole group with a transient error: every member is
//! retried, and the one that sent there then fails alone at its turn.

use std::sync::{Arc, Mutex as StdMutex, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Postgres, Transaction};
use tokio::sync::{Mutex, OnceCell, OwnedMutexGuard, watch};

use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::{Envelope, LockToken};
use crate::store::pg_history::Prepared;
use crate::store::pg_outbox::{
    ABORTED_BY_HANDLER, OutboxRow, check_storable, ensure_not_aborted, insert_outbox_with_history, outbox_of,
};
use crate::store::pg_saga::pg_unit_of_work;
use crate::store::{Begin, CommitGroup, Committed, OutboxMessage, db_error};

const SAVEPOINT: &str = "SAVEPOINT courier_member";
const ROLLBACK: &str = "ROLLBACK TO SAVEPOINT courier_member";
const ROLLBACK_AND_SAVEPOINT: &str = "ROLLBACK TO SAVEPOINT courier_member; SAVEPOINT courier_member";
/// SQLSTATE of a statement sent into a transaction that an earlier failed statement aborted.
const IN_FAILED_TRANSACTION: &str = "25P02";

type Conn = Option<Transaction<'static, Postgres>>;

/// A transport whose queues are in the group's database and whose deliveries the members
/// complete in the group's transaction (the Postgres transport's own store).
#[async_trait]
pub(crate) trait InTransaction: Send + Sync {
    /// The settlement of the delivery whose lock is `token`, when this transport delivered
    /// it (`None`: another transport's delivery, or none).
    fn settlement(&self, token: Option<LockToken>) -> Option<Box<dyn Settlement>>;

    /// Inserts the messages the members sent (in the members' order) into their queues on
    /// `conn`, in the group's transaction: one statement for each destination. Returns
    /// what to do once the transaction committed with them.
    ///
    /// # Errors
    /// A transient storage error when a destination was deleted since a member looked it
    /// up (every member is retried); a storage error.
    async fn insert_sent(&self, conn: &mut PgConnection, sent: Vec<Resolved>) -> Result<AfterCommit>;
}

/// What [`InTransaction::insert_sent`] leaves to do once the group's transaction committed
/// (wake the receivers of the queues sent to).
pub(crate) type AfterCommit = Box<dyn FnOnce() + Send>;

/// A message a member sent, its destination looked up and the message checked against it
/// at the member's turn ([`Settlement::settle`]); inserted at the group's commit.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    /// The queue's or topic's name, to look it up again if its id is gone.
    pub(crate) destination: String,
    pub(crate) is_topic: bool,
    /// The destination's id when the member looked it up.
    pub(crate) entity: i64,
    pub(crate) envelope: Envelope,
}

/// How one delivery of an [`InTransaction`] transport ends in the handling's transaction.
#[async_trait]
pub(crate) trait Settlement: Send {
    /// Looks up the destination of each of `staged` (destination, whether a topic,
    /// message) and checks the message against it, then deletes the received message if
    /// the lock is still its own, on `conn`; returns the messages to insert at the
    /// group's commit ([`InTransaction::insert_sent`]).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] when the lock is not the message's any more (the member is
    /// rolled back); a destination missing or refusing a message; a storage error.
    async fn settle(
        self: Box<Self>,
        conn: &mut PgConnection,
        staged: Vec<(String, bool, Envelope)>,
    ) -> Result<Vec<Resolved>>;
}

#[derive(Debug)]
enum Seat {
    /// Not begun yet.
    Waiting,
    /// Its id was in the inbox before: nothing of it is in this transaction.
    Duplicate,
    /// Handling, with the connection.
    Running,
    /// Done: what it leaves for the group's commit.
    Finished(Finished),
    /// Failed or left: its inbox record, if this group made it, is deleted at the commit.
    Failed,
    /// Finished, but left the transaction aborted: rolled back; its commit fails.
    Poisoned,
}

/// What a member that finished leaves for the group's commit.
#[derive(Debug)]
struct Finished {
    /// Messages to store in the outbox (a message another transport delivered).
    outbox: Vec<OutboxRow>,
    /// Whether it completed its received message in the transaction (the Postgres
    /// transport's store); then `sent` holds what it sent, to insert into their queues.
    settled: bool,
    sent: Vec<Resolved>,
    /// Its history events.
    history: Vec<Prepared>,
}

impl Seat {
    fn resolved(&self) -> bool {
        !matches!(self, Seat::Waiting | Seat::Running)
    }
}

struct Members {
    seats: Vec<Seat>,
    /// The member whose savepoint is the newest.
    owner: Option<usize>,
}

/// What the commit gave a member that finished.
type Share = std::result::Result<Committed, ErrorKind>;

pub(crate) struct PgGroup {
    pool: PgPool,
    /// The transport whose deliveries the members complete in the transaction (the
    /// Postgres transport's own store), if any.
    transport: Option<Arc<dyn InTransaction>>,
    endpoint: String,
    ids: Vec<String>,
    /// Per member, whether this group's transaction recorded its id (false: a duplicate).
    opened: OnceCell<Vec<bool>>,
    conn: Arc<Mutex<Conn>>,
    members: StdMutex<Members>,
    /// Counts resolutions, for members waiting for their turn and for the committer.
    changes: watch::Sender<u64>,
    shares: StdMutex<Vec<Option<Share>>>,
    done: watch::Sender<bool>,
    /// The endpoint's clock when a member last stored outgoing messages: their outbox
    /// rows' creation time, as alone.
    stored_at: StdMutex<Option<DateTime<Utc>>>,
}

impl PgGroup {
    pub(crate) fn new(
        pool: PgPool,
        endpoint: &str,
        ids: Vec<String>,
        transport: Option<Arc<dyn InTransaction>>,
    ) -> Self {
        let n = ids.len();
        Self {
            pool,
            transport,
            endpoint: endpoint.to_owned(),
            ids,
            opened: OnceCell::new(),
            conn: Arc::new(Mutex::new(None)),
            members: StdMutex::new(Members {
                seats: (0..n).map(|_| Seat::Waiting).collect(),
                owner: None,
            }),
            changes: watch::Sender::new(0),
            shares: StdMutex::new((0..n).map(|_| None).collect()),
            done: watch::Sender::new(false),
            stored_at: StdMutex::new(None),
        }
    }

    fn members(&self) -> std::sync::MutexGuard<'_, Members> {
        self.members.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves a member that was waiting or running to `seat`.
    fn resolve(&self, member: usize, seat: Seat) {
        let mut m = self.members();
        let Some(current) = m.seats.get_mut(member) else { return };
        if current.resolved() {
            return;
        }
        *current = seat;
        drop(m);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Opens the transaction and records every member's id in the inbox, once.
    async fn open(self: &Arc<Self>, now: DateTime<Utc>) -> Result<&Vec<bool>> {
        self.opened
            .get_or_try_init(|| async {
                let mut tx = self
                    .pool
                    .begin()
                    .await
                    .map_err(|e| db_error("cannot begin the group's transaction", e))?;
                let mut sorted = self.ids.clone();
                sorted.sort_unstable();
                let recorded: Vec<String> = sqlx::query_scalar(
                    "INSERT INTO courier.inbox (endpoint, message_id, processed_at) \
                     SELECT $1, m, $3 FROM unnest($2::text[]) WITH ORDINALITY AS r(m, ord) ORDER BY ord \
                     ON CONFLICT DO NOTHING RETURNING message_id",
                )
                .bind(&self.endpoint)
                .bind(&sorted)
                .bind(now)
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db_error("cannot record the messages in the inbox", e))?;
                let recorded: std::collections::HashSet<String> = recorded.into_iter().collect();
                *self.conn.lock().await = Some(tx);
                tokio::spawn(self.clone().committer());
                Ok(self.ids.iter().map(|id| recorded.contains(id)).collect())
            })
            .await
    }

    /// Sets the member's savepoint, first rolling back the one before if its member
    /// failed, or finding that it left the transaction aborted.
    async fn take_turn(&self, conn: &mut Conn, member: usize) -> Result<()> {
        let tx = conn.as_mut().ok_or_else(group_gone)?;
        let previous = {
            let m = self.members();
            m.owner.map(|o| (o, matches!(m.seats.get(o), Some(Seat::Failed))))
        };
        match previous {
            Some((_, true)) => raw(tx, ROLLBACK_AND_SAVEPOINT).await?,
            Some((o, false)) => {
                if let Err(e) = raw(tx, SAVEPOINT).await {
                    if !in_failed_transaction(&e) {
                        return Err(e);
                    }
                    raw(tx, ROLLBACK_AND_SAVEPOINT).await?;
                    self.poisoned(o);
                }
            }
            None => raw(tx, SAVEPOINT).await?,
        }
        let mut m = self.members();
        m.owner = Some(member);
        if let Some(seat) = m.seats.get_mut(member) {
            *seat = Seat::Running;
        }
        Ok(())
    }

    fn poisoned(&self, member: usize) {
        tracing::warn!(
            member = %Escaped(self.ids.get(member).map_or("", String::as_str)),
            "a handler reported success but a statement of its transaction had failed; its work is rolled back and it will be retried"
        );
        if let Some(seat) = self.members().seats.get_mut(member) {
            *seat = Seat::Poisoned;
        }
    }

    /// Waits until every member is resolved, commits, and hands out the shares.
    async fn committer(self: Arc<Self>) {
        let mut changes = self.changes.subscribe();
        let all = changes
            .wait_for(|_| self.members().seats.iter().all(Seat::resolved))
            .await;
        drop(all);
        let mut outcome = self.finish().await;
        {
            let members = self.members();
            let mut shares = self.shares.lock().unwrap_or_else(PoisonError::into_inner);
            for (i, seat) in members.seats.iter().enumerate() {
                let share = match (seat, &mut outcome) {
                    (Seat::Poisoned, _) => Err(poisoned_kind()),
                    (Seat::Finished(f), Ok(_)) if f.settled => Ok(Committed::Settled),
                    (Seat::Finished(_), Ok(stored)) => Ok(Committed::Stored(
                        stored.get_mut(i).and_then(Option::take).unwrap_or_default(),
                    )),
                    (Seat::Finished(_), Err(kind)) => Err(kind.clone()),
                    _ => continue,
                };
                if let Some(slot) = shares.get_mut(i) {
                    *slot = Some(share);
                }
            }
        }
        self.done.send_replace(true);
    }

    /// The commit: per member, the outbox messages stored for it.
    async fn finish(&self) -> std::result::Result<Vec<Option<Vec<OutboxMessage>>>, ErrorKind> {
        let mut conn = self.conn.lock().await;
        let mut tx = conn.take().ok_or_else(|| group_gone().kind().clone())?;
        let fresh = self.opened.get().cloned().unwrap_or_default();
        let owner_failed = {
            let m = self.members();
            m.owner.is_some_and(|o| matches!(m.seats.get(o), Some(Seat::Failed)))
        };
        if owner_failed {
            raw(&mut tx, ROLLBACK).await.map_err(|e| e.kind().clone())?;
        }
        loop {
            let (forget, rows, owners, history, sent) = {
                let m = self.members();
                let mut forget = Vec::new();
                let mut rows = Vec::new();
                let mut owners = Vec::new();
                let mut history = Vec::new();
                let mut sent = Vec::new();
                for (i, seat) in m.seats.iter().enumerate() {
                    match seat {
                        Seat::Finished(f) => {
                            for row in &f.outbox {
                                rows.push(row.clone());
                                owners.push(i);
                            }
                            history.extend(f.history.iter().cloned());
                            sent.extend(f.sent.iter().cloned());
                        }
                        Seat::Duplicate => {}
                        _ if fresh.get(i).copied().unwrap_or(false) => {
                            forget.extend(self.ids.get(i).cloned());
                        }
                        _ => {}
                    }
                }
                (forget, rows, owners, history, sent)
            };
            // The newest member finished by completing its message on the connection (the
            // transport's own store): that statement, sent last, found the transaction
            // not aborted.
            let owner_settled = {
                let m = self.members();
                m.owner
                    .is_some_and(|o| matches!(m.seats.get(o), Some(Seat::Finished(f)) if f.settled))
            };
            let check = forget.is_empty() && rows.is_empty() && history.is_empty() && sent.is_empty() && !owner_settled;
            let step = async {
                if !forget.is_empty() {
                    sqlx::query("DELETE FROM courier.inbox WHERE endpoint = $1 AND message_id = ANY($2)")
                        .bind(&self.endpoint)
                        .bind(&forget)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_error("cannot forget the inbox records of failed messages", e))?;
                }
                let stored_at = *self.stored_at.lock().unwrap_or_else(PoisonError::into_inner);
                // Without rows nothing is inserted, and the time is not used.
                // The finished members' handled events, in the statement of their outgoing
                // messages.
                let stored = insert_outbox_with_history(
                    &mut tx,
                    &self.endpoint,
                    rows,
                    stored_at.unwrap_or_else(Utc::now),
                    &history,
                )
                .await?;
                // The members' messages into their queues (the transport's own store).
                let after_commit = match (&self.transport, sent.is_empty()) {
                    (Some(transport), false) => Some(transport.insert_sent(&mut tx, sent).await?),
                    _ => None,
                };
                if check {
                    // No statement above would have found an aborted transaction.
                    ensure_not_aborted(&mut tx).await?;
                }
                Ok::<_, Error>((stored, after_commit))
            }
            .await;
            match step {
                Ok((stored, after_commit)) => {
                    tx.commit()
                        .await
                        .map_err(|e| db_error("cannot commit the group's transaction", e).kind().clone())?;
                    if let Some(after_commit) = after_commit {
                        after_commit();
                    }
                    let mut per_member: Vec<Option<Vec<OutboxMessage>>> = (0..self.ids.len()).map(|_| None).collect();
                    for (message, i) in stored.into_iter().zip(owners) {
                        if let Some(slot) = per_member.get_mut(i) {
                            slot.get_or_insert_with(Vec::new).push(message);
                        }
                    }
                    return Ok(per_member);
                }
                Err(e) if in_failed_transaction(&e) => {
                    // The newest member finished with its transaction aborted.
                    let owner = {
                        let m = self.members();
                        m.owner.filter(|&o| matches!(m.seats.get(o), Some(Seat::Finished(..))))
                    };
                    let Some(owner) = owner else {
                        return Err(e.kind().clone());
                    };
                    raw(&mut tx, ROLLBACK).await.map_err(|e| e.kind().clone())?;
                    self.poisoned(owner);
                }
                Err(e) => return Err(e.kind().clone()),
            }
        }
    }
}

#[async_trait]
impl CommitGroup for PgGroup {
    async fn begin(self: Arc<Self>, member: usize, lock: Option<LockToken>, now: DateTime<Utc>) -> Result<Begin> {
        let fresh = match self.open(now).await {
            Ok(fresh) => fresh.get(member).copied().unwrap_or(false),
            Err(e) => {
                self.resolve(member, Seat::Failed);
                return Err(e);
            }
        };
        let Some(source_id) = self.ids.get(member).cloned() else {
            return Err(group_gone());
        };
        if !fresh {
            self.resolve(member, Seat::Duplicate);
            let left = outbox_of(&self.pool, &self.endpoint, &source_id).await?;
            return Ok(Begin::Duplicate(left));
        }
        // Members take turns in the order they were received.
        let mut changes = self.changes.subscribe();
        let turn = changes
            .wait_for(|_| self.members().seats.iter().take(member).all(Seat::resolved))
            .await;
        drop(turn);
        let mut guard = self.conn.clone().lock_owned().await;
        if let Err(e) = self.take_turn(&mut guard, member).await {
            self.resolve(member, Seat::Failed);
            return Err(e);
        }
        let lock = self.transport.as_ref().and_then(|t| t.settlement(lock));
        Ok(Begin::Fresh(Box::new(PgMember {
            group: self,
            member,
            source_id,
            guard: Some(guard),
            outgoing: Vec::new(),
            lock,
            staged: Vec::new(),
            history: Vec::new(),
            finished: false,
        })))
    }

    fn leave(&self, member: usize) {
        self.resolve(member, Seat::Failed);
    }
}

/// One member's share of the group's transaction, holding the connection while it runs.
struct PgMember {
    group: Arc<PgGroup>,
    member: usize,
    source_id: String,
    guard: Option<OwnedMutexGuard<Conn>>,
    outgoing: Vec<OutboxRow>,
    /// The received message's settlement, when the group's transport delivered it:
    /// completed in the transaction, with `staged` sent into their queues.
    lock: Option<Box<dyn Settlement>>,
    staged: Vec<(String, bool, Envelope)>,
    /// Its handled event, written with the others' at the group's commit.
    history: Vec<Prepared>,
    finished: bool,
}

impl PgMember {
    fn pg_conn(&mut self) -> Result<&mut PgConnection> {
        self.guard
            .as_mut()
            .and_then(|g| g.as_mut())
            .map(|tx| &mut **tx)
            .ok_or_else(group_gone)
    }
}

impl Drop for PgMember {
    fn drop(&mut self) {
        if !self.finished {
            // Before the connection is released: the next member rolls this one back.
            self.group.resolve(self.member, Seat::Failed);
        }
    }
}

pg_unit_of_work!(PgMember, {
    fn transaction(&mut self) -> Option<&mut (dyn std::any::Any + Send)> {
        self.pg_conn().ok().map(|c| c as &mut (dyn std::any::Any + Send))
    }

    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>> {
        if self.lock.is_some() {
            // Checked (what Postgres cannot store among it) by the settlement at this
            // member's commit, still at its turn.
            self.staged.extend(messages);
            return Ok(Vec::new());
        }
        // Whatever Postgres cannot store fails this member now, alone, rather than the
        // group's outbox statement at its commit.
        for (_, _, envelope) in &messages {
            check_storable(envelope)?;
        }
        if !messages.is_empty() {
            *self.group.stored_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(now);
        }
        self.outgoing
            .extend(messages.into_iter().map(|(destination, is_topic, envelope)| OutboxRow {
                source_id: self.source_id.clone(),
                destination,
                is_topic,
                envelope,
            }));
        Ok(Vec::new())
    }

    /// Kept for the group's commit, which writes every member's in one statement.
    async fn record_history(&mut self, event: &crate::store::history::HistoryEvent) -> Result<()> {
        self.history.push(Prepared::new(event)?);
        Ok(())
    }

    async fn commit(mut self: Box<Self>) -> Result<Committed> {
        let sent = match self.lock.take() {
            Some(settlement) => {
                // Under this member's savepoint, with the connection: a failure here
                // leaves it unfinished, and it is rolled back alone (see Drop).
                let staged = std::mem::take(&mut self.staged);
                Some(
                    settlement
                        .settle(self.pg_conn()?, staged)
                        .await
                        .map_err(poisoned_if_aborted)?,
                )
            }
            None => None,
        };
        let settled = sent.is_some();
        self.finished = true;
        let mut done = self.group.done.subscribe();
        self.group.resolve(
            self.member,
            Seat::Finished(Finished {
                outbox: std::mem::take(&mut self.outgoing),
                settled,
                sent: sent.unwrap_or_default(),
                history: std::mem::take(&mut self.history),
            }),
        );
        self.guard = None;
        done.wait_for(|d| *d).await.map_err(|_| group_gone())?;
        let share = self
            .group
            .shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(self.member)
            .and_then(Option::take);
        match share {
            Some(Ok(committed)) => Ok(committed),
            Some(Err(kind)) => Err(Error::new(kind)),
            None => Err(group_gone()),
        }
    }
});

async fn raw(conn: &mut PgConnection, sql: &'static str) -> Result<()> {
    sqlx::raw_sql(sql)
        .execute(conn)
        .await
        .map_err(|e| db_error("cannot set or roll back a member's savepoint", e))?;
    Ok(())
}

/// Whether `e` is Postgres' refusal of a statement sent into an aborted transaction.
pub(crate) fn in_failed_transaction(e: &Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .and_then(|s| match s {
            sqlx::Error::Database(d) => d.code().map(|c| c == IN_FAILED_TRANSACTION),
            _ => None,
        })
        .unwrap_or(false)
}

/// `e`, or, when it is Postgres' refusal of a statement sent into an aborted transaction
/// (the handler left it so), what such a handling is told ([`poisoned_kind`]).
pub(crate) fn poisoned_if_aborted(e: Error) -> Error {
    if in_failed_transaction(&e) {
        Error::new(poisoned_kind())
    } else {
        e
    }
}

/// What a member (or a handling) that left its transaction aborted is told.
pub(crate) fn poisoned_kind() -> ErrorKind {
    ErrorKind::Storage {
        detail: ABORTED_BY_HANDLER.into(),
        transient: true,
    }
}

fn group_gone() -> Error {
    Error::new(ErrorKind::Storage {
        detail: "the commit group's transaction is gone".into(),
        transient: true,
    })
}
