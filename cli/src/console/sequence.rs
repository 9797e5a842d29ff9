//! A conversation as a sequence diagram, drawn on the server as inline SVG (no script):
//! one lifeline per endpoint (and `sender` for whoever sent the first message), one
//! arrow per event, oldest at the top, from the endpoint whose handling sent the message
//! to the endpoint that handled it, labelled with the message's type and the outcome
//! (retried and dead-lettered in colours of their own); a saga's timeout is an arrow from
//! an endpoint to itself (requested, then fired when handled); a message with no event
//! (not handled yet, or by an endpoint that keeps no history) is a dashed arrow to its
//! destination.
//!
//! Every arrow has a row of its own, so the picture grows downwards with the conversation
//! and no two labels share a line: at any length each label keeps its size (12 px) and
//! links to its message's page, with the whole text and the error on hover. The layout
//! ([`layout`]) is separate from the drawing, so a test can check the positions.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use courier::admin::{MessageHistory, MessageNode};
use maud::{Markup, html};

use super::events::{colour, family, kind_words, message_link};
use super::svg::f1;

/// The horizontal distance between two lifelines.
pub(crate) const LANE: f64 = 190.0;
/// The vertical distance between two arrows.
pub(crate) const ROW: f64 = 30.0;
/// The x of the first lifeline (the times are on its left).
const FIRST: f64 = 150.0;
/// The y of the first arrow.
const TOP: f64 = 78.0;
/// The labels' font size, in pixels.
pub(crate) const FONT: f64 = 12.0;
/// A character's width, estimated from the font size (the labels are in a proportional
/// font; this bounds the common characters, so the picture is wide enough).
pub(crate) const CHAR: f64 = 7.0;
/// The most characters of an arrow's label (the whole text is on hover).
const LABEL: usize = 56;
/// The most characters of a lifeline's name.
const NAME: usize = 24;
/// With more arrows than this, the lifelines' names are repeated at the bottom.
const FOOTER_AFTER: usize = 20;

/// One arrow of the diagram.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Arrow {
    /// Lifelines (indexes into [`Layout::lifelines`]).
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// When (the event's end, or the sending handling's for a message with no event).
    pub(crate) at: DateTime<Utc>,
    /// The label, cut to [`LABEL`] characters.
    pub(crate) label: String,
    /// Its whole text, with the error (on hover).
    pub(crate) title: String,
    /// `handled`, `retried`, `dead`, `other`, `timeout` (requested) or `none` (no event).
    pub(crate) family: &'static str,
    /// The message it links to.
    pub(crate) message_id: String,
}

/// A diagram laid out: the lifelines and the arrows in the order drawn.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    pub(crate) lifelines: Vec<String>,
    pub(crate) arrows: Vec<Arrow>,
}

/// A label's text at most `max` characters long (with `…` when cut).
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

struct Builder {
    lifelines: Vec<String>,
    index: HashMap<String, usize>,
    /// (time, order drawn in the tree, arrow).
    arrows: Vec<(DateTime<Utc>, usize, Arrow)>,
}

impl Builder {
    fn lifeline(&mut self, name: &str) -> usize {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        self.lifelines.push(name.to_owned());
        self.index.insert(name.to_owned(), self.lifelines.len() - 1);
        self.lifelines.len() - 1
    }

    fn push(&mut self, at: DateTime<Utc>, arrow: Arrow) {
        let n = self.arrows.len();
        self.arrows.push((at, n, arrow));
    }

