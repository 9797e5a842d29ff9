//! The seal on a saga's "try again later" copy of a message that found no instance.
//!
//! A saga can retry a continuing message that finds no instance later
//! (`SagaOptions::retry_not_found`): the endpoint sends a copy of it to its own queue,
//! scheduled after the delay, with a new message id and three headers:
//! [`NOT_FOUND_RETRIES`] (how many times the message was tried again, from 1),
//! [`NOT_FOUND_SAGA`] (the saga that tries it again: only that saga's handler runs on the
//! copy, the endpoint's other handlers of the type ran on the first arrival) and
//! [`NOT_FOUND_SEAL`]: the hex of HMAC-SHA256 under the endpoint's secret (the key of the
//! delayed-retry and timeout seals, under a domain of its own) of the endpoint's name, the
//! copy's message id, its type and body, the saga's name and the count, each text preceded
//! by its length.
//!
//! Any producer can write the headers; the endpoint trusts them only with a valid seal. A
//! copy whose seal does not check counts as a first arrival (its count 0, run by every
//! handler of its type): a producer's headers can neither stop a message from being tried
//! nor keep it from the other handlers. The count cannot be turned back either: the seal
//! binds the message id, and a sealed copy sent again is a duplicate the inbox drops. So
//! each message is tried at most the saga's limit of times, then dead-lettered (or given
//! to its not-found handler).
//!
//! An endpoint whose store keeps no secret takes the headers as they are (as it does the
//! delayed-retry count, see `retry_seal.rs`).

use hmac::Mac;

use crate::endpoint::retry_seal::{HmacSha256, unhex};
use crate::endpoint::trace::hex;
use crate::message::{Envelope, PropertyValue};

/// The header with the number of the try: 1 on the first copy sent again.
pub(crate) const NOT_FOUND_RETRIES: &str = "courier.saga.not_found_retries";
/// The header with the name of the saga whose handler runs on the copy.
pub(crate) const NOT_FOUND_SAGA: &str = "courier.saga.not_found_saga";
/// The header with the seal of the two above.
pub(crate) const NOT_FOUND_SEAL: &str = "courier.saga.not_found_seal";

/// What the MAC starts with: no other use of the endpoint's secret makes this seal.
const DOMAIN: &[u8] = b"courier.saga.not_found_seal/v1";

/// A copy of a message that a saga tries again, as the endpoint reads its headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retry {
    /// The saga that tries it again.
    pub(crate) saga: String,
    /// The number of the try (1 on the first copy).
    pub(crate) n: u32,
}

