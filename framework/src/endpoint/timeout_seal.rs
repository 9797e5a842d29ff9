//! The proof that a saga timeout's message was sent by the endpoint's timeout dispatcher.
//!
//! A timeout fires when a message of its type arrives with its headers
//! ([`TIMEOUT_ID`](super::TIMEOUT_ID), [`SAGA_TYPE`], [`CORRELATION`], [`TIMEOUT_DUE`]).
//! A timeout's id is not secret (`courier timeouts`, the console and the logs show it),
//! so any producer that can write to the endpoint's queue could make such a message and
//! fire the timeout at once: a one-hour confirmation expired an hour early. So the store,
//! when it claims a due timeout for dispatch, writes [`TIMEOUT_SEAL`] on its message: the
//! hex of HMAC-SHA256 under the endpoint's secret
//! ([`Store::endpoint_secret`](crate::Store::endpoint_secret), the key of the delayed-retry
//! seal too, under another domain) of the endpoint's name, the timeout's id, the message id
//! and type, the saga type, the correlation, the due time and the body. The endpoint
//! checks it before a saga handles the timeout ([`judge`]); a copy without a valid seal is
//! dead-lettered as forged, one with a valid seal that arrives before its due time (by
//! the endpoint's clock) as early, and neither touches the timeout's row.
//!
//! Sealed at the claim, not when the timeout is requested: nothing secret is stored with
//! the row (which `courier timeouts` and the admin API read), timeouts stored by a version
//! without seals are sealed when they are sent, and the dispatcher's every path (a store
//! that enqueues in its claiming transaction, or one that hands the messages back) goes
//! through the claim (`store/sqlite_saga.rs`, `store/postgres.rs`).

use chrono::{DateTime, SecondsFormat, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::checks::quoted;
use crate::endpoint::retry_seal::unhex;
use crate::endpoint::trace::hex;
use crate::error::Result;
use crate::message::{Envelope, PropertyValue};
use crate::store::EndpointSecret;

use super::TIMEOUT_ID;

type HmacSha256 = Hmac<Sha256>;

/// The header of a timeout's message that names its saga type; public as
/// `courier::saga::headers::SAGA_TYPE`.
pub(crate) const SAGA_TYPE: &str = "courier.saga.type";
/// The header that holds the instance's correlation value; public as
/// `courier::saga::headers::CORRELATION`.
pub(crate) const CORRELATION: &str = "courier.saga.correlation";
/// The header that holds the timeout's due time (RFC 3339, UTC, microseconds); public as
/// `courier::saga::headers::TIMEOUT_DUE`.
pub(crate) const TIMEOUT_DUE: &str = "courier.saga.timeout_due";
/// The header that holds the seal; public as `courier::saga::headers::TIMEOUT_SEAL`.
pub(crate) const TIMEOUT_SEAL: &str = "courier.saga.timeout_seal";

/// What the MAC starts with, so that no other use of the secret (the delayed-retry
/// seal's domain is `courier.retry.seal/v1`) can make a timeout seal.
const DOMAIN: &[u8] = b"courier.saga.timeout_seal/v1";

/// An endpoint's key for sealing and checking its timeouts' messages.
#[derive(Clone)]
pub(crate) struct TimeoutSeal {
    /// The MAC keyed with the endpoint's secret, before any input: cloned for each seal.
    keyed: HmacSha256,
}

impl std::fmt::Debug for TimeoutSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TimeoutSeal(..)")
    }
}

/// What a timeout's message says about itself: the input of its seal.
struct Claimed<'a> {
    timeout_id: &'a str,
    saga_type: &'a str,
    correlation: &'a str,
    /// The due time, in microseconds since the epoch.
    due: i64,
}

