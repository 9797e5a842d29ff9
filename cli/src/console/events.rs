//! What the history pages share (issue 33, docs/history.md): the history admin or the
//! page saying how to give one, the links to a message's page and to a saga instance's
//! timeline, the filters (time and outcome, as `courier history` takes them), and an
//! event's outcome in words and colour.
//!
//! An outcome is named by [`HistoryKind::as_str`], so a kind added to the framework is
//! shown by its name without a change here; a colour is chosen for the kinds known here
//! and a neutral one for any other.

use axum::http::StatusCode;
use chrono::{DateTime, NaiveDateTime, Utc};
use courier::HistoryKind;
use courier::admin::{AdminError, HistoryAdmin, HistoryFilter, StoredHistoryEvent};
use maud::{Markup, html};

use super::State;
use super::layout::{PageError, Width, clip};
use super::queues::encode;

/// The most events a history page reads by default (the filter's limit can say more, up to
/// [`courier::admin::MAX_HISTORY_EVENTS`]).
pub(crate) const DEFAULT_LIMIT: u32 = 1000;

/// What a history page says when the console was given no history.
pub(crate) const NO_HISTORY_ADMIN: &str = "This console reads no workflow history: start it over the store \
     the endpoints write their history to (courier serve --embedded FILE, --postgres URL or --sqlite FILE), or give \
     one to Console::history (an EmbeddedAdmin, SqliteAdmin or PostgresAdmin). The endpoints keep a history only \
     with EndpointBuilder::history (docs/history.md).";

/// What a history page says when no event was found.
const NO_EVENT: &str = "No event of it was recorded. Is the history on for the endpoint that handles it \
     (EndpointBuilder::history with HistoryOptions, docs/history.md)? Events older than the endpoint's retention are \
     deleted, a message not handled yet has none, and the store must be the endpoint's.";

/// The history admin, or the page saying how to give one.
pub(crate) fn history_admin(state: &State) -> Result<&dyn HistoryAdmin, PageError> {
    state
        .workflow_history
        .as_deref()
        .ok_or_else(|| PageError::new(StatusCode::NOT_FOUND, "No history", NO_HISTORY_ADMIN))
}

/// An error of the history admin as a page: "not found" says what to check.
pub(crate) fn history_error(e: AdminError) -> PageError {
    if matches!(e, AdminError::NotFound { .. }) {
        PageError::new(StatusCode::NOT_FOUND, "No history", format!("{e}. {NO_EVENT}"))
    } else {
        PageError::from(e)
    }
}

/// The page of message `id`: its events and the conversation it caused.
pub(crate) fn message_link(id: &str) -> String {
    format!("/history/message?id={}", encode(id))
}

/// The timeline of a saga instance.
pub(crate) fn timeline_link(saga: &str, correlation: &str) -> String {
    format!(
        "/history/saga?saga={}&correlation={}",
        encode(saga),
        encode(correlation)
    )
}

/// A message as a link to its page: its type (or "(no type)") and its id.
pub(crate) fn message_ref(message_type: Option<&str>, id: &str) -> Markup {
    html! {
        a.msg href=(message_link(id)) {
            (clip(message_type.unwrap_or("(no type)"), Width::M)) " " span.mono { (clip(id, Width::Id)) }
        }
    }
}

/// A time to the millisecond: `2026-12-03 10:00:00.123`.
pub(crate) fn time_ms(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
}

/// The colour family of a kind: `handled`, `retried`, `dead` (dead-lettered, or a kind
/// whose name says so, as `timeout_dead_lettered`), or `other` (a duplicate, or another
/// kind).
pub(crate) fn family(kind: HistoryKind) -> &'static str {
    match kind {
        HistoryKind::Handled => "handled",
        HistoryKind::Retried => "retried",
        HistoryKind::DeadLettered => "dead",
        other if other.as_str().contains("dead") => "dead",
        _ => "other",
    }
}

