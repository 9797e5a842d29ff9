//! The operations API on RabbitMQ ([`AmqpAdmin`]): queues with their counts, and the dead
//! letters of a queue's `<queue>::dlq`, over AMQP 0-9-1 alone (the management plugin is
//! often off, and is not needed).
//!
//! * **Which queues.** AMQP cannot list a broker's queues. The transport records every
//!   entity it declares in its schedule store's database (`registry.rs`), and this admin
//!   lists those, plus names given by the operator ([`AmqpAdmin::with_queues`]).
//! * **Counts** come from passive `queue.declare` of the queue and of its `::dlq` (the
//!   ready messages; RabbitMQ does not say over AMQP how many are unacknowledged, so
//!   `locked` is 0 and the oldest age unknown), and the scheduled ones from the schedule
//!   store.
//! * **Reading a DLQ** takes its messages: a listing consumes the whole DLQ (as many
//!   messages as it held when the listing began) with manual acknowledgements on a
//!   channel of its own, acknowledges none, and gives them all back with one
//!   `basic.nack` (multiple, requeue) before closing the channel (closing alone, or a
//!   crash, gives them back too). While a listing runs, the messages are invisible to
//!   other consumers of the DLQ, and each one's `x-delivery-count` rises by one (the DLQ
//!   has no delivery limit, so nothing else happens).
//! * **Identity.** A dead letter is named by its `x-courier-sequence-number` header (the
//!   sending process stamps it; the transport's own dead-letter copies get a new one), or,
//!   for a message without one (another producer's), by a 63-bit FNV-1a hash of its
//!   message id, AMQP timestamp and body: the same message gets the same number at every
//!   listing. Pages are in that number's order.
//! * **Resubmit** publishes a copy to the queue the DLQ belongs to (the subscription's
//!   own queue for a subscription: not to the topic) with publisher confirms, and only then
//!   acknowledges the dead letter. AMQP cannot make the two one transaction (transactions
//!   and confirms exclude each other, and no transaction spans two queues' acks and
//!   publishes atomically on quorum queues): a crash or a dropped future between the
//!   confirm and the ack leaves the message in both places, with the same message id
//!   (an inbox drops the second handling), never in neither.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::conn::{Connector, connection_error, reply_code};
use super::inspect::WireCounters;
use super::publish::{ConfirmChannel, Target, finish};
use super::schedule::ScheduleStore;
use super::wire::{self, DEAD_LETTER_SUFFIX, H_SEQUENCE_NUMBER, SEPARATOR};
use super::{AmqpTransport, Inner};
use crate::admin::model::{failure_text, string_header};
use crate::admin::{
    AdminError, AdminResult, BatchOutcome, BodyView, DeadLetter, DeadLetterSummary, EntityKind, MAX_PAGE, Page,
    QueueAdmin, QueueSummary,
};
use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
use crate::clock::SystemClock;
use crate::error::{Error, ErrorKind};
use crate::message::{Envelope, SequenceNumber};
use crate::recoverability::headers;

/// How long a DLQ scan waits for the next message before it takes what it has (messages
/// held by another consumer of the DLQ are not delivered to it; nor, on RabbitMQ 3.10,
/// more than 2,000 unacknowledged messages of a quorum queue to one consumer, even with an
/// unlimited prefetch: a scan of a larger DLQ ends here with 2,000, see
/// docs/operations.md).
const IDLE: Duration = Duration::from_millis(500);

/// How long a scan that has as many messages as the DLQ held waits for more.
const SETTLE: Duration = Duration::from_millis(300);

/// How long [`AmqpAdmin::connect`] tries to reach RabbitMQ (an operator waits for it;
/// the transport's default is 30 s).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How many copies a resubmit publishes before it waits for their confirms: also the most
/// messages an interrupted resubmit can leave in both places.
const WINDOW: usize = 256;

/// The operations API on RabbitMQ: queues and dead letters, with the scheduled counts of
/// the transport's schedule store. See the module docs for what a listing costs.
pub struct AmqpAdmin {
    inner: Arc<Inner>,
    /// Names the operator gave, besides the recorded ones.
    extra: Vec<String>,
    /// Whether this admin opened the connection (and closes it).
    owns: bool,
    publisher: ConfirmChannel,
}

