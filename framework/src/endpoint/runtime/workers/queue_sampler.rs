//! The queue sampler: samples the depth of the endpoint's input queue and of its
//! dead-letter sub-queue, and its outbox and inbox in the store, every `every` (by the
//! endpoint's clock), when the endpoint was built with metrics sampling.
//!
//! Counts nothing in `EndpointStats`; it sets the gauges of `endpoint/metrics.rs`
//! (`names::QUEUE_DEPTH`, `QUEUE_SCHEDULED`, `QUEUE_DEAD_LETTERED`, `OUTBOX_BACKLOG`,
//! `OUTBOX_OLDEST_AGE`, `INBOX_ROWS`). It reads only: counts from the transport and the
//! store's backlog.

use std::sync::Arc;
use std::time::Duration;

use ::metrics::{Gauge, Label, gauge};
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::{Tick, Worker, sleep_until};
use crate::clock::Clock;
use crate::endpoint::metrics::{labels, names, seconds_between};
use crate::entity::EntityPath;
use crate::store::Store;
use crate::transport::Transport;

/// What the sampler reads: the endpoint's input queue on its transport, and its store.
pub(in crate::endpoint::runtime) struct Sampled {
    pub(in crate::endpoint::runtime) transport: Arc<dyn Transport>,
    pub(in crate::endpoint::runtime) store: Option<Arc<dyn Store>>,
    pub(in crate::endpoint::runtime) clock: Arc<dyn Clock>,
    pub(in crate::endpoint::runtime) queue: Arc<str>,
}

/// Samples the queue and the store; see the module docs.
pub(in crate::endpoint::runtime) struct QueueSampler {
    transport: Arc<dyn Transport>,
    store: Option<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    queue: Arc<str>,
    path: EntityPath,
    step: chrono::Duration,
    next: DateTime<Utc>,
    depth: Gauge,
    scheduled: Gauge,
    dead: Gauge,
    backlog: Gauge,
    oldest: Gauge,
    inbox: Gauge,
}

impl QueueSampler {
    /// Registers the gauges (with the recorder installed now) for sampling every `every`.
    pub(in crate::endpoint::runtime) fn new(sampled: Sampled, every: Duration) -> Self {
        let Sampled {
            transport,
            store,
            clock,
            queue,
        } = sampled;
        let l = [
            Label::new(labels::SYSTEM, transport.name()),
            Label::new(labels::DESTINATION, queue.to_string()),
        ];
        let (depth, scheduled, dead): (Gauge, Gauge, Gauge) = (
            gauge!(names::QUEUE_DEPTH, l.to_vec()),
            gauge!(names::QUEUE_SCHEDULED, l.to_vec()),
            gauge!(names::QUEUE_DEAD_LETTERED, l.to_vec()),
        );
        let (backlog, oldest, inbox): (Gauge, Gauge, Gauge) = (
            gauge!(names::OUTBOX_BACKLOG, l.to_vec()),
            gauge!(names::OUTBOX_OLDEST_AGE, l.to_vec()),
            gauge!(names::INBOX_ROWS, l.to_vec()),
        );
        let path = EntityPath::queue(&*queue);
        let step = chrono::Duration::from_std(every).unwrap_or(chrono::Duration::MAX);
        let next = clock.now();
        Self {
            transport,
            store,
            clock,
            queue,
            path,
            step,
            next,
            depth,
            scheduled,
            dead,
            backlog,
            oldest,
            inbox,
        }
    }
}

impl Worker for QueueSampler {
    async fn tick(&mut self) -> Tick {
        let queue = &self.queue;
        match self.transport.counts(&self.path).await {
            Ok(c) => {
                // Gauges are f64: precise up to 2^53 messages.
                #[allow(clippy::cast_precision_loss)]
                {
                    self.depth.set(c.active as f64);
                    self.scheduled.set(c.scheduled as f64);
                    self.dead.set(c.dead_lettered as f64);
                }
            }
            Err(e) => tracing::warn!(error = %e, queue = %queue, "could not sample the queue's depth"),
        }
        if let Some(store) = &self.store {
            match store.backlog(queue).await {
                Ok(Some(b)) => {
                    #[allow(clippy::cast_precision_loss)]
                    {
                        self.backlog.set(b.outbox as f64);
                        self.inbox.set(b.inbox as f64);
                    }
                    self.oldest
                        .set(b.oldest_outbox.map_or(0.0, |at| seconds_between(at, self.clock.now())));
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "could not count the outbox and the inbox"),
            }
        }
        self.next = self
            .clock
            .now()
            .checked_add_signed(self.step)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
        Tick::Wait
    }

    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        sleep_until(&*self.clock, self.next, stop).await
    }
}
