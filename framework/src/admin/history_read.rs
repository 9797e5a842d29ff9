//! What the history's readers share, whatever the database: a row read as it is
//! ([`RawRow`]) and made an event leniently ([`RawRow::into_event`]: what cannot be read
//! is said, never a failure of the listing), the queries each database answers
//! ([`HistoryRows`]), and the assembling of a saga's timeline ([`saga_history`]) and of a
//! message's tree ([`message_history`]) from them.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::history::{
    FoundHistory, FoundInstance, HistoryFilter, MAX_HISTORY_DEPTH, MessageHistory, MessageNode, SagaHistory,
    StoredHistoryEvent, TimelineLink,
};
use super::{AdminError, AdminResult};
use crate::store::history::{HistoryDetail, HistoryEvent, HistoryKind, SagaChange, SentMessage};

/// How many distinct messages of an instance its timeline looks up failed attempts of.
pub(crate) const INSTANCE_MESSAGES: i64 = 10_000;

/// A row of the history table as the database gave it; `problems` holds what its reader
/// could not read already.
#[derive(Debug, Default)]
pub(crate) struct RawRow {
    pub(crate) id: i64,
    pub(crate) endpoint: String,
    pub(crate) kind: String,
    pub(crate) at: Option<DateTime<Utc>>,
    pub(crate) message_id: String,
    pub(crate) message_type: Option<String>,
    pub(crate) conversation_id: Option<String>,
    pub(crate) causation_id: Option<String>,
    pub(crate) attempt: Option<i64>,
    pub(crate) enqueued_at: Option<DateTime<Utc>>,
    pub(crate) received_at: Option<DateTime<Utc>>,
    pub(crate) detail: Option<String>,
    pub(crate) problems: Vec<String>,
}

impl RawRow {
    /// The event, with what could not be read said in its problems.
    pub(crate) fn into_event(self) -> StoredHistoryEvent {
        let mut problems = self.problems;
        let kind = HistoryKind::parse(&self.kind).unwrap_or_else(|| {
            problems.push(format!(
                "its outcome {:?} is none that Courier writes (handled, retried, dead_lettered, duplicate); shown \
                 as retried",
                self.kind
            ));
            HistoryKind::Retried
        });
        let attempt = match self.attempt.map(u32::try_from) {
            Some(Ok(n)) => n,
            Some(Err(_)) => {
                problems.push(format!(
                    "its attempt number {:?} is out of range; shown as 0",
                    self.attempt
                ));
                0
            }
            None => 0,
        };
        let at = self.at.unwrap_or(DateTime::<Utc>::UNIX_EPOCH);
        let detail = match &self.detail {
            Some(text) => parse_detail(text, &mut problems),
            None => HistoryDetail::default(),
        };
        StoredHistoryEvent {
            id: self.id,
            event: HistoryEvent {
                endpoint: self.endpoint,
                kind,
                at,
                message_id: self.message_id,
                message_type: self.message_type,
                conversation_id: self.conversation_id,
                causation_id: self.causation_id,
                attempt,
                enqueued_at: self.enqueued_at,
                received_at: self.received_at,
                detail,
            },
            problems,
            link: None,
        }
    }
}

/// A time in microseconds since the epoch (SQLite's), or a problem said.
pub(crate) fn time_of_micros(v: i64, column: &str, problems: &mut Vec<String>) -> Option<DateTime<Utc>> {
    let t = DateTime::from_timestamp_micros(v);
    if t.is_none() {
        problems.push(format!("its {column} ({v} µs since 1970) is out of range; not shown"));
    }
    t
}

/// `text` as a [`HistoryDetail`]; when it is not one, each member that can be read, and
/// a problem said for each that cannot.
pub(crate) fn parse_detail(text: &str, problems: &mut Vec<String>) -> HistoryDetail {
    if let Ok(detail) = serde_json::from_str::<HistoryDetail>(text) {
        return detail;
    }
    let members = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(members)) => members,
        Ok(_) => {
            problems.push("its detail is JSON but not an object: nothing of it is shown".into());
            return HistoryDetail::default();
        }
        Err(e) => {
            problems.push(format!("its detail is not JSON ({e}): nothing of it is shown"));
            return HistoryDetail::default();
        }
    };
    let mut detail = HistoryDetail::default();
    for (name, value) in members {
        match name.as_str() {
            "error" => detail.error = text_member(value, "error", problems),
            "reason" => detail.reason = text_member(value, "reason", problems),
            "body" => detail.body = text_member(value, "body", problems),
            "cut" => detail.cut = items(value, "cut", problems, |v| v.as_str().map(str::to_owned)),
            "sent" => {
                detail.sent = items(value, "sent", problems, |v| {
                    serde_json::from_value::<SentMessage>(v).ok()
                });
            }
            "sagas" => detail.sagas = items(value, "sagas", problems, saga_change),
            "timeout" if !value.is_null() => match serde_json::from_value(value) {
                Ok(timeout) => detail.timeout = Some(timeout),
                Err(_) => problems.push("its detail's timeout cannot be read: not shown".into()),
            },
            // A member Courier does not write (a later version's): not shown.
            _ => {}
        }
    }
    detail
}