impl std::fmt::Debug for AmqpAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpAdmin")
            .field("broker", &self.inner.conn.display)
            .finish_non_exhaustive()
    }
}

/// One dead letter held by a scan (not acknowledged).
struct Held {
    tag: u64,
    id: SequenceNumber,
    properties: BasicProperties,
    body: Vec<u8>,
}

/// A channel consuming a DLQ. Dropped without [`Scan::release`] (a dropped future), it
/// is closed in a task of its own: RabbitMQ gives its unacknowledged messages back.
struct Scan {
    channel: Option<Channel>,
    held: Vec<Held>,
}

impl Drop for Scan {
    fn drop(&mut self) {
        if let Some(c) = self.channel.take()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            rt.spawn(async move {
                let _ = c.close(200, "courier admin: interrupted".into()).await;
            });
        }
    }
}

impl Scan {
    fn channel(&self) -> AdminResult<&Channel> {
        self.channel
            .as_ref()
            .ok_or_else(|| AdminError::from(Error::new(ErrorKind::Closed)))
    }

    /// Gives back every message not acknowledged (in their order) and closes the channel.
    async fn release(mut self) {
        if let Some(c) = self.channel.take() {
            let _ = c
                .basic_nack(
                    0,
                    BasicNackOptions {
                        multiple: true,
                        requeue: true,
                    },
                )
                .await;
            let _ = c.close(200, "courier admin: done".into()).await;
        }
    }
}

