//! What an endpoint reports, after each handling whose transaction committed, to an
//! observer: the messages the handling sent and what it did to saga instances and their
//! timeouts. `courier::testing` is the observer; without one, nothing is collected.

use chrono::{DateTime, Utc};

use crate::message::Envelope;

/// A timeout a saga requested.
#[derive(Debug, Clone)]
pub(crate) struct RequestedTimeout {
    pub(crate) id: String,
    pub(crate) key: Option<String>,
    pub(crate) due: DateTime<Utc>,
    pub(crate) envelope: Envelope,
}

/// What one saga handler did to its instance.
#[derive(Debug, Clone, Default)]
pub(crate) struct SagaEffects {
    pub(crate) saga_type: &'static str,
    pub(crate) correlation: String,
    pub(crate) completed: bool,
    pub(crate) requested: Vec<RequestedTimeout>,
    pub(crate) cancelled: Vec<String>,
    /// Keys whose pending timeout was cancelled, or replaced by one in `requested`.
    pub(crate) cancelled_keys: Vec<String>,
    /// The timeout this message was, handled.
    pub(crate) fired: Option<String>,
    /// The timeout this message was, discarded (cancelled or its saga completed before).
    pub(crate) discarded: Option<String>,
    /// The state before, as JSON (none for a new instance, or a timeout discarded).
    pub(crate) before: Option<String>,
    /// The state after, as JSON.
    pub(crate) after: Option<String>,
}

/// One committed handling.
#[derive(Debug, Clone)]
pub(crate) struct Handled {
    /// The handled message.
    pub(crate) message: Envelope,
    /// What it sent: (destination, is a topic, envelope).
    pub(crate) outgoing: Vec<(String, bool, Envelope)>,
    pub(crate) sagas: Vec<SagaEffects>,
}

/// Told about every committed handling of an endpoint with a store.
pub(crate) trait Observer: Send + Sync + 'static {
    fn handled(&self, handled: Handled);
}
