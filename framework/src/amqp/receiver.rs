//! The RabbitMQ receiver: PeekLock as manual acknowledgements on a consumer with a
//! prefetch, and the settler that acks, requeues or moves a message to its dead-letter
//! queue.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use futures_lite::StreamExt;
use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Consumer};
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::endpoint::recoverability::headers;
use crate::entity::EntityPath;
use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::{LockToken, ReceivedMessage, SequenceNumber, reasons};
use crate::transport::{Delivery, Receiver, Settlement, Settler};

use super::conn::{Held, close_later, connection_error};
use super::inspect::{self, Refusal};
use super::publish::{Target, finish};
use super::{Inner, unsupported, wire};
use crate::loglimit::{Level, LogLimiter};

type Pending = Arc<std::sync::Mutex<HashMap<LockToken, Weak<AmqpSettler>>>>;

struct Consuming {
    channel: Channel,
    consumer: Consumer,
    /// The channel's prefetch (basic.qos) now.
    prefetch: u16,
}

pub(crate) struct AmqpReceiver {
    pub(crate) inner: Arc<Inner>,
    pub(crate) path: EntityPath,
    /// The RabbitMQ queue read.
    pub(crate) queue: String,
    /// Where dead-lettered messages go; `None` when this reads a dead-letter queue.
    pub(crate) dead_letter_queue: Option<String>,
    /// Kept for later receives; the transport's close closes them first ([`Held`]).
    consuming: Arc<Mutex<Option<Consuming>>>,
    getter: Arc<Mutex<Option<Channel>>>,
    pending: Pending,
    /// Which of the receiver's own dead-letterings (refusals, expiries) are logged in
    /// full, and which `x-courier-*` headers ignored (`loglimit.rs`).
    dead_log: LogLimiter,
    ignored_log: LogLimiter,
}

impl Drop for AmqpReceiver {
    /// Its channels are closed by Courier, not left to lapin (see [`close_later`]); the
    /// consumer's only when no delivery holds it (its settlement needs the channel: lapin
    /// closes it when the last one drops).
    fn drop(&mut self) {
        if let Ok(mut getter) = self.getter.try_lock()
            && let Some(channel) = getter.take()
        {
            close_later(channel);
        }
        if self.held() > 0 {
            return;
        }
        let Ok(mut slot) = self.consuming.try_lock() else {
            return;
        };
        let Some(Consuming { channel, consumer, .. }) = slot.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if channel.status().connected() {
                    let _ = channel.close(200, "OK".into()).await;
                }
                // Once the channel is closed, the consumer asks nothing more of lapin.
                drop(consumer);
            });
        }
    }
}

impl Held for Mutex<Option<Consuming>> {
    fn take_channel(&self) -> Option<(Channel, Box<dyn std::any::Any + Send>)> {
        let c = self.try_lock().ok()?.take()?;
        // The consumer is dropped once its channel is closed: it then asks nothing more.
        Some((c.channel, Box::new(c.consumer)))
    }
}

/// A delivery the receiver moves to the dead-letter queue itself (refused, or expired by
/// the transport's clock), waiting for the confirms of its batch ([`AmqpReceiver::settle_dead`]).
struct ToDeadLetter {
    acker: Acker,
    delivery_tag: u64,
    copy: crate::message::Envelope,
    /// For a refusal, the properties as received with the dead-letter headers added
    /// (`wire::refused_copy`): what goes to the dead-letter queue, byte for byte.
    raw: Option<BasicProperties>,
    reason: &'static str,
    description: String,
}

impl AmqpReceiver {
    pub(crate) fn new(inner: Arc<Inner>, path: EntityPath) -> Self {
        let queue = wire::queue_of(&path);
        let dead_letter_queue = match path.sub_queue() {
            crate::entity::SubQueue::Main => Some(wire::dead_letter_queue(&queue)),
            crate::entity::SubQueue::DeadLetter => None,
        };
        let consuming: Arc<Mutex<Option<Consuming>>> = Arc::default();
        let getter: Arc<Mutex<Option<Channel>>> = Arc::default();
        for place in [consuming.clone() as Arc<dyn Held>, getter.clone() as Arc<dyn Held>] {
            inner.conn.hold(Arc::downgrade(&place));
        }
        Self {
            path,
            queue,
            dead_letter_queue,
            consuming,
            getter,
            pending: Arc::default(),
            dead_log: crate::endpoint::metrics::transport_dead_letter_log(inner.clock.clone()),
            ignored_log: LogLimiter::new(
                inner.clock.clone(),
                crate::endpoint::metrics::DEAD_LETTER_LOG_EVERY,
                Level::Warn,
                "x-courier headers ignored",
            ),
            inner,
        }
    }

