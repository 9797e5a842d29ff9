//! A workflow's history, as an endpoint records it (issue 33, docs/history.md): the
//! option ([`HistoryOptions`], [`EndpointBuilder::history`]), the refusals at start, and
//! the [`Recorder`] that turns a handling into a [`HistoryEvent`]: what it sent, what it
//! did to each saga instance, its outcome. The states and bodies kept are cut to the
//! limits and stripped of the fields the application marks as never to be stored, and the
//! event says so. Where the events go and when: `runtime/handle.rs` (a handled event in
//! the handling's transaction), `runtime/failures.rs` (a failed attempt, on its own).

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::EndpointBuilder;
use super::observe::SagaEffects;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, ReceivedMessage};
use crate::store::TakenTimeout;
use crate::store::history::{
    HistoryDetail, HistoryEvent, HistoryKind, SagaChange, SentMessage, TimeoutMark, body_text, cut_text,
};

/// How long history events are kept by default.
pub const DEFAULT_HISTORY_RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);

/// The default limit on one saga state (before or after) and on a body kept.
pub const DEFAULT_HISTORY_MAX_BYTES: usize = 16 * 1024;

/// What an endpoint's history keeps ([`EndpointBuilder::history`]).
///
/// ```
/// use std::time::Duration;
/// use courier::HistoryOptions;
/// let history = HistoryOptions::new()
///     .keep_for(Duration::from_secs(14 * 24 * 3600))
///     .with_bodies(true)
///     .redact(["email", "card_number"]);
/// # let _ = history;
/// ```
#[derive(Debug, Clone)]
pub struct HistoryOptions {
    retention: Duration,
    bodies: bool,
    max_state_bytes: usize,
    max_body_bytes: usize,
    redacted: BTreeSet<String>,
}

impl Default for HistoryOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl HistoryOptions {
    /// Kept [`DEFAULT_HISTORY_RETENTION`], without bodies, states cut at
    /// [`DEFAULT_HISTORY_MAX_BYTES`], nothing redacted.
    pub fn new() -> Self {
        Self {
            retention: DEFAULT_HISTORY_RETENTION,
            bodies: false,
            max_state_bytes: DEFAULT_HISTORY_MAX_BYTES,
            max_body_bytes: DEFAULT_HISTORY_MAX_BYTES,
            redacted: BTreeSet::new(),
        }
    }

    /// How long events are kept: the endpoint's janitor deletes older ones.
    pub fn keep_for(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// Whether each handled message's body is kept (cut at the body limit).
    pub fn with_bodies(mut self, keep: bool) -> Self {
        self.bodies = keep;
        self
    }

    /// The most bytes of one saga state (before or after) kept; a longer one is cut and
    /// the event says so.
    pub fn max_state_bytes(mut self, bytes: usize) -> Self {
        self.max_state_bytes = bytes;
        self
    }

    /// The most bytes of a body kept; a longer one is cut and the event says so.
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = bytes;
        self
    }

    /// Fields never stored: a JSON member of one of these names, at any depth of a saga
    /// state or a message body, is written as `"[redacted]"`. A body with such names set
    /// that is not JSON is not kept at all.
    pub fn redact<I, S>(mut self, fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.redacted.extend(fields.into_iter().map(Into::into));
        self
    }

    /// The retention.
    pub fn retention(&self) -> Duration {
        self.retention
    }
}

impl EndpointBuilder {
    /// Keeps a history of every handling of a message (off by default; docs/history.md):
    /// a handled message's event commits in the transaction of its effects, a failed
    /// attempt's is written on its own. `courier history` and the console read it.
    pub fn history(mut self, options: HistoryOptions) -> Self {
        self.history = Some(options);
        self
    }
}

/// Refuses a history the endpoint cannot keep, saying what to do.
pub(super) fn check_start(
    endpoint: &str,
    options: &HistoryOptions,
    store: Option<&dyn crate::store::Store>,
) -> Result<()> {
    let invalid = |reason: String| Err(Error::new(ErrorKind::InvalidOptions { reason }));
    let Some(store) = store else {
        return invalid(format!(
            "endpoint {endpoint} keeps a history (EndpointBuilder::history) but has no store: the history is written \
             in the store's transactions; call EndpointBuilder::store"
        ));
    };
    if !store.keeps_history() {
        return invalid(format!(
            "endpoint {endpoint} keeps a history, but its store ({}) does not keep one; use PostgresStore, \
             SqliteStore, Embedded::store or PostgresTransport::store, or turn the history off",
            store.name()
        ));
    }
    if options.retention < Duration::from_secs(60) {
        return invalid(format!(
            "endpoint {endpoint}: the history's retention ({:?}) must be at least a minute",
            options.retention
        ));
    }
    if options.max_state_bytes == 0 || options.max_body_bytes == 0 {
        return invalid(format!(
            "endpoint {endpoint}: the history's size limits must be at least 1 byte (turn bodies off with \
             HistoryOptions::with_bodies(false))"
        ));
    }
    Ok(())
}

