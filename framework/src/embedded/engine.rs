//! The embedded broker's engine: one task that owns the SQLite connection and serves
//! every command.
//!
//! Commands that arrive together are served in ONE transaction (group commit): a hundred
//! concurrent sends cost one commit, which is how pipelined sends (S1.3) become cheap on a
//! single-writer database. Replies are sent only after the commit, so an acknowledged send
//! is durable (S1.1). Receivers that find nothing wait inside the engine and are served
//! as soon as a send, an abandon, an activation or a lock expiry makes a message
//! available: no polling interval.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::{Connection, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use uuid::Uuid;

use crate::clock::Clock;
use crate::entity::{EntityCounts, EntityPath, QueueOptions, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{
    BrokerProperties, Envelope, LockToken, MessageState, Properties, ReceivedMessage, SequenceNumber, reasons,
};
use crate::transport::{SessionSelector, Settlement};

/// The most commands served in one transaction.
const MAX_BATCH: usize = 512;
/// The most scheduled messages activated in one transaction.
const ACTIVATION_BATCH: i64 = 1000;

pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// Kinds of entity, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Queue = 0,
    Topic = 1,
    Subscription = 2,
}

impl Kind {
    fn from_i64(v: i64) -> Option<Self> {
        match v {
            0 => Some(Kind::Queue),
            1 => Some(Kind::Topic),
            2 => Some(Kind::Subscription),
            _ => None,
        }
    }
}

/// What the engine knows of an entity.
#[derive(Debug, Clone)]
pub(crate) struct EntityInfo {
    pub(crate) id: i64,
    pub(crate) kind: Kind,
    pub(crate) parent: i64,
    /// `queue`, `topic` or `topic/subscriptions/name`, for errors and dead-letter sources.
    pub(crate) display: String,
    pub(crate) lock_ms: i64,
    pub(crate) max_delivery_count: i64,
    pub(crate) default_ttl_ms: Option<i64>,
    pub(crate) requires_session: bool,
    next_seq: i64,
}

/// A session lock as a session receiver holds it.
#[derive(Debug, Clone)]
pub(crate) struct SessionKey {
    pub(crate) id: String,
    pub(crate) generation: i64,
}

pub(crate) enum ReceiveMode {
    PeekLock,
    ReceiveAndDelete,
}

pub(crate) struct ReceiveRequest {
    pub(crate) entity: i64,
    pub(crate) sub_queue: SubQueue,
    pub(crate) max: usize,
    pub(crate) mode: ReceiveMode,
    pub(crate) session: Option<SessionKey>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) reply: Reply<Vec<ReceivedMessage>>,
}

pub(crate) struct AcceptRequest {
    pub(crate) entity: i64,
    pub(crate) selector: SessionSelector,
    pub(crate) deadline: Option<Instant>,
    pub(crate) reply: Reply<(String, i64, DateTime<Utc>)>,
}

/// A lock named by its message.
#[derive(Debug, Clone)]
pub(crate) struct LockRef {
    pub(crate) entity: i64,
    pub(crate) sub_queue: SubQueue,
    pub(crate) seq: SequenceNumber,
    pub(crate) delivery_count: i64,
    pub(crate) session: Option<SessionKey>,
}

pub(crate) enum SessionOp {
    Renew(Reply<DateTime<Utc>>),
    GetState(Reply<Option<Bytes>>),
    SetState(Option<Bytes>, Reply<()>),
    Release(Option<Reply<()>>),
}

pub(crate) enum Command {
    Create {
        kind: Kind,
        topic: Option<String>,
        name: String,
        options: QueueOptions,
        reply: Reply<()>,
    },
    Delete {
        path: EntityPath,
        reply: Reply<()>,
    },
    /// Finds a queue or topic to send to (`path` None topic) or an entity to receive from.
    Resolve {
        path: EntityPath,
        for_send: bool,
        reply: Reply<Arc<EntityInfo>>,
    },
    Send {
        entity: i64,
        messages: Vec<Envelope>,
        reply: Option<Reply<Vec<SequenceNumber>>>,
    },
    Cancel {
        entity: i64,
        seq: SequenceNumber,
        reply: Reply<()>,
    },
    Receive(ReceiveRequest),
    ReceiveDeferred {
        entity: i64,
        seqs: Vec<SequenceNumber>,
        session: Option<SessionKey>,
        reply: Reply<Vec<ReceivedMessage>>,
    },
    Settle {
        lock: LockRef,
        settlement: Settlement,
        reply: Reply<()>,
    },
    Renew {
        lock: LockRef,
        reply: Reply<DateTime<Utc>>,
    },
    Accept(AcceptRequest),
    Session {
        entity: i64,
        key: SessionKey,
        op: SessionOp,
    },
    Peek {
        entity: i64,
        sub_queue: SubQueue,
        from: SequenceNumber,
        max: usize,
        reply: Reply<Vec<ReceivedMessage>>,
    },
    Counts {
        entity: i64,
        reply: Reply<EntityCounts>,
    },
    Close {
        reply: oneshot::Sender<()>,
    },
}