/// The name of a dead letter: its Courier sequence number, or a stable hash of what it
/// carries (module docs).
fn identify(p: &BasicProperties, body: &[u8]) -> SequenceNumber {
    let stamped = p
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(H_SEQUENCE_NUMBER))
        .and_then(wire::int);
    if let Some(n) = stamped.filter(|n| *n > 0) {
        return n;
    }
    // FNV-1a, 64 bits: stable across versions and processes (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(p.message_id().as_ref().map_or(&b""[..], |s| s.as_str().as_bytes()));
    eat(&[0xff]);
    eat(&p.timestamp().unwrap_or(0).to_le_bytes());
    eat(&[0xff]);
    eat(body);
    i64::try_from(h & (i64::MAX as u64)).unwrap_or(1).max(1)
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

    /// Consumes the DLQ `dlq` without acknowledging: every message it held when the scan
    /// began, or until each of `wanted` was seen (all when `wanted` is `None`).
    async fn scan(&self, dlq: &str, wanted: Option<&HashSet<SequenceNumber>>) -> AdminResult<Scan> {
        let channel = self.inner.conn.channel().await.map_err(|e| self.failed(e))?;
        let mut scan = Scan {
            channel: Some(channel.clone()),
            held: Vec::new(),
        };
        let count = match channel
            .queue_declare(
                dlq.into(),
                QueueDeclareOptions::default().passive(),
                FieldTable::default(),
            )
            .await
        {
            Ok(q) => usize::try_from(q.message_count()).unwrap_or(usize::MAX),
            // No DLQ (declared by another program without one): no dead letters.
            Err(e) if reply_code(&e) == Some(404) => {
                scan.channel = None;
                return Ok(scan);
            }
            Err(e) => return Err(self.failed(connection_error("cannot look up a dead-letter queue", &e))),
        };
        // Unlimited prefetch: every message comes at once.
        channel
            .basic_qos(0, BasicQosOptions::default())
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
        let mut missing: Option<HashSet<SequenceNumber>> = wanted.cloned();
        loop {
            if missing.as_ref().is_some_and(HashSet::is_empty) {
                break;
            }
            // The count of the declare may lag behind messages being given back (a
            // quorum queue applies returns through its log): once it is reached, wait
            // a little for stragglers; before, a while for messages in flight.
            let wait = if scan.held.len() >= count { SETTLE } else { IDLE };
            let Ok(next) = tokio::time::timeout(wait, consumer.next()).await else {
                break;
            };
            let Some(item) = next else { break };
            let d = item.map_err(|e| self.failed(connection_error("cannot read a dead-letter queue", &e)))?;
            let id = identify(&d.properties, &d.data);
            if let Some(m) = missing.as_mut() {
                m.remove(&id);
            }
            scan.held.push(Held {
                tag: d.delivery_tag,
                id,
                properties: d.properties,
                body: d.data,
            });
        }
        Ok(scan)
    }

    fn decode(&self, h: &Held) -> crate::message::ReceivedMessage {
        let d = wire::decode(&h.properties, h.body.clone(), true, None, self.inner.clock.now());
        crate::message::ReceivedMessage {
            envelope: d.envelope,
            broker: d.broker,
        }
    }

    fn summary(&self, h: &Held) -> DeadLetterSummary {
        let m = self.decode(h);
        DeadLetterSummary {
            sequence_number: h.id,
            delivery_count: attempts_of(&m.envelope.properties),
            error: failure_text(&m.envelope.properties, m.broker.dead_letter_description.as_deref()),
            message_id: m.envelope.message_id,
            message_type: m.envelope.message_type,
            enqueued_at: m.broker.enqueued_time,
            reason: m.broker.dead_letter_reason,
        }
    }

    /// Publishes copies of the held messages `picked` to `queue` (confirmed), then
    /// acknowledges each confirmed one in the DLQ. Returns (done, failed).
    async fn move_back(
        &self,
        scan: &Scan,
        queue: &str,
        picked: &[&Held],
    ) -> AdminResult<(Vec<SequenceNumber>, Vec<(SequenceNumber, String)>)> {
        let (mut done, mut failed) = (Vec::new(), Vec::new());
        if picked.is_empty() {
            return Ok((done, failed));
        }
        let target = Target::Queue(queue.to_owned());
        let channel = scan.channel()?;
        for window in picked.chunks(WINDOW) {
            let mut pending = Vec::with_capacity(window.len());
            for h in window {
                let mut envelope: Envelope = self.decode(h).envelope;
                envelope.properties.retain(|k, _| !headers::is_failure_header(k));
                envelope.scheduled_enqueue_time = None;
                let properties = wire::properties(&envelope, self.inner.clock.now(), self.inner.next_sequence_number())
                    .map_err(AdminError::from_error)?;
                let confirm = self
                    .publisher
                    .start(&self.inner.conn, &target, properties, &envelope.body)
                    .await
                    .map_err(|e| self.failed(e))?;
                pending.push((*h, confirm));
            }
            for (h, confirm) in pending {
                match finish(&target, confirm).await {
                    Ok(()) => {
                        // Only now leaves the DLQ: a crash before this ack leaves it in both.
                        channel
                            .basic_ack(h.tag, BasicAckOptions::default())
                            .await
                            .map_err(|e| self.failed(connection_error("cannot acknowledge a dead letter", &e)))?;
                        done.push(h.id);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }) => {
                        return Err(AdminError::not_found(format!("queue {queue}")));
                    }
                    Err(e) => failed.push((h.id, e.to_string())),
                }
            }
        }
        Ok((done, failed))
    }

    async fn change_many(&self, name: &str, seqs: &[SequenceNumber], resubmit: bool) -> AdminResult<BatchOutcome> {
        let (queue, dlq) = self.dlq_of(name).await?;
        let wanted: HashSet<SequenceNumber> = seqs.iter().copied().collect();
        let scan = self.scan(&dlq, Some(&wanted)).await?;
        // The first held message of each wanted number (a number held twice is taken once).
        let mut seen = HashSet::new();
        let picked: Vec<&Held> = scan
            .held
            .iter()
            .filter(|h| wanted.contains(&h.id) && seen.insert(h.id))
            .collect();
        let mut outcome = BatchOutcome::default();
        if resubmit {
            let result = self.move_back(&scan, &queue, &picked).await;
            let (done, failed) = match result {
                Ok(r) => r,
                Err(e) => {
                    scan.release().await;
                    return Err(e);
                }
            };
            outcome.done = done;
            outcome.failed = failed;
        } else if !picked.is_empty() {
            let channel = scan.channel()?;
            for h in &picked {
                channel
                    .basic_ack(h.tag, BasicAckOptions::default())
                    .await
                    .map_err(|e| self.failed(connection_error("cannot delete a dead letter", &e)))?;
                outcome.done.push(h.id);
            }
        }
        let found: BTreeSet<SequenceNumber> = picked.iter().map(|h| h.id).collect();
        drop(picked);
        scan.release().await;
        let mut asked = HashSet::new();
        outcome.not_found = seqs
            .iter()
            .copied()
            .filter(|s| !found.contains(s) && asked.insert(*s))
            .collect();
        outcome.done.sort_unstable();
        Ok(outcome)
    }
}

