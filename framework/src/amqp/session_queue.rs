//! A session queue as an entity on RabbitMQ: what a plain receiver of it gets (a refusal
//! to receive), its counts (the sum of its partitions), and its deletion (partitions,
//! dead-letter queue, scheduled messages). `sessions.rs` has the layout.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::QueueDeleteOptions;

use crate::entity::{EntityCounts, EntityPath};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{LockToken, ReceivedMessage, SequenceNumber};
use crate::transport::{Delivery, Receiver, SessionReceiver, SessionSelector, Settlement};

use super::publish::Target;
use super::sessions::{partition_queues, session_queue_of};
use super::{AmqpTransport, unsupported, wire};

/// The receiver of a session queue's main sub-queue: its messages are received by
/// accepting a session, so every receive is refused (as on the other transports).
pub(crate) struct SessionQueueReceiver(pub(crate) EntityPath);

impl SessionQueueReceiver {
    fn refused(&self) -> Error {
        Error::new(ErrorKind::InvalidOperation {
            reason: format!(
                "{} is a session queue: accept a session (Transport::accept_session) to receive its messages",
                self.0
            ),
        })
    }
}

#[async_trait]
impl Receiver for SessionQueueReceiver {
    fn path(&self) -> &EntityPath {
        &self.0
    }

    async fn receive(&self, _max_count: usize, _max_wait: Duration) -> Result<Vec<Delivery>> {
        Err(self.refused())
    }

    async fn receive_and_delete(&self, _max_count: usize, _max_wait: Duration) -> Result<Vec<ReceivedMessage>> {
        Err(self.refused())
    }

    async fn receive_deferred(&self, _sequence_numbers: &[SequenceNumber]) -> Result<Vec<Delivery>> {
        Err(unsupported("receiving deferred messages", "S2.5"))
    }

    async fn settle_by_token(&self, token: LockToken, _settlement: Settlement) -> Result<()> {
        Err(Error::new(ErrorKind::UnknownLockToken {
            token: token.to_string(),
        }))
    }
}

impl AmqpTransport {
    /// Where a sender to `entity` publishes, and whether `entity` is a session queue (a
    /// session queue another process declared has no queue or topic of its name, but
    /// partitions).
    pub(super) async fn sender_target(&self, entity: &str) -> Result<(Target, bool)> {
        // One look at what it is known to be (the schedule store's record is a query).
        let known = self.inner.known_kind(entity).await;
        if known == Some(super::Kind::SessionQueue) {
            return Ok((Target::Queue(entity.to_owned()), true));
        }
        match self.inner.target_of(entity, known).await? {
            Some(t) => Ok((t, false)),
            None if self.inner.is_session_queue(entity).await? => Ok((Target::Queue(entity.to_owned()), true)),
            None => Err(Error::new(ErrorKind::EntityNotFound {
                path: entity.to_owned(),
            })),
        }
    }

    /// The receiver of `path` when it is a session queue (which refuses to receive), else
    /// `not_found`, the error of the lookup of a queue of its name.
    pub(super) async fn session_queue_receiver(
        &self,
        path: &EntityPath,
        not_found: Error,
    ) -> Result<Arc<dyn Receiver>> {
        if !matches!(not_found.kind(), ErrorKind::EntityNotFound { .. }) {
            return Err(not_found);
        }
        match session_queue_of(path) {
            Some(queue) if self.inner.is_session_queue(queue).await? => {
                Ok(Arc::new(SessionQueueReceiver(path.clone())))
            }
            _ => Err(not_found),
        }
    }

    /// [`Transport::accept_session`](crate::Transport::accept_session) on RabbitMQ.
    pub(super) async fn accept(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> Result<Arc<dyn SessionReceiver>> {
        path.validate()?;
        self.inner.conn.check_open()?;
        let Some(queue) = session_queue_of(path) else {
            return Err(Error::new(ErrorKind::InvalidOperation {
                reason: format!("{path} has no sessions: only a queue created with requires_session has"),
            }));
        };
        if !self.inner.is_session_queue(queue).await? {
            return Err(match self.path_exists(path).await {
                Ok(()) => Error::new(ErrorKind::InvalidOperation {
                    reason: format!(
                        "{queue} is not a session queue: receive from it, or create one with requires_session"
                    ),
                }),
                Err(e) => e,
            });
        }
        self.inner.accept_session(path, queue, session, max_wait).await
    }

    /// The counts of a session queue: ready messages summed over its partitions (those a
    /// process holds unsettled are not counted), its dead letters, and the scheduled
    /// messages waiting for its partitions.
    pub(super) async fn session_queue_counts(&self, queue: &str) -> Result<EntityCounts> {
        let mut active = 0;
        let mut scheduled = 0;
        for partition in partition_queues(queue) {
            active += self.inner.queue_exists(&partition).await?.unwrap_or(0);
            if let Some(store) = &self.inner.schedules {
                scheduled += store.count(&partition).await?;
            }
        }
        let dead_lettered = self
            .inner
            .queue_exists(&wire::dead_letter_queue(queue))
            .await?
            .unwrap_or(0);
        Ok(EntityCounts {
            active,
            scheduled,
            deferred: 0,
            dead_lettered,
        })
    }

    /// Deletes a session queue: its hub stops, its partitions and dead-letter queue go,
    /// with the scheduled messages waiting for them.
    pub(super) async fn delete_session_queue(&self, queue: &str) -> Result<()> {
        self.inner.stop_hub(queue);
        let mut names = partition_queues(queue);
        names.push(wire::dead_letter_queue(queue));
        let r = self
            .inner
            .on_fresh_channel(|c| async move {
                for name in &names {
                    c.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                        .await?;
                }
                Ok(())
            })
            .await?;
        r.map_err(|e| self.inner.failure("cannot delete a session queue", &e))?;
        self.inner.conn.forget(queue);
        if let Some(store) = &self.inner.schedules {
            for partition in partition_queues(queue) {
                store.delete_for(&partition).await?;
            }
            store.unpark_all(queue).await?;
            store.unrecord(queue).await?;
        }
        Ok(())
    }
}