impl Command {
    /// Answers the command with an error (the batch it was in failed, or the broker closed).
    fn fail(self, kind: &ErrorKind) {
        let e = || Error::new(kind.clone());
        match self {
            Command::Create { reply, .. } | Command::Delete { reply, .. } | Command::Cancel { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Resolve { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Send { reply, .. } => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(e()));
                }
            }
            Command::Receive(r) => {
                let _ = r.reply.send(Err(e()));
            }
            Command::ReceiveDeferred { reply, .. } | Command::Peek { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Settle { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Renew { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Accept(a) => {
                let _ = a.reply.send(Err(e()));
            }
            Command::Session { op, .. } => match op {
                SessionOp::Renew(r) => {
                    let _ = r.send(Err(e()));
                }
                SessionOp::GetState(r) => {
                    let _ = r.send(Err(e()));
                }
                SessionOp::SetState(_, r) | SessionOp::Release(Some(r)) => {
                    let _ = r.send(Err(e()));
                }
                SessionOp::Release(None) => {}
            },
            Command::Counts { reply, .. } => {
                let _ = reply.send(Err(e()));
            }
            Command::Close { reply } => {
                let _ = reply.send(());
            }
        }
    }
}

/// An answer held back until the transaction commits.
enum Outcome {
    Reply(Box<dyn FnOnce(Option<&ErrorKind>) + Send>),
    /// Messages locked for a receiver: if it has gone, the locks are released.
    Received {
        entity: i64,
        locked: bool,
        reply: Reply<Vec<ReceivedMessage>>,
        messages: Vec<ReceivedMessage>,
    },
}

fn outcome<T: Send + 'static>(reply: Reply<T>, result: Result<T>) -> Outcome {
    Outcome::Reply(Box::new(move |failed: Option<&ErrorKind>| {
        let value = match failed {
            Some(kind) => Err(Error::new(kind.clone())),
            None => result,
        };
        let _ = reply.send(value);
    }))
}

enum Waiter {
    Receive(ReceiveRequest),
    Accept(AcceptRequest),
}

impl Waiter {
    fn deadline(&self) -> Option<Instant> {
        match self {
            Waiter::Receive(r) => r.deadline,
            Waiter::Accept(a) => a.deadline,
        }
    }
    fn is_abandoned(&self) -> bool {
        match self {
            Waiter::Receive(r) => r.reply.is_closed(),
            Waiter::Accept(a) => a.reply.is_closed(),
        }
    }
    fn time_out(self) {
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
}

/// The engine's state, apart from the connection.
pub(crate) struct State {
    clock: Arc<dyn Clock>,
    epoch: u32,
    entities: HashMap<i64, EntityInfo>,
    by_name: HashMap<(i64, String), i64>,
    subscriptions: HashMap<i64, Vec<i64>>,
    dirty_seq: HashSet<i64>,
    waiters: HashMap<i64, VecDeque<Waiter>>,
    /// Clock time at which a waiting entity may see a lock expire.
    wake_entity: HashMap<i64, i64>,
    touched: HashSet<i64>,
    next_scheduled: Option<i64>,
    next_expiry: Option<i64>,
    releases: Vec<(i64, SequenceNumber, i64)>,
}

pub(crate) struct Engine {
    conn: SqliteConnection,
    state: State,
}

fn storage(e: &sqlx::Error) -> ErrorKind {
    let transient = match e {
        sqlx::Error::Database(db) => {
            let code = db.code();
            // SQLITE_BUSY (5), SQLITE_LOCKED (6), SQLITE_IOERR (10), SQLITE_FULL (13)
            matches!(code.as_deref(), Some("5" | "6" | "10" | "13" | "261" | "517"))
        }
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => true,
        _ => false,
    };
    ErrorKind::Storage {
        detail: e.to_string(),
        transient,
    }
}

pub(crate) fn storage_error(e: sqlx::Error) -> Error {
    let kind = storage(&e);
    Error::with_source(kind, e)
}

pub(crate) fn micros(t: DateTime<Utc>) -> i64 {
    t.timestamp_micros()
}

fn from_micros(v: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(v).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Lock tokens: 32 bits of broker epoch, 32 bits of delivery count, 64 bits of sequence
/// number. The delivery count rises with every lock, so a token names one lock.
pub(crate) fn make_token(epoch: u32, seq: SequenceNumber, delivery_count: i64) -> LockToken {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&epoch.to_be_bytes());
    b[4..8].copy_from_slice(&(delivery_count as u32).to_be_bytes());
    b[8..16].copy_from_slice(&seq.to_be_bytes());
    LockToken::from_uuid(Uuid::from_bytes(b))
}

/// `(seq, delivery_count)` of a token this broker issued.
pub(crate) fn read_token(epoch: u32, token: LockToken) -> Option<(SequenceNumber, i64)> {
    let b = token.as_uuid().into_bytes();
    let mut e = [0u8; 4];
    e.copy_from_slice(&b[0..4]);
    if u32::from_be_bytes(e) != epoch {
        return None;
    }
    let mut dc = [0u8; 4];
    dc.copy_from_slice(&b[4..8]);
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&b[8..16]);
    Some((i64::from_be_bytes(seq), i64::from(u32::from_be_bytes(dc))))
}

/// The columns a message is read with, in the order `row_to_message` expects. SQL is built
/// only from literals (`concat!`), never from input.
macro_rules! columns {
    () => {
        "seq, state, session_id, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
         properties, body, ttl_ms, enqueued_at, scheduled_at, expires_at, delivery_count, locked_until, dl_reason, \
         dl_description, dl_source"
    };
}

/// Receivable messages of `?2` at time `?3`, with max delivery count `?4` (and session `?6`).
macro_rules! filter_main {
    () => {
        "state = 0 AND (locked_until IS NULL OR locked_until <= ?3) AND delivery_count < ?4 \
         AND (expires_at IS NULL OR expires_at > ?3)"
    };
}
macro_rules! filter_session {
    () => {
        "state = 0 AND session_id = ?6 AND (locked_until IS NULL OR locked_until <= ?3) AND delivery_count < ?4 \
         AND (expires_at IS NULL OR expires_at > ?3)"
    };
}
macro_rules! filter_dead {
    () => {
        "state = 3 AND (locked_until IS NULL OR locked_until <= ?3) AND ?4 = ?4 AND (?6 IS NULL OR ?6 IS NOT NULL)"
    };
}
/// Locks up to `?5` receivable messages until `?1`.
macro_rules! lock_sql {
    ($filter:ident) => {
        concat!(
            "UPDATE courier_message SET locked_until = ?1, delivery_count = delivery_count + 1 WHERE entity_id = ?2 \
             AND seq IN (SELECT seq FROM courier_message WHERE entity_id = ?2 AND ",
            $filter!(),
            " ORDER BY seq LIMIT ?5) AND ?1 = ?1 RETURNING ",
            columns!()
        )
    };
}
/// Takes (deletes) up to `?5` receivable messages.
macro_rules! take_sql {
    ($filter:ident) => {
        concat!(
            "DELETE FROM courier_message WHERE entity_id = ?2 AND seq IN (SELECT seq FROM courier_message \
             WHERE entity_id = ?2 AND ",
            $filter!(),
            " ORDER BY seq LIMIT ?5) AND ?1 = ?1 RETURNING ",
            columns!()
        )
    };
}
/// The condition of a settlement: lock `(?2, ?3)` of entity `?1` still held at `?4`.
macro_rules! lock_cond {
    ($states:literal) => {
        concat!(
            " WHERE entity_id = ?1 AND seq = ?2 AND delivery_count = ?3 AND locked_until IS NOT NULL \
             AND locked_until > ?4 AND ",
            $states
        )
    };
}
macro_rules! patch_props {
    ($n:literal) => {
        concat!(
            "properties = CASE WHEN ",
            $n,
            " IS NULL THEN properties ELSE json_patch(COALESCE(properties, '{}'), ",
            $n,
            ") END"
        )
    };
}

fn props_json(p: &Properties) -> Option<String> {
    if p.is_empty() {
        None
    } else {
        serde_json::to_string(p).ok()
    }
}

fn corrupt(detail: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt { detail: detail.into() })
}

impl State {
    fn now(&self) -> i64 {
        micros(self.clock.now())
    }

    fn entity(&self, id: i64) -> Result<&EntityInfo> {
        self.entities.get(&id).ok_or_else(|| {
            Error::new(ErrorKind::EntityNotFound {
                path: format!("entity #{id} (deleted)"),
            })
        })
    }

    fn row_to_message(&self, row: &SqliteRow, now: i64, locked: bool) -> Result<ReceivedMessage> {
        let get_err = |e: sqlx::Error| corrupt(e.to_string());
        let seq: i64 = row.try_get(0).map_err(get_err)?;
        let state = match row.try_get::<i64, _>(1).map_err(get_err)? {
            0 => MessageState::Active,
            1 => MessageState::Scheduled,
            2 => MessageState::Deferred,
            3 => MessageState::DeadLettered,
            other => return Err(corrupt(format!("message {seq} has unknown state {other}"))),
        };
        let properties = match row.try_get::<Option<String>, _>(9).map_err(get_err)? {
            Some(json) => serde_json::from_str::<Properties>(&json)
                .map_err(|e| corrupt(format!("properties of message {seq}: {e}")))?,
            None => Properties::new(),
        };
        let body: Vec<u8> = row.try_get(10).map_err(get_err)?;
        let ttl_ms: Option<i64> = row.try_get(11).map_err(get_err)?;
        let scheduled_at: Option<i64> = row.try_get(13).map_err(get_err)?;
        let delivery_count: i64 = row.try_get(15).map_err(get_err)?;
        let locked_until: Option<i64> = row.try_get::<Option<i64>, _>(16).map_err(get_err)?.filter(|t| *t > now);
        let envelope = Envelope {
            message_id: row.try_get(3).map_err(get_err)?,
            correlation_id: row.try_get(4).map_err(get_err)?,
            causation_id: row.try_get(5).map_err(get_err)?,
            message_type: row.try_get(6).map_err(get_err)?,
            content_type: row.try_get(7).map_err(get_err)?,
            body: Bytes::from(body),
            properties,
            session_id: row.try_get(2).map_err(get_err)?,
            reply_to: row.try_get(8).map_err(get_err)?,
            time_to_live: ttl_ms.map(|ms| std::time::Duration::from_millis(ms.max(0) as u64)),
            scheduled_enqueue_time: scheduled_at.map(from_micros),
        };
        let broker = BrokerProperties {
            sequence_number: seq,
            enqueued_time: from_micros(row.try_get(12).map_err(get_err)?),
            delivery_count: u32::try_from(delivery_count).unwrap_or(u32::MAX),
            lock_token: if locked {
                Some(make_token(self.epoch, seq, delivery_count))
            } else {
                None
            },
            locked_until: locked_until.map(from_micros),
            state,
            expires_at: row.try_get::<Option<i64>, _>(14).map_err(get_err)?.map(from_micros),
            dead_letter_reason: row.try_get(17).map_err(get_err)?,
            dead_letter_description: row.try_get(18).map_err(get_err)?,
            dead_letter_source: row.try_get(19).map_err(get_err)?,
        };
        Ok(ReceivedMessage { envelope, broker })
    }

