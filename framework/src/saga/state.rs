//! A saga instance's stored state, read back: checked against the saga's version and
//! migrated ([`Saga::migrate`]) when it was stored at an older one, before it is decoded.

use super::Saga;
use crate::endpoint::version::{UpcastError, error_chain, upcast_chain};
use crate::store::StoredSaga;

/// Why a stored state could not be read.
#[derive(Debug)]
pub(crate) enum StateError {
    /// Stored at a version this code cannot read (newer, or older without a migration).
    Unsupported(Vec<String>),
    /// Of this version (or migrated to it) but not a valid state.
    Corrupt(Vec<String>),
}

impl StateError {
    /// The texts of the error, outermost first.
    pub(crate) fn chain(&self) -> &[String] {
        match self {
            StateError::Unsupported(c) | StateError::Corrupt(c) => c,
        }
    }
}

/// Decodes the stored state of instance `correlation` of `S`, migrated to `S::VERSION`
/// when it is older.
pub(crate) fn decode_state<S: Saga>(stored: &StoredSaga, correlation: &str) -> Result<S, StateError> {
    let instance = || format!("saga {} instance {correlation:?}", S::NAME);
    let found = match u32::try_from(stored.state_version) {
        Ok(v) if v >= 1 => v,
        _ => {
            return Err(StateError::Unsupported(vec![format!(
                "the stored state of {} has state_version {}, which is not a version (an integer from 1)",
                instance(),
                stored.state_version
            )]));
        }
    };
    if found > S::VERSION {
        return Err(StateError::Unsupported(vec![format!(
            "the stored state of {} is of version {found}, newer than this code, which knows versions up to {}: \
             it was written by newer code; deploy that code (or roll the instance back to a version this code \
             knows), then move the message back. It is not decoded, so it is never read wrongly",
            instance(),
            S::VERSION
        )]));
    }
    if found == S::VERSION {
        return serde_json::from_str(&stored.state).map_err(|e| {
            StateError::Corrupt(vec![format!("the stored state of {} does not decode: {e}", instance())])
        });
    }
    let value: serde_json::Value = serde_json::from_str(&stored.state).map_err(|e| {
        StateError::Corrupt(vec![format!(
            "the stored state of {} (version {found}) is not JSON: {e}",
            instance()
        )])
    })?;
    let migrated = upcast_chain(value, found, S::VERSION, S::migrate).map_err(|(at, error)| match error {
        UpcastError::Unsupported { .. } => StateError::Unsupported(vec![format!(
            "the stored state of {} is of version {found}; this code knows version {} and its migration has no \
             step from version {at} to {}",
            instance(),
            S::VERSION,
            at + 1
        )]),
        UpcastError::Invalid(source) => {
            let mut chain = vec![format!(
                "the stored state of {} cannot be migrated from version {found} to {}: the step from version {at} \
                 failed",
                instance(),
                S::VERSION
            )];
            chain.extend(error_chain(&*source));
            StateError::Unsupported(chain)
        }
    })?;
    serde_json::from_value(migrated).map_err(|e| {
        StateError::Corrupt(vec![format!(
            "the stored state of {}, migrated from version {found} to {}, does not decode: {e}",
            instance(),
            S::VERSION
        )])
    })
}
