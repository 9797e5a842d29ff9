//! Codecs turn typed values into message bodies and back.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// An encoding of message bodies.
pub trait Codec: Send + Sync + 'static {
    /// The MIME type written into the envelope's content type.
    fn content_type(&self) -> &'static str;
    /// Encodes a value.
    ///
    /// # Errors
    /// [`CodecError::Encode`] if the value cannot be encoded.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError>;
    /// Decodes a body.
    ///
    /// # Errors
    /// [`CodecError::Decode`] if the bytes are not a valid `T`.
    fn decode<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, CodecError>;
}

/// JSON through serde_json: the default codec.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl Codec for JsonCodec {
    fn content_type(&self) -> &'static str {
        "application/json"
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|e| CodecError::Encode(Box::new(e)))
    }

    fn decode<T: DeserializeOwned>(&self, body: &[u8]) -> Result<T, CodecError> {
        serde_json::from_slice(body).map_err(|e| CodecError::Decode(Box::new(e)))
    }
}

/// Why a body could not be encoded or decoded. None of these is transient: the same
/// bytes fail the same way again, so a message that does not decode belongs in the
/// dead-letter queue.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The value could not be encoded.
    #[error("cannot encode message body")]
    Encode(#[source] crate::error::BoxError),
    /// The body could not be decoded.
    #[error("cannot decode message body")]
    Decode(#[source] crate::error::BoxError),
    /// The message says it has another content type than this codec reads.
    #[error("content type {found:?} cannot be read by a codec for {expected:?}")]
    ContentTypeMismatch {
        /// The codec's content type.
        expected: String,
        /// The message's content type.
        found: String,
    },
}
