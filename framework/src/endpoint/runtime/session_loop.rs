//! Receiving from a source that requires sessions (S4): the session workers.
//!
//! A session queue refuses a plain receiver, so an endpoint receives from it by accepting
//! sessions. Each source that requires sessions gets as many *session workers* as the
//! endpoint's concurrency. A worker loops: accept the next free session
//! (`SessionSelector::Next`), then take that session's messages one at a time, each
//! through the same `process` as a plain receive loop's (inbox, handlers, store, retries,
//! dead-lettering), and the next only once the previous one is settled. So a session's
//! messages are handled in order and never overlap, while the workers hold different
//! sessions at once; across processes the transport's session lock keeps a session to
//! one holder.
//!
//! A worker renews the session lock while it holds the session (also while a handler
//! runs, for at most the endpoint's `max_lock_renewal` per message), and releases the
//! session as soon as it has no message waiting (after its first one, which it waits for
//! up to [`SESSION_IDLE`]), after [`SESSION_TURN`] messages in a row (so a busy session
//! does not keep a worker from the sessions that wait: it goes back and is accepted again
//! in its turn), at shutdown, or when the lock was lost. Waiting on a session with nothing
//! waiting would keep the worker from the other sessions: with many sessions of a few
//! messages each, workers spent nearly all their time in that wait (the RabbitMQ sessions
//! bench: 216 messages a second at concurrency 8 with a 250 ms wait).
//!
//! Also here: how the endpoint learns that a source requires sessions (`probe`), and
//! what it refuses on such a source (`refusal`). Plain sources are `receive_loop.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::entity::EntityPath;
use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::transport::{Delivery, Receiver, SessionReceiver, SessionSelector, Transport};

use super::Shared;
use super::handle::process;
use super::receive_loop::hand_back;

/// How long a worker waits for the first message of a session it accepted (the session
/// had one when it was accepted; another receiver may have taken it since, on transports
/// that lock by message). After that it waits for none: a session with nothing waiting is
/// released at once, and accepted again when a message comes.
pub(super) const SESSION_IDLE: Duration = Duration::from_millis(250);

/// How many messages of one session a worker handles in a row before it releases the
/// session and accepts the next one (which may be the same, when its first message is
/// the oldest waiting).
pub(super) const SESSION_TURN: usize = 32;

