//! The handling of one message: `process` (the task of one delivery: its span, its
//! running count, the hard stop) and `handle`: find the handlers of its type, begin the
//! unit of work (the inbox: a duplicate is recognised here), run the handlers, store what
//! they sent in the outbox and commit, then dispatch and complete; a failure goes to
//! `failures.rs`.
//!
//! The path of one message: `receive_loop.rs` -> `process` -> `handle` -> the store's unit
//! of work (`store/`) -> `outbox.rs` (dispatch) -> the transport's settlement
//! (`Delivery::complete`, or `failures.rs`). Nothing here waits on a timer of its own:
//! the lock is renewed by `renew.rs` while the handlers run.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context as TaskContext, Poll};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::endpoint::ErasedHandler;
use crate::endpoint::Failure;
use crate::endpoint::bus::{self, Outgoing, describe_sent, name_outgoing};
use crate::endpoint::context::{Context, ContextParts};
use crate::endpoint::history::Attempt;
use crate::endpoint::metrics::TypeMetrics;
use crate::endpoint::not_found_seal;
use crate::endpoint::observe::Handled;
use crate::endpoint::recoverability::{headers, reasons};
use crate::endpoint::retry_seal::{Count, read_count};
use crate::endpoint::sagas::LockOwner;
use crate::endpoint::timeout_seal::TimeoutSeal;
use crate::endpoint::trace::TraceContext;
use crate::logtext::Escaped;
use crate::message::{LockToken, Properties};
use crate::store::{Begin, Committed, OutboxMessage, UnitOfWork};
use crate::transport::Delivery;

use super::failures::{Tried, dead_letter, on_failure};
use super::group::{GroupSeat, next_owner};
use super::outbox::dispatch_stored;
use super::renew::run_renewing;
use super::{Running, Shared};

/// Why a message without an id is refused by an endpoint with an inbox, and what to do;
/// `transport` ([`Transport::name`](crate::Transport::name)) says where the id goes.
pub(super) fn missing_id_description(endpoint: &str, transport: &str) -> String {
    let field = match transport {
        "amqp" => "on RabbitMQ the message_id property",
        "postgres" => "on the Postgres transport the message_id column of courier.message",
        _ => "on RabbitMQ the message_id property, on the Postgres transport the message_id column of courier.message",
    };
    format!(
        "the message has no message id: endpoint {endpoint} keeps an inbox, which recognises a \
         redelivered message by its id, so it cannot promise to handle this one once; the producer \
         must set a unique message id on every message ({field}) and keep it when it sends the \
         same message again; or build the endpoint with \
         EndpointBuilder::accept_messages_without_id(true) to handle such messages at least once"
    )
}

