//! What a timeout's row learns when its message leaves the queue other than by being
//! handled: it was dead-lettered (the row is marked and never sent again), or it waits
//! for a delayed retry (the dispatcher must not take the claim back meanwhile and send a
//! second copy). Without this, a timeout whose handler keeps failing fires forever: the
//! dispatcher reclaims its row after a while and sends it again.
//!
//! The endpoint's failure path (`failures.rs`) calls these; the saga module only writes
//! the header they read ([`TIMEOUT_ID`]) when it requests a timeout.

use chrono::{DateTime, Utc};

use crate::logtext::Escaped;
use crate::message::{Envelope, PropertyValue};
use crate::store::Store;

/// The header of a saga timeout's message that holds the timeout's id (also its message
/// id); public as `courier::saga::headers::TIMEOUT_ID`.
pub(crate) const TIMEOUT_ID: &str = "courier.saga.timeout";

/// The timeout id a message carries, if it is a saga timeout's.
pub(crate) fn timeout_id(envelope: &Envelope) -> Option<&str> {
    match envelope.properties.get(TIMEOUT_ID) {
        Some(PropertyValue::String(id)) => Some(id),
        _ => None,
    }
}

/// The timeout message `envelope` of `endpoint` is about to be dead-lettered with
/// `reason`: marks its row so the dispatcher never sends it again. Returns whether a row
/// was marked. A failure is logged, not returned: the dead-lettering goes on (a message
/// must not stay in the queue because the store is down); the row may then be sent
/// again once, after the dispatcher's reclaim wait.
pub(crate) async fn dead_lettered(
    store: &dyn Store,
    endpoint: &str,
    envelope: &Envelope,
    reason: &str,
    now: DateTime<Utc>,
) -> bool {
    let Some(id) = timeout_id(envelope) else { return false };
    match store.dead_letter_timeout(endpoint, id, reason, now).await {
        Ok(marked) => {
            if marked {
                tracing::warn!(timeout = %Escaped(id), reason, "saga timeout dead-lettered: it will not be sent again \
                    unless its dead letter is resubmitted");
            }
            marked
        }
        Err(e) => {
            tracing::warn!(timeout = %Escaped(id), error = %e,
                "could not mark the dead-lettered saga timeout; it may be sent once more");
            false
        }
    }
}

/// The timeout message `envelope` of `endpoint` waits for a delayed retry due at `at`:
/// the dispatcher keeps its claim until then.
pub(crate) async fn retry_scheduled(store: &dyn Store, endpoint: &str, envelope: &Envelope, at: DateTime<Utc>) {
    let Some(id) = timeout_id(envelope) else { return };
    if let Err(e) = store.postpone_timeout_reclaim(endpoint, id, at).await {
        tracing::warn!(timeout = %Escaped(id), error = %e,
            "could not postpone the saga timeout's reclaim; a second copy may be sent while it waits");
    }
}