/// A text member: a string as it is, anything else but null as its JSON.
fn text_member(value: Value, name: &str, problems: &mut Vec<String>) -> Option<String> {
    match value {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => {
            problems.push(format!("its detail's {name} is not text; shown as its JSON"));
            Some(other.to_string())
        }
    }
}

/// The items of an array member that `read` can read; a problem said for the others.
fn items<T>(value: Value, name: &str, problems: &mut Vec<String>, read: impl Fn(Value) -> Option<T>) -> Vec<T> {
    let Value::Array(values) = value else {
        if !value.is_null() {
            problems.push(format!("its detail's {name} is not a list: not shown"));
        }
        return Vec::new();
    };
    let mut out = Vec::with_capacity(values.len());
    let mut unread = 0usize;
    for v in values {
        match read(v) {
            Some(item) => out.push(item),
            None => unread += 1,
        }
    }
    if unread > 0 {
        problems.push(format!(
            "{unread} item(s) of its detail's {name} cannot be read: not shown"
        ));
    }
    out
}

/// A saga's change as far as it can be read: the whole, else its instance and states
/// (a change without its saga type and correlation is not one).
fn saga_change(value: Value) -> Option<SagaChange> {
    if let Ok(change) = serde_json::from_value::<SagaChange>(value.clone()) {
        return Some(change);
    }
    let Value::Object(members) = value else {
        return None;
    };
    let text = |name: &str| match members.get(name) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Null) | None => None,
        Some(other) => Some(other.to_string()),
    };
    Some(SagaChange {
        saga_type: text("saga_type")?,
        correlation: text("correlation")?,
        before: text("before"),
        after: text("after"),
        completed: members.get("completed").and_then(Value::as_bool).unwrap_or(false),
        ..SagaChange::default()
    })
}

/// The queries a database answers for the history's readers; rows in time order (then
/// row id), each list at most `limit` long.
#[async_trait]
pub(crate) trait HistoryRows: Send + Sync {
    /// The distinct (message id, endpoint, conversation id) of the events that name the
    /// instance, at most [`INSTANCE_MESSAGES`].
    async fn instance_messages(
        &self,
        saga_type: &str,
        correlation: &str,
    ) -> AdminResult<Vec<(String, String, Option<String>)>>;

    /// The events that name the instance and pass `filter`.
    async fn instance_events(
        &self,
        saga_type: &str,
        correlation: &str,
        filter: &HistoryFilter,
        limit: usize,
    ) -> AdminResult<Vec<RawRow>>;

    /// The events of outcome `kinds` (none handled) that pass `filter`'s times, on one of
    /// `endpoints`: of one of the messages `ids`, or of one of the conversations
    /// `conversations` whose message has no handled event on that endpoint.
    async fn related_failures(
        &self,
        ids: &[String],
        conversations: &[String],
        endpoints: &[String],
        kinds: &[&'static str],
        filter: &HistoryFilter,
        limit: usize,
    ) -> AdminResult<Vec<RawRow>>;

    /// The events of the message `id`.
    async fn of_message(&self, id: &str, limit: usize) -> AdminResult<Vec<RawRow>>;

    /// The events whose causation id is one of `ids`.
    async fn caused_by(&self, ids: &[String], limit: usize) -> AdminResult<Vec<RawRow>>;

    /// The events that pass `filter`, newest first, whose message, conversation or
    /// causation id is `needles.text`, or whose detail's text holds one of `needles`'
    /// forms.
    async fn containing(&self, needles: &Needles, filter: &HistoryFilter, limit: usize) -> AdminResult<Vec<RawRow>>;
}

/// A searched text in the forms the detail's JSON may hold it: as it is (a number, an
/// address without quote or backslash), escaped once (a string member's value), and
/// escaped twice (inside a body kept as a JSON string).
#[derive(Debug, Clone)]
pub(crate) struct Needles {
    pub(crate) text: String,
    pub(crate) escaped: String,
    pub(crate) twice: String,
}

impl Needles {
    /// The needles as Postgres holds the text: its text holds no NUL, so a NUL in an id
    /// or an error was written as U+FFFD (`history::for_postgres`); in a state or a body,
    /// JSON held it escaped (`\u0000`), as the escaped forms already say.
    #[cfg(feature = "postgres")]
    pub(crate) fn as_postgres_stores(&self) -> Self {
        Self {
            text: self.text.replace('\0', "\u{FFFD}"),
            ..self.clone()
        }
    }

