//! What the operations API returns: queues with their counts, dead letters (a page of
//! summaries, one in full), saga instances, pending timeouts and outbox rows. Plain data,
//! serializable, so the command line prints them as tables or JSON and the console as
//! pages without another model.

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::message::{Properties, SequenceNumber};
use crate::recoverability::headers;

/// Which kind of entity a [`QueueSummary`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EntityKind {
    /// A queue.
    Queue,
    /// A topic (its messages live in its subscriptions; it holds only scheduled ones).
    Topic,
    /// A subscription of a topic; its name is `topic/subscriptions/name`.
    Subscription,
}

/// A queue, topic or subscription with its counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct QueueSummary {
    /// The name: `orders`, or `events/subscriptions/billing` for a subscription.
    pub name: String,
    /// What it is.
    pub kind: EntityKind,
    /// Messages ready to be received (not locked).
    pub active: u64,
    /// Messages locked by a receiver right now (being handled).
    pub locked: u64,
    /// Messages scheduled for later.
    pub scheduled: u64,
    /// Messages set aside (deferred), received only by sequence number.
    pub deferred: u64,
    /// Messages in the dead-letter sub-queue.
    pub dead_lettered: u64,
    /// When the oldest active or locked message was enqueued (`None` when there is none).
    pub oldest_enqueued_at: Option<DateTime<Utc>>,
}

impl QueueSummary {
    /// How long the oldest active message has waited at `now` (`None` when there is none).
    pub fn oldest_age(&self, now: DateTime<Utc>) -> Option<chrono::Duration> {
        self.oldest_enqueued_at.map(|t| now - t)
    }
}

/// One dead-lettered message in a list: enough to choose which to look at.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DeadLetterSummary {
    /// Its sequence number in the dead-letter sub-queue (what `show`, `resubmit` and
    /// `delete` take).
    pub sequence_number: SequenceNumber,
    /// The sender-chosen id (kept when it is resubmitted).
    pub message_id: String,
    /// The message type's wire name.
    pub message_type: Option<String>,
    /// When it was enqueued in its queue.
    pub enqueued_at: DateTime<Utc>,
    /// How many times it was delivered before it was dead-lettered.
    pub delivery_count: u32,
    /// The dead-letter reason (`courier.RetriesExhausted`, `MaxDeliveryCountExceeded`, ...).
    pub reason: Option<String>,
    /// The failure's text, as the endpoint wrote it ([`headers::FAILURE_ERROR`]), else
    /// the dead-letter description.
    pub error: Option<String>,
    /// Why a resubmit of it would be refused ([`DeadLetter::resubmit_refused`]). Set when
    /// it is asked for by number (`dead_letter_summaries`, what a dry run shows); a page of
    /// a listing leaves it `None`.
    pub resubmit_refused: Option<String>,
}

/// A page of a list and where the next one starts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Page<T> {
    /// The items, in order.
    pub items: Vec<T>,
    /// Pass this as `after` to read the next page; `None` on the last page.
    pub next_after: Option<SequenceNumber>,
    /// How many there are in all (at the time of reading).
    pub total: u64,
}

impl Page<DeadLetterSummary> {
    /// The page of `items` (read with one more than `limit`, in order): at most `limit`
    /// of them, and where the next page starts when there was one more.
    pub(crate) fn of(mut items: Vec<DeadLetterSummary>, limit: usize, total: u64) -> Self {
        let more = items.len() > limit;
        items.truncate(limit);
        Page {
            next_after: if more {
                items.last().map(|d| d.sequence_number)
            } else {
                None
            },
            items,
            total,
        }
    }
}

/// A message body as shown to an operator.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
#[non_exhaustive]
pub enum BodyView {
    /// The body is JSON: decoded.
    Json(serde_json::Value),
    /// The body is UTF-8 text that is not JSON.
    Text(String),
    /// Anything else: the raw bytes.
    Bytes(Vec<u8>),
}

impl BodyView {
    /// Decodes a body: JSON when it parses as JSON, text when it is UTF-8, else bytes.
    pub fn decode(body: &[u8]) -> Self {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            return Self::Json(v);
        }
        match std::str::from_utf8(body) {
            Ok(s) => Self::Text(s.to_owned()),
            Err(_) => Self::Bytes(body.to_vec()),
        }
    }
}

