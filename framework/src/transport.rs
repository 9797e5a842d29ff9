//! The transport contract: the rules S1-S6 of docs/semantics.md as traits.
//!
//! A [`Transport`] makes [`Sender`]s and [`Receiver`]s. A receiver yields [`Delivery`]s;
//! settling a delivery consumes it ([`Delivery::complete`] takes `self`), so a message
//! cannot be settled twice. The traits are object-safe (`Arc<dyn Transport>`), so an
//! application picks its transport at run time. A push-style broker implements a receiver
//! over its consumer's buffered deliveries and a [`Settler`] over its acks.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};

use crate::clock::Clock;
use crate::entity::{EntityCounts, EntityPath, QueueOptions, SubscriptionOptions, TopicOptions};
use crate::error::{Error, ErrorKind, Result};
use crate::logtext::Escaped;
use crate::message::{Envelope, LockToken, Properties, ReceivedMessage, SequenceNumber};

/// A rule of docs/semantics.md that a transport cannot honour, with the reason and what it
/// does instead. The conformance suite reports these and checks that the transport
/// refuses the operation with [`ErrorKind::Unsupported`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BentRule {
    /// The rule, as `S2.3`.
    pub rule: &'static str,
    /// Why the transport cannot honour it.
    pub reason: &'static str,
    /// What the transport offers instead.
    pub substitute: &'static str,
}

/// What a transport honours of the contract.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// The rules it bends; empty means it honours every rule.
    pub bent_rules: Vec<BentRule>,
}

impl Capabilities {
    /// The declaration for `rule`, if the transport bends it.
    pub fn bends(&self, rule: &str) -> Option<&BentRule> {
        self.bent_rules.iter().find(|b| b.rule == rule)
    }
}

/// How a receiver gives up a locked message (S2.5).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Settlement {
    /// Processed: remove the message.
    Complete,
    /// Unlock now; the message goes back to the front. Properties given are merged in.
    Abandon {
        /// Properties to set on the message.
        properties: Properties,
    },
    /// Move the message to the dead-letter sub-queue.
    DeadLetter {
        /// Short machine-readable reason.
        reason: String,
        /// Human-readable detail.
        description: String,
        /// Properties to set on the message.
        properties: Properties,
    },
    /// Set the message aside; receive it later by sequence number.
    Defer {
        /// Properties to set on the message.
        properties: Properties,
    },
}

/// Settles and renews the locks a receiver handed out. Transports implement it; users
/// reach it through [`Delivery`].
#[async_trait]
pub trait Settler: Send + Sync + 'static {
    /// Settles the locked message.
    async fn settle(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()>;
    /// Renews the lock; returns the new locked-until time.
    async fn renew(&self, message: &ReceivedMessage) -> Result<DateTime<Utc>>;
}

/// A message received in PeekLock mode, locked for this receiver until it is settled or
/// the lock expires (S2.2).
///
/// Dropping a delivery without settling it lets the lock expire (S2.5: same effect as
/// abandon, later).
pub struct Delivery {
    message: ReceivedMessage,
    settler: Arc<dyn Settler>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery").field("message", &self.message).finish()
    }
}

impl Delivery {
    /// A delivery of `message`, settled through `settler` (for transport implementers).
    pub fn new(message: ReceivedMessage, settler: Arc<dyn Settler>) -> Self {
        Self { message, settler }
    }

    /// The message.
    pub fn message(&self) -> &ReceivedMessage {
        &self.message
    }

    /// The message, to change before it is handled (an endpoint gives a message that
    /// arrived without an id a fresh one).
    pub(crate) fn message_mut(&mut self) -> &mut ReceivedMessage {
        &mut self.message
    }

    /// The message, giving up the ability to settle it here.
    pub fn into_message(self) -> ReceivedMessage {
        self.message
    }

    /// The lock token.
    pub fn lock_token(&self) -> Option<LockToken> {
        self.message.broker.lock_token
    }

    /// Until when the lock is held (as of the last receive or renewal).
    pub fn locked_until(&self) -> Option<DateTime<Utc>> {
        self.message.broker.locked_until
    }

