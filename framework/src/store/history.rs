//! A workflow's history as a store keeps it (issue 33, docs/history.md): one event per
//! handling attempt of a message (handled, retried, dead-lettered, a duplicate the inbox
//! dropped) with what it did: the messages it sent, and for each saga instance it touched
//! the state before and after and the timeouts it requested, cancelled, fired or
//! discarded; and one per saga timeout the endpoint's dispatcher sent, or dead-lettered
//! after its last dispatch. A handled event commits in the transaction of the effects it
//! describes; the others are written on their own (their attempt rolled back, or the
//! dispatch is a step of its own).
//!
//! The events are rows of `courier.history` (Postgres) or `courier_history` (SQLite),
//! the detail a JSON document ([`HistoryDetail`]); `courier.history_instance` indexes
//! them by saga instance. The writing is in `pg_history.rs` and `sqlite_history.rs`; what
//! an endpoint records, in `endpoint/history.rs`.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::store::TakenTimeout;

/// What an event of the history records. More kinds may come (the stores' checks name
/// each): match with a catch-all arm, or on [`as_str`](Self::as_str).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HistoryKind {
    /// Handled: its effects committed with this event.
    Handled,
    /// A handling attempt that failed and rolled back; the message is tried again.
    Retried,
    /// Moved to the dead-letter queue, with the reason.
    DeadLettered,
    /// Found in the inbox (processed before): completed without handling.
    Duplicate,
    /// A saga timeout that fell due, sent to the endpoint's queue by its dispatcher
    /// ([`HistoryDetail::timeout`] says which; `attempt` is the how-many-th dispatch).
    TimeoutDispatched,
    /// A saga timeout sent its most times and never settled (the broker dead-lettered
    /// its message each time, or lost it): marked dead-lettered, never sent again.
    TimeoutDeadLettered,
}

impl HistoryKind {
    /// Every kind, in the order of the schema's check.
    pub const ALL: [HistoryKind; 6] = [
        HistoryKind::Handled,
        HistoryKind::Retried,
        HistoryKind::DeadLettered,
        HistoryKind::Duplicate,
        HistoryKind::TimeoutDispatched,
        HistoryKind::TimeoutDeadLettered,
    ];

    /// Its name in the store and in `--outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            HistoryKind::Handled => "handled",
            HistoryKind::Retried => "retried",
            HistoryKind::DeadLettered => "dead_lettered",
            HistoryKind::Duplicate => "duplicate",
            HistoryKind::TimeoutDispatched => "timeout_dispatched",
            HistoryKind::TimeoutDeadLettered => "timeout_dead_lettered",
        }
    }

    /// The kind of a name, if it is one.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl std::fmt::Display for HistoryKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEvent {
    /// The endpoint that handled the message.
    pub endpoint: String,
    /// What happened.
    pub kind: HistoryKind,
    /// When the attempt ended.
    pub at: DateTime<Utc>,
    /// The message's id.
    pub message_id: String,
    /// Its type, if it has one.
    pub message_type: Option<String>,
    /// Its correlation id: the conversation it belongs to.
    pub conversation_id: Option<String>,
    /// The id of the message whose handling sent it.
    pub causation_id: Option<String>,
    /// The attempt (1 for the first delivery).
    pub attempt: u32,
    /// When the broker took it.
    pub enqueued_at: Option<DateTime<Utc>>,
    /// When the attempt began.
    pub received_at: Option<DateTime<Utc>>,
    /// What the attempt did.
    pub detail: HistoryDetail,
}

impl HistoryEvent {
    /// The saga instances the event touched, or whose timeout it is: (saga type,
    /// correlation).
    pub fn instances(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = self
            .detail
            .sagas
            .iter()
            .map(|s| (s.saga_type.as_str(), s.correlation.as_str()))
            .chain(
                self.detail
                    .timeout
                    .iter()
                    .map(|t| (t.saga_type.as_str(), t.correlation.as_str())),
            )
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// What an attempt did, kept as one JSON document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HistoryDetail {
    /// Why it failed (retried, dead-lettered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The dead-letter reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The messages it sent, published and scheduled (committed with it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sent: Vec<SentMessage>,
    /// The saga instances it touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sagas: Vec<SagaChange>,
    /// The saga timeout a dispatcher's event is about (`timeout_dispatched`,
    /// `timeout_dead_lettered`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<TimeoutDispatch>,
    /// The message's body, when the endpoint keeps bodies (UTF-8 as it is; other bytes
    /// as lowercase hex, prefixed `hex:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// What was cut to the size limits or redacted, in words.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<String>,
}

/// A message the attempt sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentMessage {
    /// Its id.
    pub message_id: String,
    /// Its type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
    /// The queue or topic.
    pub destination: String,
    /// Published to a topic rather than sent to a queue.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub topic: bool,
    /// When it is due, if scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due: Option<DateTime<Utc>>,
}

