//! The RabbitMQ transport: the contract of docs/semantics.md over AMQP 0-9-1 (lapin).
//!
//! | contract | on RabbitMQ |
//! |---|---|
//! | queue | a durable quorum queue (durable delivery count), dead-lettering into `name::dlq` |
//! | topic, subscription | a durable fanout exchange; a quorum queue `topic::subscription` bound to it |
//! | settled send (S1.1) | publisher confirms; a queue send is mandatory, so a missing queue is an error |
//! | PeekLock (S2.2) | manual acknowledgements on a consumer with a prefetch |
//! | complete / abandon | `basic.ack` / `basic.nack` with requeue |
//! | dead-letter | a confirmed copy into `::dlq` with the reason as headers, then `basic.ack` |
//! | max delivery count (S2.6) | the quorum queue's `x-delivery-limit`, dead-lettered by RabbitMQ |
//! | scheduled messages (S5) | rows in a Postgres or SQLite table, published when due |
//! | sessions (S4) | partition queues with a single active consumer, by a hash of the session id (`sessions.rs`; consuming the partitions: `session_partitions.rs`; sharing them between processes: `session_balance.rs`) |
//!
//! What RabbitMQ cannot honour is declared in [`AmqpTransport::capabilities`] with the
//! substitute; `docs/rabbitmq.md` has the whole mapping and the wire format.

mod admin;
mod browse;
mod builder;
mod catalog;
mod conn;
mod dead_letters;
#[cfg(test)]
mod fuzz;
mod inspect;
mod management;
mod nodes;
mod parked;
mod publish;
mod receiver;
mod registry;
mod rules;
mod schedule;
mod seal;
mod sender;
mod session_balance;
mod session_names;
mod session_partitions;
mod session_queue;
mod session_receiver;
mod sessions;
mod wire;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{ExchangeDeclareOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use lapin::{Channel, ExchangeKind};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::entity::{
    EntityCounts, EntityPath, QueueOptions, SubQueue, SubscriptionOptions, TopicOptions, validate_name,
};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, ReceivedMessage, SequenceNumber};
use crate::transport::{Capabilities, Receiver, Sender, SenderOptions, SessionReceiver, SessionSelector, Transport};

pub use admin::AmqpAdmin;
pub use builder::AmqpBuilder;
use conn::{Connector, Declaration, connection_error, declare, reply_code};
use inspect::WireCounters;
pub use inspect::WireStats;
use publish::{ConfirmChannel, Target, finish};
use receiver::AmqpReceiver;
use rules::bent_rules;
pub(crate) use rules::unsupported;
pub use schedule::ScheduleStore;
use schedule::{Due, Publish, Published};
use sender::AmqpSender;

/// The default bound on connecting (and reconnecting) before a call fails with a
/// transient [`ErrorKind::Connection`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default bound on an operation that waits on RabbitMQ (a publish and its confirm,
/// an acknowledgement) before it fails with a transient [`ErrorKind::Connection`] whose
/// outcome is unknown ([`AmqpBuilder::operation_timeout`]).
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// The last sequence number stamped by any transport of this process.
static LAST_SEQUENCE_NUMBER: AtomicI64 = AtomicI64::new(0);

/// How many due scheduled messages one dispatch round publishes.
const DISPATCH_BATCH: i64 = 200;

/// What a RabbitMQ name is: a queue (a Courier queue or subscription) or an exchange (a
/// Courier topic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Queue,
    Topic,
    /// Partitions, no queue of its name (`sessions.rs`).
    SessionQueue,
}

/// What the transport's parts share.
pub(crate) struct Inner {
    conn: Connector,
    clock: Arc<dyn Clock>,
    schedules: Option<ScheduleStore>,
    max_message_size: usize,
    /// Wakes the scheduled-message dispatcher when an earlier message is scheduled.
    wake: Notify,
    /// The confirm channel for dead-letter copies and due scheduled messages.
    internal: ConfirmChannel,
    stop: CancellationToken,
    /// What the receivers refused or ignored in received messages.
    wire: WireCounters,
    /// The keys that seal the dead letters this transport moves (`seal.rs`).
    seal_keys: seal::Keys,
    /// The hubs of the session queues this transport accepted sessions of (`sessions.rs`).
    sessions: sessions::Hubs,
}