    pub(crate) fn of(text: &str) -> AdminResult<Self> {
        if text.is_empty() {
            return Err(AdminError::Invalid {
                what: "search text".into(),
                reason: "it is empty: give the text to find (an e-mail address, an order number, a message id)".into(),
            });
        }
        let escape = |t: &str| {
            let quoted = serde_json::to_string(t).unwrap_or_default();
            quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .unwrap_or(&quoted)
                .to_owned()
        };
        let escaped = escape(text);
        let twice = escape(&escaped);
        Ok(Self {
            text: text.to_owned(),
            escaped,
            twice,
        })
    }
}

/// The events holding `text` and the instances they name ([`HistoryAdmin::find`](super::HistoryAdmin::find)).
pub(crate) async fn find<R: HistoryRows + ?Sized>(
    rows: &R,
    text: &str,
    filter: &HistoryFilter,
) -> AdminResult<FoundHistory> {
    let needles = Needles::of(text)?;
    let limit = filter.bound();
    let mut events: Vec<StoredHistoryEvent> = rows
        .containing(&needles, filter, limit + 1)
        .await?
        .into_iter()
        .map(RawRow::into_event)
        .collect();
    let more = events.len() > limit;
    events.truncate(limit);
    let mut instances: Vec<FoundInstance> = Vec::new();
    for e in &events {
        for (saga_type, correlation) in e.event.instances() {
            match instances
                .iter_mut()
                .find(|i| i.saga_type == saga_type && i.correlation == correlation)
            {
                Some(found) => {
                    found.events += 1;
                    found.last_at = found.last_at.max(e.event.at);
                }
                None => instances.push(FoundInstance {
                    saga_type: saga_type.to_owned(),
                    correlation: correlation.to_owned(),
                    events: 1,
                    last_at: e.event.at,
                }),
            }
        }
    }
    instances.sort_by_key(|i| std::cmp::Reverse(i.last_at));
    Ok(FoundHistory {
        text: text.to_owned(),
        events,
        instances,
        more,
    })
}

/// A limit as SQL takes it.
pub(crate) fn sql_limit(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn not_recorded(what: String) -> AdminError {
    AdminError::not_found(what)
}

/// A saga instance's timeline ([`HistoryAdmin::saga_history`](super::HistoryAdmin::saga_history)).
pub(crate) async fn saga_history<R: HistoryRows + ?Sized>(
    rows: &R,
    saga_type: &str,
    correlation: &str,
    filter: &HistoryFilter,
) -> AdminResult<SagaHistory> {
    let messages = rows.instance_messages(saga_type, correlation).await?;
    if messages.is_empty() {
        return Err(not_recorded(format!(
            "history of saga {saga_type} instance {:?}",
            correlation
        )));
    }
    let limit = filter.bound();
    let mut events: Vec<StoredHistoryEvent> = rows
        .instance_events(saga_type, correlation, filter, limit + 1)
        .await?
        .into_iter()
        .map(|r| StoredHistoryEvent {
            link: Some(TimelineLink::Instance),
            ..r.into_event()
        })
        .collect();
    let mut more = events.len() > limit;
    let failed: Vec<&'static str> = [HistoryKind::Retried, HistoryKind::DeadLettered, HistoryKind::Duplicate]
        .into_iter()
        .filter(|k| filter.outcomes.is_empty() || filter.outcomes.contains(k))
        .map(HistoryKind::as_str)
        .collect();
    if !failed.is_empty() {
        let pairs: HashSet<(&str, &str)> = messages.iter().map(|(m, e, _)| (m.as_str(), e.as_str())).collect();
        let mut ids: Vec<String> = messages.iter().map(|(m, _, _)| m.clone()).collect();
        let mut endpoints: Vec<String> = messages.iter().map(|(_, e, _)| e.clone()).collect();
        let mut conversations: Vec<String> = messages.iter().filter_map(|(_, _, c)| c.clone()).collect();
        for list in [&mut ids, &mut endpoints, &mut conversations] {
            list.sort_unstable();
            list.dedup();
        }
        let known: HashSet<i64> = events.iter().map(|e| e.id).collect();
        let related = rows
            .related_failures(&ids, &conversations, &endpoints, &failed, filter, limit + 1)
            .await?;
        more |= related.len() > limit;
        let conversations: HashSet<&str> = conversations.iter().map(String::as_str).collect();
        for row in related {
            if known.contains(&row.id) {
                continue;
            }
            let event = row.into_event();
            let e = &event.event;
            let link = if pairs.contains(&(e.message_id.as_str(), e.endpoint.as_str())) {
                TimelineLink::SameMessage
            } else if e.conversation_id.as_deref().is_some_and(|c| conversations.contains(c)) {
                TimelineLink::SameConversation
            } else {
                continue;
            };
            events.push(StoredHistoryEvent {
                link: Some(link),
                ..event
            });
        }
    }
    events.sort_by_key(|a| (a.event.at, a.id));
    more |= events.len() > limit;
    events.truncate(limit);
    Ok(SagaHistory {
        saga_type: saga_type.to_owned(),
        correlation: correlation.to_owned(),
        events,
        more,
    })
}

/// What the walk of a conversation gathered.
#[derive(Default)]
struct Gathered {
    /// Each message's events, by id.
    events: HashMap<String, Vec<StoredHistoryEvent>>,
    /// Each message's children, in the order they were found.
    children: HashMap<String, Vec<String>>,
    /// Each placed message's parent (the root has none).
    parent: HashMap<String, Option<String>>,
    left_out: Vec<String>,
}

/// A message's tree ([`HistoryAdmin::message_history`](super::HistoryAdmin::message_history)).
pub(crate) async fn message_history<R: HistoryRows + ?Sized>(
    rows: &R,
    message_id: &str,
    filter: &HistoryFilter,
) -> AdminResult<MessageHistory> {
    let budget = filter.bound();
    let mut g = Gathered::default();
    g.parent.insert(message_id.to_owned(), None);
    let own = rows.of_message(message_id, budget + 1).await?;
    let mut read = own.len().min(budget);
    let mut cut = own.len() > budget;
    g.events.insert(
        message_id.to_owned(),
        own.into_iter().take(budget).map(RawRow::into_event).collect(),
    );
    let mut frontier = vec![message_id.to_owned()];
    let mut depth = 0;
    let mut loops = 0usize;
    while !frontier.is_empty() && !cut {
        if depth == MAX_HISTORY_DEPTH {
            g.left_out.push(format!(
                "the messages more than {MAX_HISTORY_DEPTH} levels below {:?}: read the history of one of the \
                 deepest messages shown",
                message_id
            ));
            break;
        }
        let remaining = budget - read;
        let found = rows.caused_by(&frontier, remaining + 1).await?;
        cut = found.len() > remaining;
        read += found.len().min(remaining);
        let mut next = Vec::new();
        for row in found.into_iter().take(remaining) {
            let Some(parent) = row.causation_id.clone() else {
                continue;
            };
            let id = row.message_id.clone();
            match g.parent.get(&id) {
                None => {
                    g.parent.insert(id.clone(), Some(parent.clone()));
                    g.children.entry(parent).or_default().push(id.clone());
                    next.push(id.clone());
                }
                Some(Some(p)) if *p == parent => {}
                Some(_) => {
                    // Its id is already in the tree elsewhere: a loop of causation ids,
                    // or a message id used twice.
                    loops += 1;
                    continue;
                }
            }
            g.events.entry(id).or_default().push(row.into_event());
        }
        frontier = next;
        depth += 1;
    }
    if cut {
        g.left_out.push(format!(
            "events past the first {budget} read: the tree may miss messages and events (raise the limit, at most \
             {}, or read the history of one of the messages shown)",
            super::history::MAX_HISTORY_EVENTS
        ));
    }
    if loops > 0 {
        g.left_out.push(format!(
            "{loops} event(s) of messages already in the tree under another parent (a loop of causation ids, or \
             a message id used twice): each message is shown once"
        ));
    }
    if g.events.values().all(Vec::is_empty) {
        return Err(not_recorded(format!("history of message {:?}", message_id)));
    }
    let mut root = build(&mut g, message_id, 0);
    if filter.narrows() {
        keep(&mut root, filter);
    }
    Ok(MessageHistory {
        root,
        left_out: g.left_out,
    })
}

/// The node of `id` and, below it, its children from `g`, and the messages its handled
/// events sent or requested that have no event (not handled yet, or by an endpoint that
/// keeps no history).
fn build(g: &mut Gathered, id: &str, depth: usize) -> MessageNode {
    let events = g.events.remove(id).unwrap_or_default();
    let mut caused: Vec<MessageNode> = g
        .children
        .remove(id)
        .unwrap_or_default()
        .iter()
        .map(|child| build(g, child, depth + 1))
        .collect();
    if depth < MAX_HISTORY_DEPTH {
        for e in events.iter().filter(|e| e.event.kind == HistoryKind::Handled) {
            for sent in &e.event.detail.sent {
                if let Some(node) = caused.iter_mut().find(|n| n.message_id == sent.message_id) {
                    node.sent.get_or_insert_with(|| sent.clone());
                    node.message_type = node.message_type.take().or_else(|| sent.message_type.clone());
                } else if !g.parent.contains_key(&sent.message_id) {
                    g.parent.insert(sent.message_id.clone(), Some(id.to_owned()));
                    caused.push(leaf(&sent.message_id, sent.message_type.clone()));
                    if let Some(node) = caused.last_mut() {
                        node.sent = Some(sent.clone());
                    }
                }
            }
            for t in e.event.detail.sagas.iter().flat_map(|s| &s.timeouts_requested) {
                if let Some(node) = caused.iter_mut().find(|n| n.message_id == t.id) {
                    node.timeout.get_or_insert_with(|| t.clone());
                    node.message_type = node.message_type.take().or_else(|| t.message_type.clone());
                } else if !g.parent.contains_key(&t.id) {
                    g.parent.insert(t.id.clone(), Some(id.to_owned()));
                    caused.push(leaf(&t.id, t.message_type.clone()));
                    if let Some(node) = caused.last_mut() {
                        node.timeout = Some(t.clone());
                    }
                }
            }
        }
    }
    // Handled first in time, then those without an event in the order they were sent.
    caused.sort_by_key(|n| n.events.first().map(|e| (e.event.at, e.id)).is_none());
    let message_type = events.iter().find_map(|e| e.event.message_type.clone());
    MessageNode {
        message_id: id.to_owned(),
        message_type,
        sent: None,
        timeout: None,
        events,
        caused,
    }
}

fn leaf(id: &str, message_type: Option<String>) -> MessageNode {
    MessageNode {
        message_id: id.to_owned(),
        message_type,
        sent: None,
        timeout: None,
        events: Vec::new(),
        caused: Vec::new(),
    }
}

/// Leaves in `node` only the events `filter` admits, and the children that have one or
/// have a descendant that has one; whether `node` has any.
fn keep(node: &mut MessageNode, filter: &HistoryFilter) -> bool {
    node.events.retain(|e| filter.admits(&e.event));
    node.caused.retain_mut(|child| keep(child, filter));
    !node.events.is_empty() || !node.caused.is_empty()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_detail_of_the_wrong_shape_gives_what_can_be_read_and_says_what_cannot() {
        let mut problems = Vec::new();
        let d = parse_detail(
            r#"{"error": 42, "sent": [{"message_id": "m-2", "destination": "billing"}, 7],
                "sagas": [{"saga_type": "Order", "correlation": "o-1", "after": {"n": 1}, "timeouts_cancelled": 3}],
                "cut": "x", "future": true}"#,
            &mut problems,
        );
        assert_eq!(d.error.as_deref(), Some("42"));
        assert_eq!(d.sent.len(), 1);
        assert_eq!(d.sagas[0].correlation, "o-1");
        assert_eq!(d.sagas[0].after.as_deref(), Some(r#"{"n":1}"#));
        assert!(d.cut.is_empty());
        assert_eq!(problems.len(), 3, "{problems:?}");

        for text in ["not json", "[1, 2]", ""] {
            let mut problems = Vec::new();
            assert_eq!(parse_detail(text, &mut problems), HistoryDetail::default());
            assert_eq!(problems.len(), 1, "{text}: {problems:?}");
        }
    }

    #[test]
    fn an_unknown_outcome_and_an_attempt_out_of_range_are_said() {
        let row = RawRow {
            id: 7,
            endpoint: "orders".into(),
            kind: "exploded".into(),
            message_id: "m-1".into(),
            attempt: Some(-3),
            detail: Some("{}".into()),
            ..RawRow::default()
        };
        let e = row.into_event();
        assert_eq!(e.event.kind, HistoryKind::Retried);
        assert_eq!(e.event.attempt, 0);
        assert_eq!(e.problems.len(), 2, "{:?}", e.problems);
    }
}
