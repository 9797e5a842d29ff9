//! The dead-letter counts of the last hour, sampled by the console itself, and their
//! picture (an inline SVG sparkline per queue on the dashboard).
//!
//! The brokers keep no history of their counts, so the console samples
//! [`QueueAdmin::queues`] every `sample_every` (30 s by default) into a ring buffer in
//! memory that holds an hour. The history therefore starts when the console starts (a
//! console started five minutes ago draws five minutes, at the right end of the hour) and
//! is lost when it stops: a design choice that needs no table in anyone's database. For
//! longer history, export the counts as metrics (docs/observability.md).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use courier::admin::{QueueAdmin, QueueSummary};
use maud::{Markup, html};

/// How far back the sparkline goes.
pub(crate) const WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// One sample: each queue's dead-letter count at a time.
#[derive(Debug)]
struct Sample {
    at: DateTime<Utc>,
    dead: HashMap<String, u64>,
}

/// The samples of the last hour.
#[derive(Debug)]
pub(crate) struct History {
    capacity: usize,
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub(crate) fn new(every: Duration) -> Self {
        let per_hour = 3_600_000 / every.as_millis().max(1);
        let capacity = usize::try_from(per_hour).unwrap_or(usize::MAX).saturating_add(2);
        Self {
            capacity,
            samples: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
        }
    }

    fn samples(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records the counts read at `at`; forgets what is older than the window.
    pub(crate) fn record(&self, at: DateTime<Utc>, queues: &[QueueSummary]) {
        let dead = queues.iter().map(|q| (q.name.clone(), q.dead_lettered)).collect();
        let mut samples = self.samples();
        samples.push_back(Sample { at, dead });
        while samples.len() > self.capacity || samples.front().is_some_and(|s| s.at < at - WINDOW) {
            samples.pop_front();
        }
    }

    /// When the oldest sample kept was taken.
    pub(crate) fn since(&self) -> Option<DateTime<Utc>> {
        self.samples().front().map(|s| s.at)
    }

    /// The dead-letter counts of `queue` within the window before `now`, oldest first.
    pub(crate) fn series(&self, queue: &str, now: DateTime<Utc>) -> Vec<(DateTime<Utc>, u64)> {
        self.samples()
            .iter()
            .filter(|s| s.at >= now - WINDOW && s.at <= now)
            .filter_map(|s| s.dead.get(queue).map(|&n| (s.at, n)))
            .collect()
    }
}

/// Samples `admin`'s counts every `every` while the history is alive (the console's
/// router holds it; the task ends after the router is dropped).
pub(crate) fn start_sampler(history: Weak<History>, admin: Arc<dyn QueueAdmin>, every: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let Some(history) = history.upgrade() else {
                return;
            };
            match admin.queues().await {
                Ok(queues) => history.record(admin.now(), &queues),
                Err(e) => {
                    tracing::warn!(error = %e, broker = %admin.describe(), "the console cannot sample the queues' counts")
                }
            }
        }
    });
}

/// Width and height of a sparkline, in pixels.
const W: f64 = 120.0;
const H: f64 = 26.0;

/// The sparkline of `series` (the samples) ending with `current` at `now`: the hour
/// before `now` spans the width, so a history shorter than an hour fills only its right
/// part. Red when the latest count is above zero.
pub(crate) fn sparkline(series: &[(DateTime<Utc>, u64)], now: DateTime<Utc>, current: u64) -> Markup {
    let mut points: Vec<(DateTime<Utc>, u64)> = series.to_vec();
    points.push((now, current));
    let max = points.iter().map(|p| p.1).max().unwrap_or(0).max(1);
    let start = now - WINDOW;
    let window_ms = WINDOW.num_milliseconds() as f64;
    let xy: Vec<(f64, f64)> = points
        .iter()
        .map(|(t, n)| {
            let x = ((*t - start).num_milliseconds() as f64 / window_ms).clamp(0.0, 1.0) * (W - 2.0) + 1.0;
            let y = H - 2.0 - (*n as f64 / max as f64) * (H - 4.0);
            (x, y)
        })
        .collect();
    let line: Vec<String> = xy.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    let first_x = xy.first().map_or(W - 1.0, |p| p.0);
    let area = format!(
        "{first_x:.1},{:.1} {} {:.1},{:.1}",
        H - 2.0,
        line.join(" "),
        W - 1.0,
        H - 2.0
    );
    let (stroke, fill) = if current > 0 {
        ("#cf222e", "#ffebe9")
    } else {
        ("#8c959f", "#eaeef2")
    };
    let peak = points.iter().map(|p| p.1).max().unwrap_or(0);
    let label = format!(
        "dead letters over the last hour (sampled since {}): now {current}, at most {peak}",
        series
            .first()
            .map_or_else(|| "now".to_owned(), |s| s.0.format("%H:%M:%S UTC").to_string())
    );
    html! {
        svg.spark xmlns="http://www.w3.org/2000/svg" width=(W) height=(H) viewBox=(format!("0 0 {W} {H}")) role="img" aria-label=(label) {
            title { (label) }
            line x1="1" y1=(H - 2.0) x2=(W - 1.0) y2=(H - 2.0) stroke="#d0d7de" stroke-width="1" {}
            polygon points=(area) fill=(fill) stroke="none" {}
            polyline points=(line.join(" ")) fill="none" stroke=(stroke) stroke-width="1.5" stroke-linejoin="round" {}
            @if let Some((x, y)) = xy.last() {
                circle cx=(format!("{x:.1}")) cy=(format!("{y:.1}")) r="2" fill=(stroke) {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_an_hour_and_a_queues_series_in_order() {
        let history = History::new(Duration::from_secs(600));
        let t0 = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        for i in 0..10 {
            let at = t0 + chrono::Duration::minutes(10 * i);
            history.record(at, &[]);
        }
        // 3600 / 600 + 2 = 8 samples at most; and none older than an hour before the last.
        let last = t0 + chrono::Duration::minutes(90);
        assert_eq!(history.since(), Some(last - WINDOW));
        assert!(history.series("orders", last).is_empty(), "no such queue sampled");
    }

    #[test]
    fn the_sparkline_is_red_when_there_are_dead_letters_now() {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        let svg = sparkline(&[(now - chrono::Duration::minutes(30), 0)], now, 4).into_string();
        assert!(svg.contains("#cf222e") && svg.contains("now 4, at most 4"), "{svg}");
        let calm = sparkline(&[], now, 0).into_string();
        assert!(!calm.contains("#cf222e"), "{calm}");
    }
}
