//! A started endpoint and its life: `start` builds the shared state and spawns a receive
//! loop per source and the background workers; `RunningEndpoint::shutdown` stops them
//! gracefully (prefetched messages handed back, running handlers given the shutdown
//! timeout) and reports what happened (`ShutdownReport`).
//!
//! Holds no per-message work: that is `handle.rs`; nor a worker's loop: `workers/`.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::endpoint::bus::Bus;
use crate::endpoint::metrics::EndpointMetrics;
use crate::endpoint::retry_seal::RetrySeal;
use crate::endpoint::timeout_seal::TimeoutSeal;
use crate::entity::EntityPath;
use crate::error::{Error, ErrorKind, Result};
use crate::store::UnitOfWorkScope;

use super::outbox::flush_dispatched;
use super::receive_loop::{ReceiveLoop, hand_back, receive_loop};
use super::session_loop::{self, SessionLoop};
use super::workers::inbox_janitor::InboxJanitor;
use super::workers::outbox_cleaner::OutboxCleaner;
use super::workers::outbox_sweeper::OutboxSweeper;
use super::workers::queue_sampler::{QueueSampler, Sampled};
use super::workers::timeout_dispatcher::TimeoutDispatcher;
use super::{Config, EndpointStats, Shared, Stats, ledger, workers};

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
///
/// It is what [`EndpointBuilder::start`](crate::EndpointBuilder::start) returns: the
/// endpoint receives and handles in tasks of its own from then on. Through it a program
/// sends from outside handlers ([`bus`](Self::bus)), reads the endpoint's counters
/// ([`stats`](Self::stats)) and stops it, gracefully: no message is lost, those received
/// ahead go back to the broker and running handlers may finish.
///
/// # Examples
///
/// ```
/// use courier::prelude::*;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, courier::Message)]
/// struct Ping;
///
/// #[courier::handler]
/// async fn ping(_m: Ping, _ctx: &mut Context) -> Result<(), HandlerError> {
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let broker = Embedded::in_memory().await?;
/// let routes = Routes::new().send::<Ping>("pings");
/// let endpoint = Endpoint::builder("pings").transport(broker).routes(routes).handler(ping).start().await?;
/// endpoint.bus().send(&Ping).await?;
///
/// // A service runs until it is told to stop: endpoint.run_until(tokio::signal::ctrl_c()).
/// let report = endpoint.shutdown().await?;   // what it handled, what it handed back
/// assert_eq!(report.interrupted, 0);         // no handler had to be stopped
/// # Ok(())
/// # }
/// ```
pub struct RunningEndpoint {
    name: Arc<str>,
    bus: Bus,
    shared: Arc<Shared>,
    stop: CancellationToken,
    /// Taken by the first [`stop`](RunningEndpoint::stop).
    receive_loops: std::sync::Mutex<Vec<tokio::task::JoinHandle<usize>>>,
    /// What the first stop reported: a later or concurrent stop answers the same.
    stopped: tokio::sync::OnceCell<ShutdownReport>,
    handlers: TaskTracker,
    shutdown_timeout: Duration,
    sources: Vec<EntityPath>,
}

impl std::fmt::Debug for RunningEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningEndpoint").field("name", &self.name).finish()
    }
}

/// The most members a commit group of an endpoint takes: its `group_commit`, but no more
/// than half its handlers. A group's members run one after another on the group's
/// connection, so a group that holds every handler leaves the server idle while it runs
/// and while it commits; two groups at least overlap (measured: 526 msg/s with one group
/// of 8 handlers, 1,481 with groups of 4; docs/postgres.md, "Group commit"). With fewer
/// than 4 handlers no group forms: two transactions of one message overlap as well.
pub(super) fn group_cap(group_commit: usize, concurrency: usize) -> usize {
    group_commit.min(concurrency / 2).max(1)
}