/// What an attempt did to one saga instance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SagaChange {
    /// The saga's name.
    pub saga_type: String,
    /// The instance's correlation.
    pub correlation: String,
    /// The state before, as JSON (none for a new instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<String>,
    /// The state after, as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The instance completed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub completed: bool,
    /// The timeouts it requested.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeouts_requested: Vec<TimeoutMark>,
    /// The ids of the timeouts it cancelled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeouts_cancelled: Vec<String>,
    /// The keys whose pending timeout it cancelled or replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys_cancelled: Vec<String>,
    /// The timeout this message was, handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_fired: Option<String>,
    /// The timeout this message was, discarded (cancelled, or its saga completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_discarded: Option<String>,
}

/// A timeout a saga requested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutMark {
    /// Its id.
    pub id: String,
    /// Its key, if keyed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Its message type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
    /// When it falls due.
    pub due: DateTime<Utc>,
}

/// A saga timeout the endpoint's dispatcher sent or gave up on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutDispatch {
    /// The saga's name.
    pub saga_type: String,
    /// The instance's correlation.
    pub correlation: String,
    /// The timeout: its id (its message's), key, type and due time.
    #[serde(flatten)]
    pub mark: TimeoutMark,
}

/// The event of a saga timeout `endpoint`'s dispatcher sent at `at`, or marked
/// dead-lettered after its last dispatch (`taken.dead_lettered`). Its body is not kept:
/// the handled event of the timeout's message has it.
pub(crate) fn timeout_event(endpoint: &str, taken: &TakenTimeout, at: DateTime<Utc>) -> HistoryEvent {
    let (kind, error, reason) = if taken.dead_lettered {
        (
            HistoryKind::TimeoutDeadLettered,
            Some(format!(
                "sent {} times and never settled: its message was dead-lettered by the broker each time (its max \
                 delivery count), or lost; it will not be sent again",
                taken.dispatches
            )),
            Some(crate::recoverability::reasons::TIMEOUT_DISPATCHES_EXHAUSTED.to_owned()),
        )
    } else {
        (HistoryKind::TimeoutDispatched, None, None)
    };
    HistoryEvent {
        endpoint: endpoint.to_owned(),
        kind,
        at,
        message_id: taken.id.clone(),
        message_type: taken.message_type.clone(),
        conversation_id: taken.conversation_id.clone(),
        causation_id: taken.causation_id.clone(),
        attempt: taken.dispatches,
        enqueued_at: None,
        received_at: None,
        detail: HistoryDetail {
            error,
            reason,
            timeout: Some(TimeoutDispatch {
                saga_type: taken.saga_type.clone(),
                correlation: taken.correlation.clone(),
                mark: TimeoutMark {
                    id: taken.id.clone(),
                    key: taken.key.clone(),
                    message_type: taken.message_type.clone(),
                    due: taken.due,
                },
            }),
            ..HistoryDetail::default()
        },
    }
}

/// `event` as Postgres can hold it: every NUL character of its text written as U+FFFD and
/// a body holding one as hex (`text` and `jsonb` refuse NUL), and its times within
/// `timestamptz`'s range (4713 BC to 294276 AD, narrower than chrono's): an optional time
/// outside it is left out, the attempt's end is brought within it. A time a producer
/// stamped (the enqueued time) never fails the handling it describes.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) fn for_postgres(event: &HistoryEvent) -> HistoryEvent {
    let mut e = scrub_nul(event);
    let (first, last) = postgres_time_range();
    let within = |t: DateTime<Utc>| (first..=last).contains(&t);
    e.at = e.at.clamp(first, last);
    if e.enqueued_at.is_some_and(|t| !within(t)) {
        e.enqueued_at = None;
        e.detail
            .cut
            .push("the enqueued time: left out (outside the range Postgres can hold)".to_owned());
    }
    if e.received_at.is_some_and(|t| !within(t)) {
        e.received_at = None;
        e.detail
            .cut
            .push("the received time: left out (outside the range Postgres can hold)".to_owned());
    }
    e
}