    fn rows_to_messages(&self, rows: &[SqliteRow], now: i64, locked: bool) -> Result<Vec<ReceivedMessage>> {
        let mut out = rows
            .iter()
            .map(|r| self.row_to_message(r, now, locked))
            .collect::<Result<Vec<_>>>()?;
        out.sort_by_key(|m| m.broker.sequence_number);
        Ok(out)
    }

    fn alloc_seq(&mut self, entity: i64, n: i64) -> Result<i64> {
        let info = self.entities.get_mut(&entity).ok_or_else(|| corrupt("sequence of unknown entity"))?;
        let first = info.next_seq;
        info.next_seq += n;
        self.dirty_seq.insert(entity);
        Ok(first)
    }

    fn note_expiry(&mut self, at: Option<i64>) {
        if let Some(at) = at {
            self.next_expiry = Some(self.next_expiry.map_or(at, |n| n.min(at)));
        }
    }
}

/// Why a receive had no messages.
type Sql = Result<(), sqlx::Error>;

impl Engine {
    pub(crate) async fn start(mut conn: SqliteConnection, clock: Arc<dyn Clock>, epoch: u32) -> Result<Self> {
        // Locks are volatile (S2.7): whatever a previous process held is released.
        sqlx::query("UPDATE courier_message SET locked_until = NULL WHERE locked_until IS NOT NULL")
            .execute(&mut conn)
            .await
            .map_err(storage_error)?;
        sqlx::query("UPDATE courier_session SET locked_until = NULL WHERE locked_until IS NOT NULL")
            .execute(&mut conn)
            .await
            .map_err(storage_error)?;
        let mut state = State {
            clock,
            epoch,
            entities: HashMap::new(),
            by_name: HashMap::new(),
            subscriptions: HashMap::new(),
            dirty_seq: HashSet::new(),
            waiters: HashMap::new(),
            wake_entity: HashMap::new(),
            touched: HashSet::new(),
            next_scheduled: None,
            next_expiry: None,
            releases: Vec::new(),
        };
        load_entities(&mut conn, &mut state).await.map_err(storage_error)?;
        refresh_due_times(&mut conn, &mut state).await.map_err(storage_error)?;
        Ok(Self { conn, state })
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<Command> = Vec::with_capacity(MAX_BATCH);
        loop {
            let wake_clock = self.next_clock_wake();
            let wake_real = self.next_waiter_deadline();
            let clock_sleep = wake_clock.map(|t| self.state.clock.sleep_until(from_micros(t)));
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(c) => batch.push(c),
                    None => break,
                },
                () = async { if let Some(s) = clock_sleep { s.await } else { std::future::pending().await } } => {}
                () = async {
                    match wake_real { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await }
                } => {}
            }
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            let close = batch
                .iter()
                .position(|c| matches!(c, Command::Close { .. }))
                .map(|i| batch.split_off(i));
            self.process(std::mem::take(&mut batch)).await;
            if let Some(rest) = close {
                self.shut_down(rest, &mut rx).await;
                return;
            }
        }
        self.shut_down(Vec::new(), &mut rx).await;
    }

    async fn shut_down(mut self, rest: Vec<Command>, rx: &mut mpsc::Receiver<Command>) {
        rx.close();
        let closed = ErrorKind::Closed;
        for (_, waiters) in self.state.waiters.drain() {
            for w in waiters {
                match w {
                    Waiter::Receive(r) => {
                        let _ = r.reply.send(Err(Error::new(closed.clone())));
                    }
                    Waiter::Accept(a) => {
                        let _ = a.reply.send(Err(Error::new(closed.clone())));
                    }
                }
            }
        }
        let mut close_replies = Vec::new();
        for cmd in rest {
            match cmd {
                Command::Close { reply } => close_replies.push(reply),
                other => other.fail(&closed),
            }
        }
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                Command::Close { reply } => close_replies.push(reply),
                other => other.fail(&closed),
            }
        }
        if let Err(e) = self.conn.close().await {
            tracing::warn!(error = %e, "closing the embedded broker's database failed");
        }
        for r in close_replies {
            let _ = r.send(());
        }
    }

    fn next_clock_wake(&self) -> Option<i64> {
        let s = &self.state;
        [s.next_scheduled, s.next_expiry, s.wake_entity.values().copied().min()]
            .into_iter()
            .flatten()
            .min()
    }

    fn next_waiter_deadline(&self) -> Option<Instant> {
        self.state
            .waiters
            .values()
            .flat_map(|q| q.iter().filter_map(Waiter::deadline))
            .min()
    }

    async fn process(&mut self, batch: Vec<Command>) {
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(batch.len());
        let mut pending = batch.into_iter();
        let result: Sql = async {
            sqlx::query("BEGIN IMMEDIATE").execute(&mut self.conn).await?;
            let now = self.state.now();
            self.maintenance(now).await?;
            for cmd in pending.by_ref() {
                if let Some(o) = self.handle(cmd, now).await? {
                    outcomes.push(o);
                }
            }
            self.serve_waiters(now, &mut outcomes).await?;
            self.flush_sequences().await?;
            sqlx::query("COMMIT").execute(&mut self.conn).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => {
                for o in outcomes {
                    match o {
                        Outcome::Reply(f) => f(None),
                        Outcome::Received {
                            entity,
                            locked,
                            reply,
                            messages,
                        } => {
                            if let Err(Ok(messages)) = reply.send(Ok(messages)) {
                                if locked {
                                    for m in messages {
                                        self.state.releases.push((
                                            entity,
                                            m.broker.sequence_number,
                                            i64::from(m.broker.delivery_count),
                                        ));
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Err(e) => {
                let kind = storage(&e);
                tracing::error!(error = %e, "embedded broker transaction failed; its commands are answered with an error");
                let _ = sqlx::query("ROLLBACK").execute(&mut self.conn).await;
                for o in outcomes {
                    match o {
                        Outcome::Reply(f) => f(Some(&kind)),
                        Outcome::Received { reply, .. } => {
                            let _ = reply.send(Err(Error::new(kind.clone())));
                        }
                    }
                }
                for cmd in pending {
                    cmd.fail(&kind);
                }
                self.state.dirty_seq.clear();
                self.state.releases.clear();
                // The cache may hold entities or sequence numbers of the rolled back work.
                if let Err(e) = load_entities(&mut self.conn, &mut self.state).await {
                    tracing::error!(error = %e, "reloading the embedded broker's entities failed");
                }
                let _ = refresh_due_times(&mut self.conn, &mut self.state).await;
            }
        }
        self.expire_waiters();
    }

    fn expire_waiters(&mut self) {
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
        let waiting: HashSet<i64> = self.state.waiters.keys().copied().collect();
        self.state.wake_entity.retain(|e, _| waiting.contains(e));
    }

    async fn flush_sequences(&mut self) -> Sql {
        for id in std::mem::take(&mut self.state.dirty_seq) {
            if let Some(info) = self.state.entities.get(&id) {
                sqlx::query("UPDATE courier_entity SET next_seq = ?1 WHERE id = ?2")
                    .bind(info.next_seq)
                    .bind(id)
                    .execute(&mut self.conn)
                    .await?;
            }
        }
        Ok(())
    }

    /// Activates due scheduled messages, dead-letters expired ones, releases locks of
    /// receivers that went away, and notes entities whose locks may have expired.
    async fn maintenance(&mut self, now: i64) -> Sql {
        for (entity, seq, dc) in std::mem::take(&mut self.state.releases) {
            sqlx::query(
                "UPDATE courier_message SET locked_until = NULL, delivery_count = delivery_count - 1 \
                 WHERE entity_id = ?1 AND seq = ?2 AND delivery_count = ?3 AND locked_until IS NOT NULL",
            )
            .bind(entity)
            .bind(seq)
            .bind(dc)
            .execute(&mut self.conn)
            .await?;
            self.state.touched.insert(entity);
        }
        if self.state.next_scheduled.is_some_and(|t| t <= now) {
            self.activate(now).await?;
        }
        if self.state.next_expiry.is_some_and(|t| t <= now) {
            self.sweep_expired(now).await?;
        }
        let due: Vec<i64> = self
            .state
            .wake_entity
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(e, _)| *e)
            .collect();
        for e in due {
            self.state.wake_entity.remove(&e);
            self.state.touched.insert(e);
        }
        Ok(())
    }

    async fn activate(&mut self, now: i64) -> Sql {
        loop {
            let rows = sqlx::query(concat!(
                "SELECT entity_id, ",
                columns!(),
                " FROM courier_message WHERE state = 1 AND scheduled_at <= ?1 ORDER BY scheduled_at, seq LIMIT ?2"
            ))
            .bind(now)
            .bind(ACTIVATION_BATCH)
            .fetch_all(&mut self.conn)
            .await?;
            let n = rows.len();
            for row in rows {
                let entity: i64 = row.try_get(0)?;
                let old_seq: i64 = row.try_get(1)?;
                let Some(info) = self.state.entities.get(&entity) else {
                    continue;
                };
                let kind = info.kind;
                let Ok(new_seq) = self.state.alloc_seq(entity, 1) else {
                    continue;
                };
                if kind == Kind::Topic {
                    // Fan the activated message out to the subscriptions.
                    let ttl: Option<i64> = row.try_get(12)?;
                    let session: Option<String> = row.try_get(3)?;
                    let copy = RowCopy::from_row(&row)?;
                    let subs = self.state.subscriptions.get(&entity).cloned().unwrap_or_default();
                    for sub in subs {
                        self.insert_copy(sub, new_seq, &copy, ttl, session.as_deref(), now).await?;
                    }
                    sqlx::query("DELETE FROM courier_message WHERE entity_id = ?1 AND seq = ?2")
                        .bind(entity)
                        .bind(old_seq)
                        .execute(&mut self.conn)
                        .await?;
                } else {
                    let ttl: Option<i64> = row.try_get(12)?;
                    let expires = ttl.map(|ms| now.saturating_add(ms.saturating_mul(1000)));
                    sqlx::query(
                        "UPDATE courier_message SET seq = ?1, state = 0, enqueued_at = ?2, expires_at = ?3 \
                         WHERE entity_id = ?4 AND seq = ?5",
                    )
                    .bind(new_seq)
                    .bind(now)
                    .bind(expires)
                    .bind(entity)
                    .bind(old_seq)
                    .execute(&mut self.conn)
                    .await?;
                    self.state.note_expiry(expires);
                    self.state.touched.insert(entity);
                }
            }
            if (n as i64) < ACTIVATION_BATCH {
                break;
            }
        }
        self.state.next_scheduled =
            sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
                .fetch_one(&mut self.conn)
                .await?;
        Ok(())
    }

    async fn sweep_expired(&mut self, now: i64) -> Sql {
        let rows = sqlx::query(
            "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?2, \
             dl_description = 'the message expired before it was received', \
             dl_source = (SELECT name FROM courier_entity WHERE id = entity_id) \
             WHERE state IN (0, 2) AND expires_at IS NOT NULL AND expires_at <= ?1 \
             AND (locked_until IS NULL OR locked_until <= ?1) RETURNING entity_id",
        )
        .bind(now)
        .bind(reasons::TTL_EXPIRED)
        .fetch_all(&mut self.conn)
        .await?;
        if !rows.is_empty() {
            tracing::debug!(count = rows.len(), "dead-lettered expired messages");
        }
        self.state.next_expiry = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND expires_at > ?1 \
             AND state IN (0, 2)",
        )
        .bind(now)
        .fetch_one(&mut self.conn)
        .await?;
        Ok(())
    }

    async fn handle(&mut self, cmd: Command, now: i64) -> Result<Option<Outcome>, sqlx::Error> {
        Ok(Some(match cmd {
            Command::Create {
                kind,
                topic,
                name,
                options,
                reply,
            } => {
                let r = self.create(kind, topic, name, &options, now).await?;
                outcome(reply, r)
            }
            Command::Delete { path, reply } => {
                let r = self.delete(&path).await?;
                outcome(reply, r)
            }
            Command::Resolve { path, for_send, reply } => outcome(reply, self.resolve(&path, for_send)),
            Command::Send { entity, messages, reply } => {
                let r = self.send(entity, messages, now).await?;
                match reply {
                    Some(reply) => outcome(reply, r),
                    None => {
                        if let Err(e) = r {
                            tracing::warn!(error = %e, "a pre-settled send failed; its sender is not told (S1.5)");
                        }
                        return Ok(None);
                    }
                }
            }
            Command::Cancel { entity, seq, reply } => {
                let r = self.cancel(entity, seq).await?;
                outcome(reply, r)
            }
            Command::Receive(req) => return self.receive(req, now).await,
            Command::ReceiveDeferred {
                entity,
                seqs,
                session,
                reply,
            } => {
                let r = self.receive_deferred(entity, &seqs, session.as_ref(), now).await?;
                match r {
                    Ok(messages) => Outcome::Received {
                        entity,
                        locked: true,
                        reply,
                        messages,
                    },
                    Err(e) => outcome(reply, Err(e)),
                }
            }
            Command::Settle {
                lock,
                settlement,
                reply,
            } => {
                let r = self.settle(&lock, settlement, now).await?;
                outcome(reply, r)
            }
            Command::Renew { lock, reply } => {
                let r = self.renew(&lock, now).await?;
                outcome(reply, r)
            }
            Command::Accept(req) => return self.accept(req, now).await,
            Command::Session { entity, key, op } => return self.session_op(entity, &key, op, now).await,
            Command::Peek {
                entity,
                sub_queue,
                from,
                max,
                reply,
            } => {
                let r = self.peek(entity, sub_queue, from, max, now).await?;
                outcome(reply, r)
            }
            Command::Counts { entity, reply } => {
                let r = self.counts(entity).await?;
                outcome(reply, r)
            }
            Command::Close { reply } => {
                let _ = reply.send(());
                return Ok(None);
            }
        }))
    }

    async fn create(
        &mut self,
        kind: Kind,
        topic: Option<String>,
        name: String,
        options: &QueueOptions,
        now: i64,
    ) -> Result<Result<()>, sqlx::Error> {
        let parent = match &topic {
            Some(t) => match self.state.by_name.get(&(0, t.clone())) {
                Some(id) if self.state.entities.get(id).is_some_and(|e| e.kind == Kind::Topic) => *id,
                _ => {
                    return Ok(Err(Error::new(ErrorKind::EntityNotFound { path: t.clone() })));
                }
            },
            None => 0,
        };
        if let Some(id) = self.state.by_name.get(&(parent, name.clone())) {
            let existing = self.state.entities.get(id).map(|e| e.kind);
            return Ok(if existing == Some(kind) {
                Ok(())
            } else {
                Err(Error::new(ErrorKind::InvalidOperation {
                    reason: format!("the name {name:?} is taken by an entity of another kind"),
                }))
            });
        }
        let lock_ms = i64::try_from(options.lock_duration.as_millis()).unwrap_or(i64::MAX);
        let ttl_ms = options
            .default_time_to_live
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO courier_entity (kind, parent, name, lock_duration_ms, max_delivery_count, default_ttl_ms, \
             requires_session, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) RETURNING id",
        )
        .bind(kind as i64)
        .bind(parent)
        .bind(&name)
        .bind(lock_ms)
        .bind(i64::from(options.max_delivery_count))
        .bind(ttl_ms)
        .bind(options.requires_session)
        .bind(now)
        .fetch_one(&mut self.conn)
        .await?;
        let display = match &topic {
            Some(t) => format!("{t}/subscriptions/{name}"),
            None => name.clone(),
        };
        self.state.entities.insert(
            id,
            EntityInfo {
                id,
                kind,
                parent,
                display,
                lock_ms,
                max_delivery_count: i64::from(options.max_delivery_count),
                default_ttl_ms: ttl_ms,
                requires_session: options.requires_session,
                next_seq: 1,
            },
        );
        self.state.by_name.insert((parent, name), id);
        if kind == Kind::Subscription {
            self.state.subscriptions.entry(parent).or_default().push(id);
        }
        Ok(Ok(()))
    }

    fn lookup(&self, path: &EntityPath) -> Option<i64> {
        match path.topic() {
            None => self.state.by_name.get(&(0, path.name().to_owned())).copied(),
            Some(t) => {
                let topic = self.state.by_name.get(&(0, t.to_owned()))?;
                self.state.by_name.get(&(*topic, path.name().to_owned())).copied()
            }
        }
    }

    fn not_found(path: &EntityPath) -> Error {
        Error::new(ErrorKind::EntityNotFound { path: path.to_string() })
    }

    fn resolve(&self, path: &EntityPath, for_send: bool) -> Result<Arc<EntityInfo>> {
        let id = self.lookup(path).ok_or_else(|| Self::not_found(path))?;
        let info = self.state.entity(id)?;
        if !for_send && info.kind == Kind::Topic {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{path} is a topic: receive from one of its subscriptions"),
            }));
        }
        Ok(Arc::new(info.clone()))
    }

    async fn delete(&mut self, path: &EntityPath) -> Result<Result<()>, sqlx::Error> {
        let Some(id) = self.lookup(path) else {
            return Ok(Err(Self::not_found(path)));
        };
        let mut ids = vec![id];
        if let Some(subs) = self.state.subscriptions.remove(&id) {
            ids.extend(subs);
        }
        for e in &ids {
            for q in [
                "DELETE FROM courier_message WHERE entity_id = ?1",
                "DELETE FROM courier_session WHERE entity_id = ?1",
                "DELETE FROM courier_entity WHERE id = ?1",
            ] {
                sqlx::query(q).bind(e).execute(&mut self.conn).await?;
            }
            if let Some(info) = self.state.entities.remove(e) {
                let name = info.display.rsplit('/').next().unwrap_or_default().to_owned();
                self.state.by_name.remove(&(info.parent, name));
                if let Some(subs) = self.state.subscriptions.get_mut(&info.parent) {
                    subs.retain(|s| s != e);
                }
            }
            if let Some(waiters) = self.state.waiters.remove(e) {
                for w in waiters {
                    let err = Self::not_found(path);
                    match w {
                        Waiter::Receive(r) => {
                            let _ = r.reply.send(Err(err));
                        }
                        Waiter::Accept(a) => {
                            let _ = a.reply.send(Err(err));
                        }
                    }
                }
            }
        }
        Ok(Ok(()))
    }

    async fn send(
        &mut self,
        entity: i64,
        messages: Vec<Envelope>,
        now: i64,
    ) -> Result<Result<Vec<SequenceNumber>>, sqlx::Error> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let n = messages.len() as i64;
        let first = match self.state.alloc_seq(entity, n) {
            Ok(f) => f,
            Err(e) => return Ok(Err(e)),
        };
        let mut seqs = Vec::with_capacity(messages.len());
        for (i, msg) in messages.iter().enumerate() {
            let seq = first + i as i64;
            seqs.push(seq);
            let scheduled = msg.scheduled_enqueue_time.map(micros).filter(|t| *t > now);
            let msg_ttl = msg
                .time_to_live
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
            let copy = RowCopy::from_envelope(msg);
            if info.kind == Kind::Topic {
                if let Some(at) = scheduled {
                    let ttl = min_opt(msg_ttl, info.default_ttl_ms);
                    copy.insert(&mut self.conn, entity, seq, 1, ttl, now, Some(at), None).await?;
                    self.state.next_scheduled = Some(self.state.next_scheduled.map_or(at, |t| t.min(at)));
                } else {
                    let ttl = min_opt(msg_ttl, info.default_ttl_ms);
                    let subs = self.state.subscriptions.get(&entity).cloned().unwrap_or_default();
                    for sub in subs {
                        self.insert_copy(sub, seq, &copy, ttl, msg.session_id.as_deref(), now)
                            .await?;
                    }
                }
            } else {
                let ttl = min_opt(msg_ttl, info.default_ttl_ms);
                if let Some(at) = scheduled {
                    copy.insert(&mut self.conn, entity, seq, 1, ttl, now, Some(at), None).await?;
                    self.state.next_scheduled = Some(self.state.next_scheduled.map_or(at, |t| t.min(at)));
                } else {
                    let expires = ttl.map(|ms| now.saturating_add(ms.saturating_mul(1000)));
                    copy.insert(&mut self.conn, entity, seq, 0, ttl, now, None, expires).await?;
                    self.state.note_expiry(expires);
                    self.state.touched.insert(entity);
                }
            }
        }
        Ok(Ok(seqs))
    }

    /// Inserts a topic message's copy into a subscription.
    async fn insert_copy(
        &mut self,
        sub: i64,
        seq: SequenceNumber,
        copy: &RowCopy,
        topic_ttl: Option<i64>,
        session: Option<&str>,
        now: i64,
    ) -> Sql {
        let Some(info) = self.state.entities.get(&sub) else {
            return Ok(());
        };
        let ttl = min_opt(topic_ttl, info.default_ttl_ms);
        let expires = ttl.map(|ms| now.saturating_add(ms.saturating_mul(1000)));
        let state = if info.requires_session && session.is_none() {
            3
        } else {
            0
        };
        let dead = (state == 3).then(|| info.display.clone());
        copy.insert(&mut self.conn, sub, seq, state, ttl, now, None, expires).await?;
        if let Some(source) = dead {
            sqlx::query(
                "UPDATE courier_message SET dl_reason = 'SessionIdMissing', \
                 dl_description = 'the subscription requires a session id and the message has none', dl_source = ?3 \
                 WHERE entity_id = ?1 AND seq = ?2",
            )
            .bind(sub)
            .bind(seq)
            .bind(source)
            .execute(&mut self.conn)
            .await?;
        } else {
            self.state.note_expiry(expires);
            self.state.touched.insert(sub);
        }
        Ok(())
    }

    async fn cancel(&mut self, entity: i64, seq: SequenceNumber) -> Result<Result<()>, sqlx::Error> {
        let done = sqlx::query("DELETE FROM courier_message WHERE entity_id = ?1 AND seq = ?2 AND state = 1")
            .bind(entity)
            .bind(seq)
            .execute(&mut self.conn)
            .await?;
        Ok(if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::MessageNotFound {
                sequence_number: seq,
                expected: "scheduled",
            }))
        })
    }

    /// Checks a session lock; returns its locked-until time.
    async fn session_lock(&mut self, entity: i64, key: &SessionKey, now: i64) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar::<_, i64>(
            "SELECT locked_until FROM courier_session WHERE entity_id = ?1 AND session_id = ?2 AND lock_gen = ?3 \
             AND locked_until > ?4",
        )
        .bind(entity)
        .bind(&key.id)
        .bind(key.generation)
        .bind(now)
        .fetch_optional(&mut self.conn)
        .await
    }

    async fn receive(&mut self, req: ReceiveRequest, now: i64) -> Result<Option<Outcome>, sqlx::Error> {
        match self.try_receive(&req, now).await? {
            Err(e) => Ok(Some(outcome(req.reply, Err(e)))),
            Ok(messages) if !messages.is_empty() || req.deadline.is_none() => Ok(Some(Outcome::Received {
                entity: req.entity,
                locked: matches!(req.mode, ReceiveMode::PeekLock),
                reply: req.reply,
                messages,
            })),
            Ok(_) => {
                self.park(req.entity, Waiter::Receive(req), now).await?;
                Ok(None)
            }
        }
    }

    async fn park(&mut self, entity: i64, waiter: Waiter, now: i64) -> Sql {
        // Wake when the first lock on this entity expires: its message (or session) comes back.
        let next: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(t) FROM (SELECT MIN(locked_until) AS t FROM courier_message WHERE entity_id = ?1 \
             AND state IN (0, 3) AND locked_until > ?2 UNION ALL SELECT MIN(locked_until) FROM courier_session \
             WHERE entity_id = ?1 AND locked_until > ?2)",
        )
        .bind(entity)
        .bind(now)
        .fetch_one(&mut self.conn)
        .await?;
        if let Some(t) = next {
            let w = self.state.wake_entity.entry(entity).or_insert(t);
            *w = (*w).min(t);
        }
        self.state.waiters.entry(entity).or_default().push_back(waiter);
        Ok(())
    }

    async fn serve_waiters(&mut self, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
        let touched: Vec<i64> = std::mem::take(&mut self.state.touched).into_iter().collect();
        for entity in touched {
            let Some(mut queue) = self.state.waiters.remove(&entity) else {
                continue;
            };
            let mut keep = VecDeque::new();
            let mut exhausted = false;
            while let Some(w) = queue.pop_front() {
                if w.is_abandoned() {
                    continue;
                }
                if exhausted {
                    keep.push_back(w);
                    continue;
                }
                match w {
                    Waiter::Receive(req) => match self.try_receive(&req, now).await? {
                        Ok(messages) if messages.is_empty() => {
                            exhausted = req.session.is_none();
                            keep.push_back(Waiter::Receive(req));
                        }
                        Ok(messages) => outcomes.push(Outcome::Received {
                            entity,
                            locked: matches!(req.mode, ReceiveMode::PeekLock),
                            reply: req.reply,
                            messages,
                        }),
                        Err(e) => outcomes.push(outcome(req.reply, Err(e))),
                    },
                    Waiter::Accept(req) => match self.try_accept(&req, now).await? {
                        Some(r) => outcomes.push(outcome(req.reply, r)),
                        None => keep.push_back(Waiter::Accept(req)),
                    },
                }
            }
            if !keep.is_empty() {
                self.state.waiters.insert(entity, keep);
                let next: Option<i64> = sqlx::query_scalar(
                    "SELECT MIN(t) FROM (SELECT MIN(locked_until) AS t FROM courier_message WHERE entity_id = ?1 \
                     AND state IN (0, 3) AND locked_until > ?2 UNION ALL SELECT MIN(locked_until) \
                     FROM courier_session WHERE entity_id = ?1 AND locked_until > ?2)",
                )
                .bind(entity)
                .bind(now)
                .fetch_one(&mut self.conn)
                .await?;
                match next {
                    Some(t) => {
                        self.state.wake_entity.insert(entity, t);
                    }
                    None => {
                        self.state.wake_entity.remove(&entity);
                    }
                }
            }
        }
        Ok(())
    }

    /// Locks (or takes) up to `max` messages; dead-letters the expired and over-delivered
    /// ones it meets on the way.
    async fn try_receive(&mut self, req: &ReceiveRequest, now: i64) -> Result<Result<Vec<ReceivedMessage>>, sqlx::Error> {
        let info = match self.state.entity(req.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let dead = req.sub_queue == SubQueue::DeadLetter;
        let mut lock_until = now.saturating_add(info.lock_ms.saturating_mul(1000));
        match (&req.session, info.requires_session && !dead) {
            (None, true) => {
                return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                    reason: format!("{} requires sessions: accept a session to receive", info.display),
                })));
            }
            (Some(key), _) => match self.session_lock(req.entity, key, now).await? {
                Some(until) => lock_until = until,
                None => return Ok(Err(Error::new(ErrorKind::SessionLockLost))),
            },
            (None, false) => {}
        }
        let max = i64::try_from(req.max.clamp(1, 5000)).unwrap_or(5000);
        for attempt in 0..2 {
            let sql: &'static str = match (&req.mode, dead, req.session.is_some()) {
                (ReceiveMode::PeekLock, true, _) => lock_sql!(filter_dead),
                (ReceiveMode::PeekLock, false, true) => lock_sql!(filter_session),
                (ReceiveMode::PeekLock, false, false) => lock_sql!(filter_main),
                (ReceiveMode::ReceiveAndDelete, true, _) => take_sql!(filter_dead),
                (ReceiveMode::ReceiveAndDelete, false, true) => take_sql!(filter_session),
                (ReceiveMode::ReceiveAndDelete, false, false) => take_sql!(filter_main),
            };
            let rows = sqlx::query(sql)
                .bind(lock_until)
                .bind(req.entity)
                .bind(now)
                .bind(info.max_delivery_count)
                .bind(max)
                .bind(req.session.as_ref().map(|k| k.id.as_str()))
                .fetch_all(&mut self.conn)
                .await?;
            let locked = matches!(req.mode, ReceiveMode::PeekLock);
            let mut messages = match self.state.rows_to_messages(&rows, now, locked) {
                Ok(m) => m,
                Err(e) => return Ok(Err(e)),
            };
            if !locked {
                for m in &mut messages {
                    m.broker.delivery_count = m.broker.delivery_count.saturating_add(1);
                }
            }
            if (messages.len() as i64) < max && !dead && attempt == 0 {
                // Few messages: look for expired or over-delivered ones to dead-letter (they
                // were skipped above) and, if any moved, try once more.
                let moved = self.dead_letter_unreceivable(&info, now).await?;
                if moved > 0 && messages.is_empty() {
                    continue;
                }
            }
            return Ok(Ok(messages));
        }
        Ok(Ok(Vec::new()))
    }

    async fn dead_letter_unreceivable(&mut self, info: &EntityInfo, now: i64) -> Result<u64, sqlx::Error> {
        let done = sqlx::query(
            "UPDATE courier_message SET state = 3, locked_until = NULL, \
             dl_reason = CASE WHEN delivery_count >= ?3 THEN ?4 ELSE ?5 END, \
             dl_description = CASE WHEN delivery_count >= ?3 \
                 THEN 'the message was delivered ' || delivery_count || ' times without being settled' \
                 ELSE 'the message expired before it was received' END, \
             dl_source = ?6 \
             WHERE entity_id = ?1 AND state = 0 AND (locked_until IS NULL OR locked_until <= ?2) \
             AND (delivery_count >= ?3 OR (expires_at IS NOT NULL AND expires_at <= ?2))",
        )
        .bind(info.id)
        .bind(now)
        .bind(info.max_delivery_count)
        .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        .bind(reasons::TTL_EXPIRED)
        .bind(&info.display)
        .execute(&mut self.conn)
        .await?;
        if done.rows_affected() > 0 {
            tracing::info!(entity = %info.display, count = done.rows_affected(), "dead-lettered messages that can no longer be delivered");
        }
        Ok(done.rows_affected())
    }

    async fn receive_deferred(
        &mut self,
        entity: i64,
        seqs: &[SequenceNumber],
        session: Option<&SessionKey>,
        now: i64,
    ) -> Result<Result<Vec<ReceivedMessage>>, sqlx::Error> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let mut lock_until = now.saturating_add(info.lock_ms.saturating_mul(1000));
        if let Some(key) = session {
            match self.session_lock(entity, key, now).await? {
                Some(until) => lock_until = until,
                None => return Ok(Err(Error::new(ErrorKind::SessionLockLost))),
            }
        }
        // Check all first: either every message is locked or none.
        for seq in seqs {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT seq FROM courier_message WHERE entity_id = ?1 AND seq = ?2 AND state = 2 \
                 AND (locked_until IS NULL OR locked_until <= ?3) AND (?4 IS NULL OR session_id = ?4)",
            )
            .bind(entity)
            .bind(seq)
            .bind(now)
            .bind(session.map(|k| k.id.as_str()))
            .fetch_optional(&mut self.conn)
            .await?;
            if found.is_none() {
                return Ok(Err(Error::new(ErrorKind::MessageNotFound {
                    sequence_number: *seq,
                    expected: "deferred (and unlocked)",
                })));
            }
        }
        let mut rows = Vec::with_capacity(seqs.len());
        for seq in seqs {
            let row = sqlx::query(concat!(
                "UPDATE courier_message SET locked_until = ?1, delivery_count = delivery_count + 1 \
                 WHERE entity_id = ?2 AND seq = ?3 RETURNING ",
                columns!()
            ))
            .bind(lock_until)
            .bind(entity)
            .bind(seq)
            .fetch_one(&mut self.conn)
            .await?;
            rows.push(row);
        }
        Ok(self.state.rows_to_messages(&rows, now, true))
    }

    async fn settle(
        &mut self,
        lock: &LockRef,
        settlement: Settlement,
        now: i64,
    ) -> Result<Result<()>, sqlx::Error> {
        let info = match self.state.entity(lock.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        if let Some(key) = &lock.session {
            if self.session_lock(lock.entity, key, now).await?.is_none() {
                return Ok(Err(Error::new(ErrorKind::SessionLockLost)));
            }
        }
        let dead = lock.sub_queue == SubQueue::DeadLetter;
        let pick = |main: &'static str, dlq: &'static str| if dead { dlq } else { main };
        let invalid = |what: &str| {
            Ok(Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("a message in a dead-letter sub-queue cannot be {what}"),
            })))
        };
        let rows = match settlement {
            Settlement::Complete => {
                sqlx::query(pick(
                    concat!("DELETE FROM courier_message", lock_cond!("state IN (0, 2)")),
                    concat!("DELETE FROM courier_message", lock_cond!("state = 3")),
                ))
                    .bind(lock.entity)
                    .bind(lock.seq)
                    .bind(lock.delivery_count)
                    .bind(now)
                    .execute(&mut self.conn)
                    .await?
                    .rows_affected()
            }
            Settlement::Abandon { properties } => {
                let r = sqlx::query(pick(
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, ",
                        patch_props!("?5"),
                        lock_cond!("state IN (0, 2)")
                    ),
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, ",
                        patch_props!("?5"),
                        lock_cond!("state = 3")
                    ),
                ))
                .bind(lock.entity)
                .bind(lock.seq)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .execute(&mut self.conn)
                .await?
                .rows_affected();
                if r == 1 {
                    self.state.touched.insert(lock.entity);
                    if !dead && lock.delivery_count >= info.max_delivery_count {
                        sqlx::query(
                            "UPDATE courier_message SET state = 3, dl_reason = ?3, \
                             dl_description = 'the message was delivered ' || delivery_count || ' times without being settled', \
                             dl_source = ?4 WHERE entity_id = ?1 AND seq = ?2",
                        )
                        .bind(lock.entity)
                        .bind(lock.seq)
                        .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
                        .bind(&info.display)
                        .execute(&mut self.conn)
                        .await?;
                    }
                }
                r
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties,
            } => {
                if dead {
                    return invalid("dead-lettered again");
                }
                sqlx::query(concat!(
                    "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?5, dl_description = ?6, \
                     dl_source = ?7, ",
                    patch_props!("?8"),
                    lock_cond!("state IN (0, 2)")
                ))
                .bind(lock.entity)
                .bind(lock.seq)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(reason)
                .bind(description)
                .bind(&info.display)
                .bind(props_json(&properties))
                .execute(&mut self.conn)
                .await?
                .rows_affected()
            }
            Settlement::Defer { properties } => {
                if dead {
                    return invalid("deferred");
                }
                sqlx::query(concat!(
                    "UPDATE courier_message SET state = 2, locked_until = NULL, ",
                    patch_props!("?5"),
                    lock_cond!("state IN (0, 2)")
                ))
                .bind(lock.entity)
                .bind(lock.seq)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .execute(&mut self.conn)
                .await?
                .rows_affected()
            }
        };
        Ok(if rows == 1 {
            Ok(())
        } else {
            Err(Error::new(ErrorKind::LockLost))
        })
    }

    async fn renew(&mut self, lock: &LockRef, now: i64) -> Result<Result<DateTime<Utc>>, sqlx::Error> {
        if let Some(key) = &lock.session {
            // In a session, a message's lock is the session's lock.
            return Ok(match self.renew_session(lock.entity, key, now).await? {
                Ok(until) => Ok(until),
                Err(e) => Err(e),
            });
        }
        let info = match self.state.entity(lock.entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let until = now.saturating_add(info.lock_ms.saturating_mul(1000));
        let r = sqlx::query(
            "UPDATE courier_message SET locked_until = ?5 WHERE entity_id = ?1 AND seq = ?2 AND delivery_count = ?3 \
             AND locked_until IS NOT NULL AND locked_until > ?4",
        )
        .bind(lock.entity)
        .bind(lock.seq)
        .bind(lock.delivery_count)
        .bind(now)
        .bind(until)
        .execute(&mut self.conn)
        .await?;
        Ok(if r.rows_affected() == 1 {
            Ok(from_micros(until))
        } else {
            Err(Error::new(ErrorKind::LockLost))
        })
    }

    async fn renew_session(
        &mut self,
        entity: i64,
        key: &SessionKey,
        now: i64,
    ) -> Result<Result<DateTime<Utc>>, sqlx::Error> {
        let info = match self.state.entity(entity) {
            Ok(i) => i.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let until = now.saturating_add(info.lock_ms.saturating_mul(1000));
        let r = sqlx::query(
            "UPDATE courier_session SET locked_until = ?5 WHERE entity_id = ?1 AND session_id = ?2 AND lock_gen = ?3 \
             AND locked_until > ?4",
        )
        .bind(entity)
        .bind(&key.id)
        .bind(key.generation)
        .bind(now)
        .bind(until)
        .execute(&mut self.conn)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(Err(Error::new(ErrorKind::SessionLockLost)));
        }
        sqlx::query(
            "UPDATE courier_message SET locked_until = ?4 WHERE entity_id = ?1 AND session_id = ?2 \
             AND locked_until > ?3",
        )
        .bind(entity)
        .bind(&key.id)
        .bind(now)
        .bind(until)
        .execute(&mut self.conn)
        .await?;
        Ok(Ok(from_micros(until)))
    }

    async fn accept(&mut self, req: AcceptRequest, now: i64) -> Result<Option<Outcome>, sqlx::Error> {
        match self.try_accept(&req, now).await? {
            Some(r) => Ok(Some(outcome(req.reply, r))),
            None if req.deadline.is_some() => {
                self.park(req.entity, Waiter::Accept(req), now).await?;
                Ok(None)
            }
            None => Ok(Some(outcome(
                req.reply,
                Err(Error::new(ErrorKind::SessionNotAvailable {
                    reason: match &req.selector {
                        SessionSelector::Next => "no unlocked session has messages".into(),
                        SessionSelector::Named(s) => format!("session {s:?} is held by another receiver"),
                    },
                })),
            ))),
        }
    }

    /// Locks a session if one is available; `None` if none is (yet).
    async fn try_accept(
        &mut self,
        req: &AcceptRequest,
        now: i64,
    ) -> Result<Option<Result<(String, i64, DateTime<Utc>)>>, sqlx::Error> {
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
                .fetch_optional(&mut self.conn)
                .await?;
                if held.is_some() {
                    return Ok(None);
                }
                s.clone()
            }
            SessionSelector::Next => {
                let found: Option<String> = sqlx::query_scalar(
                    "SELECT m.session_id FROM courier_message m WHERE m.entity_id = ?1 AND m.state = 0 \
                     AND m.session_id IS NOT NULL AND (m.locked_until IS NULL OR m.locked_until <= ?2) \
                     AND NOT EXISTS (SELECT 1 FROM courier_session s WHERE s.entity_id = ?1 \
                         AND s.session_id = m.session_id AND s.locked_until > ?2) \
                     ORDER BY m.seq LIMIT 1",
                )
                .bind(req.entity)
                .bind(now)
                .fetch_optional(&mut self.conn)
                .await?;
                match found {
                    Some(s) => s,
                    None => return Ok(None),
                }
            }
        };
        let until = now.saturating_add(info.lock_ms.saturating_mul(1000));
        let generation: i64 = sqlx::query_scalar(
            "INSERT INTO courier_session (entity_id, session_id, locked_until, lock_gen) VALUES (?1, ?2, ?3, 1) \
             ON CONFLICT (entity_id, session_id) DO UPDATE SET locked_until = excluded.locked_until, \
             lock_gen = lock_gen + 1 RETURNING lock_gen",
        )
        .bind(req.entity)
        .bind(&session)
        .bind(until)
        .fetch_one(&mut self.conn)
        .await?;
        Ok(Some(Ok((session, generation, from_micros(until)))))
    }

    async fn session_op(
        &mut self,
        entity: i64,
        key: &SessionKey,
        op: SessionOp,
        now: i64,
    ) -> Result<Option<Outcome>, sqlx::Error> {
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
                let state: Option<Vec<u8>> = sqlx::query_scalar(
                    "SELECT state FROM courier_session WHERE entity_id = ?1 AND session_id = ?2",
                )
                .bind(entity)
                .bind(&key.id)
                .fetch_optional(&mut self.conn)
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
                    .execute(&mut self.conn)
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
                    .execute(&mut self.conn)
                    .await?;
                    // Messages still locked under the session go back, as if abandoned.
                    sqlx::query(
                        "UPDATE courier_message SET locked_until = NULL WHERE entity_id = ?1 AND session_id = ?2 \
                         AND locked_until > ?3",
                    )
                    .bind(entity)
                    .bind(&key.id)
                    .bind(now)
                    .execute(&mut self.conn)
                    .await?;
                    self.state.touched.insert(entity);
                }
                reply.map(|r| outcome(r, Ok(())))
            }
        })
    }

    async fn peek(
        &mut self,
        entity: i64,
        sub_queue: SubQueue,
        from: SequenceNumber,
        max: usize,
        now: i64,
    ) -> Result<Result<Vec<ReceivedMessage>>, sqlx::Error> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let sql: &'static str = match sub_queue {
            SubQueue::Main => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE entity_id = ?1 AND seq >= ?2 AND state IN (0, 1, 2) ORDER BY seq LIMIT ?3"
            ),
            SubQueue::DeadLetter => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE entity_id = ?1 AND seq >= ?2 AND state = 3 ORDER BY seq LIMIT ?3"
            ),
        };
        let rows = sqlx::query(sql)
        .bind(entity)
        .bind(from)
        .bind(i64::try_from(max.min(5000)).unwrap_or(5000))
        .fetch_all(&mut self.conn)
        .await?;
        Ok(self.state.rows_to_messages(&rows, now, false))
    }

    async fn counts(&mut self, entity: i64) -> Result<Result<EntityCounts>, sqlx::Error> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let rows = sqlx::query("SELECT state, COUNT(*) FROM courier_message WHERE entity_id = ?1 GROUP BY state")
            .bind(entity)
            .fetch_all(&mut self.conn)
            .await?;
        let mut c = EntityCounts::default();
        for row in rows {
            let state: i64 = row.try_get(0)?;
            let n: i64 = row.try_get(1)?;
            let n = u64::try_from(n).unwrap_or(0);
            match state {
                0 => c.active = n,
                1 => c.scheduled = n,
                2 => c.deferred = n,
                _ => c.dead_lettered = n,
            }
        }
        Ok(Ok(c))
    }
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The sender-set columns of a message, ready to insert.
struct RowCopy {
    session_id: Option<String>,
    message_id: String,
    correlation_id: Option<String>,
    causation_id: Option<String>,
    message_type: Option<String>,
    content_type: Option<String>,
    reply_to: Option<String>,
    properties: Option<String>,
    body: Bytes,
}

