//! The embedded broker's engine: one task, on a thread of its own, that owns the SQLite
//! connection and serves every command.
//!
//! Commands that arrive together are served in ONE transaction (group commit), and within
//! it commands of one kind share statements: the sends of a batch are one multi-row
//! INSERT, its completes one DELETE, the receives of one queue one UPDATE. A hundred
//! concurrent sends cost one commit and a couple of statements, which is how pipelined
//! sends (S1.3) become cheap on a single-writer database. Replies are sent only after the
//! commit, so an acknowledged send is durable (S1.1). Receivers that find nothing wait
//! inside the engine and are served as soon as a send, an abandon, an activation or a lock
//! expiry makes a message ready: no polling interval.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock};

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
/// Batches of at least this many commands make the engine linger for the next one.
const LINGER_AFTER: usize = 4;
/// How long the engine lingers at most.
const LINGER: std::time::Duration = std::time::Duration::from_micros(150);
/// The most scheduled messages activated in one statement.
const ACTIVATION_BATCH: i64 = 1000;
/// The most messages one receive statement locks.
const MAX_RECEIVE: usize = 5000;
/// Row ids are `entity << SEQ_BITS | seq`.
const SEQ_BITS: u32 = 40;
/// Entity ids must stay below this so that row ids fit in an i64.
const MAX_ENTITY_ID: i64 = 1 << 22;

/// Message states as stored.
const READY: i64 = 0;
const SCHEDULED: i64 = 1;
const DEFERRED: i64 = 2;
const DEAD: i64 = 3;
const LOCKED: i64 = 4;

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
    parent: i64,
    name: String,
    /// `queue`, `topic` or `topic/subscriptions/name`, for errors and dead-letter sources.
    display: String,
    lock_ms: i64,
    max_delivery_count: i64,
    default_ttl_ms: Option<i64>,
    pub(crate) requires_session: bool,
    next_seq: i64,
}

/// A session lock as a session receiver holds it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct SessionKey {
    pub(crate) id: String,
    pub(crate) generation: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub(crate) id: i64,
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
    /// Finds a queue or topic to send to, or a queue or subscription to receive from.
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
    /// Lends the engine's connection to a store transaction (see [`Lease`]); served
    /// after the batch it came in, with nothing else running until it comes back.
    Lend {
        reply: Reply<Lease>,
    },
    /// Gives back locks `(row id, delivery count)` handed to a receive whose caller went
    /// away after they were sent: unlocked, their delivery not counted. No answer.
    Release {
        locks: Vec<(i64, i64)>,
    },
}

fn answer<T>(reply: Reply<T>, kind: &ErrorKind) {
    let _ = reply.send(Err(Error::new(kind.clone())));
}

impl Command {
    /// Answers the command with an error (the batch it was in failed, or the broker closed).
    fn fail(self, kind: &ErrorKind) {
        match self {
            Command::Create { reply, .. } | Command::Delete { reply, .. } | Command::Cancel { reply, .. } => {
                answer(reply, kind);
            }
            Command::Resolve { reply, .. } => answer(reply, kind),
            Command::Send { reply, .. } => {
                if let Some(reply) = reply {
                    answer(reply, kind);
                }
            }
            Command::Receive(r) => answer(r.reply, kind),
            Command::ReceiveDeferred { reply, .. } | Command::Peek { reply, .. } => answer(reply, kind),
            Command::Settle { reply, .. } => answer(reply, kind),
            Command::Renew { reply, .. } => answer(reply, kind),
            Command::Accept(a) => answer(a.reply, kind),
            Command::Session { op, .. } => match op {
                SessionOp::Renew(r) => answer(r, kind),
                SessionOp::GetState(r) => answer(r, kind),
                SessionOp::SetState(_, r) | SessionOp::Release(Some(r)) => answer(r, kind),
                SessionOp::Release(None) => {}
            },
            Command::Counts { reply, .. } => answer(reply, kind),
            Command::Lend { reply } => answer(reply, kind),
            // The locks expire as any lock does.
            Command::Release { .. } => {}
            Command::Close { reply } => {
                let _ = reply.send(());
            }
        }
    }
}

/// The engine's connection, lent out only to a store transaction.
struct Conn(Option<SqliteConnection>);

impl Conn {
    fn get(&mut self) -> Sql<&mut SqliteConnection> {
        self.0
            .as_mut()
            .ok_or_else(|| sqlx::Error::Protocol("the embedded broker's connection is lent out".into()))
    }

    async fn close(&mut self) -> Sql {
        match self.0.take() {
            Some(c) => c.close().await,
            None => Ok(()),
        }
    }
}

/// The engine's connection, lent to one store transaction: the inbox record, the user's
/// writes and, at [`Lease::finish`], the completion of the received message and the
/// messages sent all commit in ONE SQLite transaction. The engine does nothing else until
/// the lease comes back; dropping it gives the connection back and rolls back whatever it
/// began.
pub(crate) struct Lease {
    conn: Option<SqliteConnection>,
    back: Option<oneshot::Sender<Returned>>,
}

impl Lease {
    /// The lent connection (`None` only after it went back).
    pub(crate) fn conn(&mut self) -> Option<&mut SqliteConnection> {
        self.conn.as_mut()
    }

