//! The [`Context`] a handler gets with its message.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::endpoint::bus::{Bus, Intent, Outgoing, Parent, SendOptions, describe_refusal, prepare};
use crate::endpoint::handler::{HandlerError, Message};
use crate::endpoint::otel;
use crate::endpoint::trace::TraceContext;
use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::{Properties, PropertyValue, ReceivedMessage, SequenceNumber};
use crate::store::UnitOfWork;

/// Values shared by every handler of an endpoint, by type (a database pool, a client).
#[derive(Default)]
pub(crate) struct Extensions {
    map: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl Extensions {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: T) {
        self.map.insert(TypeId::of::<T>(), Arc::new(value));
    }
    pub(crate) fn get<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.map.get(&TypeId::of::<T>())?.downcast_ref::<T>()
    }
}

/// What a handler knows about the message it handles, and how it sends more.
///
/// Messages sent, published or scheduled through the context are collected and leave
/// only once every handler of the message succeeded; if a handler fails they are
/// discarded with the attempt. Each carries the handled message's correlation id (or,
/// when it had none, its message id) and the handled message's id as causation id, and
/// continues its W3C trace.
pub struct Context {
    endpoint: Arc<str>,
    message: ReceivedMessage,
    attempt: u32,
    delayed_retries: u32,
    bus: Bus,
    clock: Arc<dyn Clock>,
    cancel: CancellationToken,
    trace: TraceContext,
    extensions: Arc<Extensions>,
    outgoing: Vec<Outgoing>,
    unit_of_work: Option<Box<dyn UnitOfWork>>,
    /// The earliest saga timeout stored in this handling.
    timeout_due: Option<DateTime<Utc>>,
    /// Held until the transaction ends (saga instance locks). Declared after the unit of
    /// work: on a failure the transaction is dropped (rolled back) first.
    held: Vec<Box<dyn Any + Send>>,
    /// What saga handlers did, collected only when the endpoint has an observer.
    observed: Option<Vec<crate::endpoint::observe::SagaEffects>>,
    /// When the handling began (the endpoint's clock).
    started_at: chrono::DateTime<chrono::Utc>,
    /// What saga handlers did, for the metrics once the handling commits.
    saga_tally: Vec<crate::endpoint::metrics::SagaTally>,
    /// Who holds the saga instance locks this handling takes.
    lock_owner: crate::endpoint::sagas::LockOwner,
    /// Checks that a saga timeout's message is the dispatcher's (`None`: the store keeps
    /// no secret).
    timeout_seal: Option<Arc<crate::endpoint::timeout_seal::TimeoutSeal>>,
    /// Outgoing messages the transport refused when they were sent: the tracking id of
    /// the error returned, and the description of the refused message.
    refused: Vec<(uuid::Uuid, String)>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("endpoint", &self.endpoint)
            .field("message_id", &self.message.envelope.message_id)
            .field("attempt", &self.attempt)
            .field("outgoing", &self.outgoing.len())
            .finish()
    }
}

/// Everything a context is made of.
pub(crate) struct ContextParts {
    pub(crate) endpoint: Arc<str>,
    pub(crate) message: ReceivedMessage,
    pub(crate) attempt: u32,
    pub(crate) delayed_retries: u32,
    pub(crate) bus: Bus,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) cancel: CancellationToken,
    pub(crate) trace: TraceContext,
    pub(crate) extensions: Arc<Extensions>,
    /// Whether an observer wants the saga effects of this handling.
    pub(crate) observing: bool,
    /// Who holds the saga instance locks this handling takes (its commit group, or itself).
    pub(crate) lock_owner: crate::endpoint::sagas::LockOwner,
    /// Checks that a saga timeout's message is the dispatcher's (`None`: no store, or one
    /// that keeps no secret).
    pub(crate) timeout_seal: Option<Arc<crate::endpoint::timeout_seal::TimeoutSeal>>,
}

