//! Batch handlers, the runtime's side: the messages of a type with a batch handler are
//! collected (`collect`, called by `handle::process` for each of them) until the batch
//! has `max_messages` or its first message waited `max_wait`; then the batch runs
//! (`run`): each message's own checks (its delivery count, its decoding: a failure is
//! its alone), ONE transaction of the store for the rest (`Store::begin_batch`: the
//! inbox records, the handler's writes, what it sent, and on the broker's own database
//! the completions), then the dispatch and the completions. A batch that fails is handed
//! over again one message at a time, each in its own transaction, so that the message
//! that fails is retried and dead-lettered alone (`failures.rs`) and the others succeed.
//!
//! Each message's task (`process`) lives until its batch has been settled, holding its
//! concurrency slot, so the endpoint's shutdown waits for batches as for any handling.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use chrono::{DateTime, Utc};

use tokio::sync::{Semaphore, oneshot};

use crate::endpoint::Failure;
use crate::endpoint::batch::BatchContext;
use crate::endpoint::history::Attempt;
use crate::endpoint::observe::Handled;
use crate::endpoint::registry::BatchRoute;
use crate::endpoint::sagas::LockOwner;
use crate::endpoint::trace::TraceContext;
use crate::store::OutboxMessage;
use crate::transport::Delivery;

use super::Shared;
use super::failures::{Tried, on_failure};
use super::group::next_owner;
use super::handle::{CatchUnwind, Done, commit, complete, context_of, panic_text};
use super::outbox::dispatch_stored;
use super::renew::run_renewing_all;

/// The batch a batch handler is collecting, and the room for its batches that run.
pub(crate) struct Collecting {
    state: Mutex<State>,
    running: Semaphore,
}