/// Whether the source `receiver` reads requires sessions: a receive of no message is
/// refused with `InvalidOperation` on a session queue, on every transport (the contract
/// of [`Receiver::receive`]). `None`: it does. Else what the receive gave: nothing on
/// most transports, but the embedded broker takes at least one message per receive, so
/// the messages it locked are handed to the source's receive loop, to be handled as any
/// (dropping them would keep them locked until their locks expire, and abandoning them
/// would count a delivery that no handler saw).
///
/// # Errors
/// Any other error of the receive.
pub(super) async fn probe(receiver: &dyn Receiver) -> Result<Option<Vec<Delivery>>> {
    match receiver.receive(0, Duration::ZERO).await {
        Ok(received) => Ok(Some(received)),
        Err(e) if matches!(e.kind(), ErrorKind::InvalidOperation { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What the endpoint refuses on a source whose sessions it handles: the declaration and
/// the source disagreeing, a group commit, delayed retries. `declared` is the endpoint's
/// `QueueOptions::requires_session`, `requires` what the source is.
pub(super) fn refusal(
    path: &EntityPath,
    declared: bool,
    requires: bool,
    group_size: usize,
    delayed_retries: usize,
) -> Option<Error> {
    let invalid = |reason: String| Some(Error::new(ErrorKind::InvalidOptions { reason }));
    match (declared, requires) {
        (true, false) => {
            return invalid(format!(
                "the endpoint is built with QueueOptions::requires_session(true), but {path} exists without \
                 sessions (an existing queue or subscription keeps the settings it was created with): delete it \
                 and start the endpoint again to create it with sessions, or build the endpoint without \
                 requires_session"
            ));
        }
        (false, true) => {
            return invalid(format!(
                "{path} requires sessions, but the endpoint is built without them: build it with \
                 .queue_options(QueueOptions::default().requires_session(true)) to handle each session's messages \
                 in order, one at a time (docs/endpoints.md, \"Sessions\")"
            ));
        }
        (false, false) => return None,
        (true, true) => {}
    }
    if group_size > 1 {
        return invalid(format!(
            "group_commit({group_size}) cannot be used on {path}, which requires sessions: a session's messages are \
             handled one at a time, each committed before the next starts; use group_commit(1)"
        ));
    }
    if delayed_retries > 0 {
        return invalid(format!(
            "the retry policy has {delayed_retries} delayed retries, but {path} requires sessions: a delayed retry \
             sends the message back to the queue for later, behind the session's later messages, which would then \
             be handled before it; use immediate retries only (RetryPolicy::default().delayed([]), raise \
             immediate_retries to retry more): they keep the session's order"
        ));
    }
    None
}

/// What the session workers of one source share.
pub(super) struct SessionLoop {
    pub(super) transport: Arc<dyn Transport>,
    pub(super) path: EntityPath,
    pub(super) shared: Arc<Shared>,
    pub(super) concurrency: Arc<Semaphore>,
    pub(super) handlers: TaskTracker,
    pub(super) stop: CancellationToken,
    /// How long one accept waits for a session with messages.
    pub(super) accept_wait: Duration,
}

/// Runs `workers` session workers on one source until the stop; returns how many
/// messages they had received and handed back unstarted (at most one each).
pub(super) async fn session_loop(l: SessionLoop, workers: usize) -> usize {
    let l = Arc::new(l);
    let mut set = JoinSet::new();
    for _ in 0..workers.max(1) {
        set.spawn(worker(l.clone()));
    }
    let mut handed_back = 0;
    while let Some(done) = set.join_next().await {
        handed_back += done.unwrap_or(0);
    }
    handed_back
}

/// One worker: accepts a session, holds it, releases it, again, until the stop.
async fn worker(l: Arc<SessionLoop>) -> usize {
    let mut backoff = Duration::from_millis(50);
    let mut handed_back = 0;
    loop {
        let accepted = tokio::select! {
            biased;
            () = l.stop.cancelled() => return handed_back,
            a = l.transport.accept_session(&l.path, SessionSelector::Next, l.accept_wait) => a,
        };
        match accepted {
            Ok(session) => {
                backoff = Duration::from_millis(50);
                let (unstarted, ended) = hold(&l, session.clone()).await;
                handed_back += unstarted;
                match ended {
                    // The handler still runs: the session is released once it ends.
                    Held::HandlerRunning => return handed_back,
                    Held::Released => {}
                    Held::Stop => {
                        release(&*session).await;
                        return handed_back;
                    }
                    Held::Closed => return handed_back,
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }) => {}
            Err(e) if matches!(e.kind(), ErrorKind::Closed) => {
                tracing::warn!(source = %l.path, "the transport closed; the endpoint stops accepting sessions");
                return handed_back;
            }
            Err(e) => {
                tracing::warn!(source = %l.path, error = %e, retry_in = ?backoff, "accepting a session failed");
                tokio::select! {
                    () = l.stop.cancelled() => return handed_back,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
        }
    }
}

/// How a worker's hold of a session ended.
enum Held {
    /// It released the session (idle, its turn was over, or the lock was lost).
    Released,
    /// The stop came with no handler running: the caller releases the session.
    Stop,
    /// The stop came while a handler ran: a task of the endpoint's handlers releases the
    /// session once it ends.
    HandlerRunning,
    /// The transport closed.
    Closed,
}

/// Handles the held session's messages one at a time; returns how many it handed back
/// unstarted and how the hold ended.
async fn hold(l: &SessionLoop, session: Arc<dyn SessionReceiver>) -> (usize, Held) {
    let clock = l.shared.clock.clone();
    let sid = session.session_id().to_owned();
    let mut renew_at = midpoint(&*clock, session.session_locked_until());
    let mut handled = 0;
    while handled < SESSION_TURN {
        if l.stop.is_cancelled() {
            return (0, Held::Stop);
        }
        if clock.now() >= renew_at {
            match session.renew_session_lock().await {
                Ok(until) => renew_at = midpoint(&*clock, until),
                Err(e) => return lost(l, &*session, &sid, &e).await,
            }
        }
        let received = tokio::select! {
            biased;
            () = l.stop.cancelled() => return (0, Held::Stop),
            r = session.receive(1, if handled == 0 { SESSION_IDLE } else { Duration::ZERO }) => r,
        };
        let delivery = match received {
            Ok(mut got) => match got.pop() {
                Some(d) => d,
                None => break,
            },
            Err(e) => return lost(l, &*session, &sid, &e).await,
        };
        let permit = tokio::select! {
            biased;
            () = l.stop.cancelled() => {
                return (hand_back(std::iter::once(delivery).collect()).await, Held::Stop);
            }
            p = l.concurrency.clone().acquire_owned() => p,
        };
        let Ok(permit) = permit else {
            return (hand_back(std::iter::once(delivery).collect()).await, Held::Stop);
        };
        let started = clock.now();
        let renew_until =
            started + chrono::Duration::from_std(l.shared.max_lock_renewal).unwrap_or(chrono::Duration::MAX);
        let mut task = l.handlers.spawn(process(l.shared.clone(), delivery, permit, None));
        // The message's own lock is renewed by its handling; the session's lock here, so
        // that a long handler does not lose the session on a transport where they differ.
        loop {
            let at = (renew_at < renew_until).then_some(renew_at);
            tokio::select! {
                biased;
                _ = &mut task => break,
                () = l.stop.cancelled() => {
                    l.handlers.spawn(async move {
                        // The handler goes on (the shutdown timeout bounds it); its session
                        // is released once it settled its message.
                        let _ = task.await;
                        release(&*session).await;
                    });
                    return (0, Held::HandlerRunning);
                }
                () = sleep_until(&*clock, at) => {
                    match session.renew_session_lock().await {
                        Ok(until) => renew_at = midpoint(&*clock, until),
                        Err(e) => {
                            tracing::warn!(source = %l.path, session = %Escaped(&sid), error = %e,
                                "renewing the session lock failed while a handler ran");
                            renew_at = renew_until;
                        }
                    }
                }
            }
        }
        handled += 1;
    }
    release(&*session).await;
    (0, Held::Released)
}

/// The hold of a session ended by an error of the session: releases what is left of it.
async fn lost(l: &SessionLoop, session: &dyn SessionReceiver, sid: &str, e: &Error) -> (usize, Held) {
    if matches!(e.kind(), ErrorKind::Closed) {
        return (0, Held::Closed);
    }
    if e.is_lock_lost() {
        tracing::warn!(source = %l.path, session = %Escaped(sid), "session lock lost; its messages go to the next holder");
    } else {
        tracing::warn!(source = %l.path, session = %Escaped(sid), error = %e, "receiving from a session failed; releasing it");
    }
    release(session).await;
    (0, Held::Released)
}

async fn release(session: &dyn SessionReceiver) {
    if let Err(e) = session.release().await {
        tracing::debug!(session = %Escaped(session.session_id()), error = %e, "releasing a session failed; its lock will expire");
    }
}

/// Halfway from now to `until`: when a lock that ends then is renewed.
fn midpoint(clock: &dyn crate::clock::Clock, until: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    let now = clock.now();
    now + ((until - now) / 2).max(chrono::Duration::milliseconds(1))
}

/// Sleeps until `at` by the clock; never, without one.
async fn sleep_until(clock: &dyn crate::clock::Clock, at: Option<chrono::DateTime<chrono::Utc>>) {
    match at {
        Some(at) => clock.sleep_until(at).await,
        None => std::future::pending().await,
    }
}
