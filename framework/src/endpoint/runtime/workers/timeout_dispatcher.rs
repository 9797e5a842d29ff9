//! The saga timeout dispatcher: sends the endpoint's saga timeouts to its queue when they
//! are due. It sleeps until the earliest one it knows of (the store's, or one a handler
//! just committed) comes within [`TIMEOUT_LOOKAHEAD`], at most [`TIMEOUT_POLL`].
//!
//! Counts: `EndpointStats::timeouts_dispatched` (timeouts claimed and sent), and
//! `timeouts_dead_lettered` for those it stops sending. It claims timeouts through the
//! store (`Store::claim_due_timeouts`) and sends them as scheduled messages; it never
//! settles a message or runs a saga.
//!
//! A sent timeout that no handling settled is sent again after [`TIMEOUT_RECLAIM_AFTER`]
//! (its message may have been lost), at most `EndpointBuilder::max_timeout_dispatches`
//! times in all: a timeout whose message the broker dead-letters by itself (max delivery
//! count reached) is never settled by a handling, and was sent again every five minutes,
//! forever. At the limit the claim marks its row dead-lettered instead.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Tick, Worker};
use crate::endpoint::runtime::Shared;
use crate::error::Error;
use crate::store::{Store, TakenTimeout, TimeoutClaim, UnitOfWorkScope};

/// How often the timeout dispatcher looks for due timeouts that no signal announced
/// (stored by another process, or reclaimed).
const TIMEOUT_POLL: Duration = Duration::from_secs(1);
/// How far ahead the dispatcher claims timeouts: those due within it are sent as
/// scheduled messages for their due time, so the broker delivers each on time and the
/// dispatcher wakes a few times a second at most, not once per timeout.
const TIMEOUT_LOOKAHEAD: Duration = Duration::from_secs(1);
/// The least time between two claims that took everything due within the lookahead. At
/// a high rate each claim then takes this much of the timeouts (100 at 1,000 a second):
/// a claim is a write transaction, and a short one keeps a single-writer store (SQLite)
/// free for the handlers, where one of half a second's worth (500 rows, 10 to 50 ms
/// holding the write lock) made every handling behind it that much later.
const TIMEOUT_CLAIM_EVERY: Duration = Duration::from_millis(100);
/// A claimed timeout whose message was not handled after this long is sent again (its
/// dispatch may have been lost; a copy is dropped by the inbox).
const TIMEOUT_RECLAIM_AFTER: Duration = Duration::from_secs(300);
/// A claim whose send was not confirmed (`Store::timeouts_sent`) is taken again after
/// this long: the dispatcher that made it died, or lost its connection, before sending.
const TIMEOUT_SEND_LEASE: Duration = Duration::from_secs(30);
/// The most timeouts claimed in one transaction; more are claimed at once in further
/// transactions, between which the store serves others.
const TIMEOUT_BATCH: i64 = 200;

fn chrono_of(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX)
}

/// Sends due saga timeouts; see the module docs.
pub(in crate::endpoint::runtime) struct TimeoutDispatcher {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    lookahead: chrono::Duration,
    next: DateTime<Utc>,
    /// The most times one timeout is sent.
    max_dispatches: u32,
}

impl TimeoutDispatcher {
    /// A dispatcher of the endpoint's store (`None` without a store).
    pub(in crate::endpoint::runtime) fn new(shared: Arc<Shared>, max_dispatches: u32) -> Option<Self> {
        let store = shared.store.clone()?;
        let next = shared.clock.now();
        Some(Self {
            shared,
            store,
            lookahead: chrono_of(TIMEOUT_LOOKAHEAD),
            next,
            max_dispatches,
        })
    }
}

