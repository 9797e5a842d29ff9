//! `courier history`: a saga instance's timeline (`saga TYPE CORRELATION`, one event a
//! line, with what it changed in the state, what it sent and its timeouts on indented
//! lines below it) and a message's conversation (`message ID`, the tree of messages it
//! caused, each with its endpoints' outcomes), from `courier::admin::HistoryAdmin`; as
//! JSON with `--json`.

use courier::admin::{
    AdminError, FoundHistory, HistoryAdmin, HistoryFilter, MessageHistory, MessageNode, SagaHistory,
    StoredHistoryEvent, TimelineLink,
};
use courier::{HistoryKind, SagaChange, SentMessage};
use courier_cli::diff::{StateDiff, compact, diff_states};

use crate::Exit;
use crate::args::{HistoryArgs, HistoryCommand};
use crate::commands::{Failure, Run};
use crate::output::{Out, cell, time, time_ms};

/// The most changes of one state printed (`--json` has the states).
const SHOWN_CHANGES: usize = 20;

/// What to say when a store has no event of what was asked.
const NO_HISTORY: &str = "hint: no event of it was recorded. Is the history on for the endpoint that handles it \
     (EndpointBuilder::history with HistoryOptions, docs/history.md)? Events older than the endpoint's retention are \
     deleted, a message not handled yet has none, and the store must be the endpoint's";

impl Run<'_> {
    fn history_admin(&self) -> Result<&dyn HistoryAdmin, Failure> {
        self.to.history.as_deref().ok_or_else(|| {
            Failure::Usage(
                "history commands need the endpoint's store: --embedded FILE, --postgres URL or --sqlite FILE".into(),
            )
        })
    }

    pub(crate) async fn history(&mut self, command: &HistoryCommand) -> Result<Exit, Failure> {
        let admin = self.history_admin()?;
        let result = match command {
            HistoryCommand::Saga {
                saga,
                correlation,
                filter,
            } => admin
                .saga_history(saga, correlation, &filter_of(filter))
                .await
                .map(|h| self.print_saga(&h, filter)),
            HistoryCommand::Message { id, filter } => admin
                .message_history(id, &filter_of(filter))
                .await
                .map(|h| self.print_message(&h, filter)),
            HistoryCommand::Find { text, filter } => match admin.find(text, &filter_of(filter)).await {
                Ok(found) if found.events.is_empty() => Err(AdminError::NotFound {
                    what: format!("an event holding {}", cell(text, 200)),
                }),
                Ok(found) => {
                    self.print_found(&found, filter);
                    Ok(())
                }
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(()) => Ok(Exit::Ok),
            Err(e @ AdminError::NotFound { .. }) => {
                let names = match command {
                    HistoryCommand::Saga { .. } => {
                        "; `courier sagas types` lists the saga names, `courier sagas list NAME` the instances"
                    }
                    HistoryCommand::Message { .. } => "",
                    HistoryCommand::Find { .. } => {
                        "; a field the endpoint redacts (HistoryOptions::redact) is never stored, and a body only \
                         with HistoryOptions::with_bodies(true): search by what the states or ids hold"
                    }
                };
                say!("{NO_HISTORY}{names}");
                Err(Failure::Admin(e))
            }
            Err(e) => Err(Failure::Admin(e)),
        }
    }

    fn print_saga(&mut self, h: &SagaHistory, args: &HistoryArgs) {
        if self.json {
            self.out.json(h);
            return;
        }
        let out = &mut self.out;
        out.line(format!(
            "saga {} instance {}: {} event(s){}",
            cell(&h.saga_type, 200),
            cell(&h.correlation, 200),
            h.events.len(),
            filtered(args)
        ));
        if h.events.is_empty() {
            out.line("no event passes the filters (--since, --until, --outcome)");
        }
        for e in &h.events {
            out.line(headline(e));
            let change = e
                .event
                .detail
                .sagas
                .iter()
                .find(|s| s.saga_type == h.saga_type && s.correlation == h.correlation);
            let mut facets = Vec::new();
            if let Some(change) = change {
                facets.extend(state_lines(change));
                facets.extend(timeout_line(change));
            }
            facets.extend(sent_line(&e.event.detail.sent));
            facets.extend(timeout_of(e));
            facets.extend(notes(e));
            match e.link {
                Some(TimelineLink::SameConversation) => facets.push(
                    "(a failed attempt in a conversation of this instance's messages: a failed attempt names no \
                     instance, so it may be another saga's or handler's)"
                        .to_owned(),
                ),
                Some(TimelineLink::SameMessage) if e.event.kind != HistoryKind::Duplicate => {
                    facets.push("(rolled back: nothing of this attempt changed the state or was sent)".to_owned());
                }
                _ => {}
            }
            for f in facets {
                out.line(format!("    {f}"));
            }
        }
        if h.more
            && let Some(last) = h.events.last()
        {
            out.line(format!(
                "more events: the first {} are listed; the later ones with --since {} (or a higher --limit)",
                h.events.len(),
                last.event.at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            ));
        }
    }

    fn print_found(&mut self, h: &FoundHistory, args: &HistoryArgs) {
        if self.json {
            self.out.json(h);
            return;
        }
        let out = &mut self.out;
        out.line(format!(
            "{} found in {} event(s), newest first{}",
            cell(&h.text, 200),
            h.events.len(),
            filtered(args)
        ));
        for e in &h.events {
            out.line(format!("  {}", headline(e)));
        }
        if h.more
            && let Some(last) = h.events.last()
        {
            out.line(format!(
                "more events hold it: the newest {} are listed; older ones with --until {} (or a higher --limit)",
                h.events.len(),
                last.event.at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
            ));
        }
        if h.instances.is_empty() {
            out.line("no saga instance is named by these events: `courier history message ID` shows a message's tree");
            return;
        }
        out.line("saga instances they name, the most recently touched first:");
        for i in &h.instances {
            out.line(format!(
                "  {} {}: {} event(s), the last at {}; its timeline: courier history saga {} {}",
                cell(&i.saga_type, 100),
                cell(&i.correlation, 100),
                i.events,
                time_ms(i.last_at),
                shell_word(&i.saga_type),
                shell_word(&i.correlation)
            ));
        }
    }

    fn print_message(&mut self, h: &MessageHistory, args: &HistoryArgs) {
        if self.json {
            self.out.json(h);
            return;
        }
        let out = &mut self.out;
        out.line(format!(
            "message {} and the {} message(s) it caused{}",
            cell(&h.root.message_id, 200),
            h.root.count() - 1,
            filtered(args)
        ));
        if let Some(parent) = h.root.events.iter().find_map(|e| e.event.causation_id.as_deref()) {
            out.line(format!(
                "caused by {} (courier history message {})",
                cell(parent, 200),
                cell(parent, 200)
            ));
        }
        let narrowed = filter_of(args).narrows();
        tree(out, &h.root, "", None, narrowed);
        for why in &h.left_out {
            out.line(format!("left out: {}", cell(why, 500)));
        }
    }
}

