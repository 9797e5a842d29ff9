//! Stores: where an endpoint keeps the inbox of processed message ids and the outbox of
//! messages its handlers sent, in the same transaction as the handler's own writes. See
//! `docs/stores.md`.
#![cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use std::any::Any;
use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, PropertyValue};

#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;

/// How long processed message ids are kept by default.
pub const DEFAULT_INBOX_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// A message a handler sent, as the outbox keeps it until it is dispatched.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxMessage {
    /// The row's id in the outbox.
    pub id: i64,
    /// The queue or topic.
    pub destination: String,
    /// Whether the destination is a topic.
    pub is_topic: bool,
    /// The message, with the id it will keep when dispatched.
    pub envelope: Envelope,
}

/// What [`Store::begin`] found.
pub enum Begin {
    /// The message was not processed before: its id is now recorded in the returned unit
    /// of work, which commits or rolls back with the handler's effects.
    Fresh(Box<dyn UnitOfWork>),
    /// The message's effects were committed before (a redelivery): do not handle it
    /// again. Outbox messages of that earlier handling that were never dispatched are
    /// returned, to be dispatched now.
    Duplicate(Vec<OutboxMessage>),
}

impl std::fmt::Debug for Begin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Begin::Fresh(_) => f.write_str("Fresh"),
            Begin::Duplicate(left) => write!(f, "Duplicate({} undispatched)", left.len()),
        }
    }
}

/// One open transaction of a store, for one handled message.
#[async_trait]
pub trait UnitOfWork: Send {
    /// The database transaction, for [`Context::transaction`](crate::Context::transaction)
    /// (`sqlx::Transaction<'static, DB>` of the store's database).
    fn transaction(&mut self) -> &mut (dyn Any + Send);
    /// Stores the messages the handlers sent, in this transaction; returns them with
    /// their outbox ids.
    async fn store_outgoing(
        &mut self,
        messages: Vec<(String, bool, Envelope)>,
        now: DateTime<Utc>,
    ) -> Result<Vec<OutboxMessage>>;
    /// Commits the handler's writes, the inbox record and the outbox together.
    async fn commit(self: Box<Self>) -> Result<()>;
}

/// Where an endpoint keeps its inbox and outbox.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// A short name for logs (`postgres`, `sqlite`).
    fn name(&self) -> &'static str;
    /// Applies Courier's migrations (idempotent).
    async fn migrate(&self) -> Result<()>;
    /// Opens the transaction of one message and records `(endpoint, message_id)` in its
    /// inbox; or says the message was processed before. When two transactions record the
    /// same id at once, the second waits for the first and then sees a duplicate (or,
    /// if the first rolled back, records it).
    async fn begin(&self, endpoint: &str, message_id: &str, now: DateTime<Utc>) -> Result<Begin>;
    /// Removes dispatched messages from the outbox.
    async fn mark_dispatched(&self, ids: &[i64]) -> Result<()>;
    /// Outbox messages of `endpoint` stored before `older_than` and still there (left by
    /// a process that died between its commit and its dispatch, or by a dispatch that
    /// failed), oldest first.
    async fn undispatched(&self, endpoint: &str, older_than: DateTime<Utc>, limit: i64) -> Result<Vec<OutboxMessage>>;
    /// Deletes inbox records processed before `before`, at most `limit` of them in one
    /// short statement; returns how many went.
    async fn purge_inbox(&self, before: DateTime<Utc>, limit: i64) -> Result<u64>;
}

/// The envelope's fields other than the body, as the outbox stores them.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredEnvelope {
    pub(crate) message_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) correlation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) causation_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) message_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) content_type: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) properties: BTreeMap<String, PropertyValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reply_to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) time_to_live_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) scheduled_enqueue_time: Option<DateTime<Utc>>,
}

impl StoredEnvelope {
    pub(crate) fn split(envelope: Envelope) -> Result<(String, Bytes)> {
        let meta = StoredEnvelope {
            message_id: envelope.message_id,
            correlation_id: envelope.correlation_id,
            causation_id: envelope.causation_id,
            message_type: envelope.message_type,
            content_type: envelope.content_type,
            properties: envelope.properties,
            session_id: envelope.session_id,
            reply_to: envelope.reply_to,
            time_to_live_ms: envelope
                .time_to_live
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            scheduled_enqueue_time: envelope.scheduled_enqueue_time,
        };
        let json = serde_json::to_string(&meta).map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidMessage {
                    reason: "cannot store the envelope in the outbox".into(),
                },
                e,
            )
        })?;
        Ok((json, envelope.body))
    }

    pub(crate) fn join(json: &str, body: Vec<u8>) -> Result<Envelope> {
        let meta: StoredEnvelope = serde_json::from_str(json).map_err(|e| {
            Error::with_source(
                ErrorKind::Corrupt {
                    detail: "an outbox row's envelope does not parse".into(),
                },
                e,
            )
        })?;
        let mut envelope = Envelope::new(body);
        envelope.message_id = meta.message_id;
        envelope.correlation_id = meta.correlation_id;
        envelope.causation_id = meta.causation_id;
        envelope.message_type = meta.message_type;
        envelope.content_type = meta.content_type;
        envelope.properties = meta.properties;
        envelope.session_id = meta.session_id;
        envelope.reply_to = meta.reply_to;
        envelope.time_to_live = meta.time_to_live_ms.map(Duration::from_millis);
        envelope.scheduled_enqueue_time = meta.scheduled_enqueue_time;
        Ok(envelope)
    }
}

/// Maps a database error to a storage error, transient when retrying can help.
pub(crate) fn db_error(context: &'static str, e: sqlx::Error) -> Error {
    let transient = matches!(
        e,
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed
    ) || matches!(&e, sqlx::Error::Database(d) if is_transient_code(d.code().as_deref()));
    Error::with_source(
        ErrorKind::Storage {
            detail: context.to_owned(),
            transient,
        },
        e,
    )
}

/// Postgres serialization failures and deadlocks, SQLite busy and locked.
fn is_transient_code(code: Option<&str>) -> bool {
    matches!(
        code,
        Some("40001" | "40P01" | "55P03" | "57P01" | "5" | "6" | "517" | "261" | "262")
    )
}
