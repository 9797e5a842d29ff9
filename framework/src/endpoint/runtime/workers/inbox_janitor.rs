//! The inbox janitor: deletes the endpoint's inbox records older than the inbox
//! retention, and with a history its events older than the history's retention, every
//! [`PURGE_EVERY`] by the endpoint's clock, in batches of [`PURGE_BATCH`] (each a short
//! transaction of its own, so handlers never wait long behind a cleanup).
//!
//! Counts: `EndpointStats::inbox_purged` and the metric of purged inbox records. It only
//! deletes inbox records and history events (`Store::purge_inbox`,
//! `Store::purge_history`); the outbox is not its business.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Tick, Worker, sleep_until};
use crate::endpoint::runtime::Shared;
use crate::store::Store;

/// How often an endpoint purges its expired inbox records and history events.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// The most inbox records (or history events) one purge statement deletes: each batch is
/// a short transaction of its own, so handlers never wait long behind a cleanup.
const PURGE_BATCH: i64 = 1000;

/// Purges expired inbox records; see the module docs.
pub(in crate::endpoint::runtime) struct InboxJanitor {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    retention: chrono::Duration,
    /// Seen between batches: a purge stops half-way when the endpoint stops.
    stop: CancellationToken,
    next: DateTime<Utc>,
}

impl InboxJanitor {
    /// A janitor of the endpoint's store (`None` without a store).
    pub(in crate::endpoint::runtime) fn new(
        shared: Arc<Shared>,
        retention: Duration,
        stop: CancellationToken,
    ) -> Option<Self> {
        let store = shared.store.clone()?;
        let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let next = shared.clock.now();
        Some(Self {
            shared,
            store,
            retention,
            stop,
            next,
        })
    }
}

/// What a purge deletes.
#[derive(Clone, Copy)]
enum Purge {
    Inbox,
    History,
}

impl Purge {
    fn name(self) -> &'static str {
        match self {
            Purge::Inbox => "the inbox",
            Purge::History => "the history",
        }
    }
}

impl InboxJanitor {
    /// Purges `what` older than `before`, a batch at a time until a batch deletes fewer
    /// than [`PURGE_BATCH`];
    /// how many it deleted, or `None` when the endpoint stopped meanwhile.
    async fn in_batches(&self, what: Purge, before: DateTime<Utc>) -> Option<u64> {
        let (shared, store) = (&self.shared, &self.store);
        let mut purged = 0u64;
        loop {
            if self.stop.is_cancelled() {
                return None;
            }
            let batch = match what {
                Purge::Inbox => store
                    .purge_inbox(&shared.name, before, PURGE_BATCH)
                    .await
                    .inspect(|&n| {
                        shared.stats.purged.fetch_add(n, Ordering::Relaxed);
                        shared.metrics.inbox_purged(n);
                    }),
                Purge::History => store.purge_history(&shared.name, before, PURGE_BATCH).await,
            };
            match batch {
                Ok(n) => {
                    purged += n;
                    if n < PURGE_BATCH.unsigned_abs() {
                        return Some(purged);
                    }
                    // Let the handlers' transactions in between batches.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not purge {}; trying again later", what.name());
                    return Some(purged);
                }
            }
        }
    }
}

impl Worker for InboxJanitor {
    async fn tick(&mut self) -> Tick {
        let shared = &self.shared;
        let now = shared.clock.now();
        let before = now
            .checked_sub_signed(self.retention)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let Some(purged) = self.in_batches(Purge::Inbox, before).await else {
            return Tick::Stop;
        };
        if purged > 0 {
            tracing::debug!(purged, before = %before, "purged expired inbox records");
        }
        if let Some(recorder) = &shared.history {
            let retention = chrono::Duration::from_std(recorder.retention()).unwrap_or(chrono::Duration::MAX);
            let before = now.checked_sub_signed(retention).unwrap_or(DateTime::<Utc>::MIN_UTC);
            let Some(purged) = self.in_batches(Purge::History, before).await else {
                return Tick::Stop;
            };
            if purged > 0 {
                tracing::debug!(purged, before = %before, "purged history events older than the retention");
            }
        }
        self.next = now + chrono::Duration::from_std(PURGE_EVERY).unwrap_or(chrono::Duration::MAX);
        Tick::Wait
    }

    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        sleep_until(&*self.shared.clock, self.next, stop).await
    }
}
