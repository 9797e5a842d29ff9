//! A test harness for handlers and sagas: one endpoint on the in-memory embedded broker,
//! a virtual clock, and a record of what the endpoint did.
//!
//! [`TestEndpoint::start`] runs a real endpoint (the same runtime, store and broker code
//! as in production) with its store in the broker's own database, so each handling is one
//! transaction. Time stands still until the test moves it: [`TestEndpoint::advance`]
//! walks the clock forward from one due time to the next (timeouts, scheduled messages,
//! delayed retries) and lets the endpoint handle what came due at each, so a one-hour
//! timeout is tested in milliseconds and fires at its own time, not at the end of the
//! jump. Every call that makes work ([`send`](TestEndpoint::send),
//! [`advance`](TestEndpoint::advance)) returns once the endpoint has nothing left to do
//! at the current time.
//!
//! What the endpoint did is recorded from the handlings that committed (a handling that
//! failed and rolled back left nothing): the messages sent ([`sent`](TestEndpoint::sent))
//! and published ([`published`](TestEndpoint::published)), the saga timeouts requested,
//! fired, cancelled and discarded ([`timeouts`](TestEndpoint::timeouts)); the broker is
//! asked for what was dead-lettered ([`dead_lettered`](TestEndpoint::dead_lettered)) and
//! the store for saga state ([`saga`](TestEndpoint::saga)). The application's own tables
//! (created by its migrations, [`TestEndpointBuilder::migrations`]) are read through
//! [`read_pool`](TestEndpoint::read_pool).
//!
//! # Queries
//!
//! One rule: **every query is an `async fn` that returns [`courier::Result`](crate::Result)**,
//! so each reads `t.query().await?` (or `.await.unwrap()` in a test). A query asks what
//! the endpoint did or holds: [`messages`](TestEndpoint::messages),
//! [`sent`](TestEndpoint::sent), [`published`](TestEndpoint::published),
//! [`handled`](TestEndpoint::handled), [`timeouts`](TestEndpoint::timeouts),
//! [`pending_timeouts`](TestEndpoint::pending_timeouts),
//! [`dead_lettered`](TestEndpoint::dead_lettered), [`saga`](TestEndpoint::saga),
//! [`stats`](TestEndpoint::stats). Some answer from memory today; they have the same
//! shape anyway, so that none changes when it comes to ask the broker or the store, and
//! none has to be remembered apart. The harness's parts are plain accessors, neither
//! async nor fallible: [`broker`](TestEndpoint::broker),
//! [`endpoint`](TestEndpoint::endpoint), [`read_pool`](TestEndpoint::read_pool),
//! [`clock`](TestEndpoint::clock), [`now`](TestEndpoint::now).
//!
//! # Examples
//!
//! ```
//! use std::time::Duration;
//! use courier::saga::SagaContext;
//! use courier::testing::{TestEndpoint, TimeoutStatus};
//! use courier::{HandlerError, Routes};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct Registered { user: String }
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct Confirmed { user: String }
//! #[derive(Serialize, Deserialize, courier::Message)]
//! struct Expired;
//! #[derive(Debug, PartialEq, Serialize, Deserialize, courier::Message)]
//! struct RemoveUser { user: String }
//!
//! #[derive(Default, Serialize, Deserialize)]
//! struct SignUp { user: String }
//!
//! #[courier::saga]
//! impl SignUp {
//!     #[start(by = user)]
//!     async fn registered(&mut self, msg: Registered, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         self.user = msg.user;
//!         // Keyed by its type: a second Registered replaces it rather than adding one.
//!         ctx.request_timeout(Duration::from_secs(3600), &Expired)?;
//!         Ok(())
//!     }
//!
//!     #[handle(by = user)]
//!     async fn confirmed(&mut self, _msg: Confirmed, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         ctx.complete(); // cancels the expiry with the instance
//!         Ok(())
//!     }
//!
//!     #[timeout]
//!     async fn expired(&mut self, _t: Expired, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
//!         ctx.send(&RemoveUser { user: self.user.clone() })?;
//!         ctx.complete();
//!         Ok(())
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let routes = Routes::new().send::<RemoveUser>("users");
//! let t = TestEndpoint::start("accounts", |e| e.routes(routes).saga::<SignUp>()).await?;
//!
//! t.send(&Registered { user: "ann".into() }).await?;
//! assert!(t.saga::<SignUp>("ann").await?.is_some());
//! assert_eq!(t.timeouts().await?[0].status, TimeoutStatus::Pending);
//!
//! t.advance(Duration::from_secs(59 * 60)).await?;          // not yet
//! assert!(t.sent::<RemoveUser>().await?.is_empty());
//! t.advance(Duration::from_secs(60)).await?;               // the hour is up
//! assert_eq!(t.sent::<RemoveUser>().await?, vec![RemoveUser { user: "ann".into() }]);
//! assert_eq!(t.timeouts().await?[0].status, TimeoutStatus::Fired);
//! assert!(t.saga::<SignUp>("ann").await?.is_none());
//! t.shutdown().await?;
//! # Ok(())
//! # }
//! ```

