//! The running endpoint: receive loops, the worker pool, settlement, shutdown.
//!
//! Why one file of about 1,200 lines for now: the outbox workers already moved to
//! `runtime/outbox.rs`; the receive loop, the handling of one message and the timeout
//! dispatcher and inbox janitor are to move into their own files (a `workers/` folder with
//! one shape) as moves only, with the endpoint bench before and after (issue 19). Until
//! then: the receive loop is `receive_loop`, one message is `process`/`handle`, failures
//! are `on_failure`/`dead_letter`, the background workers are `timeout_dispatcher` and
//! `inbox_janitor`.

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::clock::Clock;
use crate::endpoint::bus::{Bus, Outgoing};
use crate::endpoint::context::{Context, ContextParts, Extensions};
use crate::endpoint::metrics::EndpointMetrics;
use crate::endpoint::observe::{Handled, Observer};
use crate::endpoint::recoverability::{Decision, RetryPolicy, headers, reasons};
use crate::endpoint::routing::Routes;
use crate::endpoint::trace::TraceContext;
use crate::endpoint::{Failure, TypeEntry};
use crate::entity::EntityPath;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Properties, PropertyValue};
use crate::saga::{LockOwner, SagaStats, TimeoutSignal, settle};
use crate::store::{Begin, CommitGroup, Committed, OutboxMessage, Store, TimeoutClaim};
use crate::transport::{Delivery, Receiver, Settlement, Transport};

mod ledger;
mod outbox;
use outbox::{dispatch_stored, flush_dispatched, outbox_cleaner, outbox_sweeper};

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
    pub(crate) sources: Vec<EntityPath>,
    pub(crate) has_sagas: bool,
    pub(crate) saga_stats: Arc<SagaStats>,
    pub(crate) observer: Option<Arc<dyn Observer>>,
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
    /// Messages that found no saga instance and did not start one.
    pub sagas_not_found: u64,
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
    /// The most messages in one commit group (1: none).
    group_size: usize,
    /// Set when a graceful shutdown begins: handlers finishing from then on are counted
    /// in the shutdown report.
    stopping: std::sync::atomic::AtomicBool,
    /// Handle messages without a message id even with a store (at least once).
    accept_messages_without_id: bool,
}

/// What a graceful shutdown did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Messages received ahead but not started, handed back to the broker.
    pub abandoned_prefetched: usize,
    /// Handlers that finished during the shutdown.
    pub finished_in_flight: usize,
    /// Handlers still running at the deadline, stopped; their messages are delivered
    /// again once their locks expire.
    pub interrupted: usize,
    /// Messages completed over the endpoint's life.
    pub completed: u64,
    /// Failed attempts that were retried (immediately or delayed).
    pub retried: u64,
    /// Messages dead-lettered.
    pub dead_lettered: u64,
}

impl std::fmt::Display for ShutdownReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} completed, {} retried, {} dead-lettered; at shutdown {} prefetched handed back, {} finished, {} interrupted",
            self.completed,
            self.retried,
            self.dead_lettered,
            self.abandoned_prefetched,
            self.finished_in_flight,
            self.interrupted
        )
    }
}

/// A started endpoint. Stop it with [`shutdown`](Self::shutdown) or
/// [`run_until`](Self::run_until); dropping it stops it abruptly (running handlers are
/// stopped and their messages delivered again after their locks expire).
pub struct RunningEndpoint {
    name: Arc<str>,
    bus: Bus,
    shared: Arc<Shared>,
    stop: CancellationToken,
    receive_loops: Vec<tokio::task::JoinHandle<usize>>,
    handlers: TaskTracker,
    shutdown_timeout: Duration,
    sources: Vec<EntityPath>,
}

impl std::fmt::Debug for RunningEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEndpoint").field("name", &self.name).finish()
    }
}