/// The text of the header `name` of `envelope`, if it is a string.
fn text<'a>(envelope: &'a Envelope, name: &str) -> Option<&'a str> {
    match envelope.properties.get(name) {
        Some(PropertyValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The due time a [`TIMEOUT_DUE`] text names, in microseconds.
fn parse_due(text: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|d| d.with_timezone(&Utc).timestamp_micros())
}

impl<'a> Claimed<'a> {
    /// The timeout headers of `envelope`, all of them strings and the due time a time.
    fn of(envelope: &'a Envelope) -> Option<Self> {
        Some(Self {
            timeout_id: text(envelope, TIMEOUT_ID)?,
            saga_type: text(envelope, SAGA_TYPE)?,
            correlation: text(envelope, CORRELATION)?,
            due: parse_due(text(envelope, TIMEOUT_DUE)?)?,
        })
    }
}

impl TimeoutSeal {
    /// The seal of the endpoint whose secret is `secret`.
    ///
    /// # Errors
    /// [`crate::ErrorKind::InvalidOptions`] if HMAC refused the key (it takes keys of any
    /// length, so this does not happen).
    pub(crate) fn new(secret: &EndpointSecret) -> Result<Self> {
        Ok(Self {
            keyed: super::retry_seal::keyed(secret)?,
        })
    }

    /// The MAC keyed with the endpoint's secret, before any input: a saga's not-found
    /// retry seal (`not_found_seal.rs`) starts from it too, under its own domain.
    pub(crate) fn keyed(&self) -> &HmacSha256 {
        &self.keyed
    }

    /// The MAC of a timeout's message at `endpoint`: each text and the body preceded by
    /// its length, so that no two inputs read the same.
    fn mac(&self, endpoint: &str, claimed: &Claimed<'_>, envelope: &Envelope) -> Option<HmacSha256> {
        let message_type = envelope.message_type.as_deref()?;
        let mut mac = self.keyed.clone();
        mac.update(DOMAIN);
        for field in [
            endpoint.as_bytes(),
            claimed.timeout_id.as_bytes(),
            envelope.message_id.as_bytes(),
            message_type.as_bytes(),
            claimed.saga_type.as_bytes(),
            claimed.correlation.as_bytes(),
            &envelope.body[..],
        ] {
            mac.update(&u64::try_from(field.len()).unwrap_or(u64::MAX).to_be_bytes());
            mac.update(field);
        }
        mac.update(&claimed.due.to_be_bytes());
        Some(mac)
    }

    /// Seals `envelope`, the message of `endpoint`'s timeout due at `due` that the store
    /// claimed for dispatch: writes its [`TIMEOUT_DUE`] (from the row, the time the
    /// dispatcher schedules it for) and its [`TIMEOUT_SEAL`]. Returns whether it did: a
    /// message without a timeout's headers or a type (a row written by hand) gets no
    /// seal, and is refused as forged when it arrives.
    pub(crate) fn seal(&self, endpoint: &str, envelope: &mut Envelope, due: DateTime<Utc>) -> bool {
        envelope.properties.insert(
            TIMEOUT_DUE.to_owned(),
            PropertyValue::String(due.to_rfc3339_opts(SecondsFormat::Micros, true)),
        );
        let seal = Claimed::of(envelope)
            .and_then(|claimed| self.mac(endpoint, &claimed, envelope))
            .map(|mac| hex(&mac.finalize().into_bytes()));
        match seal {
            Some(seal) => {
                envelope
                    .properties
                    .insert(TIMEOUT_SEAL.to_owned(), PropertyValue::String(seal));
                true
            }
            None => {
                envelope.properties.remove(TIMEOUT_SEAL);
                false
            }
        }
    }

    /// Whether `envelope` carries this endpoint's valid seal of its timeout headers
    /// (compared in constant time); the due time it seals when it does.
    fn verify(&self, endpoint: &str, envelope: &Envelope) -> Option<DateTime<Utc>> {
        let claimed = Claimed::of(envelope)?;
        let seal = unhex(text(envelope, TIMEOUT_SEAL)?)?;
        self.mac(endpoint, &claimed, envelope)?.verify_slice(&seal).ok()?;
        DateTime::from_timestamp_micros(claimed.due)
    }
}

/// What the endpoint makes of a message that reached a saga's timeout handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The dispatcher's copy, due: the timeout may fire.
    Due,
    /// Not the dispatcher's copy (no timeout headers, no seal, a seal of other headers, of
    /// another body or of another endpoint): refused, nothing changes. Why, for the
    /// dead letter's description.
    Forged(String),
    /// The dispatcher's copy, before its due time: refused, nothing changes (the
    /// dispatcher sends the timeout again after its reclaim wait).
    Early {
        /// When it is due.
        due: DateTime<Utc>,
    },
}

