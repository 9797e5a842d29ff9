//! The embedded broker: queues, topics and sessions in SQLite, in this process.
//!
//! Durable in a file ([`Embedded::open`]) or in memory for tests ([`Embedded::in_memory`]).
//! One engine task owns the database connection and serves every call; calls that arrive
//! together share one transaction (group commit). See `engine/` for how; a sender and its
//! checks are in `sender.rs`.
//!
//! # Durability
//!
//! A send returns once its transaction has committed. With the default
//! [`Durability::Normal`] (SQLite WAL mode, `synchronous=NORMAL`) a committed message
//! survives the process being killed at any point; an operating-system crash or power
//! loss may lose the last transactions. [`Durability::Full`] (`synchronous=FULL`) also
//! survives those, at a cost in throughput.
//!
//! One broker at a time opens a file (it holds the lock file `<file>.lock`); a second
//! gets [`ErrorKind::Storage`] saying it is in use. Locks are volatile
//! (S2.7): when a broker opens a file, every message lock left by a previous process is
//! released at once and those messages are delivered again (their delivery count kept).
//!
//! # The application's tables
//!
//! With [`Embedded::store`] the application keeps its own tables in the broker's file and
//! writes them in handlers, in the transaction of the message. Its migrations are applied
//! when the broker opens ([`EmbeddedBuilder::migrations`]); [`Embedded::read_pool`] reads
//! them from outside handlers without taking the engine's single write connection.

mod admin;
mod engine;
mod open;
mod reads;
mod sender;
mod store;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

pub(crate) use self::admin::Moved;
use self::engine::{
    AcceptRequest, Command, EntityInfo, Kind, LockRef, ReceiveMode, ReceiveRequest, SessionKey, SessionOp,
};
pub use self::open::EmbeddedBuilder;
pub use self::reads::DEFAULT_READ_CONNECTIONS;
use self::sender::EmbeddedSender;
pub use self::store::EmbeddedStore;
pub(crate) use crate::checks::DEFAULT_MAX_MESSAGE_SIZE;
pub(crate) use crate::checks::check_envelope;
use crate::clock::Clock;
use crate::entity::{EntityCounts, EntityPath, QueueOptions, SubQueue, SubscriptionOptions, TopicOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, LockToken, ReceivedMessage, SequenceNumber};
use crate::transport::{
    Capabilities, Delivery, Receiver, Sender, SenderOptions, SessionReceiver, SessionSelector, Settlement, Settler,
    Transport,
};

/// How hard a commit tries to reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// WAL with `synchronous=NORMAL`: survives a killed process, not a power loss. Default.
    #[default]
    Normal,
    /// WAL with `synchronous=FULL`: also survives an operating-system crash or power loss.
    Full,
}

struct Shared {
    tx: mpsc::Sender<Command>,
    clock: Arc<dyn Clock>,
    epoch: u32,
    max_message_size: usize,
    closed: AtomicBool,
    /// Query-only connections to the same database ([`Embedded::read_pool`]).
    read_pool: sqlx::SqlitePool,
}