pub(crate) async fn start(config: Config) -> Result<RunningEndpoint> {
    // A store that commits each message alone makes the group size 1: the receive loop
    // then starts messages one by one instead of waiting for room for a group.
    let group_size = match &config.store {
        Some(store) if config.group_size > 1 && store.commit_group(&config.name, Vec::new()).is_some() => {
            config.group_size
        }
        _ => 1,
    };
    let bus = Bus::with_clock(config.transport.clone(), config.routes, config.clock.clone());
    let metrics = EndpointMetrics::new(
        config.transport.name(),
        &config.name,
        config.by_name.iter().map(|(wire, entry)| (wire.as_str(), entry.name)),
    );
    let shared = Arc::new(Shared {
        name: config.name.clone(),
        by_name: config.by_name,
        policy: config.policy,
        clock: config.clock,
        bus: bus.clone(),
        max_lock_renewal: config.max_lock_renewal,
        extensions: config.extensions,
        store: config.store,
        saga_stats: config.saga_stats,
        timeouts: Arc::default(),
        outbox: ledger::Ledger::default(),
        dispatched_added: tokio::sync::Notify::new(),
        hard_stop: CancellationToken::new(),
        stats: Stats::default(),
        metrics,
        observer: config.observer,
        group_size,
        stopping: std::sync::atomic::AtomicBool::new(false),
        accept_messages_without_id: config.accept_messages_without_id,
    });
    // Make the sender of the input queue now, so delayed retries never wait for it.
    bus.sender(&config.name, false).await?;
    let stop = CancellationToken::new();
    let handlers = TaskTracker::new();
    let concurrency = Arc::new(Semaphore::new(config.concurrency));
    let mut receive_loops = Vec::new();
    for path in &config.sources {
        let receiver = config.transport.receiver(path).await?;
        receive_loops.push(tokio::spawn(receive_loop(ReceiveLoop {
            receiver,
            shared: shared.clone(),
            concurrency: concurrency.clone(),
            concurrency_limit: config.concurrency,
            handlers: handlers.clone(),
            stop: stop.clone(),
            prefetch: config.prefetch.max(1),
            receive_wait: config.receive_wait,
        })));
    }
    if let Some(every) = config.metrics_sampling {
        let sampled = crate::endpoint::metrics::Sampled {
            transport: config.transport.clone(),
            store: shared.store.clone(),
            clock: shared.clock.clone(),
            queue: config.name.clone(),
        };
        let sampler = crate::endpoint::metrics::sampler(sampled, every, stop.clone());
        receive_loops.push(tokio::spawn(sampler));
    }
    if shared.store.is_some() {
        receive_loops.push(tokio::spawn(outbox_sweeper(shared.clone(), stop.clone())));
        receive_loops.push(tokio::spawn(outbox_cleaner(shared.clone(), stop.clone())));
        receive_loops.push(tokio::spawn(inbox_janitor(
            shared.clone(),
            config.inbox_retention,
            stop.clone(),
        )));
        if config.has_sagas {
            receive_loops.push(tokio::spawn(timeout_dispatcher(shared.clone(), stop.clone())));
        }
    }
    tracing::info!(endpoint = %config.name, sources = config.sources.len(), "endpoint started");
    Ok(RunningEndpoint {
        name: config.name,
        bus,
        shared,
        stop,
        receive_loops,
        handlers,
        shutdown_timeout: config.shutdown_timeout,
        sources: config.sources,
    })
}

impl RunningEndpoint {
    /// The endpoint's name (its input queue).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where the endpoint receives from: its input queue, then a subscription per event
    /// type it handles.
    pub fn sources(&self) -> &[EntityPath] {
        &self.sources
    }

    /// What the endpoint is doing and has done.
    pub fn stats(&self) -> EndpointStats {
        let mut stats = self.shared.stats.snapshot();
        let sagas = &self.shared.saga_stats;
        stats.sagas_not_found = sagas.not_found.load(Ordering::Relaxed);
        stats.timeouts_discarded = sagas.timeouts_discarded.load(Ordering::Relaxed);
        stats.saga_conflicts = sagas.conflicts.load(Ordering::Relaxed);
        stats
    }

    /// A bus on the endpoint's transport, routes and clock, to send from outside handlers.
    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Runs until `signal` completes (for example `tokio::signal::ctrl_c()`), then shuts
    /// down gracefully.
    ///
    /// # Errors
    /// As [`shutdown`](Self::shutdown).
    pub async fn run_until<F: Future>(self, signal: F) -> Result<ShutdownReport> {
        signal.await;
        self.shutdown().await
    }

    /// Stops gracefully: stops receiving, hands back to the broker the messages received
    /// ahead but not started, and lets running handlers finish within the shutdown
    /// timeout. Handlers still running then see their context's cancellation and are
    /// stopped; their messages come back once their locks expire. Nothing is lost.
    ///
    /// # Errors
    /// [`ErrorKind::Closed`] if a task of the endpoint had died.
    pub async fn shutdown(mut self) -> Result<ShutdownReport> {
        // Handlers running now and finishing later count as finished during the
        // shutdown; no handler starts once the receive loops see the stop.
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.stop.cancel();
        let mut report = ShutdownReport::default();
        for h in self.receive_loops.drain(..) {
            report.abandoned_prefetched += h.await.map_err(|e| Error::with_source(ErrorKind::Closed, e))?;
        }
        self.handlers.close();
        if tokio::time::timeout(self.shutdown_timeout, self.handlers.wait())
            .await
            .is_err()
        {
            self.shared.hard_stop.cancel();
            self.handlers.wait().await;
            report.interrupted =
                usize::try_from(self.shared.stats.interrupted.load(Ordering::Relaxed)).unwrap_or(usize::MAX);
            tracing::warn!(
                endpoint = %self.name,
                interrupted = report.interrupted,
                "shutdown deadline passed; running handlers were stopped, their messages will be delivered again"
            );
        }
        // What the last handlers dispatched leaves the outbox now.
        flush_dispatched(&self.shared).await;
        report.finished_in_flight =
            usize::try_from(self.shared.stats.finished_while_stopping.load(Ordering::SeqCst)).unwrap_or(usize::MAX);
        let stats = self.shared.stats.snapshot();
        report.completed = stats.completed;
        report.retried = stats.retried;
        report.dead_lettered = stats.dead_lettered;
        tracing::info!(endpoint = %self.name, ?report, "endpoint stopped");
        Ok(report)
    }
}