/// Judges the message `envelope` that reached a timeout handler of `endpoint` at `now`.
/// With a `seal` (an endpoint whose store keeps a secret) only a copy that carries a
/// valid seal fires; without one (a store that keeps no secret) the headers are taken as
/// they are, and only the due time is checked (early: before the due time's
/// millisecond).
pub(crate) fn judge(seal: Option<&TimeoutSeal>, endpoint: &str, envelope: &Envelope, now: DateTime<Utc>) -> Verdict {
    let message_type = envelope.message_type.as_deref().unwrap_or("(none)");
    let Some(claimed) = Claimed::of(envelope) else {
        let named = match text(envelope, TIMEOUT_ID) {
            Some(id) => format!(" (it names timeout \"{}\")", quoted(id.as_bytes())),
            None => String::new(),
        };
        return Verdict::Forged(format!(
            "a {message_type} message arrived without the headers of one of the endpoint's timeouts{named}: the \
             timeout's id, saga type, correlation and due time, as text, which only its timeout dispatcher writes"
        ));
    };
    let due = match seal {
        Some(seal) => match seal.verify(endpoint, envelope) {
            Some(due) => due,
            None => {
                return Verdict::Forged(format!(
                    "a {message_type} message carries the headers of timeout \"{}\" but not the endpoint's seal of \
                     them ({TIMEOUT_SEAL}): only the copy the timeout dispatcher sends fires a timeout",
                    quoted(claimed.timeout_id.as_bytes())
                ));
            }
        },
        None => match DateTime::from_timestamp_micros(claimed.due) {
            Some(due) => due,
            None => {
                return Verdict::Forged(format!(
                    "a {message_type} message names a due time out of range for timeout \"{}\"",
                    quoted(claimed.timeout_id.as_bytes())
                ));
            }
        },
    };
    // To the millisecond: a scheduler that keeps due times in milliseconds (RabbitMQ's
    // with a SQLite schedule store) delivers at the due time's millisecond, up to 999 µs
    // before the due time itself.
    if now.timestamp_millis() < due.timestamp_millis() {
        Verdict::Early { due }
    } else {
        Verdict::Due
    }
}

