//! Sessions on RabbitMQ (S4): a session queue is a set of partition queues, and a
//! process's *hub* of each session queue it accepts sessions of.
//!
//! A session queue `orders` is [`SESSION_PARTITIONS`] quorum queues
//! `orders::session-<i>-of-<n>` with `x-single-active-consumer`, dead-lettering into
//! `orders::dlq`; there is no queue named `orders`. A send picks the partition with
//! [`partition_of`](super::session_names::partition_of) (FNV-1a of the session id, modulo
//! the count; the names are `session_names.rs`), so every message of a session is in one
//! partition, in send order. RabbitMQ lets one consumer at a time take a
//! partition's messages (single active consumer) and hands the partition to a waiting
//! consumer when the active one's channel or process goes away.
//!
//! A [`Hub`] consumes every partition of its queue, one consumer each (RabbitMQ makes it
//! active or lets it wait), and sorts the deliveries into per-session lists, in arrival
//! order. A session receiver (`session_receiver.rs`) holds a session's *lease* (the
//! session lock, by the transport's clock) against the process's other receivers and
//! takes the session's messages from the front of its list. Nothing is returned to
//! RabbitMQ while the process holds the partition: an abandoned message, or those of a
//! lease that expired or was released, go back to the front of the session's list (their
//! delivery count one higher), so the order of a session never depends on how RabbitMQ
//! requeues. When a partition's channel closes, its deliveries are forgotten here
//! (RabbitMQ requeues them, in order) and the hub consumes the partition again.
//!
//! Several processes share the partitions: a hub that is the active consumer of more than
//! its fair share *drains* the excess (no session of such a partition is leased anew;
//! once none is leased, the hub stops consuming it, and consumes it again behind the
//! other processes' waiting consumers, to which RabbitMQ hands it), so that a process
//! started after another gets partitions of its own (`session_balance.rs`). A hub idle for
//! [`HUB_IDLE`] (no session leased, no `accept_session` waiting) stops, so its partitions
//! go to the other processes; the next `accept_session` starts one again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::types::FieldTable;
use lapin::{Acker, Channel};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::entity::{EntityPath, QueueOptions, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{ReceivedMessage, reasons};
use crate::transport::{SessionReceiver, SessionSelector};

use super::conn::Declaration;
use super::session_partitions::{dead_copy, move_to_dead_letters, run_partition};
use super::session_receiver::AmqpSessionReceiver;
use super::{Inner, wire};

/// How many partition queues a session queue has. It is part of the partition queues'
/// names, so a Courier that counts differently never sends into, or reads from, the
/// partitions of another count (docs/rabbitmq.md, "Sessions").
pub(crate) const SESSION_PARTITIONS: u16 = 16;

/// The prefetch of a partition's consumer: the messages a process holds of a partition,
/// sorted into its sessions, at most.
pub(crate) const PARTITION_PREFETCH: u16 = 32;

/// How long a hub stays without a leased session or an `accept_session` before it stops
/// (`Inner::stop_idle_hub`).
pub(crate) const HUB_IDLE: Duration = Duration::from_secs(10);

/// How long the sessions of a partition a hub just became the active consumer of wait
/// before they are handed out: RabbitMQ makes a waiting consumer active as the previous
/// one goes, and can deliver the previous holder's returns after the first messages that
/// follow them; waiting lets them arrive and go first (`Hub::arrive`).
pub(crate) const HANDOVER_GRACE: Duration = Duration::from_millis(300);

/// The `x-delivery-limit` of a partition queue: how often RabbitMQ lets a message go back
/// to its partition before it dead-letters it. A partition goes back to RabbitMQ only when
/// a process that holds it stops, loses its connection, or hands the partition on, and then
/// with every message the process held, handed out or not; a hub counts the deliveries it
/// hands to a receiver itself (`Hub::arrive`), so this limit is only the backstop that ends
/// a crash loop (a message whose handling kills its process).
pub(crate) const PARTITION_RETURN_LIMIT: i64 = 100;

/// Where the arrival orders of first deliveries start: those of redeliveries are below.
const FIRST_DELIVERIES: u64 = 1 << 48;

/// How long a hub waits before it consumes a partition again after its channel closed.
pub(crate) const RECONSUME_AFTER: Duration = Duration::from_secs(1);

pub(crate) use super::session_names::{is_partition_queue, partition_queue, partition_queues, queue_for};

/// The arguments that make a partition queue: those of a Courier queue (quorum,
/// at-least-once dead-lettering) into the session queue's dead-letter queue, a single
/// active consumer, and [`PARTITION_RETURN_LIMIT`] as delivery limit (the queue's max
/// delivery count is kept by the hub).
pub(crate) fn partition_arguments(queue: &str, options: &QueueOptions) -> FieldTable {
    let mut args = super::conn::queue_arguments_into(&wire::dead_letter_queue(queue), options);
    args.insert(
        "x-delivery-limit".into(),
        lapin::types::AMQPValue::LongLongInt(PARTITION_RETURN_LIMIT),
    );
    args.insert(
        "x-single-active-consumer".into(),
        lapin::types::AMQPValue::Boolean(true),
    );
    args
}

/// The session queue `path` names, if it is the main sub-queue of a plain queue.
pub(crate) fn session_queue_of(path: &EntityPath) -> Option<&str> {
    (path.topic().is_none() && path.sub_queue() == SubQueue::Main).then(|| path.name())
}

impl Inner {
    /// The options of `queue` when this transport declared it as a session queue.
    fn declared_session_queue(&self, queue: &str) -> Option<QueueOptions> {
        self.conn.declared().into_iter().find_map(|d| match d {
            Declaration::Queue { name, options } if name == queue && options.requires_session => Some(options),
            _ => None,
        })
    }

    /// Whether `queue` is known, without I/O, to be a session queue (this transport
    /// declared it).
    pub(crate) fn known_session_queue(&self, queue: &str) -> bool {
        self.declared_session_queue(queue).is_some()
    }

    /// Whether `name` is known, without asking RabbitMQ, to be a session queue (declared
    /// so through this transport, or recorded so in the schedule store).
    pub(crate) async fn is_known_session_queue(&self, name: &str) -> bool {
        self.known_kind(name).await == Some(super::Kind::SessionQueue)
    }

    /// Whether `queue` is a session queue: declared so by this transport, recorded so in
    /// the schedule store, or its first partition exists on RabbitMQ (a passive declare).
    pub(crate) async fn is_session_queue(&self, queue: &str) -> Result<bool> {
        if self.is_known_session_queue(queue).await {
            return Ok(true);
        }
        Ok(self
            .queue_exists(&partition_queue(queue, 0, SESSION_PARTITIONS))
            .await?
            .is_some())
    }

    /// The hub of the session queue `queue`, started on first use, counting the caller
    /// among those accepting a session until the guard goes.
    fn hub(self: &Arc<Self>, queue: &str) -> Accepting {
        let mut hubs = self
            .sessions
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(h) = hubs.get(queue) {
            return Accepting::new(h.clone());
        }
        let options = self.declared_session_queue(queue).unwrap_or_default();
        let hub = Arc::new(Hub {
            queue: queue.to_owned(),
            dead_letter_queue: wire::dead_letter_queue(queue),
            lock_duration: options.lock_duration,
            max_delivery_count: options.max_delivery_count,
            state: Mutex::default(),
            changed: Notify::new(),
            stop: self.stop.child_token(),
            accepting: std::sync::atomic::AtomicUsize::new(0),
            last_used: Mutex::new(std::time::Instant::now()),
        });
        for index in 0..SESSION_PARTITIONS {
            tokio::spawn(run_partition(self.clone(), hub.clone(), index));
        }
        tokio::spawn(super::session_balance::balance(self.clone(), hub.clone()));
        hubs.insert(queue.to_owned(), hub.clone());
        Accepting::new(hub)
    }

    /// Stops `hub` if nobody has used it for [`HUB_IDLE`]: no session leased, no
    /// `accept_session` waiting. Its partitions go to the other processes' waiting
    /// consumers at once (an endpoint that stopped while its transport stays open would
    /// otherwise keep them, and the messages RabbitMQ delivered it, from the others). The
    /// next `accept_session` starts a hub again. Returns whether it stopped.
    pub(crate) fn stop_idle_hub(&self, hub: &Arc<Hub>) -> bool {
        let now = self.clock.now();
        let mut hubs = self
            .sessions
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = hub.accepting.load(std::sync::atomic::Ordering::SeqCst) == 0
            && !hub.lock().any_leased(now)
            && hub.last_used.lock().is_ok_and(|t| t.elapsed() >= HUB_IDLE);
        if !idle || !hubs.get(&hub.queue).is_some_and(|h| Arc::ptr_eq(h, hub)) {
            return false;
        }
        hubs.remove(&hub.queue);
        hub.stop.cancel();
        true
    }

    /// Stops the hub of `queue` (the queue is deleted).
    pub(crate) fn stop_hub(&self, queue: &str) {
        let hub = self
            .sessions
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(queue);
        if let Some(h) = hub {
            h.stop.cancel();
        }
    }

    /// Accepts a session of the session queue `queue` (S4), waiting up to `max_wait`.
    pub(crate) async fn accept_session(
        self: &Arc<Self>,
        path: &EntityPath,
        queue: &str,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>> {
        let accepting = self.hub(queue);
        let hub = &accepting.0;
        let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
        loop {
            let changed = hub.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = self.clock.now();
            let taken = {
                let mut state = hub.lock();
                let id = match &session {
                    SessionSelector::Named(id) => Some(id.clone()),
                    SessionSelector::Next => state.next_free(now),
                };
                id.and_then(|id| {
                    let doomed = state.reclaim_expired(&id, now, hub.max_delivery_count);
                    hub.dead_letter_later(self, doomed);
                    state.lease(&id, now, hub.lock_duration)
                })
            };
            if let Some((id, lease, until)) = taken {
                return Ok(Arc::new(AmqpSessionReceiver::new(
                    self.clone(),
                    hub.clone(),
                    path.clone(),
                    id,
                    lease,
                    until,
                )));
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                let reason = match &session {
                    SessionSelector::Named(id) => format!("session {id} of {queue} is held by another receiver"),
                    SessionSelector::Next => format!("no session of {queue} with messages is free"),
                };
                return Err(Error::new(ErrorKind::SessionNotAvailable { reason }));
            }
            self.conn.check_open()?;
        }
    }
}

/// A hub with one more `accept_session` counted on it, until dropped.
struct Accepting(Arc<Hub>);

impl Accepting {
    fn new(hub: Arc<Hub>) -> Self {
        hub.accepting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        hub.touch();
        Self(hub)
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.0.touch();
        self.0.accepting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The hubs of a transport, by session queue.
#[derive(Default)]
pub(crate) struct Hubs(Mutex<HashMap<String, Arc<Hub>>>);

/// A delivery of a partition, not settled with RabbitMQ yet.
pub(crate) struct Held {
    /// Arrival order in the hub: the order of the session's messages.
    pub(crate) order: u64,
    pub(crate) partition: u16,
    pub(crate) acker: Acker,
    pub(crate) channel: Channel,
    pub(crate) message: ReceivedMessage,
}

/// Who holds a session: a lease number and until when (the transport's clock).
#[derive(Debug, Clone, Copy)]
struct Lease {
    id: u64,
    until: DateTime<Utc>,
}

#[derive(Default)]
struct Session {
    /// The partition its messages come from (`None` until one arrived).
    partition: Option<u16>,
    /// Not handed out, in order.
    ready: VecDeque<Held>,
    /// Handed out to the lease holder and not settled, by order.
    out: BTreeMap<u64, Held>,
    lease: Option<Lease>,
}

impl Session {
    fn is_idle(&self) -> bool {
        self.ready.is_empty() && self.out.is_empty() && self.lease.is_none()
    }

    /// Puts handed-out deliveries back in front, in order, their delivery count one
    /// higher; returns those whose count reached `max_delivery_count` (to dead-letter).
    fn give_back(&mut self, helds: Vec<Held>, max_delivery_count: u32) -> Vec<Held> {
        let mut doomed = Vec::new();
        let mut all: Vec<Held> = self.ready.drain(..).collect();
        for mut h in helds {
            if h.message.broker.delivery_count >= max_delivery_count {
                doomed.push(h);
                continue;
            }
            h.message.broker.delivery_count = h.message.broker.delivery_count.saturating_add(1);
            h.message.broker.lock_token = None;
            h.message.broker.locked_until = None;
            all.push(h);
        }
        all.sort_by_key(|h| h.order);
        self.ready = all.into();
        doomed
    }
}

/// What a hub knows of one of its partitions.
#[derive(Default, Clone, Copy)]
pub(crate) struct Partition {
    /// A delivery came since the hub last consumed it: the hub is its active consumer.
    pub(crate) active: bool,
    /// The hub gives it up: no session of it is leased anew, and once none is leased the
    /// hub stops consuming it (`session_balance.rs`).
    pub(crate) draining: bool,
    /// When the hub became its active consumer (its first delivery since consuming it).
    pub(crate) active_since: Option<std::time::Instant>,
}

impl Partition {
    /// Whether the hub became its active consumer less than [`HANDOVER_GRACE`] ago.
    fn in_grace(&self) -> bool {
        self.active_since.is_some_and(|t| t.elapsed() < HANDOVER_GRACE)
    }
}

#[derive(Default)]
pub(crate) struct State {
    sessions: HashMap<String, Session>,
    pub(crate) partitions: [Partition; SESSION_PARTITIONS as usize],
    /// Orders of first deliveries ([`FIRST_DELIVERIES`] and up) and of redeliveries
    /// (below it): a session's redeliveries go first.
    next_order: u64,
    next_return: u64,
    next_lease: u64,
}

impl State {
    /// The free session (no lease, or an expired one) whose first message came first, if
    /// any has messages.
    fn next_free(&self, now: DateTime<Utc>) -> Option<String> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.lease.is_none_or(|l| l.until <= now))
            .filter(|(_, s)| {
                !s.partition
                    .is_some_and(|p| self.partition(p).draining || self.partition(p).in_grace())
            })
            .filter_map(|(id, s)| {
                let first_out = s.out.keys().next().copied();
                let first_ready = s.ready.front().map(|h| h.order);
                first_out.into_iter().chain(first_ready).min().map(|order| (order, id))
            })
            .min()
            .map(|(_, id)| id.clone())
    }

    /// What the hub knows of partition `index`.
    pub(crate) fn partition(&self, index: u16) -> Partition {
        self.partitions.get(usize::from(index)).copied().unwrap_or_default()
    }

    pub(crate) fn partition_mut(&mut self, index: u16) -> Option<&mut Partition> {
        self.partitions.get_mut(usize::from(index))
    }

    /// How many deliveries the hub holds of each partition (ready or handed out).
    pub(crate) fn held(&self) -> [usize; SESSION_PARTITIONS as usize] {
        let mut held = [0; SESSION_PARTITIONS as usize];
        for s in self.sessions.values() {
            if let Some(n) = s.partition.and_then(|p| held.get_mut(usize::from(p))) {
                *n += s.ready.len() + s.out.len();
            }
        }
        held
    }

    /// Whether a session is leased at `now`.
    fn any_leased(&self, now: DateTime<Utc>) -> bool {
        self.sessions.values().any(|s| s.lease.is_some_and(|l| l.until > now))
    }

    /// Whether partition `index` is draining and none of its sessions is leased any more:
    /// the hub may stop consuming it.
    fn drained(&self, index: u16, now: DateTime<Utc>) -> bool {
        self.partition(index).draining
            && !self
                .sessions
                .values()
                .any(|s| s.partition == Some(index) && (!s.out.is_empty() || s.lease.is_some_and(|l| l.until > now)))
    }

    /// Ends the lease of `id` if it expired: what was handed out goes back. Returns what
    /// reached the max delivery count.
    fn reclaim_expired(&mut self, id: &str, now: DateTime<Utc>, max_delivery_count: u32) -> Vec<Held> {
        let Some(s) = self.sessions.get_mut(id) else {
            return Vec::new();
        };
        match s.lease {
            Some(l) if l.until <= now => {
                s.lease = None;
                let out = std::mem::take(&mut s.out).into_values().collect();
                s.give_back(out, max_delivery_count)
            }
            _ => Vec::new(),
        }
    }

    /// Leases `id` unless a live lease holds it: (id, lease, until).
    fn lease(&mut self, id: &str, now: DateTime<Utc>, duration: Duration) -> Option<(String, u64, DateTime<Utc>)> {
        let session = self.sessions.entry(id.to_owned()).or_default();
        if session.lease.is_some() {
            return None;
        }
        self.next_lease += 1;
        let until = now + chrono::Duration::from_std(duration).unwrap_or(chrono::Duration::MAX);
        session.lease = Some(Lease {
            id: self.next_lease,
            until,
        });
        Some((id.to_owned(), self.next_lease, until))
    }
}

/// A process's view of one session queue: its partitions' deliveries by session.
pub(crate) struct Hub {
    pub(crate) queue: String,
    pub(crate) dead_letter_queue: String,
    pub(crate) lock_duration: Duration,
    pub(crate) max_delivery_count: u32,
    state: Mutex<State>,
    /// Told on every change: a delivery arrived, a session was freed.
    pub(crate) changed: Notify,
    pub(crate) stop: CancellationToken,
    /// `accept_session` calls on it now.
    accepting: std::sync::atomic::AtomicUsize,
    /// When a session was last accepted, released or asked for.
    last_used: Mutex<std::time::Instant>,
}

impl Hub {
    fn touch(&self) {
        if let Ok(mut t) = self.last_used.lock() {
            *t = std::time::Instant::now();
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks that `lease` still holds `session` at `now`; an expired lease is ended and
    /// its deliveries go back (dead-lettered past the max delivery count).
    fn check_lease(
        &self,
        inner: &Arc<Inner>,
        state: &mut State,
        session: &str,
        lease: u64,
        now: DateTime<Utc>,
    ) -> bool {
        let ok = state
            .sessions
            .get(session)
            .and_then(|s| s.lease)
            .is_some_and(|l| l.id == lease && l.until > now);
        if !ok {
            let still_ours = state
                .sessions
                .get(session)
                .and_then(|s| s.lease)
                .is_some_and(|l| l.id == lease);
            if still_ours {
                let doomed = state.reclaim_expired(session, now, self.max_delivery_count);
                self.dead_letter_later(inner, doomed);
                self.changed.notify_waiters();
            }
        }
        ok
    }

    /// Hands out up to `max` of the session's messages to the holder of `lease`, each
    /// with a fresh lock token and the lease's end, with their arrival order: `None`
    /// when the lease is gone (expired, or released).
    pub(crate) fn take(
        &self,
        inner: &Arc<Inner>,
        session: &str,
        lease: u64,
        max: usize,
    ) -> Option<Vec<(u64, ReceivedMessage)>> {
        let now = inner.clock.now();
        let mut state = self.lock();
        if !self.check_lease(inner, &mut state, session, lease, now) {
            return None;
        }
        let s = state.sessions.get_mut(session)?;
        let until = s.lease.map(|l| l.until);
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut h) = s.ready.pop_front() else { break };
            h.message.broker.lock_token = Some(crate::message::LockToken::from_uuid(Uuid::new_v4()));
            h.message.broker.locked_until = until;
            out.push((h.order, h.message.clone()));
            s.out.insert(h.order, h);
        }
        Some(out)
    }

    /// Takes the handed-out delivery `order` for settling, if `lease` still holds the
    /// session and it is still handed out.
    pub(crate) fn settle_out(&self, inner: &Arc<Inner>, session: &str, lease: u64, order: u64) -> Option<Held> {
        let now = inner.clock.now();
        let mut state = self.lock();
        if !self.check_lease(inner, &mut state, session, lease, now) {
            return None;
        }
        state.sessions.get_mut(session).and_then(|s| s.out.remove(&order))
    }

    /// The handed-out message `order` of `session` as it is now.
    pub(crate) fn peek_out(&self, session: &str, order: u64) -> Option<ReceivedMessage> {
        let state = self.lock();
        state.sessions.get(session)?.out.get(&order).map(|h| h.message.clone())
    }

    /// Puts a delivery taken by [`Hub::settle_out`] back as handed out (its settlement
    /// failed before it took effect).
    pub(crate) fn restore_out(&self, session: &str, held: Held) {
        let mut state = self.lock();
        if let Some(s) = state.sessions.get_mut(session) {
            s.out.insert(held.order, held);
        }
    }

    /// Gives the handed-out delivery `order` back to the front of its session (abandon,
    /// or a delivery dropped unsettled); `false` when the lease no longer holds it.
    pub(crate) fn give_back(&self, inner: &Arc<Inner>, session: &str, lease: u64, order: u64) -> bool {
        let now = inner.clock.now();
        let mut state = self.lock();
        if !self.check_lease(inner, &mut state, session, lease, now) {
            return false;
        }
        let Some(s) = state.sessions.get_mut(session) else {
            return false;
        };
        let Some(h) = s.out.remove(&order) else {
            return false;
        };
        let doomed = s.give_back(vec![h], self.max_delivery_count);
        drop(state);
        self.dead_letter_later(inner, doomed);
        self.changed.notify_waiters();
        true
    }

    /// Renews `lease` from `now`: its new end, or `None` when it is gone.
    pub(crate) fn renew(&self, inner: &Arc<Inner>, session: &str, lease: u64) -> Option<DateTime<Utc>> {
        let now = inner.clock.now();
        let mut state = self.lock();
        if !self.check_lease(inner, &mut state, session, lease, now) {
            return None;
        }
        let s = state.sessions.get_mut(session)?;
        let until = now + chrono::Duration::from_std(self.lock_duration).unwrap_or(chrono::Duration::MAX);
        s.lease = Some(Lease { id: lease, until });
        for h in s.out.values_mut() {
            h.message.broker.locked_until = Some(until);
        }
        Some(until)
    }

    /// Ends `lease`: what it had out goes back to the front of the session.
    pub(crate) fn release(&self, inner: &Arc<Inner>, session: &str, lease: u64) {
        self.touch();
        let mut state = self.lock();
        let Some(s) = state.sessions.get_mut(session) else {
            return;
        };
        if s.lease.is_none_or(|l| l.id != lease) {
            return;
        }
        s.lease = None;
        let out = std::mem::take(&mut s.out).into_values().collect();
        let doomed = s.give_back(out, self.max_delivery_count);
        if s.is_idle() {
            state.sessions.remove(session);
        }
        drop(state);
        self.dead_letter_later(inner, doomed);
        self.changed.notify_waiters();
    }

    /// Sorts a delivery of partition `index` into its session.
    ///
    /// A redelivery (a message RabbitMQ delivered before, to this process or another)
    /// goes before the session's messages delivered for the first time: RabbitMQ delivers
    /// a partition in order, so a message never delivered is behind every one that was,
    /// and a hand-over can bring the previous holder's returns after the first new ones.
    /// For the same reason the sessions of a partition this hub just became active on
    /// are not handed out for [`HANDOVER_GRACE`].
    ///
    /// Its delivery count starts again at 1: RabbitMQ's count also counts each time a
    /// process held the message without handing it out (every message of the prefetch
    /// goes back when a process dies, loses its connection or hands the partition on), so
    /// a message behind a few faults would reach the max delivery count without a handler
    /// ever failing it. The hub counts the deliveries it hands out ([`Session::give_back`]);
    /// a crash loop ends at the partition's [`PARTITION_RETURN_LIMIT`].
    pub(crate) fn arrive(
        self: &Arc<Self>,
        index: u16,
        channel: &Channel,
        acker: Acker,
        mut message: ReceivedMessage,
        session: String,
    ) {
        let returned = message.broker.delivery_count > 1;
        message.broker.delivery_count = 1;
        let mut state = self.lock();
        let order = if returned {
            state.next_return += 1;
            state.next_return
        } else {
            state.next_order += 1;
            FIRST_DELIVERIES.saturating_add(state.next_order)
        };
        let mut activated = false;
        if let Some(p) = state.partition_mut(index)
            && !p.active
        {
            p.active = true;
            p.active_since = Some(std::time::Instant::now());
            activated = true;
        }
        let s = state.sessions.entry(session).or_default();
        s.partition = Some(index);
        let at = s.ready.partition_point(|h| h.order < order);
        s.ready.insert(
            at,
            Held {
                order,
                partition: index,
                acker,
                channel: channel.clone(),
                message,
            },
        );
        drop(state);
        self.changed.notify_waiters();
        if activated {
            // Those waiting for a session hear when the grace is over.
            let hub = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HANDOVER_GRACE).await;
                hub.changed.notify_waiters();
            });
        }
    }

    /// Forgets the deliveries of partition `index` (its channel closed: RabbitMQ requeues
    /// them); their holders' settlements fail with a lost lock.
    pub(crate) fn forget_partition(&self, index: u16) {
        let mut state = self.lock();
        for s in state.sessions.values_mut() {
            s.ready.retain(|h| h.partition != index);
            s.out.retain(|_, h| h.partition != index);
        }
        state.sessions.retain(|_, s| !s.is_idle());
        if let Some(p) = state.partition_mut(index) {
            *p = Partition::default();
        }
    }

    /// Waits until partition `index` is drained (never, unless the hub drains it).
    pub(crate) async fn until_drained(&self, inner: &Inner, index: u16) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.lock().drained(index, inner.clock.now()) {
                return;
            }
            // A lease that expires unrenewed changes nothing the hub is told of.
            let _ = tokio::time::timeout(self.lock_duration.max(Duration::from_millis(100)), changed).await;
        }
    }

    /// Moves deliveries that reached the max delivery count to the dead-letter queue, on a
    /// task of their own.
    fn dead_letter_later(&self, inner: &Arc<Inner>, doomed: Vec<Held>) {
        if doomed.is_empty() {
            return;
        }
        let (inner, dlq, source) = (inner.clone(), self.dead_letter_queue.clone(), self.queue.clone());
        tokio::spawn(async move {
            for h in doomed {
                let description = format!(
                    "the message was delivered {} times without being completed",
                    h.message.broker.delivery_count
                );
                let copy = dead_copy(
                    &h.message.envelope,
                    reasons::MAX_DELIVERY_COUNT_EXCEEDED,
                    &description,
                    &source,
                );
                let route = (source.as_str(), dlq.as_str(), reasons::MAX_DELIVERY_COUNT_EXCEEDED);
                move_to_dead_letters(&inner, route, h.acker, &copy, None).await;
            }
        });
    }
}