mod record;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::SqlitePool;
use sqlx::migrate::Migrator;

use self::record::Recorder;
pub use self::record::{DeadLetter, RecordedTimeout, SentMessage, TimeoutStatus};
use crate::clock::{Clock, VirtualClock};
use crate::embedded::{Embedded, EmbeddedStore};
use crate::endpoint::bus::SendOptions;
use crate::endpoint::handler::Message;
use crate::endpoint::{Endpoint, EndpointBuilder, EndpointStats, RunningEndpoint, ShutdownReport};
use crate::entity::{EntityPath, QueueOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{MessageState, SequenceNumber};
use crate::saga::Saga;
use crate::store::Store;
use crate::transport::Transport;

/// How long (real time) the harness waits for the endpoint to run out of work before it
/// reports an error: a handler that never ends, or messages that keep coming.
pub const SETTLE_WITHIN: Duration = Duration::from_secs(10);

/// The most messages read per look at a queue while waiting for the endpoint to settle.
const PEEK_PAGE: usize = 256;

/// An endpoint under test: in-memory broker, store in the broker's database, virtual
/// clock, and a record of what it did (see the [module documentation](self)).
pub struct TestEndpoint {
    broker: Embedded,
    store: EmbeddedStore,
    clock: VirtualClock,
    endpoint: RunningEndpoint,
    record: Arc<Recorder>,
}

impl std::fmt::Debug for TestEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEndpoint")
            .field("endpoint", &self.endpoint)
            .field("now", &self.clock.now())
            .finish_non_exhaustive()
    }
}

/// Options of a [`TestEndpoint`] beyond its handlers: `TestEndpoint::builder(name)`.
#[derive(Debug)]
#[must_use]
pub struct TestEndpointBuilder {
    name: String,
    start: Option<DateTime<Utc>>,
    migrations: Option<Migrator>,
}

impl TestEndpointBuilder {
    /// Stands the virtual clock at `start` (by default, the current time).
    pub fn start_at(mut self, start: DateTime<Utc>) -> Self {
        self.start = Some(start);
        self
    }

    /// Applies the application's own migrations to the broker's database before the
    /// endpoint starts, as [`EmbeddedBuilder::migrations`](crate::EmbeddedBuilder::migrations)
    /// does in production: `.migrations(sqlx::migrate!("./migrations"))`. Handlers write
    /// those tables with `ctx.transaction::<courier::sqlx::Sqlite>()`, the test reads them
    /// through [`TestEndpoint::read_pool`].
    pub fn migrations(mut self, migrator: Migrator) -> Self {
        self.migrations = Some(migrator);
        self
    }