/// Whether the kind is a step of a saga timeout of its own (`timeout_dispatched`,
/// `timeout_dead_lettered`: the dispatcher's), drawn on the time axis's timeout lane.
pub(crate) fn timeout_kind(kind: HistoryKind) -> bool {
    kind.as_str().starts_with("timeout")
}

/// The stroke colour of a family in the pictures.
pub(crate) fn colour(family: &str) -> &'static str {
    match family {
        "handled" => "#1a7f37",
        "retried" => "#bc4c00",
        "dead" => "#cf222e",
        _ => "#6e7781",
    }
}

/// Whether the kind is a failed attempt (drawn as such).
pub(crate) fn failed(kind: HistoryKind) -> bool {
    matches!(family(kind), "retried" | "dead")
}

/// A kind in words: its name with `-` for `_` (`dead-lettered`).
pub(crate) fn kind_words(kind: HistoryKind) -> String {
    kind.as_str().replace('_', "-")
}

/// An event's outcome: a coloured badge, then the reason and error of a failure.
pub(crate) fn outcome(e: &StoredHistoryEvent) -> Markup {
    let d = &e.event.detail;
    let kind = e.event.kind;
    html! {
        span class=(format!("kind k-{}", family(kind))) data-kind=(kind.as_str()) { (kind_words(kind)) }
        @if kind == HistoryKind::Duplicate { span.muted.small { " already handled: dropped by the inbox" } }
        @if let Some(r) = &d.reason { " " span.reason.mono title=(r) { "(" (clip(r, Width::L)) ")" } }
        @if let Some(err) = &d.error { div.err.small { (err) } }
        @else if failed(kind) { div.muted.small { "(no error recorded)" } }
    }
}

/// The filters of a history page, as typed (the query's pairs; `outcome` repeats).
#[derive(Debug, Default, Clone)]
pub(crate) struct HistoryQuery {
    pub(crate) since: String,
    pub(crate) until: String,
    pub(crate) outcomes: Vec<String>,
    pub(crate) limit: String,
}

impl HistoryQuery {
    /// The filters among a query's pairs (the others are the page's own).
    pub(crate) fn parse(pairs: &[(String, String)]) -> Self {
        let mut q = Self::default();
        for (k, v) in pairs {
            match k.as_str() {
                "since" => q.since = v.trim().to_owned(),
                "until" => q.until = v.trim().to_owned(),
                "outcome" if !v.trim().is_empty() => q.outcomes.push(v.trim().to_owned()),
                "limit" => q.limit = v.trim().to_owned(),
                _ => {}
            }
        }
        q
    }

    /// The filter, or a page saying what is wrong with a value.
    pub(crate) fn filter(&self) -> Result<HistoryFilter, PageError> {
        let mut f = HistoryFilter::default().limit(DEFAULT_LIMIT);
        if !self.since.is_empty() {
            f = f.since(parse_time(&self.since)?);
        }
        if !self.until.is_empty() {
            f = f.until(parse_time(&self.until)?);
        }
        for o in &self.outcomes {
            let kind = HistoryKind::parse(&o.replace('-', "_")).ok_or_else(|| {
                let names: Vec<&str> = HistoryKind::ALL.iter().map(|k| k.as_str()).collect();
                PageError::bad_request(format!("\"{o}\" is not an outcome: choose among {}", names.join(", ")))
            })?;
            f = f.outcome(kind);
        }
        if !self.limit.is_empty() {
            let n: u32 = self.limit.parse().map_err(|_| {
                PageError::bad_request(format!(
                    "\"{}\" is not a number of events: write one from 1 to {}",
                    self.limit,
                    courier::admin::MAX_HISTORY_EVENTS
                ))
            })?;
            f = f.limit(n.clamp(1, courier::admin::MAX_HISTORY_EVENTS));
        }
        Ok(f)
    }

    /// The filter's fields in the page's query string (`&since=...`), to carry them over.
    pub(crate) fn carry(&self) -> String {
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for (k, v) in [("since", &self.since), ("until", &self.until), ("limit", &self.limit)] {
            if !v.is_empty() {
                pairs.push((k, v));
            }
        }
        pairs.extend(self.outcomes.iter().map(|o| ("outcome", o.as_str())));
        if pairs.is_empty() {
            return String::new();
        }
        format!("&{}", serde_urlencoded::to_string(pairs).unwrap_or_default())
    }

