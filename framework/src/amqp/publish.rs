//! Publishing with publisher confirms on a channel that is opened again after a failure.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, PublisherConfirm};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};

use super::conn::{Connector, Held, close_later, connection_error, reply_code};

/// Where a message goes: a queue (through the default exchange, mandatory, so that a
/// missing queue is an error) or a topic (its fanout exchange; a topic without
/// subscriptions drops the message, as a topic does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Queue(String),
    Topic(String),
}

impl Target {
    fn exchange(&self) -> &str {
        match self {
            Target::Queue(_) => "",
            Target::Topic(t) => t,
        }
    }
    fn routing_key(&self) -> &str {
        match self {
            Target::Queue(q) => q,
            Target::Topic(_) => "",
        }
    }
    fn name(&self) -> &str {
        match self {
            Target::Queue(n) | Target::Topic(n) => n,
        }
    }
    fn not_found(&self) -> Error {
        Error::new(ErrorKind::EntityNotFound {
            path: self.name().to_owned(),
        })
    }
}

/// A confirm-mode channel, opened on first use and again after it closed; the transport's
/// close closes it first ([`Held`]).
#[derive(Default)]
pub(crate) struct ConfirmChannel {
    channel: Arc<Mutex<Option<Channel>>>,
}

impl Drop for ConfirmChannel {
    /// Closed by Courier, not left to lapin (see [`close_later`]).
    fn drop(&mut self) {
        if let Ok(mut slot) = self.channel.try_lock()
            && let Some(channel) = slot.take()
        {
            close_later(channel);
        }
    }
}

impl ConfirmChannel {
    async fn get(&self, conn: &Connector) -> Result<Channel> {
        let mut slot = self.channel.lock().await;
        if let Some(c) = slot.as_ref()
            && c.status().connected()
        {
            return Ok(c.clone());
        }
        let channel = conn.channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| connection_error("cannot enable publisher confirms", &e))?;
        *slot = Some(channel.clone());
        let place: Arc<dyn Held> = self.channel.clone();
        conn.hold(Arc::downgrade(&place));
        Ok(channel)
    }

    /// Publishes without waiting for the confirm, which [`finish`] awaits. Opening the
    /// channel, the publish and its confirm share one deadline, the connection's
    /// operation timeout: past it the publish fails as [`unanswered`] and the channel
    /// it waited on is closed, so that the next publish opens another.
    pub(crate) async fn start(
        &self,
        conn: &Connector,
        target: &Target,
        properties: BasicProperties,
        body: &[u8],
    ) -> Result<Started> {
        let bound = conn.operation_timeout();
        let deadline = Instant::now() + bound;
        let Ok(channel) = tokio::time::timeout_at(deadline, self.get(conn)).await else {
            return Err(unanswered(target, bound));
        };
        let channel = channel?;
        let options = BasicPublishOptions {
            mandatory: matches!(target, Target::Queue(_)),
            ..BasicPublishOptions::default()
        };
        let published = tokio::time::timeout_at(
            deadline,
            channel.basic_publish(
                target.exchange().into(),
                target.routing_key().into(),
                options,
                body,
                properties,
            ),
        )
        .await;
        match published {
            Ok(Ok(confirm)) => Ok(Started {
                confirm,
                channel,
                slot: self.channel.clone(),
                deadline,
                bound,
            }),
            Ok(Err(e)) => Err(publish_error(target, &e)),
            Err(_) => {
                give_up(&self.channel, channel).await;
                Err(unanswered(target, bound))
            }
        }
    }
}

/// Closes `channel`, which did not answer in time, after taking it out of `slot` (if it
/// is still the one there): the next publish opens another at once. Left in the slot, it
/// still looked open until its close was sent, and a publish that took it then failed
/// with the channel closed under it (`invalid channel state: Closed`).
async fn give_up(slot: &Mutex<Option<Channel>>, channel: Channel) {
    {
        let mut held = slot.lock().await;
        if held.as_ref().is_some_and(|c| c.id() == channel.id()) {
            *held = None;
        }
    }
    close_later(channel);
}

/// A publish handed to lapin, its confirm awaited by [`finish`] until the deadline set
/// at its start.
pub(crate) struct Started {
    confirm: PublisherConfirm,
    channel: Channel,
    /// Where the channel is kept, to take it out if its confirm does not come in time.
    slot: Arc<Mutex<Option<Channel>>>,
    deadline: Instant,
    bound: Duration,
}

/// Waits for a publish's confirm (until its deadline) and says what it means.
pub(crate) async fn finish(target: &Target, started: Started) -> Result<()> {
    let Started {
        confirm,
        channel,
        slot,
        deadline,
        bound,
    } = started;
    let Ok(confirmed) = tokio::time::timeout_at(deadline, confirm).await else {
        give_up(&slot, channel).await;
        return Err(unanswered(target, bound));
    };
    match confirmed {
        Ok(Confirmation::Ack(None) | Confirmation::NotRequested) => Ok(()),
        Ok(Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned))) => Err(match returned.reply_code {
            312 | 404 => target.not_found(),
            311 => Error::new(ErrorKind::InvalidMessage {
                reason: format!("RabbitMQ refused the message: {}", returned.reply_text),
            }),
            code => Error::new(ErrorKind::Connection {
                detail: format!("RabbitMQ returned the message ({code} {})", returned.reply_text),
            }),
        }),
        Ok(Confirmation::Nack(None)) => Err(Error::new(ErrorKind::Storage {
            detail: format!(
                "RabbitMQ refused the message for {} (nack): the queue is full or the broker is short of resources",
                target.name()
            ),
            transient: true,
        })),
        Err(e) => Err(publish_error(target, &e)),
    }
}

/// A publish that RabbitMQ neither confirmed nor refused within the operation timeout:
/// transient, its outcome unknown.
fn unanswered(target: &Target, bound: Duration) -> Error {
    Error::new(ErrorKind::Connection {
        detail: format!(
            "publishing to {} got no answer from RabbitMQ within {} s (the transport's operation timeout); the \
             outcome is unknown: send the message again with the same message id (the receiving endpoint's inbox \
             drops a duplicate). A node that stopped answering is left after about two heartbeats (set \
             ?heartbeat=N in the URL); a broker short of memory or disk holds publishes back until its alarm clears",
            target.name(),
            bound.as_secs_f64()
        ),
    })
}

fn publish_error(target: &Target, e: &lapin::Error) -> Error {
    match reply_code(e) {
        Some(404) => target.not_found(),
        _ => connection_error(
            &format!("publishing to {} failed; the outcome is unknown", target.name()),
            e,
        ),
    }
}
