//! The RabbitMQ sender: settled sends through publisher confirms, bounded in flight.

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::Semaphore;

use crate::checks::check_envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, SequenceNumber};
use crate::transport::SendError;
use crate::transport::Sender;

use super::Inner;
use super::publish::{ConfirmChannel, Target, finish};
use super::schedule::no_store;
use super::wire;

pub(crate) struct AmqpSender {
    pub(crate) inner: Arc<Inner>,
    pub(crate) target: Target,
    pub(crate) entity: String,
    pub(crate) default_ttl: Option<std::time::Duration>,
    pub(crate) permits: Arc<Semaphore>,
    pub(crate) max_in_flight: usize,
    pub(crate) allow_presettled: bool,
    pub(crate) channel: ConfirmChannel,
    /// Whether `entity` is a session queue: each message goes to its session's partition
    /// queue (`sessions.rs`), and a message without a session id is refused.
    pub(crate) sessions: bool,
}

impl AmqpSender {
    fn check(&self, m: &Envelope) -> Result<()> {
        self.inner.conn.check_open()?;
        check_envelope(
            self.inner.max_message_size,
            m,
            &self.entity,
            self.sessions,
            self.inner.clock.now(),
        )
    }

    /// Where `m` goes: the sender's queue or topic, or its session's partition.
    fn target_of(&self, m: &Envelope) -> Target {
        match (&m.session_id, self.sessions) {
            (Some(session), true) => Target::Queue(super::sessions::queue_for(&self.entity, session)),
            _ => self.target.clone(),
        }
    }

    /// The destination a scheduled `m` is stored for: its partition on a session queue.
    fn destination_of(&self, m: &Envelope) -> String {
        match self.target_of(m) {
            Target::Queue(q) | Target::Topic(q) => q,
        }
    }

    /// The queue's default time-to-live applies to messages that set none and bounds
    /// those that do.
    fn with_default_ttl(&self, mut m: Envelope) -> Envelope {
        if let Some(d) = self.default_ttl {
            m.time_to_live = Some(m.time_to_live.map_or(d, |t| t.min(d)));
        }
        m
    }

    fn is_scheduled(&self, m: &Envelope) -> bool {
        m.scheduled_enqueue_time.is_some_and(|at| at > self.inner.clock.now())
    }

    async fn store_schedule(&self, m: Envelope, at: DateTime<Utc>) -> Result<SequenceNumber, SendError> {
        let Some(store) = &self.inner.schedules else {
            return Err(SendError::new(no_store("scheduled messages"), vec![m]));
        };
        let kept = m.clone();
        let is_topic = matches!(self.target, Target::Topic(_));
        let destination = self.destination_of(&m);
        match store
            .insert(&destination, is_topic, at, m, self.inner.clock.now())
            .await
        {
            Ok(seq) => {
                self.inner.wake.notify_one();
                Ok(seq)
            }
            Err(e) => Err(SendError::new(e, vec![kept])),
        }
    }

    async fn publish(&self, m: &Envelope, wait: bool) -> Result<()> {
        let properties = wire::properties(m, self.inner.clock.now(), self.inner.next_sequence_number())?;
        let target = self.target_of(m);
        let confirm = self
            .channel
            .start(&self.inner.conn, &target, properties, &m.body)
            .await?;
        if wait {
            finish(&target, confirm).await?;
        }
        Ok(())
    }
}

#[async_trait]
impl Sender for AmqpSender {
    fn entity(&self) -> &str {
        &self.entity
    }

    fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    async fn send(&self, message: Envelope) -> Result<(), SendError> {
        if let Err(e) = self.check(&message) {
            return Err(SendError::new(e, vec![message]));
        }
        let message = self.with_default_ttl(message);
        if let Some(at) = message.scheduled_enqueue_time.filter(|_| self.is_scheduled(&message)) {
            return self.store_schedule(message, at).await.map(|_| ());
        }
        let Ok(_permit) = self.permits.acquire().await else {
            return Err(SendError::new(Error::new(ErrorKind::Closed), vec![message]));
        };
        match self.publish(&message, true).await {
            Ok(()) => Ok(()),
            Err(e) => Err(SendError::new(e, vec![message])),
        }
    }

