//! Versions of message types and of saga states: a message type's current wire version
//! ([`Message::VERSION`]) travels in the header
//! [`headers::MESSAGE_VERSION`], and a receiver whose type is newer brings an older body
//! up to date with the type's upcaster ([`Message::upcast`]),
//! one version at a time, before it decodes it. A saga's stored state carries the version
//! it was written at ([`Saga::VERSION`](crate::saga::Saga::VERSION)) and is migrated the
//! same way ([`Saga::migrate`](crate::saga::Saga::migrate)) when it is loaded. See
//! `docs/endpoints.md` and `docs/sagas.md`.

use serde_json::Value;

use crate::codec::CodecError;
use crate::endpoint::Failure;
use crate::endpoint::handler::Message;
use crate::endpoint::recoverability::reasons;
use crate::error::BoxError;
use crate::message::{Envelope, PropertyValue};

/// The headers of versioned messages.
pub mod headers {
    /// The wire version of the message's body (an integer from 1). Senders write it for
    /// types whose [`Message::VERSION`](crate::Message::VERSION) is above 1; a message
    /// without it is of version 1.
    pub const MESSAGE_VERSION: &str = "courier.message.version";
}

/// Why a body or a state of an older version could not be brought to the next version:
/// what an upcaster ([`Message::upcast`]) or a saga's migration
/// ([`Saga::migrate`](crate::saga::Saga::migrate)) returns. Neither is transient: the
/// same value fails the same way again, so the message goes to the dead-letter queue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UpcastError {
    /// There is no step from this version (it is too old to be read any more, or the
    /// type never had it).
    #[error("no step from version {from}")]
    Unsupported {
        /// The version the step would start from.
        from: u32,
    },
    /// The value does not have the shape the step expects.
    #[error("the value cannot be upcast")]
    Invalid(#[source] BoxError),
}

impl UpcastError {
    /// No step from version `from`: what an upcaster returns for a version it does not
    /// know.
    pub fn unsupported(from: u32) -> Self {
        Self::Unsupported { from }
    }

    /// The value does not have the expected shape (a missing field, say).
    pub fn invalid(source: impl Into<BoxError>) -> Self {
        Self::Invalid(source.into())
    }
}

impl From<serde_json::Error> for UpcastError {
    fn from(e: serde_json::Error) -> Self {
        Self::Invalid(Box::new(e))
    }
}

/// Stamps `M`'s version on an envelope of it (nothing for version 1, the default).
pub(crate) fn stamp<M: Message>(envelope: &mut Envelope) {
    if M::VERSION > 1 {
        envelope.properties.insert(
            headers::MESSAGE_VERSION.to_owned(),
            PropertyValue::Int(i64::from(M::VERSION)),
        );
    }
}

/// The wire version an envelope declares: its [`headers::MESSAGE_VERSION`], 1 when it has
/// none; `Err` with a description when the header is not a version.
pub(crate) fn message_version(envelope: &Envelope) -> Result<u32, String> {
    let found = match envelope.properties.get(headers::MESSAGE_VERSION) {
        None => return Ok(1),
        Some(PropertyValue::Int(v)) => u32::try_from(*v).ok(),
        Some(PropertyValue::String(s)) => s.trim().parse::<u32>().ok(),
        Some(PropertyValue::Bool(_) | PropertyValue::Float(_)) => None,
    };
    match found {
        Some(v) if v >= 1 => Ok(v),
        _ => Err(format!(
            "its header {} is {:?}, which is not a version (an integer from 1)",
            headers::MESSAGE_VERSION,
            envelope.properties.get(headers::MESSAGE_VERSION)
        )),
    }
}

/// Runs the steps `from` → `from + 1` → ... → `to` of `step` on `value`. `Err` holds the
/// version whose step failed and why.
pub(crate) fn upcast_chain(
    mut value: Value,
    from: u32,
    to: u32,
    step: fn(u32, Value) -> Result<Value, UpcastError>,
) -> Result<Value, (u32, UpcastError)> {
    for v in from..to {
        value = step(v, value).map_err(|e| (v, e))?;
    }
    Ok(value)
}

