//! A log limiter: many events of one kind make a few log lines, not one line each.
//!
//! One bad producer can send 30,000 messages that are all dead-lettered for the same
//! reason; a line per message buries everything else in the log. A [`LogLimiter`] keeps,
//! per key (a queue and a reason), a window of [`LogLimiter::every`] of the component's
//! clock: the first event of a quiet key is logged in full by the caller (it gets `true`
//! from [`LogLimiter::admit`]), the events after it in the window are only counted, and
//! when the window ends one summary line says how many there were, with the first and the
//! last message id among them. A window in which nothing more happened ends the key's
//! flood: its next event is logged in full again.
//!
//! The summaries come on time without any event to carry them: a task on the Tokio
//! runtime the limiter was made on sleeps on the limiter's clock until the earliest
//! window ends (a virtual clock drives it in tests). Without a runtime, a summary is
//! written at the next event or when the limiter is dropped; a limiter dropped with
//! counts pending writes them then, so no count is lost.
//!
//! Every text in a line (queue, reason, ids) may come from a producer and is escaped
//! ([`Escaped`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::logtext::Escaped;

/// The level of a limiter's summary lines (the caller picks the level of its own lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// `tracing::error!`
    Error,
    /// `tracing::warn!`
    Warn,
}

/// See the module docs. Cheap to clone: clones share their windows.
#[derive(Clone)]
pub(crate) struct LogLimiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for LogLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLimiter")
            .field("what", &self.inner.what)
            .field("every", &self.inner.every)
            .finish_non_exhaustive()
    }
}

struct Inner {
    clock: Arc<dyn Clock>,
    every: chrono::Duration,
    level: Level,
    /// What the events are, for the summary line: "messages dead-lettered".
    what: &'static str,
    runtime: Option<tokio::runtime::Handle>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    windows: HashMap<(String, String), Window>,
    /// Whether the summary task is running (it ends when no window is left).
    flusher: bool,
}

/// The events of one key since its last line.
struct Window {
    ends: DateTime<Utc>,
    started: DateTime<Utc>,
    count: u64,
    first: String,
    last: String,
}

/// One summary line to write.
struct Summary {
    queue: String,
    reason: String,
    count: u64,
    first: String,
    last: String,
    seconds: f64,
}

impl LogLimiter {
    /// A limiter whose windows last `every` of `clock`, writing its summaries at `level`;
    /// `what` names the events ("messages dead-lettered").
    pub(crate) fn new(clock: Arc<dyn Clock>, every: std::time::Duration, level: Level, what: &'static str) -> Self {
        let every = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::seconds(10));
        Self {
            inner: Arc::new(Inner {
                clock,
                every,
                level,
                what,
                runtime: tokio::runtime::Handle::try_current().ok(),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// `n` events of `(queue, reason)`, `first` and `last` the message ids of the first
    /// and the last of them. `true`: the key was quiet, the caller logs these in full now;
    /// `false`: they are counted in the key's next summary line.
    pub(crate) fn admit(&self, queue: &str, reason: &str, n: u64, first: &str, last: &str) -> bool {
        let now = self.inner.clock.now();
        let (whole, due, start) = {
            let mut state = self.inner.state.lock().unwrap_or_else(PoisonError::into_inner);
            let due = self.inner.take_due(&mut state, now);
            let key = (queue.to_owned(), reason.to_owned());
            let whole = match state.windows.get_mut(&key) {
                Some(w) => {
                    if w.count == 0 {
                        first.clone_into(&mut w.first);
                    }
                    w.count = w.count.saturating_add(n);
                    last.clone_into(&mut w.last);
                    false
                }
                None => {
                    state.windows.insert(
                        key,
                        Window {
                            ends: now + self.inner.every,
                            started: now,
                            count: 0,
                            first: String::new(),
                            last: String::new(),
                        },
                    );
                    true
                }
            };
            let start = !state.flusher && self.inner.runtime.is_some();
            if start {
                state.flusher = true;
            }
            (whole, due, start)
        };
        self.inner.write(&due);
        if start && let Some(rt) = &self.inner.runtime {
            rt.spawn(flusher(Arc::downgrade(&self.inner), self.inner.clock.clone()));
        }
        whole
    }

    /// Writes the summaries of the windows that ended by the clock's time now.
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        self.inner.flush();
    }
}

impl Inner {
    /// Takes the summaries of the windows ended at `now`: a window with events starts
    /// again, an empty one ends its key's flood.
    fn take_due(&self, state: &mut State, now: DateTime<Utc>) -> Vec<Summary> {
        let mut due = Vec::new();
        state.windows.retain(|(queue, reason), w| {
            if w.ends > now {
                return true;
            }
            if w.count == 0 {
                return false;
            }
            due.push(Summary {
                queue: queue.clone(),
                reason: reason.clone(),
                count: w.count,
                first: std::mem::take(&mut w.first),
                last: std::mem::take(&mut w.last),
                seconds: seconds(w.started, now),
            });
            w.count = 0;
            w.started = now;
            w.ends = now + self.every;
            true
        });
        due
    }

    fn flush(&self) {
        let now = self.clock.now();
        let due = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            self.take_due(&mut state, now)
        };
        self.write(&due);
    }

    /// The earliest end of a window, or `None` (and the flusher marked stopped) when no
    /// key is left.
    fn next_end(&self) -> Option<DateTime<Utc>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let next = state.windows.values().map(|w| w.ends).min();
        if next.is_none() {
            state.flusher = false;
        }
        next
    }

