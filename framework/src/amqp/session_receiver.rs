//! The session receiver on RabbitMQ: holds one session's lease in its process's hub
//! (`sessions.rs`) and takes that session's messages in order; its settler acks, gives
//! back or dead-letters them.
//!
//! The session lock is the lease: it lasts the queue's lock duration (60 s) by the
//! transport's clock, is renewed by [`SessionReceiver::renew_session_lock`] (or a
//! message's `renew_lock`), and once expired the session's handed-out messages go back
//! to the front of the session, where the next receiver to accept it finds them. Session
//! state (S4.3) is refused (bent: see `rules.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use lapin::options::BasicAckOptions;

use crate::entity::EntityPath;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{LockToken, ReceivedMessage, SequenceNumber};
use crate::transport::{Delivery, Receiver, SessionReceiver, Settlement, Settler};

use super::session_partitions::dead_copy;
use super::sessions::Hub;
use super::{Inner, unsupported};

type Pending = Arc<Mutex<HashMap<LockToken, Weak<SessionSettler>>>>;

pub(crate) struct AmqpSessionReceiver {
    inner: Arc<Inner>,
    hub: Arc<Hub>,
    path: EntityPath,
    session: String,
    lease: u64,
    until: Mutex<DateTime<Utc>>,
    pending: Pending,
}

impl AmqpSessionReceiver {
    pub(crate) fn new(
        inner: Arc<Inner>,
        hub: Arc<Hub>,
        path: EntityPath,
        session: String,
        lease: u64,
        until: DateTime<Utc>,
    ) -> Self {
        Self {
            inner,
            hub,
            path,
            session,
            lease,
            until: Mutex::new(until),
            pending: Arc::default(),
        }
    }

    fn lost() -> Error {
        Error::new(ErrorKind::SessionLockLost)
    }

    /// Takes up to `max` messages, waiting up to `max_wait` for the first.
    async fn take(&self, max: usize, max_wait: Duration) -> Result<Vec<(u64, ReceivedMessage)>> {
        self.inner.conn.check_open()?;
        if max == 0 {
            return Ok(Vec::new());
        }
        let deadline = tokio::time::Instant::now() + max_wait.min(Duration::from_secs(24 * 3600));
        loop {
            let changed = self.hub.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let got = self
                .hub
                .take(&self.inner, &self.session, self.lease, max)
                .ok_or_else(Self::lost)?;
            if !got.is_empty() || max_wait.is_zero() {
                return Ok(got);
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Ok(Vec::new());
            }
            self.inner.conn.check_open()?;
        }
    }
}

impl Drop for AmqpSessionReceiver {
    /// A receiver dropped releases its session.
    fn drop(&mut self) {
        self.hub.release(&self.inner, &self.session, self.lease);
    }
}

#[async_trait]
impl Receiver for AmqpSessionReceiver {
    fn path(&self) -> &EntityPath {
        &self.path
    }

    async fn receive(&self, max_count: usize, max_wait: Duration) -> Result<Vec<Delivery>> {
        let got = self.take(max_count, max_wait).await?;
        let mut out = Vec::with_capacity(got.len());
        for (order, message) in got {
            let settler = Arc::new(SessionSettler {
                inner: self.inner.clone(),
                hub: self.hub.clone(),
                session: self.session.clone(),
                lease: self.lease,
                order,
                token: message.broker.lock_token,
                pending: self.pending.clone(),
                settled: AtomicBool::new(false),
            });
            if let (Some(token), Ok(mut p)) = (message.broker.lock_token, self.pending.lock()) {
                p.insert(token, Arc::downgrade(&settler));
            }
            out.push(Delivery::new(message, settler));
        }
        Ok(out)
    }

    async fn receive_and_delete(&self, max_count: usize, max_wait: Duration) -> Result<Vec<ReceivedMessage>> {
        let got = self.take(max_count, max_wait).await?;
        let mut out = Vec::with_capacity(got.len());
        for (order, mut message) in got {
            let Some(held) = self.hub.settle_out(&self.inner, &self.session, self.lease, order) else {
                continue;
            };
            // Settled as it leaves: a message whose ack fails is lost (S2.1, at most once).
            self.inner.conn.acked(held.acker.ack(BasicAckOptions::default())).await;
            message.broker.lock_token = None;
            message.broker.locked_until = None;
            out.push(message);
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
        let Some(s) = settler else {
            return Err(Error::new(ErrorKind::UnknownLockToken {
                token: token.to_string(),
            }));
        };
        let message = self
            .hub
            .peek_out(&self.session, s.order)
            .ok_or_else(|| Error::new(ErrorKind::LockLost))?;
        s.settle(&message, settlement).await
    }
}

#[async_trait]
impl SessionReceiver for AmqpSessionReceiver {
    fn session_id(&self) -> &str {
        &self.session
    }

