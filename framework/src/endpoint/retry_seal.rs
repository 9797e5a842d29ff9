//! The seal on a delayed retry's count: `courier.retry.delayed` says how many delayed
//! retries a message has had, and any producer can write that property. An endpoint with
//! a store trusts the count only when it carries `courier.retry.seal`, the hex of
//! HMAC-SHA256 under the endpoint's secret ([`Store::endpoint_secret`](crate::Store::endpoint_secret))
//! of the endpoint's name, the message id and the count: what the endpoint itself writes
//! on each delayed retry's copy (`runtime/failures.rs`). A count without a valid seal
//! counts as none, so a producer's count can give a message more retries, never fewer.
//!
//! An endpoint without a store has no secret that its processes share, and trusts the
//! count as it finds it (see `docs/endpoints.md`, "Recoverability").

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::endpoint::recoverability::headers;
use crate::endpoint::trace::hex;
use crate::error::{Error, ErrorKind, Result};
use crate::message::{Properties, PropertyValue};
use crate::store::EndpointSecret;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// HMAC-SHA256 keyed with the endpoint's secret: what the endpoint's seals start from.
///
/// # Errors
/// [`ErrorKind::InvalidOptions`] if HMAC refused the key (it takes keys of any length, so
/// this does not happen).
pub(crate) fn keyed(secret: &EndpointSecret) -> Result<HmacSha256> {
    HmacSha256::new_from_slice(secret.as_bytes()).map_err(|e| {
        Error::new(ErrorKind::InvalidOptions {
            reason: format!("the endpoint's secret is no HMAC-SHA256 key: {e}"),
        })
    })
}

/// What the MAC starts with, so that no other use of the secret can make a seal.
const DOMAIN: &[u8] = b"courier.retry.seal/v1";

/// The length of a seal's text: 32 bytes in hex.
const SEAL_LEN: usize = 64;

/// An endpoint's key for sealing and checking delayed-retry counts.
#[derive(Clone)]
pub(crate) struct RetrySeal {
    /// The MAC keyed with the endpoint's secret, before any input: cloned for each seal.
    keyed: HmacSha256,
}

impl std::fmt::Debug for RetrySeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RetrySeal(..)")
    }
}

impl RetrySeal {
    /// The seal of the endpoint whose secret is `secret`.
    ///
    /// # Errors
    /// [`ErrorKind::InvalidOptions`] if HMAC refused the key (it takes keys of any
    /// length, so this does not happen).
    pub(crate) fn new(secret: &EndpointSecret) -> Result<Self> {
        Ok(Self { keyed: keyed(secret)? })
    }

    /// The MAC of `(endpoint, message_id, n)`, each text preceded by its length so that no
    /// two inputs read the same.
    fn mac(&self, endpoint: &str, message_id: &str, n: u32) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(DOMAIN);
        for field in [endpoint.as_bytes(), message_id.as_bytes()] {
            mac.update(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
            mac.update(field);
        }
        mac.update(&n.to_be_bytes());
        mac
    }

    /// The seal of delayed retry `n` of the message `message_id` at `endpoint`: 64
    /// lowercase hex digits.
    pub(crate) fn seal(&self, endpoint: &str, message_id: &str, n: u32) -> String {
        hex(&self.mac(endpoint, message_id, n).finalize().into_bytes())
    }

    /// Whether `seal` is the seal of `(endpoint, message_id, n)`, compared in constant
    /// time.
    pub(crate) fn verify(&self, endpoint: &str, message_id: &str, n: u32, seal: &str) -> bool {
        match unhex(seal) {
            Some(bytes) => self.mac(endpoint, message_id, n).verify_slice(&bytes).is_ok(),
            None => false,
        }
    }

    /// Writes delayed retry `n`'s count and seal on `properties` (a copy of the message
    /// `message_id` about to be scheduled).
    pub(crate) fn write(&self, properties: &mut Properties, endpoint: &str, message_id: &str, n: u32) {
        properties.insert(headers::DELAYED_RETRIES.to_owned(), PropertyValue::Int(i64::from(n)));
        properties.insert(
            headers::DELAYED_RETRY_SEAL.to_owned(),
            PropertyValue::String(self.seal(endpoint, message_id, n)),
        );
    }
}

/// How many delayed retries a received message has had, as far as the endpoint can tell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Count {
    /// The count to go by: the sealed count (or, with no seal to check, the property as
    /// it is, 0 when absent or not a count).
    Trusted(u32),
    /// A count this endpoint did not seal (none, or a seal for another message, count or
    /// endpoint): the message counts as having had no delayed retry. The property's value.
    Unsealed(PropertyValue),
}

impl Count {
    /// The number of delayed retries to go by.
    pub(crate) fn delayed(&self) -> u32 {
        match self {
            Count::Trusted(n) => *n,
            Count::Unsealed(_) => 0,
        }
    }
}

/// Reads the count of delayed retries on the properties of the message `message_id`
/// received by `endpoint`: checked against its seal when the endpoint has a `seal`, as it
/// is otherwise.
pub(crate) fn read_count(seal: Option<&RetrySeal>, endpoint: &str, message_id: &str, properties: &Properties) -> Count {
    let Some(value) = properties.get(headers::DELAYED_RETRIES) else {
        return Count::Trusted(0);
    };
    let n = match value {
        PropertyValue::Int(n) => u32::try_from(*n).ok(),
        _ => None,
    };
    let Some(seal) = seal else {
        return Count::Trusted(n.unwrap_or(0));
    };
    let sealed = match (n, properties.get(headers::DELAYED_RETRY_SEAL)) {
        (Some(n), Some(PropertyValue::String(s))) if seal.verify(endpoint, message_id, n, s) => Some(n),
        _ => None,
    };
    match sealed {
        Some(n) => Count::Trusted(n),
        None => Count::Unsealed(value.clone()),
    }
}