    /// Unsettled deliveries handed out by this receiver.
    fn held(&self) -> usize {
        self.pending.lock().map_or(0, |p| p.len())
    }

    async fn consume(&self, prefetch: u16) -> Result<Consuming> {
        let channel = self.inner.conn.channel().await?;
        channel
            .basic_qos(prefetch, BasicQosOptions::default())
            .await
            .map_err(|e| connection_error("cannot set the prefetch", &e))?;
        let tag = format!("courier-{}", Uuid::new_v4().simple());
        let consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| match super::conn::reply_code(&e) {
                Some(404) => Error::new(ErrorKind::EntityNotFound {
                    path: self.path.to_string(),
                }),
                _ => connection_error("cannot start consuming", &e),
            })?;
        Ok(Consuming {
            channel,
            consumer,
            prefetch,
        })
    }

    /// The copy of `m` that goes to the dead-letter queue with `reason` and
    /// `description`: no time-to-live, the dead-letter headers written.
    fn dead_copy(&self, m: &ReceivedMessage, reason: &str, description: &str) -> crate::message::Envelope {
        let mut copy = m.envelope.clone();
        // A producer's failure headers are not the record of this dead-lettering.
        copy.properties.retain(|k, _| !k.starts_with(headers::FAILURE_PREFIX));
        wire::dead_letter_headers(&mut copy, reason, description, &self.queue);
        copy
    }

    /// Counts a message this receiver moved to the dead-letter queue itself, and logs it
    /// in full when it is the first of its reason in a while (a flood gives a summary
    /// line per window of the transport's clock instead: `loglimit.rs`).
    fn dead_lettered(&self, message_id: &str, delivery_tag: u64, reason: &'static str, description: &str) {
        // An expiry is no refusal: the wire-format counters do not count it.
        if reason != reasons::TTL_EXPIRED {
            self.inner.wire.refused();
        }
        let queue = self.path.to_string();
        crate::endpoint::metrics::count_dead_lettered("amqp", &queue, reason, 1);
        if !self.dead_log.admit(&queue, reason, 1, message_id, message_id) {
            return;
        }
        let (queue, message_id, problem) = (&self.queue, Escaped(message_id), Escaped(description));
        if reason == reasons::TTL_EXPIRED {
            tracing::warn!(%queue, delivery_tag, %message_id, reason, %problem,
                "a message's time-to-live passed before it was received; it was moved to the dead-letter queue");
        } else {
            tracing::warn!(%queue, delivery_tag, %message_id, reason, %problem,
                "a message breaks the wire format; it was moved to the dead-letter queue");
        }
    }

    /// Checks a delivery of a main queue against the wire format (a dead-letter queue is
    /// read as it is): warns about and counts the `x-courier-*` headers ignored, and
    /// returns why the delivery is refused, if it is.
    fn inspect(&self, p: &BasicProperties, m: &ReceivedMessage, delivery_tag: u64) -> Option<Refusal> {
        self.dead_letter_queue.as_ref()?;
        let findings = inspect::inspect(p, &m.envelope, self.inner.max_message_size);
        self.inner.wire.ignored(findings.ignored.len());
        // Text from the producer is escaped: no forged log lines, no terminal escapes.
        for (header, problem) in &findings.ignored {
            let id = &m.envelope.message_id;
            if self.ignored_log.admit(&self.queue, header, 1, id, id) {
                tracing::warn!(
                    queue = %self.queue,
                    delivery_tag,
                    message_id = %Escaped(id),
                    header = %Escaped(header),
                    problem = %Escaped(problem),
                    "an x-courier header is ignored"
                );
            }
        }
        findings.refusal
    }

    /// Why a delivery of a main queue goes to the dead-letter queue at once, if it does:
    /// it breaks the wire format (a refusal), or it expired by the transport's clock.
    fn doomed(
        &self,
        p: &BasicProperties,
        m: &ReceivedMessage,
        delivery_tag: u64,
        now: DateTime<Utc>,
    ) -> Option<(&'static str, String)> {
        if let Some(r) = self.inspect(p, m, delivery_tag) {
            return Some((r.reason, r.description));
        }
        self.is_expired(m, now).then(|| {
            (
                reasons::TTL_EXPIRED,
                "the message's time-to-live passed before it was received".to_owned(),
            )
        })
    }

    /// Moves refused and expired deliveries to the dead-letter queue: every copy is
    /// published first and the confirms awaited together (one round trip for the batch,
    /// not one per message, so that a burst of refusals costs what dead-lettering costs),
    /// then each original is acked once its copy is confirmed, or requeued when it is not.
    async fn settle_dead(&self, batch: Vec<ToDeadLetter>) {
        if batch.is_empty() {
            return;
        }
        let Some(dlq) = &self.dead_letter_queue else {
            return;
        };
        let results = self
            .inner
            .dead_letter_many(dlq, batch.iter().map(|d| (&d.copy, d.raw.as_ref())))
            .await;
        for (d, result) in batch.into_iter().zip(results) {
            match result {
                Ok(()) => {
                    self.dead_lettered(&d.copy.message_id, d.delivery_tag, d.reason, &d.description);
                    self.inner.conn.acked(d.acker.ack(BasicAckOptions::default())).await;
                }
                Err(e) => {
                    tracing::error!(
                        queue = %self.queue,
                        delivery_tag = d.delivery_tag,
                        error = %e,
                        "cannot move a refused or expired message to the dead-letter queue; it is requeued"
                    );
                    let requeue = BasicNackOptions {
                        requeue: true,
                        ..BasicNackOptions::default()
                    };
                    self.inner.conn.acked(d.acker.nack(requeue)).await;
                }
            }
        }
    }

    fn is_expired(&self, m: &ReceivedMessage, now: DateTime<Utc>) -> bool {
        self.dead_letter_queue.is_some() && m.broker.expires_at.is_some_and(|at| at <= now)
    }

    /// Turns an AMQP delivery into a PeekLock [`Delivery`], or into a delivery to move to
    /// the dead-letter queue (refused or expired), which the caller settles with others.
    fn accept(&self, d: lapin::message::Delivery, channel: &Channel) -> Accepted {
        let now = self.inner.clock.now();
        let token = LockToken::from_uuid(Uuid::new_v4());
        let decoded = wire::decode(
            &d.properties,
            d.data,
            self.dead_letter_queue.is_none(),
            d.redelivered,
            Some(token),
            now,
        );
        let message = ReceivedMessage {
            envelope: decoded.envelope,
            broker: decoded.broker,
        };
        if let Some((reason, description)) = self.doomed(&d.properties, &message, d.delivery_tag, now) {
            // Settled apart from the deliveries received with it, which are not touched.
            return Accepted::Dead(ToDeadLetter {
                copy: self.dead_copy(&message, reason, &description),
                raw: (reason != reasons::TTL_EXPIRED)
                    .then(|| wire::refused_copy(&d.properties, reason, &description, &self.queue)),
                acker: d.acker,
                delivery_tag: d.delivery_tag,
                reason,
                description,
            });
        }
        let settler = Arc::new(AmqpSettler {
            inner: self.inner.clone(),
            acker: d.acker,
            channel: channel.clone(),
            token,
            pending: self.pending.clone(),
            source: self.queue.clone(),
            dead_letter_queue: self.dead_letter_queue.clone(),
            message: message.clone(),
            settled: AtomicBool::new(false),
        });
        if let Ok(mut p) = self.pending.lock() {
            p.insert(token, Arc::downgrade(&settler));
        }
        Accepted::Delivery(Delivery::new(message, settler))
    }
}

