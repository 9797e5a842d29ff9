//! Renewing the lock of a message while its handlers run ("where is a lock renewed?" on
//! the endpoint's side: `run_renewing`, here; the embedded broker's side is
//! `embedded/engine/settle.rs`).

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::transport::Delivery;

/// Runs `work` while renewing the delivery's lock, for at most `max_total`. A lost lock
/// fires `cancel`: the handler's outcome can no longer settle the message.
pub(super) async fn run_renewing<F: Future>(
    delivery: &mut Delivery,
    clock: &dyn Clock,
    max_total: Duration,
    cancel: &CancellationToken,
    work: F,
) -> F::Output {
    run_renewing_all(&mut [delivery], clock, max_total, cancel, work).await
}

/// Runs `work` while renewing the locks of `deliveries` (one message's, or a batch's), for
/// at most `max_total`: each round at half the earliest lock's remaining time, one
/// delivery after the other. The work goes on while a renewal waits: with a store in the
/// broker's own database the broker serves the renewal only after the work's transaction
/// ends. A lost lock fires `cancel`: the outcome can no longer settle the message (a
/// batch's transaction would not commit: its completion is fenced by every lock).
pub(super) async fn run_renewing_all<F: Future>(
    deliveries: &mut [&mut Delivery],
    clock: &dyn Clock,
    max_total: Duration,
    cancel: &CancellationToken,
    work: F,
) -> F::Output {
    let stop_at = clock.now() + chrono::Duration::from_std(max_total).unwrap_or(chrono::Duration::MAX);
    let mut work = std::pin::pin!(work);
    let mut renewing = true;
    loop {
        let earliest = deliveries.iter().filter_map(|d| d.locked_until()).min();
        let next = match earliest {
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
                for delivery in deliveries.iter_mut() {
                    let renewed = tokio::select! {
                        out = &mut work => return out,
                        r = delivery.renew_lock() => r,
                    };
                    if let Err(e) = renewed {
                        renewing = false;
                        if e.is_lock_lost() {
                            tracing::warn!(error = %e, "lock lost while the handler ran; the message will be \
                                delivered again");
                            cancel.cancel();
                        } else {
                            tracing::warn!(error = %e, "lock renewal failed");
                        }
                        break;
                    }
                }
            }
        }
    }
}