    fn write(&self, due: &[Summary]) {
        for s in due {
            let (queue, reason) = (Escaped(&s.queue), Escaped(&s.reason));
            let (first, last) = (Escaped(&s.first), Escaped(&s.last));
            let (count, seconds, what) = (s.count, s.seconds, self.what);
            match self.level {
                Level::Error => tracing::error!(
                    %queue, %reason, count, first_message_id = %first, last_message_id = %last, seconds,
                    "{what}: {count} more of this queue and reason in the last {seconds} s (only the first was \
                     logged in full)"
                ),
                Level::Warn => tracing::warn!(
                    %queue, %reason, count, first_message_id = %first, last_message_id = %last, seconds,
                    "{what}: {count} more of this queue and reason in the last {seconds} s (only the first was \
                     logged in full)"
                ),
            }
        }
    }
}

impl Drop for Inner {
    /// Writes what is pending: no count is lost when the component stops.
    fn drop(&mut self) {
        let now = self.clock.now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let due: Vec<Summary> = state
            .windows
            .drain()
            .filter(|(_, w)| w.count > 0)
            .map(|((queue, reason), w)| Summary {
                queue,
                reason,
                count: w.count,
                first: w.first,
                last: w.last,
                seconds: seconds(w.started, now),
            })
            .collect();
        drop(state);
        self.write(&due);
    }
}

/// Writes each window's summary when it ends, by the limiter's clock, until no window is
/// left or the limiter is gone.
async fn flusher(inner: Weak<Inner>, clock: Arc<dyn Clock>) {
    loop {
        let Some(next) = inner.upgrade().and_then(|i| i.next_end()) else {
            return;
        };
        clock.sleep_until(next).await;
        match inner.upgrade() {
            Some(i) => i.flush(),
            None => return,
        }
    }
}

/// `to - from` in seconds, rounded to a tenth.
fn seconds(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    let ms = (to - from).num_milliseconds().max(0);
    // A window is at most a few days: the f64 is exact.
    #[allow(clippy::cast_precision_loss)]
    let s = (ms / 100) as f64 / 10.0;
    s
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::VirtualClock;

    fn limiter(clock: &VirtualClock) -> LogLimiter {
        LogLimiter::new(
            Arc::new(clock.clone()),
            Duration::from_secs(10),
            Level::Warn,
            "test events",
        )
    }

    #[test]
    fn the_first_of_a_quiet_key_is_whole_the_rest_counted() {
        let clock = VirtualClock::starting_now();
        let l = limiter(&clock);
        assert!(l.admit("q", "r", 1, "a", "a"));
        assert!(!l.admit("q", "r", 1, "b", "b"));
        assert!(!l.admit("q", "r", 2, "c", "d"));
        // Another key is logged whole on its own.
        assert!(l.admit("q", "other", 1, "x", "x"));
        assert!(l.admit("q2", "r", 1, "y", "y"));
        {
            let state = l.inner.state.lock().unwrap_or_else(PoisonError::into_inner);
            let w = &state.windows[&("q".to_owned(), "r".to_owned())];
            assert_eq!((w.count, w.first.as_str(), w.last.as_str()), (3, "b", "d"));
        }
        // The window ends: its summary is taken and it starts again.
        clock.advance(Duration::from_secs(10));
        let due = {
            let mut state = l.inner.state.lock().unwrap_or_else(PoisonError::into_inner);
            l.inner.take_due(&mut state, clock.now())
        };
        assert_eq!(due.len(), 1);
        assert_eq!(
            (due[0].count, due[0].first.as_str(), due[0].last.as_str()),
            (3, "b", "d")
        );
        // Still in a flood: counted, not whole.
        assert!(!l.admit("q", "r", 1, "e", "e"));
        // A whole window without events ends the flood.
        clock.advance(Duration::from_secs(10));
        l.flush();
        clock.advance(Duration::from_secs(10));
        l.flush();
        assert!(l.admit("q", "r", 1, "f", "f"));
    }
}