impl Worker for TimeoutDispatcher {
    async fn tick(&mut self) -> Tick {
        let (shared, store, lookahead) = (&self.shared, &self.store, self.lookahead);
        let now = shared.clock.now();
        let claim = TimeoutClaim {
            now,
            marked_at: now - chrono_of(TIMEOUT_RECLAIM_AFTER.saturating_sub(TIMEOUT_SEND_LEASE)),
            due_until: now + lookahead,
            reclaim_before: now - chrono_of(TIMEOUT_RECLAIM_AFTER),
            limit: TIMEOUT_BATCH,
            max_dispatches: self.max_dispatches,
            enqueue: shared.scope == Some(UnitOfWorkScope::All),
            history: shared.history.is_some(),
        };
        match store.claim_due_timeouts(&shared.name, claim).await {
            Ok(due) => {
                shared
                    .stats
                    .timeouts_dispatched
                    .fetch_add(due.claimed as u64, Ordering::Relaxed);
                for id in &due.dead_lettered {
                    shared.stats.timeouts_dead_lettered.fetch_add(1, Ordering::Relaxed);
                    shared.metrics.timeout_dead_lettered();
                    tracing::warn!(
                        timeout = %id,
                        dispatches = self.max_dispatches,
                        reason = crate::recoverability::reasons::TIMEOUT_DISPATCHES_EXHAUSTED,
                        "saga timeout sent {} times and never settled (its message was dead-lettered by the \
                         broker, e.g. at its max delivery count, or lost each time): marked dead-lettered, \
                         it will not be sent again; see the queue's dead-letter queue",
                        self.max_dispatches
                    );
                }
                let taken = due.claimed.saturating_add(due.dead_lettered.len());
                // Sent unless the send below fails (the store enqueued them itself when it
                // hands nothing back).
                let mut sent_ok = true;
                if !due.to_send.is_empty() {
                    let ids: Vec<String> = due.to_send.iter().map(|e| e.message_id.clone()).collect();
                    let sent = match shared.bus.sender(&shared.name, false).await {
                        Ok(sender) => sender.send_batch(due.to_send).await.map_err(Error::from),
                        Err(e) => Err(e),
                    };
                    sent_ok = sent.is_ok();
                    match sent {
                        Ok(()) => {
                            if let Err(e) = store.timeouts_sent(&ids, shared.clock.now()).await {
                                tracing::warn!(
                                    error = %e,
                                    "could not confirm the saga timeouts sent; they may be sent again after {} s \
                                     (the copies are dropped by the inbox)",
                                    TIMEOUT_SEND_LEASE.as_secs()
                                );
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "could not send due saga timeouts; trying again");
                            if let Err(e) = store.unclaim_timeouts(&ids).await {
                                tracing::warn!(error = %e, "could not release the timeouts; they are sent again later");
                            }
                        }
                    }
                }
                if !due.recorded {
                    record_history(shared, store, &due.taken, sent_ok, now).await;
                }
                if i64::try_from(taken).unwrap_or(i64::MAX) >= TIMEOUT_BATCH {
                    return Tick::Again;
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not claim due saga timeouts"),
        }
        let mut next = now + chrono_of(TIMEOUT_POLL);
        // Wake when the next timeout comes within the lookahead, but not sooner than
        // TIMEOUT_CLAIM_EVERY after this claim: at a high rate each claim then takes that
        // much of the timeouts, instead of one per claim.
        match store.next_timeout_due(&shared.name).await {
            Ok(Some(at)) => {
                let before = at.checked_sub_signed(lookahead).unwrap_or(at);
                next = next.min(before.max(now + chrono_of(TIMEOUT_CLAIM_EVERY)));
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "could not read the next saga timeout"),
        }
        self.next = next;
        Tick::Wait
    }

    /// Sleeps until the next claim. A handler's commit signals its timeouts: one that
    /// comes within the lookahead before the next claim brings it forward; others change
    /// nothing, and do not cost a claim (a write transaction) each.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let (shared, lookahead) = (&self.shared, self.lookahead);
        let mut next = self.next;
        loop {
            if let Some(at) = shared.timeouts.take_earliest() {
                next = next.min(at.checked_sub_signed(lookahead).unwrap_or(at));
            }
            if next <= shared.clock.now() {
                return true;
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = shared.clock.sleep_until(next) => return true,
                () = shared.timeouts.wait() => {}
            }
        }
    }
}

/// Tells the endpoint's history (when it keeps one) of each timeout taken, when the
/// store did not in its claim: dispatched (when `sent`: a failed send is released and
/// taken again later, and told then) or dead-lettered after its last dispatch, at the
/// claim's time `at` (the send's start: before the handling of the message it sent).
/// Best effort, as the events of failed attempts: the send is a step of its own, so a
/// failure to write is logged and changes nothing.
async fn record_history(
    shared: &Shared,
    store: &Arc<dyn Store>,
    taken: &[TakenTimeout],
    sent: bool,
    at: DateTime<Utc>,
) {
    let Some(recorder) = &shared.history else {
        return;
    };
    for t in taken.iter().filter(|t| sent || t.dead_lettered) {
        if let Err(e) = store.record_history(&recorder.timeout(t, at)).await {
            tracing::warn!(error = %e, timeout = %t.id, "could not record a saga timeout's dispatch in the history");
        }
    }
}
