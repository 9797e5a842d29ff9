//! What a timeout's row learns when its message leaves the queue other than by being
//! handled: it was dead-lettered (the row is marked and never sent again), or it waits
//! for a delayed retry (the dispatcher must not take the claim back meanwhile and send a
//! second copy). Without this, a timeout whose handler keeps failing fires forever: the
//! dispatcher reclaims its row after a while and sends it again.
//!
//! The endpoint's failure path (`failures.rs`) calls these; the saga module only writes
//! the header they read ([`TIMEOUT_ID`]) when it requests a timeout. Only a copy the
//! endpoint's dispatcher sealed names its row (`endpoint/timeout_seal.rs`): a forged
//! copy that carries a real timeout's id and is dead-lettered (as forged, or as an
//! unknown type, or for any reason) must not mark that row, or the real timeout would
//! never fire.

use chrono::{DateTime, Utc};

use crate::endpoint::recoverability::reasons;
use crate::endpoint::timeout_seal::{TimeoutSeal, sealed_timeout_id};
use crate::logtext::Escaped;
use crate::message::Envelope;
use crate::store::Store;

/// The header of a saga timeout's message that holds the timeout's id (also its message
/// id); public as `courier::saga::headers::TIMEOUT_ID`.
pub(crate) const TIMEOUT_ID: &str = "courier.saga.timeout";

/// The timeout id a message carries, if it is the message of a saga timeout of
/// `endpoint` that its dispatcher sent (checked with `seal`; without one, the id as it
/// is found).
pub(crate) fn timeout_id<'a>(seal: Option<&TimeoutSeal>, endpoint: &str, envelope: &'a Envelope) -> Option<&'a str> {
    sealed_timeout_id(seal, endpoint, envelope)
}

/// The timeout message `envelope` of `endpoint` is about to be dead-lettered with
/// `reason`: marks its row so the dispatcher never sends it again. Returns whether a row
/// was marked. A failure is logged, not returned: the dead-lettering goes on (a message
/// must not stay in the queue because the store is down); the row may then be sent
/// again once, after the dispatcher's reclaim wait. A copy refused as forged or early
/// marks nothing (the timeout still fires), nor does one the dispatcher did not seal.
pub(crate) async fn dead_lettered(
    store: &dyn Store,
    seal: Option<&TimeoutSeal>,
    endpoint: &str,
    envelope: &Envelope,
    reason: &str,
    now: DateTime<Utc>,
) -> bool {
    if reason == reasons::FORGED_TIMEOUT || reason == reasons::EARLY_TIMEOUT {
        return false;
    }
    let Some(id) = timeout_id(seal, endpoint, envelope) else {
        return false;
    };
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
pub(crate) async fn retry_scheduled(
    store: &dyn Store,
    seal: Option<&TimeoutSeal>,
    endpoint: &str,
    envelope: &Envelope,
    at: DateTime<Utc>,
) {
    let Some(id) = timeout_id(seal, endpoint, envelope) else {
        return;
    };
    if let Err(e) = store.postpone_timeout_reclaim(endpoint, id, at).await {
        tracing::warn!(timeout = %Escaped(id), error = %e,
            "could not postpone the saga timeout's reclaim; a second copy may be sent while it waits");
    }
}
