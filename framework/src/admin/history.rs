//! Reading a workflow's history (issue 33, docs/history.md): the capability
//! [`HistoryAdmin`] and what it returns: a saga instance's timeline ([`SagaHistory`]) and
//! the tree of messages a message caused ([`MessageHistory`]), made of the events the
//! endpoints recorded ([`StoredHistoryEvent`]), chosen with a [`HistoryFilter`].
//!
//! Implemented for the Postgres database ([`PostgresAdmin`](super::PostgresAdmin),
//! `pg_history.rs`), the SQLite store ([`SqliteAdmin`](super::SqliteAdmin)) and the
//! embedded broker's file ([`EmbeddedAdmin`](super::EmbeddedAdmin)), both
//! `sqlite_history.rs`; the assembling they share (reading a row leniently, the timeline,
//! the tree) is in `history_read.rs`.
//!
//! A row is never a reason for a listing to fail: one whose detail does not parse, or
//! whose values are odd (written by another program, or by hand), is returned with what
//! could be read, and [`StoredHistoryEvent::problems`] says what could not.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::AdminResult;
use crate::store::history::{HistoryEvent, HistoryKind, SentMessage, TimeoutMark};

/// The most events one reading returns.
pub const MAX_HISTORY_EVENTS: u32 = 10_000;

/// How deep [`HistoryAdmin::message_history`] follows the messages caused by a message.
pub const MAX_HISTORY_DEPTH: usize = 32;

/// Which events of a history to read.
///
/// ```
/// use courier::admin::HistoryFilter;
/// use courier::HistoryKind;
/// let failures = HistoryFilter::default()
///     .outcome(HistoryKind::Retried)
///     .outcome(HistoryKind::DeadLettered)
///     .limit(200);
/// # let _ = failures;
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct HistoryFilter {
    /// Only events at or after this time (when the attempt ended).
    pub since: Option<DateTime<Utc>>,
    /// Only events at or before this time.
    pub until: Option<DateTime<Utc>>,
    /// Only events of these outcomes (all when empty).
    pub outcomes: Vec<HistoryKind>,
    /// At most this many events are read ([`MAX_HISTORY_EVENTS`] at most; the rest is
    /// left out and the result says so).
    pub limit: u32,
}

impl Default for HistoryFilter {
    fn default() -> Self {
        Self {
            since: None,
            until: None,
            outcomes: Vec::new(),
            limit: 1000,
        }
    }
}

impl HistoryFilter {
    /// Events at or after `time`.
    #[must_use]
    pub fn since(mut self, time: DateTime<Utc>) -> Self {
        self.since = Some(time);
        self
    }

    /// Events at or before `time`.
    #[must_use]
    pub fn until(mut self, time: DateTime<Utc>) -> Self {
        self.until = Some(time);
        self
    }

    /// Events of outcome `kind` too (the first call narrows to it).
    #[must_use]
    pub fn outcome(mut self, kind: HistoryKind) -> Self {
        if !self.outcomes.contains(&kind) {
            self.outcomes.push(kind);
        }
        self
    }

    /// At most `limit` events.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }

    /// Whether it leaves out any event by its time or outcome.
    pub fn narrows(&self) -> bool {
        self.since.is_some() || self.until.is_some() || !self.outcomes.is_empty()
    }

    /// Whether `event` passes it (its time and outcome; not the limit).
    pub fn admits(&self, event: &HistoryEvent) -> bool {
        self.since.is_none_or(|s| event.at >= s)
            && self.until.is_none_or(|u| event.at <= u)
            && (self.outcomes.is_empty() || self.outcomes.contains(&event.kind))
    }

    /// The number of events to read, within bounds.
    pub(crate) fn bound(&self) -> usize {
        usize::try_from(self.limit.clamp(1, MAX_HISTORY_EVENTS)).unwrap_or(1000)
    }

    /// The outcomes' names, `None` for all.
    pub(crate) fn kinds(&self) -> Option<Vec<&'static str>> {
        (!self.outcomes.is_empty()).then(|| self.outcomes.iter().map(|k| k.as_str()).collect())
    }
}

/// How an event of a saga's timeline is tied to the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TimelineLink {
    /// The event names the instance (it is in the instance index): a handling that
    /// committed with the instance's state.
    Instance,
    /// A failed attempt (retried, dead-lettered) or a duplicate of a message the
    /// instance handled, on the same endpoint: the attempt rolled back, so it names no
    /// instance.
    SameMessage,
    /// A failed attempt of a message never handled, in a conversation of the instance's
    /// messages and on one of the endpoints that handled them: most likely this
    /// instance's (a failed attempt names none), but possibly another saga's or handler's
    /// of the same conversation.
    SameConversation,
}

/// One event as a store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StoredHistoryEvent {
    /// Its row id (increasing in the order the rows were written).
    pub id: i64,
    /// The event, as far as it could be read.
    #[serde(flatten)]
    pub event: HistoryEvent,
    /// What of the row could not be read, in words (empty for a row Courier wrote): a
    /// detail that is not the JSON of a [`HistoryDetail`](crate::HistoryDetail), an
    /// outcome none of [`HistoryKind`]'s (then `kind` says `retried` only because it must
    /// say something), a time out of range, text that is not UTF-8 (shown with `\xNN`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
    /// In a saga's timeline, how the event is tied to the instance (`None` elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<TimelineLink>,
}