impl Shared {
    /// Sends the command `make` builds; returns where its answer will come.
    async fn request<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<oneshot::Receiver<Result<T>>> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(ErrorKind::Closed));
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(make(reply))
            .await
            .map_err(|_| Error::new(ErrorKind::Closed))?;
        Ok(rx)
    }

    async fn call<T>(&self, make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command) -> Result<T> {
        self.request(make)
            .await?
            .await
            .map_err(|_| Error::new(ErrorKind::Closed))?
    }

    /// As [`call`](Self::call), for a command that locks messages for the caller: if the
    /// caller goes away (its future is dropped) after the engine answered, the locks it
    /// would have received are given back at once instead of waiting to expire.
    async fn call_locking(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<Vec<ReceivedMessage>>>) -> Command,
    ) -> Result<Vec<ReceivedMessage>> {
        // No await between the command's send and the guard: a drop lands before the
        // send (nothing sent) or on the guard.
        let rx = self.request(make).await?;
        let mut waiting = Unanswered {
            rx: Some(rx),
            shared: self,
        };
        let answer = match waiting.rx.as_mut() {
            Some(rx) => rx.await,
            None => return Err(Error::new(ErrorKind::Closed)),
        };
        waiting.rx = None;
        answer.map_err(|_| Error::new(ErrorKind::Closed))?
    }

    /// Gives back the locks of `messages`, which no caller will settle; without waiting.
    fn release(&self, messages: &[ReceivedMessage]) {
        let locks: Vec<(i64, i64)> = messages
            .iter()
            .filter_map(|m| m.broker.lock_token)
            .filter_map(|t| engine::read_token(self.epoch, t))
            .map(|(_, id, delivery_count)| (id, delivery_count))
            .collect();
        if locks.is_empty() {
            return;
        }
        match self.tx.try_send(Command::Release { locks }) {
            Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(cmd)) => {
                // Where there is no runtime to wait for room, the locks expire as any do.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    let tx = self.tx.clone();
                    runtime.spawn(async move {
                        let _ = tx.send(cmd).await;
                    });
                }
            }
        }
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) || self.tx.is_closed() {
            Err(Error::new(ErrorKind::Closed))
        } else {
            Ok(())
        }
    }
}

/// The answer to a locking command, while it is awaited. Dropped before it was read (the
/// caller's future was dropped), it keeps the engine from sending it, or gives back the
/// locks of an answer already sent: a cancelled receive leaves nothing locked until its
/// lock expires and counts no delivery.
struct Unanswered<'a> {
    rx: Option<oneshot::Receiver<Result<Vec<ReceivedMessage>>>>,
    shared: &'a Shared,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            // After `close` the engine cannot send any more: it sees the receiver gone and
            // gives back what it locked itself. An answer sent before is read here.
            rx.close();
            if let Ok(Ok(messages)) = rx.try_recv() {
                self.shared.release(&messages);
            }
        }
    }
}

/// The embedded broker. Cloning gives another handle to the same broker.
///
/// Endpoints take it as their transport (`Endpoint::builder(..).transport(broker.clone())`)
/// and its own file as their store ([`Embedded::store`]). Underneath, it is the broker
/// contract ([`Transport`](crate::Transport)) called directly: a [`Sender`](crate::Sender)
/// sends and schedules, a [`Receiver`](crate::Receiver) receives in PeekLock mode, and each
/// [`Delivery`](crate::Delivery) is settled once (its settlements take it by value).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use courier::prelude::*;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), courier::Error> {
/// let broker = Embedded::in_memory().await?;             // Embedded::open(path): durable
/// broker.create_queue("billing", &QueueOptions::default()).await?; // lock 60 s, 10 deliveries
/// let sender = broker.sender("billing", SenderOptions::default()).await?;
/// sender.send(Envelope::new("hello").with_message_id("m-1")).await?; // returns once stored
///
/// let in_one_hour = chrono::Utc::now() + chrono::Duration::hours(1);
/// let seq = sender.schedule(Envelope::new("remind"), in_one_hour).await?;
/// sender.cancel_scheduled(seq).await?;                   // gone before it was due
///
/// let receiver = broker.receiver(&EntityPath::queue("billing")).await?;
/// for delivery in receiver.receive(10, Duration::from_secs(1)).await? {  // locked, not removed
///     if delivery.message().body().as_ref() == b"hello" {
///         delivery.complete().await?;                    // removed
///     } else {
///         delivery.dead_letter("unexpected", "not a greeting").await?;
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// In tests, a broker on a [`VirtualClock`](crate::VirtualClock) sees time move only when
/// the test moves it (see that type). `cargo run -p courier-examples --bin tour` walks
/// through sessions, deferral and dead letters as well.
#[derive(Clone)]
pub struct Embedded {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded").field("epoch", &self.shared.epoch).finish()
    }
}