/// Builds the events of one endpoint's history.
#[derive(Debug)]
pub(crate) struct Recorder {
    endpoint: String,
    options: HistoryOptions,
}

/// When and which attempt: the event's frame.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt {
    pub(crate) number: u32,
    pub(crate) received_at: Option<DateTime<Utc>>,
    pub(crate) at: DateTime<Utc>,
}

impl Recorder {
    pub(crate) fn new(endpoint: &str, options: HistoryOptions) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            options,
        }
    }

    /// The history's retention.
    pub(crate) fn retention(&self) -> Duration {
        self.options.retention
    }

    /// A handled message: what it sent and did to its saga instances.
    pub(crate) fn handled(
        &self,
        received: &ReceivedMessage,
        attempt: Attempt,
        sent: &[(String, bool, Envelope)],
        sagas: &[SagaEffects],
    ) -> HistoryEvent {
        let mut detail = HistoryDetail {
            sent: sent
                .iter()
                .map(|(destination, topic, e)| SentMessage {
                    message_id: e.message_id.clone(),
                    message_type: e.message_type.clone(),
                    destination: destination.clone(),
                    topic: *topic,
                    due: e.scheduled_enqueue_time,
                })
                .collect(),
            ..HistoryDetail::default()
        };
        for effects in sagas {
            let change = self.saga_change(effects, &mut detail.cut);
            detail.sagas.push(change);
        }
        self.event(received, attempt, HistoryKind::Handled, detail)
    }

    /// An attempt that failed and rolled back: `kind` is retried or dead-lettered.
    pub(crate) fn failed(
        &self,
        received: &ReceivedMessage,
        attempt: Attempt,
        kind: HistoryKind,
        error: String,
        reason: Option<String>,
    ) -> HistoryEvent {
        let detail = HistoryDetail {
            error: Some(error),
            reason,
            ..HistoryDetail::default()
        };
        self.event(received, attempt, kind, detail)
    }

    /// A message the inbox knew: completed without handling.
    pub(crate) fn duplicate(&self, received: &ReceivedMessage, attempt: Attempt) -> HistoryEvent {
        self.event(received, attempt, HistoryKind::Duplicate, HistoryDetail::default())
    }

    /// A saga timeout the dispatcher sent at `at`, or marked dead-lettered after its
    /// last dispatch (see [`timeout_event`](crate::store::history::timeout_event)).
    pub(crate) fn timeout(&self, taken: &TakenTimeout, at: DateTime<Utc>) -> HistoryEvent {
        crate::store::history::timeout_event(&self.endpoint, taken, at)
    }

    fn event(
        &self,
        received: &ReceivedMessage,
        attempt: Attempt,
        kind: HistoryKind,
        mut detail: HistoryDetail,
    ) -> HistoryEvent {
        let envelope = &received.envelope;
        if self.options.bodies {
            detail.body = self.body(&envelope.body, &mut detail.cut);
        }
        HistoryEvent {
            endpoint: self.endpoint.clone(),
            kind,
            at: attempt.at,
            message_id: envelope.message_id.clone(),
            message_type: envelope.message_type.clone(),
            conversation_id: envelope.correlation_id.clone(),
            causation_id: envelope.causation_id.clone(),
            attempt: attempt.number,
            enqueued_at: Some(received.broker.enqueued_time),
            received_at: attempt.received_at,
            detail,
        }
    }

    fn saga_change(&self, effects: &SagaEffects, cut: &mut Vec<String>) -> SagaChange {
        let mut state = |which: &str, json: &Option<String>| {
            json.as_deref().map(|text| {
                let what = format!("the state {which} of {} {:?}", effects.saga_type, effects.correlation);
                self.kept(text, self.options.max_state_bytes, &what, cut)
                    .unwrap_or_default()
            })
        };
        let before = state("before", &effects.before);
        let after = state("after", &effects.after);
        SagaChange {
            saga_type: effects.saga_type.to_owned(),
            correlation: effects.correlation.clone(),
            before,
            after,
            completed: effects.completed,
            timeouts_requested: effects
                .requested
                .iter()
                .map(|t| TimeoutMark {
                    id: t.id.clone(),
                    key: t.key.clone(),
                    message_type: t.envelope.message_type.clone(),
                    due: t.due,
                })
                .collect(),
            timeouts_cancelled: effects.cancelled.clone(),
            keys_cancelled: effects.cancelled_keys.clone(),
            timeout_fired: effects.fired.clone(),
            timeout_discarded: effects.discarded.clone(),
        }
    }

    /// A body as kept: redacted, then cut; `None` when it cannot be redacted.
    fn body(&self, body: &[u8], cut: &mut Vec<String>) -> Option<String> {
        if self.options.redacted.is_empty() {
            let text = body_text(body);
            let (kept, was_cut) = cut_text(&text, self.options.max_body_bytes);
            if was_cut {
                cut.push(format!("the body: {} of {} bytes kept", kept.len(), text.len()));
            }
            return Some(kept.to_owned());
        }
        match std::str::from_utf8(body) {
            Ok(text) => self.kept(text, self.options.max_body_bytes, "the body", cut),
            Err(_) => {
                cut.push("the body: not kept (not UTF-8, so the redacted fields cannot be removed)".to_owned());
                None
            }
        }
    }

    /// `text` (JSON, when redaction is on) redacted and cut, noting in `cut` what was
    /// done; `None` when redaction is on and `text` is not JSON.
    fn kept(&self, text: &str, max: usize, what: &str, cut: &mut Vec<String>) -> Option<String> {
        let redacted;
        let text = if self.options.redacted.is_empty() {
            text
        } else {
            let Ok(mut value) = serde_json::from_str::<serde_json::Value>(text) else {
                cut.push(format!(
                    "{what}: not kept (not JSON, so the redacted fields cannot be removed)"
                ));
                return None;
            };
            let mut names = BTreeSet::new();
            redact(&mut value, &self.options.redacted, &mut names);
            if !names.is_empty() {
                let names: Vec<&str> = names.into_iter().collect();
                cut.push(format!("{what}: redacted {}", names.join(", ")));
            }
            redacted = value.to_string();
            redacted.as_str()
        };
        let (kept, was_cut) = cut_text(text, max);
        if was_cut {
            cut.push(format!("{what}: {} of {} bytes kept", kept.len(), text.len()));
        }
        Some(kept.to_owned())
    }
}

