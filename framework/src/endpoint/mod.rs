//! The endpoint: receives its messages in PeekLock mode, runs their handlers, settles each
//! message the right way. See `docs/endpoints.md`.
//!
//! This file is the builder ([`EndpointBuilder`]) and the failures a handling can end in;
//! the running endpoint is `runtime/` (its `mod.rs` maps it), handlers and the macros'
//! support `handler.rs`, a handler's context `context.rs`, sending `bus.rs` and
//! `routing.rs`, retries and dead-letter reasons `recoverability.rs`, metrics and traces
//! `metrics.rs` and `trace.rs`, the history's option and events `history.rs`, and what
//! the endpoint keeps for sagas, with the trait a
//! saga joins it through, `sagas.rs`. The endpoint runs on the transport and store traits
//! only, and does not name the saga module (the macros' support in `handler.rs` aside).

pub(crate) mod bus;
pub(crate) mod context;
pub(crate) mod handler;
pub(crate) mod history;
pub(crate) mod metrics;
pub(crate) mod not_found_seal;
pub(crate) mod observe;
pub(crate) mod otel;
mod parts;
pub(crate) mod recoverability;
pub(crate) mod retry_seal;
pub(crate) mod routing;
pub(crate) mod sagas;
pub(crate) mod timeout_seal;
pub(crate) mod trace;
pub mod version;

pub(crate) mod batch;
mod registry;
mod runtime;

use std::any::TypeId;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::{Clock, SystemClock};
use crate::endpoint::context::Extensions;
use crate::endpoint::handler::{Handler, Message};
use crate::endpoint::recoverability::RetryPolicy;
use crate::endpoint::routing::Routes;
use crate::entity::{QueueOptions, validate_name};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::Transport;

pub use parts::{IntoStore, IntoTransport};
use recoverability::reasons;
use registry::Registration;
use registry::{Erased, Registry};
pub(crate) use registry::{ErasedHandler, TypeEntry};
pub(crate) use runtime::TIMEOUT_ID;
pub use runtime::{EndpointStats, RunningEndpoint, ShutdownReport};

/// Why handling failed, as the endpoint records it.
pub(crate) enum Failure {
    /// The body does not decode into the handler's message type.
    Decode {
        message_type: &'static str,
        content_type: Option<String>,
        error: crate::codec::CodecError,
    },
    /// A handler returned an error.
    Handler {
        handler: &'static str,
        error: handler::HandlerError,
    },
    /// A handler panicked.
    Panic { handler: &'static str, text: String },
    /// The messages the handlers sent could not be dispatched.
    Dispatch(Error),
    /// The handling was committed with a store (now or by an earlier delivery), but
    /// `count` outbox messages could not be dispatched; they stay in the outbox.
    Undispatched { count: usize, error: Error },
    /// The store failed (the transaction is rolled back).
    Store(Error),
    /// Earlier deliveries ended without an outcome (the process stopped, or the lock
    /// expired while a handler ran).
    Unfinished { deliveries: u32 },
    /// No saga instance for the message, under the dead-letter policy.
    /// `reason` is the saga module's dead-letter reason for it.
    SagaNotFound {
        saga: &'static str,
        correlation: String,
        reason: &'static str,
        /// How many times the message was tried again, and how far apart, before
        /// (`SagaOptions::retry_not_found`; 0 when it was not).
        retried: (u32, Duration),
    },
    /// A message body or a saga state of a version this code cannot read (see
    /// `crate::version`): permanent, with its own dead-letter reason.
    Version {
        reason: &'static str,
        handler: Option<&'static str>,
        chain: Vec<String>,
    },
    /// A handler failed with the error the transport gave when it sent a message that can
    /// never leave (`description` names that message).
    Refused {
        handler: &'static str,
        description: String,
        error: handler::HandlerError,
    },
    /// A store that sends in its transaction (the embedded broker's file, the Postgres
    /// transport's store) had its commit refused by the transport for good, for a message
    /// the handlers sent that only the destination could refuse (`description` names the
    /// messages of the transaction). Nothing was committed.
    RefusedAtCommit { description: String, error: Box<Error> },
    /// A message that reached a saga's timeout handler is not the copy the endpoint's
    /// timeout dispatcher sent, or came before its due time (`timeout_seal.rs`):
    /// permanent, with its own reason (`reasons::FORGED_TIMEOUT`, `EARLY_TIMEOUT`);
    /// nothing was changed.
    TimeoutRefused {
        reason: &'static str,
        handler: &'static str,
        detail: String,
    },
    /// A saga refused the message for good with its own reason (a start message of an
    /// instance that completed, `SagaOptions::remember_completed`); nothing was changed.
    SagaRefused {
        reason: &'static str,
        handler: &'static str,
        detail: String,
    },
}

impl Failure {
    /// The dead-letter reason when no retry can help.
    pub(crate) fn permanent_reason(&self) -> Option<&'static str> {
        match self {
            Failure::Decode { .. } => Some(reasons::DESERIALIZATION_FAILED),
            Failure::SagaNotFound { reason, .. } => Some(reason),
            Failure::Version { reason, .. }
            | Failure::TimeoutRefused { reason, .. }
            | Failure::SagaRefused { reason, .. } => Some(reason),
            Failure::Handler { error, .. } if error.is_permanent() => Some(reasons::PERMANENT_FAILURE),
            Failure::Refused { .. } | Failure::RefusedAtCommit { .. } => Some(reasons::INVALID_OUTGOING_MESSAGE),
            Failure::Dispatch(e) if bus::refused_for_good(e) => Some(reasons::INVALID_OUTGOING_MESSAGE),
            Failure::Handler { .. }
            | Failure::Panic { .. }
            | Failure::Dispatch(_)
            | Failure::Undispatched { .. }
            | Failure::Store(_)
            | Failure::Unfinished { .. } => None,
        }
    }