impl Embedded {
    /// Opens (or creates) a durable broker in `path` with the system clock.
    ///
    /// # Errors
    /// As [`EmbeddedBuilder::open`].
    pub async fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::builder().path(path).open().await
    }

    /// A broker in memory with the system clock.
    ///
    /// # Errors
    /// As [`EmbeddedBuilder::open`].
    pub async fn in_memory() -> Result<Self> {
        Self::builder().in_memory().open().await
    }

    /// A builder for other settings.
    pub fn builder() -> EmbeddedBuilder {
        EmbeddedBuilder::default()
    }

    /// The broker's clock.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.shared.clock.clone()
    }

    async fn resolve(&self, path: &EntityPath, for_send: bool) -> Result<Arc<EntityInfo>> {
        path.validate()?;
        let path = path.clone();
        self.shared
            .call(|reply| Command::Resolve { path, for_send, reply })
            .await
    }

    async fn link(&self, path: &EntityPath, session: Option<SessionKey>) -> Result<Arc<Link>> {
        let info = self.resolve(path, false).await?;
        Ok(Arc::new(Link {
            shared: self.shared.clone(),
            entity: info.id,
            path: path.clone(),
            session,
        }))
    }
}

#[async_trait]
impl Transport for Embedded {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// The checks of every send (size, ids, time-to-live, schedule range), with this
    /// broker's `max_message_size`; a queue's session requirement is checked by the send.
    fn check_message(&self, message: &Envelope) -> Result<()> {
        check_envelope(
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
        let (name, options) = (name.to_owned(), options.clone());
        self.shared
            .call(|reply| Command::Create {
                kind: Kind::Queue,
                topic: None,
                name,
                options,
                reply,
            })
            .await
    }

    async fn create_topic(&self, name: &str, options: &TopicOptions) -> Result<()> {
        crate::entity::validate_name(name)?;
        let q = QueueOptions {
            default_time_to_live: options.default_time_to_live,
            ..QueueOptions::default()
        };
        q.validate()?;
        let name = name.to_owned();
        self.shared
            .call(|reply| Command::Create {
                kind: Kind::Topic,
                topic: None,
                name,
                options: q,
                reply,
            })
            .await
    }

    async fn create_subscription(&self, topic: &str, name: &str, options: &SubscriptionOptions) -> Result<()> {
        crate::entity::validate_name(topic)?;
        crate::entity::validate_name(name)?;
        options.validate()?;
        let (topic, name, options) = (topic.to_owned(), name.to_owned(), options.clone());
        self.shared
            .call(|reply| Command::Create {
                kind: Kind::Subscription,
                topic: Some(topic),
                name,
                options,
                reply,
            })
            .await
    }

    async fn delete(&self, path: &EntityPath) -> Result<()> {
        path.validate()?;
        let path = path.clone();
        self.shared.call(|reply| Command::Delete { path, reply }).await
    }

    async fn sender(&self, entity: &str, options: SenderOptions) -> Result<Arc<dyn Sender>> {
        options.validate()?;
        let info = self.resolve(&EntityPath::queue(entity), true).await?;
        Ok(Arc::new(EmbeddedSender {
            shared: self.shared.clone(),
            name: entity.to_owned(),
            requires_session: info.requires_session,
            entity: info.id,
            permits: Arc::new(Semaphore::new(options.max_in_flight)),
            max_in_flight: options.max_in_flight,
            allow_presettled: options.allow_presettled,
        }))
    }

    async fn receiver(&self, path: &EntityPath) -> Result<Arc<dyn Receiver>> {
        let link = self.link(path, None).await?;
        Ok(Arc::new(EmbeddedReceiver { link }))
    }

    async fn accept_session(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>> {
        if path.sub_queue() == SubQueue::DeadLetter {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: "dead-letter sub-queues have no sessions: use a plain receiver".into(),
            }));
        }
        let info = self.resolve(path, false).await?;
        let deadline = deadline(max_wait);
        let entity = info.id;
        let (id, generation, until) = self
            .shared
            .call(|reply| {
                Command::Accept(AcceptRequest {
                    entity,
                    selector: session,
                    deadline,
                    reply,
                })
            })
            .await?;
        let key = SessionKey { id, generation };
        Ok(Arc::new(EmbeddedSessionReceiver {
            link: Arc::new(Link {
                shared: self.shared.clone(),
                entity,
                path: path.clone(),
                session: Some(key),
            }),
            locked_until: Mutex::new(until),
        }))
    }

    async fn peek(
        &self,
        path: &EntityPath,
        from_sequence_number: SequenceNumber,
        max_count: usize,
    ) -> Result<Vec<ReceivedMessage>> {
        let info = self.resolve(path, false).await?;
        let sub_queue = path.sub_queue();
        self.shared
            .call(|reply| Command::Peek {
                entity: info.id,
                sub_queue,
                from: from_sequence_number,
                max: max_count,
                reply,
            })
            .await
    }

    async fn counts(&self, path: &EntityPath) -> Result<EntityCounts> {
        let info = self.resolve(path, false).await?;
        self.shared
            .call(|reply| Command::Counts { entity: info.id, reply })
            .await
    }

    async fn close(&self) {
        if self.shared.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let (reply, rx) = oneshot::channel();
        if self.shared.tx.send(Command::Close { reply }).await.is_ok() {
            let _ = rx.await;
        }
    }

    fn clock(&self) -> Option<Arc<dyn Clock>> {
        Some(self.shared.clock.clone())
    }

    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self)
    }
}