/// One dead-lettered message in full.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The queue it is in (its dead-letter sub-queue) and where a resubmit sends it.
    pub queue: String,
    /// Its sequence number in the dead-letter sub-queue.
    pub sequence_number: SequenceNumber,
    /// The sender-chosen id.
    pub message_id: String,
    /// The message type's wire name.
    pub message_type: Option<String>,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// The causation id.
    pub causation_id: Option<String>,
    /// The body's MIME type.
    pub content_type: Option<String>,
    /// The session it belongs to.
    pub session_id: Option<String>,
    /// When it was enqueued in its queue.
    pub enqueued_at: DateTime<Utc>,
    /// How many times it was delivered before it was dead-lettered.
    pub delivery_count: u32,
    /// The dead-letter reason.
    pub reason: Option<String>,
    /// The dead-letter description.
    pub description: Option<String>,
    /// Where it was dead-lettered (the entity's path).
    pub source: Option<String>,
    /// The failure's text the endpoint wrote ([`headers::FAILURE_ERROR`]).
    pub error: Option<String>,
    /// The failure's error chain, outermost first ([`headers::FAILURE_CHAIN`]).
    pub error_chain: Option<String>,
    /// Every application property (header), the failure headers included.
    pub headers: Properties,
    /// The body, decoded when it is JSON or text.
    pub body: BodyView,
    /// The body's size in bytes.
    pub body_size: usize,
    /// Why a resubmit of it would be refused, when it would: on RabbitMQ, a dead letter of a
    /// session queue without a valid session id (a foreign producer's), which no partition
    /// takes. `None` when a resubmit can send it back.
    pub resubmit_refused: Option<String>,
}

pub(crate) fn string_header(headers: &Properties, key: &str) -> Option<String> {
    match headers.get(key) {
        Some(crate::PropertyValue::String(s)) => Some(s.clone()),
        Some(other) => serde_json::to_string(other).ok(),
        None => None,
    }
}

/// Text a program stored or sent as bytes, as an operator reads it: the text when it is
/// UTF-8; else each byte that is not UTF-8 as `\xNN` (and `\` as `\\`), so that two
/// different ids never show as one and nothing fails to be listed.
pub(crate) fn shown_bytes(raw: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(raw) {
        return text.to_owned();
    }
    let mut out = String::with_capacity(raw.len() * 2);
    for chunk in raw.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The headers of a dead letter as an operator sees them: the values of the endpoint's
/// seals (the timeout dispatcher's, the retry count's) are replaced by a note. They stay
/// on the message (a resubmitted timeout must still fire), but shown they would be one
/// copy and paste from a forged copy's headers.
pub(crate) fn without_seals(mut headers: Properties) -> Properties {
    for key in [
        crate::saga::headers::TIMEOUT_SEAL,
        crate::endpoint::recoverability::headers::DELAYED_RETRY_SEAL,
    ] {
        if let Some(v) = headers.get_mut(key) {
            *v = crate::PropertyValue::from("(a seal of Courier's: not shown)");
        }
    }
    headers
}

/// The failure's text of a dead letter, as Courier wrote it (issue 31, point 6).
///
/// The `courier.failure.*` headers are message properties: a producer can write them,
/// and a message the broker or the transport dead-letters itself (a time-to-live, the max
/// delivery count, a wire-format refusal) keeps what the producer wrote. The dead-letter
/// description is the transport's record, which no send writes, and where an endpoint
/// dead-letters it holds the whole error chain (`a: b: c`) whose first error is the
/// [`headers::FAILURE_ERROR`] header. So the header is shown only when the description
/// starts with it (it then says nothing the description does not), else the
/// description; with no description, nothing. A producer's header is never shown as the
/// failure.
pub(crate) fn failure_text(headers: &Properties, description: Option<&str>) -> Option<String> {
    let description = description?;
    match string_header(headers, headers::FAILURE_ERROR) {
        Some(error) if !error.is_empty() && description.starts_with(error.as_str()) => Some(error),
        _ => Some(description.to_owned()),
    }
}

/// The failure's error chain of a dead letter (one error per line), as Courier wrote it:
/// the [`headers::FAILURE_CHAIN`] header only when it is the dead letter's description
/// (the chain joined by `: `) cut into lines, else `None` (see [`failure_text`]).
pub(crate) fn failure_chain(headers: &Properties, description: Option<&str>) -> Option<String> {
    let chain = string_header(headers, headers::FAILURE_CHAIN)?;
    let one_line = |text: &str| text.replace('\n', ": ");
    (one_line(&chain) == one_line(description?)).then_some(chain)
}

/// What a resubmit or delete of several dead letters did, message by message.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BatchOutcome {
    /// Sequence numbers (in the dead-letter sub-queue) that were moved or deleted.
    pub done: Vec<SequenceNumber>,
    /// Sequence numbers that were no longer there (already resubmitted or deleted, or
    /// being read by a receiver of the dead-letter sub-queue).
    pub not_found: Vec<SequenceNumber>,
    /// Sequence numbers whose change failed, with why; each of them is still in the
    /// dead-letter sub-queue (every change is atomic per message).
    pub failed: Vec<(SequenceNumber, String)>,
}

