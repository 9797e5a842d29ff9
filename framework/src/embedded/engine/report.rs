//! Counting and logging what the broker dead-letters itself: a message whose time to
//! live ran out, one delivered more often than its queue's max delivery count, a stored
//! message a receive or an activation refuses, a session no receiver can accept. Each
//! step notes what it moved ([`State::dead_lettered`]) and the notes are counted in
//! `courier.messages.dead_lettered` (`messaging.system = embedded`, the queue's path) and
//! logged after the transaction commits ([`Engine::report_dead`]); a rolled back one
//! forgets them. The lines go through the broker's log limiter (`loglimit.rs`): the first
//! dead-lettering of a queue and reason in full, then a summary line per window of the
//! broker's clock while they go on. (The endpoint's own dead-letterings, settlements of a
//! delivery, are counted and logged by the endpoint.)

use crate::logtext::Escaped;

use super::{Engine, State};

/// Messages of one queue dead-lettered for one reason in the current transaction.
#[derive(Debug)]
pub(super) struct DeadNote {
    queue: String,
    reason: String,
    count: u64,
    first: String,
    last: String,
    /// The description of the first of them.
    description: String,
}

impl State {
    /// The path of entity `id` (`topic/subscriptions/name` for a subscription), for a
    /// count's label and a log line; `entity <id>` for one the broker does not know.
    pub(super) fn display_of(&self, id: i64) -> String {
        self.entities
            .get(&id)
            .map_or_else(|| format!("entity {id}"), |e| e.display.clone())
    }

    /// Notes `count` messages of `queue` dead-lettered with `reason` (`first`, `last`:
    /// the message ids of the first and the last, `description` the first's).
    pub(super) fn dead_lettered(
        &mut self,
        queue: &str,
        reason: &str,
        count: u64,
        first: &str,
        last: &str,
        description: &str,
    ) {
        if count == 0 {
            return;
        }
        match self.dead.iter_mut().find(|d| d.queue == queue && d.reason == reason) {
            Some(d) => {
                d.count = d.count.saturating_add(count);
                last.clone_into(&mut d.last);
            }
            None => self.dead.push(DeadNote {
                queue: queue.to_owned(),
                reason: reason.to_owned(),
                count,
                first: first.to_owned(),
                last: last.to_owned(),
                description: description.to_owned(),
            }),
        }
    }
}

impl Engine {
    /// Counts and logs the dead-letterings of the transaction that just committed.
    pub(super) fn report_dead(&mut self) {
        for d in std::mem::take(&mut self.state.dead) {
            crate::endpoint::metrics::count_dead_lettered("embedded", &d.queue, &d.reason, d.count);
            if self
                .state
                .dead_log
                .admit(&d.queue, &d.reason, d.count, &d.first, &d.last)
            {
                tracing::warn!(
                    queue = %Escaped(&d.queue),
                    reason = %Escaped(&d.reason),
                    count = d.count,
                    first_message_id = %Escaped(&d.first),
                    last_message_id = %Escaped(&d.last),
                    description = %Escaped(&d.description),
                    "the embedded broker dead-lettered messages"
                );
            }
        }
    }
}
