//! A message's page (`/history/message?id=M`): its events (each endpoint's attempts, with
//! what each did: the saga instances it touched, their state's diffs, its timeouts and
//! the messages it sent), the message that caused it and the first message of its
//! conversation, and the conversation it caused as a sequence diagram (sequence.rs) and
//! as a list of its messages. Says what the tree left out
//! ([`MessageHistory::left_out`]). Filters by time and outcome, as `courier history
//! message`.

use axum::response::IntoResponse;
use courier::admin::{HistoryAdmin, HistoryFilter, MessageHistory, MessageNode, StoredHistoryEvent};
use maud::{Markup, html};

use super::Shared;
use super::events::{HistoryQuery, family, history_admin, history_error, message_link, message_ref, outcome, time_ms};
use super::layout::{PageError, PageResult, Q, Viewer, Width, clip, page, time};
use super::queues::encode;
use super::sequence::diagram;
use super::timeline::{dispatched, instance_links, sent, state_diff, timeouts};

/// How far up the causation ids the page looks for the conversation's first message.
const MAX_UP: usize = 32;

/// `GET /history/message?id=M&since=&until=&outcome=&limit=`.
pub(crate) async fn message_history(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    Q(pairs): Q<Vec<(String, String)>>,
) -> PageResult {
    let Some(id) = pairs.iter().find(|(k, _)| k == "id").map(|(_, v)| v.clone()) else {
        return Err(PageError::bad_request(
            "a message's history needs its id (id=...): open it from a saga's history or a dead letter",
        ));
    };
    let admin = history_admin(&state)?;
    let query = HistoryQuery::parse(&pairs);
    let filter = query.filter()?;
    let h = admin.message_history(&id, &filter).await.map_err(history_error)?;
    let parent = h.root.events.iter().find_map(|e| e.event.causation_id.clone());
    let first = match &parent {
        Some(p) => first_of(admin, p).await,
        None => None,
    };
    let title = format!(
        "{} {}",
        h.root.message_type.as_deref().unwrap_or("(no type)"),
        h.root.message_id
    );
    let caused = h.root.count() - 1;
    let body = html! {
        p.small.crumbs { "History › message " (clip(&id, Width::Id)) }
        h1 { "Message " (h.root.message_type.as_deref().unwrap_or("(no type)")) " " span.mono { (h.root.message_id) } }
        p.muted.small { (admin.describe()) }
        @if let Some(p) = &parent {
            p #caused-by {
                "Caused by " a.mono href=(message_link(p)) { (clip(p, Width::Id)) }
                @if let Some(f) = first.as_ref().filter(|f| f != &p) {
                    " · the conversation starts with " a.mono #conversation-start href=(message_link(f)) { (clip(f, Width::Id)) }
                }
                "."
            }
        } @else {
            p.muted.small #caused-by { "No message caused it (or its sender keeps no history): the conversation starts here." }
        }
        (query.form("/history/message", &[("id", &id)]))
        h2 { "Its events" }
        (event_table(&h.root.events))
        h2 #conversation { "Its conversation: " (caused) " message(s) it caused" }
        @if !h.left_out.is_empty() {
            div.flash.bad #left-out {
                strong { "Left out: " }
                ul { @for why in &h.left_out { li { (why) } } }
            }
        }
        p.muted.small {
            "One lifeline per endpoint, oldest at the top; each arrow goes from the endpoint whose handling sent the "
            "message to the endpoint that handled it. "
            span.k-retried { "Retried" } ", " span.k-dead { "dead-lettered" } ", " span.k-handled { "handled" }
            "; a dashed arrow is a message with no event (not handled yet, or by an endpoint that keeps no history); "
            "a saga's timeout (its label begins with \"timeout\") goes from an endpoint to itself. A label links to its message; the error is on hover."
        }
        div.diagram { (diagram(&h)) }
        h2 { "Messages" }
        (message_list(&h))
    };
    Ok(page(&state, &viewer, &title, &body).into_response())
}

