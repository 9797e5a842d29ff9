//! The seal on a dead letter that Courier moved to a RabbitMQ dead-letter queue.
//!
//! On RabbitMQ a dead letter's record is headers: why ([`H_DEAD_LETTER_REASON`]), what
//! failed ([`H_DEAD_LETTER_DESCRIPTION`]), from where, and the endpoint's `courier.failure.*`
//! headers (the error, the handler, how many attempts). A producer can write every one of
//! them: publish straight into `<queue>::dlq`, or set them on a message that RabbitMQ
//! dead-letters itself (a time-to-live, the delivery limit). So the transport seals what it
//! writes: [`H_DEAD_LETTER_SEAL`] holds the hex of HMAC-SHA256, under the secret the
//! schedule store keeps for the source queue (the table of
//! [`Store::endpoint_secret`](crate::Store::endpoint_secret), under a domain of its own), of
//! the source queue's name, the message id's bytes and every sealed header
//! ([`is_sealed`]: the `x-courier-dead-letter-*` headers and the `courier.failure.*`
//! headers, by name, with their values). The admin ([`super::dead_letters`]) trusts these
//! headers only with a valid seal; without one it reads what RabbitMQ's own `x-death`
//! says and shows the rest as the message's own headers, marked unverified.
//!
//! A transport without a schedule store has no secret its processes and the admin share:
//! its dead letters are not sealed (`docs/rabbitmq.md`, "Dead letters").

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use hmac::Mac;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::endpoint::recoverability::headers::FAILURE_PREFIX;
use crate::endpoint::retry_seal::{HmacSha256, keyed, unhex};
use crate::endpoint::trace::hex;
use crate::error::Result;
use crate::store::EndpointSecret;

use super::schedule::ScheduleStore;

/// Header: the seal of a dead letter's record (64 hex digits).
pub(crate) const H_DEAD_LETTER_SEAL: &str = "x-courier-dead-letter-seal";

/// The prefix of the dead-letter headers the seal covers (all but the seal itself).
const DEAD_LETTER_PREFIX: &[u8] = b"x-courier-dead-letter-";

/// What the MAC starts with, so that no other use of the secret (the endpoint's retry and
/// timeout seals use it too) can make a dead letter's seal.
const DOMAIN: &[u8] = b"courier.amqp.dead_letter_seal/v1";

/// Whether the header named `name` (its bytes as received) is one the seal covers.
pub(crate) fn is_sealed(name: &[u8]) -> bool {
    (name.starts_with(DEAD_LETTER_PREFIX) && name != H_DEAD_LETTER_SEAL.as_bytes())
        || name.starts_with(FAILURE_PREFIX.as_bytes())
}

/// The bytes of a short string as received (or as written).
fn bytes_of(s: &ShortString) -> &[u8] {
    s.invalid_utf8().unwrap_or(s.as_str().as_bytes())
}

/// A source queue's key for sealing and checking its dead letters.
#[derive(Clone)]
pub(crate) struct DeadLetterKey {
    /// The MAC keyed with the queue's secret, before any input: cloned for each seal.
    keyed: HmacSha256,
}

impl std::fmt::Debug for DeadLetterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeadLetterKey(..)")
    }
}

impl DeadLetterKey {
    /// The key made from `secret`.
    ///
    /// # Errors
    /// [`crate::ErrorKind::InvalidOptions`] if HMAC refused the key (it takes keys of any
    /// length, so this does not happen).
    pub(crate) fn new(secret: &EndpointSecret) -> Result<Self> {
        Ok(Self { keyed: keyed(secret)? })
    }

    /// The MAC of a dead letter of `queue` with properties `p`: each text preceded by its
    /// length, the sealed headers in the order of their names' bytes, each value with a
    /// tag of its kind, so that no two records read the same.
    fn mac(&self, queue: &str, p: &BasicProperties) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        mac.update(DOMAIN);
        let mut field = |bytes: &[u8]| {
            mac.update(&u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_be_bytes());
            mac.update(bytes);
        };
        field(queue.as_bytes());
        match p.message_id() {
            Some(id) => field(&[&[1u8][..], bytes_of(id)].concat()),
            None => field(&[0]),
        }
        let mut sealed: Vec<(&[u8], &AMQPValue)> = p
            .headers()
            .as_ref()
            .map(|h| {
                h.inner()
                    .iter()
                    .map(|(k, v)| (bytes_of(k), v))
                    .filter(|(k, _)| is_sealed(k))
                    .collect()
            })
            .unwrap_or_default();
        sealed.sort_by(|a, b| a.0.cmp(b.0));
        for (name, value) in sealed {
            field(name);
            field(&value_bytes(value));
        }
        mac
    }

    /// `p` with the seal of its record as a dead letter of `queue` (any seal it carried
    /// replaced).
    pub(crate) fn seal(&self, queue: &str, p: BasicProperties) -> BasicProperties {
        let mut headers = without_seal(p.headers().as_ref());
        let p = p.with_headers(headers.clone());
        let seal = hex(&self.mac(queue, &p).finalize().into_bytes());
        headers.insert(
            H_DEAD_LETTER_SEAL.into(),
            AMQPValue::LongString(LongString::from(seal.as_bytes())),
        );
        p.with_headers(headers)
    }

    /// Whether `p` carries a valid seal of its record as a dead letter of `queue`,
    /// compared in constant time.
    pub(crate) fn verify(&self, queue: &str, p: &BasicProperties) -> bool {
        let Some(seal) = p
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(H_DEAD_LETTER_SEAL).cloned())
        else {
            return false;
        };
        let text = match &seal {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        };
        match text.and_then(unhex) {
            Some(bytes) => self.mac(queue, p).verify_slice(&bytes).is_ok(),
            None => false,
        }
    }
}