fn filter_of(args: &HistoryArgs) -> HistoryFilter {
    let mut f = HistoryFilter::default().limit(args.limit);
    if let Some(t) = args.since {
        f = f.since(t);
    }
    if let Some(t) = args.until {
        f = f.until(t);
    }
    for k in &args.outcome {
        f = f.outcome(*k);
    }
    f
}

/// What the filters leave out, said after a count.
fn filtered(args: &HistoryArgs) -> String {
    let mut parts = Vec::new();
    if let Some(t) = args.since {
        parts.push(format!("since {}", time(t)));
    }
    if let Some(t) = args.until {
        parts.push(format!("until {}", time(t)));
    }
    if !args.outcome.is_empty() {
        let names: Vec<&str> = args.outcome.iter().map(|k| k.as_str()).collect();
        parts.push(format!("outcome {}", names.join(" or ")));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

/// An event's outcome in words: `handled`, `retried: ERROR`, `dead-lettered (REASON): ERROR`,
/// `duplicate (already handled)`.
fn outcome(e: &StoredHistoryEvent) -> String {
    let d = &e.event.detail;
    let error = d.error.as_deref().map(|x| cell(x, 300));
    match e.event.kind {
        HistoryKind::Handled => "handled".to_owned(),
        HistoryKind::Retried => format!("retried: {}", error.as_deref().unwrap_or("(no error recorded)")),
        HistoryKind::DeadLettered => {
            let reason = d.reason.as_deref().map(|r| format!(" ({})", cell(r, 100)));
            format!(
                "dead-lettered{}: {}",
                reason.unwrap_or_default(),
                error.as_deref().unwrap_or("(no error recorded)")
            )
        }
        HistoryKind::Duplicate => "duplicate (already handled: dropped by the inbox)".to_owned(),
        HistoryKind::TimeoutDispatched => match &d.timeout {
            Some(t) => format!("timeout sent (due {})", time(t.mark.due)),
            None => "timeout sent".to_owned(),
        },
        HistoryKind::TimeoutDeadLettered => {
            let reason = d.reason.as_deref().map(|r| format!(" ({})", cell(r, 100)));
            format!(
                "timeout dead-lettered{}: {}",
                reason.unwrap_or_default(),
                error.as_deref().unwrap_or("(no error recorded)")
            )
        }
        // A kind of a later version: its name, and its error if it has one.
        other => match error {
            Some(error) => format!("{}: {error}", other.as_str()),
            None => other.as_str().to_owned(),
        },
    }
}

/// A dispatcher's event: which instance's timeout, and its key.
fn timeout_of(e: &StoredHistoryEvent) -> Option<String> {
    let t = e.event.detail.timeout.as_ref()?;
    let key = t
        .mark
        .key
        .as_deref()
        .map(|k| format!(", key {}", cell(k, 60)))
        .unwrap_or_default();
    Some(format!(
        "timeout of saga {} instance {}{key}",
        cell(&t.saga_type, 100),
        cell(&t.correlation, 100)
    ))
}

/// `text` as one word of a shell command: as it is when it holds only letters, digits
/// and `._@:+-/`, else in single quotes (each quote in it written `'\''`), with any
/// control character shown escaped.
fn shell_word(text: &str) -> String {
    let plain = !text.is_empty() && text.chars().all(|c| c.is_ascii_alphanumeric() || "._@:+-/".contains(c));
    if plain {
        text.to_owned()
    } else {
        format!("'{}'", cell(text, 200).replace('\'', "'\\''"))
    }
}

/// A message as printed: its type and id.
fn message(message_type: Option<&str>, id: &str) -> String {
    format!("{} {}", cell(message_type.unwrap_or("(no type)"), 100), cell(id, 100))
}

/// The first line of an event in a timeline: time, message, outcome, endpoint, attempt.
fn headline(e: &StoredHistoryEvent) -> String {
    let ev = &e.event;
    format!(
        "{}  {}  {}  [{}, {} {}]",
        time_ms(ev.at),
        message(ev.message_type.as_deref(), &ev.message_id),
        outcome(e),
        cell(&ev.endpoint, 100),
        attempt_word(e),
        ev.attempt
    )
}

/// The state's change as lines: `state: path: old -> new; ...` (at most
/// [`SHOWN_CHANGES`]), `started: {...}`, or why there is no diff.
fn state_lines(change: &SagaChange) -> Vec<String> {
    let mut lines = Vec::new();
    let state = match diff_states(change.before.as_deref(), change.after.as_deref()) {
        StateDiff::Started(v) => Some(format!("state: started {}", cell(&compact(&v, 300), 400))),
        StateDiff::Unchanged => Some("state: unchanged".to_owned()),
        StateDiff::Changes(changes) => {
            let mut shown: Vec<String> = changes
                .iter()
                .take(SHOWN_CHANGES)
                .map(|c| cell(&c.to_string(), 400))
                .collect();
            if changes.len() > SHOWN_CHANGES {
                shown.push(format!(
                    "… {} more (--json has the states)",
                    changes.len() - SHOWN_CHANGES
                ));
            }
            Some(format!("state: {}", shown.join("; ")))
        }
        StateDiff::Unreadable { which, bytes } => Some(format!(
            "state: no diff: the state {which} ({bytes} bytes) is not JSON (cut to the history's size limit, or not \
             written as JSON; --json has it)"
        )),
        StateDiff::Unknown if change.completed => None,
        StateDiff::Unknown => Some("state: not recorded".to_owned()),
    };
    lines.extend(state);
    if change.completed {
        lines.push("completed".to_owned());
    }
    lines
}

fn timeout_line(change: &SagaChange) -> Option<String> {
    let mut parts = Vec::new();
    // A request under a key cancels any pending timeout of that key first: said with the
    // request, not as a cancellation of its own.
    let replaced = |key: &str| change.keys_cancelled.iter().any(|k| k == key);
    for t in &change.timeouts_requested {
        let key = t
            .key
            .as_deref()
            .map(|k| {
                let note = if replaced(k) { ", replacing any pending one" } else { "" };
                format!(" key {}{note}", cell(k, 60))
            })
            .unwrap_or_default();
        parts.push(format!(
            "requested {} due {}{key}",
            message(t.message_type.as_deref(), &t.id),
            time(t.due)
        ));
    }
    for id in &change.timeouts_cancelled {
        parts.push(format!("cancelled {}", cell(id, 100)));
    }
    let requested = |key: &str| change.timeouts_requested.iter().any(|t| t.key.as_deref() == Some(key));
    for key in change.keys_cancelled.iter().filter(|k| !requested(k)) {
        parts.push(format!("cancelled key {}", cell(key, 60)));
    }
    if let Some(id) = &change.timeout_fired {
        parts.push(format!("fired {}", cell(id, 100)));
    }
    if let Some(id) = &change.timeout_discarded {
        parts.push(format!(
            "discarded {} (cancelled, or its saga completed)",
            cell(id, 100)
        ));
    }
    (!parts.is_empty()).then(|| format!("timeouts: {}", parts.join("; ")))
}

/// Where a message went: `-> billing`, `-> topic events`, with its due time if
/// scheduled.
fn destination(m: &SentMessage) -> String {
    let due = m.due.map(|d| format!(" (due {})", time(d))).unwrap_or_default();
    let topic = if m.topic { "topic " } else { "" };
    format!("-> {topic}{}{due}", cell(&m.destination, 100))
}

fn sent_line(sent: &[SentMessage]) -> Option<String> {
    let parts: Vec<String> = sent
        .iter()
        .map(|m| {
            format!(
                "{} {}",
                message(m.message_type.as_deref(), &m.message_id),
                destination(m)
            )
        })
        .collect();
    (!parts.is_empty()).then(|| format!("sent: {}", parts.join("; ")))
}

/// What was cut or could not be read of an event.
fn notes(e: &StoredHistoryEvent) -> Vec<String> {
    let mut out: Vec<String> = e
        .event
        .detail
        .cut
        .iter()
        .map(|c| format!("cut: {}", cell(c, 300)))
        .collect();
    out.extend(e.problems.iter().map(|p| format!("! unreadable: {}", cell(p, 300))));
    out
}

/// An event of a message in the tree: time, endpoint, outcome, attempt.
fn tree_event(e: &StoredHistoryEvent) -> String {
    let ev = &e.event;
    format!(
        "{}  {}: {}  [{} {}]",
        time_ms(ev.at),
        cell(&ev.endpoint, 100),
        outcome(e),
        attempt_word(e),
        ev.attempt
    )
}

/// What the event's number counts: a handling's attempts, or a timeout's dispatches.
fn attempt_word(e: &StoredHistoryEvent) -> &'static str {
    match e.event.kind {
        HistoryKind::TimeoutDispatched | HistoryKind::TimeoutDeadLettered => "dispatch",
        _ => "attempt",
    }
}

/// Draws `node` and its descendants: `prefix` begins each line; `last` is whether it is
/// its parent's last child (`None` for the root); `narrowed`, whether a filter chose the
/// events.
fn tree(out: &mut Out, node: &MessageNode, prefix: &str, last: Option<bool>, narrowed: bool) {
    let (branch, inner) = match last {
        None => ("", ""),
        Some(true) => ("└─ ", "   "),
        Some(false) => ("├─ ", "│  "),
    };
    let mut head = message(node.message_type.as_deref(), &node.message_id);
    if let Some(sent) = &node.sent {
        head.push_str(&format!("  {}", destination(sent)));
    }
    if let Some(t) = &node.timeout {
        head.push_str(&format!("  (timeout, due {})", time(t.due)));
    }
    out.line(format!("{prefix}{branch}{head}"));
    let below = format!("{prefix}{inner}");
    let bar = if node.caused.is_empty() { "   " } else { "│  " };
    if node.events.is_empty() {
        let why = if narrowed {
            "no event passes the filters"
        } else {
            "no event: not handled yet, or by an endpoint that keeps no history"
        };
        out.line(format!("{below}{bar}{why}"));
    }
    for e in &node.events {
        out.line(format!("{below}{bar}{}", tree_event(e)));
        for n in notes(e) {
            out.line(format!("{below}{bar}    {n}"));
        }
    }
    for (i, child) in node.caused.iter().enumerate() {
        tree(out, child, &below, Some(i + 1 == node.caused.len()), narrowed);
    }
}
