//! A saga instance's timeline (`/history/saga?saga=S&correlation=C`, linked from the
//! instance's page): its time axis (svg.rs), then one row per event, oldest first: time,
//! message (a link to its page), outcome (failures with their error and reason), attempt,
//! endpoint, and how the event is tied to the instance (a failed attempt found by its
//! conversation is a guess, marked so); below it what it did: the state's diff (each
//! member removed and added, in colour, from `courier_cli::diff`, as `courier history
//! saga` prints it), the timeouts it requested, cancelled, fired or discarded, and the
//! messages it sent. Filters by time and outcome, as the command.

use axum::response::IntoResponse;
use courier::admin::{SagaHistory, StoredHistoryEvent, TimelineLink};
use courier::{HistoryKind, SagaChange, SentMessage};
use maud::{Markup, html};

use super::events::{
    HistoryQuery, family, history_admin, history_error, kind_words, message_ref, outcome, time_ms, timeline_link,
    timeout_kind,
};
use super::layout::{PageError, PageResult, Q, Viewer, Width, clip, page, time};
use super::queues::encode;
use super::svg::{AxisMark, Mark, time_axis};
use super::{Shared, State};
use crate::diff::{Change, StateDiff, compact, diff_states};

/// The most changes of one state shown (the rest is counted).
const SHOWN_CHANGES: usize = 50;

/// The most characters of one value in a diff (the rest is on hover).
const SHOWN_VALUE: usize = 300;

/// `GET /history/saga?saga=S&correlation=C&since=&until=&outcome=&limit=`.
pub(crate) async fn saga_history(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    Q(pairs): Q<Vec<(String, String)>>,
) -> PageResult {
    let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let (Some(saga), Some(correlation)) = (get("saga"), get("correlation")) else {
        return Err(PageError::bad_request(
            "a saga's history needs its name and correlation (saga=...&correlation=...): open it from the saga's page",
        ));
    };
    let admin = history_admin(&state)?;
    let query = HistoryQuery::parse(&pairs);
    let filter = query.filter()?;
    let h = admin
        .saga_history(&saga, &correlation, &filter)
        .await
        .map_err(history_error)?;
    let body = html! {
        p.small.crumbs {
            a href="/sagas" { "Sagas" } " › " a href=(format!("/sagas/list?saga={}", encode(&saga))) { (saga) } " › "
            a href=(format!("/sagas/instance?saga={}&correlation={}", encode(&saga), encode(&correlation))) { (correlation) }
            " › history"
        }
        h1 { "History of " (saga) " " (correlation) }
        p.muted.small { (admin.describe()) ". The instance's page shows its state now, if it has not completed." }
        (query.form("/history/saga", &[("saga", &saga), ("correlation", &correlation)]))
        (timeline(&h, &query))
    };
    Ok(page(&state, &viewer, &format!("History of {saga} {correlation}"), &body).into_response())
}

/// The link to an instance's timeline, for its page.
pub(crate) fn link_from_instance(state: &State, saga: &str, correlation: &str) -> Markup {
    html! {
        @if state.workflow_history.is_some() {
            p #history-link { a href=(timeline_link(saga, correlation)) { "History of this instance" } " — every message it handled, its state's changes, its failed attempts and timeouts." }
        }
    }
}

/// The page of an instance the store does not hold (completed, or never started), with
/// the link to its history (404).
pub(crate) fn no_instance(state: &State, viewer: &Viewer, saga: &str, correlation: &str) -> axum::response::Response {
    let body = html! {
        p.small.crumbs { a href="/sagas" { "Sagas" } " › " a href=(format!("/sagas/list?saga={}", encode(saga))) { (saga) } " › " (correlation) }
        h1 { (saga) " " (correlation) }
        p.flash.bad #no-instance {
            "The store holds no instance " (correlation) " of saga " (saga) " now: it completed (by its handlers or by "
            "hand), or never started. Its history stays for the endpoints' retention."
        }
        p #history-link { a href=(timeline_link(saga, correlation)) { "History of this instance" } }
    };
    (
        axum::http::StatusCode::NOT_FOUND,
        page(state, viewer, &format!("{saga} {correlation}"), &body),
    )
        .into_response()
}