    /// Completes the message: it is removed (S2.5).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock expired: the message will be delivered again.
    pub async fn complete(self) -> Result<()> {
        self.settler.settle(&self.message, Settlement::Complete).await
    }

    /// Abandons the message: it is unlocked and goes back to the front (S2.5).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock had already expired.
    pub async fn abandon(self) -> Result<()> {
        self.abandon_with(Properties::new()).await
    }

    /// Abandons the message and sets these properties on it.
    ///
    /// # Errors
    /// As [`abandon`](Self::abandon).
    pub async fn abandon_with(self, properties: Properties) -> Result<()> {
        self.settler
            .settle(&self.message, Settlement::Abandon { properties })
            .await
    }

    /// Moves the message to the dead-letter sub-queue with a reason and a description
    /// that stay readable on the dead-lettered message (S2.5).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`]; [`ErrorKind::InvalidOperation`] for a message already in a
    /// dead-letter sub-queue.
    pub async fn dead_letter(self, reason: impl Into<String>, description: impl Into<String>) -> Result<()> {
        self.settler
            .settle(
                &self.message,
                Settlement::DeadLetter {
                    reason: reason.into(),
                    description: description.into(),
                    properties: Properties::new(),
                },
            )
            .await
    }

    /// Settles the message in any of the ways of [`Settlement`].
    ///
    /// # Errors
    /// As the specific settlement methods.
    pub async fn settle(self, settlement: Settlement) -> Result<()> {
        self.settler.settle(&self.message, settlement).await
    }

    /// Defers the message: it can then be received only by its sequence number, which
    /// this returns (S2.5).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`]; [`ErrorKind::Unsupported`] where the transport bends S2.5's
    /// defer.
    pub async fn defer(self) -> Result<SequenceNumber> {
        let seq = self.message.broker.sequence_number;
        self.settler
            .settle(
                &self.message,
                Settlement::Defer {
                    properties: Properties::new(),
                },
            )
            .await?;
        Ok(seq)
    }

    /// Renews the lock for another lock duration (S2.4).
    ///
    /// # Errors
    /// [`ErrorKind::LockLost`] if the lock had already expired.
    pub async fn renew_lock(&mut self) -> Result<DateTime<Utc>> {
        let until = self.settler.renew(&self.message).await?;
        self.message.broker.locked_until = Some(until);
        Ok(until)
    }

    /// Runs `work` while renewing the lock in the background of the same task, each time
    /// half of the remaining lock time has passed, for at most `max_total` after the call
    /// (S2.4's auto-renew). Returns the work's output and the renewal error that ended the
    /// renewals, if any; after an error or after `max_total` the lock is left to expire.
    ///
    /// # Cancel safety
    /// Dropping the future stops the renewals; the lock then expires as usual.
    pub async fn renew_while<F: Future>(
        &mut self,
        clock: &dyn Clock,
        max_total: Duration,
        work: F,
    ) -> (F::Output, Option<Error>) {
        let stop_at = clock.now() + chrono::Duration::from_std(max_total).unwrap_or(chrono::Duration::MAX);
        let mut work = std::pin::pin!(work);
        let mut failure = None;
        loop {
            let renewing = failure.is_none();
            let next = match self.locked_until() {
                Some(until) if renewing => {
                    let now = clock.now();
                    let half = (until - now) / 2;
                    let at = now + half.max(chrono::Duration::milliseconds(1));
                    Some(at.min(stop_at))
                }
                _ => None,
            };
            let Some(at) = next.filter(|at| *at < stop_at) else {
                return (work.await, failure);
            };
            tokio::select! {
                out = &mut work => return (out, failure),
                () = clock.sleep_until(at) => {
                    if let Err(e) = self.renew_lock().await {
                        tracing::warn!(error = %e, message_id = %Escaped(&self.message.envelope.message_id), "lock renewal failed");
                        failure = Some(e);
                    }
                }
            }
        }
    }
}

