//! The Postgres transport: queues, topics, subscriptions and sessions in tables of the
//! schema `courier`, in the database the application already runs. Any number of
//! processes share them: competing receivers take disjoint messages with
//! `FOR UPDATE SKIP LOCKED`, and every lock, settlement and renewal is a fenced statement
//! on the message's row. See docs/postgres-reference.md.
//!
//! The rooms: `entities` (create, look up, delete), `send` (insert with fan-out and
//! notification, schedule, cancel), `receive` (PeekLock, ReceiveAndDelete, deferred, the
//! time-driven maintenance, waiting), `settle` (settle and renew, fenced by the token),
//! `sessions` (session locks and state), `browse` (peek, counts), `rows` (columns, row
//! to message, lock tokens), `wake` (LISTEN/NOTIFY) and `store` (the one-transaction
//! unit of work of an endpoint whose store is this database).
//!
//! # Time
//!
//! Every time (enqueued, locked-until, scheduled, expiry) is bound from the transport's
//! [`Clock`], never Postgres' `now()`, so tests drive the broker with a virtual clock.
//! The time-driven work (activating scheduled messages, dead-lettering expired ones) is
//! done by whoever receives from, browses or counts the entity next: a scheduled message
//! is activated by the first receive after its time, with its scheduled time as its
//! enqueued time.

mod browse;
mod entities;
mod holder;
mod in_tx;
mod receive;
mod rows;
mod send;
mod sessions;
mod settle;
pub(crate) mod store;
mod upkeep;
mod wake;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use tokio::sync::Semaphore;

use self::entities::Kind;
use self::receive::{Link, PgReceiver};
use self::rows::check_outgoing;
use self::send::PgSender;
pub use self::store::PgTransportStore;
use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
use crate::clock::{Clock, SystemClock};
use crate::entity::{EntityCounts, EntityPath, QueueOptions, SubscriptionOptions, TopicOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, ReceivedMessage, SequenceNumber};
use crate::store::db_error;
use crate::transport::{
    BentRule, Capabilities, Receiver, Sender, SenderOptions, SessionReceiver, SessionSelector, Transport,
};

/// How often a waiting receiver looks again when no notification came (by default).
pub const DEFAULT_PG_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The shortest time between two of a transport's statements notifying waiting receivers
/// (by default): see [`PgTransportBuilder::notify_interval`].
pub const DEFAULT_PG_NOTIFY_INTERVAL: Duration = Duration::from_millis(2);

/// The longest [`PgTransportBuilder::notify_interval`] taken.
const MAX_NOTIFY_INTERVAL: Duration = Duration::from_secs(1);

/// What the transport's handles share.
pub(crate) struct Shared {
    pub(crate) pool: PgPool,
    pub(crate) clock: Arc<dyn Clock>,
    /// The database's lock-token tag (`courier.transport_instance`).
    pub(crate) tag: u32,
    pub(crate) max_message_size: usize,
    pub(crate) poll_interval: Duration,
    pub(crate) wakers: Arc<wake::Wakers>,
    /// This instance's holder key, stamped on the messages it locks.
    pub(crate) holder: i64,
    /// Per entity: the sweep's last run and a failing maintenance's backoff.
    pub(crate) upkeeps: upkeep::Upkeeps,
    /// Which of the transport's own dead-letterings are logged in full (`loglimit.rs`).
    pub(crate) dead_log: crate::loglimit::LogLimiter,
    closed: AtomicBool,
    /// Whether the transport opened the pool (and closes it on close).
    owns_pool: bool,
    /// Set once the `LISTEN` connection is in place (see [`Shared::listen`]).
    listening: tokio::sync::OnceCell<()>,
    listener: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Keeps the holder's advisory lock.
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The ids of the queues and topics the endpoint's store sent to (`store::send_in`).
    pub(crate) destinations: in_tx::Destinations,
    /// Notifies receivers of what this process sent, after each send committed.
    notifier: wake::Notifier,
    /// `Sender` sends in flight (`send::send_on_pool`).
    pub(crate) sends_in_flight: std::sync::atomic::AtomicUsize,
}

