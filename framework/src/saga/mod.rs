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

mod locks;
mod registration;
mod runtime;
pub(crate) mod state;

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::endpoint::context::Context;
use crate::endpoint::handler::{BoxFuture, HandlerError, Message};
use crate::error::{Error, ErrorKind, Result};

/// Headers a timeout message carries: which saga instance and which timeout it is.
pub mod headers {
    /// The timeout's id (also its message id).
    pub const TIMEOUT_ID: &str = crate::endpoint::TIMEOUT_ID;
    /// The saga type's name.
    pub const SAGA_TYPE: &str = crate::endpoint::timeout_seal::SAGA_TYPE;
    /// The instance's correlation value.
    pub const CORRELATION: &str = crate::endpoint::timeout_seal::CORRELATION;
    /// The timeout's key (see [`SagaContext::request_timeout_keyed`](super::SagaContext::request_timeout_keyed)).
    pub const TIMEOUT_KEY: &str = "courier.saga.timeout_key";
    /// On a saga's copy of a message that found no instance and comes back later
    /// ([`SagaOptions::retry_not_found`](super::SagaOptions::retry_not_found)): the number
    /// of the try (an integer, 1 on the first copy).
    pub const NOT_FOUND_RETRIES: &str = crate::endpoint::not_found_seal::NOT_FOUND_RETRIES;
    /// On such a copy: the name of the saga that tries it again (only its handler runs on
    /// the copy).
    pub const NOT_FOUND_SAGA: &str = crate::endpoint::not_found_seal::NOT_FOUND_SAGA;
    /// On such a copy: the seal of the two above (64 hex digits, HMAC-SHA256 under the
    /// endpoint's secret of the endpoint's name, the copy's message id, type and body, the
    /// saga's name and the count). Without a valid one the copy counts as a first
    /// arrival.
    pub const NOT_FOUND_SEAL: &str = crate::endpoint::not_found_seal::NOT_FOUND_SEAL;
    /// When the timeout is due (RFC 3339, UTC): its lateness is measured from it, and a
    /// copy that arrives before it is refused.
    pub const TIMEOUT_DUE: &str = crate::endpoint::timeout_seal::TIMEOUT_DUE;
    /// The proof that the message is the one the endpoint's timeout dispatcher sent (64
    /// hex digits: HMAC-SHA256 under the endpoint's secret of the endpoint's name, the
    /// timeout's id, the message's id, type and body, the saga type, the correlation and
    /// the due time), written when the dispatcher claims the timeout. A message of a
    /// timeout type without a valid one is dead-lettered with
    /// [`FORGED_TIMEOUT`](crate::recoverability::reasons::FORGED_TIMEOUT) and changes
    /// nothing. Never stored with the timeout's row; not shown by `courier timeouts`.
    pub const TIMEOUT_SEAL: &str = crate::endpoint::timeout_seal::TIMEOUT_SEAL;
}

/// The longest correlation value of a saga instance, in bytes. An instance is stored and
/// found by it (a database index holds it, and Postgres refuses an index entry of more
/// than about 2700 bytes); a message whose correlation is longer fails permanently,
/// dead-lettered with a description naming its length, before any handler runs.
pub const MAX_CORRELATION: usize = 1024;
/// The longest timeout key, in bytes.
pub const MAX_TIMEOUT_KEY: usize = 256;
/// The longest correlation property name, in bytes.
pub const MAX_PROPERTY_NAME: usize = 64;
/// The longest correlation property value, in bytes.
pub const MAX_PROPERTY_VALUE: usize = 512;

/// A **correlation property** of a saga, declared once: `#[saga(properties(payment_id))]`
/// gives the saga's state type the constant `PAYMENT_ID`, which
/// [`SagaContext::correlate_by`] takes, and `#[handle(by = field, property = payment_id)]`
/// is checked against the same list, so that a misspelt name does not compile.
/// (A saga registered by hand declares its own: `const PAYMENT_ID: Property =
/// Property::new("payment_id");`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Property(&'static str);

impl Property {
    /// The property called `name` (1 to [`MAX_PROPERTY_NAME`] bytes, checked when it is set).
    #[must_use]
    pub const fn new(name: &'static str) -> Self {
        Self(name)
    }

    /// The property's name, as stored.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.0
    }
}

