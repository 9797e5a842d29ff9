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
//! * **Parking.** RabbitMQ cannot page a queue, and a quorum queue hands one consumer at
//!   most 2,000 unacknowledged messages and puts requeued ones at its back. So the admin
//!   moves the queue's DLQ into the schedule store's table of parked dead letters
//!   (`parked.rs`) as it needs them: a page parks what it lacks (at most a page and one
//!   more: parked dead letters are numbered after those parked before, so a fresh DLQ of
//!   any size lists its first page at the cost of a page, and the total counts the rest
//!   where it is), and taking all of them (`all_dead_letters`, `--all`) parks the whole
//!   DLQ (as many messages as it held when it began); `show`, `resubmit` and `delete` of
//!   numbers park nothing (a number is a parked row's). It consumes the DLQ with a
//!   prefetch of at most 1,000 and no more than it takes, inserts each batch of 500 in
//!   one transaction (a message already parked is skipped), commits, and only then
//!   acknowledges the batch. A crash between the commit
//!   and the acknowledgement redelivers the batch, which inserts nothing: a dead letter
//!   is never lost and never parked twice. Without a schedule store, dead letters cannot
//!   be read (the error says which store to give).
//! * **Identity.** A parked dead letter is numbered in park order (the table's id: what
//!   pages, `show` and `resubmit` take). It is recognised as already parked by a 63-bit
//!   FNV-1a hash of its `x-courier-sequence-number` (stamped by the sending process; the
//!   transport's own dead-letter copies get a new one), message id, AMQP timestamp and
//!   body: what a redelivery does not change (its `x-delivery-count` does change).
//! * **Resubmit** reads parked rows 500 at a time, publishes copies to the queue the DLQ
//!   belongs to (the subscription's own queue for a subscription: not to the topic) with
//!   publisher confirms, without the failure and dead-letter headers, with the same
//!   message id, body and other properties, and once a window of 500 is confirmed
//!   deletes their rows in one transaction. The publish and the delete cannot be one
//!   transaction: a crash or a dropped future between the confirms and the commit leaves
//!   at most one window in both places, with the same message ids (an inbox drops the
//!   second handling), never in neither. **Delete** deletes rows.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::conn::{Connector, connection_error, reply_code};
use super::inspect::WireCounters;
use super::management::{Management, QueueStats};
use super::parked::{Parked, Parking, encode_properties};
use super::publish::{ConfirmChannel, Target, finish};
use super::schedule::ScheduleStore;
use super::wire::{
    self, DEAD_LETTER_SUFFIX, H_DEAD_LETTER_DESCRIPTION, H_DEAD_LETTER_REASON, H_DEAD_LETTER_SOURCE, H_DEATH,
    H_DELIVERY_COUNT, H_ENQUEUED_TIME, H_SEQUENCE_NUMBER, SEPARATOR,
};
use super::{AmqpTransport, Inner};
use crate::admin::model::{failure_text, string_header};
use crate::admin::{
    AdminError, AdminResult, BatchOutcome, BodyView, DeadLetter, DeadLetterSummary, EntityKind, MAX_PAGE, Page,
    QueueAdmin, QueueSummary,
};
use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
use crate::clock::SystemClock;
use crate::error::{Error, ErrorKind};
use crate::message::SequenceNumber;
use crate::recoverability::headers;

/// How many dead letters RabbitMQ delivers ahead to the parking consumer: below the 2,000
/// unacknowledged messages RabbitMQ 3.10 hands one consumer of a quorum queue, and twice
/// a batch, so the next batch arrives while one is written.
const PREFETCH: u16 = 1000;

/// How many dead letters one transaction parks, and how many rows a resubmit or delete
/// reads or deletes at a time.
const BATCH: usize = 500;

/// How long parking waits for the next message before it asks whether the DLQ still
/// has ready messages (a busy broker pauses; another consumer may hold the rest).
const IDLE: Duration = Duration::from_millis(500);

