//! The dashboard (queues, topics and subscriptions with their counts and dead-letter
//! sparklines, and a line about the store) and the dead-letter pages: a paged list, one
//! message in full, and the resubmit and delete forms (one, selected, all; deleting and
//! "all" ask for a confirmation first, without script: a second form).

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use courier::admin::{BatchOutcome, BodyView, DeadLetter, EntityKind, QueueAdmin, TimeoutFilter};
use courier::{PropertyValue, SequenceNumber};
use maud::{Markup, html};
use serde::Deserialize;

use super::history::sparkline;
use super::layout::{F, PageError, PageResult, Q, Viewer, Width, age, clip, clip_opt, opt, page, short, time, when};
use super::{Shared, State};

/// Dead letters per page.
const PAGE: u32 = 50;

/// The most body bytes shown (a larger body is cut, with a note).
const MAX_BODY_SHOWN: usize = 256 * 1024;

fn queues(state: &State) -> Result<&dyn QueueAdmin, PageError> {
    state.queues.as_deref().ok_or_else(|| {
        PageError::new(
            StatusCode::NOT_FOUND,
            "No broker",
            "This console shows no broker, so it has no queues or dead letters: start it with one (courier serve \
             --embedded FILE), or give one to Console::queues.",
        )
    })
}

/// A link to the dead letters of `queue`, from `after`.
fn dlq_link(queue: &str, after: SequenceNumber) -> String {
    let mut link = format!("/dlq?queue={}", encode(queue));
    if after > 0 {
        let _ = write!(link, "&after={after}");
    }
    link
}

/// Percent-encodes a query value.
pub(crate) fn encode(value: &str) -> String {
    serde_urlencoded::to_string([("", value)])
        .map(|s| s.trim_start_matches('=').to_owned())
        .unwrap_or_default()
}

/// `GET /`: the dashboard.
pub(crate) async fn dashboard(axum::extract::State(state): Shared, viewer: Viewer) -> PageResult {
    let mut describe: Vec<String> = state.queues.iter().map(|q| q.describe()).collect();
    if let Some(store) = &state.store {
        // The embedded broker's file is both: name it once.
        let store = store.describe();
        if !describe.contains(&store) {
            describe.push(store);
        }
    }
    let queue_table = match &state.queues {
        None => html! { p.muted { "No broker: start the console with --embedded FILE to see queues." } },
        Some(admin) => {
            let list = admin.queues().await?;
            let now = admin.now();
            let since = state.history.since();
            html! {
                @if list.is_empty() {
                    p.muted { "No queues yet." }
                } @else {
                    table #queues {
                        thead { tr {
                            th { "Name" } th { "Kind" } th.n { "Active" } th.n { "Locked" } th.n { "Scheduled" }
                            th.n { "Deferred" } th.n { "Dead-lettered" } th.n { "Oldest" }
                            th { "Dead letters, last hour" }
                        } }
                        tbody {
                            @for q in &list {
                                @let has_dlq = !matches!(q.kind, EntityKind::Topic);
                                tr data-queue=(q.name) {
                                    td { @if has_dlq { a href=(dlq_link(&q.name, 0)) { (clip(&q.name, Width::L)) } } @else { (clip(&q.name, Width::L)) } }
                                    td.muted { (kind(q.kind)) }
                                    td.n.active { (q.active) }
                                    td.n.locked { (q.locked) }
                                    td.n.scheduled { (q.scheduled) }
                                    td.n.deferred { (q.deferred) }
                                    td.n.dead {
                                        @if q.dead_lettered > 0 {
                                            a href=(dlq_link(&q.name, 0)) { span.badge { (q.dead_lettered) } }
                                        } @else { span.muted { "0" } }
                                    }
                                    td.n { @match q.oldest_age(now) { Some(a) => (age(a)), None => span.muted { "-" } } }
                                    td.spark {
                                        @if has_dlq { (sparkline(&state.history.series(&q.name, now), now, q.dead_lettered)) }
                                    }
                                }
                            }
                        }
                    }
                    p.muted.small {
                        "Counts as of " (time(now)) ". The sparklines show what this console sampled"
                        @if let Some(s) = since { " since " (time(s)) } @else { " (nothing yet)" }
                        ": their history starts when the console starts. Reload the page to refresh."
                    }
                }
            }
        }
    };
    let store_line = match &state.store {
        None => html! {},
        Some(store) => {
            let line = async {
                let types = store.saga_types().await?;
                let overdue = store
                    .timeouts(&TimeoutFilter::default().overdue().limit(COUNT_UP_TO))
                    .await?;
                let outbox = store.outbox(COUNT_UP_TO).await?;
                Ok::<_, courier::admin::AdminError>((types, up_to(overdue.len()), up_to(outbox.len())))
            }
            .await;
            match line {
                Ok((types, overdue, outbox)) => html! {
                    h2 { "Store" }
                    p #store {
                        a href="/sagas" { (types.iter().map(|t| t.instances).sum::<u64>()) " saga instances" }
                        " in " (types.len()) " types · "
                        a href="/timeouts?overdue=on" {
                            @if overdue != "0" { span.bad { (overdue) " overdue timeouts" } } @else { "0 overdue timeouts" }
                        }
                        " · " a href="/outbox" { (outbox) " outbox messages waiting" }
                    }
                },
                Err(e) => html! { h2 { "Store" } p.flash.bad { "The store cannot be read: " (e) } },
            }
        }
    };
    Ok(page(
        &state,
        &viewer,
        "Queues",
        &html! {
            h1 { "Queues" }
            @if !describe.is_empty() { p.muted.small { "Connected to " (describe.join(" · ")) } }
            (queue_table)
            (store_line)
        },
    )
    .into_response())
}

