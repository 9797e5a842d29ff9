//! Batch handlers, the handler's side: [`Batch`] (the messages of one call),
//! [`BatchContext`] (what a call can do: write in the store's transaction, send,
//! publish), the [`BatchHandler`] trait that `#[courier::handler]` implements for an
//! `async fn(batch: Batch<T>, ctx: &mut BatchContext)`, its [`BatchOptions`] and
//! [`EndpointBuilder::batch_handler`]. How the messages are collected and handled is in
//! `runtime/batcher.rs`; docs/endpoints.md, "Batch handlers", says what is promised.

use std::any::{Any, TypeId};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::context::Context;
use super::handler::{BoxFuture, Declared, HandlerError, Message};
use super::registry::Registration;
use super::{EndpointBuilder, Failure, otel};
use crate::clock::Clock;
use crate::endpoint::bus::SendOptions;
use crate::error::{Error, ErrorKind, Result};
use crate::message::ReceivedMessage;

/// The messages of one call of a batch handler: at most the handler's
/// [`max_messages`](BatchOptions::max_messages), in the order they were received, each
/// with the message as it arrived ([`received`](Self::received)).
#[derive(Debug)]
pub struct Batch<T> {
    messages: Vec<T>,
    received: Vec<ReceivedMessage>,
}

impl<T> Batch<T> {
    pub(crate) fn of(messages: Vec<T>, received: Vec<ReceivedMessage>) -> Self {
        Batch { messages, received }
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    /// Whether there are none (never, for a batch the endpoint hands over).
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The messages.
    pub fn messages(&self) -> &[T] {
        &self.messages
    }

    /// The messages as they arrived (ids, headers, enqueued times, delivery counts), in
    /// the order of [`messages`](Self::messages).
    pub fn received(&self) -> &[ReceivedMessage] {
        &self.received
    }

    /// Each message with the message as it arrived.
    pub fn iter(&self) -> impl Iterator<Item = (&T, &ReceivedMessage)> {
        self.messages.iter().zip(&self.received)
    }

    /// The messages, owned.
    pub fn into_messages(self) -> Vec<T> {
        self.messages
    }
}

impl<T> IntoIterator for Batch<T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.messages.into_iter()
    }
}

/// What a batch handler's call can do: write in the store's transaction (which also
/// records every message of the batch in the inbox), send and publish (the messages
/// leave only if the call succeeds and its transaction commits), read the endpoint's
/// state and clock.
///
/// A message sent from a batch has the batch's first message as its cause (its
/// causation id and, unless the first message had none, its correlation id).
pub struct BatchContext {
    pub(crate) inner: Context,
}

impl std::fmt::Debug for BatchContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchContext")
            .field("endpoint", &self.inner.endpoint())
            .finish_non_exhaustive()
    }
}

impl BatchContext {
    /// The endpoint's name.
    pub fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    /// The connection of the store's transaction (`sqlx::Sqlite` or `sqlx::Postgres`),
    /// as [`Context::transaction`]: the batch's writes commit with the inbox records of
    /// all its messages and what it sends, or not at all. Write the batch's rows with one
    /// statement (a multi-row `INSERT`, or `unnest` on Postgres) rather than one each.
    ///
    /// # Errors
    /// A [`HandlerError`] when the endpoint has no store, or a store of another database.
    pub fn transaction<DB: sqlx::Database>(&mut self) -> Result<&mut DB::Connection, HandlerError> {
        self.inner.transaction::<DB>()
    }

    /// A value given to the endpoint with [`EndpointBuilder::state`].
    ///
    /// # Errors
    /// As [`Context::state`].
    pub fn state<T: Send + Sync + 'static>(&self) -> Result<&T, HandlerError> {
        self.inner.state::<T>()
    }

    /// The endpoint's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        self.inner.clock()
    }

    /// The time by the endpoint's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.inner.clock().now()
    }

    /// Fired when the endpoint's shutdown deadline passed, or a lock of the batch was
    /// lost: the call's outcome will not be committed.
    pub fn cancellation(&self) -> &CancellationToken {
        self.inner.cancellation()
    }

    /// Sends a command to its routed queue if the call succeeds (as [`Context::send`]).
    ///
    /// # Errors
    /// As [`Context::send`].
    pub fn send<M: Message>(&mut self, message: &M) -> Result<()> {
        self.inner.send(message)
    }

    /// Sends with options (as [`Context::send_with`]).
    ///
    /// # Errors
    /// As [`Context::send_with`].
    pub fn send_with<M: Message>(&mut self, message: &M, options: SendOptions) -> Result<()> {
        self.inner.send_with(message, options)
    }

    /// Sends, delivered at `at` (as [`Context::send_at`]).
    ///
    /// # Errors
    /// As [`Context::send_at`].
    pub fn send_at<M: Message>(&mut self, message: &M, at: DateTime<Utc>) -> Result<()> {
        self.inner.send_at(message, at)
    }

    /// Publishes an event if the call succeeds (as [`Context::publish`]).
    ///
    /// # Errors
    /// As [`Context::publish`].
    pub fn publish<M: Message>(&mut self, message: &M) -> Result<()> {
        self.inner.publish(message)
    }

    /// Publishes with options (as [`Context::publish_with`]).
    ///
    /// # Errors
    /// As [`Context::publish_with`].
    pub fn publish_with<M: Message>(&mut self, message: &M, options: SendOptions) -> Result<()> {
        self.inner.publish_with(message, options)
    }

    /// How many messages the call has sent and published so far.
    pub fn pending_messages(&self) -> usize {
        self.inner.pending_messages()
    }
}