fn timeline(h: &SagaHistory, query: &HistoryQuery) -> Markup {
    let marks = axis_marks(h);
    let more = h.events.last().filter(|_| h.more).map(|last| {
        let mut next = query.clone();
        next.since = last.event.at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
        let link = format!(
            "/history/saga?saga={}&correlation={}{}",
            encode(&h.saga_type),
            encode(&h.correlation),
            next.carry()
        );
        (link, last.event.at)
    });
    html! {
        p #count {
            (h.events.len()) " event(s)"
            @if h.more { ": the first " (h.events.len()) " read" }
            "."
        }
        @if h.events.is_empty() {
            p.muted #empty { "No event passes the filters (since, until, outcome)." }
        } @else {
            (time_axis(&marks))
            table #timeline {
                thead { tr {
                    th { "Time (UTC)" } th { "Message" } th { "Outcome" } th.n { "Attempt" } th { "Endpoint" } th { "Tie" }
                } }
                @for e in &h.events {
                    tbody.event data-id=(e.id) data-kind=(e.event.kind.as_str()) {
                        tr class=(format!("head k-{}", family(e.event.kind))) {
                            td.mono.nowrap { (time_ms(e.event.at)) }
                            td { (message_ref(e.event.message_type.as_deref(), &e.event.message_id)) }
                            td.err.outcome { (outcome(e)) }
                            td.n { (e.event.attempt) }
                            td { (clip(&e.event.endpoint, Width::S)) }
                            td.link { (tie(e)) }
                        }
                        @let did = what_it_did(h, e);
                        @if !did.0.is_empty() {
                            tr.did { td {} td colspan="5" { (did) } }
                        }
                    }
                }
            }
            @if let Some((link, from)) = more {
                p #more {
                    "More events pass the filters than were read: "
                    a href=(link) { "read on from " (time(from)) }
                    " (or raise the number of events read)."
                }
            }
        }
    }
}

/// How an event is tied to the instance, in words.
fn tie(e: &StoredHistoryEvent) -> Markup {
    match e.link {
        Some(TimelineLink::SameConversation) => html! {
            span.guess title="A failed attempt names no instance (it rolled back): this one is of a message never \
                handled, in a conversation of this instance's messages, on one of its endpoints; most likely this \
                instance's, possibly another saga's or handler's of the same conversation." {
                "≈ same conversation (a guess)"
            }
        },
        Some(TimelineLink::SameMessage) => html! {
            span.muted title="A failed attempt or duplicate of a message this instance handled, on the same endpoint." { "same message" }
        },
        Some(TimelineLink::Instance) => html! { span.muted { "instance" } },
        _ => html! { span.muted { "-" } },
    }
}

/// Below an event: what it did to the instance, what it sent, and what could not be read.
fn what_it_did(h: &SagaHistory, e: &StoredHistoryEvent) -> Markup {
    let d = &e.event.detail;
    let change = d
        .sagas
        .iter()
        .find(|s| s.saga_type == h.saga_type && s.correlation == h.correlation);
    let rolled_back = e.link == Some(TimelineLink::SameMessage) && e.event.kind != HistoryKind::Duplicate;
    let nothing = change.is_none()
        && d.timeout.is_none()
        && d.sent.is_empty()
        && d.cut.is_empty()
        && e.problems.is_empty()
        && !rolled_back;
    if nothing {
        return html! {};
    }
    html! {
        @if let Some(c) = change {
            (state_diff(c))
            (timeouts(c))
        }
        (dispatched(e))
        (sent(&d.sent))
        @if rolled_back { p.muted.small { "Rolled back: nothing of this attempt changed the state or was sent." } }
        @for c in &d.cut { p.muted.small { "Cut: " (c) } }
        @for p in &e.problems { p.bad.small { "Unreadable: " (p) } }
    }
}