pub(crate) async fn start(config: Config) -> Result<RunningEndpoint> {
    // A store that commits each message alone makes the group size 1: the receive loop
    // then starts messages one by one instead of waiting for room for a group.
    let group_size = match &config.store {
        Some(store) if config.group_size > 1 && store.commit_group(&config.name, Vec::new()).is_some() => {
            let cap = group_cap(config.group_size, config.concurrency);
            if cap < config.group_size {
                tracing::info!(
                    endpoint = %config.name,
                    group_commit = config.group_size,
                    concurrency = config.concurrency,
                    group = cap,
                    "group commit: a group takes at most {cap} messages, half the handlers, so that two groups \
                     overlap; raise concurrency to at least twice group_commit for groups of {}",
                    config.group_size
                );
            }
            cap
        }
        _ => 1,
    };
    let scope = config
        .store
        .as_ref()
        .map(|store| store.unit_of_work_scope(&*config.transport));
    log_unit_of_work(&config, scope);
    let (seal, timeout_seal) = seals(&config).await?;
    let bus = Bus::with_clock(config.transport.clone(), config.routes, config.clock.clone());
    let metrics = EndpointMetrics::new(
        config.transport.name(),
        &config.name,
        config.by_name.iter().map(|(wire, entry)| (wire.as_str(), entry.name)),
        config.clock.clone(),
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
        history: config.history,
        group_size,
        stopping: std::sync::atomic::AtomicBool::new(false),
        accept_messages_without_id: config.accept_messages_without_id,
        scope,
        seal,
        timeout_seal,
    });
    // Make the sender of the input queue now, so delayed retries never wait for it.
    bus.sender(&config.name, false).await?;
    let stop = CancellationToken::new();
    let handlers = TaskTracker::new();
    let concurrency = Arc::new(Semaphore::new(config.concurrency));
    let mut receive_loops = Vec::new();
    for path in &config.sources {
        let receiver = config.transport.receiver(path).await?;
        let probed = session_loop::probe(&*receiver).await?;
        let requires = probed.is_none();
        let delayed = shared.policy.delayed_retries.len();
        if let Some(refused) = session_loop::refusal(path, config.sessions, requires, config.group_size, delayed) {
            stop.cancel();
            hand_back(probed.unwrap_or_default().into()).await;
            return Err(refused);
        }
        let Some(initial) = probed else {
            receive_loops.push(tokio::spawn(session_loop::session_loop(
                SessionLoop {
                    transport: config.transport.clone(),
                    path: path.clone(),
                    shared: shared.clone(),
                    concurrency: concurrency.clone(),
                    handlers: handlers.clone(),
                    stop: stop.clone(),
                    accept_wait: config.receive_wait,
                },
                config.concurrency,
            )));
            continue;
        };
        receive_loops.push(tokio::spawn(receive_loop(ReceiveLoop {
            initial,
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
        let sampled = Sampled {
            transport: config.transport.clone(),
            store: shared.store.clone(),
            clock: shared.clock.clone(),
            queue: config.name.clone(),
        };
        receive_loops.push(workers::start(QueueSampler::new(sampled, every), stop.clone()));
    }
    if shared.store.is_some() {
        receive_loops.extend(OutboxSweeper::new(shared.clone()).map(|w| workers::start(w, stop.clone())));
        receive_loops.push(workers::start(OutboxCleaner::new(shared.clone()), stop.clone()));
        receive_loops.extend(
            InboxJanitor::new(shared.clone(), config.inbox_retention, stop.clone())
                .map(|w| workers::start(w, stop.clone())),
        );
        if config.has_sagas {
            receive_loops.extend(
                TimeoutDispatcher::new(shared.clone(), config.max_timeout_dispatches)
                    .map(|w| workers::start(w, stop.clone())),
            );
        }
    }
    tracing::info!(endpoint = %config.name, sources = config.sources.len(), "endpoint started");
    Ok(RunningEndpoint {
        name: config.name,
        bus,
        shared,
        stop,
        receive_loops: std::sync::Mutex::new(receive_loops),
        stopped: tokio::sync::OnceCell::new(),
        handlers,
        shutdown_timeout: config.shutdown_timeout,
        sources: config.sources,
    })
}

/// The seal of delayed-retry counts and the check of saga timeouts' seals, with the
/// endpoint's secret read (or made) in its store once, here: `None` without a store or
/// with one that keeps no secret.
async fn seals(config: &Config) -> Result<(Option<RetrySeal>, Option<Arc<TimeoutSeal>>)> {
    let Some(store) = &config.store else {
        return Ok((None, None));
    };
    // The store's error names the table and what the database said (a missing table:
    // Courier's migrations were not applied).
    let secret = store.endpoint_secret(&config.name, config.clock.now()).await?;
    if secret.is_none() {
        tracing::info!(
            endpoint = %config.name,
            store = store.name(),
            "the store keeps no endpoint secret: delayed-retry counts are trusted as found, and saga timeouts \
             as their headers say (only their due time is checked)"
        );
    }
    let retry = secret.as_ref().map(RetrySeal::new).transpose()?;
    let timeout = secret.as_ref().map(TimeoutSeal::new).transpose()?.map(Arc::new);
    Ok((retry, timeout))
}

/// Says at info which steps of a handling commit together, and which are separate.
fn log_unit_of_work(config: &Config, scope: Option<UnitOfWorkScope>) {
    let transport = config.transport.name();
    let Some(store) = &config.store else {
        tracing::info!(
            endpoint = %config.name,
            transport,
            store = "none",
            "unit of work: no store, so no transaction: the handler's sends are sent when it returns, \
             then the received message is completed (at least once; no inbox drops a redelivery)"
        );
        return;
    };
    let store = store.name();
    match scope {
        Some(UnitOfWorkScope::All) => tracing::info!(
            endpoint = %config.name,
            transport,
            store,
            one_transaction = true,
            "unit of work: ONE {store} transaction per message: the completion of the received message, the inbox \
             record, the handler's writes, saga state and timeouts, the messages it sends and publishes, and a \
             delayed retry commit together or not at all (due saga timeouts are enqueued in the transaction \
             that claims them)"
        ),
        Some(UnitOfWorkScope::AllButDelayedRetries) => tracing::info!(
            endpoint = %config.name,
            transport,
            store,
            one_transaction = true,
            "unit of work: ONE {store} transaction per message: the completion of the received message, the inbox \
             record, the handler's writes, saga state and timeouts and the messages it sends and publishes commit \
             together; separate step: a delayed retry sends its scheduled copy, then completes the received \
             message (a crash between them handles it again, and the inbox drops the copy)"
        ),
        _ => tracing::info!(
            endpoint = %config.name,
            transport,
            store,
            one_transaction = false,
            "unit of work: one {store} transaction holds the inbox record, the handler's writes, saga state and \
             timeouts and the outbox; separate steps after its commit, each at least once (the inbox drops the \
             duplicates): dispatching the outbox to {transport} (sends and publishes), completing the received \
             message, sending due saga timeouts, and a delayed retry's scheduled copy then its completion"
        ),
    }
}

impl RunningEndpoint {
    /// The endpoint's name (its input queue).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The messages waiting in batches being collected, and the earliest time one of
    /// those batches is handed over (`courier::testing` waits for the clock there).
    pub(crate) fn batches_waiting(&self) -> (usize, Option<chrono::DateTime<chrono::Utc>>) {
        let mut waiting = 0;
        let mut earliest: Option<chrono::DateTime<chrono::Utc>> = None;
        let mut seen: Vec<*const crate::endpoint::registry::BatchRoute> = Vec::new();
        for entry in self.shared.by_name.values() {
            let Some(route) = &entry.batch else { continue };
            // Aliases index one entry under several names: count it once.
            let at = Arc::as_ptr(route);
            if seen.contains(&at) {
                continue;
            }
            seen.push(at);
            let (n, deadline) = route.collecting.waiting();
            waiting += n;
            if let Some(d) = deadline {
                earliest = Some(earliest.map_or(d, |e| e.min(d)));
            }
        }
        (waiting, earliest)
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
        stats.sagas_not_found_retried = sagas.not_found_retried.load(Ordering::Relaxed);
        stats.sagas_not_found_handled = sagas.not_found_handled.load(Ordering::Relaxed);
        stats.saga_late_starts = sagas.late_starts.load(Ordering::Relaxed);
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
    pub async fn shutdown(self) -> Result<ShutdownReport> {
        self.stop().await
    }

    /// [`shutdown`](Self::shutdown) through a shared reference: for an endpoint held in a
    /// struct (test fixtures, an application's state) that cannot give it up by value.
    /// The endpoint stays a value that can be read (`stats`, `name`) but receives
    /// nothing more; a second or concurrent call waits for the first and answers its
    /// report.
    ///
    /// ```no_run
    /// # use courier::{RunningEndpoint, ShutdownReport};
    /// struct Fixture {
    ///     orders: RunningEndpoint,
    /// }
    ///
    /// impl Fixture {
    ///     async fn stop(&self) -> courier::Result<ShutdownReport> {
    ///         self.orders.stop().await   // no Option<RunningEndpoint> to take()
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    /// As [`shutdown`](Self::shutdown).
    pub async fn stop(&self) -> Result<ShutdownReport> {
        self.stopped.get_or_try_init(|| self.stop_once()).await.cloned()
    }

    async fn stop_once(&self) -> Result<ShutdownReport> {
        // Handlers running now and finishing later count as finished during the
        // shutdown; no handler starts once the receive loops see the stop.
        self.shared.stopping.store(true, Ordering::SeqCst);
        self.stop.cancel();
        let mut report = ShutdownReport::default();
        let loops = match self.receive_loops.lock() {
            Ok(mut loops) => std::mem::take(&mut *loops),
            Err(poisoned) => std::mem::take(&mut *poisoned.into_inner()),
        };
        for h in loops {
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
        let loops = match self.receive_loops.get_mut() {
            Ok(loops) => loops,
            Err(poisoned) => poisoned.into_inner(),
        };
        for h in loops.iter() {
            h.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::group_cap;

    proptest! {
        /// Over every size and concurrency the builder accepts (both at least 1) and
        /// the extremes: a group is at least one message, never more than asked, and
        /// never more than half the handlers unless that is less than one.
        #[test]
        fn a_group_is_at_most_what_was_asked_and_half_the_handlers(
            group in prop_oneof![1..64usize, Just(usize::MAX)],
            concurrency in prop_oneof![1..256usize, Just(usize::MAX)],
        ) {
            let cap = group_cap(group, concurrency);
            prop_assert!(cap >= 1);
            prop_assert!(cap <= group);
            prop_assert!(cap == 1 || cap <= concurrency / 2);
            // As large as those bounds allow: all that was asked, or half the handlers.
            prop_assert!(cap == group || cap == (concurrency / 2).max(1));
        }
    }

    #[test]
    fn eight_handlers_make_groups_of_four_and_three_make_none() {
        assert_eq!(group_cap(10, 8), 4);
        assert_eq!(group_cap(4, 16), 4);
        assert_eq!(group_cap(4, 3), 1);
        assert_eq!(group_cap(1, 100), 1);
    }
}