    /// Starts the endpoint. `configure` adds the routes, handlers, sagas and options; the
    /// harness sets the transport, store and clock (its own, whatever `configure` sets).
    /// The queues of the routes' commands are created, so handlers can send to endpoints
    /// that are not running. The topics of the routes' events are not: as on every
    /// transport, a publish creates its topic if it is missing (and the endpoint creates
    /// those of the events it handles, with its subscriptions).
    ///
    /// # Errors
    /// As [`EmbeddedBuilder::open`](crate::EmbeddedBuilder::open) (a migration that
    /// failed) and [`EndpointBuilder::start`].
    pub async fn start(self, configure: impl FnOnce(EndpointBuilder) -> EndpointBuilder) -> Result<TestEndpoint> {
        let clock = VirtualClock::new(self.start.unwrap_or_else(|| VirtualClock::starting_now().now()));
        let shared_clock: Arc<dyn Clock> = Arc::new(clock.clone());
        let mut broker = Embedded::builder().in_memory().clock(shared_clock.clone());
        if let Some(migrator) = self.migrations {
            broker = broker.migrations(migrator);
        }
        let broker = broker.open().await?;
        let store = broker.store();
        let record = Arc::new(Recorder::default());
        let builder = configure(Endpoint::builder(&self.name));
        // Queues only: a command to a queue that does not exist fails on every transport,
        // and handlers under test may send to endpoints that are not running. A topic is
        // created by its first publish (or by a subscriber), as on the transports, so a
        // publish to a topic nobody created is tested as it runs in production.
        for (_, queue) in builder.routes_ref().commands() {
            broker.create_queue(queue, &QueueOptions::default()).await?;
        }
        let endpoint = builder
            .transport(Arc::new(broker.clone()))
            .store(Arc::new(store.clone()))
            .clock(shared_clock)
            .observer(record.clone())
            .start()
            .await?;
        let harness = TestEndpoint {
            broker,
            store,
            clock,
            endpoint,
            record,
        };
        harness.settle().await?;
        Ok(harness)
    }
}

impl TestEndpoint {
    /// A builder for a harness with options (the clock's start, the application's
    /// migrations); [`start`](Self::start) is `builder(name).start(configure)`.
    pub fn builder(name: &str) -> TestEndpointBuilder {
        TestEndpointBuilder {
            name: name.to_owned(),
            start: None,
            migrations: None,
        }
    }

    /// Starts endpoint `name` with the clock at the current time (see
    /// [`TestEndpointBuilder::start`]).
    ///
    /// # Errors
    /// As [`EndpointBuilder::start`].
    pub async fn start(name: &str, configure: impl FnOnce(EndpointBuilder) -> EndpointBuilder) -> Result<Self> {
        Self::builder(name).start(configure).await
    }

    /// As [`start`](Self::start), with the clock standing at `start`.
    ///
    /// # Errors
    /// As [`EndpointBuilder::start`].
    pub async fn start_at(
        name: &str,
        start: DateTime<Utc>,
        configure: impl FnOnce(EndpointBuilder) -> EndpointBuilder,
    ) -> Result<Self> {
        Self::builder(name).start_at(start).start(configure).await
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &RunningEndpoint {
        &self.endpoint
    }

    /// The broker (to create more queues, peek, or send as another endpoint would).
    pub fn broker(&self) -> &Embedded {
        &self.broker
    }

    /// Query-only connections to the broker's database: read the application's own
    /// tables (created by the [migrations](TestEndpointBuilder::migrations)) as the
    /// handlers left them. See [`Embedded::read_pool`]; a write through it fails.
    pub fn read_pool(&self) -> &SqlitePool {
        self.broker.read_pool()
    }

    /// The virtual clock the broker and the endpoint read.
    pub fn clock(&self) -> &VirtualClock {
        &self.clock
    }

    /// The virtual time now.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Sends `message` to this endpoint and waits until the endpoint has nothing left to
    /// do (it was handled, retried as far as time allows, or dead-lettered).
    ///
    /// # Errors
    /// The send's error; [`ErrorKind::InvalidOperation`] if the endpoint is still busy
    /// after [`SETTLE_WITHIN`].
    pub async fn send<M: Message>(&self, message: &M) -> Result<()> {
        self.send_with(message, SendOptions::new()).await
    }

    /// As [`send`](Self::send), with options (headers, message id, ...). Without a
    /// destination the message goes to this endpoint.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn send_with<M: Message>(&self, message: &M, options: SendOptions) -> Result<()> {
        let endpoint = &self.endpoint;
        let options = if options.destination.is_some() {
            options
        } else {
            options.to(endpoint.name().to_owned())
        };
        endpoint.bus().send_with(message, options).await?;
        self.settle().await
    }

