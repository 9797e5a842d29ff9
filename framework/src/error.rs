//! Errors of the transport contract (docs/semantics.md S1.2, S2.7).
//!
//! The lowest room: it names no other module of the crate. A failed send, which hands its
//! messages back, is `transport::SendError` (it holds envelopes).

use uuid::Uuid;

/// A boxed error cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `Result` with Courier's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error of a transport operation.
///
/// Every error carries a [`kind`](Error::kind) that says what went wrong, a
/// [`tracking_id`](Error::tracking_id) that also appears in the log line written when the
/// error was raised (so an operator can find it), and whether retrying the same call can
/// succeed ([`is_transient`](Error::is_transient)).
#[derive(Debug, thiserror::Error)]
#[error("{kind} (tracking id {tracking_id})")]
pub struct Error {
    kind: ErrorKind,
    tracking_id: Uuid,
    #[source]
    source: Option<BoxError>,
}

impl Error {
    /// A new error of this kind with a fresh tracking id.
    pub fn new(kind: ErrorKind) -> Self {
        let tracking_id = Uuid::new_v4();
        tracing::debug!(%tracking_id, error = %kind, "courier error");
        Self {
            kind,
            tracking_id,
            source: None,
        }
    }

    /// A new error of this kind caused by `source`.
    pub fn with_source(kind: ErrorKind, source: impl Into<BoxError>) -> Self {
        let mut error = Self::new(kind);
        error.source = Some(source.into());
        error
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// The id under which this error was logged.
    pub fn tracking_id(&self) -> Uuid {
        self.tracking_id
    }

    /// Whether the same call, retried later, can succeed.
    pub fn is_transient(&self) -> bool {
        self.kind.is_transient()
    }

    /// Whether this is the distinct "lock lost" error of S2.7 (message or session lock).
    pub fn is_lock_lost(&self) -> bool {
        matches!(self.kind, ErrorKind::LockLost | ErrorKind::SessionLockLost)
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Self::new(kind)
    }
}

/// The kinds of [`Error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A queue, topic or subscription name is not valid.
    #[error("invalid entity name {name:?}: {reason}")]
    InvalidEntityName {
        /// The name as given (truncated to 300 characters).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The queue, topic or subscription does not exist.
    #[error("{path} does not exist")]
    EntityNotFound {
        /// The entity's path.
        path: String,
    },
    /// Options given to a call are out of range or contradict each other.
    #[error("invalid options: {reason}")]
    InvalidOptions {
        /// What is wrong.
        reason: String,
    },
    /// The message is malformed (for example a message id that is too long).
    #[error("invalid message: {reason}")]
    InvalidMessage {
        /// What is wrong.
        reason: String,
    },
    /// The message is larger than the broker accepts.
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    MessageTooLarge {
        /// Size of the message (body, headers and properties) in bytes.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A scheduled enqueue time cannot be represented or is out of the accepted range.
    #[error("scheduled time {time} is out of range: {reason}")]
    InvalidScheduleTime {
        /// The time as given.
        time: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The operation is not valid in the entity's or message's current state (for example
    /// receiving from a session queue without accepting a session).
    #[error("invalid operation: {reason}")]
    InvalidOperation {
        /// What is wrong.
        reason: String,
    },
    /// The message lock expired or was lost; the message will be delivered again (S2.7).
    #[error("the message lock was lost or has expired; the message will be delivered again")]
    LockLost,
    /// The session lock expired or was lost; the session can be accepted again (S2.7, S4).
    #[error("the session lock was lost or has expired")]
    SessionLockLost,
    /// The lock token was not issued by this broker instance.
    #[error("unknown lock token {token}")]
    UnknownLockToken {
        /// The token as given.
        token: String,
    },
    /// No message with this sequence number is in the state the call needs (a deferred
    /// message for receive-deferred, a scheduled message for cancel).
    #[error("no {expected} message with sequence number {sequence_number}")]
    MessageNotFound {
        /// The sequence number asked for.
        sequence_number: i64,
        /// The state that was looked for.
        expected: &'static str,
    },
    /// The session is held by another receiver, or no session became available in time.
    #[error("no session could be locked: {reason}")]
    SessionNotAvailable {
        /// Why.
        reason: String,
    },
    /// The transport does not implement this part of the contract.
    #[error("{transport} does not support {capability} (rule {rule}): {reason}")]
    Unsupported {
        /// The transport's name.
        transport: &'static str,
        /// The operation.
        capability: &'static str,
        /// The rule of docs/semantics.md it bends.
        rule: &'static str,
        /// Why, and what to use instead.
        reason: &'static str,
    },
    /// The broker or link is closed.
    #[error("the broker is closed")]
    Closed,
    /// The connection to a broker server is down or was lost mid-call (RabbitMQ). The
    /// outcome of a send that fails this way is unknown: send it again with the same
    /// message id; receivers deduplicate.
    #[error("broker connection failed: {detail}")]
    Connection {
        /// What failed (never a password).
        detail: String,
    },
    /// The broker's storage failed.
    #[error("storage error: {detail}")]
    Storage {
        /// What failed.
        detail: String,
        /// Whether retrying can help (a busy database, an interrupted call).
        transient: bool,
    },
    /// A message type has no destination in the routing table.
    #[error("cannot route {message_type}: {reason}")]
    NoRoute {
        /// The wire name of the message type.
        message_type: String,
        /// What is missing.
        reason: String,
    },
    /// The broker's storage holds something this version cannot read.
    #[error("corrupt stored message: {detail}")]
    Corrupt {
        /// What could not be read.
        detail: String,
    },
    /// Another transaction changed the same record first (a saga instance updated or
    /// created concurrently); retrying reads the new version.
    #[error("concurrency conflict: {detail}")]
    Conflict {
        /// What was changed concurrently.
        detail: String,
    },
}

impl ErrorKind {
    /// Whether the same call, retried later, can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ErrorKind::Storage { transient, .. } => *transient,
            ErrorKind::SessionNotAvailable { .. } | ErrorKind::Conflict { .. } | ErrorKind::Connection { .. } => true,
            ErrorKind::InvalidEntityName { .. }
            | ErrorKind::EntityNotFound { .. }
            | ErrorKind::InvalidOptions { .. }
            | ErrorKind::InvalidMessage { .. }
            | ErrorKind::MessageTooLarge { .. }
            | ErrorKind::InvalidScheduleTime { .. }
            | ErrorKind::InvalidOperation { .. }
            | ErrorKind::LockLost
            | ErrorKind::SessionLockLost
            | ErrorKind::UnknownLockToken { .. }
            | ErrorKind::MessageNotFound { .. }
            | ErrorKind::Unsupported { .. }
            | ErrorKind::Closed
            | ErrorKind::NoRoute { .. }
            | ErrorKind::Corrupt { .. } => false,
        }
    }
}