    /// Gives the connection back; with `finish`, the engine completes the lock and inserts
    /// the messages in the transaction the lease holder began, then commits it.
    pub(crate) fn give_back(mut self, finish: Option<Finish>) {
        if let (Some(conn), Some(back)) = (self.conn.take(), self.back.take()) {
            // Only fails when the engine is gone; the connection then closes with it.
            let _ = back.send(Returned { conn, finish });
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let (Some(conn), Some(back)) = (self.conn.take(), self.back.take()) {
            let _ = back.send(Returned { conn, finish: None });
        }
    }
}

struct Returned {
    conn: SqliteConnection,
    finish: Option<Finish>,
}

/// What ends a lease's transaction: the received message to complete, the messages to
/// send (destination, is a topic, messages), all or nothing.
pub(crate) struct Finish {
    /// `(entity, row id, delivery count)` of the lock to complete.
    pub(crate) complete: Option<(i64, i64, i64)>,
    pub(crate) sends: Vec<(String, bool, Vec<Envelope>)>,
    /// The broker's largest message (the sender's checks apply).
    pub(crate) max_message_size: usize,
    pub(crate) reply: Reply<()>,
}

/// Sends a reply: the result, or the error of a transaction that failed.
type Answer = Box<dyn FnOnce(Option<&ErrorKind>) + Send>;

/// One send command: entity, messages, and where the sequence numbers go (none for a
/// pre-settled send).
type SendCommand = (i64, Vec<Envelope>, Option<Reply<Vec<SequenceNumber>>>);

/// An answer held back until the transaction commits.
enum Outcome {
    Reply(Answer),
    /// Messages locked for a receiver: if it has gone, the locks are released.
    Received {
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
    fn fail(self, make: impl Fn() -> Error) {
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

/// The engine's state, apart from the connection.
struct State {
    clock: Arc<dyn Clock>,
    epoch: u32,
    entities: HashMap<i64, EntityInfo>,
    by_name: HashMap<(i64, String), i64>,
    subscriptions: HashMap<i64, Vec<i64>>,
    dirty_seq: HashSet<i64>,
    waiters: HashMap<i64, VecDeque<Waiter>>,
    touched: HashSet<i64>,
    /// Clock times (µs) at which something is due: a scheduled message, a lock or a
    /// session lock expiring, a time-to-live running out.
    next_scheduled: Option<i64>,
    next_unlock: Option<i64>,
    next_session_unlock: Option<i64>,
    next_expiry: Option<i64>,
    /// Locks handed to receivers that had gone: `(row id, delivery count)`.
    releases: Vec<(i64, i64)>,
}

pub(crate) struct Engine {
    conn: Conn,
    state: State,
    /// Held while the engine runs (the file's lock, the checkpointer's stop signal).
    guards: Vec<Box<dyn std::any::Any + Send>>,
}

type Sql<T = ()> = Result<T, sqlx::Error>;

fn storage(e: &sqlx::Error) -> ErrorKind {
    let transient = match e {
        sqlx::Error::Database(db) => {
            // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_IOERR, SQLITE_FULL and their extended codes.
            let primary = db.code().and_then(|c| c.parse::<i64>().ok()).map(|c| c & 0xff);
            matches!(primary, Some(5 | 6 | 10 | 13))
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

fn row_id(entity: i64, seq: SequenceNumber) -> i64 {
    (entity << SEQ_BITS) | seq
}

fn entity_of(id: i64) -> i64 {
    id >> SEQ_BITS
}

fn min_opt(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn after_ms(now: i64, ms: i64) -> i64 {
    now.saturating_add(ms.saturating_mul(1000))
}

/// Lock tokens: 32 bits of broker epoch, 32 bits of delivery count, 64 bits of row id. The
/// delivery count rises with every lock, so a token names one lock.
fn make_token(epoch: u32, id: i64, delivery_count: i64) -> LockToken {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&epoch.to_be_bytes());
    b[4..8].copy_from_slice(&u32::try_from(delivery_count).unwrap_or(u32::MAX).to_be_bytes());
    b[8..16].copy_from_slice(&id.to_be_bytes());
    LockToken::from_uuid(Uuid::from_bytes(b))
}

/// `(entity, row id, delivery count)` of a token this broker issued.
pub(crate) fn read_token(epoch: u32, token: LockToken) -> Option<(i64, i64, i64)> {
    let b = token.as_uuid().into_bytes();
    let (e, rest) = b.split_at(4);
    let (dc, id) = rest.split_at(4);
    if u32::from_be_bytes(e.try_into().ok()?) != epoch {
        return None;
    }
    let id = i64::from_be_bytes(id.try_into().ok()?);
    let dc = i64::from(u32::from_be_bytes(dc.try_into().ok()?));
    Some((entity_of(id), id, dc))
}

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

/// Columns written by an insert, in order.
const INSERT_COLUMNS: usize = 19;

/// `INSERT` statements for 256, 128, 64, 32 and 16 down to 1 rows: the sends of a batch go
/// in as few statements as these sizes allow (one for up to 16 rows), each size prepared
/// once and kept in the connection's statement cache.
static INSERTS: LazyLock<[(usize, String); 20]> = LazyLock::new(|| {
    let sizes: [usize; 20] = [256, 128, 64, 32, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1];
    sizes.map(|rows| {
        let mut sql = String::from(
            "INSERT INTO courier_message (id, entity_id, seq, state, session_id, enqueued_at, scheduled_at, \
             expires_at, ttl_ms, message_id, correlation_id, causation_id, message_type, content_type, reply_to, \
             properties, dl_reason, dl_source, body) VALUES ",
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

fn lock_lost() -> Error {
    Error::new(ErrorKind::LockLost)
}

/// A message row to insert.
struct NewRow {
    id: i64,
    entity: i64,
    seq: SequenceNumber,
    state: i64,
    enqueued_at: i64,
    scheduled_at: Option<i64>,
    expires_at: Option<i64>,
    ttl_ms: Option<i64>,
    /// For a copy that is dead-lettered on arrival (a session subscription, no session id).
    dead: Option<String>,
    fields: Arc<Fields>,
}

/// The sender-set fields of a message, shared by its copies.
struct Fields {
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

impl Fields {
    fn from_envelope(m: Envelope) -> Self {
        Self {
            properties: props_json(&m.properties),
            session_id: m.session_id,
            message_id: m.message_id,
            correlation_id: m.correlation_id,
            causation_id: m.causation_id,
            message_type: m.message_type,
            content_type: m.content_type,
            reply_to: m.reply_to,
            body: m.body,
        }
    }

    fn from_message(m: ReceivedMessage) -> Self {
        Self::from_envelope(m.envelope)
    }
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
        let get = |e: sqlx::Error| corrupt(e.to_string());
        let id: i64 = row.try_get(0).map_err(get)?;
        let seq: i64 = row.try_get(1).map_err(get)?;
        let state = match row.try_get::<i64, _>(2).map_err(get)? {
            READY | LOCKED => MessageState::Active,
            SCHEDULED => MessageState::Scheduled,
            DEFERRED => MessageState::Deferred,
            DEAD => MessageState::DeadLettered,
            other => return Err(corrupt(format!("message {seq} has unknown state {other}"))),
        };
        let delivery_count: i64 = row.try_get(3).map_err(get)?;
        let locked_until: Option<i64> = row.try_get::<Option<i64>, _>(4).map_err(get)?.filter(|t| *t > now);
        let ttl_ms: Option<i64> = row.try_get(9).map_err(get)?;
        let properties = match row.try_get::<Option<String>, _>(16).map_err(get)? {
            Some(json) => serde_json::from_str::<Properties>(&json)
                .map_err(|e| corrupt(format!("properties of message {seq}: {e}")))?,
            None => Properties::new(),
        };
        let body: Vec<u8> = row.try_get(20).map_err(get)?;
        let envelope = Envelope {
            message_id: row.try_get(10).map_err(get)?,
            correlation_id: row.try_get(11).map_err(get)?,
            causation_id: row.try_get(12).map_err(get)?,
            message_type: row.try_get(13).map_err(get)?,
            content_type: row.try_get(14).map_err(get)?,
            body: Bytes::from(body),
            properties,
            session_id: row.try_get(5).map_err(get)?,
            reply_to: row.try_get(15).map_err(get)?,
            time_to_live: ttl_ms.map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            scheduled_enqueue_time: row.try_get::<Option<i64>, _>(7).map_err(get)?.map(from_micros),
        };
        let broker = BrokerProperties {
            sequence_number: seq,
            enqueued_time: from_micros(row.try_get(6).map_err(get)?),
            delivery_count: u32::try_from(delivery_count).unwrap_or(u32::MAX),
            lock_token: locked.then(|| make_token(self.epoch, id, delivery_count)),
            locked_until: locked_until.map(from_micros),
            state,
            expires_at: row.try_get::<Option<i64>, _>(8).map_err(get)?.map(from_micros),
            dead_letter_reason: row.try_get(17).map_err(get)?,
            dead_letter_description: row.try_get(18).map_err(get)?,
            dead_letter_source: row.try_get(19).map_err(get)?,
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
        let info = self
            .entities
            .get_mut(&entity)
            .ok_or_else(|| corrupt("sequence of unknown entity"))?;
        let first = info.next_seq;
        if first + n >= 1 << SEQ_BITS {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{} has used up its sequence numbers", info.display),
            }));
        }
        info.next_seq += n;
        self.dirty_seq.insert(entity);
        Ok(first)
    }

    fn note(slot: &mut Option<i64>, at: Option<i64>) {
        if let Some(at) = at {
            *slot = Some(slot.map_or(at, |n| n.min(at)));
        }
    }

    /// The rows for one message sent to `entity` (a queue, or a topic's subscriptions).
    fn rows_for(&self, info: &EntityInfo, seq: SequenceNumber, msg: Envelope, now: i64, out: &mut Vec<NewRow>) {
        let scheduled = msg.scheduled_enqueue_time.map(micros).filter(|t| *t > now);
        let msg_ttl = msg
            .time_to_live
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let ttl = min_opt(msg_ttl, info.default_ttl_ms);
        let fields = Arc::new(Fields::from_envelope(msg));
        if scheduled.is_some() || info.kind != Kind::Topic {
            // A queue's message, or a topic's scheduled message (fanned out on activation).
            out.push(NewRow {
                id: row_id(info.id, seq),
                entity: info.id,
                seq,
                state: if scheduled.is_some() { SCHEDULED } else { READY },
                enqueued_at: now,
                scheduled_at: scheduled,
                expires_at: if scheduled.is_some() {
                    None
                } else {
                    ttl.map(|ms| after_ms(now, ms))
                },
                ttl_ms: ttl,
                dead: None,
                fields,
            });
            return;
        }
        self.fan_out(info.id, seq, ttl, None, &fields, now, out);
    }

    /// Copies of a topic message for each subscription.
    #[allow(clippy::too_many_arguments)]
    fn fan_out(
        &self,
        topic: i64,
        seq: SequenceNumber,
        ttl: Option<i64>,
        scheduled_at: Option<i64>,
        fields: &Arc<Fields>,
        now: i64,
        out: &mut Vec<NewRow>,
    ) {
        for sub in self.subscriptions.get(&topic).into_iter().flatten() {
            let Some(s) = self.entities.get(sub) else { continue };
            let ttl = min_opt(ttl, s.default_ttl_ms);
            let dead = (s.requires_session && fields.session_id.is_none()).then(|| s.display.clone());
            out.push(NewRow {
                id: row_id(s.id, seq),
                entity: s.id,
                seq,
                state: if dead.is_some() { DEAD } else { READY },
                enqueued_at: now,
                scheduled_at,
                expires_at: ttl.map(|ms| after_ms(now, ms)),
                ttl_ms: ttl,
                dead,
                fields: fields.clone(),
            });
        }
    }
}

impl Engine {
    pub(crate) async fn start(mut conn: SqliteConnection, clock: Arc<dyn Clock>, epoch: u32) -> Result<Self> {
        // Locks are volatile (S2.7): whatever a previous process held is released, and its
        // locked messages are ready again with their delivery count kept.
        for sql in [
            "UPDATE courier_message SET state = 0, locked_until = NULL WHERE state = 4",
            "UPDATE courier_message SET locked_until = NULL WHERE locked_until IS NOT NULL",
            "UPDATE courier_session SET locked_until = NULL WHERE locked_until IS NOT NULL",
        ] {
            sqlx::query(sql).execute(&mut conn).await.map_err(storage_error)?;
        }
        let mut state = State {
            clock,
            epoch,
            entities: HashMap::new(),
            by_name: HashMap::new(),
            subscriptions: HashMap::new(),
            dirty_seq: HashSet::new(),
            waiters: HashMap::new(),
            touched: HashSet::new(),
            next_scheduled: None,
            next_unlock: None,
            next_session_unlock: None,
            next_expiry: None,
            releases: Vec::new(),
        };
        load_entities(&mut conn, &mut state).await.map_err(storage_error)?;
        refresh_due_times(&mut conn, &mut state).await.map_err(storage_error)?;
        Ok(Self {
            conn: Conn(Some(conn)),
            state,
            guards: Vec::new(),
        })
    }

    /// Keeps `guard` alive until the engine has closed its connection.
    pub(crate) fn keep(&mut self, guard: Box<dyn std::any::Any + Send>) {
        self.guards.push(guard);
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        let mut batch: Vec<Command> = Vec::with_capacity(MAX_BATCH);
        let mut last_batch = 0;
        loop {
            let wake_clock = self.next_clock_wake();
            let wake_real = self.next_waiter_deadline();
            let clock_sleep = wake_clock.map(|t| self.state.clock.sleep_until(from_micros(t)));
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    Some(c) => batch.push(c),
                    None => break,
                },
                () = async {
                    match clock_sleep { Some(s) => s.await, None => std::future::pending().await }
                } => {}
                () = async {
                    match wake_real { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await }
                } => {}
            }
            self.gather(&mut rx, &mut batch, last_batch);
            last_batch = batch.len();
            let close = batch
                .iter()
                .position(|c| matches!(c, Command::Close { .. }))
                .map(|i| batch.split_off(i));
            let lends: Vec<Reply<Lease>> = batch
                .extract_if(.., |c| matches!(c, Command::Lend { .. }))
                .filter_map(|c| match c {
                    Command::Lend { reply } => Some(reply),
                    _ => None,
                })
                .collect();
            self.process(std::mem::take(&mut batch)).await;
            for reply in lends {
                self.lend(reply).await;
            }
            if let Some(rest) = close {
                self.shut_down(rest, &mut rx).await;
                return;
            }
        }
        self.shut_down(Vec::new(), &mut rx).await;
    }

    /// Takes what else is waiting. When the last batch showed concurrent callers, lingers
    /// a little for more: their commands are on their way, and one commit for all of them
    /// costs far less than one each (group commit).
    fn gather(&self, rx: &mut mpsc::Receiver<Command>, batch: &mut Vec<Command>, last_batch: usize) {
        let linger = if last_batch >= LINGER_AFTER {
            LINGER
        } else {
            std::time::Duration::ZERO
        };
        let start = std::time::Instant::now();
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(_) if start.elapsed() < linger && batch.len() < last_batch => std::thread::yield_now(),
                Err(_) => break,
            }
        }
    }

    async fn shut_down(mut self, rest: Vec<Command>, rx: &mut mpsc::Receiver<Command>) {
        rx.close();
        let closed = ErrorKind::Closed;
        for (_, waiters) in self.state.waiters.drain() {
            for w in waiters {
                w.fail(|| Error::new(closed.clone()));
            }
        }
        let mut close_replies = Vec::new();
        let mut rest = rest.into_iter().collect::<VecDeque<_>>();
        while let Ok(cmd) = rx.try_recv() {
            rest.push_back(cmd);
        }
        for cmd in rest {
            match cmd {
                Command::Close { reply } => close_replies.push(reply),
                other => other.fail(&closed),
            }
        }
        if let Err(e) = self.conn.close().await {
            tracing::warn!(error = %e, "closing the embedded broker's database failed");
        }
        self.guards.clear();
        for r in close_replies {
            let _ = r.send(());
        }
    }

    fn next_clock_wake(&self) -> Option<i64> {
        let s = &self.state;
        [s.next_scheduled, s.next_unlock, s.next_session_unlock, s.next_expiry]
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
        let mut pending: VecDeque<Command> = VecDeque::with_capacity(batch.len());
        for cmd in batch {
            // Given back first (by `maintenance`), so the receives of this batch find them.
            match cmd {
                Command::Release { locks } => self.state.releases.extend(locks),
                other => pending.push_back(other),
            }
        }
        let result: Sql = async {
            sqlx::query("BEGIN IMMEDIATE").execute(self.conn.get()?).await?;
            let now = self.state.now();
            self.maintenance(now).await?;
            // Commands of one kind share statements: sends, completes and receives are
            // gathered and served together after the others, in arrival order.
            let mut sends = Vec::new();
            let mut completes = Vec::new();
            let mut receives = Vec::new();
            while let Some(cmd) = pending.pop_front() {
                match cmd {
                    Command::Send {
                        entity,
                        messages,
                        reply,
                    } => sends.push((entity, messages, reply)),
                    Command::Settle {
                        lock,
                        settlement: Settlement::Complete,
                        reply,
                    } if lock.sub_queue == SubQueue::Main && lock.session.is_none() => completes.push((lock, reply)),
                    Command::Receive(r) => receives.push(r),
                    other => {
                        if let Some(o) = self.handle(other, now).await? {
                            outcomes.push(o);
                        }
                    }
                }
            }
            self.send_all(sends, now, &mut outcomes).await?;
            self.complete_all(completes, now, &mut outcomes).await?;
            self.receive_all(receives, now, &mut outcomes).await?;
            self.serve_waiters(now, &mut outcomes).await?;
            self.flush_sequences().await?;
            sqlx::query("COMMIT").execute(self.conn.get()?).await?;
            Ok(())
        }
        .await;
        match result {
            Ok(()) => self.deliver(outcomes),
            Err(e) => {
                let kind = storage(&e);
                tracing::error!(error = %e, "embedded broker transaction failed; its commands are answered with an error");
                if let Ok(c) = self.conn.get() {
                    let _ = sqlx::query("ROLLBACK").execute(c).await;
                }
                for o in outcomes {
                    match o {
                        Outcome::Reply(f) => f(Some(&kind)),
                        Outcome::Received { reply, .. } => answer(reply, &kind),
                    }
                }
                for cmd in pending {
                    cmd.fail(&kind);
                }
                self.after_rollback().await;
            }
        }
        self.expire_waiters();
    }

    /// Sends the answers of a committed transaction.
    fn deliver(&mut self, outcomes: Vec<Outcome>) {
        for o in outcomes {
            match o {
                Outcome::Reply(f) => f(None),
                Outcome::Received {
                    locked,
                    reply,
                    messages,
                } => {
                    if let Err(Ok(messages)) = reply.send(Ok(messages))
                        && locked
                    {
                        // The receiver went away: give the messages back.
                        for m in messages {
                            if let Some((_, id, dc)) = m.broker.lock_token.and_then(|t| read_token(self.state.epoch, t))
                            {
                                self.state.releases.push((id, dc));
                            }
                        }
                    }
                }
            }
        }
    }

    /// Forgets what a rolled back transaction changed in memory: the cache may hold
    /// entities or sequence numbers of the rolled back work.
    async fn after_rollback(&mut self) {
        self.state.dirty_seq.clear();
        self.state.touched.clear();
        let Ok(conn) = self.conn.get() else { return };
        if let Err(e) = load_entities(conn, &mut self.state).await {
            tracing::error!(error = %e, "reloading the embedded broker's entities failed");
        }
        if let Err(e) = refresh_due_times(conn, &mut self.state).await {
            tracing::error!(error = %e, "reloading the embedded broker's timers failed");
        }
    }

    /// Lends the connection to a store transaction and waits for it to come back, then
    /// finishes (or rolls back) that transaction.
    async fn lend(&mut self, reply: Reply<Lease>) {
        if reply.is_closed() {
            return;
        }
        let Some(conn) = self.conn.0.take() else {
            answer(
                reply,
                &ErrorKind::Storage {
                    detail: "the embedded broker's connection is lent out".into(),
                    transient: true,
                },
            );
            return;
        };
        let (back, returned) = oneshot::channel();
        let lease = Lease {
            conn: Some(conn),
            back: Some(back),
        };
        // A requester that went away drops the lease, which sends the connection back.
        let _ = reply.send(Ok(lease));
        match returned.await {
            Ok(Returned { conn, finish }) => {
                self.conn.0 = Some(conn);
                match finish {
                    Some(f) => self.finish(f).await,
                    None => {
                        // The holder may have begun a transaction: roll it back (an error
                        // only says there was none).
                        if let Ok(c) = self.conn.get()
                            && let Err(e) = sqlx::query("ROLLBACK").execute(c).await
                        {
                            tracing::trace!(error = %e, "no transaction to roll back after a lease");
                        }
                    }
                }
            }
            Err(_) => {
                tracing::error!("a lease of the embedded broker's connection was lost; the broker stops serving");
            }
        }
    }

    /// Ends a lease's transaction: completes its lock and inserts its messages, then
    /// commits; anything failing rolls the whole transaction back (the holder's writes too).
    async fn finish(&mut self, f: Finish) {
        let now = self.state.now();
        let mut outcomes = Vec::new();
        let Finish {
            complete,
            sends,
            max_message_size,
            reply,
        } = f;
        let result: Sql<Result<()>> = async {
            if let Some((_, id, dc)) = complete {
                let done = sqlx::query(
                    "DELETE FROM courier_message WHERE id = ?1 AND delivery_count = ?2 AND state IN (2, 4) \
                     AND locked_until > ?3",
                )
                .bind(id)
                .bind(dc)
                .bind(now)
                .execute(self.conn.get()?)
                .await?;
                if done.rows_affected() != 1 {
                    return Ok(Err(lock_lost()));
                }
            }
            let mut rows = Vec::new();
            for (destination, is_topic, messages) in sends {
                let entity = match self.state.by_name.get(&(0, destination.clone())).copied() {
                    Some(id) => id,
                    None if is_topic => {
                        let options = QueueOptions::default();
                        if let Err(e) = self
                            .create(Kind::Topic, None, destination.clone(), &options, now)
                            .await?
                        {
                            return Ok(Err(e));
                        }
                        match self.state.by_name.get(&(0, destination.clone())).copied() {
                            Some(id) => id,
                            None => return Ok(Err(Self::not_found(&EntityPath::queue(&destination)))),
                        }
                    }
                    None => return Ok(Err(Self::not_found(&EntityPath::queue(&destination)))),
                };
                let info = match self.state.entity(entity) {
                    Ok(i) => i,
                    Err(e) => return Ok(Err(e)),
                };
                if info.kind == Kind::Subscription {
                    return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                        reason: format!("{destination} is a subscription: send to its topic"),
                    })));
                }
                let requires_session = info.requires_session;
                if let Some(e) = messages.iter().find_map(|m| {
                    super::check_envelope(max_message_size, m, &destination, requires_session, from_micros(now)).err()
                }) {
                    return Ok(Err(e));
                }
                if let Err(e) = self.rows_for_send(entity, messages, now, &mut rows) {
                    return Ok(Err(e));
                }
            }
            self.insert_rows(&rows).await?;
            self.serve_waiters(now, &mut outcomes).await?;
            self.flush_sequences().await?;
            sqlx::query("COMMIT").execute(self.conn.get()?).await?;
            Ok(Ok(()))
        }
        .await;
        match result {
            Ok(Ok(())) => {
                self.deliver(outcomes);
                let _ = reply.send(Ok(()));
            }
            Ok(Err(e)) => {
                self.rollback_lease().await;
                let _ = reply.send(Err(e));
            }
            Err(e) => {
                tracing::error!(error = %e, "a store transaction on the embedded broker's file failed");
                self.rollback_lease().await;
                let _ = reply.send(Err(storage_error(e)));
            }
        }
        self.expire_waiters();
    }

    async fn rollback_lease(&mut self) {
        if let Ok(c) = self.conn.get()
            && let Err(e) = sqlx::query("ROLLBACK").execute(c).await
        {
            tracing::warn!(error = %e, "rolling back a store transaction on the embedded broker's file failed");
        }
        self.after_rollback().await;
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
    }

    async fn flush_sequences(&mut self) -> Sql {
        for id in std::mem::take(&mut self.state.dirty_seq) {
            if let Some(info) = self.state.entities.get(&id) {
                sqlx::query("UPDATE courier_entity SET next_seq = ?1 WHERE id = ?2")
                    .bind(info.next_seq)
                    .bind(id)
                    .execute(self.conn.get()?)
                    .await?;
            }
        }
        Ok(())
    }

    /// Gives back locks of receivers that went away, activates due scheduled messages,
    /// releases expired locks (dead-lettering messages past their max delivery count),
    /// dead-letters expired messages, and wakes waiters whose sessions may be free.
    async fn maintenance(&mut self, now: i64) -> Sql {
        for (id, dc) in std::mem::take(&mut self.state.releases) {
            let r = sqlx::query(
                "UPDATE courier_message SET state = 0, locked_until = NULL, delivery_count = delivery_count - 1 \
                 WHERE id = ?1 AND delivery_count = ?2 AND state = 4",
            )
            .bind(id)
            .bind(dc)
            .execute(self.conn.get()?)
            .await?;
            if r.rows_affected() == 0 {
                // A deferred or dead-lettered message keeps its state; only unlock it.
                sqlx::query(
                    "UPDATE courier_message SET locked_until = NULL, delivery_count = delivery_count - 1 \
                     WHERE id = ?1 AND delivery_count = ?2 AND state IN (2, 3) AND locked_until IS NOT NULL",
                )
                .bind(id)
                .bind(dc)
                .execute(self.conn.get()?)
                .await?;
            }
            self.state.touched.insert(entity_of(id));
        }
        if self.state.next_scheduled.is_some_and(|t| t <= now) {
            self.activate(now).await?;
        }
        if self.state.next_unlock.is_some_and(|t| t <= now) {
            self.unlock_expired(now).await?;
        }
        if self.state.next_expiry.is_some_and(|t| t <= now) {
            self.sweep_expired(now).await?;
        }
        if self.state.next_session_unlock.is_some_and(|t| t <= now) {
            let waiting: Vec<i64> = self.state.waiters.keys().copied().collect();
            self.state.touched.extend(waiting);
            self.state.next_session_unlock = sqlx::query_scalar::<_, Option<i64>>(
                "SELECT MIN(locked_until) FROM courier_session WHERE locked_until > ?1",
            )
            .bind(now)
            .fetch_one(self.conn.get()?)
            .await?;
        }
        Ok(())
    }

    async fn activate(&mut self, now: i64) -> Sql {
        loop {
            let rows = sqlx::query(concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE state = 1 AND scheduled_at <= ?1 ORDER BY scheduled_at, id LIMIT ?2"
            ))
            .bind(now)
            .bind(ACTIVATION_BATCH)
            .fetch_all(self.conn.get()?)
            .await?;
            let n = rows.len();
            let mut new_rows = Vec::new();
            for row in rows {
                let old_id: i64 = row.try_get(0)?;
                let entity = entity_of(old_id);
                sqlx::query("DELETE FROM courier_message WHERE id = ?1")
                    .bind(old_id)
                    .execute(self.conn.get()?)
                    .await?;
                let Some(info) = self.state.entities.get(&entity).cloned() else {
                    continue;
                };
                let message = match self.state.row_to_message(&row, now, false) {
                    Ok(m) => m,
                    Err(_) => {
                        tracing::error!(entity = %info.display, "an unreadable scheduled message was dropped");
                        continue;
                    }
                };
                let scheduled_at = message.envelope.scheduled_enqueue_time.map(micros);
                let ttl = message
                    .envelope
                    .time_to_live
                    .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
                let Ok(seq) = self.state.alloc_seq(entity, 1) else {
                    continue;
                };
                // Enqueued as if sent now: a new sequence number and enqueued time (S5.4).
                let fields = Arc::new(Fields::from_message(message));
                if info.kind == Kind::Topic {
                    self.state
                        .fan_out(entity, seq, ttl, scheduled_at, &fields, now, &mut new_rows);
                } else {
                    new_rows.push(NewRow {
                        id: row_id(entity, seq),
                        entity,
                        seq,
                        state: READY,
                        enqueued_at: now,
                        scheduled_at,
                        expires_at: ttl.map(|ms| after_ms(now, ms)),
                        ttl_ms: ttl,
                        dead: None,
                        fields,
                    });
                }
            }
            self.insert_rows(&new_rows).await?;
            if (n as i64) < ACTIVATION_BATCH {
                break;
            }
        }
        self.state.next_scheduled =
            sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
                .fetch_one(self.conn.get()?)
                .await?;
        Ok(())
    }