/// A saga instance's history: its events in time order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SagaHistory {
    /// The saga's name.
    pub saga_type: String,
    /// The instance's correlation.
    pub correlation: String,
    /// The events that pass the filter, oldest first (by time, then row id).
    pub events: Vec<StoredHistoryEvent>,
    /// Whether more events pass the filter than the limit: the first `limit` are listed;
    /// read the later ones with [`HistoryFilter::since`] the last one's time.
    pub more: bool,
}

/// A message's history: its own events and the tree of the messages it caused.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MessageHistory {
    /// The message asked for, and below it the messages its handlings sent.
    pub root: MessageNode,
    /// What was left out and why (the size or depth bound, a loop of causation ids);
    /// empty when the tree is whole.
    pub left_out: Vec<String>,
}

/// A message of a conversation's tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct MessageNode {
    /// Its id.
    pub message_id: String,
    /// Its type, from its events or from the handling that sent it.
    pub message_type: Option<String>,
    /// How the handling of its parent sent it, when that handling's event says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent: Option<SentMessage>,
    /// The timeout it is, when its parent's handling requested it as a saga's timeout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutMark>,
    /// Its events that pass the filter, in time order: each endpoint's attempts. None for
    /// a message not handled yet, or handled by an endpoint that keeps no history.
    pub events: Vec<StoredHistoryEvent>,
    /// The messages its handlings sent, published, scheduled or requested as timeouts.
    pub caused: Vec<MessageNode>,
}

impl MessageNode {
    /// The number of messages in this tree (itself included).
    pub fn count(&self) -> usize {
        1 + self.caused.iter().map(MessageNode::count).sum::<usize>()
    }
}

/// The events whose kept text holds a searched text
/// ([`HistoryAdmin::find`]), and the saga instances they name.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct FoundHistory {
    /// The text searched for.
    pub text: String,
    /// The events found that pass the filter, newest first.
    pub events: Vec<StoredHistoryEvent>,
    /// The saga instances those events name, the most recently touched first.
    pub instances: Vec<FoundInstance>,
    /// Whether more events hold the text than the limit: the newest `limit` are listed;
    /// read older ones with [`HistoryFilter::until`] the last one's time.
    pub more: bool,
}

/// A saga instance named by events that hold a searched text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct FoundInstance {
    /// The saga's name.
    pub saga_type: String,
    /// The instance's correlation.
    pub correlation: String,
    /// How many of the events found name it.
    pub events: usize,
    /// The time of the newest of them.
    pub last_at: DateTime<Utc>,
}

/// A store's history of workflows: what the endpoints that keep one
/// ([`EndpointBuilder::history`](crate::EndpointBuilder::history)) recorded.
#[async_trait]
pub trait HistoryAdmin: Send + Sync {
    /// What this is connected to, for messages and logs (never with a password).
    fn describe(&self) -> String;

    /// The timeline of the instance `correlation` of saga `saga_type`: every event that
    /// names it, and the failed attempts and duplicates that belong to it (see
    /// [`TimelineLink`]), that pass `filter`, oldest first. The instance may have
    /// completed: its history stays for the retention.
    ///
    /// # Errors
    /// [`AdminError::NotFound`](super::AdminError::NotFound) if no event names the
    /// instance (its endpoint keeps no history, or the events are past the retention);
    /// [`AdminError::Failed`](super::AdminError::Failed) if the store cannot be read.
    async fn saga_history(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
    ) -> AdminResult<SagaHistory>;

    /// The events of the message `message_id` (each endpoint's attempts) and, as a tree,
    /// those of the messages it caused, across endpoints, as deep as
    /// [`MAX_HISTORY_DEPTH`], reading at most the filter's limit of events; the
    /// filter's time and outcome choose the events shown (a message is kept while one
    /// of its descendants has one).
    ///
    /// # Errors
    /// [`AdminError::NotFound`](super::AdminError::NotFound) if there is no event of the
    /// message nor of one it caused; [`AdminError::Failed`](super::AdminError::Failed) if
    /// the store cannot be read.
    async fn message_history(&self, message_id: &str, filter: &HistoryFilter) -> AdminResult<MessageHistory>;

    /// The events, newest first, whose message id, conversation id or causation id is
    /// `text`, or whose detail holds it: a kept body, a saga state before or after, an
    /// error, a sent message's id, an instance's correlation (an e-mail address, an order
    /// number). The detail is searched as the store keeps it, so a redacted field is not
    /// found (docs/history.md, "Finding a workflow"). Every event that passes the
    /// filter's times and outcomes is read: narrow a large history with
    /// [`HistoryFilter::since`].
    ///
    /// # Errors
    /// [`AdminError::Invalid`](super::AdminError::Invalid) for an empty text;
    /// [`AdminError::Failed`](super::AdminError::Failed) if the store cannot be read.
    async fn find(&self, text: &str, filter: &HistoryFilter) -> AdminResult<FoundHistory>;
}