/// What [`AmqpReceiver::accept`] made of a delivery (moved once, at once: the sizes of
/// the two do not matter).
#[allow(clippy::large_enum_variant)]
enum Accepted {
    Delivery(Delivery),
    Dead(ToDeadLetter),
}

#[async_trait]
impl Receiver for AmqpReceiver {
    fn path(&self) -> &EntityPath {
        &self.path
    }

    async fn receive(&self, max_count: usize, max_wait: Duration) -> Result<Vec<Delivery>> {
        self.inner.conn.check_open()?;
        if max_count == 0 {
            return Ok(Vec::new());
        }
        // RabbitMQ hands a consumer as many unacknowledged messages as its prefetch; the
        // prefetch follows the demand (held + asked for, never lowered), so a receiver
        // holds no more than it was asked for at once and competing receivers get the
        // rest (S2.2).
        let wanted = u16::try_from(self.held().saturating_add(max_count)).unwrap_or(u16::MAX);
        let mut slot = self.consuming.lock().await;
        if slot.as_ref().is_none_or(|c| !c.channel.status().connected()) {
            *slot = None;
            *slot = Some(self.consume(wanted).await?);
        }
        if let Some(c) = slot.as_mut()
            && wanted > c.prefetch
        {
            c.channel
                .basic_qos(wanted, BasicQosOptions::default())
                .await
                .map_err(|e| connection_error("cannot raise the prefetch", &e))?;
            c.prefetch = wanted;
        }
        let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
        let mut out = Vec::new();
        // Refused and expired deliveries, moved to the dead-letter queue together when no
        // more deliveries are waiting (their unacked count holds the prefetch).
        let mut dead = Vec::new();
        let result = loop {
            if out.len() >= max_count {
                break Ok(());
            }
            let Some(c) = slot.as_mut() else { break Ok(()) };
            // Take what is already here; wait only for the first message, after settling
            // the dead ones. (A zero tokio timeout would wait for the timer's next 1 ms
            // tick: measured at 1.1 ms per call, a fifth of the receive throughput.)
            let mut next = futures_lite::future::poll_once(c.consumer.next()).await;
            if next.is_none() && !dead.is_empty() {
                self.settle_dead(std::mem::take(&mut dead)).await;
                continue;
            }
            if next.is_none() && out.is_empty() && !max_wait.is_zero() {
                next = tokio::time::timeout_at(deadline, c.consumer.next()).await.ok();
            }
            let Some(item) = next else { break Ok(()) };
            match item {
                Some(Ok(delivery)) => {
                    let channel = c.channel.clone();
                    match self.accept(delivery, &channel) {
                        Accepted::Delivery(d) => out.push(d),
                        Accepted::Dead(d) => dead.push(d),
                    }
                }
                Some(Err(e)) => {
                    *slot = None;
                    if out.is_empty() {
                        break Err(connection_error(&format!("the consumer of {} failed", self.queue), &e));
                    }
                }
                None => {
                    *slot = None;
                    if out.is_empty() {
                        break self.inner.conn.check_open().and_then(|()| {
                            Err(Error::new(ErrorKind::Connection {
                                detail: format!("the consumer of {} stopped (connection lost)", self.queue),
                            }))
                        });
                    }
                }
            }
        };
        // Those still waiting: settled before the receive answers (on a channel that went
        // away their acks fail, and RabbitMQ delivers them again).
        self.settle_dead(dead).await;
        result.map(|()| out)
    }