/// Replaces the value of every member named in `fields`, at any depth, by
/// `"[redacted]"`; the names found go in `found`.
fn redact<'a>(value: &mut serde_json::Value, fields: &'a BTreeSet<String>, found: &mut BTreeSet<&'a str>) {
    match value {
        serde_json::Value::Object(members) => {
            for (name, v) in members.iter_mut() {
                if let Some(field) = fields.get(name.as_str()) {
                    *v = serde_json::Value::String("[redacted]".to_owned());
                    found.insert(field.as_str());
                } else {
                    redact(v, fields, found);
                }
            }
        }
        serde_json::Value::Array(items) => {
            for v in items {
                redact(v, fields, found);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn recorder(options: HistoryOptions) -> Recorder {
        Recorder::new("orders", options)
    }

    #[test]
    fn a_redacted_field_is_never_kept_at_any_depth() {
        let r = recorder(HistoryOptions::new().redact(["email"]));
        let mut cut = Vec::new();
        let kept = r
            .kept(
                r#"{"email":"a@b.c","lines":[{"email":"x@y.z","sku":"A1"}],"n":1}"#,
                1 << 20,
                "the state after",
                &mut cut,
            )
            .unwrap();
        assert!(!kept.contains("@"), "{kept}");
        assert!(kept.contains("A1"));
        assert_eq!(cut, vec!["the state after: redacted email".to_owned()]);
    }

    #[test]
    fn with_redaction_a_body_that_is_not_json_is_not_kept_and_the_event_says_so() {
        let r = recorder(HistoryOptions::new().redact(["email"]).with_bodies(true));
        let mut cut = Vec::new();
        assert_eq!(r.body(b"email=a@b.c", &mut cut), None);
        assert!(cut[0].contains("not JSON"), "{cut:?}");
        let mut cut = Vec::new();
        assert_eq!(r.body(&[0xff, 0xfe], &mut cut), None);
        assert!(cut[0].contains("not UTF-8"), "{cut:?}");
    }

    #[test]
    fn a_long_state_is_cut_and_the_event_says_so() {
        let r = recorder(HistoryOptions::new().max_state_bytes(8));
        let mut cut = Vec::new();
        let kept = r.kept(r#"{"a":"0123456789"}"#, 8, "the state after", &mut cut).unwrap();
        assert_eq!(kept, r#"{"a":"01"#);
        assert_eq!(cut, vec!["the state after: 8 of 18 bytes kept".to_owned()]);
    }

    #[test]
    fn a_body_that_is_not_utf8_is_kept_as_hex() {
        let r = recorder(HistoryOptions::new().with_bodies(true));
        let mut cut = Vec::new();
        assert_eq!(r.body(&[0, 0xff], &mut cut).as_deref(), Some("hex:00ff"));
        assert!(cut.is_empty());
    }
}