impl Inner {
    /// A number unique and increasing within this process: the clock's
    /// microseconds, or one more than the last when the clock has not moved (S3.1 bent).
    pub(crate) fn next_sequence_number(&self) -> i64 {
        let now = self.clock.now().timestamp_micros();
        let mut last = LAST_SEQUENCE_NUMBER.load(Ordering::Relaxed);
        loop {
            let next = now.max(last.saturating_add(1));
            match LAST_SEQUENCE_NUMBER.compare_exchange_weak(last, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(seen) => last = seen,
            }
        }
    }

    /// Runs `f` on a channel of its own, which a broker refusal (404, 406) may close
    /// ([`Connector::on_own_channel`](conn::Connector::on_own_channel): on a task, so that
    /// a dropped caller never closes the channel while the broker answers).
    async fn on_fresh_channel<T, F, Fut>(&self, f: F) -> Result<std::result::Result<T, lapin::Error>>
    where
        T: Send + 'static,
        F: FnOnce(Channel) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = std::result::Result<T, lapin::Error>> + Send + 'static,
    {
        self.conn.on_own_channel(f).await
    }

    /// Whether a queue exists (a passive declare).
    async fn queue_exists(&self, queue: &str) -> Result<Option<u64>> {
        self.conn.check_open()?;
        let r = self.conn.passive_declare(queue).await?;
        match r {
            Ok(q) => Ok(Some(u64::from(q.message_count()))),
            Err(e) if reply_code(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.failure("cannot look up a queue", &e)),
        }
    }

    /// Whether a topic (exchange) exists.
    async fn topic_exists(&self, topic: &str) -> Result<bool> {
        self.conn.check_open()?;
        let topic = topic.to_owned();
        let r = self
            .on_fresh_channel(|c| async move {
                let options = ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                };
                c.exchange_declare(
                    topic.as_str().into(),
                    ExchangeKind::Fanout,
                    options,
                    FieldTable::default(),
                )
                .await
            })
            .await?;
        match r {
            Ok(()) => Ok(true),
            Err(e) if reply_code(&e) == Some(404) => Ok(false),
            Err(e) => Err(self.failure("cannot look up a topic", &e)),
        }
    }

    /// What `name` is known to be without asking RabbitMQ: declared through this
    /// transport, or recorded in the schedule store by any transport sharing it. A lookup
    /// of an entity that is not there makes RabbitMQ close the channel, which lapin logs
    /// at ERROR: knowing the kind first spares a healthy run those lines.
    async fn known_kind(&self, name: &str) -> Option<Kind> {
        let declared = self.conn.declared().into_iter().find_map(|d| match d {
            Declaration::Queue { name: q, options } if q == name && options.requires_session => {
                Some(Kind::SessionQueue)
            }
            Declaration::Queue { name: q, .. } if q == name => Some(Kind::Queue),
            Declaration::Topic { name: t } if t == name => Some(Kind::Topic),
            Declaration::Subscription { topic, name: s, .. } if wire::subscription_queue(&topic, &s) == name => {
                Some(Kind::Queue)
            }
            _ => None,
        });
        if declared.is_some() {
            return declared;
        }
        let store = self.schedules.as_ref()?;
        match store.recorded_kind(name).await {
            Ok(Some(1)) => Some(Kind::Topic),
            Ok(Some(registry::KIND_SESSION_QUEUE)) => Some(Kind::SessionQueue),
            Ok(Some(_)) => Some(Kind::Queue),
            Ok(None) | Err(_) => None,
        }
    }

    /// Where a sender to `entity` publishes: its queue or its topic, looked up as what it
    /// is known to be first (then as the other, for a record gone stale); `None` when
    /// neither exists.
    /// `known` is what [`known_kind`](Self::known_kind) said of it.
    async fn target_of(&self, entity: &str, known: Option<Kind>) -> Result<Option<Target>> {
        let as_queue = |entity: &str| Target::Queue(entity.to_owned());
        let as_topic = |entity: &str| Target::Topic(entity.to_owned());
        if known == Some(Kind::Topic) {
            if self.topic_exists(entity).await? {
                return Ok(Some(as_topic(entity)));
            }
            return Ok(self.queue_exists(entity).await?.map(|_| as_queue(entity)));
        }
        if self.queue_exists(entity).await?.is_some() {
            return Ok(Some(as_queue(entity)));
        }
        Ok(self.topic_exists(entity).await?.then(|| as_topic(entity)))
    }

    fn failure(&self, context: &str, e: &lapin::Error) -> Error {
        if self.conn.is_closed() {
            return Error::new(ErrorKind::Closed);
        }
        connection_error(context, e)
    }

    /// Declares and remembers `d`; an entity that exists with other settings keeps them.
    /// Declares a dead-letter queue that is missing (deleted outside Courier) again, as
    /// its queue's declaration makes it, and says so in the log.
    pub(crate) async fn restore_dead_letter_queue(&self, dlq: &str) -> Result<()> {
        let r = self
            .on_fresh_channel({
                let dlq = dlq.to_owned();
                |c| async move { conn::declare_dead_letter_queue(&c, &dlq).await }
            })
            .await?;
        r.map_err(|e| self.failure("cannot declare a dead-letter queue again", &e))?;
        tracing::warn!(
            dead_letter_queue = %dlq,
            "the dead-letter queue was missing (deleted outside Courier): declared again; messages RabbitMQ \
             dead-lettered while it was missing are held by their queue until RabbitMQ retries them"
        );
        Ok(())
    }

    async fn declare(&self, d: Declaration) -> Result<()> {
        self.conn.check_open()?;
        let r = self.on_fresh_channel({
            let d = d.clone();
            |c| async move { declare(&c, &d).await }
        });
        match r.await? {
            Ok(()) => {}
            Err(e) if reply_code(&e) == Some(406) => {
                tracing::debug!(declaration = ?d, "exists with other settings; they are kept");
            }
            Err(e) if reply_code(&e) == Some(404) => {
                let Declaration::Subscription { topic, .. } = &d else {
                    return Err(self.failure("cannot declare", &e));
                };
                return Err(Error::new(ErrorKind::EntityNotFound { path: topic.clone() }));
            }
            Err(e) => return Err(self.failure("cannot declare", &e)),
        }
        if let Some(store) = self.schedules.as_ref()
            && let Err(e) = store.record(&d, self.clock.now()).await
        {
            tracing::warn!(declaration = ?d, error = %e, "the declaration is not recorded for the operations API");
        }
        self.conn.remember(d);
        Ok(())
    }

    async fn delete_queue(&self, queue: &str) -> Result<()> {
        let r = self
            .on_fresh_channel({
                let queue = queue.to_owned();
                |c| async move {
                    c.queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                        .await?;
                    c.queue_delete(
                        wire::dead_letter_queue(&queue).as_str().into(),
                        QueueDeleteOptions::default(),
                    )
                    .await
                }
            })
            .await?;
        r.map(|_| ()).map_err(|e| self.failure("cannot delete a queue", &e))
    }
}