pub(super) async fn process(
    shared: Arc<Shared>,
    mut delivery: Delivery,
    _permit: OwnedSemaphorePermit,
    seat: Option<GroupSeat>,
) {
    let _running = Running::new(&shared.stats.running);
    shared.metrics.of(delivery.message()).consumed();
    if delivery.message().envelope.message_id.is_empty() {
        if shared.store.is_some() && !shared.accept_messages_without_id {
            drop(seat);
            let description = missing_id_description(&shared.name, shared.bus.transport().name());
            // Refused before its delayed-retry count is read: its deliveries number it.
            let tried = Tried {
                delayed: 0,
                number: delivery.message().broker.delivery_count,
                began: shared.clock.now(),
            };
            dead_letter(
                &shared,
                delivery,
                reasons::MISSING_MESSAGE_ID,
                description,
                Properties::new(),
                tried,
            )
            .await;
            return;
        }
        // At least once: a fresh id at each delivery (see accept_messages_without_id).
        delivery.message_mut().envelope.message_id = uuid::Uuid::now_v7().to_string();
    }
    // The count of delayed retries: trusted when the endpoint sealed it (or has no secret
    // to check it with); a count it did not seal counts as none and is taken off the
    // message the handler sees (it is logged below, in the message's span).
    let count = {
        let envelope = &delivery.message().envelope;
        read_count(
            shared.seal.as_ref(),
            &shared.name,
            &envelope.message_id,
            &envelope.properties,
        )
    };
    if let Count::Unsealed(_) = count {
        let properties = &mut delivery.message_mut().envelope.properties;
        properties.remove(headers::DELAYED_RETRIES);
        properties.remove(headers::DELAYED_RETRY_SEAL);
    }
    let delayed = count.delayed();
    if let Some(route) = delivery
        .message()
        .envelope
        .message_type
        .as_deref()
        .and_then(|t| shared.by_name.get(t))
        .and_then(|entry| entry.batch.clone())
    {
        // A message of a batch handler: its task waits for its batch (`batcher.rs`).
        drop(seat);
        let attempt = shared
            .policy
            .attempt_number(delayed, delivery.message().broker.delivery_count);
        let hard_stop = shared.hard_stop.clone();
        tokio::select! {
            biased;
            () = super::batcher::collect(&shared, &route, delivery, delayed, attempt) => {}
            () = hard_stop.cancelled() => {
                shared.stats.interrupted.fetch_add(1, Ordering::Relaxed);
            }
        }
        return;
    }
    let message = delivery.message();
    let delivery_count = message.broker.delivery_count;
    let attempt = shared.policy.attempt_number(delayed, delivery_count);
    let trace = TraceContext::from_properties(&message.envelope.properties)
        .map_or_else(TraceContext::new_root, |parent| parent.child());
    let span = tracing::info_span!(
        "message",
        endpoint = %shared.name,
        message_id = %Escaped(&message.envelope.message_id),
        message_type = message.envelope.message_type.as_deref().unwrap_or(""),
        queue = %shared.name,
        delivery_count,
        attempt,
        trace_id = %trace.trace_id(),
        span_id = %trace.span_id(),
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
    );
    if let Count::Unsealed(value) = &count {
        span.in_scope(|| {
            tracing::warn!(
                count = %Escaped(&value.to_string()),
                "the message carries a delayed-retry count (courier.retry.delayed) that this endpoint did not seal: \
                 ignored and removed from its headers, its delayed retries count from 0"
            );
        });
    }
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

/// The handling of one delivery, by step: [`handlers_of`] (or the dead-letter queue for
/// an unknown type), the delivery count, [`context_of`], [`run`] under the lock's
/// renewal (the inbox, the handlers, [`commit`]), then [`settle`] (dispatch and
/// complete); a failure of any step goes to `failures.rs`.
pub(super) async fn handle(
    shared: &Shared,
    mut delivery: Delivery,
    delayed: u32,
    attempt: u32,
    trace: TraceContext,
    seat: Option<GroupSeat>,
) {
    let began = shared.clock.now();
    if let Some(until) = delivery.locked_until()
        && until <= began
    {
        tracing::warn!("lock lost before the handler started; the message will be delivered again");
        return;
    }
    let tried = Tried {
        delayed,
        number: attempt,
        began,
    };
    let handlers = match handlers_of(shared, &delivery) {
        Ok(handlers) => handlers,
        Err(description) => {
            dead_letter(
                shared,
                delivery,
                reasons::UNKNOWN_MESSAGE_TYPE,
                description,
                Properties::new(),
                tried,
            )
            .await;
            return;
        }
    };
    let delivery_count = delivery.message().broker.delivery_count;
    if delivery_count > shared.policy.attempts_per_round() {
        // Its commit group does not wait for it.
        drop(seat);
        let failure = Failure::Unfinished {
            deliveries: delivery_count,
        };
        on_failure(shared, delivery, failure, tried).await;
        return;
    }
    let cancel = shared.hard_stop.child_token();
    let owner = LockOwner {
        id: seat.as_ref().map_or_else(next_owner, |s| s.owner),
        bounded: shared.group_size > 1,
    };
    let mut ctx = context_of(shared, &delivery, (attempt, delayed), trace, owner, cancel.clone());
    let lock = delivery.lock_token();
    let started = std::time::Instant::now();
    let work = run(shared, &mut ctx, &handlers, seat, lock);
    let outcome = run_renewing(&mut delivery, &*shared.clock, shared.max_lock_renewal, &cancel, work).await;
    // Before the delivery is settled: a unit of work a failed handling left in the context
    // rolls back here, and gives back what it holds (the embedded broker lends it its
    // single writer, which the dead-lettering below needs).
    drop(ctx);
    let metrics = shared.metrics.of(delivery.message());
    metrics.processed(started.elapsed(), outcome.as_ref().err());
    match settle(shared, &delivery, metrics, outcome, tried).await {
        Next::Complete => complete(shared, delivery).await,
        Next::Done => {}
        Next::Fail(failure) => on_failure(shared, delivery, failure, tried).await,
    }
}

/// The handlers of the delivery's message type, or why there are none (the description
/// of its dead letter).
fn handlers_of(shared: &Shared, delivery: &Delivery) -> Result<Arc<[Arc<dyn ErasedHandler>]>, String> {
    let message_type = delivery.message().envelope.message_type.as_deref();
    if let Some(entry) = message_type.and_then(|t| shared.by_name.get(t)) {
        return Ok(entry.handlers.clone());
    }
    Err(match message_type {
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
    })
}

/// The handlers' context for this delivery: its attempt (and delayed retries), trace,
/// lock owner and cancellation.
pub(super) fn context_of(
    shared: &Shared,
    delivery: &Delivery,
    (attempt, delayed_retries): (u32, u32),
    trace: TraceContext,
    lock_owner: LockOwner,
    cancel: CancellationToken,
) -> Context {
    Context::new(ContextParts {
        endpoint: shared.name.clone(),
        message: delivery.message().clone(),
        attempt,
        delayed_retries,
        bus: shared.bus.clone(),
        clock: shared.clock.clone(),
        cancel,
        trace,
        extensions: shared.extensions.clone(),
        observing: shared.observer.is_some() || shared.history.is_some(),
        lock_owner,
        timeout_seal: shared.timeout_seal.clone(),
    })
}

/// The work under the lock: the inbox (record the id in a new transaction or the
/// group's, or learn it was processed), the handlers, and [`commit`].
async fn run(
    shared: &Shared,
    ctx: &mut Context,
    handlers: &[Arc<dyn ErasedHandler>],
    seat: Option<GroupSeat>,
    lock: Option<LockToken>,
) -> Result<Done, Failure> {
    // A saga's copy of a message it tries again (no instance found yet): that saga's
    // handler runs, the others ran on the first arrival (`endpoint/not_found_seal.rs`).
    let retried_by = not_found_seal::read(
        shared.timeout_seal.as_deref().map(TimeoutSeal::keyed),
        &shared.name,
        &ctx.received().envelope,
    )
    .map(|r| r.saga);
    if let Some(saga) = &retried_by
        && !handlers.iter().any(|h| h.saga() == Some(saga.as_str()))
    {
        tracing::warn!(saga = %Escaped(saga), "a saga's copy of a message it tries again, but this endpoint \
            runs no such saga (any more): completed without running a handler");
    }
    if let Some(store) = &shared.store {
        let now = shared.clock.now();
        // A duplicate's begin reads the outbox rows its handling left.
        let read = shared.outbox.read();
        let begun = match seat {
            Some(seat) => seat.begin(lock, now).await,
            None => store.begin(&shared.name, ctx.message_id(), lock, now).await,
        };
        match begun {
            Err(e) => return Err(Failure::Store(e)),
            Ok(Begin::Duplicate(left)) => {
                // Rows this process took already (being sent, or sent and waiting to be
                // deleted): not again.
                let left = shared.outbox.take_read(read, left, |m| m.id);
                return Ok(Done::Duplicate(left));
            }
            Ok(Begin::Fresh(work)) => ctx.set_unit_of_work(work),
        }
    }
    for h in handlers {
        if let Some(saga) = &retried_by
            && h.saga() != Some(saga.as_str())
        {
            continue;
        }
        match CatchUnwind(h.call(ctx)).await {
            Ok(Ok(())) => {}
            Ok(Err(f)) => return Err(f.with_refusals(ctx)),
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
        Some(work) => commit(shared, ctx, work, outgoing).await,
        None => Ok(Done::Handled(outgoing)),
    }
}

/// The outbox: what the handlers sent commits with their writes, the inbox record and
/// the saga state; then the timeouts, metrics and the observer learn of it.
pub(super) async fn commit(
    shared: &Shared,
    ctx: &mut Context,
    mut work: Box<dyn UnitOfWork>,
    outgoing: Vec<Outgoing>,
) -> Result<Done, Failure> {
    let rows: Vec<_> = outgoing
        .into_iter()
        .map(|o| (o.destination, o.is_topic, o.envelope))
        .collect();
    let observed = shared.observer.as_ref().map(|_| rows.clone());
    let destinations: Vec<String> = rows.iter().map(|(d, _, _)| d.clone()).collect();
    let sent: Vec<String> = rows.iter().map(|(d, t, e)| name_outgoing(d, *t, e)).collect();
    let queues: Vec<String> = rows
        .iter()
        .filter(|(_, is_topic, _)| !is_topic)
        .map(|(d, _, _)| d.clone())
        .collect();
    // A store that sends in its transaction (the embedded broker's own file, the Postgres
    // transport's store) fails with the transport's finding no queue the handlers sent to
    // (a send's failure, retried), or its refusal of a message (for good, naming what was
    // sent).
    let failure = |error: crate::error::Error| {
        if bus::missing_destination(&error).is_some_and(|p| queues.iter().any(|q| q == p)) {
            Failure::Dispatch(error)
        } else if bus::refused_for_good(&error) {
            Failure::RefusedAtCommit {
                description: describe_sent(&sent),
                error: Box::new(error),
            }
        } else {
            Failure::Store(error)
        }
    };
    let sagas = ctx.take_observed();
    if let Some(recorder) = &shared.history {
        let attempt = Attempt {
            number: ctx.attempt(),
            received_at: Some(ctx.started_at()),
            at: shared.clock.now(),
        };
        let event = recorder.handled(ctx.received(), attempt, &rows, &sagas);
        work.record_history(&event).await.map_err(Failure::Store)?;
    }
    let stored = work.store_outgoing(rows, shared.clock.now()).await.map_err(failure)?;
    let committed = work.commit().await;
    ctx.release_held();
    let committed = committed.map_err(failure)?;
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
            sagas,
        });
    }
    Ok(match committed {
        Committed::Pending => Done::Committed(stored),
        Committed::Stored(stored) => Done::Committed(stored),
        Committed::Settled => Done::Settled,
    })
}