impl Context {
    pub(crate) fn new(parts: ContextParts) -> Self {
        Self {
            started_at: parts.clock.now(),
            endpoint: parts.endpoint,
            message: parts.message,
            attempt: parts.attempt,
            delayed_retries: parts.delayed_retries,
            bus: parts.bus,
            clock: parts.clock,
            cancel: parts.cancel,
            trace: parts.trace,
            extensions: parts.extensions,
            outgoing: Vec::new(),
            unit_of_work: None,
            timeout_due: None,
            held: Vec::new(),
            observed: parts.observing.then(Vec::new),
            saga_tally: Vec::new(),
            lock_owner: parts.lock_owner,
            timeout_seal: parts.timeout_seal,
            refused: Vec::new(),
        }
    }

    /// The description of the refused outgoing message whose error `error` is, or has
    /// among its causes (a handler that returned what `send` gave it, with `?` or
    /// wrapped in its own error type).
    pub(crate) fn refusal_of(&self, error: &HandlerError) -> Option<&str> {
        if self.refused.is_empty() {
            return None;
        }
        let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.source());
        while let Some(e) = next {
            if let Some(courier) = e.downcast_ref::<Error>()
                && let Some((_, description)) = self.refused.iter().find(|(id, _)| *id == courier.tracking_id())
            {
                return Some(description);
            }
            next = e.source();
        }
        None
    }

    /// Who holds the saga instance locks this handling takes.
    /// The key that checks a saga timeout's seal (`None`: the store keeps no secret).
    pub(crate) fn timeout_seal(&self) -> Option<&crate::endpoint::timeout_seal::TimeoutSeal> {
        self.timeout_seal.as_deref()
    }

    pub(crate) fn lock_owner(&self) -> crate::endpoint::sagas::LockOwner {
        self.lock_owner
    }

    /// Records what a saga handler did, when the endpoint has an observer.
    /// When the handling began (the endpoint's clock).
    pub(crate) fn started_at(&self) -> chrono::DateTime<chrono::Utc> {
        self.started_at
    }

    /// Whether an observer or the history collects what the sagas did.
    pub(crate) fn is_observing(&self) -> bool {
        self.observed.is_some()
    }

    pub(crate) fn observe_saga(&mut self, effects: impl FnOnce() -> crate::endpoint::observe::SagaEffects) {
        if let Some(observed) = &mut self.observed {
            observed.push(effects());
        }
    }

    pub(crate) fn take_observed(&mut self) -> Vec<crate::endpoint::observe::SagaEffects> {
        self.observed.take().unwrap_or_default()
    }

    /// Records what a saga handler did, for the metrics.
    pub(crate) fn tally_saga(&mut self, tally: crate::endpoint::metrics::SagaTally) {
        self.saga_tally.push(tally);
    }

    pub(crate) fn take_saga_tally(&mut self) -> Vec<crate::endpoint::metrics::SagaTally> {
        std::mem::take(&mut self.saga_tally)
    }

    /// The endpoint's name, shared.
    pub(crate) fn endpoint_name(&self) -> Arc<str> {
        self.endpoint.clone()
    }

    /// Keeps `guard` until the message's transaction has ended.
    pub(crate) fn hold_until_commit(&mut self, guard: Box<dyn Any + Send>) {
        self.held.push(guard);
    }

    /// Takes the header `name` off the message the handlers see (`header`, `headers`,
    /// `received`); the broker's copy, which a retry or a dead letter keeps, is not this.
    pub(crate) fn hide_header(&mut self, name: &str) {
        self.message.envelope.properties.remove(name);
    }

    /// The transaction ended: lets go of what was held for it.
    pub(crate) fn release_held(&mut self) {
        self.held.clear();
    }

    pub(crate) fn unit_of_work_mut(&mut self) -> Option<&mut Box<dyn UnitOfWork>> {
        self.unit_of_work.as_mut()
    }

    /// A saga stored a timeout due at `due` in this handling.
    pub(crate) fn note_timeout(&mut self, due: DateTime<Utc>) {
        self.timeout_due = Some(self.timeout_due.map_or(due, |t| t.min(due)));
    }

    pub(crate) fn take_timeout_due(&mut self) -> Option<DateTime<Utc>> {
        self.timeout_due.take()
    }

    /// Encodes `message` addressed to this endpoint's own queue with message id `id`, as
    /// a message sent by this handler (correlation, causation, trace).
    pub(crate) fn prepare_to_self<M: Message>(&self, message: &M, id: &str) -> Result<crate::message::Envelope> {
        let parent = Parent {
            message_id: self.message.envelope.message_id.clone(),
            correlation_id: self.message.envelope.correlation_id.clone(),
            trace: self.trace,
        };
        let options = SendOptions::default().to(self.endpoint.to_string()).message_id(id);
        let mut out = prepare(
            self.bus.routes(),
            &*self.clock,
            Intent::Send,
            message,
            options,
            Some(&parent),
        )?;
        let _created = otel::producer(&mut out, self.bus.transport().name(), otel::Operation::Create);
        Ok(out.envelope)
    }

    /// Sends `envelope`, a copy of a received message made ready to come back (a saga's
    /// try again later of a message that found no instance), to this endpoint's own queue
    /// when the handling commits, as a message this handler sent (its trace).
    ///
    /// # Errors
    /// The transport's refusal of the message.
    pub(crate) fn send_copy_to_self(&mut self, mut envelope: crate::message::Envelope) -> Result<()> {
        envelope.properties.insert(
            crate::endpoint::trace::TRACEPARENT.to_owned(),
            PropertyValue::String(self.trace.to_string()),
        );
        let mut out = Outgoing {
            destination: self.endpoint.to_string(),
            is_topic: false,
            envelope,
        };
        let _created = otel::producer(&mut out, self.bus.transport().name(), otel::Operation::Create);
        self.bus.check(&out)?;
        self.outgoing.push(out);
        Ok(())
    }

    pub(crate) fn set_unit_of_work(&mut self, work: Box<dyn UnitOfWork>) {
        self.unit_of_work = Some(work);
    }

    pub(crate) fn take_unit_of_work(&mut self) -> Option<Box<dyn UnitOfWork>> {
        self.unit_of_work.take()
    }

    /// The connection of the store's transaction, for the handler's own writes
    /// (`sqlx::Sqlite` or `sqlx::Postgres`): they commit together with the inbox record of
    /// this message and the messages the handler sends, or not at all. The transaction is
    /// the endpoint's: do not commit or roll it back (a handler fails by returning an
    /// error, which rolls everything back). On SQLite it is a transaction begun with
    /// `BEGIN IMMEDIATE` by a statement, not by sqlx: sqlx's `begin()` on it is refused
    /// (a transaction is open); for a part that may fail on its own, write `SAVEPOINT`
    /// and `ROLLBACK TO` yourself. On Postgres, `begin()` on it makes a savepoint.
    ///
    /// ```no_run
    /// # use courier::{Context, HandlerError};
    /// async fn record_order(ctx: &mut Context, id: &str) -> Result<(), HandlerError> {
    ///     let tx = ctx.transaction::<sqlx::Sqlite>()?; // sqlx::Postgres with a PostgresStore
    ///     sqlx::query("INSERT INTO orders (id) VALUES (?1)").bind(id).execute(&mut *tx).await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// A [`HandlerError`] when the endpoint has no store, or a store of another database.
    pub fn transaction<DB: sqlx::Database>(&mut self) -> Result<&mut DB::Connection, HandlerError> {
        let endpoint = self.endpoint.clone();
        let Some(work) = self.unit_of_work.as_mut() else {
            return Err(HandlerError::msg(format!(
                "endpoint {endpoint} has no store: add EndpointBuilder::store to use transactions"
            )));
        };
        work.transaction()
            .and_then(|c| c.downcast_mut::<DB::Connection>())
            .ok_or_else(|| {
                HandlerError::msg(format!(
                    "the store of endpoint {endpoint} is not a {} database",
                    std::any::type_name::<DB>()
                ))
            })
    }

    pub(crate) fn take_outgoing(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.outgoing)
    }

    /// The endpoint handling the message.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The message id (kept through every redelivery and retry).
    pub fn message_id(&self) -> &str {
        &self.message.envelope.message_id
    }

    /// The correlation id, if the sender set one.
    pub fn correlation_id(&self) -> Option<&str> {
        self.message.envelope.correlation_id.as_deref()
    }

    /// The id of the message whose handling sent this one.
    pub fn causation_id(&self) -> Option<&str> {
        self.message.envelope.causation_id.as_deref()
    }

    /// The wire name of the message type.
    pub fn message_type(&self) -> Option<&str> {
        self.message.envelope.message_type.as_deref()
    }

    /// The broker's sequence number.
    pub fn sequence_number(&self) -> SequenceNumber {
        self.message.broker.sequence_number
    }

    /// When the broker enqueued the message (for a delayed retry: when the retry was
    /// enqueued).
    pub fn enqueued_time(&self) -> DateTime<Utc> {
        self.message.broker.enqueued_time
    }

    /// How many times the broker has delivered this copy of the message.
    pub fn delivery_count(&self) -> u32 {
        self.message.broker.delivery_count
    }

    /// Which attempt this is, counting every immediate and delayed retry (1 on the
    /// first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// How many delayed retries came before this attempt: the message's
    /// `courier.retry.delayed`, on an endpoint with a store only when it carries the seal
    /// this endpoint wrote (0 otherwise; see `docs/endpoints.md`, "Recoverability").
    pub fn delayed_retries(&self) -> u32 {
        self.delayed_retries
    }

    /// The message's headers (application properties).
    pub fn headers(&self) -> &Properties {
        &self.message.envelope.properties
    }

    /// One header.
    pub fn header(&self, key: &str) -> Option<&PropertyValue> {
        self.message.envelope.properties.get(key)
    }

    /// Where the sender wants replies.
    pub fn reply_to(&self) -> Option<&str> {
        self.message.envelope.reply_to.as_deref()
    }

    /// The whole received message.
    pub fn received(&self) -> &ReceivedMessage {
        &self.message
    }

    /// The trace position of this handling: its span id is the parent of what it sends.
    /// With the feature `opentelemetry` and a `tracing-opentelemetry` layer, it is the
    /// position of the handling's OpenTelemetry `process` span (what it sends has a
    /// `create` span of its own under the handler's span).
    pub fn trace(&self) -> TraceContext {
        self.trace
    }

    /// Fires when the handler should stop: the endpoint's shutdown deadline passed, or
    /// the message lock was lost (its outcome will not count).
    pub fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Whether [`cancellation`](Self::cancellation) has fired.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// The clock of the endpoint (virtual in tests).
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// A value given to the endpoint with
    /// [`EndpointBuilder::state`](crate::EndpointBuilder::state).
    ///
    /// # Errors
    /// A [`HandlerError`] naming the type and the endpoint when no value of type `T` was
    /// given (a configuration mistake: the message is retried and, if nobody fixes it,
    /// dead-lettered with this text).
    pub fn state<T: Send + Sync + 'static>(&self) -> Result<&T, HandlerError> {
        self.extensions.get::<T>().ok_or_else(|| {
            HandlerError::msg(format!(
                "endpoint {} was given no state of type {}: add EndpointBuilder::state",
                self.endpoint,
                std::any::type_name::<T>()
            ))
        })
    }

    fn push<M: Message>(&mut self, intent: Intent, message: &M, options: SendOptions) -> Result<()> {
        let parent = Parent {
            message_id: self.message.envelope.message_id.clone(),
            correlation_id: self.message.envelope.correlation_id.clone(),
            trace: self.trace,
        };
        let mut out = match prepare(self.bus.routes(), &*self.clock, intent, message, options, Some(&parent)) {
            Ok(out) => out,
            Err(e) => {
                // No route, a destination name no transport accepts, or no encoding
                // will not change on a retry: a handler that returns this error fails
                // for good, as for a refused message.
                if matches!(
                    e.kind(),
                    ErrorKind::NoRoute { .. } | ErrorKind::InvalidMessage { .. } | ErrorKind::InvalidEntityName { .. }
                ) {
                    let description = format!("outgoing message {} cannot be sent: {}", M::NAME, e.kind());
                    tracing::warn!(error = %e, "{}", Escaped(&description));
                    self.refused.push((e.tracking_id(), description));
                }
                return Err(e);
            }
        };
        let _created = otel::producer(&mut out, self.bus.transport().name(), otel::Operation::Create);
        if let Err(e) = self.bus.check(&out) {
            let description = describe_refusal(&out.destination, out.is_topic, &out.envelope, &e);
            tracing::warn!(error = %e, "{}", Escaped(&description));
            self.refused.push((e.tracking_id(), description));
            return Err(e);
        }
        self.outgoing.push(out);
        Ok(())
    }

    /// Sends a command to its routed queue when the handler succeeds.
    ///
    /// The message is checked at once against what the transport refuses whatever the
    /// destination (size, ids and fields, reserved headers, time-to-live, scheduled time:
    /// [`Transport::check_message`](crate::Transport::check_message)). A handler that
    /// returns that error (with `?`, or as the cause of its own) fails permanently: the
    /// handled message is dead-lettered at once with the reason
    /// [`INVALID_OUTGOING_MESSAGE`](crate::recoverability::reasons::INVALID_OUTGOING_MESSAGE)
    /// and a description naming the outgoing message, and nothing of the attempt is
    /// committed or sent. A handler may also handle the error and send something else.
    ///
    /// # Errors
    /// [`ErrorKind::NoRoute`], a destination no transport accepts
    /// ([`ErrorKind::InvalidEntityName`]) or an encoding error
    /// ([`ErrorKind::InvalidMessage`]), which fail the handler permanently as a refusal
    /// does; the transport's refusal ([`ErrorKind::MessageTooLarge`], [`ErrorKind::InvalidMessage`],
    /// [`ErrorKind::InvalidScheduleTime`], [`ErrorKind::Unsupported`]).
    pub fn send<M: Message>(&mut self, message: &M) -> Result<()> {
        self.push(Intent::Send, message, SendOptions::default())
    }

    /// Sends a command with options when the handler succeeds.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_with<M: Message>(&mut self, message: &M, options: SendOptions) -> Result<()> {
        self.push(Intent::Send, message, options)
    }

    /// Sends a command that is delivered at `at`.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_at<M: Message>(&mut self, message: &M, at: DateTime<Utc>) -> Result<()> {
        self.push(Intent::Send, message, SendOptions::default().deliver_at(at))
    }

    /// Sends a command that is delivered after `delay`.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub fn send_after<M: Message>(&mut self, message: &M, delay: Duration) -> Result<()> {
        self.push(Intent::Send, message, SendOptions::default().deliver_after(delay))
    }

    /// Publishes an event when the handler succeeds.
    ///
    /// # Errors
    /// [`ErrorKind::NoRoute`] if the type is not declared as an event.
    pub fn publish<M: Message>(&mut self, message: &M) -> Result<()> {
        self.push(Intent::Publish, message, SendOptions::default())
    }

    /// Publishes an event with options when the handler succeeds.
    ///
    /// # Errors
    /// As [`publish`](Self::publish).
    pub fn publish_with<M: Message>(&mut self, message: &M, options: SendOptions) -> Result<()> {
        self.push(Intent::Publish, message, options)
    }

    /// Sends a reply to the handled message's `reply_to` queue when the handler succeeds.
    ///
    /// # Errors
    /// [`ErrorKind::NoRoute`] if the message has no reply-to address.
    pub fn reply<M: Message>(&mut self, message: &M) -> Result<()> {
        let Some(to) = self.message.envelope.reply_to.clone() else {
            return Err(Error::new(ErrorKind::NoRoute {
                message_type: M::NAME.to_owned(),
                reason: "the handled message has no reply-to address".into(),
            }));
        };
        self.push(Intent::Send, message, SendOptions::default().to(to))
    }

    /// How many messages wait to leave when the handler succeeds.
    pub fn pending_messages(&self) -> usize {
        self.outgoing.len()
    }
}