fn mac(keyed: &HmacSha256, endpoint: &str, envelope: &Envelope, saga: &str, n: u32) -> HmacSha256 {
    let mut mac = keyed.clone();
    mac.update(DOMAIN);
    let message_type = envelope.message_type.as_deref().unwrap_or_default();
    for field in [
        endpoint.as_bytes(),
        envelope.message_id.as_bytes(),
        message_type.as_bytes(),
        &envelope.body[..],
        saga.as_bytes(),
    ] {
        mac.update(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
        mac.update(field);
    }
    mac.update(&n.to_be_bytes());
    mac
}

/// Writes try `n` of `saga` on `envelope` (the copy, with its new message id and final
/// body), sealed with `keyed` when the endpoint has a secret.
pub(crate) fn write(keyed: Option<&HmacSha256>, endpoint: &str, envelope: &mut Envelope, saga: &str, n: u32) {
    let p = &mut envelope.properties;
    p.insert(NOT_FOUND_RETRIES.to_owned(), PropertyValue::Int(i64::from(n)));
    p.insert(NOT_FOUND_SAGA.to_owned(), PropertyValue::String(saga.to_owned()));
    p.remove(NOT_FOUND_SEAL);
    if let Some(keyed) = keyed {
        let seal = hex(&mac(keyed, endpoint, envelope, saga, n).finalize().into_bytes());
        envelope
            .properties
            .insert(NOT_FOUND_SEAL.to_owned(), PropertyValue::String(seal));
    }
}

/// The try `envelope` is, when it is a copy the endpoint sent again and sealed (with no
/// secret to check, when it has the headers); `None` for anything else, a first arrival.
pub(crate) fn read(keyed: Option<&HmacSha256>, endpoint: &str, envelope: &Envelope) -> Option<Retry> {
    let n = match envelope.properties.get(NOT_FOUND_RETRIES)? {
        PropertyValue::Int(n) => u32::try_from(*n).ok().filter(|n| *n > 0)?,
        _ => return None,
    };
    let saga = match envelope.properties.get(NOT_FOUND_SAGA)? {
        PropertyValue::String(s) => s.clone(),
        _ => return None,
    };
    if let Some(keyed) = keyed {
        let Some(PropertyValue::String(seal)) = envelope.properties.get(NOT_FOUND_SEAL) else {
            return None;
        };
        let bytes = unhex(seal)?;
        mac(keyed, endpoint, envelope, &saga, n).verify_slice(&bytes).ok()?;
    }
    Some(Retry { saga, n })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::EndpointSecret;

    fn keyed(byte: u8) -> HmacSha256 {
        crate::endpoint::retry_seal::keyed(&EndpointSecret::from_bytes([byte; 32])).unwrap()
    }

    fn copy() -> Envelope {
        let mut e = Envelope::new(&b"{\"id\":\"o-1\"}"[..]).with_message_id("m-2");
        e.message_type = Some("shop.PaymentCaptured".into());
        e
    }

    #[test]
    fn the_endpoints_copy_is_read_back() {
        let k = keyed(7);
        let mut e = copy();
        write(Some(&k), "shop", &mut e, "shop.Order", 3);
        let want = Some(Retry {
            saga: "shop.Order".into(),
            n: 3,
        });
        assert_eq!(read(Some(&k), "shop", &e), want);
        // Without a secret: the headers as they are.
        let mut plain = copy();
        write(None, "shop", &mut plain, "shop.Order", 3);
        assert!(!plain.properties.contains_key(NOT_FOUND_SEAL));
        assert_eq!(read(None, "shop", &plain), want);
        assert_eq!(read(Some(&k), "shop", &plain), None, "a secret wants a seal");
    }

    #[test]
    fn a_changed_copy_is_a_first_arrival() {
        let k = keyed(7);
        let mut sealed = copy();
        write(Some(&k), "shop", &mut sealed, "shop.Order", 3);
        type Change = Box<dyn Fn(&mut Envelope)>;
        let changes: Vec<Change> = vec![
            Box::new(|e| drop(e.properties.insert(NOT_FOUND_RETRIES.into(), PropertyValue::Int(1)))),
            Box::new(|e| drop(e.properties.insert(NOT_FOUND_RETRIES.into(), PropertyValue::Int(0)))),
            Box::new(|e| drop(e.properties.insert(NOT_FOUND_RETRIES.into(), PropertyValue::Int(-3)))),
            Box::new(|e| {
                drop(
                    e.properties
                        .insert(NOT_FOUND_RETRIES.into(), PropertyValue::String("3".into())),
                )
            }),
            Box::new(|e| {
                drop(
                    e.properties
                        .insert(NOT_FOUND_SAGA.into(), PropertyValue::String("x".into())),
                )
            }),
            Box::new(|e| {
                drop(
                    e.properties
                        .insert(NOT_FOUND_SEAL.into(), PropertyValue::String("0".repeat(64))),
                )
            }),
            Box::new(|e| drop(e.properties.insert(NOT_FOUND_SEAL.into(), PropertyValue::Int(1)))),
            Box::new(|e| drop(e.properties.remove(NOT_FOUND_SEAL))),
            Box::new(|e| e.message_id = "m-3".into()),
            Box::new(|e| e.body = b"{\"id\":\"o-2\"}".to_vec().into()),
            Box::new(|e| e.message_type = Some("shop.Other".into())),
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut e = sealed.clone();
            change(&mut e);
            assert_eq!(read(Some(&k), "shop", &e), None, "change {i}");
        }
        assert_eq!(read(Some(&k), "billing", &sealed), None, "another endpoint");
        assert_eq!(read(Some(&keyed(8)), "shop", &sealed), None, "another secret");
        assert_eq!(read(Some(&k), "shop", &copy()), None, "no headers");
    }

    #[test]
    fn the_seal_is_hmac_sha256_of_the_documented_input() {
        let k = keyed(0);
        let mut e = copy();
        write(Some(&k), "shop", &mut e, "S", 2);
        let mut m = HmacSha256::new_from_slice(&[0; 32]).unwrap();
        m.update(b"courier.saga.not_found_seal/v1");
        for field in [&b"shop"[..], b"m-2", b"shop.PaymentCaptured", b"{\"id\":\"o-1\"}", b"S"] {
            m.update(&(field.len() as u64).to_be_bytes());
            m.update(field);
        }
        m.update(&2u32.to_be_bytes());
        assert_eq!(
            e.properties.get(NOT_FOUND_SEAL),
            Some(&PropertyValue::String(hex(&m.finalize().into_bytes())))
        );
    }
}