/// Dead-letter reasons of sagas.
pub mod reasons {
    /// A message found no saga instance and does not start one (with
    /// [`NotFound::DeadLetter`](super::NotFound::DeadLetter)).
    pub const SAGA_NOT_FOUND: &str = "courier.SagaNotFound";
    /// The instance's stored state is of a version this code cannot read: newer than the
    /// saga's [`Saga::VERSION`](super::Saga::VERSION) (written by newer code: deploy it,
    /// or roll the instance back), or older with no migration step from it.
    pub const UNSUPPORTED_STATE_VERSION: &str = "courier.UnsupportedSagaStateVersion";
    /// A start message of an instance that completed within the retention of its marker
    /// (with [`SagaOptions::remember_completed`](super::SagaOptions::remember_completed)
    /// and [`LateStart::DeadLetter`](super::LateStart::DeadLetter)).
    pub const SAGA_COMPLETED: &str = "courier.SagaCompleted";
}

/// A saga: a persisted state type and the handlers of its messages.
pub trait Saga: Serialize + DeserializeOwned + Default + Send + Sync + 'static {
    /// The saga type's stable name, stored with each instance (like a message's wire name,
    /// it must not change while instances exist).
    const NAME: &'static str;

    /// The current version of the state's shape (`#[saga(version = 2)]`; default 1),
    /// stored with each instance. An instance stored at an older version is brought up to
    /// date with [`migrate`](Self::migrate) when it is loaded, and saved at this version;
    /// one stored at a newer version (written by newer code) is never decoded: the
    /// message fails permanently with the reason [`reasons::UNSUPPORTED_STATE_VERSION`].
    const VERSION: u32 = 1;

    /// Lists the saga's handlers.
    fn register(handlers: &mut SagaHandlers<Self>);

    /// The message types the saga's handlers send and publish, as it declares them
    /// (`#[saga(sends(T, ..), publishes(U, ..))]`): checked against the endpoint's
    /// routes at `start()`. The default declares nothing.
    fn declared() -> crate::endpoint::handler::Declared {
        crate::endpoint::handler::Declared::default()
    }

    /// Brings a stored state of version `from` to version `from + 1`; the endpoint calls it
    /// for each version from the stored one up to [`VERSION`](Self::VERSION) - 1, in
    /// order, then decodes the result. Set it with
    /// `#[saga(version = 2, migrate = Self::migrate)]`. The default has no step: an
    /// instance stored at an older version fails its messages permanently.
    ///
    /// # Errors
    /// [`UpcastError::Unsupported`](crate::UpcastError::Unsupported) for a version it has
    /// no step from; [`UpcastError::Invalid`](crate::UpcastError::Invalid) for a state
    /// without the expected shape. Either fails the message permanently with
    /// [`reasons::UNSUPPORTED_STATE_VERSION`].
    fn migrate(from: u32, state: serde_json::Value) -> std::result::Result<serde_json::Value, crate::UpcastError> {
        let _ = state;
        Err(crate::UpcastError::unsupported(from))
    }
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

/// A handler of a message that found no saga instance: it gets the message and the
/// endpoint's context (no state: there is none), in the message's transaction. See
/// [`SagaHandlers::not_found`].
pub type NotFoundFn<M> = for<'a> fn(M, &'a mut Context) -> BoxFuture<'a, std::result::Result<(), HandlerError>>;