impl Shared {
    pub(crate) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            Err(Error::new(ErrorKind::Closed))
        } else {
            Ok(())
        }
    }

    /// Opens the transport's `LISTEN` connection unless it is open: called before
    /// anything of this transport waits for a notification (a receiver, a session
    /// accept), and returns once `LISTEN` is in place, so that whatever is committed after
    /// it returns is notified, and what was committed before is found by the first look.
    /// A process that only sends never opens it: a listening backend reads every
    /// notification in a transaction of its own, one more Postgres transaction per send
    /// (docs/measurements.md, "The send path"). A failed attempt leaves it closed, and
    /// the next receiver tries again.
    ///
    /// # Errors
    /// [`ErrorKind::Closed`]; a storage error when the connection cannot be opened or
    /// `LISTEN` fails (transient).
    pub(crate) async fn listen(&self) -> Result<()> {
        self.check_open()?;
        self.listening
            .get_or_try_init(|| async {
                let task = wake::listen(&self.pool, Arc::downgrade(&self.wakers)).await?;
                *self.listener.lock().unwrap_or_else(PoisonError::into_inner) = Some(task);
                Ok::<(), Error>(())
            })
            .await
            .map_err(|e| self.closed_or(e))?;
        // Closed meanwhile: its tasks were stopped before this one was kept.
        if self.closed.load(Ordering::Acquire) {
            self.stop_tasks();
            return Err(Error::new(ErrorKind::Closed));
        }
        Ok(())
    }

    /// Notifies the receivers of `entities` (queues and topics sent to by a transaction
    /// that has committed), soon, from a statement of the transport's own
    /// ([`wake::Notifier`]).
    /// Once the transport is closed, nothing more is notified (its notifier stopped; a
    /// send committing meanwhile is found by the receivers' poll).
    pub(crate) fn wake_after_commit(&self, entities: impl IntoIterator<Item = i64>) {
        // Nothing to wake (a handling that sent nothing, a send that notified itself):
        // the notifier's lock is not taken.
        let mut entities = entities.into_iter().peekable();
        if entities.peek().is_some() && !self.closed.load(Ordering::Acquire) {
            self.notifier.after_commit(&self.pool, entities);
        }
    }

    /// `e`, or `Closed` when the transport was closed meanwhile (its pool refuses).
    pub(crate) fn closed_or(&self, e: Error) -> Error {
        if self.closed.load(Ordering::Acquire) {
            Error::new(ErrorKind::Closed)
        } else {
            e
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop_tasks();
    }
}

impl Shared {
    fn stop_tasks(&self) {
        self.notifier.stop();
        for slot in [&self.listener, &self.keeper] {
            if let Some(task) = slot.lock().unwrap_or_else(PoisonError::into_inner).take() {
                task.abort();
            }
        }
    }
}

/// Settings of a [`PostgresTransport`]: `PostgresTransport::builder(url)`.
#[derive(Debug, Clone)]
#[must_use]
pub struct PgTransportBuilder {
    url: Option<String>,
    pool: Option<PgPool>,
    clock: Option<Arc<dyn Clock>>,
    max_message_size: usize,
    poll_interval: Duration,
    notify_interval: Duration,
    migrate: bool,
    max_connections: u32,
}

impl PgTransportBuilder {
    /// Uses the application's pool instead of connecting to a URL. Once it has a
    /// receiver, the transport keeps one of its connections for `LISTEN`.
    pub fn pool(mut self, pool: PgPool) -> Self {
        self.pool = Some(pool);
        self
    }

    /// The clock every time is read from (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The largest message accepted (default [`DEFAULT_MAX_MESSAGE_SIZE`], 1 MiB).
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// How often a waiting receiver looks again when no notification came (default
    /// [`DEFAULT_PG_POLL_INTERVAL`]): the bound on how late a message is seen when its
    /// notification was lost, and the cost of an idle receiver (one query per interval).
    pub fn poll_interval(mut self, every: Duration) -> Self {
        self.poll_interval = every.max(Duration::from_millis(10));
        self
    }