/// How many sends one sender may have outstanding by default (S1.4).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// Options of a sender.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SenderOptions {
    /// At most this many messages are outstanding at once; more sends wait (S1.4).
    pub max_in_flight: usize,
    /// Allows [`Sender::send_presettled`] (S1.5). Off by default.
    pub allow_presettled: bool,
}

impl Default for SenderOptions {
    fn default() -> Self {
        Self {
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            allow_presettled: false,
        }
    }
}

impl SenderOptions {
    /// Sets the bound on outstanding sends.
    #[must_use]
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }
    /// Allows pre-settled sends.
    #[must_use]
    pub fn allow_presettled(mut self, yes: bool) -> Self {
        self.allow_presettled = yes;
        self
    }
    /// Checks the ranges.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`] for a zero bound.
    pub fn validate(&self) -> Result<()> {
        if self.max_in_flight == 0 {
            return Err(Error::new(ErrorKind::InvalidOptions {
                reason: "max_in_flight must be at least 1".into(),
            }));
        }
        Ok(())
    }
}

/// A failed send: the error, and the messages handed back so nothing is lost (S1.2).
#[derive(thiserror::Error)]
#[error("send failed: {error}")]
pub struct SendError {
    /// Why the send failed.
    #[source]
    pub error: Error,
    /// The messages that were not accepted, in the order they were given.
    pub messages: Vec<Envelope>,
}

impl SendError {
    /// A failed send of `messages`.
    pub fn new(error: Error, messages: Vec<Envelope>) -> Self {
        Self { error, messages }
    }

    /// Whether sending again can succeed.
    pub fn is_transient(&self) -> bool {
        self.error.is_transient()
    }

    /// The error kind.
    pub fn kind(&self) -> &ErrorKind {
        self.error.kind()
    }
}

impl std::fmt::Debug for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendError")
            .field("error", &self.error)
            .field("messages", &self.messages.len())
            .finish()
    }
}

impl From<SendError> for Error {
    fn from(value: SendError) -> Self {
        value.error
    }
}

/// Sends to one queue or topic. Every send completes only once the broker has durably
/// accepted the message (S1.1); sends may be called concurrently and are pipelined
/// (S1.3), bounded by [`SenderOptions::max_in_flight`] (S1.4).
#[async_trait]
pub trait Sender: Send + Sync {
    /// The queue or topic.
    fn entity(&self) -> &str;

    /// How many messages are outstanding right now.
    fn in_flight(&self) -> usize;

    /// Sends one message. A message with a scheduled enqueue time is scheduled (S5.1).
    ///
    /// # Errors
    /// A [`SendError`] carrying the reason, a tracking id, whether a retry can help, and
    /// the message handed back.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the outcome unknown: the message may or may not have
    /// been accepted (send it again with the same message id; receivers deduplicate).
    async fn send(&self, message: Envelope) -> Result<(), SendError>;

    /// Sends messages as one batch: all are accepted, in order, or none.
    ///
    /// # Errors
    /// As [`send`](Self::send), with all messages handed back.
    async fn send_batch(&self, messages: Vec<Envelope>) -> Result<(), SendError>;

    /// Schedules a message for `at` and returns its sequence number, with which it can
    /// be cancelled until it activates (S5.1, S5.3).
    ///
    /// # Errors
    /// As [`send`](Self::send); [`ErrorKind::InvalidScheduleTime`] for a time out of range.
    async fn schedule(&self, message: Envelope, at: DateTime<Utc>) -> Result<SequenceNumber, SendError>;

    /// Cancels a scheduled message (S5.3).
    ///
    /// # Errors
    /// [`ErrorKind::MessageNotFound`] if no scheduled message has this sequence number
    /// (it was cancelled already or has activated: S5.6).
    async fn cancel_scheduled(&self, sequence_number: SequenceNumber) -> Result<()>;

    /// Sends without waiting for the broker's answer (S1.5): the caller never learns the
    /// outcome. Refused unless [`SenderOptions::allow_presettled`] was set.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOperation`] when not allowed; errors found before the message
    /// leaves (name, size) are still returned.
    async fn send_presettled(&self, message: Envelope) -> Result<(), SendError>;
}