/// `p` without a seal: what a transport that cannot seal publishes (a producer's seal on
/// the message is not passed on as if it were the transport's).
pub(crate) fn unsealed(p: BasicProperties) -> BasicProperties {
    match p.headers() {
        Some(headers) if headers.inner().contains_key(H_DEAD_LETTER_SEAL) => {
            let headers = without_seal(Some(headers));
            p.with_headers(headers)
        }
        _ => p,
    }
}

/// The headers `headers` without [`H_DEAD_LETTER_SEAL`].
fn without_seal(headers: Option<&FieldTable>) -> FieldTable {
    let mut out = FieldTable::default();
    for (k, v) in headers.map(FieldTable::inner).into_iter().flatten() {
        if bytes_of(k) != H_DEAD_LETTER_SEAL.as_bytes() {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// What a name of a sealed header becomes on a dead letter whose seal is missing or wrong:
/// it is shown under this prefix, as one of the message's own headers, and is no part of
/// the record ([`as_read`]).
pub(crate) const UNVERIFIED: &str = "(unverified) ";

/// A dead letter of `queue` as the admin reads it, and whether its record is Courier's:
/// with a valid seal under `key`, `p` as it is; otherwise `p` with every sealed header
/// renamed under [`UNVERIFIED`] (a name that is not UTF-8 stays: it is shown in hex
/// anyway), so that the record is read from what RabbitMQ wrote (`x-death`) or is none.
pub(crate) fn as_read(p: &BasicProperties, queue: &str, key: Option<&DeadLetterKey>) -> (BasicProperties, bool) {
    if key.is_some_and(|k| k.verify(queue, p)) {
        return (p.clone(), true);
    }
    let Some(headers) = p.headers() else {
        return (p.clone(), false);
    };
    let mut out = FieldTable::default();
    for (k, v) in headers.inner() {
        let renamed = k.invalid_utf8().is_none() && is_sealed(k.as_str().as_bytes());
        if renamed {
            out.insert(format!("{UNVERIFIED}{}", k.as_str()).into(), v.clone());
        } else if bytes_of(k) != H_DEAD_LETTER_SEAL.as_bytes() {
            out.insert(k.clone(), v.clone());
        }
    }
    (p.clone().with_headers(out), false)
}

/// A header value's bytes for the MAC: a tag of its kind, then the value. Integers of
/// every width read as one 64-bit integer and floats as one 64-bit float (a width is no
/// meaning a record could change); a kind Courier never writes on these headers reads as
/// its debug text.
fn value_bytes(v: &AMQPValue) -> Vec<u8> {
    let int = |n: i64| [&b"i"[..], &n.to_be_bytes()].concat();
    match v {
        AMQPValue::Boolean(b) => vec![b'b', u8::from(*b)],
        AMQPValue::ShortShortInt(n) => int(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => int(i64::from(*n)),
        AMQPValue::ShortInt(n) => int(i64::from(*n)),
        AMQPValue::ShortUInt(n) => int(i64::from(*n)),
        AMQPValue::LongInt(n) => int(i64::from(*n)),
        AMQPValue::LongUInt(n) => int(i64::from(*n)),
        AMQPValue::LongLongInt(n) => int(*n),
        AMQPValue::Float(f) => [&b"f"[..], &f64::from(*f).to_bits().to_be_bytes()].concat(),
        AMQPValue::Double(f) => [&b"f"[..], &f.to_bits().to_be_bytes()].concat(),
        AMQPValue::LongString(s) => [&b"s"[..], s.as_bytes()].concat(),
        AMQPValue::ShortString(s) => [&b"s"[..], bytes_of(s)].concat(),
        AMQPValue::Timestamp(t) => [&b"t"[..], &t.to_be_bytes()].concat(),
        other => [&b"o"[..], format!("{other:?}").as_bytes()].concat(),
    }
}

/// The transport's dead-letter keys, one per source queue, made from the schedule store's
/// secrets the first time a queue dead-letters and kept for the transport's life (a
/// secret never changes while its row is there).
#[derive(Debug, Default)]
pub(crate) struct Keys {
    made: Mutex<HashMap<String, DeadLetterKey>>,
}

impl Keys {
    /// The key of `queue`: the schedule store's secret for it, made now if it has none.
    ///
    /// # Errors
    /// What reading or making the secret failed with (the store is down, or Courier's
    /// migrations were not applied); the caller publishes unsealed.
    pub(crate) async fn of(&self, store: &ScheduleStore, queue: &str, now: DateTime<Utc>) -> Result<DeadLetterKey> {
        if let Some(k) = self.made.lock().ok().and_then(|m| m.get(queue).cloned()) {
            return Ok(k);
        }
        let key = DeadLetterKey::new(&store.secret(queue, now).await?)?;
        if let Ok(mut m) = self.made.lock() {
            m.insert(queue.to_owned(), key.clone());
        }
        Ok(key)
    }
}

/// A field table of these entries (for tests).
#[cfg(test)]
fn table(entries: &[(&str, AMQPValue)]) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in entries {
        t.insert((*k).into(), v.clone());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> DeadLetterKey {
        DeadLetterKey::new(&EndpointSecret::from_bytes([byte; 32])).unwrap()
    }

    fn long(s: &str) -> AMQPValue {
        AMQPValue::LongString(LongString::from(s.as_bytes()))
    }

    fn record() -> BasicProperties {
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_headers(table(&[
                ("x-courier-dead-letter-reason", long("HandlerFailed")),
                ("x-courier-dead-letter-description", long("boom")),
                ("courier.failure.attempts", AMQPValue::LongLongInt(4)),
                ("app.header", long("free")),
            ]))
    }

    fn with(p: &BasicProperties, name: &str, v: AMQPValue) -> BasicProperties {
        let mut h = p.headers().clone().unwrap_or_default();
        h.insert(name.into(), v);
        p.clone().with_headers(h)
    }

    #[test]
    fn a_sealed_record_verifies_and_any_change_to_it_does_not() {
        let k = key(7);
        let sealed = k.seal("orders", record());
        assert!(k.verify("orders", &sealed));
        assert!(!k.verify("payments", &sealed), "another queue's record");
        assert!(!key(8).verify("orders", &sealed), "another secret");
        assert!(!k.verify("orders", &record()), "no seal");
        assert!(!k.verify(
            "orders",
            &with(&sealed, "x-courier-dead-letter-description", long("forged"))
        ));
        assert!(!k.verify(
            "orders",
            &with(&sealed, "courier.failure.attempts", AMQPValue::LongLongInt(1))
        ));
        assert!(!k.verify("orders", &with(&sealed, "courier.failure.error", long("added"))));
        assert!(!k.verify("orders", &sealed.clone().with_message_id("m-2".into())));
        // What the seal does not cover may change: a resubmit strips the record anyway.
        assert!(k.verify("orders", &with(&sealed, "app.header", long("other"))));
        assert!(!k.verify("orders", &with(&sealed, H_DEAD_LETTER_SEAL, long(&"0".repeat(64)))));
        assert!(!k.verify("orders", &with(&sealed, H_DEAD_LETTER_SEAL, AMQPValue::LongLongInt(1))));
    }

    #[test]
    fn sealing_again_replaces_the_old_seal_and_unsealed_drops_it() {
        let k = key(1);
        let forged = with(&record(), H_DEAD_LETTER_SEAL, long("f".repeat(64).as_str()));
        let sealed = k.seal("q", forged);
        assert!(k.verify("q", &sealed));
        let plain = unsealed(sealed);
        assert!(
            !plain
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .contains_key(H_DEAD_LETTER_SEAL)
        );
    }

    #[test]
    fn an_unverified_record_is_read_as_the_message_s_own_headers() {
        let k = key(3);
        let sealed = k.seal("q", record());
        let (read, verified) = as_read(&sealed, "q", Some(&k));
        assert!(verified);
        assert_eq!(read, sealed);
        for (p, key) in [
            (record(), Some(&k)),
            (sealed.clone(), None),
            (k.seal("other", record()), Some(&k)),
        ] {
            let (read, verified) = as_read(&p, "q", key);
            assert!(!verified);
            let names: Vec<String> = read
                .headers()
                .as_ref()
                .unwrap()
                .inner()
                .keys()
                .map(|k| k.as_str().to_owned())
                .collect();
            assert!(
                names.contains(&"(unverified) x-courier-dead-letter-description".to_owned()),
                "{names:?}"
            );
            assert!(names.contains(&"(unverified) courier.failure.attempts".to_owned()));
            assert!(names.contains(&"app.header".to_owned()));
            assert!(
                !names
                    .iter()
                    .any(|n| n.starts_with("x-courier-dead-letter") || n.starts_with("courier.failure"))
            );
        }
    }

    #[test]
    fn only_the_record_headers_are_sealed() {
        assert!(is_sealed(b"x-courier-dead-letter-reason"));
        assert!(is_sealed(b"x-courier-dead-letter-time-to-live"));
        assert!(is_sealed(b"courier.failure.handler"));
        assert!(!is_sealed(H_DEAD_LETTER_SEAL.as_bytes()));
        assert!(!is_sealed(b"x-death"));
        assert!(!is_sealed(b"courier.retry.delayed"));
    }
}