/// The state's change as a diff: each member's path, its value removed, its value added.
pub(crate) fn state_diff(c: &SagaChange) -> Markup {
    let diff = diff_states(c.before.as_deref(), c.after.as_deref());
    html! {
        div.state-change {
            @match &diff {
                StateDiff::Started(v) => {
                    span.muted.small { "started with " }
                    code.added title=(compact(v, 2000)) { (compact(v, SHOWN_VALUE)) }
                }
                StateDiff::Unchanged => span.muted.small { "state unchanged" },
                StateDiff::Changes(changes) => {
                    table.diff {
                        @for ch in changes.iter().take(SHOWN_CHANGES) { (change_row(ch)) }
                    }
                    @if changes.len() > SHOWN_CHANGES {
                        p.muted.small { "… " (changes.len() - SHOWN_CHANGES) " more changes (courier history saga --json has the states)." }
                    }
                }
                StateDiff::Unreadable { which, bytes } => p.muted.small {
                    "No diff: the state " (which) " (" (bytes) " bytes) is not JSON (cut to the history's size limit, "
                    "or not written as JSON; courier history saga --json has it)."
                },
                _ => @if !c.completed { span.muted.small { "state not recorded" } },
            }
            @if c.completed { " " span.kind.k-other.completed { "completed" } }
        }
    }
}

fn change_row(ch: &Change) -> Markup {
    let (path, before, after) = match ch {
        Change::Changed { path, before, after } => (path, Some(before), Some(after)),
        Change::Added { path, after } => (path, None, Some(after)),
        Change::Removed { path, before } => (path, Some(before), None),
    };
    html! {
        tr {
            td.path.mono { (path.to_string()) }
            td.mono { @match before {
                Some(v) => { span.sign.del { "− " } del title=(compact(v, 2000)) { (compact(v, SHOWN_VALUE)) } },
                None => span.muted { "(absent)" },
            } }
            td.mono { @match after {
                Some(v) => { span.sign.ins { "+ " } ins title=(compact(v, 2000)) { (compact(v, SHOWN_VALUE)) } },
                None => span.muted { "(absent)" },
            } }
        }
    }
}

/// The timeouts an event requested, cancelled, fired or discarded.
/// A request under a key cancels any pending timeout of that key first: that is said with
/// the request, not as a cancellation of its own (as `courier history saga` says it).
pub(crate) fn timeouts(c: &SagaChange) -> Markup {
    let replaced = |key: &str| c.keys_cancelled.iter().any(|k| k == key);
    let requested = |key: &str| c.timeouts_requested.iter().any(|t| t.key.as_deref() == Some(key));
    html! {
        @if !c.timeouts_requested.is_empty() || !c.timeouts_cancelled.is_empty() || !c.keys_cancelled.is_empty()
            || c.timeout_fired.is_some() || c.timeout_discarded.is_some() {
            ul.timeouts.small {
                @for t in &c.timeouts_requested {
                    li.requested { "requested timeout " (message_ref(t.message_type.as_deref(), &t.id)) " due " (time(t.due))
                        @if let Some(k) = &t.key { " (key " (clip(k, Width::S)) @if replaced(k) { ", replacing any pending one" } ")" } }
                }
                @for id in &c.timeouts_cancelled { li.cancelled { "cancelled timeout " span.mono { (clip(id, Width::Id)) } } }
                @for k in c.keys_cancelled.iter().filter(|k| !requested(k)) { li.cancelled { "cancelled the timeout of key " (clip(k, Width::S)) } }
                @if let Some(id) = &c.timeout_fired { li.fired { "this message was timeout " span.mono { (clip(id, Width::Id)) } ": fired" } }
                @if let Some(id) = &c.timeout_discarded {
                    li.discarded { "this message was timeout " span.mono { (clip(id, Width::Id)) } ": discarded (cancelled, or its saga had completed)" }
                }
            }
        }
    }
}