    /// The arrow of the timeout `node` requested by `from`'s handling at `sent_at`: from
    /// the endpoint to itself.
    fn requested(&mut self, node: &MessageNode, from: &str, sent_at: Option<DateTime<Utc>>) {
        let ty = node.message_type.as_deref().unwrap_or("(no type)");
        let first_at = node.events.first().map(|e| e.event.at);
        if let Some(t) = &node.timeout {
            let at = sent_at.or(first_at).unwrap_or(t.due);
            let i = self.lifeline(from);
            let label = format!("timeout {} requested, due {}", ty, t.due.format("%H:%M:%S"));
            self.push(
                at,
                Arrow {
                    from: i,
                    to: i,
                    at,
                    title: format!("timeout {} {} requested by {from}, due {}", ty, node.message_id, t.due),
                    label: cut(&label, LABEL),
                    family: "timeout",
                    message_id: node.message_id.clone(),
                },
            );
        }
    }

    /// The arrows of `node` sent from lifeline `from` at `sent_at`, then the requests of
    /// the timeouts its handling asked for, then its descendants'.
    fn node(&mut self, node: &MessageNode, from: &str, sent_at: Option<DateTime<Utc>>) {
        let ty = node.message_type.as_deref().unwrap_or("(no type)");
        for e in &node.events {
            let ev = &e.event;
            let (src, dst) = if node.timeout.is_some() {
                (ev.endpoint.as_str(), ev.endpoint.as_str())
            } else {
                (from, ev.endpoint.as_str())
            };
            let (a, b) = (self.lifeline(src), self.lifeline(dst));
            let attempt = if ev.attempt > 1 {
                format!(" #{}", ev.attempt)
            } else {
                String::new()
            };
            let mark = if node.timeout.is_some() { "timeout " } else { "" };
            let label = format!("{mark}{ty}: {}{attempt}", kind_words(ev.kind));
            let mut title = format!(
                "{ty} {} — {} on {}, attempt {}, {}",
                node.message_id,
                kind_words(ev.kind),
                ev.endpoint,
                ev.attempt,
                ev.at
            );
            if let Some(r) = &ev.detail.reason {
                title.push_str(&format!(" ({r})"));
            }
            if let Some(err) = &ev.detail.error {
                title.push_str(&format!(": {err}"));
            }
            self.push(
                ev.at,
                Arrow {
                    from: a,
                    to: b,
                    at: ev.at,
                    label: cut(&label, LABEL),
                    title,
                    family: family(ev.kind),
                    message_id: node.message_id.clone(),
                },
            );
        }
        if node.events.is_empty() && node.timeout.is_none() {
            let dst = match &node.sent {
                Some(s) if s.topic => format!("topic {}", s.destination),
                Some(s) => s.destination.clone(),
                None => "(unknown)".to_owned(),
            };
            let at = sent_at.unwrap_or(DateTime::<Utc>::MIN_UTC);
            let (a, b) = (self.lifeline(from), self.lifeline(&dst));
            self.push(
                at,
                Arrow {
                    from: a,
                    to: b,
                    at,
                    label: cut(&format!("{ty}: no event"), LABEL),
                    title: format!(
                        "{ty} {} sent to {dst}: no event (not handled yet, or by an endpoint that keeps no history)",
                        node.message_id
                    ),
                    family: "none",
                    message_id: node.message_id.clone(),
                },
            );
        }
        for child in node.caused.iter().filter(|c| c.timeout.is_some()) {
            let (src, at) = sender_of(node, &child.message_id).unwrap_or((from, sent_at));
            self.requested(child, src, at);
        }
        for child in &node.caused {
            let (src, at) = sender_of(node, &child.message_id).unwrap_or((from, sent_at));
            self.node(child, src, at);
        }
    }
}

/// The endpoint whose handling of `parent` sent (or requested as a timeout) `child`, and
/// when: the event that lists it, else the first handled event.
fn sender_of<'a>(parent: &'a MessageNode, child: &str) -> Option<(&'a str, Option<DateTime<Utc>>)> {
    let lists = |e: &&courier::admin::StoredHistoryEvent| {
        let d = &e.event.detail;
        d.sent.iter().any(|m| m.message_id == child)
            || d.sagas
                .iter()
                .any(|s| s.timeouts_requested.iter().any(|t| t.id == child))
    };
    parent
        .events
        .iter()
        .find(lists)
        .or_else(|| {
            parent
                .events
                .iter()
                .find(|e| e.event.kind == courier::HistoryKind::Handled)
        })
        .or_else(|| parent.events.first())
        .map(|e| (e.event.endpoint.as_str(), Some(e.event.at)))
}