    /// Expired locks: a locked message is ready again (S2.5), or dead-lettered if it has
    /// been delivered as often as its queue allows (S2.6); a deferred or dead-lettered one
    /// stays where it is, unlocked. Waiters of those entities are served.
    async fn unlock_expired(&mut self, now: i64) -> Sql {
        let rows = sqlx::query(
            "WITH e AS (SELECT id, name, max_delivery_count AS max FROM courier_entity) \
             UPDATE courier_message SET locked_until = NULL, \
             state = CASE WHEN state <> 4 THEN state \
                 WHEN delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) THEN 3 ELSE 0 END, \
             dl_reason = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN ?2 ELSE dl_reason END, \
             dl_description = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN 'the message was delivered ' || delivery_count || ' times without being settled' \
                 ELSE dl_description END, \
             dl_source = CASE WHEN state = 4 AND delivery_count >= (SELECT max FROM e WHERE e.id = entity_id) \
                 THEN (SELECT name FROM e WHERE e.id = entity_id) ELSE dl_source END \
             WHERE locked_until IS NOT NULL AND locked_until <= ?1 RETURNING entity_id",
        )
        .bind(now)
        .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        .fetch_all(self.conn.get()?)
        .await?;
        for row in rows {
            self.state.touched.insert(row.try_get(0)?);
        }
        self.state.next_unlock = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(locked_until) FROM courier_message WHERE locked_until IS NOT NULL",
        )
        .fetch_one(self.conn.get()?)
        .await?;
        Ok(())
    }