    async fn send_batch(&self, messages: Vec<Envelope>) -> Result<(), SendError> {
        if let Some(e) = messages.iter().find_map(|m| self.check(m).err()) {
            return Err(SendError::new(e, messages));
        }
        // Pipelined in chunks of the in-flight bound; a failure stops the batch and hands
        // back exactly the messages that were not confirmed (S1.3 is bent: RabbitMQ cannot
        // make a confirmed batch all-or-nothing).
        let mut failed: Vec<Envelope> = Vec::new();
        let mut first_error: Option<Error> = None;
        let mut rest = messages.into_iter().map(|m| self.with_default_ttl(m)).peekable();
        while rest.peek().is_some() {
            let chunk: Vec<Envelope> = rest.by_ref().take(self.max_in_flight).collect();
            if first_error.is_some() {
                failed.extend(chunk);
                continue;
            }
            let Ok(n) = u32::try_from(chunk.len()) else {
                failed.extend(chunk);
                continue;
            };
            let Ok(_permits) = self.permits.acquire_many(n).await else {
                first_error = Some(Error::new(ErrorKind::Closed));
                failed.extend(chunk);
                continue;
            };
            let mut pending = Vec::with_capacity(chunk.len());
            for m in chunk {
                if let Some(at) = m.scheduled_enqueue_time.filter(|_| self.is_scheduled(&m)) {
                    if let Err(e) = self.store_schedule(m, at).await {
                        first_error.get_or_insert(e.error);
                        failed.extend(e.messages);
                    }
                    continue;
                }
                if first_error.is_some() {
                    failed.push(m);
                    continue;
                }
                let target = self.target_of(&m);
                let started = match wire::properties(&m, self.inner.clock.now(), self.inner.next_sequence_number()) {
                    Ok(p) => self.channel.start(&self.inner.conn, &target, p, &m.body).await,
                    Err(e) => Err(e),
                };
                match started {
                    Ok(confirm) => pending.push((m, target, confirm)),
                    Err(e) => {
                        first_error.get_or_insert(e);
                        failed.push(m);
                    }
                }
            }
            for (m, target, confirm) in pending {
                if let Err(e) = finish(&target, confirm).await {
                    first_error.get_or_insert(e);
                    failed.push(m);
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(SendError::new(e, failed)),
        }
    }

    async fn schedule(&self, message: Envelope, at: DateTime<Utc>) -> Result<SequenceNumber, SendError> {
        let message = message.with_scheduled_enqueue_time(at);
        if let Err(e) = self.check(&message) {
            return Err(SendError::new(e, vec![message]));
        }
        let message = self.with_default_ttl(message);
        self.store_schedule(message, at).await
    }

    async fn cancel_scheduled(&self, sequence_number: SequenceNumber) -> Result<()> {
        self.inner.conn.check_open()?;
        let Some(store) = &self.inner.schedules else {
            return Err(no_store("cancelling scheduled messages"));
        };
        // On a session queue, the message waits for its partition (`destination_of`).
        let destinations = if self.sessions {
            super::sessions::partition_queues(&self.entity)
        } else {
            vec![self.entity.clone()]
        };
        for destination in &destinations {
            if store.cancel(destination, sequence_number).await? {
                return Ok(());
            }
        }
        Err(Error::new(ErrorKind::MessageNotFound {
            sequence_number,
            expected: "scheduled",
        }))
    }

    async fn send_presettled(&self, message: Envelope) -> Result<(), SendError> {
        if !self.allow_presettled {
            return Err(SendError::new(
                Error::new(ErrorKind::InvalidOperation {
                    reason: "pre-settled sends are off: enable SenderOptions::allow_presettled".into(),
                }),
                vec![message],
            ));
        }
        if let Err(e) = self.check(&message) {
            return Err(SendError::new(e, vec![message]));
        }
        let message = self.with_default_ttl(message);
        match self.publish(&message, false).await {
            Ok(()) => Ok(()),
            Err(e) => Err(SendError::new(e, vec![message])),
        }
    }
}