/// Which saga instances to list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SagaFilter {
    /// Only instances whose correlation value contains this text.
    pub correlation: Option<String>,
    /// Only instances last updated before this time (stuck ones).
    pub updated_before: Option<DateTime<Utc>>,
    /// Only instances with (`Some(true)`) or without (`Some(false)`) a pending timeout.
    pub has_pending_timeout: Option<bool>,
    /// At most this many (oldest update first).
    pub limit: u32,
}

impl Default for SagaFilter {
    fn default() -> Self {
        Self {
            correlation: None,
            updated_before: None,
            has_pending_timeout: None,
            limit: 100,
        }
    }
}

impl SagaFilter {
    /// Instances whose correlation contains `text`.
    #[must_use]
    pub fn correlation(mut self, text: impl Into<String>) -> Self {
        self.correlation = Some(text.into());
        self
    }

    /// Instances last updated before `time`.
    #[must_use]
    pub fn updated_before(mut self, time: DateTime<Utc>) -> Self {
        self.updated_before = Some(time);
        self
    }

    /// Instances with (`true`) or without (`false`) a pending timeout.
    #[must_use]
    pub fn has_pending_timeout(mut self, yes: bool) -> Self {
        self.has_pending_timeout = Some(yes);
        self
    }

    /// At most `limit` instances.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// A saga type and how many instances it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SagaTypeSummary {
    /// The saga's name (its type as stored).
    pub saga_type: String,
    /// Instances stored (not completed).
    pub instances: u64,
    /// When the least recently updated instance was updated.
    pub oldest_updated_at: Option<DateTime<Utc>>,
}

/// One saga instance in a list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct SagaSummary {
    /// The saga's name.
    pub saga_type: String,
    /// Its correlation value.
    pub correlation: String,
    /// Its version (1 when created, one more at each update).
    pub version: i64,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it was last updated.
    pub updated_at: DateTime<Utc>,
    /// How many timeouts it has pending (not yet handled).
    pub pending_timeouts: u64,
}

/// One saga instance in full.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct SagaInstance {
    /// The instance's identity, version and times.
    pub summary: SagaSummary,
    /// The version of the state's shape it was written at (`Saga::VERSION`).
    pub state_version: i64,
    /// Its state as JSON.
    pub state: serde_json::Value,
    /// Its pending timeouts, earliest first.
    pub timeouts: Vec<PendingTimeout>,
}

/// Where a pending timeout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TimeoutState {
    /// Stored, not yet sent by the dispatcher.
    Waiting,
    /// Sent by the dispatcher; its message is not handled yet.
    Dispatched,
    /// Its message was dead-lettered; it waits for an operator (resubmit or complete).
    DeadLettered,
}

/// A timeout that has not been handled yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PendingTimeout {
    /// Its id (also its message's id).
    pub id: String,
    /// The endpoint whose queue receives it.
    pub endpoint: String,
    /// The saga's name.
    pub saga_type: String,
    /// The saga instance's correlation value.
    pub correlation: String,
    /// The key it was requested under (by default its message's wire name).
    pub key: Option<String>,
    /// Its message's type.
    pub message_type: Option<String>,
    /// When it is due.
    pub due_at: DateTime<Utc>,
    /// When the dispatcher sent it.
    pub dispatched_at: Option<DateTime<Utc>>,
    /// Where it is.
    pub state: TimeoutState,
    /// Why its message was dead-lettered.
    pub dead_letter_reason: Option<String>,
}

impl PendingTimeout {
    /// Whether it is overdue at `now`: due and still not sent (the dispatcher is down or
    /// behind), or sent more than `grace` ago and not handled (the endpoint is down or
    /// behind).
    pub fn is_overdue(&self, now: DateTime<Utc>, grace: chrono::Duration) -> bool {
        match self.state {
            TimeoutState::Waiting => self.due_at <= now,
            TimeoutState::Dispatched => self.due_at.max(self.dispatched_at.unwrap_or(self.due_at)) + grace <= now,
            TimeoutState::DeadLettered => false,
        }
    }
}

