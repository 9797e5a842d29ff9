//! Sending to the embedded broker: [`EmbeddedSender`], one per queue or topic, with the
//! broker's bound on sends in flight. Every message passes the checks every transport
//! applies (`crate::checks`) before it is accepted; the sends themselves are served by the
//! engine (`engine/send.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::Shared;
use super::engine::Command;
use crate::checks::check_envelope;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, SequenceNumber};
use crate::transport::{SendError, Sender};

pub(super) struct EmbeddedSender {
    pub(super) shared: Arc<Shared>,
    pub(super) name: String,
    pub(super) entity: i64,
    pub(super) requires_session: bool,
    pub(super) permits: Arc<Semaphore>,
    pub(super) max_in_flight: usize,
    pub(super) allow_presettled: bool,
}

impl EmbeddedSender {
    fn check(&self, m: &Envelope, now: DateTime<Utc>) -> Result<()> {
        check_envelope(self.shared.max_message_size, m, &self.name, self.requires_session, now)
    }

    async fn submit(&self, messages: Vec<Envelope>) -> Result<Vec<SequenceNumber>, SendError> {
        if let Err(e) = self.shared.check_open() {
            return Err(SendError::new(e, messages));
        }
        let now = self.shared.clock.now();
        if let Some(e) = messages.iter().find_map(|m| self.check(m, now).err()) {
            return Err(SendError::new(e, messages));
        }
        let n = u32::try_from(messages.len().clamp(1, self.max_in_flight)).unwrap_or(u32::MAX);
        let Ok(_permits) = self.permits.acquire_many(n).await else {
            return Err(SendError::new(Error::new(ErrorKind::Closed), messages));
        };
        let (reply, rx) = oneshot::channel();
        // Keep a copy to hand back if the broker refuses; bodies are reference counted.
        let kept = messages.clone();
        let cmd = Command::Send {
            entity: self.entity,
            messages,
            reply: Some(reply),
        };
        if self.shared.tx.send(cmd).await.is_err() {
            return Err(SendError::new(Error::new(ErrorKind::Closed), kept));
        }
        match rx.await {
            Ok(Ok(seqs)) => Ok(seqs),
            Ok(Err(e)) => Err(SendError::new(e, kept)),
            Err(_) => Err(SendError::new(Error::new(ErrorKind::Closed), kept)),
        }
    }
}

#[async_trait]
impl Sender for EmbeddedSender {
    fn entity(&self) -> &str {
        &self.name
    }

    fn in_flight(&self) -> usize {
        self.max_in_flight - self.permits.available_permits()
    }

    async fn send(&self, message: Envelope) -> Result<(), SendError> {
        self.submit(vec![message]).await.map(|_| ())
    }

    async fn send_batch(&self, messages: Vec<Envelope>) -> Result<(), SendError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.submit(messages).await.map(|_| ())
    }

    async fn schedule(&self, mut message: Envelope, at: DateTime<Utc>) -> Result<SequenceNumber, SendError> {
        message.scheduled_enqueue_time = Some(at);
        let seqs = self.submit(vec![message]).await?;
        seqs.first().copied().ok_or_else(|| {
            SendError::new(
                Error::new(ErrorKind::Corrupt {
                    detail: "the broker returned no sequence number".into(),
                }),
                Vec::new(),
            )
        })
    }

    async fn cancel_scheduled(&self, sequence_number: SequenceNumber) -> Result<()> {
        let entity = self.entity;
        self.shared
            .call(|reply| Command::Cancel {
                entity,
                seq: sequence_number,
                reply,
            })
            .await
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
        if let Err(e) = self
            .shared
            .check_open()
            .and_then(|()| self.check(&message, self.shared.clock.now()))
        {
            return Err(SendError::new(e, vec![message]));
        }
        let cmd = Command::Send {
            entity: self.entity,
            messages: vec![message],
            reply: None,
        };
        match self.shared.tx.send(cmd).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError(Command::Send { messages, .. })) => {
                Err(SendError::new(Error::new(ErrorKind::Closed), messages))
            }
            Err(_) => Err(SendError::new(Error::new(ErrorKind::Closed), Vec::new())),
        }
    }
}