    /// The shortest time between two statements by which this transport notifies waiting
    /// receivers (of any process) of what it sent (default [`DEFAULT_PG_NOTIFY_INTERVAL`],
    /// 2 ms; at most 1 s). Sends are notified after they commit, from a statement of the
    /// transport's own: the first send after a quiet interval at once, the sends during
    /// an interval together at its end. A longer interval spares the server work under a
    /// steady load (each notification is a transaction, and every listening connection
    /// reads it) and makes a waiting receiver see a message up to that much later;
    /// `Duration::ZERO` sends one statement right after the other. The interval is wall-clock
    /// time (tokio's timer), not the transport's [`clock`](Self::clock): it paces
    /// statements, it stamps nothing. Figures:
    /// docs/measurements-postgres-gaps.md ("The notify interval, in turns").
    ///
    /// ```no_run
    /// # async fn open() -> Result<(), courier::Error> {
    /// use std::time::Duration;
    /// // Many sending processes, receivers that may wait 10 ms more in a burst:
    /// let broker = courier::PostgresTransport::builder("postgres://app@localhost/app")
    ///     .notify_interval(Duration::from_millis(10))
    ///     .open()
    ///     .await?;
    /// # drop(broker);
    /// # Ok(()) }
    /// ```
    pub fn notify_interval(mut self, interval: Duration) -> Self {
        self.notify_interval = interval.min(MAX_NOTIFY_INTERVAL);
        self
    }

    /// Whether [`open`](Self::open) applies Courier's migrations first (default: yes).
    /// Turn it off where they are applied by `sqlx migrate run` or by
    /// [`PostgresStore::migrate`](crate::PostgresStore).
    pub fn migrate(mut self, yes: bool) -> Self {
        self.migrate = yes;
        self
    }

    /// The most connections of the pool it opens from a URL (default 10, one of them
    /// for `LISTEN` once the transport has a receiver).
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(2);
        self
    }

    /// Connects, applies the migrations (unless turned off) and takes the lock holder's
    /// advisory lock. It listens for notifications only once it has a receiver or accepts a
    /// session: a process that only sends opens no `LISTEN` connection.
    ///
    /// # Errors
    /// [`ErrorKind::Storage`] when the database cannot be reached (transient) or its
    /// schema is missing or cannot be migrated; [`ErrorKind::InvalidOptions`] without a
    /// URL or pool.
    pub async fn open(self) -> Result<PostgresTransport> {
        let owns_pool = self.pool.is_none();
        let pool = match (self.pool, &self.url) {
            (Some(pool), _) => pool,
            (None, Some(url)) => crate::store::postgres::pool_options()
                .max_connections(self.max_connections)
                .connect(url)
                .await
                .map_err(|e| db_error("cannot connect to Postgres", e))?,
            (None, None) => {
                return Err(Error::new(ErrorKind::InvalidOptions {
                    reason: "give the Postgres transport a URL or a pool".into(),
                }));
            }
        };
        check_encoding(&pool).await?;
        if self.migrate {
            crate::store::postgres::migrate(&pool).await?;
        }
        let tag: i32 = sqlx::query_scalar("SELECT token_tag FROM courier.transport_instance")
            .fetch_one(&pool)
            .await
            .map_err(|e| {
                db_error(
                    "cannot read courier.transport_instance: apply Courier's migrations (open with migrate(true))",
                    e,
                )
            })?;
        let wakers = Arc::new(wake::Wakers::default());
        let holder = holder::new_key();
        let keeper = holder::hold(
            &pool,
            holder,
            self.poll_interval.max(Duration::from_secs(1)),
            Arc::downgrade(&wakers),
        )
        .await?;
        let clock: Arc<dyn Clock> = self.clock.unwrap_or_else(|| Arc::new(SystemClock));
        Ok(PostgresTransport {
            shared: Arc::new(Shared {
                pool,
                dead_log: crate::endpoint::metrics::transport_dead_letter_log(clock.clone()),
                clock,
                tag: u32::from_be_bytes(tag.to_be_bytes()),
                max_message_size: self.max_message_size,
                poll_interval: self.poll_interval,
                wakers,
                closed: AtomicBool::new(false),
                owns_pool,
                listening: tokio::sync::OnceCell::new(),
                listener: Mutex::new(None),
                holder,
                upkeeps: upkeep::Upkeeps::default(),
                keeper: Mutex::new(Some(keeper)),
                destinations: in_tx::Destinations::default(),
                notifier: wake::Notifier::new(self.notify_interval),
                sends_in_flight: std::sync::atomic::AtomicUsize::new(0),
            }),
        })
    }
}