/// The first and last instants of Postgres's `timestamptz` (4713 BC and 294276 AD), a day
/// inside each end (the last is chrono's, which ends sooner).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn postgres_time_range() -> (DateTime<Utc>, DateTime<Utc>) {
    let first = chrono::NaiveDate::from_ymd_opt(-4712, 1, 2)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(DateTime::<Utc>::MIN_UTC, |t| t.and_utc());
    let last = chrono::NaiveDate::from_ymd_opt(294_276, 12, 30)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map_or(DateTime::<Utc>::MAX_UTC, |t| t.and_utc());
    (first, last)
}

/// `event` with every NUL character of its text written as U+FFFD, and a body holding one
/// as hex.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn scrub_nul(event: &HistoryEvent) -> HistoryEvent {
    let mut e = event.clone();
    clean(&mut e.endpoint);
    clean(&mut e.message_id);
    clean_opt(&mut e.message_type);
    clean_opt(&mut e.conversation_id);
    clean_opt(&mut e.causation_id);
    let d = &mut e.detail;
    clean_opt(&mut d.error);
    clean_opt(&mut d.reason);
    if let Some(body) = &mut d.body
        && body.contains('\0')
    {
        *body = hex_body(body.as_bytes());
    }
    d.cut.iter_mut().for_each(clean);
    for m in &mut d.sent {
        clean(&mut m.message_id);
        clean_opt(&mut m.message_type);
        clean(&mut m.destination);
    }
    for saga in &mut d.sagas {
        clean(&mut saga.saga_type);
        clean(&mut saga.correlation);
        clean_opt(&mut saga.before);
        clean_opt(&mut saga.after);
        saga.timeouts_cancelled.iter_mut().for_each(clean);
        saga.keys_cancelled.iter_mut().for_each(clean);
        clean_opt(&mut saga.timeout_fired);
        clean_opt(&mut saga.timeout_discarded);
        saga.timeouts_requested.iter_mut().for_each(clean_mark);
    }
    if let Some(t) = &mut d.timeout {
        clean(&mut t.saga_type);
        clean(&mut t.correlation);
        clean_mark(&mut t.mark);
    }
    e
}

/// `s` with every NUL character written as U+FFFD.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn clean(s: &mut String) {
    if s.contains('\0') {
        *s = s.replace('\0', "\u{FFFD}");
    }
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn clean_opt(s: &mut Option<String>) {
    if let Some(s) = s {
        clean(s);
    }
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn clean_mark(t: &mut TimeoutMark) {
    clean(&mut t.id);
    clean_opt(&mut t.key);
    clean_opt(&mut t.message_type);
}

/// A body as the history keeps it: UTF-8 without NUL as it is, anything else as
/// lowercase hex prefixed `hex:`.
pub(crate) fn body_text(body: &[u8]) -> String {
    match std::str::from_utf8(body) {
        Ok(text) if !text.contains('\0') && !text.starts_with("hex:") => text.to_owned(),
        _ => hex_body(body),
    }
}

fn hex_body(body: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(4 + body.len() * 2);
    out.push_str("hex:");
    for b in body {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The event's detail as JSON text.
pub(crate) fn detail_json(event: &HistoryEvent) -> crate::error::Result<String> {
    serde_json::to_string(&event.detail).map_err(|e| {
        crate::error::Error::new(crate::error::ErrorKind::Storage {
            detail: format!(
                "the history of message {:?} does not encode as JSON: {e}",
                event.message_id
            ),
            transient: false,
        })
    })
}

/// `text` cut to at most `max` bytes at a character boundary, and whether it was.
pub(crate) fn cut_text(text: &str, max: usize) -> (&str, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_kind_reads_back_from_its_name() {
        for k in HistoryKind::ALL {
            assert_eq!(HistoryKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(HistoryKind::parse("Handled"), None);
    }

    proptest! {
        #[test]
        fn a_cut_is_a_prefix_at_a_boundary_within_the_limit(text in any::<String>(), max in 0usize..64) {
            let (kept, cut) = cut_text(&text, max);
            prop_assert!(kept.len() <= max || !cut);
            prop_assert!(text.starts_with(kept));
            prop_assert_eq!(cut, text.len() > max);
            prop_assert!(text.len() <= max || kept.len() + 4 > max);
        }
    }
}