fn deadline(max_wait: Duration) -> Option<Instant> {
    if max_wait.is_zero() {
        None
    } else {
        Some(Instant::now() + max_wait.min(Duration::from_secs(24 * 3600)))
    }
}

/// What a receiver and its deliveries share: the entity and, for a session receiver, the
/// session lock.
struct Link {
    shared: Arc<Shared>,
    entity: i64,
    path: EntityPath,
    session: Option<SessionKey>,
}

impl Link {
    fn lock_ref(&self, token: Option<LockToken>) -> Result<LockRef> {
        let token = token.ok_or_else(|| {
            Error::new(ErrorKind::InvalidOperation {
                reason: "the message was not received in PeekLock mode".into(),
            })
        })?;
        let unknown = || {
            Error::new(ErrorKind::UnknownLockToken {
                token: token.to_string(),
            })
        };
        let (entity, id, delivery_count) = engine::read_token(self.shared.epoch, token).ok_or_else(unknown)?;
        if entity != self.entity {
            return Err(unknown());
        }
        Ok(LockRef {
            entity,
            sub_queue: self.path.sub_queue(),
            id,
            delivery_count,
            session: self.session.clone(),
        })
    }

    async fn settle_token(&self, token: Option<LockToken>, settlement: Settlement) -> Result<()> {
        let lock = self.lock_ref(token)?;
        self.shared
            .call(|reply| Command::Settle {
                lock,
                settlement,
                reply,
            })
            .await
    }

    async fn receive(
        self: &Arc<Self>,
        max: usize,
        max_wait: Duration,
        mode: ReceiveMode,
    ) -> Result<Vec<ReceivedMessage>> {
        let req = |reply| {
            Command::Receive(ReceiveRequest {
                entity: self.entity,
                sub_queue: self.path.sub_queue(),
                max,
                mode,
                session: self.session.clone(),
                deadline: deadline(max_wait),
                reply,
            })
        };
        match mode {
            ReceiveMode::PeekLock => self.shared.call_locking(req).await,
            // Received and deleted: nothing is locked, nothing to give back.
            ReceiveMode::ReceiveAndDelete => self.shared.call(req).await,
        }
    }

    fn deliveries(self: &Arc<Self>, messages: Vec<ReceivedMessage>) -> Vec<Delivery> {
        let settler: Arc<dyn Settler> = self.clone();
        messages
            .into_iter()
            .map(|m| Delivery::new(m, settler.clone()))
            .collect()
    }