    async fn receive_and_delete(&self, max_count: usize, max_wait: Duration) -> Result<Vec<ReceivedMessage>> {
        self.inner.conn.check_open()?;
        let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
        let mut slot = self.getter.lock().await;
        let mut out = Vec::new();
        while out.len() < max_count {
            let channel = match slot.as_ref() {
                Some(c) if c.status().connected() => c.clone(),
                _ => {
                    let c = self.inner.conn.channel().await?;
                    *slot = Some(c.clone());
                    c
                }
            };
            let got = channel
                .basic_get(self.queue.as_str().into(), BasicGetOptions { no_ack: true })
                .await
                .map_err(|e| match super::conn::reply_code(&e) {
                    Some(404) => Error::new(ErrorKind::EntityNotFound {
                        path: self.path.to_string(),
                    }),
                    _ => connection_error("basic.get failed", &e),
                })?;
            match got {
                Some(m) => {
                    let now = self.inner.clock.now();
                    let d = m.delivery;
                    let decoded = wire::decode(
                        &d.properties,
                        d.data,
                        self.dead_letter_queue.is_none(),
                        d.redelivered,
                        None,
                        now,
                    );
                    let message = ReceivedMessage {
                        envelope: decoded.envelope,
                        broker: decoded.broker,
                    };
                    // The message left RabbitMQ when it was taken: a refused one is in
                    // the dead-letter queue only if the copy is confirmed, else the
                    // receive fails with the error (at most once, S2.1).
                    match self.doomed(&d.properties, &message, d.delivery_tag, now) {
                        Some((reason, description)) => {
                            if let Some(dlq) = &self.dead_letter_queue {
                                let copy = self.dead_copy(&message, reason, &description);
                                let raw = (reason != reasons::TTL_EXPIRED)
                                    .then(|| wire::refused_copy(&d.properties, reason, &description, &self.queue));
                                let results = self
                                    .inner
                                    .dead_letter_many(dlq, [(&copy, raw.as_ref())].into_iter())
                                    .await;
                                results.into_iter().next().unwrap_or(Ok(()))?;
                                self.dead_lettered(&message.envelope.message_id, d.delivery_tag, reason, &description);
                            }
                        }
                        None => out.push(message),
                    }
                }
                None if !out.is_empty() || tokio::time::Instant::now() >= deadline => break,
                // basic.get does not wait: poll until a message comes or the wait is over.
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
        Ok(out)
    }

    async fn receive_deferred(&self, _sequence_numbers: &[SequenceNumber]) -> Result<Vec<Delivery>> {
        Err(unsupported("receiving deferred messages", "S2.5"))
    }

    async fn settle_by_token(&self, token: LockToken, settlement: Settlement) -> Result<()> {
        let settler = self
            .pending
            .lock()
            .ok()
            .and_then(|p| p.get(&token).and_then(Weak::upgrade));
        match settler {
            Some(s) => {
                let message = s.message.clone();
                s.settle(&message, settlement).await
            }
            None => Err(Error::new(ErrorKind::UnknownLockToken {
                token: token.to_string(),
            })),
        }
    }
}

/// Settles one delivery. A delivery dropped unsettled is requeued at once (the effect
/// of lock expiry on a broker with lock durations: S2.5).
pub(crate) struct AmqpSettler {
    inner: Arc<Inner>,
    acker: Acker,
    channel: Channel,
    token: LockToken,
    pending: Pending,
    source: String,
    dead_letter_queue: Option<String>,
    message: ReceivedMessage,
    settled: AtomicBool,
}

impl AmqpSettler {
    fn lock_lost() -> Error {
        Error::new(ErrorKind::LockLost)
    }

    async fn ack(&self) -> Result<()> {
        if self.inner.conn.acked(self.acker.ack(BasicAckOptions::default())).await {
            Ok(())
        } else {
            Err(Self::lock_lost())
        }
    }
}

#[async_trait]
impl Settler for AmqpSettler {
    async fn settle(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        let outcome = self.settle_once(message, settlement).await;
        // Settled (or the lock is gone): the token is spent. A settlement that failed
        // before it could take effect leaves the token usable.
        if self.settled.load(Ordering::Acquire)
            && let Ok(mut p) = self.pending.lock()
        {
            p.remove(&self.token);
        }
        outcome
    }

    async fn renew(&self, _message: &ReceivedMessage) -> Result<DateTime<Utc>> {
        Err(unsupported("lock renewal", "S2.4"))
    }
}

impl AmqpSettler {
    async fn settle_once(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        if let Settlement::Defer { .. } = settlement {
            return Err(unsupported("defer", "S2.5"));
        }
        if self.settled.swap(true, Ordering::AcqRel) {
            return Err(Self::lock_lost());
        }
        if !self.channel.status().connected() {
            return Err(Self::lock_lost());
        }
        match settlement {
            Settlement::Complete => self.ack().await,
            Settlement::Abandon { .. } => {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                if self.inner.conn.acked(self.acker.nack(requeue)).await {
                    Ok(())
                } else {
                    Err(Self::lock_lost())
                }
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties,
            } => {
                let Some(dlq) = &self.dead_letter_queue else {
                    self.settled.store(false, Ordering::Release);
                    return Err(Error::new(ErrorKind::InvalidOperation {
                        reason: "the message is in a dead-letter queue already".into(),
                    }));
                };
                let mut copy = message.envelope.clone();
                // The failure headers of the copy are those of the settlement (an
                // endpoint's record of the failure), never a producer's: the seal vouches
                // for them (issue 31).
                copy.properties.retain(|k, _| !k.starts_with(headers::FAILURE_PREFIX));
                copy.properties.extend(properties);
                wire::dead_letter_headers(&mut copy, &reason, &description, &self.source);
                // Confirmed in the dead-letter queue first, then acked: a crash in between
                // leaves a copy in both, never in neither.
                if let Err(e) = self.inner.dead_letter(dlq, &copy).await {
                    self.settled.store(false, Ordering::Release);
                    return Err(e);
                }
                self.ack().await
            }
            Settlement::Defer { .. } => Err(unsupported("defer", "S2.5")),
        }
    }
}

impl Drop for AmqpSettler {
    fn drop(&mut self) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&self.token);
        }
        if self.settled.load(Ordering::Acquire) || !self.channel.status().connected() {
            return;
        }
        let acker = self.acker.clone();
        let inner = self.inner.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..BasicNackOptions::default()
                };
                inner.conn.acked(acker.nack(requeue)).await;
            });
        }
    }
}