/// A handler of batches of one message type. `#[courier::handler]` implements it for an
/// `async fn(batch: Batch<T>, ctx: &mut BatchContext) -> Result<(), E>`; register it with
/// [`EndpointBuilder::batch_handler`].
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a Courier batch handler",
    note = "put `#[courier::handler]` on an `async fn(batch: courier::Batch<T>, ctx: &mut courier::BatchContext) -> Result<(), E>`"
)]
pub trait BatchHandler: Send + Sync + 'static {
    /// The message type handled.
    type Message: Message;

    /// The handler's name in logs and in the failure details of a dead-lettered message.
    fn name(&self) -> &'static str;

    /// Handles a batch.
    fn handle<'a>(
        &'a self,
        batch: Batch<Self::Message>,
        ctx: &'a mut BatchContext,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;

    /// The message types the handler sends and publishes (as [`Handler::declared`](crate::Handler::declared)).
    fn declared(&self) -> Declared {
        Declared::default()
    }
}

/// How a batch handler's batches are formed and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOptions {
    pub(crate) max_messages: usize,
    pub(crate) max_wait: Duration,
    pub(crate) concurrency: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        BatchOptions {
            max_messages: 100,
            max_wait: Duration::from_millis(200),
            concurrency: 1,
        }
    }
}

impl BatchOptions {
    /// 100 messages at most, 200 ms at most from the first, one batch at a time.
    pub fn new() -> Self {
        Self::default()
    }

    /// The most messages of one call (1 to 10,000; default 100). A batch is handed over
    /// as soon as it has them.
    #[must_use]
    pub fn max_messages(mut self, n: usize) -> Self {
        self.max_messages = n;
        self
    }

    /// The longest a batch waits for more messages, from its first one's arrival
    /// (default 200 ms; at most 10 minutes): then it is handed over with what it has.
    #[must_use]
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// How many batches of this handler run at once (default 1).
    #[must_use]
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    pub(crate) fn validate(&self, handler: &str) -> std::result::Result<(), String> {
        if !(1..=10_000).contains(&self.max_messages) {
            return Err(format!(
                "batch handler {handler}: max_messages is {}; give 1 to 10000",
                self.max_messages
            ));
        }
        if self.max_wait > Duration::from_secs(600) {
            return Err(format!(
                "batch handler {handler}: max_wait is {:?}; give at most 10 minutes (the messages' locks run while \
                 they wait)",
                self.max_wait
            ));
        }
        if self.concurrency == 0 {
            return Err(format!("batch handler {handler}: concurrency must be at least 1"));
        }
        Ok(())
    }

    /// How many messages the handler's batches hold at most at once.
    pub(crate) fn holding(&self) -> usize {
        self.max_messages.saturating_mul(self.concurrency.saturating_add(1))
    }
}

/// A batch handler with its message type erased.
pub(crate) trait ErasedBatch: Send + Sync {
    fn name(&self) -> &'static str;
    fn options(&self) -> BatchOptions;
    /// Decodes one message of the batch (a failure is that message's alone).
    fn decode(&self, received: &ReceivedMessage) -> Result<Box<dyn Any + Send>, Failure>;
    /// Calls the handler with messages [`decode`](Self::decode) made.
    fn call<'a>(
        &'a self,
        decoded: Vec<Box<dyn Any + Send>>,
        received: Vec<ReceivedMessage>,
        ctx: &'a mut BatchContext,
    ) -> BoxFuture<'a, Result<(), Failure>>;
}

struct ErasedBatchHandler<H> {
    handler: H,
    options: BatchOptions,
}