    /// The filter form of a page at `action`, with its own `hidden` fields.
    pub(crate) fn form(&self, action: &str, hidden: &[(&str, &str)]) -> Markup {
        let checked = |k: HistoryKind| self.outcomes.iter().any(|o| o.replace('-', "_") == k.as_str());
        html! {
            form.filters #history-filters method="get" action=(action) {
                @for (name, value) in hidden { input type="hidden" name=(name) value=(value); }
                label { "Since (RFC 3339, UTC)" input type="text" name="since" size="22" placeholder="2026-12-03T10:00:00Z" value=(self.since); }
                label { "Until" input type="text" name="until" size="22" value=(self.until); }
                fieldset.outcomes {
                    legend { "Outcome (all when none)" }
                    @for k in HistoryKind::ALL {
                        label.check { input type="checkbox" name="outcome" value=(k.as_str()) checked[checked(k)]; " " (kind_words(k)) }
                    }
                }
                label { "Events read" input type="text" name="limit" size="6" placeholder=(DEFAULT_LIMIT) value=(self.limit); }
                button type="submit" { "Filter" }
                @if !self.since.is_empty() || !self.until.is_empty() || !self.outcomes.is_empty() || !self.limit.is_empty() {
                    a href=(clear_link(action, hidden)) { "Clear" }
                }
            }
        }
    }
}

fn clear_link(action: &str, hidden: &[(&str, &str)]) -> String {
    format!("{action}?{}", serde_urlencoded::to_string(hidden).unwrap_or_default())
}

/// A time typed in a filter: RFC 3339 (`2026-12-03T10:00:00Z`), or a date and time in
/// UTC (`2026-12-03 10:00`, `2026-12-03T10:00:00`), or a date (its midnight, UTC).
pub(crate) fn parse_time(text: &str) -> Result<DateTime<Utc>, PageError> {
    let text = text.trim();
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let spaced = text.replacen('T', " ", 1);
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(&spaced, format) {
            return Ok(t.and_utc());
        }
    }
    if let Some(t) = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
    {
        return Ok(t.and_utc());
    }
    Err(PageError::bad_request(format!(
        "\"{text}\" is not a time: write it as RFC 3339 (2026-12-03T10:00:00Z), or a date and time in UTC \
         (2026-12-03 10:00)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
    }

    #[test]
    fn the_filters_read_like_the_command_lines() {
        let q = HistoryQuery::parse(&pairs(&[
            ("id", "m-1"),
            ("since", "2026-12-03T10:00:00Z"),
            ("until", "2026-12-03 11:00"),
            ("outcome", "dead-lettered"),
            ("outcome", "retried"),
            ("limit", "20"),
        ]));
        let f = q.filter().map_err(|e| format!("{e:?}"));
        let f = f.as_ref();
        assert_eq!(
            f.map(|f| f.outcomes.clone()).ok(),
            Some(vec![HistoryKind::DeadLettered, HistoryKind::Retried])
        );
        assert_eq!(f.map(|f| f.limit).ok(), Some(20));
        assert!(f.is_ok_and(|f| f.since.is_some() && f.until.is_some()));
        assert!(
            q.carry().contains("outcome=dead-lettered&outcome=retried"),
            "{}",
            q.carry()
        );
        for wrong in [("since", "yesterday"), ("outcome", "failed"), ("limit", "many")] {
            assert!(HistoryQuery::parse(&pairs(&[wrong])).filter().is_err(), "{wrong:?}");
        }
        assert!(parse_time("2026-12-03").is_ok());
    }

    #[test]
    fn every_kind_has_a_family_and_words() {
        for k in HistoryKind::ALL {
            assert!(!kind_words(k).contains('_'));
            assert!(!colour(family(k)).is_empty());
        }
        assert!(failed(HistoryKind::DeadLettered) && !failed(HistoryKind::Handled));
    }
}