/// Refuses a database whose encoding is not UTF8: Courier's texts (ids, types, properties)
/// are UTF-8, and a `SQL_ASCII` database stores any bytes another program writes
/// unchecked, which no receiver could read (one such row failed every receive of its
/// queue). Other encodings cannot hold every text a sender may send.
async fn check_encoding(pool: &PgPool) -> Result<()> {
    let (encoding, database): (String, String) =
        sqlx::query_as("SELECT current_setting('server_encoding'), current_database()")
            .fetch_one(pool)
            .await
            .map_err(|e| db_error("cannot read the database's encoding", e))?;
    if encoding.eq_ignore_ascii_case("UTF8") {
        return Ok(());
    }
    Err(Error::new(ErrorKind::InvalidOptions {
        reason: format!(
            "database {database:?} has the encoding {encoding}; the Postgres transport needs UTF8 (texts another \
             program writes would not be checked, and one that is not UTF-8 could not be received): create the \
             database with CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0, or move Courier's schema to \
             such a database"
        ),
    }))
}

/// The Postgres transport. Cloning gives another handle to the same transport.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), courier::Error> {
/// use courier::prelude::*;
/// let broker = courier::PostgresTransport::builder("postgres://app@localhost/app").open().await?;
/// broker.create_queue("orders", &QueueOptions::default()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresTransport {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PostgresTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresTransport").finish_non_exhaustive()
    }
}

impl PostgresTransport {
    /// A builder connecting to `url` (`postgres://user:password@host:5432/database`).
    pub fn builder(url: impl Into<String>) -> PgTransportBuilder {
        PgTransportBuilder {
            url: Some(url.into()),
            pool: None,
            clock: None,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            poll_interval: DEFAULT_PG_POLL_INTERVAL,
            notify_interval: DEFAULT_PG_NOTIFY_INTERVAL,
            migrate: true,
            max_connections: 10,
        }
    }

    /// A builder over the application's pool (see [`PgTransportBuilder::pool`]).
    pub fn from_pool(pool: PgPool) -> PgTransportBuilder {
        let mut b = Self::builder(String::new());
        b.url = None;
        b.pool(pool)
    }

    /// Connects to `url` with the default settings.
    ///
    /// # Errors
    /// As [`PgTransportBuilder::open`].
    pub async fn connect(url: &str) -> Result<Self> {
        Self::builder(url).open().await
    }

    /// The pool (the one given, or the one opened).
    pub fn pool(&self) -> &PgPool {
        &self.shared.pool
    }

    /// The transport's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.clock.clone()
    }

    async fn link(&self, path: &EntityPath) -> Result<Arc<Link>> {
        let entity = entities::resolve(&self.shared, path, false).await?;
        self.shared.listen().await?;
        Ok(Arc::new(Link::new(self.shared.clone(), entity, path.clone(), None)))
    }
}

/// The rules the Postgres transport bends.
fn bent_rules() -> Vec<BentRule> {
    vec![
        BentRule {
            rule: "S2.7 volatile session locks",
            reason: "a session lock is a row of the database, not yet tied to its holder's connection",
            substitute: "message locks are volatile (a dead or disconnected holder's locks end at the next receive \
                         of their entity, within 250 ms on a busy one); a session lock ends when it is released or \
                         its lock duration has passed",
        },
        BentRule {
            rule: "S3.1",
            reason: "gap-free numbers per queue would make every sender to a queue wait for the one before it to commit",
            substitute: "one database sequence numbers every queue and topic: unique and increasing for each sender \
                     (a batch in its order), not gap-free per queue, and concurrent senders may commit out of \
                     number order",
        },
    ]
}