    async fn sweep_expired(&mut self, now: i64) -> Sql {
        let moved = sqlx::query(
            "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?2, \
             dl_description = 'the message expired before it was received', \
             dl_source = (SELECT name FROM courier_entity e WHERE e.id = entity_id) \
             WHERE state IN (0, 2) AND expires_at IS NOT NULL AND expires_at <= ?1 \
             AND (locked_until IS NULL OR locked_until <= ?1) RETURNING entity_id",
        )
        .bind(now)
        .bind(reasons::TTL_EXPIRED)
        .fetch_all(self.conn.get()?)
        .await?;
        if !moved.is_empty() {
            tracing::info!(count = moved.len(), "dead-lettered expired messages");
        }
        for row in moved {
            // Receivers of the dead-letter sub-queue may be waiting.
            self.state.touched.insert(row.try_get(0)?);
        }
        self.state.next_expiry = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND expires_at > ?1 \
             AND state IN (0, 2)",
        )
        .bind(now)
        .fetch_one(self.conn.get()?)
        .await?;
        Ok(())
    }

    async fn handle(&mut self, cmd: Command, now: i64) -> Sql<Option<Outcome>> {
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
            Command::Send {
                entity,
                messages,
                reply,
            } => {
                let mut outcomes = Vec::new();
                self.send_all(vec![(entity, messages, reply)], now, &mut outcomes)
                    .await?;
                return Ok(outcomes.pop());
            }
            Command::Cancel { entity, seq, reply } => {
                let r = self.cancel(entity, seq).await?;
                outcome(reply, r)
            }
            Command::Receive(req) => {
                let mut outcomes = Vec::new();
                self.receive_all(vec![req], now, &mut outcomes).await?;
                return Ok(outcomes.pop());
            }
            Command::ReceiveDeferred {
                entity,
                seqs,
                session,
                reply,
            } => match self.receive_deferred(entity, &seqs, session.as_ref(), now).await? {
                Ok(messages) => Outcome::Received {
                    locked: true,
                    reply,
                    messages,
                },
                Err(e) => outcome(reply, Err(e)),
            },
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
            Command::Release { locks } => {
                // `process` takes these out of the batch; here only for completeness.
                self.state.releases.extend(locks);
                return Ok(None);
            }
            Command::Lend { reply } => {
                // `run` takes leases out of the batch before it is processed.
                answer(
                    reply,
                    &ErrorKind::Storage {
                        detail: "a lease cannot be served inside a batch".into(),
                        transient: true,
                    },
                );
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
    ) -> Sql<Result<()>> {
        let parent = match &topic {
            Some(t) => match self.state.by_name.get(&(0, t.clone())) {
                Some(id) if self.state.entities.get(id).is_some_and(|e| e.kind == Kind::Topic) => *id,
                _ => return Ok(Err(Error::new(ErrorKind::EntityNotFound { path: t.clone() }))),
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
        .fetch_one(self.conn.get()?)
        .await?;
        if id >= MAX_ENTITY_ID {
            return Ok(Err(Error::new(ErrorKind::InvalidOperation {
                reason: "the broker has run out of entity ids".into(),
            })));
        }
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
                name: name.clone(),
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
        if for_send && info.kind == Kind::Subscription {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{path} is a subscription: send to its topic"),
            }));
        }
        Ok(Arc::new(info.clone()))
    }

    async fn delete(&mut self, path: &EntityPath) -> Sql<Result<()>> {
        let Some(id) = self.lookup(path) else {
            return Ok(Err(Self::not_found(path)));
        };
        let mut ids = vec![id];
        ids.extend(self.state.subscriptions.remove(&id).unwrap_or_default());
        for e in &ids {
            sqlx::query("DELETE FROM courier_message WHERE id >= ?1 AND id < ?2")
                .bind(row_id(*e, 0))
                .bind(row_id(*e + 1, 0))
                .execute(self.conn.get()?)
                .await?;
            for q in [
                "DELETE FROM courier_session WHERE entity_id = ?1",
                "DELETE FROM courier_entity WHERE id = ?1",
            ] {
                sqlx::query(q).bind(e).execute(self.conn.get()?).await?;
            }
            if let Some(info) = self.state.entities.remove(e) {
                self.state.by_name.remove(&(info.parent, info.name));
                if let Some(subs) = self.state.subscriptions.get_mut(&info.parent) {
                    subs.retain(|s| s != e);
                }
            }
            for w in self.state.waiters.remove(e).unwrap_or_default() {
                w.fail(|| Self::not_found(path));
            }
        }
        Ok(Ok(()))
    }

    /// Serves the sends of a batch with as few INSERT statements as possible.
    async fn send_all(&mut self, sends: Vec<SendCommand>, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
        if sends.is_empty() {
            return Ok(());
        }
        let mut rows = Vec::new();
        for (entity, messages, reply) in sends {
            let result = self.rows_for_send(entity, messages, now, &mut rows);
            match reply {
                Some(reply) => outcomes.push(outcome(reply, result)),
                None => {
                    if let Err(e) = result {
                        tracing::warn!(error = %e, "a pre-settled send failed; its sender is not told (S1.5)");
                    }
                }
            }
        }
        self.insert_rows(&rows).await
    }

    fn rows_for_send(
        &mut self,
        entity: i64,
        messages: Vec<Envelope>,
        now: i64,
        rows: &mut Vec<NewRow>,
    ) -> Result<Vec<SequenceNumber>> {
        let info = self.state.entity(entity)?.clone();
        let first = self.state.alloc_seq(entity, messages.len() as i64)?;
        let seqs: Vec<SequenceNumber> = (first..first + messages.len() as i64).collect();
        for (seq, msg) in seqs.iter().zip(messages) {
            self.state.rows_for(&info, *seq, msg, now, rows);
        }
        Ok(seqs)
    }

    async fn insert_rows(&mut self, rows: &[NewRow]) -> Sql {
        let mut rest = rows;
        while !rest.is_empty() {
            let Some((n, sql)) = INSERTS.iter().find(|(n, _)| *n <= rest.len()) else {
                break;
            };
            let (chunk, tail) = rest.split_at(*n);
            rest = tail;
            let sql: &'static str = sql.as_str();
            let mut q = sqlx::query(sql);
            for r in chunk {
                let f = &r.fields;
                q = q
                    .bind(r.id)
                    .bind(r.entity)
                    .bind(r.seq)
                    .bind(r.state)
                    .bind(f.session_id.as_deref())
                    .bind(r.enqueued_at)
                    .bind(r.scheduled_at)
                    .bind(r.expires_at)
                    .bind(r.ttl_ms)
                    .bind(f.message_id.as_str())
                    .bind(f.correlation_id.as_deref())
                    .bind(f.causation_id.as_deref())
                    .bind(f.message_type.as_deref())
                    .bind(f.content_type.as_deref())
                    .bind(f.reply_to.as_deref())
                    .bind(f.properties.as_deref())
                    .bind(r.dead.as_ref().map(|_| "SessionIdMissing"))
                    .bind(r.dead.as_deref())
                    .bind(&f.body[..]);
            }
            q.execute(self.conn.get()?).await?;
        }
        for r in rows {
            match r.state {
                READY => {
                    State::note(&mut self.state.next_expiry, r.expires_at);
                    self.state.touched.insert(r.entity);
                }
                SCHEDULED => State::note(&mut self.state.next_scheduled, r.scheduled_at),
                _ => {
                    self.state.touched.insert(r.entity);
                }
            }
        }
        Ok(())
    }

    async fn cancel(&mut self, entity: i64, seq: SequenceNumber) -> Sql<Result<()>> {
        let done = sqlx::query("DELETE FROM courier_message WHERE id = ?1 AND state = 1")
            .bind(row_id(entity, seq))
            .execute(self.conn.get()?)
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

    /// A session lock's locked-until time, if it is still held.
    async fn session_lock(&mut self, entity: i64, key: &SessionKey, now: i64) -> Sql<Option<i64>> {
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

    /// Serves receive requests: those for the same entity, sub-queue, session and mode
    /// share one statement; the messages go to the requests in arrival order. Requests
    /// left empty wait (until their deadline) or get an empty answer.
    async fn receive_all(&mut self, requests: Vec<ReceiveRequest>, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
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
    async fn take_messages(
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
        let mut messages = match self.state.rows_to_messages(&rows, now, locked) {
            Ok(m) => m,
            Err(e) => return Ok(Err(e)),
        };
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

    async fn serve_waiters(&mut self, now: i64, outcomes: &mut Vec<Outcome>) -> Sql {
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

    /// Completes many locks with one statement.
    async fn complete_all(
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

    async fn receive_deferred(
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
        // Check all first: either every message is locked or none.
        for seq in seqs {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT id FROM courier_message WHERE id = ?1 AND state = 2 \
                 AND (locked_until IS NULL OR locked_until <= ?2) AND (?3 IS NULL OR session_id = ?3)",
            )
            .bind(row_id(entity, *seq))
            .bind(now)
            .bind(session.map(|k| k.id.as_str()))
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
        Ok(self.state.rows_to_messages(&rows, now, true))
    }

    async fn settle(&mut self, lock: &LockRef, settlement: Settlement, now: i64) -> Sql<Result<()>> {
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
                // Back to the front: a locked message is ready again; a deferred or
                // dead-lettered one stays where it is, unlocked. At the max delivery
                // count it is dead-lettered (S2.6).
                let r = sqlx::query(pick(
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, \
                         state = CASE WHEN state = 2 THEN 2 WHEN delivery_count >= ?5 THEN 3 ELSE 0 END, \
                         dl_reason = CASE WHEN state = 4 AND delivery_count >= ?5 THEN ?6 ELSE dl_reason END, \
                         dl_description = CASE WHEN state = 4 AND delivery_count >= ?5 THEN 'the message was delivered ' \
                             || delivery_count || ' times without being settled' ELSE dl_description END, \
                         dl_source = CASE WHEN state = 4 AND delivery_count >= ?5 THEN ?7 ELSE dl_source END, ",
                        patch_props!("?4"),
                        lock_cond!("(2, 4)")
                    ),
                    concat!(
                        "UPDATE courier_message SET locked_until = NULL, ",
                        patch_props!("?4"),
                        lock_cond!("(3)"),
                        " AND ?5 = ?5 AND ?6 = ?6 AND ?7 = ?7"
                    ),
                ))
                .bind(lock.id)
                .bind(lock.delivery_count)
                .bind(now)
                .bind(props_json(&properties))
                .bind(info.max_delivery_count)
                .bind(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
                .bind(&info.display)
                .execute(self.conn.get()?)
                .await?
                .rows_affected();
                if r == 1 {
                    self.state.touched.insert(lock.entity);
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
                let r = sqlx::query(concat!(
                    "UPDATE courier_message SET state = 3, locked_until = NULL, dl_reason = ?5, dl_description = ?6, \
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

    async fn renew(&mut self, lock: &LockRef, now: i64) -> Sql<Result<DateTime<Utc>>> {
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

    async fn renew_session(&mut self, entity: i64, key: &SessionKey, now: i64) -> Sql<Result<DateTime<Utc>>> {
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

    async fn accept(&mut self, req: AcceptRequest, now: i64) -> Sql<Option<Outcome>> {
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
    async fn try_accept(&mut self, req: &AcceptRequest, now: i64) -> Sql<Option<Result<(String, i64, DateTime<Utc>)>>> {
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
            SessionSelector::Next => {
                let found: Option<String> = sqlx::query_scalar(
                    "SELECT m.session_id FROM courier_message m WHERE m.entity_id = ?1 AND m.state = 0 \
                     AND m.session_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM courier_session s \
                     WHERE s.entity_id = ?1 AND s.session_id = m.session_id AND s.locked_until > ?2) \
                     ORDER BY m.seq LIMIT 1",
                )
                .bind(req.entity)
                .bind(now)
                .fetch_optional(self.conn.get()?)
                .await?;
                match found {
                    Some(s) => s,
                    None => return Ok(None),
                }
            }
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

    async fn session_op(&mut self, entity: i64, key: &SessionKey, op: SessionOp, now: i64) -> Sql<Option<Outcome>> {
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

    async fn peek(
        &mut self,
        entity: i64,
        sub_queue: SubQueue,
        from: SequenceNumber,
        max: usize,
        now: i64,
    ) -> Sql<Result<Vec<ReceivedMessage>>> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let sql: &'static str = match sub_queue {
            SubQueue::Main => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE id >= ?1 AND id < ?2 AND state IN (0, 1, 2, 4) ORDER BY id LIMIT ?3"
            ),
            SubQueue::DeadLetter => concat!(
                "SELECT ",
                columns!(),
                " FROM courier_message WHERE id >= ?1 AND id < ?2 AND state = 3 ORDER BY id LIMIT ?3"
            ),
        };
        let rows = sqlx::query(sql)
            .bind(row_id(entity, from.clamp(0, (1 << SEQ_BITS) - 1)))
            .bind(row_id(entity + 1, 0))
            .bind(i64::try_from(max.min(MAX_RECEIVE)).unwrap_or(1))
            .fetch_all(self.conn.get()?)
            .await?;
        Ok(self.state.rows_to_messages(&rows, now, false))
    }

    async fn counts(&mut self, entity: i64) -> Sql<Result<EntityCounts>> {
        if let Err(e) = self.state.entity(entity) {
            return Ok(Err(e));
        }
        let rows = sqlx::query("SELECT state, COUNT(*) FROM courier_message WHERE id >= ?1 AND id < ?2 GROUP BY state")
            .bind(row_id(entity, 0))
            .bind(row_id(entity + 1, 0))
            .fetch_all(self.conn.get()?)
            .await?;
        let mut c = EntityCounts::default();
        for row in rows {
            let state: i64 = row.try_get(0)?;
            let n = u64::try_from(row.try_get::<i64, _>(1)?).unwrap_or(0);
            match state {
                READY | LOCKED => c.active += n,
                SCHEDULED => c.scheduled = n,
                DEFERRED => c.deferred = n,
                _ => c.dead_lettered = n,
            }
        }
        Ok(Ok(c))
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
                name: name.clone(),
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
    let one = |sql: &'static str| sqlx::query_scalar::<_, Option<i64>>(sql);
    state.next_scheduled = one("SELECT MIN(scheduled_at) FROM courier_message WHERE state = 1")
        .fetch_one(&mut *conn)
        .await?;
    state.next_unlock = one("SELECT MIN(locked_until) FROM courier_message WHERE locked_until IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    state.next_expiry =
        one("SELECT MIN(expires_at) FROM courier_message WHERE expires_at IS NOT NULL AND state IN (0, 2)")
            .fetch_one(&mut *conn)
            .await?;
    state.next_session_unlock = one("SELECT MIN(locked_until) FROM courier_session WHERE locked_until IS NOT NULL")
        .fetch_one(&mut *conn)
        .await?;
    Ok(())
}