    fn session_locked_until(&self) -> DateTime<Utc> {
        *self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn renew_session_lock(&self) -> Result<DateTime<Utc>> {
        self.inner.conn.check_open()?;
        let until = self
            .hub
            .renew(&self.inner, &self.session, self.lease)
            .ok_or_else(Self::lost)?;
        *self.until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = until;
        Ok(until)
    }

    async fn session_state(&self) -> Result<Option<Bytes>> {
        self.inner.conn.check_open()?;
        Err(unsupported("session state", "S4.3"))
    }

    async fn set_session_state(&self, _state: Option<Bytes>) -> Result<()> {
        self.inner.conn.check_open()?;
        Err(unsupported("session state", "S4.3"))
    }

    async fn release(&self) -> Result<()> {
        self.inner.conn.check_open()?;
        self.hub.release(&self.inner, &self.session, self.lease);
        Ok(())
    }
}

/// Settles one message of a session. Dropped unsettled, it gives the message back to
/// the front of its session (the effect of abandon).
pub(crate) struct SessionSettler {
    inner: Arc<Inner>,
    hub: Arc<Hub>,
    session: String,
    lease: u64,
    order: u64,
    token: Option<LockToken>,
    pending: Pending,
    settled: AtomicBool,
}

impl SessionSettler {
    async fn settle_once(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        let lost = || Error::new(ErrorKind::LockLost);
        match settlement {
            Settlement::Defer { .. } => Err(unsupported("defer", "S2.5")),
            Settlement::Abandon { .. } => {
                if self.settled.swap(true, Ordering::AcqRel) {
                    return Err(lost());
                }
                if self.hub.give_back(&self.inner, &self.session, self.lease, self.order) {
                    Ok(())
                } else {
                    Err(lost())
                }
            }
            Settlement::Complete => {
                if self.settled.swap(true, Ordering::AcqRel) {
                    return Err(lost());
                }
                let held = self
                    .hub
                    .settle_out(&self.inner, &self.session, self.lease, self.order)
                    .ok_or_else(lost)?;
                if !held.channel.status().connected() {
                    return Err(lost());
                }
                if !self.inner.conn.acked(held.acker.ack(BasicAckOptions::default())).await {
                    return Err(lost());
                }
                Ok(())
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties,
            } => {
                if self.settled.swap(true, Ordering::AcqRel) {
                    return Err(lost());
                }
                let held = self
                    .hub
                    .settle_out(&self.inner, &self.session, self.lease, self.order)
                    .ok_or_else(lost)?;
                let mut copy = dead_copy(&message.envelope, &reason, &description, &self.hub.queue);
                copy.properties.extend(properties);
                // Confirmed in the dead-letter queue first, then acked: a crash in between
                // leaves a copy in both, never in neither.
                if let Err(e) = self.inner.dead_letter(&self.hub.dead_letter_queue, &copy).await {
                    self.hub.restore_out(&self.session, held);
                    self.settled.store(false, Ordering::Release);
                    return Err(e);
                }
                if !self.inner.conn.acked(held.acker.ack(BasicAckOptions::default())).await {
                    return Err(lost());
                }
                Ok(())
            }
        }
    }
}

#[async_trait]
impl Settler for SessionSettler {
    async fn settle(&self, message: &ReceivedMessage, settlement: Settlement) -> Result<()> {
        let outcome = self.settle_once(message, settlement).await;
        if self.settled.load(Ordering::Acquire)
            && let (Some(token), Ok(mut p)) = (self.token, self.pending.lock())
        {
            p.remove(&token);
        }
        outcome
    }

    /// Renews the session's lease: a message's lock is its session's lock.
    async fn renew(&self, _message: &ReceivedMessage) -> Result<DateTime<Utc>> {
        self.inner.conn.check_open()?;
        self.hub
            .renew(&self.inner, &self.session, self.lease)
            .ok_or_else(|| Error::new(ErrorKind::LockLost))
    }
}

impl Drop for SessionSettler {
    fn drop(&mut self) {
        if let (Some(token), Ok(mut p)) = (self.token, self.pending.lock()) {
            p.remove(&token);
        }
        if !self.settled.load(Ordering::Acquire) {
            self.hub.give_back(&self.inner, &self.session, self.lease, self.order);
        }
    }
}
