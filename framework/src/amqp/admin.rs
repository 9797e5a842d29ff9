//! The operations API on RabbitMQ ([`AmqpAdmin`]): queues with their counts, and the dead
//! letters of a queue's `<queue>::dlq`, over AMQP 0-9-1 (the management plugin is often
//! off, and is not needed) and the transport's schedule store; and, when it is given the
//! management plugin's address ([`AmqpAdmin::with_management`]), the unacknowledged
//! counts from its HTTP API (`management.rs`).
//!
//! * **Which queues.** AMQP cannot list a broker's queues. The transport records every
//!   entity it declares in its schedule store's database (`registry.rs`), and this admin
//!   lists those, plus names given by the operator ([`AmqpAdmin::with_queues`]).
//! * **Counts** come from passive `queue.declare` of the queue and of its `::dlq` (the
//!   ready messages), plus the dead letters parked in the schedule store, and the
//!   scheduled ones from the schedule store. RabbitMQ does not say over AMQP how many
//!   messages are unacknowledged: without the management API `locked` is 0. With it,
//!   `locked` is the queue's `messages_unacknowledged` (one `GET /api/queues/{vhost}` a
//!   listing, statistics up to 5 s old). The oldest age (`oldest_enqueued_at`) stays
//!   unknown for Courier's queues: RabbitMQ 3.10 gives no `head_message_timestamp` for a
//!   quorum queue, and peeking the head (a `basic.get` and a requeue) would raise its
//!   delivery count toward the delivery limit; only a classic queue named with
//!   [`with_queues`](AmqpAdmin::with_queues) can have one (its head message's AMQP
//!   timestamp). When the API cannot be reached or answers an error, the listing has the
//!   AMQP counts alone and logs a warning that says what to do.
//! * **Session queues** (recorded, or named and found by their first partition) are
//!   listed as queues: their ready and unacknowledged counts are the sums over their
//!   partitions, their dead letters those of their one `::dlq`, and a resubmit sends each
//!   dead letter to the partition of its session id (one without a valid session id is
//!   refused, with what to do) (`sessions.rs`).
//! * **Dead letters** are read where they are, in the queue's DLQ, and taken from it
//!   only by a resubmit or a delete (`dead_letters.rs`); their numbers are kept in the
//!   transport's schedule store (`catalog.rs`). Without a schedule store, dead letters
//!   cannot be listed (the error says which store to give).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use lapin::BasicProperties;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::conn::{Connector, connection_error, reply_code};
use super::inspect::WireCounters;
use super::management::{Management, QueueStats};
use super::publish::{ConfirmChannel, Target};
use super::registry::KIND_SESSION_QUEUE;
use super::schedule::ScheduleStore;
use super::sessions::{SESSION_PARTITIONS, partition_queue, partition_queues, queue_for};
use super::wire::{self, DEAD_LETTER_SUFFIX, SEPARATOR};
use super::{AmqpTransport, Inner};
use crate::admin::{
    AdminError, AdminResult, BatchOutcome, DeadLetter, DeadLetterSummary, EntityKind, Page, QueueAdmin, QueueSummary,
};
use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
use crate::clock::SystemClock;
use crate::error::{Error, ErrorKind};
use crate::message::SequenceNumber;

/// How long [`AmqpAdmin::connect`] tries to reach RabbitMQ (an operator waits for it;
/// the transport's default is 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The operations API on RabbitMQ: queues and dead letters, with the scheduled counts of
/// the transport's schedule store. See the module docs for what a listing costs.
pub struct AmqpAdmin {
    inner: Arc<Inner>,
    /// Names the operator gave, besides the recorded ones.
    extra: Vec<String>,
    /// Whether this admin opened the connection (and closes it).
    owns: bool,
    publisher: ConfirmChannel,
    /// The management API, when its address was given.
    management: Option<Management>,
}

impl std::fmt::Debug for AmqpAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAdmin")
            .field("broker", &self.inner.conn.display)
            .field("management", &self.management.as_ref().map(|m| &m.display))
            .finish_non_exhaustive()
    }
}

/// An entity the admin lists: its Courier name, kind, RabbitMQ name, and whether it is a
/// session queue (its RabbitMQ queues are its partitions).
struct Listed {
    name: String,
    kind: EntityKind,
    queue: String,
    sessions: bool,
}