/// The dashboard counts overdue timeouts and outbox rows up to this many.
const COUNT_UP_TO: u32 = 1000;

/// A count read with a limit of [`COUNT_UP_TO`]: `1000+` when it reached it.
fn up_to(n: usize) -> String {
    if n >= COUNT_UP_TO as usize {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

fn kind(k: EntityKind) -> &'static str {
    match k {
        EntityKind::Queue => "queue",
        EntityKind::Topic => "topic",
        EntityKind::Subscription => "subscription",
        _ => "other",
    }
}

/// The query of the dead-letter list.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    queue: String,
    #[serde(default)]
    after: SequenceNumber,
    /// What the last change did (shown once, after a redirect).
    done: Option<String>,
    #[serde(default)]
    n: u64,
    #[serde(default)]
    missing: u64,
}

/// `GET /dlq?queue=Q&after=N`: a page of dead letters.
pub(crate) async fn dead_letters(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    Q(q): Q<ListQuery>,
) -> PageResult {
    let admin = queues(&state)?;
    let list = admin.dead_letters(&q.queue, q.after, PAGE).await?;
    let now = admin.now();
    let flash = q.done.as_deref().map(|done| {
        let verb = if done == "deleted" { "deleted" } else { "resubmitted" };
        html! {
            p.flash #flash {
                (q.n) " " (plural(q.n, "message", "messages")) " " (verb) "."
                @if q.missing > 0 { " " (q.missing) " were no longer there (already moved or deleted)." }
            }
        }
    });
    let csrf = &viewer.csrf;
    let shown = match (list.items.first(), list.items.last()) {
        (Some(first), Some(last)) => Some((first.sequence_number, last.sequence_number)),
        _ => None,
    };
    let body = html! {
        p.small.crumbs { a href="/" { "Queues" } " › " (q.queue) }
        h1 { "Dead letters of " (q.queue) }
        @if let Some(f) = flash { (f) }
        @if list.total == 0 {
            p #empty.muted { "No dead letters in " (q.queue) "." }
        } @else {
            p #shown {
                (list.total) " " (plural(list.total, "message", "messages")) " in the dead-letter queue"
                @if let Some((first, last)) = shown {
                    @if list.total > list.items.len() as u64 {
                        "; this page shows " (list.items.len()) ", sequence numbers " (first) " to " (last)
                    } @else if first == last {
                        ", sequence number " (first)
                    } @else {
                        ", sequence numbers " (first) " to " (last)
                    }
                }
                "."
            }
            div.toolbar {
                // Every dead letter of the queue, not only this page's: above the list, so
                // it is reached without scrolling past it.
                form.actions #all method="post" action="/dlq/resubmit" {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="queue" value=(q.queue);
                    input type="hidden" name="all" value="1";
                    button type="submit" formaction="/dlq/resubmit" { "Resubmit all " (list.total) "…" }
                    button.danger type="submit" formaction="/dlq/delete" { "Delete all " (list.total) "…" }
                    span.muted.small { "Both ask for a confirmation first." }
                }
                div.actions {
                    @if q.after > 0 { a href=(dlq_link(&q.queue, 0)) { "« First page" } }
                    @if let Some(next) = list.next_after { a #next href=(dlq_link(&q.queue, next)) { "Next page »" } }
                }
            }
            form #selected method="post" action="/dlq/resubmit" {
                input type="hidden" name="csrf" value=(csrf);
                input type="hidden" name="queue" value=(q.queue);
                div.actions {
                    button type="submit" formaction="/dlq/resubmit" { "Resubmit selected" }
                    button.danger type="submit" formaction="/dlq/delete" { "Delete selected" }
                }
                table #dead-letters {
                    thead { tr {
                        th { "" } th.n { "Seq" } th { "Message id" } th { "Type" } th { "Enqueued" }
                        th.n { "Deliveries" } th { "Reason" } th { "Failure" } th { "" }
                    } }
                    tbody {
                        @for d in &list.items {
                            tr data-seq=(d.sequence_number) {
                                td { input type="checkbox" name="seq" value=(d.sequence_number) aria-label="select"; }
                                td.n { a href=(message_link(&q.queue, d.sequence_number)) { (d.sequence_number) } }
                                td.mono.id { a.message-id href=(message_link(&q.queue, d.sequence_number)) { (clip(&d.message_id, Width::Id)) } }
                                td.type { (clip_opt(d.message_type.as_deref(), Width::M)) }
                                td.enqueued { (when(d.enqueued_at, now)) }
                                td.n { (d.delivery_count) }
                                td.reason { (clip_opt(d.reason.as_deref(), Width::M)) }
                                td.err {
                                    @if let Some(e) = &d.error { span.lines3 title=(short(e, 2000)) { (short(e, 300)) } }
                                    @else { span.muted { "-" } }
                                }
                                td.buttons { div.actions {
                                    button type="submit" name="one" value=(d.sequence_number) formaction="/dlq/resubmit" { "Resubmit" }
                                    button.danger type="submit" name="one" value=(d.sequence_number) formaction="/dlq/delete" { "Delete" }
                                } }
                            }
                        }
                    }
                }
                div.actions {
                    button type="submit" formaction="/dlq/resubmit" { "Resubmit selected" }
                    button.danger type="submit" formaction="/dlq/delete" { "Delete selected" }
                }
            }
            div.actions {
                @if q.after > 0 { a href=(dlq_link(&q.queue, 0)) { "« First page" } }
                @if let Some(next) = list.next_after { a href=(dlq_link(&q.queue, next)) { "Next page »" } }
            }
        }
    };
    Ok(page(&state, &viewer, &format!("Dead letters of {}", q.queue), &body).into_response())
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

