//! The store's pages: saga types, a saga's instances (filtered by correlation, age and
//! pending timeout), one instance (state, version, pending timeouts, and the form that
//! completes it by hand with a required reason), pending and overdue timeouts, and the
//! outbox (waiting rows, or its dead letters).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use courier::admin::{PendingTimeout, SagaFilter, StoreAdmin, TimeoutFilter, TimeoutState};
use maud::{Markup, html};
use serde::Deserialize;

use super::layout::{F, PageError, PageResult, Q, Viewer, Width, clip, clip_opt, page, parse_age, short, time, when};
use super::queues::encode;
use super::{Shared, State};

fn store(state: &State) -> Result<&dyn StoreAdmin, PageError> {
    state.store.as_deref().ok_or_else(|| {
        PageError::new(
            StatusCode::NOT_FOUND,
            "No store",
            "This console shows no store, so it has no sagas, timeouts or outbox: start it with one (courier serve \
             --embedded FILE, --postgres URL or --sqlite FILE), or give one to Console::store.",
        )
    })
}

fn saga_link(saga: &str) -> String {
    format!("/sagas/list?saga={}", encode(saga))
}

fn instance_link(saga: &str, correlation: &str) -> String {
    format!(
        "/sagas/instance?saga={}&correlation={}",
        encode(saga),
        encode(correlation)
    )
}

/// `GET /sagas`: saga types with their number of instances.
pub(crate) async fn saga_types(axum::extract::State(state): Shared, viewer: Viewer) -> PageResult {
    let admin = store(&state)?;
    let types = admin.saga_types().await?;
    let now = admin.now();
    let body = html! {
        h1 { "Sagas" }
        p.muted.small { (admin.describe()) }
        @if types.is_empty() { p.muted { "No saga instances." } } @else {
            table #saga-types {
                thead { tr { th { "Saga" } th.n { "Instances" } th { "Least recently updated" } } }
                tbody { @for t in &types { tr {
                    td { a href=(saga_link(&t.saga_type)) { (clip(&t.saga_type, Width::L)) } }
                    td.n { (t.instances) }
                    td { @match t.oldest_updated_at { Some(u) => (when(u, now)), None => span.muted { "-" } } }
                } } }
            }
        }
    };
    Ok(page(&state, &viewer, "Sagas", &body).into_response())
}

/// The filters of a saga's instances.
#[derive(Debug, Deserialize)]
pub(crate) struct SagasQuery {
    saga: String,
    correlation: Option<String>,
    older_than: Option<String>,
    /// `with`, `without`, or anything else for both.
    timeout: Option<String>,
    /// A correlation just completed by hand, and its version (shown once).
    completed: Option<String>,
    version: Option<i64>,
}

/// `GET /sagas/list?saga=S&correlation=&older_than=&timeout=`: instances, least recently
/// updated first.
pub(crate) async fn sagas(axum::extract::State(state): Shared, viewer: Viewer, Q(q): Q<SagasQuery>) -> PageResult {
    let admin = store(&state)?;
    let now = admin.now();
    let mut filter = SagaFilter::default().limit(200);
    let correlation = q.correlation.as_deref().map(str::trim).filter(|c| !c.is_empty());
    if let Some(c) = correlation {
        filter = filter.correlation(c);
    }
    let older_than = q.older_than.as_deref().map(str::trim).filter(|c| !c.is_empty());
    if let Some(age) = older_than {
        filter = filter.updated_before(now - parse_age(age)?);
    }
    match q.timeout.as_deref() {
        Some("with") => filter = filter.has_pending_timeout(true),
        Some("without") => filter = filter.has_pending_timeout(false),
        _ => {}
    }
    let list = admin.sagas(&q.saga, &filter).await?;
    let selected = |v: &str| q.timeout.as_deref() == Some(v);
    let body = html! {
        p.small.crumbs { a href="/sagas" { "Sagas" } " › " (q.saga) }
        h1 { "Instances of " (q.saga) }
        @if let Some(c) = &q.completed {
            p.flash #flash { "Instance " (c) @if let Some(v) = q.version { " (version " (v) ")" } " completed by hand; the reason is in the console's log." }
        }
        form.filters method="get" action="/sagas/list" {
            input type="hidden" name="saga" value=(q.saga);
            label { "Correlation contains" input type="text" name="correlation" value=(correlation.unwrap_or_default()); }
            label { "Not updated for (90s, 15m, 2h, 3d)" input type="text" name="older_than" size="8" value=(older_than.unwrap_or_default()); }
            label { "Pending timeout"
                select name="timeout" {
                    option value="" selected[!selected("with") && !selected("without")] { "any" }
                    option value="with" selected[selected("with")] { "has one" }
                    option value="without" selected[selected("without")] { "has none" }
                }
            }
            button type="submit" { "Filter" }
        }
        @if list.is_empty() { p.muted #empty { "No instance matches." } } @else {
            table #sagas {
                thead { tr { th { "Correlation" } th.n { "Version" } th { "Created" } th { "Updated" } th.n { "Pending timeouts" } } }
                tbody { @for s in &list { tr {
                    td.mono { a href=(instance_link(&s.saga_type, &s.correlation)) { (clip(&s.correlation, Width::L)) } }
                    td.n { (s.version) }
                    td { (when(s.created_at, now)) }
                    td { (when(s.updated_at, now)) }
                    td.n { (s.pending_timeouts) }
                } } }
            }
            @if list.len() >= 200 { p.muted.small { "The first 200; narrow the filter to see others." } }
        }
    };
    Ok(page(&state, &viewer, &format!("Instances of {}", q.saga), &body).into_response())
}

