//! Sagas: long-running workflows with persisted state and cancellable timeouts.
//!
//! A saga is a state type (serde, `Default`) and handlers of the messages that start or
//! continue it. Each handled message says how it finds its instance (a field of the
//! message, or a header): its **correlation**. `#[courier::saga]` implements [`Saga`] for
//! an impl block of the state type; it can also be implemented by hand:
//!
//! ```
//! use courier::saga::{Correlate, Saga, SagaContext, SagaHandlers};
//! use courier::{BoxFuture, HandlerError};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize, courier::Message)]
//! # struct Registered { user: String }
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct SignUp { registered: bool }
//!
//! impl SignUp {
//!     async fn registered(&mut self, _msg: Registered, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         self.registered = true;
//!         Ok(())
//!     }
//! }
//!
//! impl Saga for SignUp {
//!     const NAME: &'static str = "accounts.SignUp";
//!     fn register(handlers: &mut SagaHandlers<Self>) {
//!         fn registered<'a, 'b>(
//!             s: &'a mut SignUp,
//!             m: Registered,
//!             ctx: &'a mut SagaContext<'b>,
//!         ) -> BoxFuture<'a, Result<(), HandlerError>> {
//!             Box::pin(s.registered(m, ctx))
//!         }
//!         handlers.start("registered", Correlate::by(|m: &Registered| m.user.clone()), registered);
//!     }
//! }
//! ```
//!
//! The endpoint (which needs a store) loads the instance in the message's transaction,
//! runs the handler, and saves the state, its new timeouts and the messages it sent in
//! the same transaction. See `docs/sagas.md`.

mod runtime;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::endpoint::context::Context;
use crate::endpoint::handler::{BoxFuture, HandlerError, Message};
use crate::error::{Error, ErrorKind, Result};

pub(crate) use runtime::{LockOwner, SagaStats, TimeoutSignal, register};

/// Headers a timeout message carries: which saga instance and which timeout it is.
pub mod headers {
    /// The timeout's id (also its message id).
    pub const TIMEOUT_ID: &str = "courier.saga.timeout";
    /// The saga type's name.
    pub const SAGA_TYPE: &str = "courier.saga.type";
    /// The instance's correlation value.
    pub const CORRELATION: &str = "courier.saga.correlation";
}

/// Dead-letter reasons of sagas.
pub mod reasons {
    /// A message found no saga instance and does not start one (with
    /// [`NotFound::DeadLetter`]).
    pub const SAGA_NOT_FOUND: &str = "courier.SagaNotFound";
}

/// A saga: a persisted state type and the handlers of its messages.
pub trait Saga: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// The saga type's stable name, stored with each instance (like a message's wire name,
    /// it must not change while instances exist).
    const NAME: &'static str;

    /// Lists the saga's handlers.
    fn register(handlers: &mut SagaHandlers<Self>);
}

/// A saga handler: the state, the message and the saga's context.
pub type SagaFn<S, M> =
    for<'a, 'b> fn(&'a mut S, M, &'a mut SagaContext<'b>) -> BoxFuture<'a, std::result::Result<(), HandlerError>>;

/// How a message finds its saga instance.
pub enum Correlate<M> {
    /// A value computed from the message (usually one of its fields).
    By(fn(&M) -> String),
    /// A header (application property) of the message, as text.
    Header(&'static str),
}

impl<M> Correlate<M> {
    /// Correlates by a value of the message.
    pub fn by(f: fn(&M) -> String) -> Self {
        Correlate::By(f)
    }

    /// Correlates by a header.
    pub fn header(name: &'static str) -> Self {
        Correlate::Header(name)
    }
}

impl<M> std::fmt::Debug for Correlate<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Correlate::By(_) => f.write_str("Correlate::By(..)"),
            Correlate::Header(h) => write!(f, "Correlate::Header({h:?})"),
        }
    }
}

/// What a handler does with its saga: start, continue, or handle a timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Start,
    Continue,
    Timeout,
}

/// The handlers of a saga, as [`Saga::register`] lists them.
pub struct SagaHandlers<S> {
    pub(crate) entries: Vec<runtime::Entry<S>>,
}

impl<S> std::fmt::Debug for SagaHandlers<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaHandlers")
            .field("handlers", &self.entries.len())
            .finish()
    }
}

impl<S: Saga> SagaHandlers<S> {
    pub(crate) fn new() -> Self {
        Self { entries: Vec::new() }
    }

    /// A message that starts an instance when none correlates (and continues it when one
    /// does).
    pub fn start<M: Message>(&mut self, name: &'static str, correlate: Correlate<M>, f: SagaFn<S, M>) -> &mut Self {
        self.entries
            .push(runtime::Entry::new(name, Role::Start, Some(correlate), f));
        self
    }

    /// A message that continues an existing instance; one that finds none goes to the
    /// saga's [`NotFound`] policy.
    pub fn handle<M: Message>(&mut self, name: &'static str, correlate: Correlate<M>, f: SagaFn<S, M>) -> &mut Self {
        self.entries
            .push(runtime::Entry::new(name, Role::Continue, Some(correlate), f));
        self
    }

    /// A timeout the saga requested with [`SagaContext::request_timeout`]: it finds its
    /// instance by itself, and is discarded (never handled) if it was cancelled or the
    /// saga completed before it fired.
    pub fn timeout<M: Message>(&mut self, name: &'static str, f: SagaFn<S, M>) -> &mut Self {
        self.entries.push(runtime::Entry::new(name, Role::Timeout, None, f));
        self
    }
}

/// What happens to a message that finds no saga instance and does not start one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NotFound {
    /// Log it, count it ([`EndpointStats::sagas_not_found`](crate::EndpointStats)) and
    /// complete the message (the default: a late message for a finished workflow is
    /// normal).
    #[default]
    Complete,
    /// Dead-letter the message with [`reasons::SAGA_NOT_FOUND`].
    DeadLetter,
}