/// Lays out the conversation of `h`: lifelines in the order they first appear, arrows in
/// time order (the tree's order among equal times).
pub(crate) fn layout(h: &MessageHistory) -> Layout {
    let mut b = Builder {
        lifelines: Vec::new(),
        index: HashMap::new(),
        arrows: Vec::new(),
    };
    b.lifeline("sender");
    b.node(&h.root, "sender", None);
    b.arrows.sort_by(|x, y| x.0.cmp(&y.0).then(x.1.cmp(&y.1)));
    // Lifelines in the order the sorted arrows reach them (sender first).
    let mut order: Vec<usize> = vec![0];
    for (_, _, a) in &b.arrows {
        for i in [a.from, a.to] {
            if !order.contains(&i) {
                order.push(i);
            }
        }
    }
    let mut place = vec![0; b.lifelines.len()];
    for (pos, &i) in order.iter().enumerate() {
        place[i] = pos;
    }
    let lifelines = order.iter().map(|&i| b.lifelines[i].clone()).collect();
    let arrows = b
        .arrows
        .into_iter()
        .map(|(_, _, mut a)| {
            a.from = place[a.from];
            a.to = place[a.to];
            a
        })
        .collect();
    Layout { lifelines, arrows }
}

/// The x of lifeline `i`.
pub(crate) fn lane_x(i: usize) -> f64 {
    FIRST + i as f64 * LANE
}

/// The y of arrow `row`.
pub(crate) fn row_y(row: usize) -> f64 {
    TOP + row as f64 * ROW
}

/// Where an arrow's label is: the x of its anchor, its baseline's y, whether it is
/// anchored at its end (right-aligned), and its estimated left edge. A label goes right
/// of its arrow's start (of a loop: right of it), unless it would pass the last
/// lifeline's column, then it ends left of its arrow's end (of a loop: left of it).
pub(crate) fn label_at(a: &Arrow, row: usize, lifelines: usize) -> (f64, f64, bool, f64) {
    let y = row_y(row);
    let w = text_width(&a.label);
    let right_edge = lane_x(lifelines.saturating_sub(1)) + LANE / 2.0;
    let (start, end, y) = if a.from == a.to {
        let x = lane_x(a.from);
        (x + 34.0, x - 10.0, y + 4.0)
    } else {
        let (x1, x2) = (lane_x(a.from), lane_x(a.to));
        (x1.min(x2) + 10.0, x1.max(x2) - 10.0, y - 6.0)
    };
    if start + w > right_edge && end - w > FIRST {
        (end, y, true, end - w)
    } else {
        (start, y, false, start)
    }
}

/// The estimated width of a text.
pub(crate) fn text_width(text: &str) -> f64 {
    text.chars().count() as f64 * CHAR
}

/// The picture's width and height.
pub(crate) fn size(l: &Layout) -> (f64, f64) {
    let lanes = lane_x(l.lifelines.len().saturating_sub(1)) + LANE / 2.0;
    let labels = l
        .arrows
        .iter()
        .enumerate()
        .map(|(i, a)| label_at(a, i, l.lifelines.len()).3 + text_width(&a.label) + 16.0)
        .fold(0.0, f64::max);
    let footer = if l.arrows.len() > FOOTER_AFTER { 40.0 } else { 0.0 };
    let height = row_y(l.arrows.len()) + 34.0 + footer;
    (lanes.max(labels).ceil(), height)
}

fn stroke(family: &str) -> &'static str {
    match family {
        "timeout" => "#0969da",
        "none" => "#8c959f",
        f => colour(f),
    }
}