/// What the delivery needs after its handling.
enum Next {
    /// Its messages are sent: complete it.
    Complete,
    /// Nothing more: completed in the store's transaction, or left to come back.
    Done,
    /// To be retried or dead-lettered (`failures.rs`).
    Fail(Failure),
}

/// After the handling: dispatch what it sent (or what a duplicate's handling left) and
/// say whether the delivery is to be completed.
async fn settle(
    shared: &Shared,
    delivery: &Delivery,
    metrics: &TypeMetrics,
    outcome: Result<Done, Failure>,
    tried: Tried,
) -> Next {
    let dispatched = match outcome {
        Ok(Done::Settled) => {
            shared.stats.completed.fetch_add(1, Ordering::Relaxed);
            metrics.handled(delivery.message().broker.enqueued_time, shared.clock.now());
            tracing::debug!("message handled, its messages sent and itself completed in one transaction");
            return Next::Done;
        }
        Err(Failure::Store(e)) if e.is_lock_lost() => {
            tracing::warn!(
                error = %e,
                "lock lost before the transaction committed; it rolled back and the message will be delivered again"
            );
            return Next::Done;
        }
        Ok(Done::Handled(outgoing)) => shared.bus.dispatch_created(outgoing).await.map_err(Failure::Dispatch),
        Ok(Done::Committed(stored)) => {
            let count = stored.len();
            let stored = shared.outbox.take_stored(stored, |m| m.id);
            dispatch_stored(shared, stored)
                .await
                .map_err(|error| Failure::Undispatched { count, error })
        }
        Ok(Done::Duplicate(left)) => {
            let message = delivery.message();
            super::failures::record_history(shared, tried, |r, attempt| r.duplicate(message, attempt)).await;
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
        Ok(()) => Next::Complete,
        Err(f) => Next::Fail(f),
    }
}
/// How the handling of one message ended, before dispatch and completion.
pub(super) enum Done {
    /// No store: the messages the handlers sent.
    Handled(Vec<Outgoing>),
    /// The store committed; the stored messages are to be dispatched.
    Committed(Vec<OutboxMessage>),
    /// Processed before; what its handling stored and did not dispatch.
    Duplicate(Vec<OutboxMessage>),
    /// The store's transaction also sent the messages and completed the received one.
    Settled,
}

pub(super) async fn complete(shared: &Shared, delivery: Delivery) {
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

/// A future that turns a panic while polling into an error.
pub(super) struct CatchUnwind<F>(pub(super) F);

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

pub(super) fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_owned()
    }
}