/// What happens to a completed instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Completion {
    /// Delete it (the default).
    #[default]
    Delete,
    /// Move it to the archive table (`saga_archive`) with its final state.
    Archive,
}

/// How an endpoint runs a saga.
#[derive(Debug, Clone, Copy, Default)]
pub struct SagaOptions {
    pub(crate) not_found: NotFound,
    pub(crate) completion: Completion,
}

impl SagaOptions {
    /// The defaults: [`NotFound::Complete`], [`Completion::Delete`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the not-found policy.
    pub fn not_found(mut self, policy: NotFound) -> Self {
        self.not_found = policy;
        self
    }

    /// Sets what happens to completed instances.
    pub fn completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }
}

/// A requested timeout, to cancel or replace it. Keep it in the saga's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TimeoutHandle(String);

impl TimeoutHandle {
    pub(crate) fn from_id(id: String) -> Self {
        Self(id)
    }

    /// The timeout's id (the message id of its message).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TimeoutHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a saga handler did besides changing its state.
#[derive(Debug, Default)]
pub(crate) struct Frame {
    pub(crate) saga_type: &'static str,
    pub(crate) correlation: String,
    pub(crate) is_new: bool,
    pub(crate) completed: bool,
    pub(crate) timeouts: Vec<crate::store::Timeout>,
    pub(crate) cancelled: Vec<String>,
}

/// A saga handler's context: everything of [`Context`] (it derefs to it: `send`,
/// `publish`, `transaction`, ...) plus the saga's own operations.
pub struct SagaContext<'a> {
    ctx: &'a mut Context,
    frame: &'a mut Frame,
}

impl std::fmt::Debug for SagaContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SagaContext")
            .field("saga", &self.frame.saga_type)
            .field("correlation", &self.frame.correlation)
            .field("completed", &self.frame.completed)
            .finish()
    }
}

impl std::ops::Deref for SagaContext<'_> {
    type Target = Context;
    fn deref(&self) -> &Context {
        self.ctx
    }
}

impl std::ops::DerefMut for SagaContext<'_> {
    fn deref_mut(&mut self) -> &mut Context {
        self.ctx
    }
}

impl<'a> SagaContext<'a> {
    pub(crate) fn new(ctx: &'a mut Context, frame: &'a mut Frame) -> Self {
        Self { ctx, frame }
    }

    /// The instance's correlation value.
    pub fn saga_id(&self) -> &str {
        &self.frame.correlation
    }

    /// Whether this message created the instance.
    pub fn is_new(&self) -> bool {
        self.frame.is_new
    }

    /// Requests `message` to be handled by this saga after `delay`: stored with the saga's
    /// state in this transaction, sent to this endpoint when due. Its handler runs only
    /// if the timeout was neither cancelled nor the saga completed by then.
    ///
    /// # Errors
    /// An encoding error, or a delay out of range.
    pub fn request_timeout<M: Message>(&mut self, delay: Duration, message: &M) -> Result<TimeoutHandle> {
        let delay = chrono::Duration::from_std(delay).map_err(|_| {
            Error::new(ErrorKind::InvalidOptions {
                reason: format!("timeout delay {delay:?} is out of range"),
            })
        })?;
        let due = self.ctx.clock().now() + delay;
        self.request_timeout_at(due, message)
    }

    /// Requests `message` to be handled by this saga at `at` (see
    /// [`request_timeout`](Self::request_timeout)).
    ///
    /// # Errors
    /// An encoding error.
    pub fn request_timeout_at<M: Message>(&mut self, at: DateTime<Utc>, message: &M) -> Result<TimeoutHandle> {
        let id = uuid::Uuid::now_v7().to_string();
        let mut envelope = self.ctx.prepare_to_self(message, &id)?;
        envelope.properties.insert(
            headers::TIMEOUT_ID.to_owned(),
            crate::message::PropertyValue::String(id.clone()),
        );
        envelope.properties.insert(
            headers::SAGA_TYPE.to_owned(),
            crate::message::PropertyValue::String(self.frame.saga_type.to_owned()),
        );
        envelope.properties.insert(
            headers::CORRELATION.to_owned(),
            crate::message::PropertyValue::String(self.frame.correlation.clone()),
        );
        self.frame.timeouts.push(crate::store::Timeout {
            id: id.clone(),
            due: at,
            envelope,
        });
        Ok(TimeoutHandle(id))
    }

    /// Cancels a timeout of this saga: it will not be handled. Cancelling one that fired
    /// already, or twice, does nothing.
    pub fn cancel_timeout(&mut self, handle: &TimeoutHandle) {
        if let Some(i) = self.frame.timeouts.iter().position(|t| t.id == handle.0) {
            self.frame.timeouts.remove(i);
        } else {
            self.frame.cancelled.push(handle.0.clone());
        }
    }

    /// Cancels `handle` and requests a new timeout after `delay`.
    ///
    /// # Errors
    /// As [`request_timeout`](Self::request_timeout).
    pub fn replace_timeout<M: Message>(
        &mut self,
        handle: &TimeoutHandle,
        delay: Duration,
        message: &M,
    ) -> Result<TimeoutHandle> {
        self.cancel_timeout(handle);
        self.request_timeout(delay, message)
    }

    /// Ends the saga when this handling commits: the instance is deleted (or archived)
    /// and all its pending timeouts are cancelled, in the same transaction.
    pub fn complete(&mut self) {
        self.frame.completed = true;
    }

    /// Whether [`complete`](Self::complete) was called.
    pub fn is_completed(&self) -> bool {
        self.frame.completed
    }
}