fn message_link(queue: &str, seq: SequenceNumber) -> String {
    format!("/dlq/message?queue={}&seq={seq}", encode(queue))
}

/// The query of one dead letter.
#[derive(Debug, Deserialize)]
pub(crate) struct MessageQuery {
    queue: String,
    seq: SequenceNumber,
}

/// `GET /dlq/message?queue=Q&seq=N`: one dead letter in full.
pub(crate) async fn dead_letter(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    Q(q): Q<MessageQuery>,
) -> PageResult {
    let admin = queues(&state)?;
    let d = admin.dead_letter(&q.queue, q.seq).await?;
    let now = admin.now();
    let body = html! {
        p.small.crumbs { a href="/" { "Queues" } " › " a href=(dlq_link(&q.queue, 0)) { (q.queue) } " › " (d.sequence_number) }
        h1 { "Dead letter " span.mono { (d.message_id) } }
        form.actions method="post" action="/dlq/resubmit" {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="queue" value=(q.queue);
            button.primary type="submit" name="one" value=(d.sequence_number) formaction="/dlq/resubmit" { "Resubmit to " (d.queue) }
            button.danger type="submit" name="one" value=(d.sequence_number) formaction="/dlq/delete" { "Delete…" }
        }
        @if state.workflow_history.is_some() { (super::conversation::dead_letter_link(&d.message_id)) }
        (fields(&d, now))
        @if let Some(e) = &d.error { h2 { "Failure" } pre #error { (e) } }
        @if let Some(chain) = &d.error_chain { h2 { "Error chain" } pre #error-chain { (chain) } }
        h2 { "Body " span.muted.small { "(" (body_kind(&d.body)) ", " (d.body_size) " bytes)" } }
        pre #body { (body_text(&d.body)) }
        h2 { "Headers" }
        @if d.headers.is_empty() { p.muted { "None." } } @else {
            table.headers #headers {
                thead { tr { th { "Name" } th { "Value" } } }
                tbody { @for (k, v) in &d.headers { tr {
                    td.wrap { code title=(short(k, 2000)) { (visible(k)) } }
                    td.wrap { (property(v)) }
                } } }
            }
        }
    };
    Ok(page(&state, &viewer, &format!("Dead letter {}", d.message_id), &body).into_response())
}

fn fields(d: &DeadLetter, now: chrono::DateTime<chrono::Utc>) -> Markup {
    html! {
        dl.fields #fields {
            dt { "Queue" } dd { (d.queue) }
            dt { "Sequence number" } dd { (d.sequence_number) }
            dt { "Message id" } dd { (d.message_id) }
            dt { "Type" } dd { (opt(d.message_type.as_deref())) }
            dt { "Reason" } dd #reason { (opt(d.reason.as_deref())) }
            dt { "Description" } dd #description { (opt(d.description.as_deref())) }
            dt { "Delivery count" } dd { (d.delivery_count) }
            dt { "Enqueued" } dd { (time(d.enqueued_at)) " (" (when(d.enqueued_at, now)) ")" }
            dt { "Dead-lettered in" } dd { (opt(d.source.as_deref())) }
            dt { "Correlation id" } dd { (opt(d.correlation_id.as_deref())) }
            dt { "Causation id" } dd { (opt(d.causation_id.as_deref())) }
            dt { "Content type" } dd { (opt(d.content_type.as_deref())) }
            dt { "Session" } dd { (opt(d.session_id.as_deref())) }
        }
    }
}