impl Inner {
    /// Publishes a copy into a dead-letter queue, confirmed.
    pub(crate) async fn dead_letter(&self, dlq: &str, copy: &crate::message::Envelope) -> Result<()> {
        let results = self.dead_letter_many(dlq, [(copy, None)].into_iter()).await;
        results.into_iter().next().unwrap_or(Ok(()))
    }

    /// Publishes copies into a dead-letter queue, all of them before waiting for any
    /// confirm: one round trip for the batch. The outcome of each, in order.
    /// A copy with properties as received (a refusal's) is published with those, byte
    /// for byte; the others are encoded from the envelope.
    async fn dead_letter_many_once<'a>(
        &self,
        dlq: &str,
        copies: impl Iterator<Item = (&'a crate::message::Envelope, Option<&'a BasicProperties>)>,
    ) -> Vec<Result<()>> {
        let target = Target::Queue(dlq.to_owned());
        let source = dlq.strip_suffix(wire::DEAD_LETTER_SUFFIX).unwrap_or(dlq);
        let key = self.dead_letter_key(source).await;
        let mut started = Vec::new();
        for (copy, raw) in copies {
            let properties = match raw {
                Some(p) => Ok(p.clone()),
                None => wire::properties(copy, self.clock.now(), self.next_sequence_number()),
            }
            .map(|p| match &key {
                Some(key) => key.seal(source, p),
                None => super::seal::unsealed(p),
            });
            let confirm = match properties {
                Ok(properties) => self.internal.start(&self.conn, &target, properties, &copy.body).await,
                Err(e) => Err(e),
            };
            started.push(confirm);
        }
        let mut out = Vec::with_capacity(started.len());
        for confirm in started {
            out.push(match confirm {
                Ok(c) => finish(&target, c).await,
                Err(e) => Err(e),
            });
        }
        out
    }

    /// The key that seals the dead letters of `source` (`seal.rs`), if the transport has a
    /// schedule store to keep its secret; when the store cannot give it, the dead letters
    /// are published unsealed (never held back for it) and a warning says why.
    async fn dead_letter_key(&self, source: &str) -> Option<super::seal::DeadLetterKey> {
        let store = self.schedules.as_ref()?;
        match self.seal_keys.of(store, source, self.clock.now()).await {
            Ok(key) => Some(key),
            Err(e) => {
                tracing::warn!(queue = %source, error = %e,
                    "cannot read the queue's secret: its dead letters are moved unsealed, and the admin shows their \
                     record as unverified");
                None
            }
        }
    }

    /// [`Self::dead_letter_many_once`], and when the dead-letter queue is missing (deleted
    /// outside Courier), declares it again and publishes what it refused once more: a
    /// message is not held back, or retried until its delivery limit, for a queue that
    /// can be made.
    pub(crate) async fn dead_letter_many<'a>(
        &self,
        dlq: &str,
        copies: impl Iterator<Item = (&'a crate::message::Envelope, Option<&'a BasicProperties>)>,
    ) -> Vec<Result<()>> {
        let copies: Vec<_> = copies.collect();
        let mut out = self.dead_letter_many_once(dlq, copies.iter().copied()).await;
        let missing = |r: &Result<()>| matches!(r, Err(e) if matches!(e.kind(), ErrorKind::EntityNotFound { .. }));
        if !out.iter().any(missing) {
            return out;
        }
        if let Err(e) = self.restore_dead_letter_queue(dlq).await {
            tracing::error!(dead_letter_queue = %dlq, error = %e, "the dead-letter queue is missing and cannot be declared again");
            return out;
        }
        let again: Vec<usize> = (0..out.len()).filter(|&i| out.get(i).is_some_and(missing)).collect();
        let retried = self
            .dead_letter_many_once(dlq, again.iter().filter_map(|&i| copies.get(i).copied()))
            .await;
        for (i, r) in again.into_iter().zip(retried) {
            if let Some(slot) = out.get_mut(i) {
                *slot = r;
            }
        }
        out
    }
}