/// The handlers of a saga, as [`Saga::register`] lists them.
pub struct SagaHandlers<S> {
    pub(crate) entries: Vec<runtime::Entry<S>>,
    pub(crate) not_found: Vec<runtime::NotFoundEntry>,
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
        Self {
            entries: Vec::new(),
            not_found: Vec::new(),
        }
    }

    /// A message that starts an instance when none correlates (and continues it when one
    /// does).
    pub fn start<M: Message>(&mut self, name: &'static str, correlate: Correlate<M>, f: SagaFn<S, M>) -> &mut Self {
        self.entries
            .push(runtime::Entry::new(name, Role::Start, Some(correlate), None, f));
        self
    }

    /// A message that continues an existing instance; one that finds none goes to the
    /// saga's [`NotFound`] policy.
    pub fn handle<M: Message>(&mut self, name: &'static str, correlate: Correlate<M>, f: SagaFn<S, M>) -> &mut Self {
        self.entries
            .push(runtime::Entry::new(name, Role::Continue, Some(correlate), None, f));
        self
    }

    /// A message that continues an existing instance found by one of its **correlation
    /// properties** rather than by its correlation: `correlate` reads the value from the
    /// message, and the instance is the one whose handler set `property` to that value
    /// with [`SagaContext::correlate_by`] (a payment provider's event that carries only
    /// a payment id, say). One that finds none goes to the saga's [`NotFound`] policy.
    pub fn handle_by_property<M: Message>(
        &mut self,
        name: &'static str,
        property: &'static str,
        correlate: Correlate<M>,
        f: SagaFn<S, M>,
    ) -> &mut Self {
        self.entries.push(runtime::Entry::new(
            name,
            Role::Continue,
            Some(correlate),
            Some(property),
            f,
        ));
        self
    }

    /// What to do with an `M` that finds no instance, instead of the saga's [`NotFound`]
    /// policy: `f` runs with the message and the endpoint's context, in the message's
    /// transaction (what it sends and writes commits with the inbox record), as
    /// NServiceBus's `IHandleSagaNotFound` does. A payment captured after its order was
    /// cancelled can trigger a refund instead of being quietly completed. `M` must be a
    /// message the saga continues with (a [`handle`](Self::handle)); an error of `f` is
    /// retried as any handler's.
    pub fn not_found<M: Message>(&mut self, name: &'static str, f: NotFoundFn<M>) -> &mut Self {
        self.not_found.push(runtime::NotFoundEntry::new(name, f));
        self
    }

    /// A timeout the saga requested with [`SagaContext::request_timeout`]: it finds its
    /// instance by itself, and is discarded (never handled) if it was cancelled or the
    /// saga completed before it fired. Only the copy the endpoint's timeout dispatcher
    /// sealed ([`headers::TIMEOUT_SEAL`]) is handled, at or after its due time; any other
    /// message of type `M` that reaches it is dead-lettered as forged (or early) without
    /// running `f`, so `M` should be a type of the saga's own, not one other producers
    /// send.
    pub fn timeout<M: Message>(&mut self, name: &'static str, f: SagaFn<S, M>) -> &mut Self {
        self.entries
            .push(runtime::Entry::new(name, Role::Timeout, None, None, f));
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

/// What happens to a start message whose instance completed while its marker is kept
/// ([`SagaOptions::remember_completed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LateStart {
    /// Complete the message without running the start handler (the default): logged at
    /// INFO and counted in [`EndpointStats::saga_late_starts`](crate::EndpointStats). A
    /// client's retry of a request that was handled already is a duplicate.
    #[default]
    Ignore,
    /// Dead-letter the message with [`reasons::SAGA_COMPLETED`] (counted too), for an
    /// operator to look at.
    DeadLetter,
    /// Start a new instance, as without markers (counted too); its start handler sees when
    /// the previous one completed in [`SagaContext::completed_before`] and decides (reply
    /// "already closed" and complete at once, say).
    StartNew,
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

/// How a message type that finds no instance is tried again later: see
/// [`SagaOptions::retry_not_found`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryNotFound {
    /// How long after each arrival the message comes back.
    pub(crate) delay: Duration,
    /// How many times it comes back at most.
    pub(crate) limit: u32,
}

/// How an endpoint runs a saga: given to [`EndpointBuilder::saga_with`](crate::EndpointBuilder::saga_with)
/// (`saga::<S>()` is `saga_with::<S>(SagaOptions::default())`).
///
/// ```
/// use std::time::Duration;
///
/// use courier::saga::{Completion, NotFound, SagaContext, SagaOptions};
/// use courier::{Endpoint, HandlerError};
/// # use serde::{Deserialize, Serialize};
/// # #[derive(Serialize, Deserialize, courier::Message)]
/// # struct ClaimFiled { claim_id: String }
/// # #[derive(Serialize, Deserialize, courier::Message)]
/// # struct AssessmentDone { claim_id: String }
///
/// #[derive(Default, Serialize, Deserialize)]
/// struct Claim { assessed: bool }
///
/// #[courier::saga(name = "claims.Claim")]
/// impl Claim {
///     #[start(by = claim_id)]
///     async fn filed(&mut self, _msg: ClaimFiled, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
///         Ok(())
///     }
///
///     #[handle(by = claim_id)]
///     async fn assessed(&mut self, _msg: AssessmentDone, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
///         self.assessed = true;
///         Ok(())
///     }
/// }
///
/// let options = SagaOptions::new()
///     // An assessment that overtook its claim comes back every 30 s, 20 times at most.
///     .retry_not_found::<AssessmentDone>(Duration::from_secs(30), 20)
///     // Any other continuing message that finds no instance is dead-lettered.
///     .not_found(NotFound::DeadLetter)
///     // A completed claim is kept, with its final state, in saga_archive.
///     .completion(Completion::Archive);
/// let builder = Endpoint::builder("claims").saga_with::<Claim>(options);
/// # drop(builder);
/// ```
#[derive(Debug, Clone, Default)]
pub struct SagaOptions {
    pub(crate) not_found: NotFound,
    pub(crate) completion: Completion,
    /// Message types tried again when they find no instance: (type, wire name, how).
    pub(crate) retry_not_found: Vec<(std::any::TypeId, &'static str, RetryNotFound)>,
    /// How long a completed instance's marker is kept, and what a late start does.
    pub(crate) remember_completed: Option<(Duration, LateStart)>,
}

impl SagaOptions {
    /// The defaults: [`NotFound::Complete`], [`Completion::Delete`], no message tried
    /// again.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the not-found policy: what happens to a continuing message that finds no
    /// instance, has no `#[not_found]` handler and is not tried again
    /// ([`retry_not_found`](Self::retry_not_found)).
    pub fn not_found(mut self, policy: NotFound) -> Self {
        self.not_found = policy;
        self
    }