/// The id of the timeout whose message `envelope` is, if it is one that this endpoint's
/// dispatcher sent (with no `seal` to check it with, the id as it is found): what the
/// endpoint's failure path marks or postpones. A forged copy names a real timeout's id,
/// and must not mark its row dead-lettered (the real timeout would never fire).
pub(crate) fn sealed_timeout_id<'a>(
    seal: Option<&TimeoutSeal>,
    endpoint: &str,
    envelope: &'a Envelope,
) -> Option<&'a str> {
    let id = text(envelope, TIMEOUT_ID)?;
    match seal {
        Some(seal) => seal.verify(endpoint, envelope).map(|_| id),
        None => Some(id),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn seal() -> TimeoutSeal {
        TimeoutSeal::new(&EndpointSecret::from_bytes([7; 32])).unwrap()
    }

    fn due() -> DateTime<Utc> {
        DateTime::from_timestamp_micros(1_800_000_000_123_456).unwrap()
    }

    /// A timeout's message as the saga writes it.
    fn timeout() -> Envelope {
        let mut e = Envelope::new(b"{\"n\":1}".to_vec());
        e.message_id = "t-1".into();
        e.message_type = Some("shop.Expired".into());
        for (k, v) in [
            (TIMEOUT_ID, "t-1"),
            (SAGA_TYPE, "shop.Order"),
            (CORRELATION, "o-1"),
            ("courier.saga.timeout_key", "shop.Expired"),
        ] {
            e.properties.insert(k.into(), PropertyValue::String(v.into()));
        }
        e
    }

    fn sealed() -> Envelope {
        let mut e = timeout();
        assert!(seal().seal("orders", &mut e, due()));
        e
    }

    #[test]
    fn the_dispatchers_copy_fires_at_its_due_time_and_not_before() {
        let e = sealed();
        let s = seal();
        assert_eq!(judge(Some(&s), "orders", &e, due()), Verdict::Due);
        let before = due() - chrono::Duration::milliseconds(1);
        assert_eq!(judge(Some(&s), "orders", &e, before), Verdict::Early { due: due() });
        let hour_early = due() - chrono::Duration::hours(1);
        assert_eq!(judge(Some(&s), "orders", &e, hour_early), Verdict::Early { due: due() });
        // Within the due time's millisecond (a scheduler that keeps milliseconds delivers
        // then): due.
        let same_milli = due() - chrono::Duration::microseconds(456);
        assert_eq!(judge(Some(&s), "orders", &e, same_milli), Verdict::Due);
        assert_eq!(sealed_timeout_id(Some(&s), "orders", &e), Some("t-1"));
        assert_eq!(
            text(&e, TIMEOUT_DUE),
            Some("2027-01-15T08:00:00.123456Z"),
            "the due time is written from the row"
        );
    }

    #[test]
    fn any_change_to_a_sealed_field_breaks_the_seal() {
        let s = seal();
        let later = due() + chrono::Duration::hours(2);
        type Change = Box<dyn Fn(&mut Envelope)>;
        let changes: Vec<(&str, Change)> = vec![
            ("message id", Box::new(|e| e.message_id = "t-2".into())),
            ("type", Box::new(|e| e.message_type = Some("shop.Other".into()))),
            ("no type", Box::new(|e| e.message_type = None)),
            ("body", Box::new(|e| e.body = b"{\"n\":2}".to_vec().into())),
            (
                "id",
                Box::new(|e| {
                    drop(
                        e.properties
                            .insert(TIMEOUT_ID.into(), PropertyValue::String("t-2".into())),
                    )
                }),
            ),
            (
                "saga",
                Box::new(|e| drop(e.properties.insert(SAGA_TYPE.into(), PropertyValue::String("x".into())))),
            ),
            (
                "correlation",
                Box::new(|e| {
                    drop(
                        e.properties
                            .insert(CORRELATION.into(), PropertyValue::String("o-2".into())),
                    )
                }),
            ),
            (
                "due",
                Box::new(|e| {
                    drop(
                        e.properties
                            .insert(TIMEOUT_DUE.into(), PropertyValue::String("2020-01-01T00:00:00Z".into())),
                    )
                }),
            ),
            (
                "seal",
                Box::new(|e| {
                    drop(
                        e.properties
                            .insert(TIMEOUT_SEAL.into(), PropertyValue::String("0".repeat(64))),
                    )
                }),
            ),
            (
                "seal type",
                Box::new(|e| drop(e.properties.insert(TIMEOUT_SEAL.into(), PropertyValue::Int(1)))),
            ),
            ("no seal", Box::new(|e| drop(e.properties.remove(TIMEOUT_SEAL)))),
            (
                "id type",
                Box::new(|e| drop(e.properties.insert(TIMEOUT_ID.into(), PropertyValue::Int(1)))),
            ),
        ];
        for (what, change) in changes {
            let mut e = sealed();
            change(&mut e);
            assert!(
                matches!(judge(Some(&s), "orders", &e, later), Verdict::Forged(_)),
                "{what}"
            );
            assert_ne!(sealed_timeout_id(Some(&s), "orders", &e), Some("t-1"), "{what}");
        }
        // Another endpoint, another secret.
        let e = sealed();
        assert!(matches!(judge(Some(&s), "billing", &e, later), Verdict::Forged(_)));
        let other = TimeoutSeal::new(&EndpointSecret::from_bytes([8; 32])).unwrap();
        assert!(matches!(judge(Some(&other), "orders", &e, later), Verdict::Forged(_)));
        // Upper-case hex is the same seal; the due time in another zone too.
        let mut e = sealed();
        let upper = text(&e, TIMEOUT_SEAL).unwrap().to_uppercase();
        e.properties.insert(TIMEOUT_SEAL.into(), PropertyValue::String(upper));
        assert_eq!(judge(Some(&s), "orders", &e, later), Verdict::Due);
    }

    #[test]
    fn a_forged_copy_with_every_header_but_the_seal_is_refused() {
        let mut e = timeout();
        e.properties.insert(
            TIMEOUT_DUE.into(),
            PropertyValue::String(due().to_rfc3339_opts(SecondsFormat::Micros, true)),
        );
        let later = due() + chrono::Duration::hours(1);
        let Verdict::Forged(why) = judge(Some(&seal()), "orders", &e, later) else {
            panic!("refused")
        };
        assert!(why.contains("t-1") && why.contains(TIMEOUT_SEAL), "{why}");
        let Verdict::Forged(why) = judge(Some(&seal()), "orders", &Envelope::new(Vec::new()), later) else {
            panic!("refused")
        };
        assert!(why.contains("without the headers"), "{why}");
        // Without a secret the headers are taken as they are; the due time still counts.
        assert_eq!(judge(None, "orders", &e, later), Verdict::Due);
        assert_eq!(
            judge(None, "orders", &e, due() - chrono::Duration::hours(1)),
            Verdict::Early { due: due() }
        );
        assert_eq!(sealed_timeout_id(None, "orders", &e), Some("t-1"));
    }

    #[test]
    fn a_message_without_the_headers_gets_no_seal() {
        let mut e = Envelope::new(Vec::new());
        e.message_type = Some("shop.Expired".into());
        assert!(!seal().seal("orders", &mut e, due()));
        assert!(!e.properties.contains_key(TIMEOUT_SEAL));
        let mut e = timeout();
        e.message_type = None;
        assert!(!seal().seal("orders", &mut e, due()));
    }

    /// Any value (or none) for a header of a timeout's message.
    fn any_header() -> impl Strategy<Value = Option<PropertyValue>> {
        prop_oneof![
            Just(None),
            any::<String>().prop_map(|s| Some(PropertyValue::String(s))),
            "[0-9a-fA-F]{64}".prop_map(|s| Some(PropertyValue::String(s))),
            "20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-][01][0-9]:[0-5][0-9])"
                .prop_map(|s| Some(PropertyValue::String(s))),
            any::<i64>().prop_map(|n| Some(PropertyValue::Int(n))),
            any::<bool>().prop_map(|b| Some(PropertyValue::Bool(b))),
            any::<f64>().prop_map(|f| Some(PropertyValue::Float(f))),
        ]
    }

    /// The real timeout's value of a header, or any value.
    fn kept_or_any(real: &Envelope, name: &'static str) -> impl Strategy<Value = Option<PropertyValue>> {
        let kept = real.properties.get(name).cloned();
        prop_oneof![Just(kept), any_header()]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// A producer that knows everything `courier timeouts` and the logs show (the
        /// timeout's id, saga, correlation, key, due time) and even the real copy's seal
        /// (copied from a dead letter) fires nothing unless every sealed field is the real
        /// one's: any bytes, strings and numbers for the timeout headers, the seal, the
        /// message id, type and body.
        #[test]
        fn forged_headers_never_fire_a_timeout(
            headers in (
                kept_or_any(&sealed(), TIMEOUT_ID),
                kept_or_any(&sealed(), SAGA_TYPE),
                kept_or_any(&sealed(), CORRELATION),
                kept_or_any(&sealed(), TIMEOUT_DUE),
                kept_or_any(&sealed(), TIMEOUT_SEAL),
            ),
            message_id in prop_oneof![Just("t-1".to_owned()), any::<String>()],
            message_type in prop_oneof![Just(Some("shop.Expired".to_owned())), any::<Option<String>>()],
            body in prop_oneof![Just(b"{\"n\":1}".to_vec()), proptest::collection::vec(any::<u8>(), 0..64)],
            minutes_late in -120i64..120,
        ) {
            let real = sealed();
            let mut forged = Envelope::new(body);
            forged.message_id = message_id;
            forged.message_type = message_type;
            let (id, saga, correlation, due_text, seal_text) = headers;
            for (name, value) in [
                (TIMEOUT_ID, id),
                (SAGA_TYPE, saga),
                (CORRELATION, correlation),
                (TIMEOUT_DUE, due_text),
                (TIMEOUT_SEAL, seal_text),
            ] {
                if let Some(v) = value {
                    forged.properties.insert(name.into(), v);
                }
            }
            let now = due() + chrono::Duration::minutes(minutes_late);
            let s = seal();
            let verdict = judge(Some(&s), "orders", &forged, now);
            let same = |e: &Envelope| {
                let c = Claimed::of(e).map(|c| (c.timeout_id.to_owned(), c.saga_type.to_owned(), c.correlation.to_owned(), c.due));
                (c, e.message_id.clone(), e.message_type.clone(), e.body.clone())
            };
            let genuine = same(&forged) == same(&real) && text(&forged, TIMEOUT_SEAL).map(str::to_lowercase)
                == text(&real, TIMEOUT_SEAL).map(str::to_owned);
            if verdict == Verdict::Due {
                prop_assert!(genuine, "a forged copy fired: {forged:?}");
                prop_assert!(now.timestamp_millis() >= due().timestamp_millis());
            }
            if !genuine {
                prop_assert!(matches!(verdict, Verdict::Forged(_)), "{verdict:?} for {forged:?}");
                prop_assert_eq!(sealed_timeout_id(Some(&s), "orders", &forged), None);
            }
        }
    }

    #[test]
    fn the_seal_is_hmac_sha256_of_the_documented_input() {
        // Pins the input layout: a change makes every dispatched timeout's seal invalid.
        let s = TimeoutSeal::new(&EndpointSecret::from_bytes([0; 32])).unwrap();
        let mut e = timeout();
        assert!(s.seal("orders", &mut e, due()));
        let mut mac = HmacSha256::new_from_slice(&[0; 32]).unwrap();
        mac.update(b"courier.saga.timeout_seal/v1");
        for field in [
            &b"orders"[..],
            b"t-1",
            b"t-1",
            b"shop.Expired",
            b"shop.Order",
            b"o-1",
            b"{\"n\":1}",
        ] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac.update(&1_800_000_000_123_456i64.to_be_bytes());
        assert_eq!(text(&e, TIMEOUT_SEAL), Some(hex(&mac.finalize().into_bytes()).as_str()));
    }
}