impl RowCopy {
    fn from_envelope(m: &Envelope) -> Self {
        Self {
            session_id: m.session_id.clone(),
            message_id: m.message_id.clone(),
            correlation_id: m.correlation_id.clone(),
            causation_id: m.causation_id.clone(),
            message_type: m.message_type.clone(),
            content_type: m.content_type.clone(),
            reply_to: m.reply_to.clone(),
            properties: props_json(&m.properties),
            body: m.body.clone(),
        }
    }

    /// From a row selected as `entity_id, COLUMNS`.
    fn from_row(row: &SqliteRow) -> Result<Self, sqlx::Error> {
        let body: Vec<u8> = row.try_get(11)?;
        Ok(Self {
            session_id: row.try_get(3)?,
            message_id: row.try_get(4)?,
            correlation_id: row.try_get(5)?,
            causation_id: row.try_get(6)?,
            message_type: row.try_get(7)?,
            content_type: row.try_get(8)?,
            reply_to: row.try_get(9)?,
            properties: row.try_get(10)?,
            body: Bytes::from(body),
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn insert(
        &self,
        conn: &mut SqliteConnection,
        entity: i64,
        seq: SequenceNumber,
        state: i64,
        ttl_ms: Option<i64>,
        now: i64,
        scheduled_at: Option<i64>,
        expires_at: Option<i64>,
    ) -> Sql {
        sqlx::query(
            "INSERT INTO courier_message (entity_id, seq, state, session_id, message_id, correlation_id, causation_id, \
             message_type, content_type, reply_to, properties, body, ttl_ms, enqueued_at, scheduled_at, expires_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
        )
        .bind(entity)
        .bind(seq)
        .bind(state)
        .bind(self.session_id.as_deref())
        .bind(&self.message_id)
        .bind(self.correlation_id.as_deref())
        .bind(self.causation_id.as_deref())
        .bind(self.message_type.as_deref())
        .bind(self.content_type.as_deref())
        .bind(self.reply_to.as_deref())
        .bind(self.properties.as_deref())
        .bind(&self.body[..])
        .bind(ttl_ms)
        .bind(now)
        .bind(scheduled_at)
        .bind(expires_at)
        .execute(conn)
        .await?;
        Ok(())
    }
}

async fn load_entities(conn: &mut SqliteConnection, state: &mut State) -> Sql {
    let rows = sqlx::query(
        "SELECT id, kind, parent, name, lock_duration_ms, max_delivery_count, default_ttl_ms, requires_session, \
         next_seq FROM courier_entity ORDER BY id",
    )
    .fetch_all(&mut *conn)
    .await?;
    state.entities.clear();
    state.by_name.clear();
    state.subscriptions.clear();
    let mut names: HashMap<i64, String> = HashMap::new();
    for row in rows {
        let id: i64 = row.try_get(0)?;
        let Some(kind) = Kind::from_i64(row.try_get(1)?) else {
            continue;
        };
        let parent: i64 = row.try_get(2)?;
        let name: String = row.try_get(3)?;
        let display = match names.get(&parent) {
            Some(t) if parent != 0 => format!("{t}/subscriptions/{name}"),
            _ => name.clone(),
        };
        names.insert(id, name.clone());
        state.entities.insert(
            id,
            EntityInfo {
                id,
                kind,
                parent,
                display,
                lock_ms: row.try_get(4)?,
                max_delivery_count: row.try_get(5)?,
                default_ttl_ms: row.try_get(6)?,
                requires_session: row.try_get(7)?,
                next_seq: row.try_get(8)?,
            },
        );
        state.by_name.insert((parent, name), id);
        if kind == Kind::Subscription {
            state.subscriptions.entry(parent).or_default().push(id);
        }
    }
    Ok(())
}

async fn refresh_due_times(conn: &mut SqliteConnection, state: &mut State) -> Sql {
    state.next_scheduled =
        sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
            .fetch_one(&mut *conn)
            .await?;
    state.next_expiry = sqlx::query_scalar::<_, Option<i64>>(
        "SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND state IN (0, 2)",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(())
}