    /// A continuing message of type `M` that finds no instance **comes back later**: the
    /// endpoint sends a copy of it to its own queue, scheduled `delay` later, in the
    /// handling's transaction (so it survives a restart: it waits in the broker, or in the
    /// outbox, like any scheduled send), up to `limit` times. A copy that finds its
    /// instance is handled as usual; after the last try, the message goes to the saga's
    /// `#[not_found]` handler of `M` if it has one, and is dead-lettered with
    /// [`reasons::SAGA_NOT_FOUND`] otherwise (whatever [`not_found`](Self::not_found) says).
    ///
    /// For an event that can overtake the one that creates its instance, or sets the
    /// correlation property it is found by (two sources, RabbitMQ's ordering across
    /// queues): MassTransit's `OnMissingInstance(m => m.Redeliver(..))`. Only the saga's
    /// handler runs on a copy (the endpoint's other handlers of `M` ran on the first
    /// arrival). The copy's count travels in the header
    /// [`headers::NOT_FOUND_RETRIES`], sealed with the endpoint's secret
    /// ([`headers::NOT_FOUND_SEAL`]): a producer's count is not trusted (the message
    /// counts as a first arrival), and the endpoint's sealed copy cannot be sent again (the
    /// inbox drops it), so a message is tried `limit` times at most. Each try counts in
    /// [`EndpointStats::sagas_not_found`](crate::EndpointStats) and
    /// `sagas_not_found_retried`. Setting it again for `M` replaces the earlier setting.
    ///
    /// `M` must be a message the saga continues with (`#[handle]`), `delay` at least a
    /// millisecond and `limit` at least 1: otherwise the endpoint's `start()` fails saying
    /// which.
    pub fn retry_not_found<M: Message>(mut self, delay: Duration, limit: u32) -> Self {
        let id = std::any::TypeId::of::<M>();
        self.retry_not_found.retain(|(t, _, _)| *t != id);
        self.retry_not_found.push((id, M::NAME, RetryNotFound { delay, limit }));
        self
    }

    /// Keeps a **marker** of each completed instance (its saga type, correlation and
    /// completion time, a row of `saga_completed`) for `retention` after its completion,
    /// so that a start message arriving later (a client's retry of a request whose
    /// workflow already ended) is recognised instead of starting a new instance: it is
    /// handled as `late_start` says. The marker is written in the completing handling's
    /// transaction; a start message that finds no instance reads it in its own. While a
    /// marker is kept, a message tried again later
    /// ([`retry_not_found`](Self::retry_not_found)) that finds it is too late, not too
    /// early: it is not tried again.
    ///
    /// The cost: one row per instance completed within the retention, one more write per
    /// completion, and one indexed read per start message that finds no instance (every
    /// new instance). A start after the retention starts a new instance, as without
    /// markers; and a correlation value cannot start a second workflow within the
    /// retention (correlate by an id that is unique per workflow, not a user id that
    /// starts several). Expired markers are ignored, and deleted a hundred at a time by
    /// later completions. See `docs/sagas.md`.
    ///
    /// A retention under a millisecond or over ten years is refused by the endpoint's
    /// `start()`.
    pub fn remember_completed(mut self, retention: Duration, late_start: LateStart) -> Self {
        self.remember_completed = Some((retention, late_start));
        self
    }