/// Where a resubmit publishes: the queue, or the partition of each dead letter's session.
pub(super) enum ResubmitTo {
    Queue(Target),
    Sessions(String),
}

impl ResubmitTo {
    /// The target of a dead letter with `properties`, or why it has none: a dead letter of
    /// a session queue without a valid session id (a foreign producer's).
    pub(super) fn target(&self, properties: &BasicProperties) -> Result<Target, String> {
        match self {
            Self::Queue(t) => Ok(t.clone()),
            Self::Sessions(queue) => match wire::session_id_of(properties) {
                Some(id) => Ok(Target::Queue(queue_for(queue, &id))),
                None => Err(format!(
                    "the dead letter has no valid session id (header {}: a UTF-8 string of 1 to {} bytes) and {queue} \
                     is a session queue, which takes only messages with one: delete it, or send a copy with a \
                     session id",
                    wire::H_SESSION_ID,
                    crate::checks::MAX_MESSAGE_ID_LEN
                )),
            },
        }
    }
}

/// The RabbitMQ queue of a Courier name (`orders`, `topic/subscriptions/name`).
fn queue_of(name: &str) -> String {
    match name.split_once("/subscriptions/") {
        Some((topic, sub)) => wire::subscription_queue(topic, sub),
        None => name.to_owned(),
    }
}

impl AmqpAdmin {
    /// Connects to RabbitMQ at `url` (its own connection, named `courier-admin`); with the
    /// transport's schedule store, lists the entities the transport recorded there and
    /// counts scheduled messages. It publishes no due scheduled message (it runs no
    /// dispatcher).
    ///
    /// The URL may name the nodes of a cluster (`amqp://user:password@h1:5672,h2:5672/vhost`,
    /// as [`AmqpTransport::builder`](super::AmqpTransport::builder)): the first that answers
    /// is used.
    ///
    /// # Errors
    /// [`AdminError::Unavailable`] if RabbitMQ cannot be reached within 10 s (the address
    /// is shown without its password); [`AdminError::Invalid`] when the URL or its list of
    /// nodes cannot be read.
    pub async fn connect(url: &str, schedules: Option<ScheduleStore>) -> AdminResult<Self> {
        let nodes = super::nodes::Nodes::parse(&[url]).map_err(|reason| AdminError::Invalid {
            what: "RabbitMQ URL".into(),
            reason,
        })?;
        let inner = Arc::new(Inner {
            conn: Connector::new(nodes, "courier-admin".into(), CONNECT_TIMEOUT, None),
            clock: Arc::new(SystemClock),
            schedules,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            wake: Notify::new(),
            internal: ConfirmChannel::default(),
            stop: CancellationToken::new(),
            wire: WireCounters::default(),
            seal_keys: super::seal::Keys::default(),
            sessions: super::sessions::Hubs::default(),
        });
        inner
            .conn
            .connection()
            .await
            .map_err(|e| AdminError::unavailable(inner.conn.display.clone(), e))?;
        Ok(Self {
            inner,
            extra: Vec::new(),
            owns: true,
            publisher: ConfirmChannel::default(),
            management: None,
        })
    }

    /// The operations API on a running transport's connection (and its schedule store and
    /// clock).
    pub fn new(transport: &AmqpTransport) -> Self {
        Self {
            inner: transport.inner.clone(),
            extra: Vec::new(),
            owns: false,
            publisher: ConfirmChannel::default(),
            management: None,
        }
    }

    /// Also lists these queues, topics or subscriptions (`topic/subscriptions/name`):
    /// those the transport did not record (declared by a transport without a schedule
    /// store, or by another program).
    #[must_use]
    pub fn with_queues<I, S>(mut self, names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.extra.extend(names.into_iter().map(Into::into));
        self
    }