impl Drop for RunningEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
        self.shared.hard_stop.cancel();
        for h in &self.receive_loops {
            h.abort();
        }
    }
}

struct ReceiveLoop {
    receiver: Arc<dyn Receiver>,
    shared: Arc<Shared>,
    concurrency: Arc<Semaphore>,
    /// The semaphore's size.
    concurrency_limit: usize,
    handlers: TaskTracker,
    stop: CancellationToken,
    prefetch: usize,
    receive_wait: Duration,
}

/// Receives from one source and starts a handler task per message as concurrency
/// allows. Each source has its own share of `prefetch` slots (messages received but not
/// started), so a receive waiting on an empty source never holds room another source
/// needs. Returns how many prefetched messages it handed back at shutdown.
async fn receive_loop(l: ReceiveLoop) -> usize {
    let path = l.receiver.path().clone();
    let mut buffered: std::collections::VecDeque<Delivery> = std::collections::VecDeque::new();
    let mut backoff = Duration::from_millis(50);
    loop {
        // Start what is buffered, as concurrency allows.
        while let Some(delivery) = buffered.pop_front() {
            // With a group commit, wait for room for a group of what is buffered.
            let want = l.shared.group_size.min(l.concurrency_limit).min(1 + buffered.len());
            let permit = tokio::select! {
                biased;
                () = l.stop.cancelled() => {
                    buffered.push_front(delivery);
                    return hand_back(buffered).await;
                }
                p = l.concurrency.clone().acquire_many_owned(u32::try_from(want).unwrap_or(1)) => match p {
                    Ok(p) => p,
                    Err(_) => {
                        buffered.push_front(delivery);
                        return hand_back(buffered).await;
                    }
                },
            };
            if want == 1 {
                l.handlers.spawn(process(l.shared.clone(), delivery, permit, None));
            } else {
                start_group(&l, delivery, permit, want, &mut buffered);
            }
            // Receive more once half of the share is free: receives stay batched instead
            // of fetching one message each time a handler starts.
            if buffered.len() <= l.prefetch / 2 {
                break;
            }
        }
        let wanted = l.prefetch - buffered.len();
        let received = tokio::select! {
            biased;
            () = l.stop.cancelled() => return hand_back(buffered).await,
            r = l.receiver.receive(wanted, if buffered.is_empty() { l.receive_wait } else { Duration::ZERO }) => r,
        };
        match received {
            Ok(deliveries) => {
                backoff = Duration::from_millis(50);
                buffered.extend(deliveries);
            }
            Err(e) if matches!(e.kind(), ErrorKind::Closed) => {
                tracing::warn!(source = %path, "the transport closed; the endpoint stops receiving");
                return hand_back(buffered).await;
            }
            Err(e) => {
                tracing::warn!(source = %path, error = %e, retry_in = ?backoff, "receive failed");
                tokio::select! {
                    () = l.stop.cancelled() => return hand_back(buffered).await,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

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

/// Sends the endpoint's saga timeouts to its queue when they are due: sleeps until the
/// earliest one it knows of (the store's, or one a handler just committed) comes within
/// [`TIMEOUT_LOOKAHEAD`], at most [`TIMEOUT_POLL`]. Returns 0 (it hands nothing back at
/// shutdown).
async fn timeout_dispatcher(shared: Arc<Shared>, stop: CancellationToken) -> usize {
    let Some(store) = shared.store.clone() else { return 0 };
    let chrono_of = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
    let lookahead = chrono_of(TIMEOUT_LOOKAHEAD);
    loop {
        let now = shared.clock.now();
        let claim = TimeoutClaim {
            now,
            marked_at: now - chrono_of(TIMEOUT_RECLAIM_AFTER.saturating_sub(TIMEOUT_SEND_LEASE)),
            due_until: now + lookahead,
            reclaim_before: now - chrono_of(TIMEOUT_RECLAIM_AFTER),
            limit: TIMEOUT_BATCH,
        };
        match store.claim_due_timeouts(&shared.name, claim).await {
            Ok(due) => {
                shared
                    .stats
                    .timeouts_dispatched
                    .fetch_add(due.claimed as u64, Ordering::Relaxed);
                if !due.to_send.is_empty() {
                    let ids: Vec<String> = due.to_send.iter().map(|e| e.message_id.clone()).collect();
                    let sent = match shared.bus.sender(&shared.name, false).await {
                        Ok(sender) => sender.send_batch(due.to_send).await.map_err(Error::from),
                        Err(e) => Err(e),
                    };
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
                if i64::try_from(due.claimed).unwrap_or(i64::MAX) >= TIMEOUT_BATCH {
                    continue;
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
        // Sleep until then. A handler's commit signals its timeouts: one that comes within
        // the lookahead before `next` brings the wake forward; others change nothing, and
        // do not cost a claim (a write transaction) each.
        loop {
            if let Some(at) = shared.timeouts.take_earliest() {
                next = next.min(at.checked_sub_signed(lookahead).unwrap_or(at));
            }
            if next <= shared.clock.now() {
                break;
            }
            tokio::select! {
                () = stop.cancelled() => return 0,
                () = shared.clock.sleep_until(next) => break,
                () = shared.timeouts.wait() => {}
            }
        }
    }
}

/// How often an endpoint purges its expired inbox records.
const INBOX_PURGE_EVERY: Duration = Duration::from_secs(60);
/// The most inbox records one purge statement deletes: each batch is a short transaction
/// of its own, so handlers never wait long behind a cleanup.
const INBOX_PURGE_BATCH: i64 = 1000;

/// Deletes this endpoint's inbox records older than the retention, every minute by the
/// endpoint's clock, in batches. Returns 0 (it hands nothing back at shutdown).
async fn inbox_janitor(shared: Arc<Shared>, retention: Duration, stop: CancellationToken) -> usize {
    let Some(store) = shared.store.clone() else { return 0 };
    let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
    loop {
        let now = shared.clock.now();
        let before = now
            .checked_sub_signed(retention)
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
        let mut purged = 0u64;
        loop {
            if stop.is_cancelled() {
                return 0;
            }
            match store.purge_inbox(&shared.name, before, INBOX_PURGE_BATCH).await {
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
        let next = now + chrono::Duration::from_std(INBOX_PURGE_EVERY).unwrap_or(chrono::Duration::MAX);
        tokio::select! {
            () = stop.cancelled() => return 0,
            () = shared.clock.sleep_until(next) => {}
        }
    }
}

/// Starts `first` and up to `want - 1` more buffered messages (distinct ids) as one
/// commit group, one of the `want` permits each.
fn start_group(
    l: &ReceiveLoop,
    first: Delivery,
    mut permit: OwnedSemaphorePermit,
    want: usize,
    buffered: &mut std::collections::VecDeque<Delivery>,
) {
    // A message without an id is never grouped: it is refused, or gets an id, alone.
    let alone = first.message().envelope.message_id.is_empty();
    let mut members = vec![first];
    while !alone && members.len() < want {
        let Some(next) = buffered.front() else { break };
        let id = &next.message().envelope.message_id;
        if id.is_empty() || members.iter().any(|d| &d.message().envelope.message_id == id) {
            break;
        }
        members.extend(buffered.pop_front());
    }
    let group = match &l.shared.store {
        Some(store) if members.len() > 1 => {
            let ids = members
                .iter()
                .map(|d| d.message().envelope.message_id.clone())
                .collect();
            store.commit_group(&l.shared.name, ids)
        }
        _ => None,
    };
    // One permit each; those taken for messages that were not there go back.
    let surplus = permit.num_permits().saturating_sub(members.len());
    if surplus > 0 {
        drop(permit.split(surplus));
    }
    let mut permits: Vec<OwnedSemaphorePermit> = (1..members.len()).filter_map(|_| permit.split(1)).collect();
    permits.push(permit);
    let owner = next_owner();
    for (index, (delivery, own)) in members.into_iter().zip(permits).enumerate() {
        let seat = group.clone().map(|group| GroupSeat {
            group,
            index,
            owner,
            used: false,
        });
        l.handlers.spawn(process(l.shared.clone(), delivery, own, seat));
    }
}

/// Why a message without an id is refused by an endpoint with an inbox, and what to do.
fn missing_id_description(endpoint: &str) -> String {
    format!(
        "the message has no message id: endpoint {endpoint} keeps an inbox, which recognises a \
         redelivered message by its id, so it cannot promise to handle this one once; the producer \
         must set a unique message id on every message (on RabbitMQ the message_id property) and \
         keep it when it sends the same message again; or build the endpoint with \
         EndpointBuilder::accept_messages_without_id(true) to handle such messages at least once"
    )
}

/// Abandons prefetched messages that were not started, so another instance gets them at
/// once.
async fn hand_back(buffered: std::collections::VecDeque<Delivery>) -> usize {
    let n = buffered.len();
    let mut abandons = JoinSet::new();
    for delivery in buffered {
        abandons.spawn(async move {
            if let Err(e) = delivery.abandon().await {
                tracing::debug!(error = %e, "abandon of a prefetched message failed; its lock will expire");
            }
        });
    }
    while abandons.join_next().await.is_some() {}
    n
}

fn int_property(properties: &Properties, key: &str) -> u32 {
    match properties.get(key) {
        Some(PropertyValue::Int(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
    }
}

async fn process(shared: Arc<Shared>, mut delivery: Delivery, _permit: OwnedSemaphorePermit, seat: Option<GroupSeat>) {
    let _running = Running::new(&shared.stats.running);
    shared.metrics.of(delivery.message()).consumed();
    if delivery.message().envelope.message_id.is_empty() {
        if shared.store.is_some() && !shared.accept_messages_without_id {
            drop(seat);
            let description = missing_id_description(&shared.name);
            dead_letter(
                &shared,
                delivery,
                reasons::MISSING_MESSAGE_ID,
                description,
                Properties::new(),
            )
            .await;
            return;
        }
        // At least once: a fresh id at each delivery (see accept_messages_without_id).
        delivery.message_mut().envelope.message_id = uuid::Uuid::now_v7().to_string();
    }
    let message = delivery.message();
    let delayed = int_property(&message.envelope.properties, headers::DELAYED_RETRIES);
    let delivery_count = message.broker.delivery_count;
    let attempt = shared.policy.attempt_number(delayed, delivery_count);
    let trace = TraceContext::from_properties(&message.envelope.properties)
        .map_or_else(TraceContext::new_root, |parent| parent.child());
    let span = tracing::info_span!(
        "message",
        endpoint = %shared.name,
        message_id = %message.envelope.message_id,
        message_type = message.envelope.message_type.as_deref().unwrap_or(""),
        queue = %shared.name,
        delivery_count,
        attempt,
        trace_id = %trace.trace_id(),
        span_id = %trace.span_id(),
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    let trace = crate::endpoint::otel::consumer(&span, shared.bus.transport().name(), &shared.name, message, trace);
    let hard_stop = shared.hard_stop.clone();
    tokio::select! {
        biased;
        () = handle(&shared, delivery, delayed, attempt, trace, seat).instrument(span) => {
            if shared.stopping.load(Ordering::SeqCst) {
                shared.stats.finished_while_stopping.fetch_add(1, Ordering::SeqCst);
            }
        }
        () = hard_stop.cancelled() => {
            // The shutdown deadline passed: the handler is dropped mid-way and its message
            // comes back when its lock expires.
            shared.stats.interrupted.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn handle(
    shared: &Shared,
    mut delivery: Delivery,
    delayed: u32,
    attempt: u32,
    trace: TraceContext,
    seat: Option<GroupSeat>,
) {
    if let Some(until) = delivery.locked_until()
        && until <= shared.clock.now()
    {
        tracing::warn!("lock lost before the handler started; the message will be delivered again");
        return;
    }
    let message_type = delivery.message().envelope.message_type.clone();
    let Some(entry) = message_type.as_deref().and_then(|t| shared.by_name.get(t)).cloned() else {
        let description = match &message_type {
            None => format!(
                "the message has no type; endpoint {} cannot pick a handler",
                shared.name
            ),
            Some(t) => {
                let mut known: Vec<&str> = shared.by_name.keys().map(String::as_str).collect();
                known.sort_unstable();
                format!(
                    "endpoint {} has no handler for message type {t:?} (it handles {known:?})",
                    shared.name
                )
            }
        };
        dead_letter(
            shared,
            delivery,
            reasons::UNKNOWN_MESSAGE_TYPE,
            description,
            Properties::new(),
        )
        .await;
        return;
    };
    let delivery_count = delivery.message().broker.delivery_count;
    let failure = if delivery_count > shared.policy.attempts_per_round() {
        // Its commit group does not wait for it.
        drop(seat);
        Failure::Unfinished {
            deliveries: delivery_count,
        }
    } else {
        let cancel = shared.hard_stop.child_token();
        let mut ctx = Context::new(ContextParts {
            endpoint: shared.name.clone(),
            message: delivery.message().clone(),
            attempt,
            delayed_retries: delayed,
            bus: shared.bus.clone(),
            clock: shared.clock.clone(),
            cancel: cancel.clone(),
            trace,
            extensions: shared.extensions.clone(),
            observing: shared.observer.is_some(),
            lock_owner: LockOwner {
                id: seat.as_ref().map_or_else(next_owner, |s| s.owner),
                bounded: shared.group_size > 1,
            },
        });
        let handlers = entry.handlers.clone();
        let lock = delivery.lock_token();
        let work = async {
            // The inbox: record the id in a new transaction (or the group's), or learn it
            // was processed.
            if let Some(store) = &shared.store {
                let now = shared.clock.now();
                // A duplicate's begin reads the outbox rows its handling left.
                let read = shared.outbox.read();
                let begun = match seat {
                    Some(seat) => seat.begin(now).await,
                    None => store.begin(&shared.name, ctx.message_id(), lock, now).await,
                };
                match begun {
                    Err(e) => return Err(Failure::Store(e)),
                    Ok(Begin::Duplicate(left)) => {
                        // Rows this process took already (being sent, or sent and waiting
                        // to be deleted): not again.
                        let left = shared.outbox.take_read(read, left, |m| m.id);
                        return Ok(Done::Duplicate(left));
                    }
                    Ok(Begin::Fresh(work)) => ctx.set_unit_of_work(work),
                }
            }
            for h in handlers.iter() {
                match CatchUnwind(h.call(&mut ctx)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(f)) => return Err(f.with_refusals(&ctx)),
                    Err(payload) => {
                        return Err(Failure::Panic {
                            handler: h.name(),
                            text: panic_text(payload.as_ref()),
                        });
                    }
                }
            }
            let outgoing = ctx.take_outgoing();
            match ctx.take_unit_of_work() {
                // The outbox: what the handlers sent commits with their writes.
                Some(mut work) => {
                    let rows: Vec<_> = outgoing
                        .into_iter()
                        .map(|o| (o.destination, o.is_topic, o.envelope))
                        .collect();
                    let observed = shared.observer.as_ref().map(|_| rows.clone());
                    let destinations: Vec<String> = rows.iter().map(|(d, _, _)| d.clone()).collect();
                    let stored = work
                        .store_outgoing(rows, shared.clock.now())
                        .await
                        .map_err(Failure::Store)?;
                    let committed = work.commit().await;
                    ctx.release_held();
                    // A store that sends at its commit (the embedded broker's own file)
                    // fails the commit with the transport's refusal of a message.
                    let committed = committed.map_err(|e| {
                        if crate::endpoint::bus::refused_for_good(&e) {
                            Failure::Dispatch(e)
                        } else {
                            Failure::Store(e)
                        }
                    })?;
                    if let Some(due) = ctx.take_timeout_due() {
                        shared.timeouts.stored(due);
                    }
                    shared.metrics.sagas(&ctx.take_saga_tally());
                    if matches!(committed, Committed::Settled) {
                        shared.metrics.sent_at_commit(&destinations);
                    }
                    if let (Some(observer), Some(outgoing)) = (&shared.observer, observed) {
                        observer.handled(Handled {
                            message: ctx.received().envelope.clone(),
                            outgoing,
                            sagas: ctx.take_observed(),
                        });
                    }
                    match committed {
                        Committed::Pending => Ok(Done::Committed(stored)),
                        Committed::Stored(stored) => Ok(Done::Committed(stored)),
                        Committed::Settled => Ok(Done::Settled),
                    }
                }
                None => Ok(Done::Handled(outgoing)),
            }
        };
        let started = std::time::Instant::now();
        let outcome = run_renewing(&mut delivery, &*shared.clock, shared.max_lock_renewal, &cancel, work).await;
        let metrics = shared.metrics.of(delivery.message());
        metrics.processed(started.elapsed(), outcome.as_ref().err());
        let dispatched = match outcome {
            Ok(Done::Settled) => {
                shared.stats.completed.fetch_add(1, Ordering::Relaxed);
                metrics.handled(delivery.message().broker.enqueued_time, shared.clock.now());
                tracing::debug!("message handled, its messages sent and itself completed in one transaction");
                return;
            }
            Err(Failure::Store(e)) if e.is_lock_lost() => {
                tracing::warn!(
                    error = %e,
                    "lock lost before the transaction committed; it rolled back and the message will be delivered again"
                );
                return;
            }
            Ok(Done::Handled(outgoing)) => shared.bus.dispatch(outgoing).await.map_err(Failure::Dispatch),
            Ok(Done::Committed(stored)) => {
                let count = stored.len();
                let stored = shared.outbox.take_stored(stored, |m| m.id);
                dispatch_stored(shared, stored)
                    .await
                    .map_err(|error| Failure::Undispatched { count, error })
            }
            Ok(Done::Duplicate(left)) => {
                tracing::info!(
                    undispatched = left.len(),
                    "message already processed (found in the inbox); completing it without handling"
                );
                shared.stats.duplicates.fetch_add(1, Ordering::Relaxed);
                metrics.deduplicated();
                let count = left.len();
                dispatch_stored(shared, left)
                    .await
                    .map_err(|error| Failure::Undispatched { count, error })
            }
            Err(f) => Err(f),
        };
        match dispatched {
            Ok(()) => {
                complete(shared, delivery).await;
                return;
            }
            Err(f) => f,
        }
    };
    on_failure(shared, delivery, failure, delayed, attempt).await;
}

/// A message's place in a commit group: it begins through the group, or leaves it when
/// dropped unused (its handling ended before the store), so the group does not wait.
struct GroupSeat {
    group: Arc<dyn CommitGroup>,
    index: usize,
    /// The group's owner id for saga instance locks.
    owner: u64,
    used: bool,
}

/// A fresh owner id for saga instance locks: one per handling, or per commit group.
fn next_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl GroupSeat {
    async fn begin(mut self, now: chrono::DateTime<chrono::Utc>) -> Result<Begin> {
        let begun = self.group.clone().begin(self.index, now).await;
        // Only now: a begin stopped half-way (a hard stop) still leaves the group.
        self.used = true;
        begun
    }
}

impl Drop for GroupSeat {
    fn drop(&mut self) {
        if !self.used {
            self.group.leave(self.index);
        }
    }
}

/// How the handling of one message ended, before dispatch and completion.
enum Done {
    /// No store: the messages the handlers sent.
    Handled(Vec<Outgoing>),
    /// The store committed; the stored messages are to be dispatched.
    Committed(Vec<OutboxMessage>),
    /// Processed before; what its handling stored and did not dispatch.
    Duplicate(Vec<OutboxMessage>),
    /// The store's transaction also sent the messages and completed the received one.
    Settled,
}

async fn complete(shared: &Shared, delivery: Delivery) {
    let (metrics, enqueued) = (
        shared.metrics.of(delivery.message()),
        delivery.message().broker.enqueued_time,
    );
    match delivery.complete().await {
        Ok(()) => {
            shared.stats.completed.fetch_add(1, Ordering::Relaxed);
            metrics.handled(enqueued, shared.clock.now());
            tracing::debug!("message completed");
        }
        Err(e) if e.is_lock_lost() => {
            tracing::warn!(error = %e, "lock lost before completion; the message will be delivered again");
        }
        Err(e) => tracing::warn!(error = %e, "completion failed; the message will be delivered again"),
    }
}

fn failure_properties(shared: &Shared, failure: &Failure, attempt: u32) -> Properties {
    let chain = failure.chain();
    let mut p = Properties::new();
    p.insert(
        headers::FAILURE_ERROR.to_owned(),
        PropertyValue::String(chain.first().cloned().unwrap_or_default()),
    );
    p.insert(
        headers::FAILURE_CHAIN.to_owned(),
        PropertyValue::String(chain.join("\n")),
    );
    if let Some(h) = failure.handler() {
        p.insert(headers::FAILURE_HANDLER.to_owned(), PropertyValue::String(h.to_owned()));
    }
    p.insert(
        headers::FAILURE_ENDPOINT.to_owned(),
        PropertyValue::String(shared.name.to_string()),
    );
    p.insert(
        headers::FAILURE_ATTEMPTS.to_owned(),
        PropertyValue::Int(i64::from(attempt)),
    );
    p.insert(
        headers::FAILURE_TIME.to_owned(),
        PropertyValue::String(shared.clock.now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
    );
    p.insert(
        headers::FAILURE_PERMANENT.to_owned(),
        PropertyValue::Bool(failure.permanent_reason().is_some()),
    );
    p
}

async fn on_failure(shared: &Shared, delivery: Delivery, failure: Failure, delayed: u32, attempt: u32) {
    let properties = failure_properties(shared, &failure, attempt);
    let error_text = failure.chain().join(": ");
    let metrics = shared.metrics.of(delivery.message());
    metrics.failed(&failure);
    if let Some(reason) = failure.permanent_reason() {
        dead_letter(shared, delivery, reason, error_text, properties).await;
        return;
    }
    let delivery_count = delivery.message().broker.delivery_count;
    match shared.policy.decide(delayed, delivery_count) {
        Decision::Immediate => {
            shared.stats.retried.fetch_add(1, Ordering::Relaxed);
            metrics.retried(false);
            tracing::warn!(error = %error_text, handler = failure.handler(), "handler failed; immediate retry");
            if let Err(e) = delivery.abandon_with(properties).await {
                tracing::warn!(error = %e, "abandon failed; the lock will expire and the message come back");
            }
        }
        Decision::Delayed { n, delay } => {
            let mut copy = delivery.message().envelope.clone();
            copy.properties.extend(properties);
            copy.properties
                .insert(headers::DELAYED_RETRIES.to_owned(), PropertyValue::Int(i64::from(n)));
            let at = shared.clock.now() + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
            copy.scheduled_enqueue_time = Some(at);
            let scheduled = match shared.bus.sender(&shared.name, false).await {
                Ok(sender) => sender.send(copy).await.map_err(Error::from),
                Err(e) => Err(e),
            };
            match scheduled {
                Ok(()) => {
                    if let Some(store) = &shared.store {
                        settle::retry_scheduled(&**store, &shared.name, &delivery.message().envelope, at).await;
                    }
                    shared.stats.retried.fetch_add(1, Ordering::Relaxed);
                    metrics.retried(true);
                    tracing::warn!(
                        error = %error_text,
                        handler = failure.handler(),
                        delayed_retry = n,
                        due = %at,
                        "handler failed; delayed retry scheduled"
                    );
                    if let Err(e) = delivery.complete().await {
                        tracing::warn!(
                            error = %e,
                            "completion after scheduling a delayed retry failed; the message may be handled twice"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not schedule the delayed retry; handing the message back");
                    if let Err(e) = delivery.abandon().await {
                        tracing::warn!(error = %e, "abandon failed; the lock will expire and the message come back");
                    }
                }
            }
        }
        Decision::Exhausted => {
            dead_letter(shared, delivery, failure.exhausted_reason(), error_text, properties).await;
        }
    }
}

async fn dead_letter(
    shared: &Shared,
    delivery: Delivery,
    reason: &'static str,
    description: String,
    properties: Properties,
) {
    let metrics = shared.metrics.of(delivery.message());
    tracing::error!(reason, description = %description, "message dead-lettered");
    if let Some(store) = &shared.store {
        let envelope = &delivery.message().envelope;
        if settle::dead_lettered(&**store, &shared.name, envelope, reason, shared.clock.now()).await {
            shared.stats.timeouts_dead_lettered.fetch_add(1, Ordering::Relaxed);
            shared.metrics.timeout_dead_lettered();
        }
    }
    let settlement = Settlement::DeadLetter {
        reason: reason.to_owned(),
        description,
        properties,
    };
    match delivery.settle(settlement).await {
        Ok(()) => {
            shared.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
            metrics.dead_lettered(reason);
        }
        Err(e) => tracing::warn!(error = %e, "dead-lettering failed; the message will be delivered again"),
    }
}

/// Runs `work` while renewing the delivery's lock, for at most `max_total`. A lost lock
/// fires `cancel`: the handler's outcome can no longer settle the message.
async fn run_renewing<F: Future>(
    delivery: &mut Delivery,
    clock: &dyn Clock,
    max_total: Duration,
    cancel: &CancellationToken,
    work: F,
) -> F::Output {
    let stop_at = clock.now() + chrono::Duration::from_std(max_total).unwrap_or(chrono::Duration::MAX);
    let mut work = std::pin::pin!(work);
    let mut renewing = true;
    loop {
        let next = match delivery.locked_until() {
            Some(until) if renewing => {
                let now = clock.now();
                let half = ((until - now) / 2).max(chrono::Duration::milliseconds(1));
                Some(now + half).filter(|at| *at < stop_at)
            }
            _ => None,
        };
        let Some(at) = next else {
            return work.await;
        };
        tokio::select! {
            out = &mut work => return out,
            () = clock.sleep_until(at) => {
                // The work goes on while the renewal waits: with a store in the broker's
                // own database the broker serves the renewal only after the work's
                // transaction ends.
                let renewed = tokio::select! {
                    out = &mut work => return out,
                    r = delivery.renew_lock() => r,
                };
                if let Err(e) = renewed {
                    renewing = false;
                    if e.is_lock_lost() {
                        tracing::warn!(error = %e, "lock lost while the handler ran; the message will be delivered again");
                        cancel.cancel();
                    } else {
                        tracing::warn!(error = %e, "lock renewal failed");
                    }
                }
            }
        }
    }
}

/// A future that turns a panic while polling into an error.
struct CatchUnwind<F>(F);

impl<F: Future + Unpin> Future for CatchUnwind<F> {
    type Output = std::result::Result<F::Output, Box<dyn Any + Send>>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        let inner = &mut self.get_mut().0;
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::new(&mut *inner).poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(out)) => Poll::Ready(Ok(out)),
            Err(payload) => Poll::Ready(Err(payload)),
        }
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}
