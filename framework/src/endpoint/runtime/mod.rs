//! The running endpoint: receive loops, the handling of each message, the background
//! workers, shutdown.
//!
//! # Where is X
//!
//! - starting and stopping an endpoint, the shutdown report: `running.rs`
//! - receiving from a source, prefetch, handing back at shutdown: `receive_loop.rs`
//! - receiving from a source that requires sessions (session workers, one session's
//!   messages at a time, in order): `session_loop.rs`
//! - a commit group (many messages in one store transaction): `group.rs`
//! - batch handlers (collecting a type's messages, one call and one transaction for
//!   many): `batcher.rs`
//! - the handling of one message (inbox, handlers, outbox, commit, complete):
//!   `handle.rs`
//! - renewing a message's lock while its handlers run: `renew.rs`
//! - retries and dead-lettering of a failed message: `failures.rs` (the policy itself is
//!   `endpoint/recoverability.rs`)
//! - dispatching the outbox's rows: `outbox.rs`; which rows this process has taken:
//!   `ledger.rs`
//! - the background workers (outbox sweeper and cleaner, saga timeout dispatcher, inbox
//!   janitor, queue sampler), one shape each: `workers/`
//!
//! This module holds what they share: the endpoint's configuration (`Config`), its
//! shared state (`Shared`) and counters (`Stats`, `EndpointStats`). It may not reach into
//! a transport or a store beyond their traits (`transport.rs`, `store/`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::endpoint::TypeEntry;
use crate::endpoint::bus::Bus;
use crate::endpoint::context::Extensions;
use crate::endpoint::metrics::EndpointMetrics;
use crate::endpoint::observe::Observer;
use crate::endpoint::recoverability::RetryPolicy;
use crate::endpoint::retry_seal::RetrySeal;
use crate::endpoint::routing::Routes;
use crate::endpoint::sagas::{SagaStats, TimeoutSignal};
use crate::endpoint::timeout_seal::TimeoutSeal;
use crate::entity::EntityPath;
use crate::store::Store;
use crate::transport::Transport;

mod batcher;
mod failures;
mod group;
mod handle;
mod ledger;
mod outbox;
mod receive_loop;
mod renew;
mod running;
mod session_loop;
mod timeout_rows;
mod workers;

pub(crate) use batcher::Collecting;
pub(crate) use running::start;
pub use running::{RunningEndpoint, ShutdownReport};
pub(crate) use timeout_rows::TIMEOUT_ID;

pub(crate) struct Config {
    pub(crate) name: Arc<str>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) routes: Routes,
    pub(crate) by_name: HashMap<String, Arc<TypeEntry>>,
    pub(crate) policy: RetryPolicy,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) concurrency: usize,
    pub(crate) prefetch: usize,
    pub(crate) max_lock_renewal: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) receive_wait: Duration,
    pub(crate) extensions: Arc<Extensions>,
    pub(crate) store: Option<Arc<dyn Store>>,
    pub(crate) inbox_retention: Duration,
    /// The most times a saga timeout is sent (`EndpointBuilder::max_timeout_dispatches`).
    pub(crate) max_timeout_dispatches: u32,
    pub(crate) sources: Vec<EntityPath>,
    /// The endpoint declared its sources with `QueueOptions::requires_session`: they must
    /// require sessions, and are received by accepting sessions (`session_loop.rs`).
    pub(crate) sessions: bool,
    pub(crate) has_sagas: bool,
    pub(crate) saga_stats: Arc<SagaStats>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
    /// Builds the history's events (`EndpointBuilder::history`); `None`: no history.
    pub(crate) history: Option<Arc<crate::endpoint::history::Recorder>>,
    pub(crate) group_size: usize,
    pub(crate) accept_messages_without_id: bool,
    /// Sample the input queue's depth this often (off when `None`).
    pub(crate) metrics_sampling: Option<Duration>,
}

/// Counters of what an endpoint did.
#[derive(Default)]
struct Stats {
    duplicates: AtomicU64,
    purged: AtomicU64,
    timeouts_dispatched: AtomicU64,
    timeouts_dead_lettered: AtomicU64,
    running: AtomicU64,
    /// Handlers that finished after the shutdown began (they were running then).
    finished_while_stopping: AtomicU64,
    interrupted: AtomicU64,
    completed: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    outbox_dead_lettered: AtomicU64,
}