impl Collecting {
    /// Room for `concurrency` batches running at once.
    pub(crate) fn new(concurrency: usize) -> Self {
        Collecting {
            state: Mutex::new(State::default()),
            running: Semaphore::new(concurrency.max(1)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct State {
    /// One more each time a batch is handed over: the first member's timer hands over
    /// only the batch it started.
    generation: u64,
    members: Vec<Member>,
    /// When the batch being collected is handed over at the latest.
    deadline: Option<DateTime<Utc>>,
}

impl State {
    fn take(&mut self) -> Vec<Member> {
        self.generation += 1;
        self.deadline = None;
        std::mem::take(&mut self.members)
    }
}

impl Collecting {
    /// How many messages wait in the batch being collected, and until when at the
    /// latest (for `courier::testing`: a batch that waits for its time limit waits for
    /// the clock, it is not busy).
    pub(crate) fn waiting(&self) -> (usize, Option<DateTime<Utc>>) {
        let state = self.lock();
        (state.members.len(), state.deadline)
    }
}

/// A message of a batch, with its retry counts; its task waits until `done` is dropped.
struct Member {
    delivery: Delivery,
    delayed: u32,
    attempt: u32,
    done: oneshot::Sender<()>,
}

impl Member {
    /// Its attempt, begun at `began` (when its batch, or its retry alone, began).
    fn tried(&self, began: DateTime<Utc>) -> Tried {
        Tried {
            delayed: self.delayed,
            number: self.attempt,
            began,
        }
    }
}

/// Adds a received message to its type's batch, and returns once that batch has been
/// handled and the message settled. The task that fills the batch runs it; the task of
/// its first message runs it when `max_wait` passed first.
pub(super) async fn collect(shared: &Arc<Shared>, route: &BatchRoute, delivery: Delivery, delayed: u32, attempt: u32) {
    let options = route.handler.options();
    let (done, finished) = oneshot::channel();
    let member = Member {
        delivery,
        delayed,
        attempt,
        done,
    };
    if attempt > 1 {
        // A message being retried goes alone: the batch it failed in does not fail again.
        run(shared, route, vec![member]).await;
        return;
    }
    let id = member.delivery.message().envelope.message_id.clone();
    let (earlier, full, timer) = {
        let mut state = route.collecting.lock();
        // A batch's ids are distinct (the inbox records each once): the same id again
        // hands the batch over first.
        let earlier = state
            .members
            .iter()
            .any(|m| m.delivery.message().envelope.message_id == id)
            .then(|| state.take());
        state.members.push(member);
        let timer = (state.members.len() == 1).then(|| {
            let wait = chrono::Duration::from_std(options.max_wait).unwrap_or(chrono::Duration::MAX);
            let deadline = shared.clock.now() + wait;
            state.deadline = Some(deadline);
            (state.generation, deadline)
        });
        let full = (state.members.len() >= options.max_messages).then(|| state.take());
        (earlier, full, timer)
    };
    if let Some(batch) = earlier {
        run(shared, route, batch).await;
    }
    let mut finished = std::pin::pin!(finished);
    if let Some(batch) = full {
        run(shared, route, batch).await;
    } else if let Some((generation, deadline)) = timer {
        tokio::select! {
            _ = &mut finished => return,
            () = shared.clock.sleep_until(deadline) => {}
        }
        let batch = {
            let mut state = route.collecting.lock();
            (state.generation == generation && !state.members.is_empty()).then(|| state.take())
        };
        if let Some(batch) = batch {
            run(shared, route, batch).await;
        }
    }
    let _ = finished.await;
}

/// A member past its own checks, with its decoded message.
struct Ready {
    member: Member,
    decoded: Box<dyn std::any::Any + Send>,
}

/// Runs a batch: the members' own checks, then the batch, or its members one by one
/// when it failed.
async fn run(shared: &Arc<Shared>, route: &BatchRoute, members: Vec<Member>) {
    let Ok(_slot) = route.collecting.running.acquire().await else {
        return;
    };
    let mut ready = Vec::with_capacity(members.len());
    let began = shared.clock.now();
    for member in members {
        if let Some(until) = member.delivery.locked_until()
            && until <= began
        {
            tracing::warn!("lock lost before the batch started; the message will be delivered again");
            continue;
        }
        let delivery_count = member.delivery.message().broker.delivery_count;
        if delivery_count > shared.policy.attempts_per_round() {
            let failure = Failure::Unfinished {
                deliveries: delivery_count,
            };
            let tried = member.tried(began);
            on_failure(shared, member.delivery, failure, tried).await;
            continue;
        }
        match route.handler.decode(member.delivery.message()) {
            Ok(decoded) => ready.push(Ready { member, decoded }),
            Err(failure) => {
                let tried = member.tried(began);
                on_failure(shared, member.delivery, failure, tried).await;
            }
        }
    }
    if ready.is_empty() {
        return;
    }
    if ready.len() == 1 {
        return run_alone(shared, route, ready).await;
    }
    // Kept for a retry one by one: decoding again is cheaper than cloning what the
    // handler takes by value.
    let (mut members, decoded): (Vec<Member>, Vec<_>) = ready.into_iter().map(|r| (r.member, r.decoded)).unzip();
    match handle(shared, route, &mut members, decoded).await {
        Ok(outcome) => settle(shared, members, outcome, began).await,
        Err(failure) => {
            tracing::warn!(
                handler = route.handler.name(),
                messages = members.len(),
                error = %failure.chain().join(": "),
                "a batch failed; its messages are handled again one by one"
            );
            for member in members {
                match route.handler.decode(member.delivery.message()) {
                    Ok(decoded) => run_alone(shared, route, vec![Ready { member, decoded }]).await,
                    Err(failure) => {
                        let tried = member.tried(shared.clock.now());
                        on_failure(shared, member.delivery, failure, tried).await;
                    }
                }
            }
        }
    }
}

/// A batch of one: its failure is the message's (retried or dead-lettered by the policy).
async fn run_alone(shared: &Arc<Shared>, route: &BatchRoute, ready: Vec<Ready>) {
    let began = shared.clock.now();
    let (mut members, decoded): (Vec<Member>, Vec<_>) = ready.into_iter().map(|r| (r.member, r.decoded)).unzip();
    match handle(shared, route, &mut members, decoded).await {
        Ok(outcome) => settle(shared, members, outcome, began).await,
        Err(Failure::Store(e)) if e.is_lock_lost() => {
            tracing::warn!(error = %e, "lock lost before the batch's transaction committed; it rolled back and \
                the message will be delivered again");
        }
        Err(failure) => {
            if let Some(member) = members.into_iter().next() {
                let tried = member.tried(began);
                on_failure(shared, member.delivery, failure, tried).await;
            }
        }
    }
}

/// How a batch's handling ended, before dispatch and completion.
struct Outcome {
    /// The fresh members' outcome.
    done: Option<Done>,
    /// Per member: whether it was processed before (its rows left to dispatch are in
    /// `left`).
    duplicate: Vec<bool>,
    left: Vec<OutboxMessage>,
}

/// The batch's transaction: the inbox (which members are fresh), the handler on the
/// fresh ones, the commit.
async fn handle(
    shared: &Arc<Shared>,
    route: &BatchRoute,
    members: &mut [Member],
    mut decoded: Vec<Box<dyn std::any::Any + Send>>,
) -> Result<Outcome, Failure> {
    let Some(first) = members.first() else {
        return Ok(Outcome {
            done: None,
            duplicate: Vec::new(),
            left: Vec::new(),
        });
    };
    let owner = LockOwner {
        id: next_owner(),
        bounded: false,
    };
    let cancel = shared.hard_stop.child_token();
    let mut duplicate = vec![false; members.len()];
    let mut left = Vec::new();
    let mut work = None;
    if let Some(store) = &shared.store {
        let read = shared.outbox.read();
        let ids = members
            .iter()
            .map(|m| {
                (
                    m.delivery.message().envelope.message_id.clone(),
                    m.delivery.lock_token(),
                )
            })
            .collect();
        let begun = store
            .begin_batch(&shared.name, ids, shared.clock.now())
            .await
            .map_err(Failure::Store)?;
        for (i, d) in begun.duplicates.into_iter().enumerate() {
            if let Some(rows) = d {
                left.extend(rows);
                if let Some(flag) = duplicate.get_mut(i) {
                    *flag = true;
                }
            }
        }
        left = shared.outbox.take_read(read, left, |m| m.id);
        let Some(w) = begun.work else {
            return Ok(Outcome {
                done: None,
                duplicate,
                left,
            });
        };
        work = Some(w);
    }
    // The fresh members, in order; the first of them is the context's message.
    let mut received = Vec::new();
    let mut fresh = Vec::new();
    for ((m, is_dup), d) in members.iter().zip(&duplicate).zip(decoded.drain(..)) {
        if !is_dup {
            received.push(m.delivery.message().clone());
            fresh.push(d);
        }
    }
    let lead = members
        .iter()
        .zip(&duplicate)
        .find(|(_, d)| !**d)
        .map_or(first, |(m, _)| m);
    let lead_id = lead.delivery.message().envelope.message_id.clone();
    let trace = TraceContext::new_root();
    let inner = context_of(
        shared,
        &lead.delivery,
        (lead.attempt, lead.delayed),
        trace,
        owner,
        cancel.clone(),
    );
    let mut ctx = BatchContext { inner };
    if let Some(work) = work {
        ctx.inner.set_unit_of_work(work);
    }
    let mut deliveries: Vec<&mut Delivery> = members.iter_mut().map(|m| &mut m.delivery).collect();
    let call = CatchUnwind(route.handler.call(fresh, received, &mut ctx));
    let called = run_renewing_all(&mut deliveries, &*shared.clock, shared.max_lock_renewal, &cancel, call).await;
    drop(deliveries);
    match called {
        Ok(Ok(())) => {}
        Ok(Err(f)) => return Err(f.with_refusals(&ctx.inner)),
        Err(payload) => {
            return Err(Failure::Panic {
                handler: route.handler.name(),
                text: panic_text(payload.as_ref()),
            });
        }
    }
    let outgoing = ctx.inner.take_outgoing();
    let done = match ctx.inner.take_unit_of_work() {
        Some(mut work) => {
            // The history: the lead's event (with what the batch sent) is written by
            // `commit`; each other fresh member's, here, in the same transaction.
            if let Some(recorder) = &shared.history {
                for (m, is_dup) in members.iter().zip(&duplicate) {
                    let message = m.delivery.message();
                    if !is_dup && message.envelope.message_id != lead_id {
                        let attempt = Attempt {
                            number: m.attempt,
                            received_at: Some(ctx.inner.started_at()),
                            at: shared.clock.now(),
                        };
                        let event = recorder.handled(message, attempt, &[], &[]);
                        work.record_history(&event).await.map_err(Failure::Store)?;
                    }
                }
            }
            let done = commit(shared, &mut ctx.inner, work, outgoing).await?;
            // The observer heard of the batch's first fresh message (with what the batch
            // sent); each other fresh message is a committed handling too.
            if let Some(observer) = &shared.observer {
                for (m, is_dup) in members.iter().zip(&duplicate) {
                    let envelope = &m.delivery.message().envelope;
                    if !is_dup && envelope.message_id != lead_id {
                        observer.handled(Handled {
                            message: envelope.clone(),
                            outgoing: Vec::new(),
                            sagas: Vec::new(),
                        });
                    }
                }
            }
            done
        }
        None => Done::Handled(outgoing),
    };
    Ok(Outcome {
        done: Some(done),
        duplicate,
        left,
    })
}

/// After the batch's commit: dispatch what it sent and what duplicates left, then
/// complete the members (unless the transaction did).
async fn settle(shared: &Arc<Shared>, members: Vec<Member>, outcome: Outcome, began: DateTime<Utc>) {
    let Outcome { done, duplicate, left } = outcome;
    let settled_fresh = matches!(done, Some(Done::Settled));
    let dispatched = match done {
        None | Some(Done::Settled) => Ok(()),
        Some(Done::Handled(outgoing)) => shared.bus.dispatch_created(outgoing).await,
        Some(Done::Committed(stored)) | Some(Done::Duplicate(stored)) => {
            dispatch_stored(shared, shared.outbox.take_stored(stored, |m| m.id)).await
        }
    };
    let left_sent = dispatch_stored(shared, left).await;
    if let Err(e) = dispatched.as_ref().and(left_sent.as_ref()) {
        // Committed: the outbox sweeper sends what is left; the members come back and
        // are recognised as processed.
        tracing::warn!(error = %e, "a batch is committed, but some of its messages could not be dispatched; they \
            stay in the outbox and the outbox sweeper keeps sending them");
        for member in members {
            let _ = member.delivery.abandon().await;
        }
        return;
    }
    let now = shared.clock.now();
    for (member, is_dup) in members.into_iter().zip(duplicate) {
        let metrics = shared.metrics.of(member.delivery.message());
        if is_dup {
            shared
                .stats
                .duplicates
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics.deduplicated();
            let message = member.delivery.message();
            let tried = member.tried(began);
            super::failures::record_history(shared, tried, |r, attempt| r.duplicate(message, attempt)).await;
            complete(shared, member.delivery).await;
        } else if settled_fresh {
            shared
                .stats
                .completed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            metrics.handled(member.delivery.message().broker.enqueued_time, now);
        } else {
            complete(shared, member.delivery).await;
        }
        drop(member.done);
    }
}