/// The first message of the conversation above `parent`, following the causation ids as
/// far as there are events (at most [`MAX_UP`] steps).
async fn first_of(admin: &dyn HistoryAdmin, parent: &str) -> Option<String> {
    let mut at = parent.to_owned();
    for _ in 0..MAX_UP {
        let Ok(h) = admin.message_history(&at, &HistoryFilter::default().limit(1)).await else {
            break;
        };
        match h.root.events.iter().find_map(|e| e.event.causation_id.clone()) {
            Some(up) if up != at => at = up,
            _ => break,
        }
    }
    Some(at)
}

/// A message's events, one a row, with what each did.
fn event_table(events: &[StoredHistoryEvent]) -> Markup {
    html! {
        @if events.is_empty() {
            p.muted #no-events { "No event: not handled yet, by an endpoint that keeps no history, or none passes the filters." }
        } @else {
            table #events {
                thead { tr { th { "Time (UTC)" } th { "Endpoint" } th { "Outcome" } th.n { "Attempt" } th { "What it did" } } }
                tbody {
                    @for e in events {
                        tr class=(format!("k-{}", family(e.event.kind))) data-kind=(e.event.kind.as_str()) {
                            td.mono.nowrap { (time_ms(e.event.at)) }
                            td { (clip(&e.event.endpoint, Width::S)) }
                            td.err.outcome { (outcome(e)) }
                            td.n { (e.event.attempt) }
                            td.wrap {
                                @if e.event.detail.timeout.is_some() { (dispatched(e)) } @else { (instance_links(e)) }
                                @for c in &e.event.detail.sagas { (state_diff(c)) (timeouts(c)) }
                                (sent(&e.event.detail.sent))
                                @if let Some(t) = e.event.enqueued_at { div.muted.small { "enqueued " (time(t)) } }
                                @for c in &e.event.detail.cut { div.muted.small { "Cut: " (c) } }
                                @for p in &e.problems { div.bad.small { "Unreadable: " (p) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The conversation's messages in the tree's order, indented by depth, each with its
/// outcomes.
fn message_list(h: &MessageHistory) -> Markup {
    let mut rows = Vec::new();
    flatten(&h.root, 0, &mut rows);
    html! {
        table #messages {
            thead { tr { th { "Message" } th { "Sent" } th { "Outcomes" } } }
            tbody {
                @for (depth, n) in &rows {
                    tr data-id=(n.message_id) {
                        td style=(format!("padding-left:{}em", 0.7 + 1.2 * (*depth).min(16) as f64)) {
                            @if *depth > 0 { span.muted { "└ " } }
                            (message_ref(n.message_type.as_deref(), &n.message_id))
                        }
                        td.small {
                            @if let Some(s) = &n.sent {
                                "→ " @if s.topic { "topic " } (clip(&s.destination, Width::S))
                                @if let Some(d) = s.due { " (due " (time(d)) ")" }
                            }
                            @if let Some(t) = &n.timeout { "timeout, due " (time(t.due)) }
                        }
                        td.small {
                            @if n.events.is_empty() { span.muted { "no event" } }
                            @for e in &n.events {
                                span class=(format!("kind k-{}", family(e.event.kind))) title=(time_ms(e.event.at)) {
                                    (clip(&e.event.endpoint, Width::S)) ": " (super::events::kind_words(e.event.kind))
                                }
                                " "
                            }
                        }
                    }
                }
            }
        }
    }
}

fn flatten<'a>(node: &'a MessageNode, depth: usize, out: &mut Vec<(usize, &'a MessageNode)>) {
    out.push((depth, node));
    for c in &node.caused {
        flatten(c, depth + 1, out);
    }
}

/// The link from a dead letter to its message's history.
pub(crate) fn dead_letter_link(message_id: &str) -> Markup {
    html! {
        p #history-link {
            a href=(format!("/history/message?id={}", encode(message_id))) { "History of this message" }
            " — each endpoint's attempts, and the conversation it belongs to."
        }
    }
}
