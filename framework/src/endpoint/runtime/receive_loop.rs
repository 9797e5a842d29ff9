//! The receive loop: one per source, receiving in batches up to the endpoint's prefetch
//! and starting a handling task per message as concurrency allows (or a commit group of
//! several, `start_group`, each with its seat from `group.rs`); at shutdown, the messages
//! received ahead but not started are handed back.
//!
//! Holds `ReceiveLoop`, `receive_loop`, `start_group` and `hand_back`. What happens to
//! one message is in `handle.rs`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::ErrorKind;
use crate::transport::{Delivery, Receiver};

use super::Shared;
use super::group::{GroupSeat, next_owner};
use super::handle::process;

pub(super) struct ReceiveLoop {
    /// Messages received before the loop started (by the endpoint's probe of the source,
    /// `session_loop::probe`): the first in its buffer.
    pub(super) initial: Vec<Delivery>,
    pub(super) receiver: Arc<dyn Receiver>,
    pub(super) shared: Arc<Shared>,
    pub(super) concurrency: Arc<Semaphore>,
    /// The semaphore's size.
    pub(super) concurrency_limit: usize,
    pub(super) handlers: TaskTracker,
    pub(super) stop: CancellationToken,
    pub(super) prefetch: usize,
    pub(super) receive_wait: Duration,
}

/// A receive in flight.
type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = crate::error::Result<Vec<Delivery>>> + Send>>;

/// What woke the receive loop.
enum Step {
    Stop,
    Received(crate::error::Result<Vec<Delivery>>),
    Permit(Option<OwnedSemaphorePermit>),
}

/// The receive in flight's answer; never, without one.
async fn answer(pending: &mut Option<Pending>) -> crate::error::Result<Vec<Delivery>> {
    match pending.as_mut() {
        Some(receive) => receive.await,
        None => std::future::pending().await,
    }
}

/// Receives from one source and starts a handler task per message as concurrency
/// allows. Each source has its own share of `prefetch` slots (messages received but not
/// started), so a receive waiting on an empty source never holds room another source
/// needs. The next receive is sent once half of the share is free and runs while the
/// buffered messages start: a handler that finishes meanwhile takes the next buffered
/// message at once instead of waiting for the receive. Returns how many prefetched
/// messages it handed back at shutdown.
pub(super) async fn receive_loop(mut l: ReceiveLoop) -> usize {
    let path = l.receiver.path().clone();
    let mut buffered: std::collections::VecDeque<Delivery> = std::mem::take(&mut l.initial).into();
    // Messages the probe received start only with those of the first receive (at once,
    // without waiting), so that a commit group forms of all of them, not of the first;
    // unless they fill half the prefetch already: then no receive is sent before one of
    // them starts, and waiting for its answer would wait forever.
    let mut first_receive = !buffered.is_empty() && buffered.len() <= l.prefetch / 2;
    let mut backoff = Duration::from_millis(50);
    let mut pending: Option<Pending> = None;
    // The wait before the next receive, after a failed one.
    let mut retry_in: Option<Duration> = None;
    // A receive that did not wait (messages were buffered) found nothing: the next one
    // waits until a buffered message starts, so an empty source is not asked in a loop.
    let mut starved = false;
    loop {
        let free = buffered.len() <= l.prefetch / 2 && (buffered.is_empty() || !starved);
        if pending.is_none() && free {
            let receiver = l.receiver.clone();
            let wanted = l.prefetch - buffered.len();
            let wait = if buffered.is_empty() {
                l.receive_wait
            } else {
                Duration::ZERO
            };
            let delay = retry_in.take();
            pending = Some(Box::pin(async move {
                if let Some(delay) = delay {
                    tokio::time::sleep(delay).await;
                }
                receiver.receive(wanted, wait).await
            }));
        }
        // With a group commit, wait for room for a group of what is buffered.
        let want = l.shared.group_size.min(l.concurrency_limit).min(buffered.len().max(1));
        let step = tokio::select! {
            biased;
            () = l.stop.cancelled() => Step::Stop,
            p = l.concurrency.clone().acquire_many_owned(u32::try_from(want).unwrap_or(1)),
                if !buffered.is_empty() && !first_receive => Step::Permit(p.ok()),
            r = answer(&mut pending) => Step::Received(r),
        };
        match step {
            Step::Stop | Step::Permit(None) => return hand_back(buffered).await,
            Step::Permit(Some(permit)) => {
                let Some(delivery) = buffered.pop_front() else {
                    continue;
                };
                starved = false;
                if want == 1 {
                    l.handlers.spawn(process(l.shared.clone(), delivery, permit, None));
                } else {
                    start_group(&l, delivery, permit, want, &mut buffered);
                }
            }
            Step::Received(received) => {
                pending = None;
                first_receive = false;
                match received {
                    Ok(deliveries) => {
                        backoff = Duration::from_millis(50);
                        starved = deliveries.is_empty();
                        buffered.extend(deliveries);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::Closed) => {
                        tracing::warn!(source = %path, "the transport closed; the endpoint stops receiving");
                        return hand_back(buffered).await;
                    }
                    Err(e) => {
                        tracing::warn!(source = %path, error = %e, retry_in = ?backoff, "receive failed");
                        retry_in = Some(backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
        }
    }
}

/// Abandons prefetched messages that were not started, so another instance gets them at
/// once.
pub(super) async fn hand_back(buffered: std::collections::VecDeque<Delivery>) -> usize {
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

/// Starts `first` and up to `want - 1` more buffered messages (distinct ids) as one
/// commit group, one of the `want` permits each.
pub(super) fn start_group(
    l: &ReceiveLoop,
    first: Delivery,
    mut permit: OwnedSemaphorePermit,
    want: usize,
    buffered: &mut std::collections::VecDeque<Delivery>,
) {
    // A message without an id is never grouped: it is refused, or gets an id, alone. Nor
    // is one whose id holds a NUL character (a producer may send one over RabbitMQ):
    // Postgres cannot record it in the inbox, and the group records every member's id
    // in one statement, which would fail them all.
    let ungroupable = |id: &str| id.is_empty() || id.contains('\0');
    let alone = ungroupable(&first.message().envelope.message_id);
    let mut members = vec![first];
    while !alone && members.len() < want {
        let Some(next) = buffered.front() else { break };
        let id = &next.message().envelope.message_id;
        if ungroupable(id) || members.iter().any(|d| &d.message().envelope.message_id == id) {
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