    /// Publishes an event (the endpoint gets it if it handles it) and waits as
    /// [`send`](Self::send) does.
    ///
    /// # Errors
    /// As [`send`](Self::send).
    pub async fn publish<M: Message>(&self, event: &M) -> Result<()> {
        self.endpoint.bus().publish(event).await?;
        self.settle().await
    }

    /// Moves the clock forward by `by`, stopping at every due time on the way (saga
    /// timeouts, scheduled messages, delayed retries) and letting the endpoint handle
    /// what came due there before going on; returns when the endpoint has nothing left to
    /// do at the end time.
    ///
    /// # Errors
    /// As [`settle`](Self::settle); [`ErrorKind::InvalidOptions`] for a duration out of
    /// range.
    pub async fn advance(&self, by: Duration) -> Result<()> {
        let by = chrono::Duration::from_std(by).map_err(|_| {
            Error::new(ErrorKind::InvalidOptions {
                reason: format!("cannot advance the clock by {by:?}"),
            })
        })?;
        let target = self.clock.now() + by;
        self.settle().await?;
        loop {
            let now = self.clock.now();
            match self.next_due().await? {
                Some(due) if due > now && due < target => self.clock.set(due),
                _ => {
                    if target > now {
                        self.clock.set(target);
                    }
                    self.settle().await?;
                    return Ok(());
                }
            }
            self.settle().await?;
        }
    }