/// A header name as it is shown: a character that would not show (a control character)
/// as its `\u{..}` escape, and `\` as `\\`, so two different names never look the same.
fn visible(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if c.is_control() {
            let _ = write!(out, "{}", c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

fn property(v: &PropertyValue) -> String {
    match v {
        PropertyValue::String(s) => s.clone(),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn body_kind(b: &BodyView) -> &'static str {
    match b {
        BodyView::Json(_) => "JSON",
        BodyView::Text(_) => "text",
        BodyView::Bytes(_) => "bytes, in hexadecimal",
        _ => "other",
    }
}

/// The body as shown: pretty JSON, the text, or a hex dump (cut past a size).
fn body_text(b: &BodyView) -> String {
    match b {
        BodyView::Json(v) => cut(serde_json::to_string_pretty(v).unwrap_or_default()),
        BodyView::Text(t) => cut(t.clone()),
        BodyView::Bytes(bytes) => hex_dump(&bytes[..bytes.len().min(MAX_BODY_SHOWN / 4)], bytes.len()),
        _ => String::new(),
    }
}

fn cut(mut text: String) -> String {
    if text.len() > MAX_BODY_SHOWN {
        let mut end = MAX_BODY_SHOWN;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let total = text.len();
        text.truncate(end);
        let _ = write!(text, "\n… ({} more bytes not shown)", total - end);
    }
    text
}

/// Offset, 16 bytes in hex, and their printable ASCII.
fn hex_dump(bytes: &[u8], total: usize) -> String {
    let mut out = String::new();
    for (i, chunk) in bytes.chunks(16).enumerate() {
        let _ = write!(out, "{:08x}  ", i * 16);
        for j in 0..16 {
            match chunk.get(j) {
                Some(b) => {
                    let _ = write!(out, "{b:02x} ");
                }
                None => out.push_str("   "),
            }
        }
        out.push(' ');
        out.extend(chunk.iter().map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        }));
        out.push('\n');
    }
    if total > bytes.len() {
        let _ = write!(out, "… ({} more bytes not shown)", total - bytes.len());
    }
    out
}

/// A change's form: which dead letters.
#[derive(Debug, Default)]
struct Change {
    queue: String,
    one: Option<SequenceNumber>,
    selected: Vec<SequenceNumber>,
    all: bool,
    confirmed: bool,
}

impl Change {
    fn parse(pairs: &[(String, String)]) -> Result<Self, PageError> {
        let mut c = Change::default();
        let seq = |v: &str| {
            v.parse::<SequenceNumber>()
                .map_err(|_| PageError::bad_request(format!("\"{v}\" is not a sequence number")))
        };
        for (k, v) in pairs {
            match k.as_str() {
                "queue" => c.queue.clone_from(v),
                "one" => c.one = Some(seq(v)?),
                "seq" => c.selected.push(seq(v)?),
                "all" => c.all = v == "1",
                "confirmed" => c.confirmed = v == "1",
                _ => {}
            }
        }
        if c.queue.is_empty() {
            return Err(PageError::bad_request("the form names no queue"));
        }
        Ok(c)
    }
}

/// `POST /dlq/resubmit`.
pub(crate) async fn resubmit(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    F(form): F<Vec<(String, String)>>,
) -> PageResult {
    change(&state, &viewer, &form, true).await
}

/// `POST /dlq/delete`.
pub(crate) async fn delete(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    F(form): F<Vec<(String, String)>>,
) -> PageResult {
    change(&state, &viewer, &form, false).await
}

async fn change(state: &State, viewer: &Viewer, pairs: &[(String, String)], resubmit: bool) -> PageResult {
    let admin = queues(state)?;
    let c = Change::parse(pairs)?;
    let verb = if resubmit { "Resubmit" } else { "Delete" };
    let seqs: Vec<SequenceNumber> = match (c.one, c.all) {
        (Some(one), _) => vec![one],
        (None, true) => admin.all_dead_letters(&c.queue).await?,
        (None, false) => c.selected.clone(),
    };
    if seqs.is_empty() {
        return Err(PageError::bad_request(if c.all {
            "There are no dead letters left to change.".to_owned()
        } else {
            "No message was selected: tick the messages first, or use the button of one message.".to_owned()
        }));
    }
    // Deleting is for good, and "all" may be many: ask first (a second form, no script).
    if !c.confirmed && (!resubmit || c.all) {
        return Ok(confirm(state, viewer, &c, &seqs, resubmit).into_response());
    }
    let outcome: BatchOutcome = if resubmit {
        admin.resubmit_many(&c.queue, &seqs).await?
    } else {
        admin.delete_many(&c.queue, &seqs).await?
    };
    if outcome.failed.is_empty() {
        let done = if resubmit { "resubmitted" } else { "deleted" };
        let to = format!(
            "{}&done={done}&n={}&missing={}",
            dlq_link(&c.queue, 0),
            outcome.done.len(),
            outcome.not_found.len()
        );
        return Ok(Redirect::to(&to).into_response());
    }
    let body = html! {
        h1 { (verb) " failed for " (outcome.failed.len()) " " (plural(outcome.failed.len() as u64, "message", "messages")) }
        p.flash.bad {
            (outcome.done.len()) " done; " (outcome.not_found.len()) " no longer there; each failed one is still in "
            "the dead-letter queue (every change is atomic per message). Try again; if it keeps failing, the reason below says what to fix."
        }
        table { thead { tr { th.n { "Seq" } th { "Why" } } } tbody {
            @for (seq, why) in &outcome.failed { tr { td.n { (seq) } td.err { (why) } } }
        } }
        p { a href=(dlq_link(&c.queue, 0)) { "Back to the dead letters of " (c.queue) } }
    };
    Ok((
        StatusCode::INTERNAL_SERVER_ERROR,
        page(state, viewer, "Some changes failed", &body),
    )
        .into_response())
}

/// The confirmation form of a change.
fn confirm(state: &State, viewer: &Viewer, c: &Change, seqs: &[SequenceNumber], resubmit: bool) -> Markup {
    let n = seqs.len() as u64;
    let what = if c.all {
        format!("all {n} dead letters of {}", c.queue)
    } else {
        format!("{n} {} of {}", plural(n, "dead letter", "dead letters"), c.queue)
    };
    let (title, action, button) = if resubmit {
        (format!("Resubmit {what}?"), "/dlq/resubmit", "Resubmit")
    } else {
        (format!("Delete {what}?"), "/dlq/delete", "Delete for good")
    };
    let body = html! {
        h1 { (title) }
        @if resubmit {
            p { "Each goes back to " (c.queue) " with its message id (an inbox still recognises it), its delivery count from zero." }
        } @else {
            p.flash.bad { "Deleted messages cannot be brought back." }
        }
        @if !c.all { p.muted.small { "Sequence numbers: " (seqs.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")) } }
        @else { p.muted.small { "Those there now; a message that fails again meanwhile is not taken a second time." } }
        form.actions method="post" action=(action) {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="queue" value=(c.queue);
            input type="hidden" name="confirmed" value="1";
            @if c.all { input type="hidden" name="all" value="1"; }
            @else { @for s in seqs { input type="hidden" name="seq" value=(s); } }
            button.danger[!resubmit].primary[resubmit] type="submit" { (button) }
            a href=(dlq_link(&c.queue, 0)) { "Cancel" }
        }
    };
    page(state, viewer, &title, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_dumped_in_hex_with_their_ascii() {
        let dump = hex_dump(&[0xff, 0x00, b'A', b'<'], 4);
        assert_eq!(
            dump,
            "00000000  ff 00 41 3c                                      ..A<\n"
        );
        assert_eq!(encode("events/subscriptions/a b"), "events%2Fsubscriptions%2Fa+b");
    }

    /// The name [`visible`] was made of: shows that no two names are shown alike.
    fn decoded(shown: &str) -> Option<String> {
        let mut out = String::new();
        let mut rest = shown;
        while let Some(c) = rest.chars().next() {
            if let Some(after) = rest.strip_prefix("\\\\") {
                out.push('\\');
                rest = after;
            } else if let Some(after) = rest.strip_prefix("\\u{") {
                let (hex, after) = after.split_once('}')?;
                out.push(char::from_u32(u32::from_str_radix(hex, 16).ok()?)?);
                rest = after;
            } else {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        Some(out)
    }

    proptest::proptest! {
        /// Any header name a producer writes is shown with nothing that would not show,
        /// and so that it can be read back: two different names never look the same.
        #[test]
        fn header_names_are_shown_one_to_one(name in r"(\PC|[\x00-\x1f\\\x7f-\x{9f}]|\\u\{7\}){0,16}") {
            let shown = visible(&name);
            proptest::prop_assert!(!shown.chars().any(char::is_control));
            proptest::prop_assert_eq!(decoded(&shown), Some(name));
        }
    }

    #[test]
    fn a_change_form_names_one_selected_or_all() {
        let pairs = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                .collect::<Vec<_>>()
        };
        let c = Change::parse(&pairs(&[("queue", "q"), ("seq", "3"), ("seq", "5"), ("one", "7")])).ok();
        assert_eq!(
            c.as_ref().map(|c| (c.one, c.selected.clone())),
            Some((Some(7), vec![3, 5]))
        );
        assert!(Change::parse(&pairs(&[("seq", "3")])).is_err(), "no queue");
        assert!(Change::parse(&pairs(&[("queue", "q"), ("seq", "x")])).is_err());
    }
}