/// One instance's address.
#[derive(Debug, Deserialize)]
pub(crate) struct InstanceQuery {
    saga: String,
    correlation: String,
}

/// `GET /sagas/instance?saga=S&correlation=C`: state, version, pending timeouts, and the
/// completion form.
pub(crate) async fn saga(axum::extract::State(state): Shared, viewer: Viewer, Q(q): Q<InstanceQuery>) -> PageResult {
    let admin = store(&state)?;
    let s = match admin.saga(&q.saga, &q.correlation).await {
        Ok(s) => s,
        // A completed instance has no state any more, but its history stays.
        Err(courier::admin::AdminError::NotFound { .. }) if state.workflow_history.is_some() => {
            return Ok(super::timeline::no_instance(&state, &viewer, &q.saga, &q.correlation));
        }
        Err(e) => return Err(e.into()),
    };
    let now = admin.now();
    let body = html! {
        p.small.crumbs { a href="/sagas" { "Sagas" } " › " a href=(saga_link(&q.saga)) { (q.saga) } " › " (q.correlation) }
        h1 { (q.saga) " " (q.correlation) }
        dl.fields #fields {
            dt { "Saga" } dd { (s.summary.saga_type) }
            dt { "Correlation" } dd { (s.summary.correlation) }
            dt { "Version" } dd #version { (s.summary.version) }
            dt { "State version" } dd { (s.state_version) }
            dt { "Created" } dd { (time(s.summary.created_at)) " (" (when(s.summary.created_at, now)) ")" }
            dt { "Updated" } dd { (time(s.summary.updated_at)) " (" (when(s.summary.updated_at, now)) ")" }
        }
        (super::timeline::link_from_instance(&state, &q.saga, &q.correlation))
        h2 { "State" }
        pre #state { (serde_json::to_string_pretty(&s.state).unwrap_or_default()) }
        h2 { "Pending timeouts" }
        (timeout_table(&s.timeouts, now, false))
        h2 { "Complete by hand" }
        p { "Deletes the instance with its pending timeouts, in one transaction. A message for it that comes later "
            "finds no instance (it starts a new one only if it is a start message). The reason is logged." }
        form.filters method="post" action="/sagas/complete" {
            input type="hidden" name="csrf" value=(viewer.csrf);
            input type="hidden" name="saga" value=(q.saga);
            input type="hidden" name="correlation" value=(q.correlation);
            label { "Reason (required)" input type="text" name="reason" size="50" required; }
            button.danger type="submit" { "Complete" }
        }
    };
    Ok(page(&state, &viewer, &format!("{} {}", q.saga, q.correlation), &body).into_response())
}

/// The completion form.
#[derive(Debug, Deserialize)]
pub(crate) struct CompleteForm {
    saga: String,
    correlation: String,
    #[serde(default)]
    reason: String,
}

/// `POST /sagas/complete`: completes one instance by hand.
pub(crate) async fn complete(axum::extract::State(state): Shared, F(form): F<CompleteForm>) -> PageResult {
    let admin = store(&state)?;
    if form.reason.trim().is_empty() {
        return Err(PageError::bad_request(
            "Completing a saga by hand needs a reason (it is logged): go back and say why. Nothing was changed.",
        ));
    }
    let done = admin
        .complete_saga(&form.saga, &form.correlation, form.reason.trim())
        .await?;
    // With Debug, escaped and quoted: the correlation value came from a message.
    tracing::info!(saga = ?form.saga, correlation = ?form.correlation, version = done.version, "completed from the web console");
    Ok(Redirect::to(&format!(
        "{}&completed={}&version={}",
        saga_link(&form.saga),
        encode(&form.correlation),
        done.version
    ))
    .into_response())
}