    /// Waits until the endpoint has nothing left to do at the current virtual time: no
    /// message of its sources is ready, locked or due, no saga timeout is due, no handler
    /// runs. [`send`](Self::send) and [`advance`](Self::advance) call it; call it after
    /// sending through [`broker`](Self::broker) yourself.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOperation`] if that does not happen within [`SETTLE_WITHIN`]
    /// (real time); the broker's or store's errors.
    pub async fn settle(&self) -> Result<()> {
        let deadline = tokio::time::Instant::now() + SETTLE_WITHIN;
        let mut quiet_in_a_row = 0;
        loop {
            let busy = self.busy().await?;
            match busy {
                None => {
                    quiet_in_a_row += 1;
                    if quiet_in_a_row == 2 {
                        return Ok(());
                    }
                }
                Some(what) => {
                    quiet_in_a_row = 0;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Error::new(ErrorKind::InvalidOperation {
                            reason: format!("the endpoint under test did not settle within {SETTLE_WITHIN:?}: {what}"),
                        }));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// What the endpoint still has to do now, if anything.
    async fn busy(&self) -> Result<Option<String>> {
        let endpoint = &self.endpoint;
        // Messages in a batch that waits for its time limit wait for the clock.
        let (batched, _) = endpoint.batches_waiting();
        let running = endpoint.stats().running.saturating_sub(batched as u64);
        if running > 0 {
            return Ok(Some(format!("{running} handler(s) running")));
        }
        let now = self.clock.now();
        let mut batched = batched;
        for path in endpoint.sources() {
            let (active, due) = self.scan(path).await?;
            let waiting = active.min(batched);
            batched -= waiting;
            let active = active - waiting;
            if active > 0 {
                return Ok(Some(format!("{active} message(s) ready or locked in {path}")));
            }
            if due.is_some_and(|at| at <= now) {
                return Ok(Some(format!("a scheduled message in {path} is due")));
            }
        }
        if let Some(at) = self.timeout_due().await?
            && at <= now
        {
            return Ok(Some(format!("a saga timeout due at {at} is not yet sent")));
        }
        Ok(None)
    }

    /// The earliest unclaimed saga timeout of the endpoint (none if it has no saga).
    async fn timeout_due(&self) -> Result<Option<DateTime<Utc>>> {
        let name = self.endpoint.name();
        match self.store.next_timeout_due(name).await {
            Ok(at) => Ok(at),
            Err(e) if matches!(e.kind(), ErrorKind::Unsupported { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Active messages of `path`, and the earliest scheduled one.
    async fn scan(&self, path: &EntityPath) -> Result<(usize, Option<DateTime<Utc>>)> {
        let mut from: SequenceNumber = 0;
        let mut active = 0;
        let mut earliest: Option<DateTime<Utc>> = None;
        loop {
            let page = self.broker.peek(path, from, PEEK_PAGE).await?;
            for m in &page {
                match m.broker.state {
                    MessageState::Active => active += 1,
                    MessageState::Scheduled => {
                        if let Some(at) = m.envelope.scheduled_enqueue_time {
                            earliest = Some(earliest.map_or(at, |e| e.min(at)));
                        }
                    }
                    MessageState::Deferred | MessageState::DeadLettered => {}
                }
            }
            match page.last() {
                Some(last) if page.len() == PEEK_PAGE => from = last.broker.sequence_number + 1,
                _ => return Ok((active, earliest)),
            }
        }
    }

    /// The next time something becomes due: a saga timeout, a scheduled message, or a
    /// batch's time limit.
    async fn next_due(&self) -> Result<Option<DateTime<Utc>>> {
        let mut next = self.timeout_due().await?;
        if let (_, Some(at)) = self.endpoint.batches_waiting() {
            next = Some(next.map_or(at, |n| n.min(at)));
        }
        for path in self.endpoint.sources() {
            if let (_, Some(at)) = self.scan(path).await? {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        Ok(next)
    }

    /// Every message the endpoint's handlers sent or published, in order.
    ///
    /// # Errors
    /// None today; a `Result` as every query of the harness (see the [module
    /// documentation](self#queries)).
    pub async fn messages(&self) -> Result<Vec<SentMessage>> {
        Ok(record::messages(self.record.handlings()))
    }

    fn decoded<M: Message>(&self, topic: bool) -> Result<Vec<M>> {
        record::messages(self.record.handlings())
            .iter()
            .filter(|m| m.is_topic == topic && m.envelope.message_type.as_deref() == Some(M::NAME))
            .map(|m| {
                m.decode::<M>().map_err(|e| {
                    Error::with_source(
                        ErrorKind::Corrupt {
                            detail: format!(
                                "a message the endpoint sent to {} with wire name {} does not decode as {}: {e}",
                                m.destination,
                                M::NAME,
                                std::any::type_name::<M>()
                            ),
                        },
                        e,
                    )
                })
            })
            .collect()
    }

    /// The messages of type `M` the handlers sent to queues (commands, replies; not saga
    /// timeouts, see [`timeouts`](Self::timeouts)), in order.
    ///
    /// # Errors
    /// [`ErrorKind::Corrupt`] for a message with `M`'s wire name whose body does not
    /// decode as `M`.
    pub async fn sent<M: Message>(&self) -> Result<Vec<M>> {
        self.decoded(false)
    }

    /// The events of type `M` the handlers published, in order.
    ///
    /// # Errors
    /// As [`sent`](Self::sent).
    pub async fn published<M: Message>(&self) -> Result<Vec<M>> {
        self.decoded(true)
    }

    /// How many handlings committed.
    ///
    /// # Errors
    /// None today (see [`messages`](Self::messages)).
    pub async fn handled(&self) -> Result<usize> {
        Ok(self.record.handlings().len())
    }

    /// Every saga timeout requested, in the order requested, with where it stands.
    ///
    /// # Errors
    /// None today (see [`messages`](Self::messages)).
    /// A timeout whose message was dead-lettered is [`TimeoutStatus::DeadLettered`] (its
    /// row in the store is marked so), with the reason.
    ///
    /// # Errors
    /// The store's errors (reading which timeouts were dead-lettered).
    pub async fn timeouts(&self) -> Result<Vec<RecordedTimeout>> {
        let mut timeouts = record::timeouts(self.record.handlings());
        if timeouts.iter().any(|t| t.status == TimeoutStatus::Pending) {
            let dead: std::collections::HashMap<String, Option<String>> = sqlx::query_as(
                "SELECT id, dead_letter_reason FROM courier_saga_timeout WHERE dead_lettered_at IS NOT NULL",
            )
            .fetch_all(self.broker.read_pool())
            .await
            .map_err(|e| crate::store::db_error("cannot read the dead-lettered saga timeouts", e))?
            .into_iter()
            .collect();
            for t in timeouts.iter_mut().filter(|t| t.status == TimeoutStatus::Pending) {
                if let Some(reason) = dead.get(t.handle.as_str()) {
                    t.status = TimeoutStatus::DeadLettered;
                    t.dead_letter_reason = reason.clone();
                }
            }
        }
        Ok(timeouts)
    }

    /// The timeouts still pending: not fired, cancelled, replaced or dead-lettered.
    ///
    /// # Errors
    /// As [`timeouts`](Self::timeouts).
    pub async fn pending_timeouts(&self) -> Result<Vec<RecordedTimeout>> {
        let mut t = self.timeouts().await?;
        t.retain(|t| t.status == TimeoutStatus::Pending);
        Ok(t)
    }

    /// The endpoint's counters: [`RunningEndpoint::stats`], synchronous as it is (it
    /// reads counters in memory). It was `async` and returned a `Result` before: write
    /// `t.stats().completed` for `t.stats().await?.completed`.
    pub fn stats(&self) -> EndpointStats {
        self.endpoint.stats()
    }

    /// The messages in the dead-letter queues of the endpoint's sources.
    ///
    /// # Errors
    /// The broker's errors.
    pub async fn dead_lettered(&self) -> Result<Vec<DeadLetter>> {
        let mut dead = Vec::new();
        for source in self.endpoint.sources() {
            let path = source.clone().dead_letter();
            let mut from: SequenceNumber = 0;
            loop {
                let page = self.broker.peek(&path, from, PEEK_PAGE).await?;
                let full = page.len() == PEEK_PAGE;
                if let Some(last) = page.last() {
                    from = last.broker.sequence_number + 1;
                }
                dead.extend(page.into_iter().map(|m| DeadLetter {
                    path: path.clone(),
                    reason: m.broker.dead_letter_reason,
                    description: m.broker.dead_letter_description,
                    envelope: m.envelope,
                }));
                if !full {
                    break;
                }
            }
        }
        Ok(dead)
    }

    /// The state of saga `S`'s instance `correlation`, if it exists (not completed).
    ///
    /// # Errors
    /// The store's errors; [`ErrorKind::Corrupt`] if the stored state does not decode as
    /// `S` (after [`Saga::migrate`] when it was stored at an older version).
    pub async fn saga<S: Saga>(&self, correlation: &str) -> Result<Option<S>> {
        let Some(stored) = self.store.saga_state(S::NAME, correlation).await? else {
            return Ok(None);
        };
        // As a handler would see it: migrated when it was stored at an older version.
        crate::saga::state::decode_state(&stored, correlation)
            .map(Some)
            .map_err(|e| {
                Error::new(ErrorKind::Corrupt {
                    detail: e.chain().join(": "),
                })
            })
    }

    /// Stops the endpoint gracefully.
    ///
    /// # Errors
    /// As [`RunningEndpoint::shutdown`].
    pub async fn shutdown(self) -> Result<ShutdownReport> {
        self.endpoint.shutdown().await
    }
}
