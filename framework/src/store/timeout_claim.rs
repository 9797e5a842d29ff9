//! The timeout dispatcher's claim of due saga timeouts ([`Store::claim_due_timeouts`](super::Store::claim_due_timeouts)):
//! what it asks ([`TimeoutClaim`]), what a store hands back ([`DueTimeouts`]), and each
//! timeout it took as the endpoint's history tells of it ([`TakenTimeout`]).

use chrono::{DateTime, Utc};

use crate::message::Envelope;

/// Which timeouts [`Store::claim_due_timeouts`](super::Store::claim_due_timeouts) takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeoutClaim {
    /// The time of the claim. A store that enqueues the messages in the claiming
    /// transaction marks the claimed rows dispatched at it.
    pub now: DateTime<Utc>,
    /// What a store that hands the messages back for sending (in
    /// [`DueTimeouts::to_send`]) marks the claimed rows with instead: a time before `now`,
    /// so that a claim whose send is never confirmed ([`Store::timeouts_sent`](super::Store::timeouts_sent): the
    /// dispatcher died, or its connection did, between the claim and the send) is taken
    /// again after a short lease instead of the whole reclaim wait.
    pub marked_at: DateTime<Utc>,
    /// Unclaimed timeouts due at or before this are taken: those due after `now` are sent
    /// as scheduled messages for their due time, so that the broker, not a polling loop,
    /// delivers them on time.
    pub due_until: DateTime<Utc>,
    /// Claimed timeouts whose message was not handled and that were claimed before this
    /// are taken again (their dispatch may have been lost).
    pub reclaim_before: DateTime<Utc>,
    /// The most taken.
    pub limit: i64,
    /// The most times a timeout is sent. A taken timeout already sent this many times
    /// is not sent again: its row is marked dead-lettered at `now` with the reason
    /// [`TIMEOUT_DISPATCHES_EXHAUSTED`](crate::recoverability::reasons::TIMEOUT_DISPATCHES_EXHAUSTED)
    /// (the state an endpoint's dead-lettering of its message sets) and its id returned
    /// in [`DueTimeouts::dead_lettered`]. This bounds a timeout whose message the broker
    /// dead-letters by itself (its max delivery count reached) and which no endpoint
    /// therefore settles. A claim whose send failed ([`Store::unclaim_timeouts`](super::Store::unclaim_timeouts)) does not
    /// count. At least 1.
    pub max_dispatches: u32,
    /// Whether the endpoint receives from the broker in the store's own database
    /// ([`Store::unit_of_work_scope`](super::Store::unit_of_work_scope) said so when it started): such a store enqueues the
    /// claimed timeouts' messages in the claiming transaction and hands nothing back
    /// (the embedded broker's store always does). Otherwise the messages are handed
    /// back in [`DueTimeouts::to_send`].
    pub enqueue: bool,
    /// Whether the endpoint keeps a history
    /// ([`EndpointBuilder::history`](crate::EndpointBuilder::history)). A store that
    /// enqueues the claimed timeouts' messages in the claiming transaction writes their
    /// events there too (so an event is exactly as committed as its dispatch) and says so
    /// in [`DueTimeouts::recorded`]; otherwise the endpoint writes them after the send.
    pub history: bool,
}

impl TimeoutClaim {
    /// Marks an envelope of a timeout due at `due` for delivery at that time when it is
    /// still in the future.
    pub(crate) fn schedule(&self, mut envelope: Envelope, due: DateTime<Utc>) -> Envelope {
        if due > self.now {
            envelope.scheduled_enqueue_time = Some(due);
        }
        envelope
    }
}

/// Due timeouts a store claimed for dispatch.
#[derive(Debug, Default)]
pub struct DueTimeouts {
    /// How many were claimed to be sent.
    pub claimed: usize,
    /// Their messages, to send to the endpoint's queue; empty when the store enqueued
    /// them itself in the claiming transaction (a store in the broker's own database).
    pub to_send: Vec<Envelope>,
    /// The ids of taken timeouts that had been sent
    /// [`TimeoutClaim::max_dispatches`] times already: marked dead-lettered instead of
    /// sent.
    pub dead_lettered: Vec<String>,
    /// Every timeout taken (sent, or marked dead-lettered), as the endpoint's history
    /// tells of it; a store may leave it empty (the endpoint then records no event).
    pub taken: Vec<TakenTimeout>,
    /// The history's events of the taken timeouts were written in the claiming
    /// transaction (see [`TimeoutClaim::history`]): the endpoint writes none.
    pub recorded: bool,
}

/// What a claim of due timeouts took (the stores' claims share it): the messages to
/// send, the ids of the rows marked dead-lettered instead, and every row taken.
#[derive(Debug, Default)]
pub(crate) struct Claimed {
    pub(crate) due: Vec<Envelope>,
    pub(crate) dead_lettered: Vec<String>,
    pub(crate) taken: Vec<TakenTimeout>,
}

impl TakenTimeout {
    /// The row of a claim: `envelope` is its stored message (for its type, conversation
    /// and causation).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn of_row(
        id: String,
        saga_type: String,
        correlation: String,
        key: Option<String>,
        due: DateTime<Utc>,
        dispatches: i64,
        dead_lettered: bool,
        envelope: &Envelope,
    ) -> Self {
        Self {
            id,
            saga_type,
            correlation,
            key,
            due,
            dispatches: u32::try_from(dispatches.max(0)).unwrap_or(u32::MAX),
            dead_lettered,
            message_type: envelope.message_type.clone(),
            conversation_id: envelope.correlation_id.clone(),
            causation_id: envelope.causation_id.clone(),
        }
    }
}

/// A timeout [`Store::claim_due_timeouts`](super::Store::claim_due_timeouts) took, as the endpoint's history tells of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenTimeout {
    /// Its id (its message's id).
    pub id: String,
    /// The saga's name.
    pub saga_type: String,
    /// The instance's correlation.
    pub correlation: String,
    /// The key it was requested under.
    pub key: Option<String>,
    /// When it fell due.
    pub due: DateTime<Utc>,
    /// How many times it has been sent, this claim's included.
    pub dispatches: u32,
    /// Marked dead-lettered instead of sent (sent its most times already).
    pub dead_lettered: bool,
    /// Its message's type, conversation (correlation id) and causation id.
    pub message_type: Option<String>,
    /// The conversation it belongs to.
    pub conversation_id: Option<String>,
    /// The message whose handling requested it.
    pub causation_id: Option<String>,
}