fn timeout_table(list: &[PendingTimeout], now: chrono::DateTime<chrono::Utc>, with_saga: bool) -> Markup {
    let grace = TimeoutFilter::default().grace;
    html! {
        @if list.is_empty() { p.muted #no-timeouts { "None." } } @else {
            table #timeouts {
                thead { tr {
                    th { "Id" }
                    @if with_saga { th { "Saga" } th { "Correlation" } }
                    th { "Key" } th { "Endpoint" } th { "Due" } th { "State" }
                } }
                tbody { @for t in list { tr.bad-row[t.is_overdue(now, grace)] data-id=(t.id) {
                    td.mono.timeout-id { (clip(&t.id, Width::Id)) }
                    @if with_saga {
                        td { a href=(saga_link(&t.saga_type)) { (clip(&t.saga_type, Width::M)) } }
                        td.mono { a href=(instance_link(&t.saga_type, &t.correlation)) { (clip(&t.correlation, Width::M)) } }
                    }
                    td { (clip_opt(t.key.as_deref().or(t.message_type.as_deref()), Width::M)) }
                    td { (clip(&t.endpoint, Width::S)) }
                    td { (time(t.due_at)) " (" (when(t.due_at, now)) ")" }
                    td.state {
                        @match t.state {
                            TimeoutState::Waiting => @if t.is_overdue(now, grace) { span.bad { "overdue: not sent" } } @else { "waiting" },
                            TimeoutState::Dispatched => @if t.is_overdue(now, grace) { span.bad { "overdue: sent, not handled" } } @else { "sent" },
                            TimeoutState::DeadLettered => span.bad { "dead-lettered" @if let Some(r) = &t.dead_letter_reason { " (" (clip(r, Width::M)) ")" } },
                            _ => "?",
                        }
                    }
                } } }
            }
        }
    }
}

/// The timeouts page's filter.
#[derive(Debug, Deserialize)]
pub(crate) struct TimeoutsQuery {
    overdue: Option<String>,
}

/// `GET /timeouts?overdue=on`: pending timeouts, earliest due first.
pub(crate) async fn timeouts(
    axum::extract::State(state): Shared,
    viewer: Viewer,
    Q(q): Q<TimeoutsQuery>,
) -> PageResult {
    let admin = store(&state)?;
    let overdue = q.overdue.is_some_and(|v| !v.is_empty());
    let mut filter = TimeoutFilter::default().limit(500);
    if overdue {
        filter = filter.overdue();
    }
    let list = admin.timeouts(&filter).await?;
    let now = admin.now();
    let body = html! {
        h1 { @if overdue { "Overdue timeouts" } @else { "Pending timeouts" } }
        div.actions {
            @if overdue { a href="/timeouts" { "All pending" } " · " strong { "Overdue only" } }
            @else { strong { "All pending" } " · " a href="/timeouts?overdue=on" { "Overdue only" } }
        }
        p.muted.small {
            "Overdue: due and not sent (the dispatcher is down or behind), or sent more than "
            (filter.grace.num_seconds()) "s ago and not handled (the endpoint is down or behind). As of " (time(now)) "."
        }
        (timeout_table(&list, now, true))
    };
    Ok(page(&state, &viewer, "Timeouts", &body).into_response())
}

/// The outbox page's choice.
#[derive(Debug, Deserialize)]
pub(crate) struct OutboxQuery {
    dead: Option<String>,
}

/// `GET /outbox?dead=on`: messages stored and not dispatched, or the outbox's dead letters.
pub(crate) async fn outbox(axum::extract::State(state): Shared, viewer: Viewer, Q(q): Q<OutboxQuery>) -> PageResult {
    let admin = store(&state)?;
    let dead = q.dead.is_some_and(|v| !v.is_empty());
    let list = if dead {
        admin.outbox_dead_letters(500).await?
    } else {
        admin.outbox(500).await?
    };
    let now = admin.now();
    let body = html! {
        h1 { @if dead { "Outbox dead letters" } @else { "Outbox" } }
        div.actions {
            @if dead { a href="/outbox" { "Waiting" } " · " strong { "Refused at dispatch" } }
            @else { strong { "Waiting" } " · " a href="/outbox?dead=on" { "Refused at dispatch" } }
        }
        p.muted.small { @if dead { "Messages the transport refused for good at dispatch." }
            @else { "Messages stored with a handler's transaction and not dispatched yet, oldest first." } }
        @if list.is_empty() { p.muted #empty { "None." } } @else {
            table #outbox {
                thead { tr {
                    th.n { "Id" } th { "Stored" } th { "Endpoint" } th { "Destination" } th { "Message id" } th { "Type" }
                    th { "Handled message" }
                    @if dead { th { "Reason" } }
                } }
                tbody { @for o in &list { tr {
                    td.n { (o.id) }
                    td { (when(o.created_at, now)) }
                    td { (clip(&o.endpoint, Width::S)) }
                    td { (clip(&o.destination, Width::M)) @if o.is_topic { span.muted { " (topic)" } } }
                    td.mono { (clip_opt(o.message_id.as_deref(), Width::M)) }
                    td { (clip_opt(o.message_type.as_deref(), Width::M)) }
                    td.mono { (clip(&o.source_id, Width::M)) }
                    @if dead { td.err {
                        (clip_opt(o.dead_letter_reason.as_deref(), Width::L))
                        @if let Some(d) = &o.dead_letter_description { br; span.muted.small title=(short(d, 2000)) { (short(d, 200)) } }
                    } }
                } } }
            }
        }
    };
    Ok(page(&state, &viewer, "Outbox", &body).into_response())
}