/// Publishes due scheduled messages through the internal confirm channel.
struct DuePublisher<'a>(&'a Inner);

impl Publish for DuePublisher<'_> {
    async fn publish(&self, due: Vec<Due>) -> Published {
        let inner = self.0;
        let mut pending = Vec::with_capacity(due.len());
        let mut published = Published::default();
        for d in due {
            let target = if d.is_topic {
                Target::Topic(d.destination.clone())
            } else {
                Target::Queue(d.destination.clone())
            };
            let properties = match wire::properties(&d.envelope, inner.clock.now(), inner.next_sequence_number()) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(seq = d.seq, error = %e, "a scheduled message cannot be published; it is dropped");
                    published.done.push(d.seq);
                    continue;
                }
            };
            match inner
                .internal
                .start(&inner.conn, &target, properties, &d.envelope.body)
                .await
            {
                Ok(confirm) => pending.push((d.seq, target, confirm)),
                Err(e) => {
                    // The broker is unreachable: end the round (and its database
                    // transaction) now; the rest is published on a later round.
                    tracing::warn!(seq = d.seq, error = %e, "publishing a due scheduled message failed; it is retried");
                    break;
                }
            }
        }
        for (seq, target, confirm) in pending {
            match finish(&target, confirm).await {
                Ok(()) => published.done.push(seq),
                Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => {
                    // Never dropped for it: a broker that restarts says so for a moment.
                    tracing::warn!(
                        seq,
                        error = %e,
                        "the destination of a due scheduled message is not there; it is kept and published again in \
                         {} s (create the destination, or cancel the message by its sequence number)",
                        schedule::MISSING_RETRY.as_secs()
                    );
                    published.missing.push(seq);
                }
                Err(e) => tracing::warn!(seq, error = %e, "a due scheduled message was not confirmed; it is retried"),
            }
        }
        published
    }
}