/// What an endpoint is doing and has done, as of the call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndpointStats {
    /// Messages being handled right now.
    pub running: u64,
    /// Messages completed.
    pub completed: u64,
    /// Failed attempts that were retried (immediately or delayed).
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
    /// Messages found in the inbox (processed before) and completed without handling.
    pub duplicates: u64,
    /// Inbox records this endpoint purged after their retention.
    pub inbox_purged: u64,
    /// Arrivals of messages that found no saga instance and did not start one, whatever
    /// happened to them next: completed or dead-lettered by the saga's not-found policy
    /// (the rest), handled by a `#[not_found]` handler
    /// ([`sagas_not_found_handled`](Self::sagas_not_found_handled)), or sent back to be
    /// tried again ([`sagas_not_found_retried`](Self::sagas_not_found_retried)). A message
    /// tried again counts at each arrival.
    pub sagas_not_found: u64,
    /// Of [`sagas_not_found`](Self::sagas_not_found), those sent back to the endpoint's
    /// queue to be tried again later (`SagaOptions::retry_not_found`): each try counts.
    pub sagas_not_found_retried: u64,
    /// Of [`sagas_not_found`](Self::sagas_not_found), those a saga's `#[not_found]`
    /// handler ran on (`SagaHandlers::not_found`), whether it succeeded or not (a failed
    /// one is retried, and counts again).
    pub sagas_not_found_handled: u64,
    /// Start messages that found the marker of their completed instance
    /// (`SagaOptions::remember_completed`), whatever was done with them.
    pub saga_late_starts: u64,
    /// Saga timeouts that fired after they were cancelled or their saga completed, and
    /// were discarded without being handled.
    pub timeouts_discarded: u64,
    /// Saga timeouts sent to the endpoint's queue when due.
    pub timeouts_dispatched: u64,
    /// Saga timeouts whose message was dead-lettered: their rows are marked and never
    /// sent again (see `docs/sagas.md`).
    pub timeouts_dead_lettered: u64,
    /// Saga saves that found the instance changed by another process (retried).
    pub saga_conflicts: u64,
    /// Outbox messages the transport refused for good at dispatch, moved to the store's
    /// outbox dead letters ([`Store::dead_letter_outbox`](crate::Store::dead_letter_outbox)).
    pub outbox_dead_lettered: u64,
}

impl Stats {
    fn snapshot(&self) -> EndpointStats {
        EndpointStats {
            running: self.running.load(Ordering::Relaxed),
            completed: self.completed.load(Ordering::Relaxed),
            retried: self.retried.load(Ordering::Relaxed),
            dead_lettered: self.dead_lettered.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            inbox_purged: self.purged.load(Ordering::Relaxed),
            sagas_not_found: 0,
            sagas_not_found_retried: 0,
            sagas_not_found_handled: 0,
            saga_late_starts: 0,
            timeouts_discarded: 0,
            timeouts_dispatched: self.timeouts_dispatched.load(Ordering::Relaxed),
            timeouts_dead_lettered: self.timeouts_dead_lettered.load(Ordering::Relaxed),
            saga_conflicts: 0,
            outbox_dead_lettered: self.outbox_dead_lettered.load(Ordering::Relaxed),
        }
    }
}

/// Counts a message as running while it lives.
struct Running<'a>(&'a AtomicU64);

impl<'a> Running<'a> {
    fn new(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Self(gauge)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Shared {
    name: Arc<str>,
    by_name: HashMap<String, Arc<TypeEntry>>,
    policy: RetryPolicy,
    clock: Arc<dyn Clock>,
    bus: Bus,
    max_lock_renewal: Duration,
    extensions: Arc<Extensions>,
    store: Option<Arc<dyn Store>>,
    saga_stats: Arc<SagaStats>,
    timeouts: Arc<TimeoutSignal>,
    /// The outbox rows this process took to dispatch; dispatched ones wait there to be
    /// deleted in batches by `outbox_cleaner`.
    outbox: ledger::Ledger,
    dispatched_added: tokio::sync::Notify,
    /// Fired when the shutdown deadline passes: running handlers see it in their context.
    hard_stop: CancellationToken,
    stats: Stats,
    metrics: EndpointMetrics,
    observer: Option<Arc<dyn Observer>>,
    /// Builds the history's events (`None`: no history).
    history: Option<Arc<crate::endpoint::history::Recorder>>,
    /// The most messages in one commit group (1: none).
    group_size: usize,
    /// Set when a graceful shutdown begins: handlers finishing from then on are counted
    /// in the shutdown report.
    stopping: std::sync::atomic::AtomicBool,
    /// Handle messages without a message id even with a store (at least once).
    accept_messages_without_id: bool,
    /// How much of a handling the store's transaction covers (`None`: no store).
    scope: Option<crate::store::UnitOfWorkScope>,
    /// Seals and checks the count of delayed retries, with the endpoint's secret from its
    /// store (`None`: no store, or one that keeps no secret: counts are trusted as found).
    seal: Option<RetrySeal>,
    /// Checks that a saga timeout's message is one its dispatcher sent, with the same
    /// secret (`None`: no store, or one that keeps no secret).
    timeout_seal: Option<Arc<TimeoutSeal>>,
}
