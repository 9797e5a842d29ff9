//! A saga instance's time axis, drawn on the server as inline SVG (no script): its
//! handled and failed events on one lane, its timeouts on another (requested, with a
//! dashed line to the time they fall due; fired; discarded), over an axis of times.
//!
//! Marks that fall on the same few pixels (events at the same time, as on a virtual
//! clock) are stacked, so each one shows; each carries its description as a `title`
//! (shown on hover), and a legend below says what the shapes are.

use chrono::{DateTime, Utc};
use maud::{Markup, html};

use super::events::colour;

/// What a mark on the axis is.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mark {
    /// An event of the colour family `family` (`handled`, `retried`, `dead`, `other`).
    Event { family: &'static str },
    /// A timeout requested, falling due at `due`.
    Requested { due: DateTime<Utc> },
    /// A timeout that fired (its message was handled).
    Fired,
    /// A timeout discarded (cancelled, or its saga completed).
    Discarded,
    /// An event of a timeout of its own (its dispatch, say), of colour family `family`.
    TimeoutEvent { family: &'static str },
}

/// A mark at a time, with what it says on hover.
#[derive(Debug, Clone)]
pub(crate) struct AxisMark {
    pub(crate) at: DateTime<Utc>,
    pub(crate) mark: Mark,
    pub(crate) title: String,
}

const WIDTH: f64 = 1000.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 30.0;
/// The vertical distance between two stacked marks.
const STACK: f64 = 13.0;
/// How close (in pixels) two marks are to be stacked.
const NEAR: f64 = 9.0;
/// The most marks stacked on one spot (the others share the top one).
const MAX_STACK: usize = 6;

/// The x of each mark's time between `first` and `last`.
fn scale(first: DateTime<Utc>, last: DateTime<Utc>) -> impl Fn(DateTime<Utc>) -> f64 {
    let span = (last - first).num_milliseconds().max(0) as f64;
    move |t| {
        if span == 0.0 {
            LEFT + (WIDTH - LEFT - RIGHT) / 2.0
        } else {
            LEFT + ((t - first).num_milliseconds() as f64 / span).clamp(0.0, 1.0) * (WIDTH - LEFT - RIGHT)
        }
    }
}

/// For each x in order, how many earlier ones are within [`NEAR`] of it (its level).
fn levels(xs: &[f64]) -> Vec<usize> {
    let mut placed: Vec<(f64, usize)> = Vec::new();
    xs.iter()
        .map(|&x| {
            let mut level = 0;
            while level < MAX_STACK - 1 && placed.iter().any(|&(px, l)| l == level && (px - x).abs() < NEAR) {
                level += 1;
            }
            placed.push((x, level));
            level
        })
        .collect()
}

/// A time on the axis: the date once, then the time of day.
fn tick_label(t: DateTime<Utc>, with_date: bool) -> String {
    if with_date {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    } else {
        t.format("%H:%M:%S").to_string()
    }
}

/// The axis of `marks` (empty markup when there is none).
pub(crate) fn time_axis(marks: &[AxisMark]) -> Markup {
    let times = marks.iter().flat_map(|m| match &m.mark {
        Mark::Requested { due } => vec![m.at, *due],
        _ => vec![m.at],
    });
    let (Some(first), Some(last)) = (times.clone().min(), times.max()) else {
        return html! {};
    };
    let x = scale(first, last);
    let (events, timeouts): (Vec<&AxisMark>, Vec<&AxisMark>) =
        marks.iter().partition(|m| matches!(m.mark, Mark::Event { .. }));
    let ev_levels = levels(&events.iter().map(|m| x(m.at)).collect::<Vec<_>>());
    let to_levels = levels(&timeouts.iter().map(|m| x(m.at)).collect::<Vec<_>>());
    let lane = |levels: &[usize]| levels.iter().max().map_or(1, |l| l + 1) as f64 * STACK + 14.0;
    let ev_base = 18.0 + lane(&ev_levels) - 10.0;
    let to_base = ev_base + 10.0 + lane(&to_levels);
    let axis_y = to_base + 16.0;
    let height = axis_y + 52.0;
    let ticks: i32 = if first == last { 1 } else { 5 };
    let span = last - first;
    html! {
        svg.axis #time-axis xmlns="http://www.w3.org/2000/svg" width=(WIDTH) height=(height)
            viewBox=(format!("0 0 {WIDTH} {height}")) role="img"
            aria-label=(format!("the instance's events and timeouts from {} to {}", tick_label(first, true), tick_label(last, true))) {
            text.lane x="4" y=(ev_base + 4.0) { "messages" }
            text.lane x="4" y=(to_base + 4.0) { "timeouts" }
            line x1=(LEFT) y1=(ev_base) x2=(WIDTH - RIGHT) y2=(ev_base) stroke="#eaeef2" {}
            line x1=(LEFT) y1=(to_base) x2=(WIDTH - RIGHT) y2=(to_base) stroke="#eaeef2" {}
            line x1=(LEFT) y1=(axis_y) x2=(WIDTH - RIGHT) y2=(axis_y) stroke="#8c959f" {}
            @for i in 0..ticks {
                @let t = if ticks == 1 { first } else { first + span * i / (ticks - 1) };
                @let tx = x(t);
                line x1=(f1(tx)) y1=(axis_y) x2=(f1(tx)) y2=(axis_y + 5.0) stroke="#8c959f" {}
                text.tick x=(f1(tx)) y=(axis_y + 18.0) text-anchor=(if i == 0 && ticks > 1 { "start" } else if i + 1 == ticks && ticks > 1 { "end" } else { "middle" }) {
                    (tick_label(t, i == 0))
                }
            }
            // The timeouts' spans first, under their marks.
            @for (m, level) in timeouts.iter().zip(&to_levels) {
                @if let Mark::Requested { due } = &m.mark {
                    @let y = to_base - *level as f64 * STACK;
                    line.due-span x1=(f1(x(m.at))) y1=(f1(y)) x2=(f1(x(*due))) y2=(f1(y)) stroke="#0969da" stroke-dasharray="4 3" {}
                    g.mark.due {
                        title { "due: " (m.title) }
                        line x1=(f1(x(*due))) y1=(f1(y - 6.0)) x2=(f1(x(*due))) y2=(f1(y + 6.0)) stroke="#0969da" stroke-width="2" {}
                    }
                }
            }
            @for (m, level) in events.iter().zip(&ev_levels) {
                @let (cx, cy) = (x(m.at), ev_base - *level as f64 * STACK);
                @let family = if let Mark::Event { family } = &m.mark { *family } else { "other" };
                g class=(format!("mark event k-{family}")) {
                    title { (m.title) }
                    @if family == "dead" {
                        rect x=(f1(cx - 5.0)) y=(f1(cy - 5.0)) width="10" height="10" fill=(colour(family)) {}
                    } @else if family == "retried" {
                        polygon points=(format!("{},{} {},{} {},{}", f1(cx), f1(cy - 6.0), f1(cx + 6.0), f1(cy + 5.0), f1(cx - 6.0), f1(cy + 5.0))) fill=(colour(family)) {}
                    } @else {
                        circle cx=(f1(cx)) cy=(f1(cy)) r="5.5" fill=(colour(family)) {}
                    }
                }
            }
            @for (m, level) in timeouts.iter().zip(&to_levels) {
                @let (cx, cy) = (x(m.at), to_base - *level as f64 * STACK);
                @match &m.mark {
                    Mark::Requested { .. } => g.mark.requested {
                        title { (m.title) }
                        polygon points=(format!("{},{} {},{} {},{} {},{}", f1(cx), f1(cy - 6.0), f1(cx + 6.0), f1(cy), f1(cx), f1(cy + 6.0), f1(cx - 6.0), f1(cy))) fill="#fff" stroke="#0969da" stroke-width="2" {}
                    },
                    Mark::Fired => g.mark.fired {
                        title { (m.title) }
                        polygon points=(format!("{},{} {},{} {},{}", f1(cx - 5.0), f1(cy - 6.0), f1(cx + 6.0), f1(cy), f1(cx - 5.0), f1(cy + 6.0))) fill="#0969da" {}
                    },
                    Mark::TimeoutEvent { family } => g class=(format!("mark timeout-event k-{family}")) {
                        title { (m.title) }
                        circle cx=(f1(cx)) cy=(f1(cy)) r="4.5" fill="#fff" stroke=(if *family == "dead" { colour(family) } else { "#0969da" }) stroke-width="2.5" {}
                    },
                    _ => g.mark.discarded {
                        title { (m.title) }
                        path d=(format!("M{} {}L{} {}M{} {}L{} {}", f1(cx - 5.0), f1(cy - 5.0), f1(cx + 5.0), f1(cy + 5.0), f1(cx - 5.0), f1(cy + 5.0), f1(cx + 5.0), f1(cy - 5.0))) stroke="#6e7781" stroke-width="2.5" {}
                    },
                }
            }
            g.legend transform=(format!("translate({LEFT} {})", axis_y + 40.0)) {
                circle cx="0" cy="-4" r="5" fill=(colour("handled")) {}
                text x="9" y="0" { "handled" }
                polygon points="80,-10 86,1 74,1" fill=(colour("retried")) {}
                text x="91" y="0" { "retried" }
                rect x="150" y="-9" width="10" height="10" fill=(colour("dead")) {}
                text x="165" y="0" { "dead-lettered" }
                circle cx="265" cy="-4" r="5" fill=(colour("other")) {}
                text x="274" y="0" { "other" }
                polygon points="330,-10 336,-4 330,2 324,-4" fill="#fff" stroke="#0969da" stroke-width="2" {}
                text x="342" y="0" { "timeout requested" }
                line x1="470" y1="-4" x2="495" y2="-4" stroke="#0969da" stroke-dasharray="4 3" {}
                line x1="497" y1="-10" x2="497" y2="2" stroke="#0969da" stroke-width="2" {}
                text x="504" y="0" { "due" }
                polygon points="545,-10 556,-4 545,2" fill="#0969da" {}
                text x="561" y="0" { "fired" }
                path d="M605 -9L615 1M605 1L615 -9" stroke="#6e7781" stroke-width="2.5" {}
                text x="621" y="0" { "discarded" }
                circle cx="692" cy="-4" r="4.5" fill="#fff" stroke="#0969da" stroke-width="2.5" {}
                text x="701" y="0" { "dispatched" }
            }
        }
    }
}

/// A coordinate with one decimal.
pub(crate) fn f1(v: f64) -> String {
    format!("{v:.1}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000 + s, 0).unwrap_or_default()
    }

    #[test]
    fn marks_at_the_same_time_are_stacked_and_each_has_its_title() {
        let marks: Vec<AxisMark> = (0..3)
            .map(|i| AxisMark {
                at: at(0),
                mark: Mark::Event { family: "handled" },
                title: format!("event {i} <b>"),
            })
            .chain([AxisMark {
                at: at(10),
                mark: Mark::Requested { due: at(900) },
                title: "requested".into(),
            }])
            .collect();
        let svg = time_axis(&marks).into_string();
        for i in 0..3 {
            assert!(svg.contains(&format!("<title>event {i} &lt;b&gt;</title>")), "{svg}");
        }
        assert_eq!(levels(&[10.0, 10.0, 12.0, 40.0]), vec![0, 1, 2, 0]);
        assert!(svg.contains("class=\"due-span\""), "{svg}");
        assert!(time_axis(&[]).into_string().is_empty());
    }
}
