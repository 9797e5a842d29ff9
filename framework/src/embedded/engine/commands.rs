//! The commands the broker's handles send the engine, and the answers it holds back
//! until its transaction commits (`Outcome`).
//!
//! Holds: `Command` and the request types it carries, the entity and lock descriptions
//! the handles keep (`EntityInfo`, `LockRef`, `SessionKey`), and how a command is failed
//! when its batch fails, and the lease of the connection a `Lend` command answers with
//! (`Lease`, `Finish`; the engine's side of lending is `lease.rs`). No SQL here: serving
//! a command is the other files' work.

use std::sync::Arc;

use bytes::Bytes;
use chrono::{DateTime, Utc};
use sqlx::sqlite::SqliteConnection;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::entity::{EntityCounts, EntityPath, QueueOptions, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, ReceivedMessage, SequenceNumber};
use crate::transport::{SessionSelector, Settlement};

pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// Kinds of entity, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Queue = 0,
    Topic = 1,
    Subscription = 2,
}

impl Kind {
    pub(super) fn from_i64(v: i64) -> Option<Self> {
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
    pub(super) parent: i64,
    pub(super) name: String,
    /// `queue`, `topic` or `topic/subscriptions/name`, for errors and dead-letter sources.
    pub(super) display: String,
    pub(super) lock_ms: i64,
    pub(super) max_delivery_count: i64,
    pub(super) default_ttl_ms: Option<i64>,
    pub(crate) requires_session: bool,
    pub(super) next_seq: i64,
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

pub(super) fn answer<T>(reply: Reply<T>, kind: &ErrorKind) {
    let _ = reply.send(Err(Error::new(kind.clone())));
}

impl Command {
    /// Answers the command with an error (the batch it was in failed, or the broker closed).
    pub(super) fn fail(self, kind: &ErrorKind) {
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

/// Sends a reply: the result, or the error of a transaction that failed.
pub(super) type Answer = Box<dyn FnOnce(Option<&ErrorKind>) + Send>;

/// One send command: entity, messages, and where the sequence numbers go (none for a
/// pre-settled send).
pub(super) type SendCommand = (i64, Vec<Envelope>, Option<Reply<Vec<SequenceNumber>>>);

/// An answer held back until the transaction commits.
pub(super) enum Outcome {
    Reply(Answer),
    /// Messages locked for a receiver: if it has gone, the locks are released.
    Received {
        locked: bool,
        reply: Reply<Vec<ReceivedMessage>>,
        messages: Vec<ReceivedMessage>,
    },
}

pub(super) fn outcome<T: Send + 'static>(reply: Reply<T>, result: Result<T>) -> Outcome {
    Outcome::Reply(Box::new(move |failed: Option<&ErrorKind>| {
        let value = match failed {
            Some(kind) => Err(Error::new(kind.clone())),
            None => result,
        };
        let _ = reply.send(value);
    }))
}

/// The engine's connection, lent to one store transaction: the inbox record, the user's
/// writes and, at [`Lease::finish`], the completion of the received message and the
/// messages sent all commit in ONE SQLite transaction. The engine does nothing else until
/// the lease comes back; dropping it gives the connection back and rolls back whatever it
/// began.
pub(crate) struct Lease {
    pub(super) conn: Option<SqliteConnection>,
    pub(super) back: Option<oneshot::Sender<Returned>>,
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

pub(super) struct Returned {
    pub(super) conn: SqliteConnection,
    pub(super) finish: Option<Finish>,
}

/// What ends a lease's transaction: the received message to complete, the messages to
/// send (destination, is a topic, messages), all or nothing.
pub(crate) struct Finish {
    /// `(entity, row id, delivery count)` of each lock to complete (a batch handler's
    /// transaction completes several).
    pub(crate) complete: Vec<(i64, i64, i64)>,
    pub(crate) sends: Vec<(String, bool, Vec<Envelope>)>,
    /// Dead letters an operator resubmits: `(entity, sequence numbers)` of a queue or of
    /// ONE subscription of a topic (not fanned out to the others again), chosen in the
    /// lease's transaction (dead-lettered, not locked), put back in place by the engine
    /// (`put_back.rs`).
    pub(crate) put_back: Option<(i64, Vec<SequenceNumber>)>,
    /// The broker's largest message (the sender's checks apply).
    pub(crate) max_message_size: usize,
    /// History events of the transaction (a handling's, a timeout claim's), written with
    /// its `COMMIT` in one query.
    pub(crate) history: Vec<crate::store::sqlite_history::Rendered>,
    pub(crate) reply: Reply<()>,
}