/// The bytes of a seal's text (64 hex digits, either case), or `None` (the timeout seal's
/// text too: `timeout_seal.rs`).
pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() != SEAL_LEN {
        return None;
    }
    let digit = |c: u8| char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok());
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal() -> RetrySeal {
        RetrySeal::new(&EndpointSecret::from_bytes([7; 32])).unwrap()
    }

    fn props(count: Option<PropertyValue>, seal: Option<&str>) -> Properties {
        let mut p = Properties::new();
        if let Some(c) = count {
            p.insert(headers::DELAYED_RETRIES.into(), c);
        }
        if let Some(s) = seal {
            p.insert(headers::DELAYED_RETRY_SEAL.into(), PropertyValue::String(s.into()));
        }
        p
    }

    #[test]
    fn a_count_the_endpoint_sealed_is_trusted() {
        let s = seal();
        let mut p = Properties::new();
        s.write(&mut p, "sales", "m-1", 2);
        assert_eq!(p.get(headers::DELAYED_RETRIES), Some(&PropertyValue::Int(2)));
        assert_eq!(read_count(Some(&s), "sales", "m-1", &p), Count::Trusted(2));
        // Upper-case hex is the same seal.
        let upper = s.seal("sales", "m-1", 2).to_uppercase();
        let p = props(Some(PropertyValue::Int(2)), Some(&upper));
        assert_eq!(read_count(Some(&s), "sales", "m-1", &p), Count::Trusted(2));
    }

    #[test]
    fn a_forged_count_counts_as_none() {
        let s = seal();
        // No seal at all.
        let p = props(Some(PropertyValue::Int(1000)), None);
        let count = read_count(Some(&s), "sales", "m-1", &p);
        assert_eq!(count, Count::Unsealed(PropertyValue::Int(1000)));
        assert_eq!(count.delayed(), 0);
        // A seal of another count, or garbage, or not a string.
        let other = s.seal("sales", "m-1", 1);
        for seal in [other.as_str(), "", "zz", &"0".repeat(64), &"g".repeat(64)] {
            let p = props(Some(PropertyValue::Int(1000)), Some(seal));
            assert_eq!(read_count(Some(&s), "sales", "m-1", &p).delayed(), 0, "{seal:?}");
        }
        let mut p = props(Some(PropertyValue::Int(1)), None);
        p.insert(headers::DELAYED_RETRY_SEAL.into(), PropertyValue::Int(5));
        assert_eq!(read_count(Some(&s), "sales", "m-1", &p).delayed(), 0);
        // Counts that are no count, sealed or not.
        for value in [
            PropertyValue::Int(-1),
            PropertyValue::Int(i64::MAX),
            PropertyValue::String("2".into()),
        ] {
            let p = props(Some(value.clone()), Some(&other));
            assert_eq!(read_count(Some(&s), "sales", "m-1", &p), Count::Unsealed(value));
        }
    }

    #[test]
    fn a_seal_of_another_message_endpoint_or_secret_does_not_carry_over() {
        let s = seal();
        let theirs = s.seal("sales", "m-2", 3);
        let p = props(Some(PropertyValue::Int(3)), Some(&theirs));
        assert_eq!(read_count(Some(&s), "sales", "m-1", &p).delayed(), 0);
        assert_eq!(read_count(Some(&s), "billing", "m-2", &p).delayed(), 0);
        assert_eq!(read_count(Some(&s), "sales", "m-2", &p), Count::Trusted(3));
        let other_secret = RetrySeal::new(&EndpointSecret::from_bytes([8; 32])).unwrap();
        assert_eq!(read_count(Some(&other_secret), "sales", "m-2", &p).delayed(), 0);
        // The lengths are part of the input: ("ab", "c") is not ("a", "bc").
        assert_ne!(s.seal("ab", "c", 1), s.seal("a", "bc", 1));
    }

    #[test]
    fn without_a_seal_the_count_is_read_as_it_is() {
        let p = props(Some(PropertyValue::Int(1000)), None);
        assert_eq!(read_count(None, "sales", "m-1", &p), Count::Trusted(1000));
        let p = props(Some(PropertyValue::Int(-4)), None);
        assert_eq!(read_count(None, "sales", "m-1", &p), Count::Trusted(0));
        assert_eq!(
            read_count(Some(&seal()), "sales", "m-1", &Properties::new()),
            Count::Trusted(0)
        );
    }

    #[test]
    fn the_seal_is_hmac_sha256_of_the_documented_input() {
        // Pins the input layout: a change makes every waiting retry's seal invalid.
        let s = RetrySeal::new(&EndpointSecret::from_bytes([0; 32])).unwrap();
        let mut mac = HmacSha256::new_from_slice(&[0; 32]).unwrap();
        mac.update(b"courier.retry.seal/v1");
        mac.update(&5u64.to_be_bytes());
        mac.update(b"sales");
        mac.update(&3u64.to_be_bytes());
        mac.update(b"m-1");
        mac.update(&2u32.to_be_bytes());
        assert_eq!(s.seal("sales", "m-1", 2), hex(&mac.finalize().into_bytes()));
        assert_eq!(s.seal("sales", "m-1", 2).len(), SEAL_LEN);
    }
}
