//! The outbox cleaner: deletes dispatched outbox rows in batches (one statement for many
//! messages instead of one transaction each). A row whose deletion is lost (the process
//! dies first) is sent again by the sweeper with the same id, which receivers' inboxes
//! drop.
//!
//! Counts nothing. The deleting itself is `outbox::flush_dispatched` (also called at
//! shutdown); this worker only says when: when enough rows were dispatched, or every
//! [`OUTBOX_DELETE_EVERY`](crate::endpoint::runtime::outbox::OUTBOX_DELETE_EVERY), and
//! once more when the endpoint stops.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{Tick, Worker};
use crate::endpoint::runtime::Shared;
use crate::endpoint::runtime::outbox::{OUTBOX_DELETE_EVERY, flush_dispatched};

/// Deletes dispatched outbox rows; see the module docs.
pub(in crate::endpoint::runtime) struct OutboxCleaner {
    shared: Arc<Shared>,
}

impl OutboxCleaner {
    pub(in crate::endpoint::runtime) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }
}

impl Worker for OutboxCleaner {
    async fn tick(&mut self) -> Tick {
        flush_dispatched(&self.shared).await;
        Tick::Wait
    }

    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        tokio::select! {
            () = stop.cancelled() => false,
            () = self.shared.dispatched_added.notified() => true,
            () = tokio::time::sleep(OUTBOX_DELETE_EVERY) => true,
        }
    }

    async fn stop(&mut self) {
        flush_dispatched(&self.shared).await;
    }
}