/// How many [`IDLE`] waits in a row parking sits out while the DLQ says it has ready
/// messages, before it ends short (RabbitMQ delivering nothing for 15 s).
const MAX_STALLS: u32 = 30;

/// How long [`AmqpAdmin::connect`] tries to reach RabbitMQ (an operator waits for it;
/// the transport's default is 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many copies a resubmit publishes before it waits for their confirms: also the most
/// messages an interrupted resubmit can leave in both places.
const WINDOW: usize = 500;

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

/// The channel parking a DLQ. Dropped without [`Closing::close`] (an error, a dropped
/// future), it is closed in a task of its own: RabbitMQ gives back what it did not
/// acknowledge.
struct Closing(Option<Channel>);

impl Closing {
    async fn close(mut self) {
        if let Some(c) = self.0.take() {
            let _ = c.close(200, "courier admin: done".into()).await;
        }
    }
}

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(c) = self.0.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = c.close(200, "courier admin: interrupted".into()).await;
            });
        }
    }
}

/// The identity of a dead letter, the same at every delivery of it: a 63-bit FNV-1a hash
/// of its `x-courier-sequence-number` (if any), message id, AMQP timestamp and body.
/// Not the sequence number alone: two processes can stamp the same one (microseconds of
/// their clocks), and two different messages must never be taken for one.
fn identify(p: &BasicProperties, body: &[u8]) -> i64 {
    let stamped = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(H_SEQUENCE_NUMBER))
        .and_then(wire::int)
        .unwrap_or(0);
    // FNV-1a, 64 bits: stable across versions and processes (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&stamped.to_le_bytes());
    eat(p.message_id().as_ref().map_or(&b""[..], |s| s.as_str().as_bytes()));
    eat(&[0xff]);
    eat(&p.timestamp().unwrap_or(0).to_le_bytes());
    eat(&[0xff]);
    eat(body);
    i64::try_from(h & (i64::MAX as u64)).unwrap_or(i64::MAX)
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
    /// # Errors
    /// [`AdminError::Unavailable`] if RabbitMQ cannot be reached within 10 s (the address
    /// is shown without its password).
    pub async fn connect(url: &str, schedules: Option<ScheduleStore>) -> AdminResult<Self> {
        let inner = Arc::new(Inner {
            conn: Connector::new(url.to_owned(), "courier-admin".into(), CONNECT_TIMEOUT, None),
            clock: Arc::new(SystemClock),
            schedules,
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            wake: Notify::new(),
            internal: ConfirmChannel::default(),
            stop: CancellationToken::new(),
            wire: WireCounters::default(),
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

    fn failed(&self, e: Error) -> AdminError {
        match e.kind() {
            ErrorKind::Connection { .. } => AdminError::unavailable(self.inner.conn.display.clone(), e),
            _ => AdminError::from_error(e),
        }
    }

    /// The ready messages and consumers of a queue (`None` when there is no such queue).
    async fn declare_ok(&self, queue: &str) -> AdminResult<Option<(u64, u64)>> {
        let r = self
            .inner
            .on_fresh_channel(|c| async move {
                c.queue_declare(
                    queue.into(),
                    QueueDeclareOptions::default().passive(),
                    FieldTable::default(),
                )
                .await
            })
            .await
            .map_err(|e| self.failed(e))?;
        match r {
            Ok(q) => Ok(Some((u64::from(q.message_count()), u64::from(q.consumer_count())))),
            Err(e) if reply_code(&e) == Some(404) => Ok(None),
            Err(e) => Err(self.failed(connection_error("cannot look up a queue", &e))),
        }
    }

    /// The entities to list: (Courier name, kind, RabbitMQ name).
    async fn entities(&self) -> AdminResult<Vec<(String, EntityKind, String)>> {
        let mut out = Vec::new();
        if let Some(store) = &self.inner.schedules {
            for r in store.recorded().await.map_err(|e| self.failed(e))? {
                let kind = match r.kind {
                    1 => EntityKind::Topic,
                    2 => EntityKind::Subscription,
                    _ => EntityKind::Queue,
                };
                out.push((r.name, kind, r.queue));
            }
        }
        for name in &self.extra {
            if out.iter().any(|(n, _, _)| n == name) {
                continue;
            }
            let queue = queue_of(name);
            let kind = if name.contains("/subscriptions/") {
                EntityKind::Subscription
            } else if self.declare_ok(&queue).await?.is_some() {
                EntityKind::Queue
            } else if self.inner.topic_exists(name).await.map_err(|e| self.failed(e))? {
                EntityKind::Topic
            } else {
                EntityKind::Queue
            };
            out.push((name.clone(), kind, queue));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// The DLQ of a queue or subscription, after checking that the queue exists.
    async fn dlq_of(&self, name: &str) -> AdminResult<(String, String)> {
        if name.contains(SEPARATOR) {
            return Err(AdminError::not_found(format!("queue {name}")));
        }
        let queue = queue_of(name);
        if self.declare_ok(&queue).await?.is_none() {
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

    /// The schedule store the dead letters are parked in, or what to do without one.
    fn store(&self) -> AdminResult<&ScheduleStore> {
        self.inner.schedules.as_ref().ok_or_else(|| {
            AdminError::refused(
                "RabbitMQ dead letters are listed and changed from the transport's schedule store (Postgres or \
                 SQLite), where they are parked first, and this admin has none: give it the store the transport \
                 uses (AmqpAdmin::connect(url, Some(store)); with the courier command, --postgres URL or \
                 --sqlite FILE next to --rabbitmq)",
            )
        })
    }

    /// What a listing shows of a delivered dead letter, and the message to keep.
    fn parking(&self, d: &Delivery) -> AdminResult<Parking> {
        // The body is not needed to decode the headers.
        let m = wire::decode(
            &d.properties,
            Vec::new(),
            true,
            d.redelivered,
            None,
            self.inner.clock.now(),
        );
        let error = failure_text(&m.envelope.properties, m.broker.dead_letter_description.as_deref());
        Ok(Parking {
            identity: identify(&d.properties, &d.data),
            delivery_count: attempts_of(&m.envelope.properties),
            message_id: m.envelope.message_id,
            message_type: m.envelope.message_type,
            reason: m.broker.dead_letter_reason,
            description: m.broker.dead_letter_description,
            error,
            enqueued_at: m.broker.enqueued_time,
            properties: encode_properties(&d.properties).map_err(AdminError::from_error)?,
            body: d.data.clone(),
        })
    }

    /// Moves up to `at_most` messages of the DLQ `dlq` (and no more than it held when this
    /// began) into the schedule store's table of parked dead letters of `queue`: a batch
    /// is inserted and committed, then acknowledged (module docs). Returns how many the
    /// DLQ still held, of those it held at the start, when this ended.
    async fn park(&self, store: &ScheduleStore, queue: &str, dlq: &str, at_most: usize) -> AdminResult<u64> {
        let channel = self.inner.conn.channel().await.map_err(|e| self.failed(e))?;
        let guard = Closing(Some(channel.clone()));
        let count = match channel
            .queue_declare(
                dlq.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => usize::try_from(q.message_count()).unwrap_or(usize::MAX),
            // No DLQ (declared by another program without one): nothing to park.
            Err(e) if reply_code(&e) == Some(404) => return Ok(0),
            Err(e) => return Err(self.failed(connection_error("cannot look up a dead-letter queue", &e))),
        };
        let take = count.min(at_most);
        if take == 0 {
            guard.close().await;
            return Ok(u64::try_from(count).unwrap_or(u64::MAX));
        }
        // No more delivered than taken: a message delivered and not taken would go back to
        // the end of the DLQ (a quorum queue's requeue).
        let prefetch = u16::try_from(take).map_or(PREFETCH, |t| t.min(PREFETCH));
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| self.failed(connection_error("cannot set the prefetch", &e)))?;
        let tag = format!("courier-admin-{}", Uuid::new_v4().simple());
        let mut consumer = channel
            .basic_consume(
                dlq.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| self.failed(connection_error("cannot read a dead-letter queue", &e)))?;
        let (mut seen, mut stalls) = (0_usize, 0_u32);
        let mut batch = Vec::with_capacity(BATCH);
        let mut last_tag = 0;
        loop {
            let mut ended = seen >= take;
            if !ended && batch.len() < BATCH {
                match tokio::time::timeout(IDLE, consumer.next()).await {
                    Ok(Some(Ok(d))) => {
                        stalls = 0;
                        batch.push(self.parking(&d)?);
                        last_tag = d.delivery_tag;
                        seen += 1;
                        continue;
                    }
                    Ok(Some(Err(e))) => {
                        return Err(self.failed(connection_error("cannot read a dead-letter queue", &e)));
                    }
                    // The DLQ was deleted, or the channel closed: what was not acknowledged
                    // goes back to the DLQ and is parked next time.
                    Ok(None) => ended = true,
                    // A pause. If the DLQ still has ready messages, the broker is slow
                    // (a quorum queue applying a large ack, a vhost being deleted): wait
                    // on. If it has none, another consumer holds the rest.
                    Err(_) => {
                        stalls += 1;
                        let ready = self.declare_ok(dlq).await?.map_or(0, |(n, _)| n);
                        ended = ready == 0 || stalls > MAX_STALLS;
                    }
                }
            }
            if !batch.is_empty() {
                store
                    .park(queue, &batch, self.inner.clock.now())
                    .await
                    .map_err(|e| self.failed(e))?;
                // Only now leaves the DLQ: a crash before this ack redelivers the batch,
                // and parking it again inserts nothing.
                channel
                    .basic_ack(last_tag, BasicAckOptions { multiple: true })
                    .await
                    .map_err(|e| self.failed(connection_error("cannot acknowledge parked dead letters", &e)))?;
                batch.clear();
            }
            if ended {
                break;
            }
        }
        // Messages delivered beyond the count (dead-lettered meanwhile) go back to the DLQ.
        guard.close().await;
        Ok(u64::try_from(count.saturating_sub(seen)).unwrap_or(u64::MAX))
    }

    /// The store and the RabbitMQ queue of `name`, for dead letters given by number: a
    /// number is a parked row's (a listing parked it), so nothing is parked here.
    async fn numbered_queue(&self, name: &str) -> AdminResult<(&ScheduleStore, String)> {
        let store = self.store()?;
        let (queue, _dlq) = self.dlq_of(name).await?;
        Ok((store, queue))
    }

    /// The queue and DLQ of `name`, with that DLQ parked, and the store it is parked in.
    async fn parked_queue(&self, name: &str) -> AdminResult<(&ScheduleStore, String)> {
        let store = self.store()?;
        let (queue, dlq) = self.dlq_of(name).await?;
        self.park(store, &queue, &dlq, usize::MAX).await?;
        Ok((store, queue))
    }

    /// The properties of a resubmitted copy: those of the dead letter without what its
    /// failure and dead-lettering added, with a new sequence number and enqueued time.
    fn republished(&self, p: &BasicProperties) -> BasicProperties {
        let mut headers = FieldTable::default();
        if let Some(old) = p.headers() {
            for (k, v) in old {
                let key = k.as_str();
                let added = headers::is_failure_header(key)
                    || [H_DEAD_LETTER_REASON, H_DEAD_LETTER_DESCRIPTION, H_DEAD_LETTER_SOURCE].contains(&key)
                    || [H_DEATH, H_DELIVERY_COUNT, H_SEQUENCE_NUMBER, H_ENQUEUED_TIME].contains(&key)
                    || key.starts_with("x-first-death-")
                    || key.starts_with("x-last-death-");
                if !added {
                    headers.insert(k.clone(), v.clone());
                }
            }
        }
        let now = self.inner.clock.now();
        headers.insert(
            H_SEQUENCE_NUMBER.into(),
            AMQPValue::LongLongInt(self.inner.next_sequence_number()),
        );
        headers.insert(H_ENQUEUED_TIME.into(), AMQPValue::LongLongInt(wire::millis(now)));
        p.clone()
            .with_headers(headers)
            .with_timestamp(u64::try_from(now.timestamp()).unwrap_or(0))
    }

    /// Publishes copies of `rows` to `queue` (confirmed, in windows of [`WINDOW`]), and
    /// deletes each window's confirmed rows in one transaction. Returns (done, failed).
    async fn move_back(
        &self,
        store: &ScheduleStore,
        queue: &str,
        rows: &[Parked],
    ) -> AdminResult<(Vec<SequenceNumber>, Vec<(SequenceNumber, String)>)> {
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        let target = Target::Queue(queue.to_owned());
        for window in rows.chunks(WINDOW) {
            let mut pending = Vec::with_capacity(window.len());
            for p in window {
                let confirm = self
                    .publisher
                    .start(&self.inner.conn, &target, self.republished(&p.properties), &p.body)
                    .await
                    .map_err(|e| self.failed(e))?;
                pending.push((p.id, confirm));
            }
            let mut confirmed = Vec::with_capacity(pending.len());
            let mut missing = false;
            for (id, confirm) in pending {
                match finish(&target, confirm).await {
                    Ok(()) => confirmed.push(id),
                    Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => missing = true,
                    Err(e) => failed.push((id, e.to_string())),
                }
            }
            // Only now leave the table: a crash before this commit leaves them in both.
            store.unpark(queue, &confirmed).await.map_err(|e| self.failed(e))?;
            done.extend(confirmed);
            if missing {
                return Err(AdminError::not_found(format!("queue {queue}")));
            }
        }
        Ok((done, failed))
    }

    /// The parked rows of `queue` among `chunk` (none without a chunk).
    async fn read_parked(
        &self,
        store: &ScheduleStore,
        queue: &str,
        chunk: Option<&[SequenceNumber]>,
    ) -> AdminResult<Option<Vec<Parked>>> {
        match chunk {
            Some(c) => store.parked(queue, c).await.map(Some).map_err(|e| self.failed(e)),
            None => Ok(None),
        }
    }

    async fn change_many(&self, name: &str, seqs: &[SequenceNumber], resubmit: bool) -> AdminResult<BatchOutcome> {
        let (store, queue) = self.numbered_queue(name).await?;
        let mut asked = HashSet::new();
        let wanted: Vec<SequenceNumber> = seqs.iter().copied().filter(|s| asked.insert(*s)).collect();
        let mut outcome = BatchOutcome::default();
        let mut found = HashSet::new();
        let mut chunks = wanted.chunks(BATCH);
        if resubmit {
            let mut next = self.read_parked(store, &queue, chunks.next()).await?;
            while let Some(rows) = next {
                found.extend(rows.iter().map(|r| r.id));
                // The next rows are read while this window's copies are published.
                let (moved, following) = tokio::join!(
                    self.move_back(store, &queue, &rows),
                    self.read_parked(store, &queue, chunks.next())
                );
                let (done, failed) = moved?;
                outcome.done.extend(done);
                outcome.failed.extend(failed);
                next = following?;
            }
        } else {
            for chunk in chunks {
                let gone = store.unpark(&queue, chunk).await.map_err(|e| self.failed(e))?;
                found.extend(gone.iter().copied());
                outcome.done.extend(gone);
            }
        }
        outcome.not_found = wanted.into_iter().filter(|s| !found.contains(s)).collect();
        outcome.done.sort_unstable();
        Ok(outcome)
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
        for (name, kind, queue) in entities? {
            let scheduled = match (&self.inner.schedules, kind) {
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
                let Some((ready, _consumers)) = self.declare_ok(&queue).await? else {
                    continue;
                };
                let dlq = format!("{queue}{DEAD_LETTER_SUFFIX}");
                let waiting = self.declare_ok(&dlq).await?.map_or(0, |(n, _)| n);
                let parked = match &self.inner.schedules {
                    Some(store) => store.parked_count(&queue).await.map_err(|e| self.failed(e))?,
                    None => 0,
                };
                let held = stats.as_ref().and_then(|s| s.get(&queue)).copied().unwrap_or_default();
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
        let store = self.store()?;
        let (rabbit, dlq) = self.dlq_of(queue).await?;
        let limit = i64::from(limit.clamp(1, MAX_PAGE));
        let mut items = store
            .parked_page(&rabbit, after, limit + 1)
            .await
            .map_err(|e| self.failed(e))?;
        // A page parks only what it lacks (parked dead letters are numbered after those
        // parked before), so the first page of a large fresh DLQ costs a page, not the
        // DLQ; the rest is counted where it still is.
        let lacking = usize::try_from(limit + 1)
            .unwrap_or(usize::MAX)
            .saturating_sub(items.len());
        let waiting = if lacking > 0 {
            let waiting = self.park(store, &rabbit, &dlq, lacking).await?;
            items = store
                .parked_page(&rabbit, after, limit + 1)
                .await
                .map_err(|e| self.failed(e))?;
            waiting
        } else {
            self.declare_ok(&dlq).await?.map_or(0, |(n, _)| n)
        };
        let total = store.parked_count(&rabbit).await.map_err(|e| self.failed(e))? + waiting;
        let more = items.len() > usize::try_from(limit).unwrap_or(usize::MAX);
        items.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(Page {
            next_after: if more {
                items.last().map(|d| d.sequence_number)
            } else {
                None
            },
            items,
            total,
        })
    }

    async fn dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<DeadLetter> {
        let (store, rabbit) = self.numbered_queue(queue).await?;
        let rows = store
            .parked(&rabbit, &[sequence_number])
            .await
            .map_err(|e| self.failed(e))?;
        let Some(p) = rows.into_iter().next() else {
            return Err(AdminError::not_found(format!(
                "dead letter {sequence_number} of {queue}"
            )));
        };
        let body_size = p.body.len();
        let body = BodyView::decode(&p.body);
        let m = wire::decode(&p.properties, p.body, true, false, None, self.inner.clock.now());
        let headers_ = m.envelope.properties;
        Ok(DeadLetter {
            queue: queue.to_owned(),
            sequence_number,
            message_id: m.envelope.message_id,
            message_type: m.envelope.message_type,
            correlation_id: m.envelope.correlation_id,
            causation_id: m.envelope.causation_id,
            content_type: m.envelope.content_type,
            session_id: m.envelope.session_id,
            enqueued_at: m.broker.enqueued_time,
            delivery_count: attempts_of(&headers_),
            reason: m.broker.dead_letter_reason,
            description: m.broker.dead_letter_description,
            source: m.broker.dead_letter_source,
            error: failure_text(&headers_, None),
            error_chain: string_header(&headers_, headers::FAILURE_CHAIN),
            headers: headers_,
            body_size,
            body,
        })
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change_many(queue, &[sequence_number], true).await?;
        single(queue, sequence_number, &outcome)
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change_many(queue, &[sequence_number], false).await?;
        single(queue, sequence_number, &outcome)
    }

    /// Rows read, and copies published, 500 at a time; each window's rows
    /// deleted in one transaction once its copies are confirmed.
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change_many(queue, sequence_numbers, true).await
    }

    /// One delete statement per 500 numbers.
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change_many(queue, sequence_numbers, false).await
    }

    /// One query, not a page at a time.
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        let (store, rabbit) = self.parked_queue(queue).await?;
        store.parked_ids(&rabbit).await.map_err(|e| self.failed(e))
    }
}

/// How many times the message was delivered before it was dead-lettered: the endpoint's
/// failure header when it wrote one, else 0 (RabbitMQ keeps no count across the move; the
/// DLQ's own delivery count rises with every listing, so it is not shown).
fn attempts_of(properties: &crate::message::Properties) -> u32 {
    match properties.get(headers::FAILURE_ATTEMPTS) {
        Some(crate::PropertyValue::Int(n)) => u32::try_from(*n).unwrap_or(0),
        _ => 0,
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