    /// Sets what happens to completed instances.
    pub fn completion(mut self, completion: Completion) -> Self {
        self.completion = completion;
        self
    }
}

/// One requested timeout, to cancel exactly it with
/// [`SagaContext::cancel_timeout_handle`]. Most sagas need none: a timeout is cancelled
/// and replaced by its type or key.
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
    /// Timeouts cancelled by id (a handle).
    pub(crate) cancelled: Vec<String>,
    /// Keys whose stored pending timeout is cancelled (or replaced by one in `timeouts`).
    pub(crate) cancelled_keys: Vec<String>,
    /// Correlation properties set: (name, value).
    pub(crate) properties: Vec<(String, String)>,
    /// When the previous instance of this correlation completed, on a new instance started
    /// while its marker was kept ([`LateStart::StartNew`]).
    pub(crate) completed_before: Option<DateTime<Utc>>,
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

    /// On a new instance whose correlation belonged to an instance that completed at the
    /// returned time, within the retention of its marker
    /// ([`SagaOptions::remember_completed`] with [`LateStart::StartNew`]): the start
    /// handler can tell a retry of a finished workflow from a first request. `None`
    /// otherwise.
    pub fn completed_before(&self) -> Option<DateTime<Utc>> {
        self.frame.completed_before
    }

    /// Requests `message` to be handled by this saga after `delay`: stored with the saga's
    /// state in this transaction, sent to this endpoint when due. Its handler runs only
    /// if the timeout was neither cancelled nor the saga completed by then.
    ///
    /// The timeout's key is the message's wire name (`M::NAME`): requesting a timeout of
    /// the same type again **replaces** the pending one (a start message that arrives
    /// twice while the instance runs leaves one timeout, not an orphan; one that arrives
    /// after it completed starts a new instance, unless
    /// [`SagaOptions::remember_completed`] keeps a marker), and [`cancel_timeout::<M>()`] cancels it
    /// without a handle kept in the state. For several pending timeouts of one type, give
    /// each a key of its own with [`request_timeout_keyed`](Self::request_timeout_keyed).
    ///
    /// [`cancel_timeout::<M>()`]: Self::cancel_timeout
    ///
    /// # Errors
    /// An encoding error, or a delay out of range.
    pub fn request_timeout<M: Message>(&mut self, delay: Duration, message: &M) -> Result<TimeoutHandle> {
        let at = self.due_after(delay)?;
        self.request_keyed(M::NAME.to_owned(), at, message)
    }

    /// Requests `message` to be handled by this saga at `at`; replaces the pending timeout
    /// of the same type (see [`request_timeout`](Self::request_timeout)).
    ///
    /// # Errors
    /// An encoding error.
    pub fn request_timeout_at<M: Message>(&mut self, at: DateTime<Utc>, message: &M) -> Result<TimeoutHandle> {
        self.request_keyed(M::NAME.to_owned(), at, message)
    }

    /// Requests `message` after `delay` under `key`, which replaces the pending timeout of
    /// this instance with the same key (of any type) and leaves the others: one reminder
    /// per line of an order, say, with the line's id as the key. Cancel it with
    /// [`cancel_timeout_keyed`](Self::cancel_timeout_keyed).
    ///
    /// # Errors
    /// As [`request_timeout`](Self::request_timeout), and an empty key or one over
    /// [`MAX_TIMEOUT_KEY`] bytes.
    pub fn request_timeout_keyed<M: Message>(
        &mut self,
        key: impl Into<String>,
        delay: Duration,
        message: &M,
    ) -> Result<TimeoutHandle> {
        let at = self.due_after(delay)?;
        self.request_keyed(key.into(), at, message)
    }

    /// As [`request_timeout_keyed`](Self::request_timeout_keyed), due at `at`.
    ///
    /// # Errors
    /// As [`request_timeout_keyed`](Self::request_timeout_keyed).
    pub fn request_timeout_keyed_at<M: Message>(
        &mut self,
        key: impl Into<String>,
        at: DateTime<Utc>,
        message: &M,
    ) -> Result<TimeoutHandle> {
        self.request_keyed(key.into(), at, message)
    }

    fn due_after(&self, delay: Duration) -> Result<DateTime<Utc>> {
        let delay = chrono::Duration::from_std(delay).map_err(|_| {
            Error::new(ErrorKind::InvalidOptions {
                reason: format!("timeout delay {delay:?} is out of range"),
            })
        })?;
        self.ctx.clock().now().checked_add_signed(delay).ok_or_else(|| {
            Error::new(ErrorKind::InvalidOptions {
                reason: format!("timeout delay {delay} is out of range"),
            })
        })
    }

