//! The inbox janitor: deletes the endpoint's inbox records older than the retention,
//! every [`INBOX_PURGE_EVERY`] by the endpoint's clock, in batches of
//! [`INBOX_PURGE_BATCH`] (each a short transaction of its own, so handlers never wait long
//! behind a cleanup).
//!
//! Counts: `EndpointStats::inbox_purged` and the metric of purged inbox records. It only
//! deletes inbox records (`Store::purge_inbox`); the outbox is not its business.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Tick, Worker, sleep_until};
use crate::endpoint::runtime::Shared;
use crate::store::Store;

/// How often an endpoint purges its expired inbox records.
const INBOX_PURGE_EVERY: Duration = Duration::from_secs(60);
/// The most inbox records one purge statement deletes: each batch is a short transaction
/// of its own, so handlers never wait long behind a cleanup.
const INBOX_PURGE_BATCH: i64 = 1000;

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

impl Worker for InboxJanitor {
    async fn tick(&mut self) -> Tick {
        let shared = &self.shared;
        let now = shared.clock.now();
        let before = now
            .checked_sub_signed(self.retention)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let mut purged = 0u64;
        loop {
            if self.stop.is_cancelled() {
                return Tick::Stop;
            }
            match self.store.purge_inbox(&shared.name, before, INBOX_PURGE_BATCH).await {
                Ok(n) => {
                    purged += n;
                    shared.stats.purged.fetch_add(n, Ordering::Relaxed);
                    shared.metrics.inbox_purged(n);
                    if n < INBOX_PURGE_BATCH.unsigned_abs() {
                        break;
                    }
                    // Let the handlers' transactions in between batches.
                    tokio::task::yield_now().await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not purge the inbox; trying again later");
                    break;
                }
            }
        }
        if purged > 0 {
            tracing::debug!(purged, before = %before, "purged expired inbox records");
        }
        self.next = now + chrono::Duration::from_std(INBOX_PURGE_EVERY).unwrap_or(chrono::Duration::MAX);
        Tick::Wait
    }

    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        sleep_until(&*self.shared.clock, self.next, stop).await
    }
}