/// Receives from a queue, a subscription, or a dead-letter sub-queue.
#[async_trait]
pub trait Receiver: Send + Sync {
    /// What this receiver reads.
    fn path(&self) -> &EntityPath;

    /// Receives up to `max_count` messages in PeekLock mode, waiting up to `max_wait` for
    /// the first one (S2.2). Returns an empty vector when none came in time.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOperation`] on a session queue (accept a session instead).
    ///
    /// # Cancel safety
    /// Cancel safe: messages locked for a receive whose future was dropped are unlocked
    /// again with their delivery count restored.
    async fn receive(&self, max_count: usize, max_wait: Duration) -> Result<Vec<Delivery>>;

    /// Receives up to `max_count` messages in ReceiveAndDelete mode (S2.1): they are
    /// removed as they leave the broker.
    ///
    /// # Cancel safety
    /// Not cancel safe: a message taken for a dropped future is lost, as the mode says.
    async fn receive_and_delete(&self, max_count: usize, max_wait: Duration) -> Result<Vec<ReceivedMessage>>;

    /// Locks deferred messages by sequence number (S2.5).
    ///
    /// # Errors
    /// [`ErrorKind::MessageNotFound`] if one of them is not a deferred message here.
    async fn receive_deferred(&self, sequence_numbers: &[SequenceNumber]) -> Result<Vec<Delivery>>;

    /// Settles a message by its lock token alone (for a token kept outside a
    /// [`Delivery`]).
    ///
    /// # Errors
    /// [`ErrorKind::UnknownLockToken`] for a token this broker never issued;
    /// [`ErrorKind::LockLost`] for one whose lock is gone.
    async fn settle_by_token(&self, token: LockToken, settlement: Settlement) -> Result<()>;
}

/// Which session to accept (S4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionSelector {
    /// The next session that has messages and is not held by anyone.
    Next,
    /// This session, whether or not it has messages.
    Named(String),
}

/// A receiver that holds one session's lock: it alone receives that session's messages,
/// in sequence order (S4.1).
#[async_trait]
pub trait SessionReceiver: Receiver {
    /// The session held.
    fn session_id(&self) -> &str;
    /// Until when the session lock is held (as of acceptance or the last renewal).
    fn session_locked_until(&self) -> DateTime<Utc>;
    /// Renews the session lock (and the locks of its received messages).
    ///
    /// # Errors
    /// [`ErrorKind::SessionLockLost`] if it had expired.
    async fn renew_session_lock(&self) -> Result<DateTime<Utc>>;
    /// Reads the session state (S4.3).
    ///
    /// # Errors
    /// [`ErrorKind::SessionLockLost`].
    async fn session_state(&self) -> Result<Option<Bytes>>;
    /// Writes the session state (S4.3); `None` clears it.
    ///
    /// # Errors
    /// [`ErrorKind::SessionLockLost`].
    async fn set_session_state(&self, state: Option<Bytes>) -> Result<()>;
    /// Releases the session lock so another receiver can accept the session.
    ///
    /// # Errors
    /// [`ErrorKind::Closed`].
    async fn release(&self) -> Result<()>;
}

