//! The background workers of a running endpoint, one file each, all of one shape: the
//! [`Worker`] trait. A worker does its work in rounds ([`Worker::tick`]), waits for the
//! next round ([`Worker::wait`]), and may finish something when the endpoint stops
//! ([`Worker::stop`]); [`start`] spawns one on the endpoint's task list.
//!
//! - `outbox_sweeper.rs`: dispatches outbox rows the normal path left behind
//! - `outbox_cleaner.rs`: deletes dispatched outbox rows in batches
//! - `timeout_dispatcher.rs`: sends saga timeouts when they are due
//! - `inbox_janitor.rs`: deletes inbox records past the retention
//! - `queue_sampler.rs`: samples the input queue's depth and the store's backlog
//!
//! Each worker's docs say what it counts (in [`EndpointStats`](super::EndpointStats) and
//! in the metrics of `endpoint/metrics.rs`). A new worker (a transport's cleanup, another
//! sampler) is a file here implementing [`Worker`], started in `running.rs`. A worker
//! owns no message the receive loop handed out and never settles one; it reaches the
//! transport and the store only through the endpoint's `Shared` state (or what it was
//! given at start).

use std::future::Future;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;

pub(super) mod inbox_janitor;
pub(super) mod outbox_cleaner;
pub(super) mod outbox_sweeper;
pub(super) mod queue_sampler;
pub(super) mod timeout_dispatcher;

/// What a round of a worker asks for next.
pub(super) enum Tick {
    /// Another round at once (the last one was full).
    Again,
    /// Wait ([`Worker::wait`]) before the next round.
    Wait,
    /// The endpoint is stopping (seen during the round): stop now.
    Stop,
}

/// A background worker of an endpoint; see the module docs.
pub(super) trait Worker: Send + 'static {
    /// One round of work.
    fn tick(&mut self) -> impl Future<Output = Tick> + Send;

    /// Waits until the next round is due. Returns `false` when `stop` fired first.
    fn wait(&mut self, stop: &CancellationToken) -> impl Future<Output = bool> + Send;

    /// What is left to do when the endpoint stops (nothing, unless the worker says so).
    fn stop(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Spawns `worker`: rounds and waits until `stop`. The task returns 0, as a receive loop
/// returns the messages it handed back (a worker hands none back).
pub(super) fn start<W: Worker>(mut worker: W, stop: CancellationToken) -> JoinHandle<usize> {
    tokio::spawn(async move {
        loop {
            match worker.tick().await {
                Tick::Again => {}
                Tick::Wait => {
                    if !worker.wait(&stop).await {
                        break;
                    }
                }
                Tick::Stop => break,
            }
        }
        worker.stop().await;
        0
    })
}

/// Sleeps until `at` by `clock`. Returns `false` when `stop` fired first.
pub(super) async fn sleep_until(clock: &dyn Clock, at: DateTime<Utc>, stop: &CancellationToken) -> bool {
    tokio::select! {
        () = stop.cancelled() => false,
        () = clock.sleep_until(at) => true,
    }
}