/// The diagram of `l`.
pub(crate) fn draw(l: &Layout) -> Markup {
    let (width, height) = size(l);
    let bottom = row_y(l.arrows.len()) + 2.0;
    html! {
        svg.sequence #sequence xmlns="http://www.w3.org/2000/svg" width=(width) height=(height)
            viewBox=(format!("0 0 {width} {height}")) role="img" font-size=(FONT)
            aria-label=(format!("sequence diagram: {} arrows between {} lifelines", l.arrows.len(), l.lifelines.len())) {
            @for (i, name) in l.lifelines.iter().enumerate() {
                @let x = lane_x(i);
                g.lifeline data-name=(name) {
                    title { (name) }
                    line x1=(f1(x)) y1="44" x2=(f1(x)) y2=(f1(bottom)) stroke="#d0d7de" stroke-dasharray="5 4" {}
                    rect x=(f1(x - LANE / 2.0 + 8.0)) y="12" width=(f1(LANE - 16.0)) height="30" rx="5" fill="#f6f8fa" stroke="#8c959f" {}
                    text.head x=(f1(x)) y="32" text-anchor="middle" font-weight="600" { (cut(name, NAME)) }
                }
            }
            @for (row, a) in l.arrows.iter().enumerate() {
                @let y = row_y(row);
                @let colour = stroke(a.family);
                @let (lx, ly, end, x0) = label_at(a, row, l.lifelines.len());
                g class=(format!("arrow k-{}", a.family)) data-row=(row) {
                    title { (a.title) }
                    text.time x="6" y=(f1(y + 4.0)) fill="#656d76" { (a.at.format("%H:%M:%S%.3f")) }
                    @if a.from == a.to {
                        @let x = lane_x(a.from);
                        path d=(format!("M{} {}h26v12h-20", f1(x), f1(y - 6.0))) fill="none" stroke=(colour) stroke-width="1.6"
                            stroke-dasharray=[(a.family == "timeout").then_some("4 3")] {}
                        polygon points=(format!("{},{} {},{} {},{}", f1(x), f1(y + 6.0), f1(x + 7.0), f1(y + 2.0), f1(x + 7.0), f1(y + 10.0))) fill=(colour) {}
                    } @else {
                        @let (x1, x2) = (lane_x(a.from), lane_x(a.to));
                        @let dir = if x2 > x1 { -1.0 } else { 1.0 };
                        line x1=(f1(x1)) y1=(f1(y)) x2=(f1(x2 + dir * 2.0)) y2=(f1(y)) stroke=(colour) stroke-width="1.6"
                            stroke-dasharray=[(a.family == "none").then_some("5 4")] {}
                        polygon points=(format!("{},{} {},{} {},{}", f1(x2), f1(y), f1(x2 + dir * 9.0), f1(y - 4.5), f1(x2 + dir * 9.0), f1(y + 4.5))) fill=(colour) {}
                    }
                    a href=(message_link(&a.message_id)) {
                        text.label x=(f1(lx)) y=(f1(ly)) fill=(colour) text-anchor=[end.then_some("end")]
                            data-x0=(f1(x0)) data-w=(f1(text_width(&a.label))) { (a.label) }
                    }
                }
            }
            @if l.arrows.len() > FOOTER_AFTER {
                @let top = row_y(l.arrows.len()) + 2.0;
                @for (i, name) in l.lifelines.iter().enumerate() {
                    @let x = lane_x(i);
                    g.footer {
                        rect x=(f1(x - LANE / 2.0 + 8.0)) y=(f1(top)) width=(f1(LANE - 16.0)) height="30" rx="5" fill="#f6f8fa" stroke="#8c959f" {}
                        text.head x=(f1(x)) y=(f1(top + 20.0)) text-anchor="middle" font-weight="600" { (cut(name, NAME)) }
                    }
                }
            }
        }
    }
}

/// The diagram of a message's conversation.
pub(crate) fn diagram(h: &MessageHistory) -> Markup {
    draw(&layout(h))
}