/// Publishes scheduled messages when they are due: sleeps on the clock until the
/// earliest, wakes when an earlier one is scheduled, and looks at the table at least
/// every second (other processes schedule too).
async fn dispatcher(inner: Arc<Inner>, store: ScheduleStore) {
    loop {
        if inner.stop.is_cancelled() {
            return;
        }
        let now = inner.clock.now();
        let mut backoff = false;
        match store.dispatch_due(now, DISPATCH_BATCH, &DuePublisher(&inner)).await {
            Ok(n) if i64::try_from(n).unwrap_or(i64::MAX) >= DISPATCH_BATCH => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "cannot dispatch scheduled messages");
                backoff = true;
            }
        }
        let next = match store.next_due().await {
            Ok(next) => next,
            Err(_) => {
                backoff = true;
                None
            }
        };
        // Rows still due after a round were not confirmed: try again a little later.
        backoff |= next.is_some_and(|t| t <= now);
        let until = match next {
            Some(t) if !backoff => t,
            _ => now + chrono::Duration::days(1),
        };
        let real = if backoff {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(1)
        };
        tokio::select! {
            () = inner.stop.cancelled() => return,
            () = inner.wake.notified() => {}
            () = inner.clock.sleep_until(until) => {}
            () = tokio::time::sleep(real) => {}
        }
    }
}

/// The RabbitMQ transport. Cheap to share behind an `Arc<dyn Transport>`; one AMQP
/// connection, re-established with backoff when it drops.
///
/// ```no_run
/// # async fn run() -> courier::Result<()> {
/// use courier::{AmqpTransport, PostgresStore, Store};
/// let store = PostgresStore::connect("postgres://app@db/app").await?;
/// store.migrate().await?;
/// let rabbit = AmqpTransport::builder("amqp://app:secret@rabbit:5672/%2f")
///     .schedules(&store)
///     .open()
///     .await?;
/// # let _ = rabbit; Ok(()) }
/// ```
pub struct AmqpTransport {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AmqpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpTransport")
            .field("broker", &self.inner.conn.display)
            .finish_non_exhaustive()
    }
}

impl AmqpTransport {
    /// A builder for `url` (`amqp://user:password@host:5672/vhost`, or `amqps://` for
    /// TLS; the vhost `/` is written `%2f`). The nodes of a cluster are hosts separated by
    /// commas (`amqp://user:password@h1:5672,h2:5672,h3:5672/vhost`), or
    /// [`AmqpBuilder::nodes`].
    pub fn builder(url: impl Into<String>) -> AmqpBuilder {
        AmqpBuilder::new(url.into())
    }

    /// Connects to `url` with the defaults (no scheduled messages).
    ///
    /// # Errors
    /// As [`AmqpBuilder::open`].
    pub async fn connect(url: impl Into<String>) -> Result<Self> {
        Self::builder(url).open().await
    }

    /// How many connections were made so far: more than 1 after a reconnect.
    pub fn connections_made(&self) -> u64 {
        self.inner.conn.generation()
    }

    /// The node of the last connection made (its URL without the password): with the
    /// nodes of a cluster, the one the transport is connected to, or was until the
    /// connection was lost. `None` before the first connection.
    pub fn connected_node(&self) -> Option<String> {
        self.inner.conn.connected_node()
    }

    /// What this transport's receivers found wrong in the messages they received: the
    /// deliveries refused (moved to their dead-letter queue with
    /// `courier.InvalidWireFormat` or `courier.MessageTooLarge`) and the `x-courier-*`
    /// headers ignored. See docs/rabbitmq.md, "What a receiver refuses".
    pub fn wire_stats(&self) -> WireStats {
        self.inner.wire.snapshot()
    }

    /// Where [`Transport::close`] is and the state of the connection, in words: what a
    /// watchdog reports when a close takes too long. For tests.
    #[doc(hidden)]
    pub fn close_progress(&self) -> String {
        self.inner.conn.close_progress()
    }