impl<H: BatchHandler> ErasedBatch for ErasedBatchHandler<H> {
    fn name(&self) -> &'static str {
        self.handler.name()
    }

    fn options(&self) -> BatchOptions {
        self.options
    }

    fn decode(&self, received: &ReceivedMessage) -> Result<Box<dyn Any + Send>, Failure> {
        let message = super::version::decode_message::<H::Message>(&received.envelope)?;
        Ok(Box::new(message))
    }

    fn call<'a>(
        &'a self,
        decoded: Vec<Box<dyn Any + Send>>,
        received: Vec<ReceivedMessage>,
        ctx: &'a mut BatchContext,
    ) -> BoxFuture<'a, Result<(), Failure>> {
        let span = otel::handle_span(self.handler.name(), <H::Message as Message>::NAME);
        Box::pin(otel::in_span(span, async move {
            let name = self.handler.name();
            let messages: Vec<H::Message> = decoded
                .into_iter()
                .filter_map(|m| m.downcast::<H::Message>().ok().map(|b| *b))
                .collect();
            let batch = Batch::of(messages, received);
            self.handler
                .handle(batch, ctx)
                .await
                .map_err(|error| Failure::Handler { handler: name, error })
        }))
    }
}

impl EndpointBuilder {
    /// Adds a batch handler: the messages of its type are handed to it in batches of up
    /// to [`BatchOptions::max_messages`], each batch one call and ONE transaction of the
    /// store (every message's inbox record, the handler's writes, what it sends, and on
    /// the broker's own database the completion of every message).
    ///
    /// A batch that fails is not retried as a whole: its messages are handled again one
    /// by one (a batch of one each, in its own transaction), so a message that fails
    /// alone is retried and dead-lettered under the endpoint's policy with its own
    /// reason, and the others succeed. A message type with a batch handler has no other
    /// handler, and an endpoint on a session queue refuses batch handlers at
    /// [`start`](Self::start). The endpoint's concurrency is raised to hold its batches
    /// (each waiting message takes a slot). See docs/endpoints.md, "Batch handlers".
    pub fn batch_handler<H: BatchHandler>(mut self, handler: H, options: BatchOptions) -> Self {
        if let Err(e) = options.validate(handler.name()) {
            self.errors.push(e);
        }
        self.declared.push((handler.name(), handler.declared()));
        self.batch_holding = self.batch_holding.saturating_add(options.holding());
        self.batch_max_wait = self.batch_max_wait.max(options.max_wait);
        let erased: Arc<dyn ErasedBatch> = Arc::new(ErasedBatchHandler { handler, options });
        self.registrations.push(Registration {
            type_id: TypeId::of::<H::Message>(),
            type_name: std::any::type_name::<H::Message>(),
            name: <H::Message as Message>::NAME,
            aliases: <H::Message as Message>::ALIASES,
            handler: super::registry::Handling::Batch(erased),
        });
        self
    }
}

/// What an endpoint with batch handlers refuses at start: a `max_wait` the messages'
/// locks would not outlast, a session queue (a batch would
/// mix sessions, or hold one session's messages while the next waits), a group commit
/// (a batch is already one transaction), and a store that cannot begin a batch.
pub(crate) async fn check_start(
    endpoint: &str,
    queue: &crate::entity::QueueOptions,
    max_wait: Duration,
    group_commit: usize,
    store: Option<&dyn crate::store::Store>,
) -> Result<()> {
    let invalid = |reason: String| Err(Error::new(ErrorKind::InvalidOptions { reason }));
    if max_wait.saturating_mul(2) >= queue.lock_duration {
        return invalid(format!(
            "endpoint {endpoint} has a batch handler whose max_wait ({max_wait:?}) is half its queue's lock duration \
             ({:?}) or more: the messages waiting for their batch would lose their locks and come back; shorten \
             max_wait, or lengthen QueueOptions::lock_duration",
            queue.lock_duration
        ));
    }
    if queue.requires_session {
        return invalid(format!(
            "endpoint {endpoint} has batch handlers and requires sessions: a batch would take messages of several \
             sessions, or the next message of a session before the previous one committed; handle a session \
             queue's messages one at a time (#[courier::handler] on a function of one message), or give the \
             batch handler an endpoint of its own without sessions"
        ));
    }
    if group_commit > 1 {
        return invalid(format!(
            "endpoint {endpoint} has batch handlers and group_commit({group_commit}): a batch is already one \
             transaction; use group_commit(1), or put the batch handler on an endpoint of its own"
        ));
    }
    if let Some(store) = store {
        store
            .begin_batch(endpoint, Vec::new(), chrono::Utc::now())
            .await
            .map(|_| ())?;
    }
    Ok(())
}