/// A broker: where messages live between send and settle.
#[async_trait]
pub trait Transport: Send + Sync + 'static {
    /// A short name for logs and errors (`embedded`, `amqp`).
    fn name(&self) -> &'static str;

    /// The rules this transport bends.
    fn capabilities(&self) -> Capabilities;

    /// Checks, without I/O, what a send of `message` would refuse whatever its
    /// destination: its size against this transport's limit, its ids and field lengths,
    /// the property names the transport reserves, its time-to-live and scheduled time,
    /// and a schedule the transport cannot keep. An endpoint calls it when a handler
    /// sends (`Context::send`, `publish`, ...), so that a message that can never leave
    /// fails the handler at once, permanently, instead of after its outbox row was
    /// committed. What depends on the destination (whether it exists, whether it needs
    /// sessions) is checked by the send. The default checks nothing.
    ///
    /// # Errors
    /// The error the send would fail with ([`ErrorKind::MessageTooLarge`],
    /// [`ErrorKind::InvalidMessage`], [`ErrorKind::InvalidScheduleTime`],
    /// [`ErrorKind::Unsupported`]); none of them is transient.
    fn check_message(&self, message: &Envelope) -> Result<()> {
        let _ = message;
        Ok(())
    }

    /// Creates a queue if it does not exist (an existing queue keeps its settings).
    ///
    /// # Errors
    /// [`ErrorKind::InvalidEntityName`], [`ErrorKind::InvalidOptions`], or a name taken by
    /// a topic.
    async fn create_queue(&self, name: &str, options: &QueueOptions) -> Result<()>;

    /// Creates a topic if it does not exist.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue).
    async fn create_topic(&self, name: &str, options: &TopicOptions) -> Result<()>;

    /// Creates a subscription of a topic if it does not exist; from then on it gets a copy
    /// of every message sent to the topic.
    ///
    /// # Errors
    /// As [`create_queue`](Self::create_queue); [`ErrorKind::EntityNotFound`] for a
    /// missing topic.
    async fn create_subscription(&self, topic: &str, name: &str, options: &SubscriptionOptions) -> Result<()>;

    /// Deletes a queue, topic (with its subscriptions) or subscription and its messages.
    ///
    /// # Errors
    /// [`ErrorKind::EntityNotFound`].
    async fn delete(&self, path: &EntityPath) -> Result<()>;

    /// A sender to a queue or topic.
    ///
    /// # Errors
    /// [`ErrorKind::EntityNotFound`], [`ErrorKind::InvalidOptions`].
    async fn sender(&self, entity: &str, options: SenderOptions) -> Result<Arc<dyn Sender>>;

    /// A receiver of a queue, subscription or dead-letter sub-queue.
    ///
    /// # Errors
    /// [`ErrorKind::EntityNotFound`].
    async fn receiver(&self, path: &EntityPath) -> Result<Arc<dyn Receiver>>;

    /// Accepts a session of a session queue or subscription, waiting up to `max_wait`
    /// for one to become available (S4).
    ///
    /// # Errors
    /// [`ErrorKind::SessionNotAvailable`] when none could be locked in time.
    async fn accept_session(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>>;

    /// Reads up to `max_count` messages from `from_sequence_number` on, without locking
    /// or changing them (S6.1). On the main sub-queue it shows active, scheduled and
    /// deferred messages; on the dead-letter sub-queue, dead-lettered ones.
    ///
    /// # Errors
    /// [`ErrorKind::EntityNotFound`].
    async fn peek(
        &self,
        path: &EntityPath,
        from_sequence_number: SequenceNumber,
        max_count: usize,
    ) -> Result<Vec<ReceivedMessage>>;

    /// Counts the messages of an entity by state.
    ///
    /// # Errors
    /// [`ErrorKind::EntityNotFound`].
    async fn counts(&self, path: &EntityPath) -> Result<EntityCounts>;

    /// Closes the broker connection; later calls fail with [`ErrorKind::Closed`].
    async fn close(&self);

    /// The clock the transport stamps and compares times with (enqueued times, lock
    /// ends, scheduled messages), when it has one of its own. An endpoint on this
    /// transport uses it unless [`EndpointBuilder::clock`](crate::EndpointBuilder::clock)
    /// says otherwise, so a test's [`VirtualClock`](crate::VirtualClock) given to the
    /// transport also drives the endpoint's saga timeouts and delayed retries. The
    /// default: `None` (the endpoint uses the system clock).
    fn clock(&self) -> Option<Arc<dyn Clock>> {
        None
    }

    /// This transport as [`Any`](std::any::Any), so that a store in the broker's own
    /// database recognises it ([`Store::unit_of_work_scope`](crate::Store::unit_of_work_scope)).
    /// The default: `None` (no store shares its database).
    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        None
    }
}