    /// Drops the connection as a network failure would: unsettled messages go back to
    /// their queues, and the next call reconnects. For tests of recovery.
    #[doc(hidden)]
    pub async fn sever_connection(&self) {
        self.inner.conn.sever().await;
    }

    async fn path_exists(&self, path: &EntityPath) -> Result<()> {
        path.validate()?;
        let queue = wire::queue_of(path);
        if self.inner.queue_exists(&queue).await?.is_some() {
            return Ok(());
        }
        if path.topic().is_none() && path.sub_queue() == SubQueue::Main && self.inner.topic_exists(path.name()).await? {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{} is a topic: receive from one of its subscriptions", path.name()),
            }));
        }
        Err(Error::new(ErrorKind::EntityNotFound { path: path.to_string() }))
    }

    async fn delete_topic(&self, topic: &str) -> Result<()> {
        let r = self
            .inner
            .on_fresh_channel({
                let topic = topic.to_owned();
                |c| async move { c.exchange_delete(topic.as_str().into(), Default::default()).await }
            })
            .await?;
        r.map_err(|e| self.inner.failure("cannot delete a topic", &e))?;
        self.inner.conn.forget(topic);
        if let Some(store) = &self.inner.schedules {
            store.delete_for(topic).await?;
            store.unrecord(topic).await?;
        }
        Ok(())
    }

    fn check_queue_options(options: &QueueOptions, subscription: bool) -> Result<()> {
        options.validate()?;
        if options.requires_session && subscription {
            return Err(unsupported("session subscriptions", "S4.1 subscriptions"));
        }
        if options.lock_duration != QueueOptions::default().lock_duration {
            return Err(unsupported("a lock duration", "S2.3"));
        }
        Ok(())
    }

    /// The default time-to-live of a queue this transport declared.
    fn default_ttl_of(&self, queue: &str) -> Option<Duration> {
        self.inner.conn.declared().into_iter().find_map(|d| match d {
            Declaration::Queue { name, options } if name == queue => options.default_time_to_live,
            _ => None,
        })
    }
}