    fn request_keyed<M: Message>(&mut self, key: String, at: DateTime<Utc>, message: &M) -> Result<TimeoutHandle> {
        if key.is_empty() || key.len() > MAX_TIMEOUT_KEY {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: format!(
                    "a timeout key must have 1 to {MAX_TIMEOUT_KEY} bytes; {:?} has {}",
                    key.chars().take(40).collect::<String>(),
                    key.len()
                ),
            }));
        }
        let id = uuid::Uuid::now_v7().to_string();
        let mut envelope = self.ctx.prepare_to_self(message, &id)?;
        for (name, value) in [
            (headers::TIMEOUT_ID, id.clone()),
            (headers::SAGA_TYPE, self.frame.saga_type.to_owned()),
            (headers::CORRELATION, self.frame.correlation.clone()),
            (headers::TIMEOUT_KEY, key.clone()),
            (
                headers::TIMEOUT_DUE,
                at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            ),
        ] {
            envelope
                .properties
                .insert(name.to_owned(), crate::message::PropertyValue::String(value));
        }
        self.forget_key(&key);
        self.frame.timeouts.push(crate::store::Timeout {
            id: id.clone(),
            key: Some(key),
            due: at,
            envelope,
        });
        Ok(TimeoutHandle(id))
    }

    /// Drops the timeouts of `key` requested in this handling and marks the stored one
    /// to be cancelled.
    fn forget_key(&mut self, key: &str) {
        self.frame.timeouts.retain(|t| t.key.as_deref() != Some(key));
        if !self.frame.cancelled_keys.iter().any(|k| k == key) {
            self.frame.cancelled_keys.push(key.to_owned());
        }
    }

    /// Cancels this instance's pending timeout of message type `M` (requested with
    /// [`request_timeout`](Self::request_timeout) or
    /// [`request_timeout_at`](Self::request_timeout_at)): it will not be handled.
    /// Cancelling when none is pending does nothing.
    pub fn cancel_timeout<M: Message>(&mut self) {
        self.forget_key(M::NAME);
    }

    /// Cancels this instance's pending timeout of `key` (see
    /// [`request_timeout_keyed`](Self::request_timeout_keyed)). Cancelling when none is
    /// pending does nothing.
    pub fn cancel_timeout_keyed(&mut self, key: &str) {
        self.forget_key(key);
    }

    /// Cancels the one timeout `handle` stands for. A handle of a timeout that fired, was
    /// replaced or was cancelled already cancels nothing (in particular not the timeout
    /// that replaced it).
    pub fn cancel_timeout_handle(&mut self, handle: &TimeoutHandle) {
        if let Some(i) = self.frame.timeouts.iter().position(|t| t.id == handle.0) {
            self.frame.timeouts.remove(i);
        } else {
            self.frame.cancelled.push(handle.0.clone());
        }
    }

    /// Sets a **correlation property** of this instance: messages handled with
    /// [`SagaHandlers::handle_by_property`] (`#[handle(by = field, property = name)]`)
    /// find it by `value`. The property is declared once, on the saga
    /// (`#[saga(properties(payment_id))]` gives `Self::PAYMENT_ID`), so that a misspelt
    /// name does not compile. Stored and indexed with the state, in this transaction; one
    /// value per name per instance (setting it again replaces it), and a value belongs to
    /// one instance of the saga type at a time: a value another instance holds fails the
    /// handling permanently (dead-lettered with the reason). Removed at completion.
    ///
    /// # Errors
    /// A name that is empty or over [`MAX_PROPERTY_NAME`] bytes, or a value over
    /// [`MAX_PROPERTY_VALUE`] bytes.
    pub fn correlate_by(&mut self, property: Property, value: impl std::fmt::Display) -> Result<()> {
        let name = property.name();
        let value = value.to_string();
        if name.is_empty() || name.len() > MAX_PROPERTY_NAME || value.len() > MAX_PROPERTY_VALUE {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: format!(
                    "a correlation property has a name of 1 to {MAX_PROPERTY_NAME} bytes and a value of at most \
                     {MAX_PROPERTY_VALUE}: {name:?} ({} bytes) = {} bytes",
                    name.len(),
                    value.len()
                ),
            }));
        }
        self.frame.properties.retain(|(n, _)| n != name);
        self.frame.properties.push((name.to_owned(), value));
        Ok(())
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