    async fn receive_deferred(self: &Arc<Self>, seqs: &[SequenceNumber]) -> Result<Vec<Delivery>> {
        if self.path.sub_queue() == SubQueue::DeadLetter {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: "dead-letter sub-queues hold no deferred messages".into(),
            }));
        }
        let seqs = seqs.to_vec();
        let messages = self
            .shared
            .call_locking(|reply| Command::ReceiveDeferred {
                entity: self.entity,
                seqs,
                session: self.session.clone(),
                reply,
            })
            .await?;
        Ok(self.deliveries(messages))
    }
}

#[async_trait]
impl Settler for Link {
    async fn settle(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        self.settle_token(message.broker.lock_token, settlement).await
    }

    async fn renew(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>> {
        let lock = self.lock_ref(message.broker.lock_token)?;
        self.shared.call(|reply| Command::Renew { lock, reply }).await
    }
}

struct EmbeddedReceiver {
    link: Arc<Link>,
}

/// Plain and session receivers receive the same way, through their link.
macro_rules! receive_through_link {
    ($ty:ty) => {
        #[async_trait]
        impl Receiver for $ty {
            fn path(&self) -> &EntityPath {
                &self.link.path
            }

            async fn receive(&self, max_count: usize, max_wait: Duration) -> Result<Vec<Delivery>> {
                let messages = self
                    .link
                    .receive(max_count, max_wait, ReceiveMode::PeekLock)
                    .await?;
                Ok(self.link.deliveries(messages))
            }

            async fn receive_and_delete(&self, max_count: usize, max_wait: Duration) -> Result<Vec<ReceivedMessage>> {
                self.link
                    .receive(max_count, max_wait, ReceiveMode::ReceiveAndDelete)
                    .await
            }

            async fn receive_deferred(&self, sequence_numbers: &[SequenceNumber]) -> Result<Vec<Delivery>> {
                self.link.receive_deferred(sequence_numbers).await
            }

            async fn settle_by_token(&self, token: LockToken, settlement: Settlement) -> Result<()> {
                self.link.settle_token(Some(token), settlement).await
            }
        }
    };
}

receive_through_link!(EmbeddedReceiver);
receive_through_link!(EmbeddedSessionReceiver);

struct EmbeddedSessionReceiver {
    link: Arc<Link>,
    locked_until: Mutex<DateTime<Utc>>,
}

impl EmbeddedSessionReceiver {
    fn key(&self) -> SessionKey {
        // A session receiver always has a session key.
        self.link.session.clone().unwrap_or(SessionKey {
            id: String::new(),
            generation: -1,
        })
    }

    async fn session_call<T>(&self, op: impl FnOnce(oneshot::Sender<Result<T>>) -> SessionOp) -> Result<T> {
        let (entity, key) = (self.link.entity, self.key());
        self.link
            .shared
            .call(|reply| Command::Session {
                entity,
                key,
                op: op(reply),
            })
            .await
    }
}

impl Drop for EmbeddedSessionReceiver {
    fn drop(&mut self) {
        // Give the session back at once rather than when its lock expires.
        let _ = self.link.shared.tx.try_send(Command::Session {
            entity: self.link.entity,
            key: self.key(),
            op: SessionOp::Release(None),
        });
    }
}

#[async_trait]
impl SessionReceiver for EmbeddedSessionReceiver {
    fn session_id(&self) -> &str {
        self.link.session.as_ref().map_or("", |k| k.id.as_str())
    }

    fn session_locked_until(&self) -> DateTime<Utc> {
        *self.locked_until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn renew_session_lock(&self) -> Result<DateTime<Utc>> {
        let until = self.session_call(SessionOp::Renew).await?;
        *self.locked_until.lock().unwrap_or_else(PoisonError::into_inner) = until;
        Ok(until)
    }

    async fn session_state(&self) -> Result<Option<Bytes>> {
        self.session_call(SessionOp::GetState).await
    }

    async fn set_session_state(&self, state: Option<Bytes>) -> Result<()> {
        self.session_call(|reply| SessionOp::SetState(state, reply)).await
    }

    async fn release(&self) -> Result<()> {
        self.session_call(|reply| SessionOp::Release(Some(reply))).await
    }
}