#[async_trait]
impl Transport for PostgresTransport {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bent_rules: bent_rules(),
        }
    }

    fn check_message(&self, message: &Envelope) -> Result<()> {
        check_outgoing(
            self.shared.max_message_size,
            message,
            "",
            false,
            self.shared.clock.now(),
        )
    }

    async fn create_queue(&self, name: &str, options: &QueueOptions) -> Result<()> {
        crate::entity::validate_name(name)?;
        options.validate()?;
        entities::create(&self.shared, Kind::Queue, None, name, options).await
    }

    async fn create_topic(&self, name: &str, options: &TopicOptions) -> Result<()> {
        crate::entity::validate_name(name)?;
        let q = QueueOptions {
            default_time_to_live: options.default_time_to_live,
            ..QueueOptions::default()
        };
        q.validate()?;
        entities::create(&self.shared, Kind::Topic, None, name, &q).await
    }

    async fn create_subscription(&self, topic: &str, name: &str, options: &SubscriptionOptions) -> Result<()> {
        crate::entity::validate_name(topic)?;
        crate::entity::validate_name(name)?;
        options.validate()?;
        entities::create(&self.shared, Kind::Subscription, Some(topic), name, options).await
    }

    async fn delete(&self, path: &EntityPath) -> Result<()> {
        entities::delete(&self.shared, path).await
    }

    async fn sender(&self, entity: &str, options: SenderOptions) -> Result<Arc<dyn Sender>> {
        options.validate()?;
        let info = entities::resolve(&self.shared, &EntityPath::queue(entity), true).await?;
        Ok(Arc::new(PgSender {
            shared: self.shared.clone(),
            name: entity.to_owned(),
            entity: info,
            permits: Arc::new(Semaphore::new(options.max_in_flight)),
            max_in_flight: options.max_in_flight,
            allow_presettled: options.allow_presettled,
        }))
    }

    async fn receiver(&self, path: &EntityPath) -> Result<Arc<dyn Receiver>> {
        Ok(Arc::new(PgReceiver {
            link: self.link(path).await?,
        }))
    }

    async fn accept_session(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>> {
        let entity = entities::resolve(&self.shared, path, false).await?;
        self.shared.listen().await?;
        sessions::accept(&self.shared, entity, path, &session, max_wait).await
    }

    async fn peek(
        &self,
        path: &EntityPath,
        from_sequence_number: SequenceNumber,
        max_count: usize,
    ) -> Result<Vec<ReceivedMessage>> {
        let entity = entities::resolve(&self.shared, path, false).await?;
        browse::peek(&self.shared, &entity, path.sub_queue(), from_sequence_number, max_count).await
    }

    async fn counts(&self, path: &EntityPath) -> Result<EntityCounts> {
        let entity = entities::resolve(&self.shared, path, false).await?;
        browse::counts(&self.shared, &entity).await
    }

    async fn close(&self) {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.shared.stop_tasks();
        // What was sent just before is notified, not left to the receivers' poll.
        self.shared.notifier.flush(&self.shared.pool).await;
        if self.shared.owns_pool {
            self.shared.pool.close().await;
        }
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.shared.clock.clone())
    }

    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Any interval a caller may pass, up to `Duration::MAX`: taken as it is up to a
        /// second, a second above it.
        #[test]
        fn the_notify_interval_is_taken_up_to_a_second(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
            let asked = Duration::new(secs, nanos);
            let b = PostgresTransport::builder("postgres://x").notify_interval(asked);
            prop_assert_eq!(b.notify_interval, asked.min(Duration::from_secs(1)));
            prop_assert!(b.notify_interval <= MAX_NOTIFY_INTERVAL);
        }
    }

    #[test]
    fn the_notify_interval_defaults_to_2_ms_and_takes_the_extremes() {
        assert_eq!(
            PostgresTransport::builder("postgres://x").notify_interval,
            DEFAULT_PG_NOTIFY_INTERVAL
        );
        for (asked, taken) in [
            (Duration::ZERO, Duration::ZERO),
            (Duration::from_secs(1), Duration::from_secs(1)),
            (Duration::MAX, Duration::from_secs(1)),
        ] {
            let b = PostgresTransport::builder("postgres://x").notify_interval(asked);
            assert_eq!(b.notify_interval, taken, "asked {asked:?}");
        }
    }
}