    /// The dead-letter reason when the retries are exhausted.
    pub(crate) fn exhausted_reason(&self) -> &'static str {
        match self {
            Failure::Undispatched { .. } => reasons::DISPATCH_FAILED,
            _ => reasons::RETRIES_EXHAUSTED,
        }
    }

    pub(crate) fn handler(&self) -> Option<&'static str> {
        match self {
            Failure::Handler { handler, .. }
            | Failure::Panic { handler, .. }
            | Failure::Refused { handler, .. }
            | Failure::TimeoutRefused { handler, .. }
            | Failure::SagaRefused { handler, .. } => Some(handler),
            Failure::Version { handler, .. } => *handler,
            Failure::Decode { .. }
            | Failure::Dispatch(_)
            | Failure::RefusedAtCommit { .. }
            | Failure::Undispatched { .. }
            | Failure::Store(_)
            | Failure::Unfinished { .. }
            | Failure::SagaNotFound { .. } => None,
        }
    }

    pub(crate) fn chain(&self) -> Vec<String> {
        fn walk(top: &(dyn std::error::Error + 'static)) -> Vec<String> {
            let mut out = vec![top.to_string()];
            let mut next = top.source();
            while let Some(e) = next {
                out.push(e.to_string());
                next = e.source();
            }
            out
        }
        match self {
            Failure::Decode {
                message_type,
                content_type,
                error,
            } => {
                let mut v = vec![format!(
                    "cannot decode a {message_type} from a body of content type {}",
                    content_type.as_deref().unwrap_or("(none)")
                )];
                v.extend(walk(error));
                v
            }
            Failure::Handler { error, .. } => error.chain(),
            Failure::Refused {
                handler,
                description,
                error,
            } => {
                let mut v = vec![format!(
                    "handler {handler} sent a message that can never leave: {description}"
                )];
                v.extend(error.chain());
                v
            }
            Failure::Panic { text, .. } => vec![format!("handler panicked: {text}")],
            Failure::Dispatch(e) => {
                let first = match bus::missing_destination(e) {
                    Some(queue) => bus::missing_queue_text(queue),
                    None => "could not send the handler's messages".to_owned(),
                };
                let mut v = vec![first];
                v.extend(walk(e));
                v
            }
            Failure::RefusedAtCommit { description, error } => {
                let mut v = vec![format!(
                    "the transport refused the handling's transaction at its commit, nothing was committed: \
                     {description}"
                )];
                v.extend(walk(error));
                v
            }
            Failure::Undispatched { count, error } => {
                let mut v = vec![format!(
                    "the handling is committed, but {count} outgoing messages could not be dispatched; they stay \
                     in the outbox and the outbox sweeper keeps sending them"
                )];
                v.extend(bus::missing_destination(error).map(bus::missing_queue_text));
                v.extend(walk(error));
                v
            }
            Failure::Store(e) => {
                let mut v = vec!["the store failed; the handler's transaction was rolled back".to_owned()];
                v.extend(walk(e));
                v
            }
            Failure::Unfinished { deliveries } => vec![format!(
                "{} earlier deliveries ended without an outcome (the process stopped or the lock expired)",
                deliveries.saturating_sub(1)
            )],
            Failure::SagaNotFound {
                saga,
                correlation,
                retried: (0, _),
                ..
            } => vec![format!(
                "no instance of saga {saga} correlates to {correlation:?}, and the message does not start one"
            )],
            Failure::SagaNotFound {
                saga,
                correlation,
                retried: (n, delay),
                ..
            } => vec![format!(
                "no instance of saga {saga} correlates to {correlation:?}, and the message does not start one; it \
                 was tried again {n} times, {delay:?} apart (SagaOptions::retry_not_found), and found none: the \
                 instance it waited for was never created (or is gone); look for the message that should have \
                 created it, then move this one back"
            )],
            Failure::Version { chain, .. } => chain.clone(),
            Failure::TimeoutRefused { detail, .. } | Failure::SagaRefused { detail, .. } => vec![detail.clone()],
        }
    }
}