    /// Also reads RabbitMQ's management HTTP API at `url` (the management plugin's
    /// listener, `http://user:password@rabbit:15672`), so that [`queues`](QueueAdmin::queues)
    /// fills `locked` with each queue's unacknowledged messages, which AMQP 0-9-1 does not
    /// tell. One request a listing (`GET /api/queues/{vhost}`, at most 5 s); the counts are
    /// the broker's statistics, refreshed every `collect_statistics_interval` (5 s by
    /// default). The oldest age stays unknown for Courier's quorum queues: RabbitMQ gives
    /// it for classic queues only.
    ///
    /// The credentials are the URL's (HTTP Basic authentication), else the AMQP URL's user
    /// and password; the virtual host is the AMQP URL's. Plain HTTP only: HTTPS
    /// management endpoints are not supported yet. When the API cannot be reached or
    /// answers an error, a listing has the AMQP counts alone (`locked` 0) and logs a
    /// warning that says what to do; it does not fail.
    ///
    /// # Errors
    /// [`AdminError::Invalid`] when `url` cannot be used (not `http://`, no host, a bad
    /// port, a query), saying what is wrong without the password.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use courier::admin::{AmqpAdmin, QueueAdmin};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let admin = AmqpAdmin::connect("amqp://ops:secret@rabbit:5672/prod", None)
    ///     .await?
    ///     .with_queues(["orders"])
    ///     // The AMQP URL's user and password, and its vhost `prod`.
    ///     .with_management("http://rabbit:15672")?;
    /// for q in admin.queues().await? {
    ///     println!("{}: {} ready, {} unacknowledged", q.name, q.active, q.locked);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn with_management(mut self, url: &str) -> AdminResult<Self> {
        let management = Management::new(url, self.inner.conn.url()).map_err(|reason| AdminError::Invalid {
            what: "RabbitMQ management URL".into(),
            reason,
        })?;
        self.management = Some(management);
        Ok(self)
    }

    /// The management API's statistics of the queues, or none (with a warning) when it
    /// has no address or fails.
    async fn management_stats(&self) -> Option<HashMap<String, QueueStats>> {
        let management = self.management.as_ref()?;
        match management.queues().await {
            Ok(stats) => Some(stats),
            Err(e) => {
                tracing::warn!(
                    management = %management.display,
                    error = %e.with_causes(),
                    "the RabbitMQ management API gave no statistics, so the unacknowledged counts (LOCKED) are \
                     shown as 0: {}",
                    e.hint()
                );
                None
            }
        }
    }

    /// Closes the connection this admin opened ([`connect`](Self::connect)).
    pub async fn close(&self) {
        if self.owns {
            self.inner.conn.close().await;
        }
    }

    pub(super) fn failed(&self, e: Error) -> AdminError {
        match e.kind() {
            ErrorKind::Connection { .. } => AdminError::unavailable(self.inner.conn.display.clone(), e),
            _ => AdminError::from_error(e),
        }
    }

    /// The ready messages and consumers of a queue (`None` when there is no such queue).
    async fn declare_ok(&self, queue: &str) -> AdminResult<Option<(u64, u64)>> {
        let r = self
            .inner
            .conn
            .passive_declare(queue)
            .await
            .map_err(|e| self.failed(e))?;
        match r {
            Ok(q) => Ok(Some((u64::from(q.message_count()), u64::from(q.consumer_count())))),
            Err(e) if reply_code(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.failed(connection_error("cannot look up a queue", &e))),
        }
    }

    /// The entities to list.
    async fn entities(&self) -> AdminResult<Vec<Listed>> {
        let mut out = Vec::new();
        if let Some(store) = &self.inner.schedules {
            for r in store.recorded().await.map_err(|e| self.failed(e))? {
                let kind = match r.kind {
                    1 => EntityKind::Topic,
                    2 => EntityKind::Subscription,
                    _ => EntityKind::Queue,
                };
                out.push(Listed {
                    name: r.name,
                    kind,
                    queue: r.queue,
                    sessions: r.kind == KIND_SESSION_QUEUE,
                });
            }
        }
        for name in &self.extra {
            if out.iter().any(|l| &l.name == name) {
                continue;
            }
            let queue = queue_of(name);
            let mut sessions = false;
            let kind = if name.contains("/subscriptions/") {
                EntityKind::Subscription
            } else if self.declare_ok(&queue).await?.is_some() {
                EntityKind::Queue
            } else if self.inner.topic_exists(name).await.map_err(|e| self.failed(e))? {
                EntityKind::Topic
            } else {
                sessions = self.session_queue_exists(name).await?;
                EntityKind::Queue
            };
            out.push(Listed {
                name: name.clone(),
                kind,
                queue,
                sessions,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Whether `name` is a session queue on RabbitMQ: its first partition exists.
    async fn session_queue_exists(&self, name: &str) -> AdminResult<bool> {
        if name.contains(SEPARATOR) || name.contains("/subscriptions/") {
            return Ok(false);
        }
        Ok(self
            .declare_ok(&partition_queue(name, 0, SESSION_PARTITIONS))
            .await?
            .is_some())
    }

    /// The ready messages of a session queue's partitions and the unacknowledged ones the
    /// management API counts (`None` when it has no partition any more).
    async fn session_queue_counts(
        &self,
        queue: &str,
        stats: Option<&HashMap<String, QueueStats>>,
    ) -> AdminResult<Option<(u64, QueueStats)>> {
        let (mut ready, mut held, mut found) = (0, QueueStats::default(), false);
        for partition in partition_queues(queue) {
            if let Some((n, _)) = self.declare_ok(&partition).await? {
                found = true;
                ready += n;
            }
            if let Some(s) = stats.and_then(|s| s.get(&partition)) {
                held.unacknowledged = Some(held.unacknowledged.unwrap_or(0) + s.unacknowledged.unwrap_or(0));
            }
        }
        Ok(found.then_some((ready, held)))
    }

    /// Where a resubmit of `queue`'s dead letters publishes.
    pub(super) async fn resubmit_to(&self, queue: &str) -> AdminResult<ResubmitTo> {
        if self.declare_ok(queue).await?.is_none() && self.session_queue_exists(queue).await? {
            return Ok(ResubmitTo::Sessions(queue.to_owned()));
        }
        Ok(ResubmitTo::Queue(Target::Queue(queue.to_owned())))
    }

    /// The DLQ of a queue or subscription, after checking that the queue exists.
    pub(super) async fn dlq_of(&self, name: &str) -> AdminResult<(String, String)> {
        if name.contains(SEPARATOR) {
            return Err(AdminError::not_found(format!("queue {name}")));
        }
        let queue = queue_of(name);
        if self.declare_ok(&queue).await?.is_none() && !self.session_queue_exists(name).await? {
            if !name.contains("/subscriptions/") && self.inner.topic_exists(name).await.map_err(|e| self.failed(e))? {
                return Err(AdminError::refused(format!(
                    "{name} is a topic: its messages are in its subscriptions (topic/subscriptions/name)"
                )));
            }
            return Err(AdminError::not_found(format!("queue {name}")));
        }
        let dlq = format!("{queue}{DEAD_LETTER_SUFFIX}");
        Ok((queue, dlq))
    }

    /// The schedule store that numbers the dead letters, or what to do without one.
    pub(super) fn store(&self) -> AdminResult<&ScheduleStore> {
        self.inner.schedules.as_ref().ok_or_else(|| {
            AdminError::refused(
                "RabbitMQ dead letters are listed and changed from the transport's schedule store (Postgres or \
                 SQLite), which numbers them, and this admin has none: give it the store the transport \
                 uses (AmqpAdmin::connect(url, Some(store)); with the courier command, --postgres URL or \
                 --sqlite FILE next to --rabbitmq)",
            )
        })
    }

    /// The connection (for a reading of a DLQ).
    pub(super) fn connector(&self) -> &Connector {
        &self.inner.conn
    }

    /// The time of the transport's clock.
    pub(super) fn now_utc(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// A new sequence number for a copy this admin publishes.
    pub(super) fn next_sequence_number(&self) -> i64 {
        self.inner.next_sequence_number()
    }

    /// Starts publishing a copy to `target` (confirmed by [`finish`](super::publish::finish)).
    pub(super) async fn publish_copy(
        &self,
        target: &Target,
        properties: BasicProperties,
        body: &[u8],
    ) -> AdminResult<super::publish::Started> {
        self.publisher
            .start(&self.inner.conn, target, properties, body)
            .await
            .map_err(|e| self.failed(e))
    }
}

#[async_trait]
impl QueueAdmin for AmqpAdmin {
    fn describe(&self) -> String {
        match &self.management {
            Some(m) => format!("rabbitmq {} (management {})", self.inner.conn.display, m.display),
            None => format!("rabbitmq {}", self.inner.conn.display),
        }
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// With the management API: its statistics asked for once, beside the AMQP counts.
    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        let (entities, stats) = tokio::join!(self.entities(), self.management_stats());
        let mut out = Vec::new();
        for Listed {
            name,
            kind,
            queue,
            sessions,
        } in entities?
        {
            let scheduled = match (&self.inner.schedules, kind) {
                (Some(store), _) if sessions => {
                    let mut n = 0;
                    for partition in partition_queues(&queue) {
                        n += store.count(&partition).await.map_err(|e| self.failed(e))?;
                    }
                    n
                }
                (Some(store), EntityKind::Queue | EntityKind::Topic) => {
                    store.count(&queue).await.map_err(|e| self.failed(e))?
                }
                _ => 0,
            };
            let (active, dead_lettered, held) = if kind == EntityKind::Topic {
                if !self.inner.topic_exists(&queue).await.map_err(|e| self.failed(e))? {
                    continue;
                }
                (0, 0, QueueStats::default())
            } else {
                // Gone (deleted outside Courier): not listed.
                let counted = if sessions {
                    self.session_queue_counts(&queue, stats.as_ref()).await?
                } else {
                    let held = stats.as_ref().and_then(|s| s.get(&queue)).copied().unwrap_or_default();
                    self.declare_ok(&queue).await?.map(|(ready, _consumers)| (ready, held))
                };
                let Some((ready, held)) = counted else {
                    continue;
                };
                let dlq = format!("{queue}{DEAD_LETTER_SUFFIX}");
                let waiting = match self.declare_ok(&dlq).await? {
                    Some((n, _)) => n,
                    None => {
                        tracing::warn!(
                            queue = %queue,
                            dead_letter_queue = %dlq,
                            "the dead-letter queue does not exist (deleted outside Courier): its dead letters \
                             cannot be counted or read, and RabbitMQ holds those it dead-letters in the queue \
                             itself until it exists; an endpoint of the queue declares it again when it \
                             dead-letters, or restart one"
                        );
                        0
                    }
                };
                let parked = match &self.inner.schedules {
                    Some(store) => store.parked_count(&queue).await.map_err(|e| self.failed(e))?,
                    None => 0,
                };
                (ready, waiting + parked, held)
            };
            out.push(QueueSummary {
                name,
                kind,
                active,
                locked: held.unacknowledged.unwrap_or(0),
                scheduled,
                deferred: 0,
                dead_lettered,
                oldest_enqueued_at: held.head_timestamp,
            });
        }
        Ok(out)
    }

    async fn dead_letters(
        &self,
        queue: &str,
        after: SequenceNumber,
        limit: u32,
    ) -> AdminResult<Page<DeadLetterSummary>> {
        self.page(queue, after, limit).await
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        let (mut found, _) = self.in_full(queue, &[sequence_number]).await?;
        found.pop().ok_or_else(|| {
            AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue} (no longer in its dead-letter queue)"
            ))
        })
    }

    /// One reading of the DLQ for all of them.
    async fn dead_letter_summaries(
        &self,
        queue: &str,
        sequence_numbers: &[SequenceNumber],
    ) -> AdminResult<(Vec<DeadLetterSummary>, Vec<SequenceNumber>)> {
        let (found, missing) = self.in_full(queue, sequence_numbers).await?;
        Ok((found.iter().map(DeadLetter::summary).collect(), missing))
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change(queue, &[sequence_number], true).await?;
        single(queue, sequence_number, &outcome)
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change(queue, &[sequence_number], false).await?;
        single(queue, sequence_number, &outcome)
    }

    /// One reading of the DLQ; copies confirmed 500 at a time before their dead letters
    /// are taken from it.
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change(queue, sequence_numbers, true).await
    }

    /// One reading of the DLQ.
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change(queue, sequence_numbers, false).await
    }

    /// One reading of the whole DLQ, which gives every message back.
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        self.every_number(queue).await
    }
}

fn single(queue: &str, seq: SequenceNumber, outcome: &BatchOutcome) -> AdminResult<()> {
    if let Some((_, why)) = outcome.failed.first() {
        return Err(AdminError::from(Error::new(ErrorKind::Connection {
            detail: why.clone(),
        })));
    }
    if outcome.done.contains(&seq) {
        Ok(())
    } else {
        Err(AdminError::not_found(format!("dead letter {seq} of {queue}")))
    }
}