/// Decodes the received message as an `M`: as it is when it is of `M`'s version, through
/// `M`'s upcasters when it is older. A newer version, an older one without an upcaster, or
/// a header that is not a version fails permanently with
/// [`UNSUPPORTED_MESSAGE_VERSION`](reasons::UNSUPPORTED_MESSAGE_VERSION); a body that does
/// not decode (before or after the upcasters) with
/// [`DESERIALIZATION_FAILED`](reasons::DESERIALIZATION_FAILED).
pub(crate) fn decode_message<M: Message>(envelope: &Envelope) -> Result<M, Failure> {
    let decode_failure = |error: CodecError| Failure::Decode {
        message_type: M::NAME,
        content_type: envelope.content_type.clone(),
        error,
    };
    let unsupported = |text: String| Failure::Version {
        reason: reasons::UNSUPPORTED_MESSAGE_VERSION,
        handler: None,
        chain: vec![text],
    };
    let found =
        message_version(envelope).map_err(|why| unsupported(format!("a {} message cannot be read: {why}", M::NAME)))?;
    if found == M::VERSION {
        return M::from_envelope(envelope).map_err(decode_failure);
    }
    if found > M::VERSION {
        return Err(unsupported(format!(
            "a {} message of version {found} is newer than this code, which knows versions up to {}: deploy the \
             code that sends it to this endpoint too, then move the message back",
            M::NAME,
            M::VERSION
        )));
    }
    let body = M::body_value(envelope).map_err(decode_failure)?;
    let value = upcast_chain(body, found, M::VERSION, M::upcast).map_err(|(at, error)| match error {
        UpcastError::Unsupported { .. } => unsupported(format!(
            "a {} message of version {found} cannot be read: this code knows version {} and its upcaster has no \
             step from version {at} to {}",
            M::NAME,
            M::VERSION,
            at + 1
        )),
        UpcastError::Invalid(source) => {
            let mut chain = vec![format!(
                "cannot upcast a {} message of version {found} to version {}: the step from version {at} failed",
                M::NAME,
                M::VERSION
            )];
            chain.extend(error_chain(&*source));
            Failure::Version {
                reason: reasons::DESERIALIZATION_FAILED,
                handler: None,
                chain,
            }
        }
    })?;
    serde_json::from_value(value).map_err(|e| Failure::Version {
        reason: reasons::DESERIALIZATION_FAILED,
        handler: None,
        chain: vec![
            format!(
                "a {} message of version {found}, upcast to version {}, does not decode",
                M::NAME,
                M::VERSION
            ),
            e.to_string(),
        ],
    })
}

/// An error's text and its causes', outermost first.
pub(crate) fn error_chain(top: &(dyn std::error::Error + 'static)) -> Vec<String> {
    let mut out = vec![top.to_string()];
    let mut next = top.source();
    while let Some(e) = next {
        out.push(e.to_string());
        next = e.source();
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn with_header(value: PropertyValue) -> Envelope {
        Envelope::new("{}").with_property(headers::MESSAGE_VERSION, value)
    }

    #[test]
    fn the_version_header_is_read_and_checked() {
        assert_eq!(message_version(&Envelope::new("{}")), Ok(1), "no header: version 1");
        assert_eq!(message_version(&with_header(PropertyValue::Int(3))), Ok(3));
        assert_eq!(message_version(&with_header("2".into())), Ok(2), "a producer's text");
        for bad in [
            PropertyValue::Int(0),
            PropertyValue::Int(-1),
            PropertyValue::Int(i64::from(u32::MAX) + 1),
            "two".into(),
            PropertyValue::Bool(true),
        ] {
            let err = message_version(&with_header(bad.clone())).expect_err("not a version");
            assert!(err.contains(headers::MESSAGE_VERSION), "{bad:?}: {err}");
        }
    }

    fn step(from: u32, mut v: Value) -> Result<Value, UpcastError> {
        match from {
            1 => {
                v["steps"] = serde_json::json!([1]);
                Ok(v)
            }
            2 => {
                v["steps"]
                    .as_array_mut()
                    .ok_or_else(|| UpcastError::invalid("no steps"))?
                    .push(2.into());
                Ok(v)
            }
            _ => Err(UpcastError::unsupported(from)),
        }
    }

    #[test]
    fn the_steps_run_in_order_from_the_version_found() {
        let v = upcast_chain(serde_json::json!({}), 1, 3, step).unwrap();
        assert_eq!(v, serde_json::json!({"steps": [1, 2]}));
        let err = upcast_chain(serde_json::json!({}), 2, 3, step).expect_err("no steps array");
        assert!(matches!(err, (2, UpcastError::Invalid(_))));
        let err = upcast_chain(serde_json::json!({}), 0, 3, step).expect_err("no step from 0");
        assert!(matches!(err, (0, UpcastError::Unsupported { from: 0 })));
        assert_eq!(
            upcast_chain(serde_json::json!(7), 3, 3, step).unwrap(),
            serde_json::json!(7)
        );
    }
}