/// Which timeouts to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TimeoutFilter {
    /// Only overdue ones ([`PendingTimeout::is_overdue`] with [`grace`](Self::grace)).
    pub overdue_only: bool,
    /// How long after its due time a dispatched timeout may stay unhandled before it
    /// counts as overdue.
    #[serde(skip)]
    pub grace: chrono::Duration,
    /// At most this many, earliest due first.
    pub limit: u32,
}

impl Default for TimeoutFilter {
    fn default() -> Self {
        Self {
            overdue_only: false,
            grace: chrono::Duration::seconds(60),
            limit: 100,
        }
    }
}

impl TimeoutFilter {
    /// Only overdue timeouts.
    #[must_use]
    pub fn overdue(mut self) -> Self {
        self.overdue_only = true;
        self
    }

    /// At most `limit` timeouts.
    #[must_use]
    pub fn limit(mut self, limit: u32) -> Self {
        self.limit = limit;
        self
    }
}

/// A message stored in the outbox and not dispatched yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct OutboxEntry {
    /// Its outbox row id.
    pub id: i64,
    /// The endpoint that stored it.
    pub endpoint: String,
    /// The handled message whose transaction stored it.
    pub source_id: String,
    /// Where it goes.
    pub destination: String,
    /// Whether the destination is a topic.
    pub is_topic: bool,
    /// Its message id.
    pub message_id: Option<String>,
    /// Its type.
    pub message_type: Option<String>,
    /// When it was stored.
    pub created_at: DateTime<Utc>,
    /// Why it is not sent, for a dead letter of the outbox (`None` for a row waiting to
    /// be dispatched).
    pub dead_letter_reason: Option<String>,
    /// What was wrong with it, for a dead letter of the outbox.
    pub dead_letter_description: Option<String>,
}

/// What completing a saga by hand removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct CompletedSaga {
    /// The version the instance had.
    pub version: i64,
    /// Its pending timeouts, deleted with it (their messages are discarded if they come).
    pub timeouts_removed: u64,
}

#[cfg(test)]
mod failure_display_tests {
    use super::{failure_chain, failure_text, without_seals};
    use crate::message::{Properties, PropertyValue};
    use crate::recoverability::headers;

    fn with(error: Option<&str>, chain: Option<&str>) -> Properties {
        let mut p = Properties::new();
        if let Some(e) = error {
            p.insert(headers::FAILURE_ERROR.to_owned(), PropertyValue::from(e));
        }
        if let Some(c) = chain {
            p.insert(headers::FAILURE_CHAIN.to_owned(), PropertyValue::from(c));
        }
        p
    }

    #[test]
    fn courier_s_own_failure_is_shown_as_it_wrote_it() {
        let h = with(Some("card declined"), Some("card declined\nbank said no"));
        let d = Some("card declined: bank said no");
        assert_eq!(failure_text(&h, d).as_deref(), Some("card declined"));
        assert_eq!(failure_chain(&h, d).as_deref(), Some("card declined\nbank said no"));
    }

    #[test]
    fn a_producer_s_failure_headers_are_never_the_failure() {
        let h = with(Some("X"), Some("X\nforged"));
        let d = Some("the message's time-to-live passed");
        assert_eq!(failure_text(&h, d).as_deref(), d);
        assert_eq!(failure_chain(&h, d), None);
        // Without a description there is nothing Courier wrote.
        assert_eq!(failure_text(&h, None), None);
        assert_eq!(failure_chain(&h, None), None);
        // A header longer than the description is not shown.
        let h = with(Some("endpoint e has no handler for message type \"t\" and more"), None);
        let d = Some("endpoint e has no handler for message type \"t\"");
        assert_eq!(failure_text(&h, d).as_deref(), d);
    }

    #[test]
    fn the_endpoints_seals_are_not_shown_and_the_rest_is() {
        let mut p = with(Some("boom"), None);
        p.insert(
            crate::saga::headers::TIMEOUT_SEAL.to_owned(),
            PropertyValue::from("ab12"),
        );
        p.insert(headers::DELAYED_RETRY_SEAL.to_owned(), PropertyValue::from("cd34"));
        let shown = without_seals(p);
        for key in [crate::saga::headers::TIMEOUT_SEAL, headers::DELAYED_RETRY_SEAL] {
            let value = shown.get(key).map(ToString::to_string).unwrap_or_default();
            assert!(!value.contains("ab12") && !value.contains("cd34"), "{key}: {value}");
            assert!(value.contains("not shown"), "{key}: {value}");
        }
        assert_eq!(shown.get(headers::FAILURE_ERROR), Some(&PropertyValue::from("boom")));
    }
}
