//! Sending to the embedded broker: [`EmbeddedSender`] (one per queue or topic, with the
//! broker's bound on sends in flight) and the checks every message passes before it is
//! accepted (`check_envelope`, `check_schedule`; the engine applies the same to the sends
//! of a store transaction). The sends themselves are served by the engine
//! (`engine/send.rs`).

use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::engine::Command;
use super::{MAX_MESSAGE_ID_LEN, MAX_SCHEDULE_AHEAD, Shared};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Envelope, SequenceNumber};
use crate::transport::{SendError, Sender};

/// The checks a message passes before it is accepted for `entity` (every transport
/// applies the same).
pub(crate) fn check_envelope(
    max_message_size: usize,
    m: &Envelope,
    entity: &str,
    requires_session: bool,
    now: DateTime<Utc>,
) -> Result<()> {
    let invalid = |reason: String| Err(Error::new(ErrorKind::InvalidMessage { reason }));
    let size = m.size();
    if size > max_message_size {
        return Err(Error::new(ErrorKind::MessageTooLarge {
            size,
            limit: max_message_size,
        }));
    }
    if m.message_id.is_empty() || m.message_id.len() > MAX_MESSAGE_ID_LEN {
        return invalid(format!(
            "the message id must have 1 to {MAX_MESSAGE_ID_LEN} bytes, it has {}",
            m.message_id.len()
        ));
    }
    if let Some(s) = &m.session_id {
        if s.is_empty() || s.len() > MAX_MESSAGE_ID_LEN {
            return invalid(format!("the session id must have 1 to {MAX_MESSAGE_ID_LEN} bytes"));
        }
    } else if requires_session {
        return invalid(format!("{entity} requires sessions: set a session id"));
    }
    if let Some(ttl) = m.time_to_live
        && (ttl.is_zero() || ttl > crate::entity::MAX_TIME_TO_LIVE)
    {
        return invalid(format!("time-to-live {ttl:?} must be between 1 ms and 100 years"));
    }
    if let Some(at) = m.scheduled_enqueue_time {
        check_schedule(at, now)?;
    }
    Ok(())
}

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

/// Checks a scheduled enqueue time: from 1970 on, at most 100 years ahead (every
/// transport refuses the same times).
pub(crate) fn check_schedule(at: DateTime<Utc>, now: DateTime<Utc>) -> Result<()> {
    let refuse = |reason| {
        Err(Error::new(ErrorKind::InvalidScheduleTime {
            time: at.to_rfc3339(),
            reason,
        }))
    };
    if at.timestamp() < 0 {
        return refuse("it is before 1970-01-01");
    }
    if at > now + MAX_SCHEDULE_AHEAD {
        return refuse("it is more than 100 years ahead");
    }
    Ok(())
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