#[async_trait]
impl Transport for AmqpTransport {
    fn name(&self) -> &'static str {
        "amqp"
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.inner.clock.clone())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            bent_rules: bent_rules(),
        }
    }

    /// The sender's checks (size against `max_message_size`, ids, time-to-live,
    /// schedule range), a future schedule without a schedule store, and what AMQP cannot
    /// carry (reserved `x-` property names, fields over 255 bytes).
    fn check_message(&self, message: &Envelope) -> Result<()> {
        let now = self.inner.clock.now();
        crate::checks::check_envelope(self.inner.max_message_size, message, "", false, now)?;
        if self.inner.schedules.is_none() && message.scheduled_enqueue_time.is_some_and(|at| at > now) {
            return Err(schedule::no_store("scheduled messages"));
        }
        wire::properties(message, now, 0).map(|_| ())
    }

    async fn create_queue(&self, name: &str, options: &QueueOptions) -> Result<()> {
        validate_name(name)?;
        Self::check_queue_options(options, false)?;
        self.inner.conn.check_open()?;
        self.inner
            .declare(Declaration::Queue {
                name: name.to_owned(),
                options: options.clone(),
            })
            .await
    }

    async fn create_topic(&self, name: &str, options: &TopicOptions) -> Result<()> {
        validate_name(name)?;
        if options.default_time_to_live.is_some() {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "a RabbitMQ exchange has no time-to-live: set it on the subscriptions".into(),
            }));
        }
        self.inner.conn.check_open()?;
        self.inner.declare(Declaration::Topic { name: name.to_owned() }).await
    }

    async fn create_subscription(&self, topic: &str, name: &str, options: &SubscriptionOptions) -> Result<()> {
        validate_name(topic)?;
        validate_name(name)?;
        Self::check_queue_options(options, true)?;
        if !self.inner.topic_exists(topic).await? {
            return Err(Error::new(ErrorKind::EntityNotFound { path: topic.to_owned() }));
        }
        self.inner
            .declare(Declaration::Subscription {
                topic: topic.to_owned(),
                name: name.to_owned(),
                options: options.clone(),
            })
            .await
    }

    async fn delete(&self, path: &EntityPath) -> Result<()> {
        path.validate()?;
        let queue = wire::queue_of(path);
        let maybe_topic = path.topic().is_none() && path.sub_queue() == SubQueue::Main;
        // A name known as a topic is looked up as one first: no lookup of a queue that is
        // not there (which RabbitMQ answers by closing the channel, and lapin logs at ERROR).
        if maybe_topic && self.inner.is_known_session_queue(path.name()).await {
            return self.delete_session_queue(path.name()).await;
        }
        let topic_first = maybe_topic && self.inner.known_kind(path.name()).await == Some(Kind::Topic);
        if topic_first && self.inner.topic_exists(path.name()).await? {
            return self.delete_topic(path.name()).await;
        }
        if self.inner.queue_exists(&queue).await?.is_some() {
            self.inner.delete_queue(&queue).await?;
            self.inner.conn.forget(&queue);
            if let Some(store) = &self.inner.schedules {
                store.delete_for(&queue).await?;
                store.unpark_all(&queue).await?;
                store.unrecord(&queue).await?;
            }
            return Ok(());
        }
        if maybe_topic && !topic_first && self.inner.topic_exists(path.name()).await? {
            return self.delete_topic(path.name()).await;
        }
        if maybe_topic && self.inner.is_session_queue(path.name()).await? {
            return self.delete_session_queue(path.name()).await;
        }
        Err(Error::new(ErrorKind::EntityNotFound { path: path.to_string() }))
    }

    async fn sender(&self, entity: &str, options: SenderOptions) -> Result<Arc<dyn Sender>> {
        validate_name(entity)?;
        options.validate()?;
        let (target, sessions) = self.sender_target(entity).await?;
        Ok(Arc::new(AmqpSender {
            inner: self.inner.clone(),
            default_ttl: self.default_ttl_of(entity),
            target,
            entity: entity.to_owned(),
            permits: Arc::new(Semaphore::new(options.max_in_flight)),
            max_in_flight: options.max_in_flight,
            allow_presettled: options.allow_presettled,
            channel: ConfirmChannel::default(),
            sessions,
        }))
    }

    async fn receiver(&self, path: &EntityPath) -> Result<Arc<dyn Receiver>> {
        path.validate()?;
        match self.path_exists(path).await {
            Ok(()) => Ok(Arc::new(AmqpReceiver::new(self.inner.clone(), path.clone()))),
            // A session queue has no queue of its name: its partitions.
            Err(e) => self.session_queue_receiver(path, e).await,
        }
    }

    async fn accept_session(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>> {
        self.accept(path, session, max_wait).await
    }

    async fn peek(
        &self,
        _path: &EntityPath,
        _from_sequence_number: SequenceNumber,
        _max_count: usize,
    ) -> Result<Vec<ReceivedMessage>> {
        self.inner.conn.check_open()?;
        Err(unsupported("browsing", "S6.1"))
    }

    async fn counts(&self, path: &EntityPath) -> Result<EntityCounts> {
        path.validate()?;
        if let Some(queue) = sessions::session_queue_of(path)
            && self.inner.known_session_queue(queue)
        {
            return self.session_queue_counts(queue).await;
        }
        let queue = wire::queue_of(path);
        let Some(active) = self.inner.queue_exists(&queue).await? else {
            if let Some(queue) = sessions::session_queue_of(path)
                && self.inner.is_session_queue(queue).await?
            {
                return self.session_queue_counts(queue).await;
            }
            return Err(Error::new(ErrorKind::EntityNotFound { path: path.to_string() }));
        };
        let dead_lettered = match path.sub_queue() {
            SubQueue::Main => self
                .inner
                .queue_exists(&wire::dead_letter_queue(&queue))
                .await?
                .unwrap_or(0),
            SubQueue::DeadLetter => active,
        };
        let scheduled = match (&self.inner.schedules, path.sub_queue()) {
            (Some(store), SubQueue::Main) => store.count(&queue).await?,
            _ => 0,
        };
        Ok(EntityCounts {
            active: if path.sub_queue() == SubQueue::Main { active } else { 0 },
            scheduled,
            deferred: 0,
            dead_lettered,
        })
    }

    async fn close(&self) {
        self.inner.stop.cancel();
        self.inner.conn.close().await;
    }
}

impl Drop for AmqpTransport {
    fn drop(&mut self) {
        self.inner.stop.cancel();
    }
}