impl Failure {
    /// A handler's failure whose error is the one `ctx.send` (or `publish`, ...) returned
    /// for a message the transport refused, or is caused by it, becomes
    /// [`Failure::Refused`]: no retry can help.
    pub(crate) fn with_refusals(self, ctx: &context::Context) -> Failure {
        match self {
            Failure::Handler { handler, error } => match ctx.refusal_of(&error) {
                Some(description) => Failure::Refused {
                    handler,
                    description: description.to_owned(),
                    error,
                },
                None => Failure::Handler { handler, error },
            },
            other => other,
        }
    }
}

/// An endpoint: a named input queue and the handlers of the messages that arrive on it.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use courier::prelude::*;
///
/// #[derive(serde::Serialize, serde::Deserialize, courier::Message)]
/// #[message(name = "billing.ChargeCard")]
/// struct ChargeCard { order: u64 }
///
/// #[courier::handler]
/// async fn charge(msg: ChargeCard, ctx: &mut Context) -> Result<(), HandlerError> {
///     assert_eq!(msg.order, 7);
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), courier::Error> {
/// let transport: Arc<dyn Transport> = Arc::new(Embedded::in_memory().await?);
/// let routes = Routes::new().send::<ChargeCard>("billing");
/// let billing = Endpoint::builder("billing")
///     .transport(transport.clone())
///     .routes(routes.clone())
///     .handler(charge)
///     .start()
///     .await?;
/// billing.bus().send(&ChargeCard { order: 7 }).await?;
/// billing.shutdown().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Endpoint;

impl Endpoint {
    /// Starts configuring the endpoint `name`; its input queue has the same name.
    pub fn builder(name: impl Into<String>) -> EndpointBuilder {
        EndpointBuilder::new(name.into())
    }
}

/// How many messages an endpoint handles at once by default.
pub const DEFAULT_CONCURRENCY: usize = 16;
/// How long a lock is renewed while a handler runs, at most, by default.
pub const DEFAULT_MAX_LOCK_RENEWAL: Duration = Duration::from_secs(300);
/// How long one receive call waits for a first message by default.
pub const DEFAULT_RECEIVE_WAIT: Duration = Duration::from_secs(1);
/// The most messages whose handlings share one store transaction by default (see
/// [`EndpointBuilder::group_commit`]).
pub const DEFAULT_GROUP_COMMIT: usize = 1;
/// How long a graceful shutdown waits for running handlers by default.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(30);
/// The most times a saga timeout is sent by default (see
/// [`EndpointBuilder::max_timeout_dispatches`]).
pub const DEFAULT_MAX_TIMEOUT_DISPATCHES: u32 = 10;

/// Configures an [`Endpoint`]; [`start`](EndpointBuilder::start) runs it.
#[must_use]
pub struct EndpointBuilder {
    name: String,
    transport: Option<Arc<dyn Transport>>,
    routes: Routes,
    registrations: Vec<Registration>,
    concurrency: usize,
    prefetch: Option<usize>,
    group_commit: usize,
    policy: RetryPolicy,
    max_lock_renewal: Duration,
    shutdown_timeout: Duration,
    receive_wait: Duration,
    check_routes: bool,
    clock: Option<Arc<dyn Clock>>,
    queue_options: QueueOptions,
    extensions: Extensions,
    store: Option<Arc<dyn crate::store::Store>>,
    inbox_retention: Duration,
    max_timeout_dispatches: u32,
    sagas: Vec<&'static str>,
    saga_stats: Arc<sagas::SagaStats>,
    /// Mistakes found while adding sagas, reported by `start`.
    errors: Vec<String>,
    /// How many messages the batch handlers' batches hold at most at once (the
    /// concurrency is raised to it).
    batch_holding: usize,
    /// The longest `max_wait` of the batch handlers.
    batch_max_wait: Duration,
    observer: Option<Arc<dyn observe::Observer>>,
    history: Option<history::HistoryOptions>,
    accept_messages_without_id: bool,
    metrics_sampling: Option<Duration>,
    /// What each handler and saga declared it sends: (its name, the types).
    declared: Vec<(&'static str, handler::Declared)>,
}

impl std::fmt::Debug for EndpointBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointBuilder")
            .field("name", &self.name)
            .field("handlers", &self.registrations.len())
            .field("concurrency", &self.concurrency)
            .field("prefetch", &self.prefetch)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl EndpointBuilder {
    fn new(name: String) -> Self {
        Self {
            name,
            transport: None,
            routes: Routes::new(),
            registrations: Vec::new(),
            concurrency: DEFAULT_CONCURRENCY,
            prefetch: None,
            group_commit: DEFAULT_GROUP_COMMIT,
            policy: RetryPolicy::default(),
            max_lock_renewal: DEFAULT_MAX_LOCK_RENEWAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            receive_wait: DEFAULT_RECEIVE_WAIT,
            check_routes: true,
            clock: None,
            queue_options: QueueOptions::default(),
            extensions: Extensions::default(),
            store: None,
            inbox_retention: crate::store::DEFAULT_INBOX_RETENTION,
            max_timeout_dispatches: DEFAULT_MAX_TIMEOUT_DISPATCHES,
            sagas: Vec::new(),
            saga_stats: Arc::default(),
            errors: Vec::new(),
            batch_holding: 0,
            batch_max_wait: Duration::ZERO,
            observer: None,
            history: None,
            accept_messages_without_id: false,
            metrics_sampling: None,
            declared: Vec::new(),
        }
    }

    /// Reports every committed handling to `observer` (`courier::testing`).
    pub(crate) fn observer(mut self, observer: Arc<dyn observe::Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The routing table set so far.
    pub(crate) fn routes_ref(&self) -> &Routes {
        &self.routes
    }

    /// The broker (required): the broker itself (`.transport(broker.clone())`), an `Arc`
    /// of it, or an `Arc<dyn Transport>` shared with other endpoints.
    pub fn transport(mut self, transport: impl IntoTransport) -> Self {
        self.transport = Some(transport.into_transport());
        self
    }

    /// The routing table: where sent commands go, which types are events.
    pub fn routes(mut self, routes: Routes) -> Self {
        self.routes = routes;
        self
    }

    /// Adds a handler. Several handlers of one message type all run, in the order they
    /// were added; one failing fails the message (and all run again on a retry).
    pub fn handler<H: Handler>(mut self, handler: H) -> Self {
        self.declared.push((handler.name(), handler.declared()));
        self.registrations.push(Registration {
            type_id: TypeId::of::<H::Message>(),
            type_name: std::any::type_name::<H::Message>(),
            name: <H::Message as Message>::NAME,
            aliases: <H::Message as Message>::ALIASES,
            handler: registry::Handling::One(Arc::new(Erased(handler))),
        });
        self
    }

    /// How many messages are handled at once (default [`DEFAULT_CONCURRENCY`]).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// How many messages are received ahead of the handlers, locked and waiting (default:
    /// twice the concurrency). Their locks run while they wait; a deeper buffer means
    /// larger, fewer receives (measured: 16 handlers with 32 prefetched drain a queue
    /// about 1.5 times as fast as with 16 prefetched on the embedded broker).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = Some(n);
        self
    }

    /// Lets up to `n` messages received together share one transaction of the store (a
    /// group commit; default [`DEFAULT_GROUP_COMMIT`], 1 = each message commits alone).
    ///
    /// With a store that supports it (`PostgresStore`), one statement records all their
    /// ids in the inbox, the handlers run one after another on the group's connection,
    /// each under a savepoint of its own, one statement stores all their outgoing
    /// messages, and one COMMIT ends them. A handler that fails is rolled back to its
    /// savepoint alone and retried as usual; the others commit. Each message is completed
    /// only after the group's commit, so the guarantees are the same as alone: the
    /// handlers' effects, inbox records and outgoing messages commit together or not at
    /// all. The cost is latency: a slow handler holds up the others of its group, and
    /// their row locks are held until the group commits. Other stores ignore it. See
    /// `docs/stores.md` for the measured gain.
    ///
    /// A group takes at most half the endpoint's handlers ([`concurrency`](Self::concurrency)),
    /// so that one group runs its handlers while another commits: with `concurrency(8)`,
    /// `group_commit(10)` forms groups of 4, and with fewer than 4 handlers no group forms.
    /// The endpoint logs the size it uses at start when it is smaller than `n`.
    pub fn group_commit(mut self, n: usize) -> Self {
        self.group_commit = n;
        self
    }

    /// The retry policy (default [`RetryPolicy::default`]).
    pub fn recoverability(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Renew a message's lock while its handlers run for at most this long (default
    /// [`DEFAULT_MAX_LOCK_RENEWAL`]).
    pub fn max_lock_renewal(mut self, d: Duration) -> Self {
        self.max_lock_renewal = d;
        self
    }

    /// Whether `start()` warns of the queues its routes send to that do not exist (default
    /// `true`). A process that starts several endpoints, each receiving from a queue the
    /// others send to, turns it off for those started before the queues they send to
    /// exist: they are created a moment later by the process's own next endpoints, and
    /// the warning would only say so.
    pub fn check_routes_at_start(mut self, check: bool) -> Self {
        self.check_routes = check;
        self
    }

    /// How long a graceful shutdown waits for running handlers (default
    /// [`DEFAULT_SHUTDOWN_TIMEOUT`]).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }

    /// How long one receive call waits for a first message before it asks again (default
    /// [`DEFAULT_RECEIVE_WAIT`]). A longer wait means fewer empty calls on an idle queue
    /// (it matters on a networked broker); it never delays shutdown or other sources.
    pub fn receive_wait(mut self, d: Duration) -> Self {
        self.receive_wait = d;
        self
    }

    /// The clock of saga timeouts, delayed retries and the endpoint's own times. The
    /// default: the transport's clock ([`Transport::clock`]: the one given to
    /// `PostgresTransport::builder(..).clock(..)`, `Embedded`'s or `AmqpTransport`'s),
    /// else the system clock. Setting a different clock from the transport's is
    /// allowed but logged as a warning at start: timeouts would come due by one clock
    /// and messages be stamped by the other.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Options of the input queue and subscriptions when the endpoint creates them. The
    /// max delivery count is raised to at least one more than the attempts per round of
    /// the retry policy, so the broker's own limit stays a backstop. With
    /// `requires_session(true)` the endpoint handles its sessions, each one's messages in
    /// order, one at a time (docs/endpoints.md, "Sessions"; `start` refuses delayed
    /// retries and a group commit then, and a source whose sessions disagree).
    pub fn queue_options(mut self, options: QueueOptions) -> Self {
        self.queue_options = options;
        self
    }

    /// The store of the inbox and outbox: each message's id is recorded in the same
    /// transaction as its handlers' writes ([`Context::transaction`](crate::Context::transaction))
    /// and the messages they send, so a redelivered message is recognised and its effects
    /// happen once. Migrate the store first ([`Store::migrate`](crate::Store::migrate)).
    /// Takes the store itself (`.store(broker.store())`), an `Arc` of it, or an
    /// `Arc<dyn Store>`.
    pub fn store(mut self, store: impl IntoStore) -> Self {
        self.store = Some(store.into_store());
        self
    }

    /// How long the store keeps the ids of processed messages (default
    /// [`DEFAULT_INBOX_RETENTION`](crate::DEFAULT_INBOX_RETENTION), 7 days). A message
    /// redelivered after its id was purged is handled again: keep this longer than any
    /// redelivery can take (lock expiry, delayed retries, an outage). The endpoint purges
    /// its expired ids every minute, in short batches.
    pub fn inbox_retention(mut self, d: Duration) -> Self {
        self.inbox_retention = d;
        self
    }

    /// The most times the endpoint's timeout dispatcher sends one saga timeout (default
    /// [`DEFAULT_MAX_TIMEOUT_DISPATCHES`], 10; at least 1).
    ///
    /// A timeout is sent when due, and again after five minutes if no handling settled
    /// it (its message may have been lost). A handling settles it by handling its message,
    /// or by dead-lettering it (the row is then marked dead-lettered). When the broker
    /// dead-letters the message by itself (its max delivery count reached: a handler that
    /// kills the process each time, a RabbitMQ delivery limit), nothing settles the row;
    /// after this many sends the dispatcher marks it dead-lettered with the reason
    /// [`TIMEOUT_DISPATCHES_EXHAUSTED`](crate::recoverability::reasons::TIMEOUT_DISPATCHES_EXHAUSTED)
    /// instead of sending it again, and logs a warning. Operators see it in
    /// `courier::admin` and `courier timeouts`; a copy still in the queue, or one
    /// resubmitted from the dead-letter queue, is still handled.
    pub fn max_timeout_dispatches(mut self, n: u32) -> Self {
        self.max_timeout_dispatches = n;
        self
    }

    /// Whether an endpoint with a [`store`](Self::store) handles messages that arrived
    /// without a message id (default `false`).
    ///
    /// The inbox recognises a redelivered message by its id, so by default such a message
    /// is dead-lettered at once with the reason
    /// [`MISSING_MESSAGE_ID`](crate::recoverability::reasons::MISSING_MESSAGE_ID) and a
    /// description saying what the producer must set. With `true` it gets a fresh id at
    /// each delivery and is handled **at least once**: a redelivery (a lost connection, a
    /// failed acknowledgement) is handled again, its writes and sent messages included.
    /// Messages with an id keep their exactly-once effects. Only a producer outside
    /// Courier can send a message without an id (RabbitMQ's `message_id` left unset);
    /// every Courier sender refuses one. An endpoint without a store always handles them,
    /// with a fresh id at each delivery, as it handles everything: at least once.
    pub fn accept_messages_without_id(mut self, yes: bool) -> Self {
        self.accept_messages_without_id = yes;
        self
    }

    /// Samples the depth of the input queue (active, scheduled and dead-lettered
    /// messages) and, with a store, the endpoint's outbox and inbox rows, every `every` by
    /// the endpoint's clock, into the gauges `courier.queue.*`, `courier.outbox.backlog`,
    /// `courier.outbox.oldest_age` and `courier.inbox.rows` (see docs/observability.md).
    /// Off by default: each sample costs the broker and the store a count.
    pub fn sample_queue_metrics(mut self, every: Duration) -> Self {
        self.metrics_sampling = Some(every);
        self
    }

    /// A value every handler can read with [`Context::state`](crate::Context::state).
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        self.extensions.insert(value);
        self
    }

    /// Creates the input queue (and a subscription per handled event) if missing, and
    /// starts receiving.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`] for a missing transport, zero concurrency, two types
    /// sharing a wire name or a bad retry policy; [`ErrorKind::InvalidEntityName`]; the
    /// transport's errors creating the topology.
    pub async fn start(self) -> Result<RunningEndpoint> {
        validate_name(&self.name)?;
        self.routes.validate()?;
        self.policy.validate()?;
        let invalid = |reason: &str| {
            Err(Error::new(ErrorKind::InvalidOptions {
                reason: reason.to_owned(),
            }))
        };
        let Some(transport) = self.transport else {
            return invalid("an endpoint needs a transport: call EndpointBuilder::transport");
        };
        if self.concurrency == 0 {
            return invalid("concurrency must be at least 1");
        }
        if self.group_commit == 0 {
            return invalid("group_commit must be at least 1 (1: each message commits alone)");
        }
        if let Some(e) = self.errors.first() {
            return invalid(e);
        }
        if self.registrations.is_empty() {
            return invalid("an endpoint needs at least one handler");
        }
        if let Some(missing) = routing::missing_routes(&self.name, &self.routes, &self.declared) {
            return Err(Error::new(ErrorKind::InvalidOptions { reason: missing }));
        }
        if !self.sagas.is_empty() && self.store.is_none() {
            return invalid("an endpoint with sagas needs a store: call EndpointBuilder::store");
        }
        if self.max_timeout_dispatches == 0 {
            return invalid("max_timeout_dispatches must be at least 1");
        }
        if self.inbox_retention < Duration::from_secs(60) {
            return invalid("inbox_retention must be at least a minute (redeliveries would be handled again)");
        }
        if let Some(options) = &self.history {
            history::check_start(&self.name, options, self.store.as_deref())?;
        }
        if self.batch_holding > 0 {
            batch::check_start(
                &self.name,
                &self.queue_options,
                self.batch_max_wait,
                self.group_commit,
                self.store.as_deref(),
            )
            .await?;
        }
        let clock = endpoint_clock(&self.name, self.clock, transport.clock());
        let Registry { by_name, entries } = registry::registry(self.registrations)?;
        let mut options = self.queue_options;
        let sessions = options.requires_session;
        options.max_delivery_count = options
            .max_delivery_count
            .max(self.policy.attempts_per_round().saturating_add(1));
        transport.create_queue(&self.name, &options).await?;
        let mut sources = vec![crate::entity::EntityPath::queue(self.name.clone())];
        for entry in &entries {
            if let Some(topic) = self.routes.topic_of(entry.name) {
                transport
                    .create_topic(topic, &crate::entity::TopicOptions::default())
                    .await?;
                transport.create_subscription(topic, &self.name, &options).await?;
                sources.push(crate::entity::EntityPath::subscription(topic, self.name.clone()));
            }
        }
        if self.check_routes {
            routing::warn_missing_queues(&*transport, &self.name, &self.routes).await;
        }
        let history = self
            .history
            .map(|options| Arc::new(history::Recorder::new(&self.name, options)));
        let config = runtime::Config {
            name: self.name.into(),
            transport,
            routes: self.routes,
            by_name,
            policy: self.policy,
            clock,
            concurrency: self.concurrency.saturating_add(self.batch_holding),
            prefetch: self
                .prefetch
                .unwrap_or(self.concurrency.saturating_add(self.batch_holding).saturating_mul(2)),
            max_lock_renewal: self.max_lock_renewal,
            shutdown_timeout: self.shutdown_timeout,
            receive_wait: self.receive_wait,
            extensions: Arc::new(self.extensions),
            store: self.store,
            inbox_retention: self.inbox_retention,
            max_timeout_dispatches: self.max_timeout_dispatches,
            sources,
            sessions,
            has_sagas: !self.sagas.is_empty(),
            saga_stats: self.saga_stats,
            observer: self.observer,
            history,
            group_size: self.group_commit,
            accept_messages_without_id: self.accept_messages_without_id,
            metrics_sampling: self.metrics_sampling,
        };
        runtime::start(config).await
    }
}

/// The endpoint's clock: the one set on the builder, else the transport's, else the
/// system clock. A builder's clock that is not the transport's is kept, with a warning.
fn endpoint_clock(endpoint: &str, set: Option<Arc<dyn Clock>>, transport: Option<Arc<dyn Clock>>) -> Arc<dyn Clock> {
    match (set, transport) {
        (Some(set), Some(transport)) => {
            if !same_clock(&set, &transport) {
                tracing::warn!(
                    endpoint,
                    "the endpoint's clock (EndpointBuilder::clock) is not its transport's: saga timeouts and \
                     delayed retries come due by the endpoint's clock while the transport stamps and \
                     delivers by its own; give both the same clock, or leave EndpointBuilder::clock unset \
                     to use the transport's"
                );
            }
            set
        }
        (Some(set), None) => set,
        (None, Some(transport)) => transport,
        (None, None) => Arc::new(SystemClock),
    }
}

/// Whether two clocks read the same time: by [`Clock::identity`] when both tell it, else
/// whether they are one object (their data pointers; vtables may differ).
fn same_clock(a: &Arc<dyn Clock>, b: &Arc<dyn Clock>) -> bool {
    match (a.identity(), b.identity()) {
        (Some(x), Some(y)) => x == y,
        _ => std::ptr::eq(Arc::as_ptr(a).cast::<()>(), Arc::as_ptr(b).cast::<()>()),
    }
}