/// The saga timeout a dispatcher's event is about (sent, or given up on).
pub(crate) fn dispatched(e: &StoredHistoryEvent) -> Markup {
    html! {
        @if let Some(t) = &e.event.detail.timeout {
            p.small.dispatch {
                "timeout " (message_ref(t.mark.message_type.as_deref(), &t.mark.id)) " of "
                a.instance href=(timeline_link(&t.saga_type, &t.correlation)) { "saga " (clip(&t.saga_type, Width::M)) " " (clip(&t.correlation, Width::M)) }
                ", due " (time(t.mark.due))
                @if let Some(k) = &t.mark.key { " (key " (clip(k, Width::S)) ")" }
                @if e.event.attempt > 1 { "; dispatch " (e.event.attempt) }
            }
        }
    }
}

/// The messages an event sent.
pub(crate) fn sent(sent: &[SentMessage]) -> Markup {
    html! {
        @if !sent.is_empty() {
            ul.sent.small {
                @for m in sent {
                    li { "sent " (message_ref(m.message_type.as_deref(), &m.message_id)) " → "
                        @if m.topic { "topic " } (clip(&m.destination, Width::M))
                        @if let Some(due) = m.due { " (due " (time(due)) ")" } }
                }
            }
        }
    }
}

/// The marks of the time axis: each event, and each timeout requested, fired or
/// discarded.
fn axis_marks(h: &SagaHistory) -> Vec<AxisMark> {
    let mut marks = Vec::new();
    for e in &h.events {
        let ev = &e.event;
        let what = format!(
            "{} {} {} — {} on {}, attempt {}{}",
            time_ms(ev.at),
            ev.message_type.as_deref().unwrap_or("(no type)"),
            ev.message_id,
            kind_words(ev.kind),
            ev.endpoint,
            ev.attempt,
            ev.detail.error.as_deref().map(|x| format!(": {x}")).unwrap_or_default()
        );
        let f = family(ev.kind);
        marks.push(AxisMark {
            at: ev.at,
            mark: if timeout_kind(ev.kind) {
                Mark::TimeoutEvent { family: f }
            } else {
                Mark::Event { family: f }
            },
            title: what,
        });
        let Some(c) = ev
            .detail
            .sagas
            .iter()
            .find(|s| s.saga_type == h.saga_type && s.correlation == h.correlation)
        else {
            continue;
        };
        for t in &c.timeouts_requested {
            marks.push(AxisMark {
                at: ev.at,
                mark: Mark::Requested { due: t.due },
                title: format!(
                    "{} timeout {} {} requested at {}, due {}",
                    time_ms(ev.at),
                    t.message_type.as_deref().unwrap_or("(no type)"),
                    t.id,
                    time(ev.at),
                    time(t.due)
                ),
            });
        }
        if let Some(id) = &c.timeout_fired {
            marks.push(AxisMark {
                at: ev.at,
                mark: Mark::Fired,
                title: format!("{} timeout {id} fired", time_ms(ev.at)),
            });
        }
        if let Some(id) = &c.timeout_discarded {
            marks.push(AxisMark {
                at: ev.at,
                mark: Mark::Discarded,
                title: format!("{} timeout {id} discarded", time_ms(ev.at)),
            });
        }
    }
    marks
}

/// The message page's link to each instance an event touched.
pub(crate) fn instance_links(e: &StoredHistoryEvent) -> Markup {
    html! {
        @for (saga, correlation) in e.event.instances() {
            a.instance href=(timeline_link(saga, correlation)) { "saga " (clip(saga, Width::M)) " " (clip(correlation, Width::M)) }
            " "
        }
    }
}
