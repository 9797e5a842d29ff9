//! The outbox sweeper: dispatches outbox messages the normal path left behind (a process
//! that died between its commit and its dispatch, whose received message was then
//! dead-lettered or expired instead of coming back). They keep their ids, so a copy is
//! recognised by receivers.
//!
//! Counts: what `dispatch_stored` counts (rows moved to the outbox's dead letters). It
//! takes rows through the ledger (`runtime/ledger.rs`) like every other path that sends
//! outbox rows, and may not send a row without taking it there.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Tick, Worker, sleep_until};
use crate::endpoint::runtime::Shared;
use crate::endpoint::runtime::outbox::dispatch_stored;
use crate::store::Store;

/// How often the outbox sweeper looks for messages left behind, and how old they must be
/// (by the endpoint's clock) before it takes them: far older than a dispatch takes.
const OUTBOX_SWEEP_EVERY: Duration = Duration::from_secs(10);
const OUTBOX_LEFT_AFTER: Duration = Duration::from_secs(30);
/// The most rows the sweeper takes at once.
const OUTBOX_SWEEP_BATCH: i64 = 100;

/// Dispatches the outbox rows left behind, every [`OUTBOX_SWEEP_EVERY`].
pub(in crate::endpoint::runtime) struct OutboxSweeper {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    next: DateTime<Utc>,
}

impl OutboxSweeper {
    /// A sweeper of the endpoint's store (`None` without a store).
    pub(in crate::endpoint::runtime) fn new(shared: Arc<Shared>) -> Option<Self> {
        let store = shared.store.clone()?;
        let next = shared.clock.now();
        Some(Self { shared, store, next })
    }
}

impl Worker for OutboxSweeper {
    async fn tick(&mut self) -> Tick {
        let shared = &self.shared;
        let now = shared.clock.now();
        self.next = now + chrono::Duration::from_std(OUTBOX_SWEEP_EVERY).unwrap_or(chrono::Duration::MAX);
        let older_than = now - chrono::Duration::from_std(OUTBOX_LEFT_AFTER).unwrap_or(chrono::Duration::zero());
        let read = shared.outbox.read();
        match self
            .store
            .undispatched(&shared.name, older_than, OUTBOX_SWEEP_BATCH)
            .await
        {
            Ok(left) if !left.is_empty() => {
                let full = i64::try_from(left.len()).unwrap_or(i64::MAX) >= OUTBOX_SWEEP_BATCH;
                // Rows this process took already (a handling or a redelivery sending them,
                // or sent and waiting to be deleted) are not sent again.
                let left = shared.outbox.take_read(read, left, |m| m.id);
                let n = left.len();
                match dispatch_stored(shared, left).await {
                    Ok(()) if n == 0 => {}
                    Ok(()) => {
                        tracing::warn!(dispatched = n, "dispatched outbox messages left behind");
                        if full {
                            return Tick::Again;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "could not dispatch outbox messages left behind"),
                }
            }
            // The ticket goes now, not after the sleep: tombstones are kept while it is out.
            Ok(_) => drop(read),
            Err(e) => {
                drop(read);
                tracing::warn!(error = %e, "could not read the outbox");
            }
        }
        Tick::Wait
    }

    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        sleep_until(&*self.shared.clock, self.next, stop).await
    }
}