#[async_trait]
impl QueueAdmin for AmqpAdmin {
    fn describe(&self) -> String {
        format!("rabbitmq {}", self.inner.conn.display)
    }

    fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    async fn queues(&self) -> AdminResult<Vec<QueueSummary>> {
        let mut out = Vec::new();
        for (name, kind, queue) in self.entities().await? {
            let scheduled = match (&self.inner.schedules, kind) {
                (Some(store), EntityKind::Queue | EntityKind::Topic) => {
                    store.count(&queue).await.map_err(|e| self.failed(e))?
                }
                _ => 0,
            };
            let (active, dead_lettered) = if kind == EntityKind::Topic {
                if !self.inner.topic_exists(&queue).await.map_err(|e| self.failed(e))? {
                    continue;
                }
                (0, 0)
            } else {
                // Gone (deleted outside Courier): not listed.
                let Some((ready, _consumers)) = self.declare_ok(&queue).await? else {
                    continue;
                };
                let dlq = format!("{queue}{DEAD_LETTER_SUFFIX}");
                (ready, self.declare_ok(&dlq).await?.map_or(0, |(n, _)| n))
            };
            out.push(QueueSummary {
                name,
                kind,
                active,
                locked: 0,
                scheduled,
                deferred: 0,
                dead_lettered,
                oldest_enqueued_at: None,
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
        let (_, dlq) = self.dlq_of(queue).await?;
        let scan = self.scan(&dlq, None).await?;
        let total = u64::try_from(scan.held.len()).unwrap_or(u64::MAX);
        let mut items: Vec<DeadLetterSummary> = scan
            .held
            .iter()
            .filter(|h| h.id > after)
            .map(|h| self.summary(h))
            .collect();
        scan.release().await;
        items.sort_by_key(|d| d.sequence_number);
        let limit = usize::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(1);
        let more = items.len() > limit;
        items.truncate(limit);
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
        let (_, dlq) = self.dlq_of(queue).await?;
        let wanted = HashSet::from([sequence_number]);
        let scan = self.scan(&dlq, Some(&wanted)).await?;
        let found = scan.held.iter().find(|h| h.id == sequence_number).map(|h| {
            let m = self.decode(h);
            let headers_ = m.envelope.properties.clone();
            DeadLetter {
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
                body_size: h.body.len(),
                body: BodyView::decode(&h.body),
            }
        });
        scan.release().await;
        found.ok_or_else(|| AdminError::not_found(format!("dead letter {sequence_number} of {queue}")))
    }

    async fn resubmit(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change_many(queue, &[sequence_number], true).await?;
        single(queue, sequence_number, &outcome)
    }

    async fn delete_dead_letter(&self, queue: &str, sequence_number: SequenceNumber) -> AdminResult<()> {
        let outcome = self.change_many(queue, &[sequence_number], false).await?;
        single(queue, sequence_number, &outcome)
    }

    /// One scan of the DLQ for all of them; copies published in windows of 256, each
    /// acknowledged in the DLQ once its copy is confirmed.
    async fn resubmit_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change_many(queue, sequence_numbers, true).await
    }

    /// One scan of the DLQ for all of them.
    async fn delete_many(&self, queue: &str, sequence_numbers: &[SequenceNumber]) -> AdminResult<BatchOutcome> {
        self.change_many(queue, sequence_numbers, false).await
    }

    /// One scan, not a page at a time.
    async fn all_dead_letters(&self, queue: &str) -> AdminResult<Vec<SequenceNumber>> {
        let (_, dlq) = self.dlq_of(queue).await?;
        let scan = self.scan(&dlq, None).await?;
        let mut all: Vec<SequenceNumber> = scan.held.iter().map(|h| h.id).collect();
        scan.release().await;
        all.sort_unstable();
        all.dedup();
        Ok(all)
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
