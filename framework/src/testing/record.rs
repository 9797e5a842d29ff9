//! What a [`TestEndpoint`](super::TestEndpoint) records and reports: the handlings that
//! committed, and the messages and saga timeouts read out of them.

use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};

use crate::codec::CodecError;
use crate::endpoint::handler::Message;
use crate::endpoint::observe::{Handled, Observer};
use crate::entity::EntityPath;
use crate::message::Envelope;
use crate::saga::TimeoutHandle;

/// A message a handler sent or published, from a handling that committed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SentMessage {
    /// The queue or topic.
    pub destination: String,
    /// Whether it was published to a topic (an event) rather than sent to a queue.
    pub is_topic: bool,
    /// The message.
    pub envelope: Envelope,
    /// The wire name of the message whose handling sent it.
    pub sent_by: Option<String>,
}

impl SentMessage {
    /// Decodes the body as `M`.
    ///
    /// # Errors
    /// The codec's error if the body is not an `M`.
    pub fn decode<M: Message>(&self) -> std::result::Result<M, CodecError> {
        M::from_envelope(&self.envelope)
    }
}

/// Where a requested saga timeout stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutStatus {
    /// Stored, not yet handled.
    Pending,
    /// Handled by the saga's timeout handler.
    Fired,
    /// Cancelled (`cancel_timeout`, `cancel_timeout_keyed`, `cancel_timeout_handle`) or
    /// dropped with its completed saga: it will never be handled.
    Cancelled,
    /// Replaced by a timeout requested later under the same key (by default, of the same
    /// message type): it will never be handled.
    Replaced,
    /// Its message was dead-lettered (its handler failed for good, or its retries ran
    /// out): the dispatcher never sends it again, so it will not fire unless its dead
    /// letter is sent back to the endpoint's queue (then it is handled, and `Fired`).
    /// Counted in [`EndpointStats::timeouts_dead_lettered`](crate::EndpointStats), not in
    /// [`pending_timeouts`](super::TestEndpoint::pending_timeouts).
    DeadLettered,
}

/// A timeout a saga requested, from a handling that committed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RecordedTimeout {
    /// The handle the saga got.
    pub handle: TimeoutHandle,
    /// The key it was requested under (by default its message's wire name).
    pub key: Option<String>,
    /// The saga type's name.
    pub saga: &'static str,
    /// The instance's correlation value.
    pub correlation: String,
    /// When it is (or was) due.
    pub due: DateTime<Utc>,
    /// Where it stands.
    pub status: TimeoutStatus,
    /// Its message arrived after it was cancelled and was discarded, never handled.
    pub discarded: bool,
    /// Why its message was dead-lettered (`courier.RetriesExhausted`, ...), when its
    /// status is [`TimeoutStatus::DeadLettered`].
    pub dead_letter_reason: Option<String>,
    /// The timeout's message.
    pub envelope: Envelope,
}

impl RecordedTimeout {
    /// The wire name of the timeout's message.
    pub fn message_type(&self) -> Option<&str> {
        self.envelope.message_type.as_deref()
    }

    /// Decodes the timeout's message as `M`.
    ///
    /// # Errors
    /// The codec's error if it is not an `M`.
    pub fn decode<M: Message>(&self) -> std::result::Result<M, CodecError> {
        M::from_envelope(&self.envelope)
    }
}

/// A message in the dead-letter queue of one of the endpoint's sources.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The dead-letter queue it is in.
    pub path: EntityPath,
    /// The message.
    pub envelope: Envelope,
    /// Why it was dead-lettered (`courier.RetriesExhausted`, ...).
    pub reason: Option<String>,
    /// The failure, in words.
    pub description: Option<String>,
}

/// The handlings that committed, as the endpoint reported them.
#[derive(Default)]
pub(super) struct Recorder {
    handled: Mutex<Vec<Handled>>,
}

impl Recorder {
    /// A copy of what was recorded, in order.
    pub(super) fn handlings(&self) -> Vec<Handled> {
        self.handled.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Observer for Recorder {
    fn handled(&self, handled: Handled) {
        self.handled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handled);
    }
}

/// Every message sent or published by `handlings`, in order.
pub(super) fn messages(handlings: Vec<Handled>) -> Vec<SentMessage> {
    handlings
        .into_iter()
        .flat_map(|h| {
            let sent_by = h.message.message_type.clone();
            h.outgoing
                .into_iter()
                .map(move |(destination, is_topic, envelope)| SentMessage {
                    destination,
                    is_topic,
                    envelope,
                    sent_by: sent_by.clone(),
                })
        })
        .collect()
}

/// Every saga timeout requested in `handlings`, in the order requested, with where it
/// stands after them.
pub(super) fn timeouts(handlings: Vec<Handled>) -> Vec<RecordedTimeout> {
    let mut timeouts: Vec<RecordedTimeout> = Vec::new();
    for handled in handlings {
        for e in handled.sagas {
            if let Some(id) = &e.fired
                && let Some(t) = timeouts.iter_mut().find(|t| t.handle.as_str() == id)
            {
                t.status = TimeoutStatus::Fired;
            }
            if let Some(id) = &e.discarded
                && let Some(t) = timeouts.iter_mut().find(|t| t.handle.as_str() == id)
            {
                t.discarded = true;
            }
            for key in &e.cancelled_keys {
                let replaced = e.requested.iter().any(|r| r.key.as_ref() == Some(key));
                timeouts
                    .iter_mut()
                    .filter(|t| t.saga == e.saga_type && t.correlation == e.correlation && t.key.as_ref() == Some(key))
                    .for_each(|t| {
                        if t.status == TimeoutStatus::Pending {
                            t.status = if replaced {
                                TimeoutStatus::Replaced
                            } else {
                                TimeoutStatus::Cancelled
                            };
                        }
                    });
            }
            for r in e.requested {
                timeouts.push(RecordedTimeout {
                    handle: TimeoutHandle::from_id(r.id),
                    key: r.key,
                    saga: e.saga_type,
                    correlation: e.correlation.clone(),
                    due: r.due,
                    status: TimeoutStatus::Pending,
                    discarded: false,
                    dead_letter_reason: None,
                    envelope: r.envelope,
                });
            }
            for id in &e.cancelled {
                if let Some(t) = timeouts.iter_mut().find(|t| t.handle.as_str() == id) {
                    cancel(t);
                }
            }
            if e.completed {
                timeouts
                    .iter_mut()
                    .filter(|t| t.saga == e.saga_type && t.correlation == e.correlation)
                    .for_each(cancel);
            }
        }
    }
    timeouts
}

fn cancel(t: &mut RecordedTimeout) {
    if t.status == TimeoutStatus::Pending {
        t.status = TimeoutStatus::Cancelled;
    }
}
