//! An endpoint's secret ([`EndpointSecret`]): the key, kept by the store, that seals the
//! count of a delayed retry and the messages of the endpoint's saga timeouts.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::error::{Error, ErrorKind, Result};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use crate::logtext::Escaped;

/// An endpoint's secret ([`Store::endpoint_secret`](super::Store::endpoint_secret)): 32
/// random bytes, the key that seals the count of a delayed retry and each saga timeout's
/// message (`courier::saga::headers::TIMEOUT_SEAL`). Its `Debug` does not show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct EndpointSecret([u8; EndpointSecret::LEN]);

impl EndpointSecret {
    /// The length of a secret, in bytes.
    pub const LEN: usize = 32;

    /// A secret of these bytes.
    pub fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        Self(bytes)
    }

    /// A new secret of random bytes (two version-4 UUIDs: 244 random bits from the
    /// operating system's generator).
    pub fn random() -> Self {
        let mut bytes = [0; Self::LEN];
        bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
        Self(bytes)
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    /// The secret stored for `endpoint` in `table`, or [`ErrorKind::Corrupt`] when it is
    /// not [`LEN`](Self::LEN) bytes.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn stored(bytes: &[u8], table: &str, endpoint: &str) -> Result<Self> {
        <[u8; Self::LEN]>::try_from(bytes).map(Self).map_err(|_| {
            Error::new(ErrorKind::Corrupt {
                detail: format!(
                    "the secret of endpoint {} in {table} has {} bytes, not {}: delete the row and restart the \
                     endpoint's processes to make a new one (messages waiting for a delayed retry then start \
                     their retries again)",
                    Escaped(endpoint),
                    bytes.len(),
                    Self::LEN
                ),
            })
        })
    }
}

impl std::fmt::Debug for EndpointSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EndpointSecret(..)")
    }
}
