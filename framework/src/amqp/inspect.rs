//! What a receiver checks in a delivery before handing it out: the rules of the wire
//! format (docs/rabbitmq.md) that Courier's senders keep and producers in other languages
//! may break. A delivery that breaks one is *refused*: moved to its dead-letter queue at
//! once with a Courier reason, never handed out, never requeued. An `x-courier-*` header
//! Courier cannot use is *ignored* with a warning and counted ([`WireStats`]).
//!
//! Short strings that are not UTF-8 reach this module because the patched
//! amq-protocol-types (`patches/amq-protocol-types`) parses them lossily and keeps their
//! bytes (`ShortString::invalid_utf8`) instead of failing the frame, which closed the
//! whole connection.

use std::fmt::Write as _;
use std::num::IntErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};

use lapin::BasicProperties;
use lapin::types::{AMQPValue, ShortString};

use crate::checks::MAX_MESSAGE_ID_LEN;
use crate::message::Envelope;
use crate::message::reasons::{INVALID_WIRE_FORMAT, MESSAGE_TOO_LARGE};

use super::wire::{
    H_CAUSATION_ID, H_DEAD_LETTER_DESCRIPTION, H_DEAD_LETTER_REASON, H_DEAD_LETTER_SOURCE, H_ENQUEUED_TIME,
    H_SEQUENCE_NUMBER, H_SESSION_ID, H_TIME_TO_LIVE, from_millis, time_to_live_of,
};

/// The prefix of Courier's own headers.
const COURIER_PREFIX: &str = "x-courier-";

/// What the receivers of one transport found wrong in the messages they received
/// (`AmqpTransport::wire_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WireStats {
    /// Deliveries refused: moved to their dead-letter queue at once with
    /// `courier.InvalidWireFormat` or `courier.MessageTooLarge`.
    pub invalid: u64,
    /// `x-courier-*` headers ignored (wrong type, out of range, or a name Courier does
    /// not know); each was logged as a warning.
    pub ignored_headers: u64,
}

/// The counters behind [`WireStats`].
#[derive(Default)]
pub(crate) struct WireCounters {
    invalid: AtomicU64,
    ignored_headers: AtomicU64,
}

impl WireCounters {
    pub(crate) fn refused(&self) {
        self.invalid.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn ignored(&self, n: usize) {
        let n = u64::try_from(n).unwrap_or(u64::MAX);
        self.ignored_headers.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> WireStats {
        WireStats {
            invalid: self.invalid.load(Ordering::Relaxed),
            ignored_headers: self.ignored_headers.load(Ordering::Relaxed),
        }
    }
}

/// Why a delivery is refused: the dead-letter reason and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: &'static str,
    pub(crate) description: String,
}

/// What [`inspect`] found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Set when the delivery must not be handed out.
    pub(crate) refusal: Option<Refusal>,
    /// `x-courier-*` headers ignored: the name and what was wrong (for a warning).
    pub(crate) ignored: Vec<(String, String)>,
}

/// Bytes as lowercase hex, for descriptions and logs.
fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

fn not_utf8(what: &str, raw: &[u8]) -> String {
    format!("{what} is not UTF-8 (hex {})", hex(raw))
}

/// The AMQP type of a header value, as the warning names it.
fn type_name(v: &AMQPValue) -> String {
    format!("{:?}", v.get_type())
}

/// The refusal of a time-to-live of `ms` milliseconds in `what`, worded as the other
/// transports word it (`checks::stored_refusal`).
fn time_to_live_out_of_range(what: &str, ms: impl std::fmt::Display) -> String {
    format!("{what} is {ms} ms; Courier's time-to-lives are 1 ms to 100 years (a Courier sender refuses another)")
}

/// An AMQP integer header value of any width, an unsigned timestamp over `i64::MAX`
/// included.
fn wide_int(v: &AMQPValue) -> Option<i128> {
    match v {
        AMQPValue::Timestamp(n) => Some(i128::from(*n)),
        other => super::wire::int(other).map(i128::from),
    }
}

/// Checks one `x-courier-*` header: `Err(problem)` refuses the delivery, `Ok(Some(why))`
/// ignores the header.
fn courier_header(name: &str, v: &AMQPValue) -> Result<Option<String>, String> {
    let ignored = |why: String| Ok(Some(why));
    match name {
        // 0, negative or over 100 years: a Courier sender refuses it, so the delayed retry
        // (a copy with the same time-to-live) could not be sent and the retry policy would
        // be skipped.
        H_TIME_TO_LIVE => match wide_int(v) {
            None => ignored(format!("a {}, not an integer", type_name(v))),
            Some(ms) if i64::try_from(ms).ok().and_then(time_to_live_of).is_none() => {
                Err(time_to_live_out_of_range(name, ms))
            }
            Some(_) => Ok(None),
        },
        H_ENQUEUED_TIME | H_SEQUENCE_NUMBER => match super::wire::int(v) {
            None => ignored(format!("a {}, not an integer", type_name(v))),
            Some(ms) if name == H_ENQUEUED_TIME && from_millis(ms).is_none() => {
                ignored(format!("{ms} ms is not a time"))
            }
            Some(_) => Ok(None),
        },
        H_CAUSATION_ID | H_SESSION_ID | H_DEAD_LETTER_REASON | H_DEAD_LETTER_DESCRIPTION | H_DEAD_LETTER_SOURCE => {
            let AMQPValue::LongString(s) = v else {
                return ignored(format!("a {}, not a string", type_name(v)));
            };
            let Ok(text) = std::str::from_utf8(s.as_bytes()) else {
                return Err(not_utf8(name, s.as_bytes()));
            };
            if name == H_SESSION_ID && (text.is_empty() || text.len() > MAX_MESSAGE_ID_LEN) {
                return Err(format!(
                    "{name} has {} bytes; Courier's session ids have 1 to {MAX_MESSAGE_ID_LEN}",
                    text.len()
                ));
            }
            Ok(None)
        }
        _ => ignored("not a header Courier knows".to_owned()),
    }
}

/// The `expiration` property as an integer, if it is one outside Courier's time-to-lives
/// (text that is no integer is not read: `wire::decode` ignores it, and RabbitMQ refuses it
/// at publish).
fn expiration_out_of_range(text: &str) -> Option<String> {
    match text.parse::<i64>() {
        Ok(ms) => time_to_live_of(ms).is_none().then(|| ms.to_string()),
        Err(e) if matches!(e.kind(), IntErrorKind::PosOverflow | IntErrorKind::NegOverflow) => Some(text.to_owned()),
        Err(_) => None,
    }
}

/// Checks a delivery from a main queue (a dead-letter queue is read as it is), given its
/// AMQP properties and the envelope [`super::wire::decode`] made of them.
pub(crate) fn inspect(p: &BasicProperties, envelope: &Envelope, max_message_size: usize) -> Findings {
    let mut problems = Vec::new();
    let texts: [(&str, &Option<ShortString>); 5] = [
        ("message_id", p.message_id()),
        ("correlation_id", p.correlation_id()),
        ("type", p.kind()),
        ("content_type", p.content_type()),
        ("reply_to", p.reply_to()),
    ];
    for (what, value) in texts {
        if let Some(raw) = value.as_ref().and_then(ShortString::invalid_utf8) {
            problems.push(not_utf8(what, raw));
        }
    }
    if let Some(id) = p.message_id()
        && id.invalid_utf8().is_none()
        && id.as_str().len() > MAX_MESSAGE_ID_LEN
    {
        problems.push(format!(
            "message_id has {} bytes; Courier's message ids have 1 to {MAX_MESSAGE_ID_LEN}",
            id.as_str().len()
        ));
    }
    // RabbitMQ delivers an `expiration` of 0 (to a consumer that waits) and refuses at
    // publish what is negative, not an integer, or over its own maximum (10 years in 3.10).
    if let Some(e) = p.expiration()
        && let Some(ms) = expiration_out_of_range(e.as_str())
    {
        problems.push(time_to_live_out_of_range("expiration", ms));
    }
    let mut ignored = Vec::new();
    if let Some(headers) = p.headers() {
        for (name, value) in headers {
            if let Some(raw) = name.invalid_utf8() {
                problems.push(not_utf8("a header name", raw));
            } else if name.as_str().starts_with(COURIER_PREFIX) {
                match courier_header(name.as_str(), value) {
                    Err(problem) => problems.push(problem),
                    Ok(Some(why)) => ignored.push((name.as_str().to_owned(), why)),
                    Ok(None) => {}
                }
            }
        }
    }
    let size = envelope.size();
    let too_large = size > max_message_size;
    if too_large {
        problems.push(format!(
            "the message has {size} bytes (body, ids and properties); this transport's limit is \
             {max_message_size} (AmqpBuilder::max_message_size)"
        ));
    }
    let refusal = (!problems.is_empty()).then(|| Refusal {
        reason: if too_large && problems.len() == 1 {
            MESSAGE_TOO_LARGE
        } else {
            INVALID_WIRE_FORMAT
        },
        description: problems.join("; "),
    });
    Findings { refusal, ignored }
}

#[cfg(test)]
mod tests {
    use lapin::types::{FieldTable, LongString};

    use super::*;

    /// A short string as the (patched) parser makes it from `bytes`.
    fn received(bytes: &[u8]) -> ShortString {
        ShortString::from_received_bytes(bytes.to_vec())
    }

    fn valid() -> BasicProperties {
        BasicProperties::default()
            .with_message_id("m-1".into())
            .with_type("billing.Charge".into())
    }

    fn check(p: &BasicProperties) -> Findings {
        let envelope = super::super::wire::decode(p, b"{}".to_vec(), false, false, None, chrono::Utc::now()).envelope;
        inspect(p, &envelope, 1024)
    }

    #[test]
    fn a_message_as_courier_sends_it_passes() {
        let m = Envelope::new("x")
            .with_message_id("m-1")
            .with_causation_id("c")
            .with_session_id("s")
            .with_time_to_live(std::time::Duration::from_secs(1))
            .with_property("tenant", "acme");
        let p = super::super::wire::properties(&m, chrono::Utc::now(), 7).unwrap_or_default();
        let f = check(&p);
        assert_eq!(f.refusal, None);
        assert!(f.ignored.is_empty(), "{:?}", f.ignored);
    }

    #[test]
    fn text_that_is_not_utf8_is_refused_naming_the_property_and_its_bytes() {
        let p = valid()
            .with_message_id(received(b"id\xff"))
            .with_type(received(b"t\xfe"));
        let r = check(&p).refusal.unwrap_or_else(|| Refusal {
            reason: "",
            description: String::new(),
        });
        assert_eq!(r.reason, INVALID_WIRE_FORMAT);
        assert!(
            r.description.contains("message_id is not UTF-8 (hex 6964ff)"),
            "{}",
            r.description
        );
        assert!(
            r.description.contains("type is not UTF-8 (hex 74fe)"),
            "{}",
            r.description
        );

        let mut headers = FieldTable::default();
        headers.insert(received(b"k\xff"), AMQPValue::Boolean(true));
        let r = check(&valid().with_headers(headers)).refusal.map(|r| r.description);
        assert_eq!(r.as_deref(), Some("a header name is not UTF-8 (hex 6bff)"));

        let mut headers = FieldTable::default();
        headers.insert(
            H_CAUSATION_ID.into(),
            AMQPValue::LongString(LongString::from(&b"\xff"[..])),
        );
        let r = check(&valid().with_headers(headers)).refusal.map(|r| r.description);
        assert_eq!(r.as_deref(), Some("x-courier-causation-id is not UTF-8 (hex ff)"));
    }

    #[test]
    fn an_id_over_128_bytes_and_a_message_over_the_limit_are_refused() {
        let long = "i".repeat(MAX_MESSAGE_ID_LEN + 1);
        let r = check(&valid().with_message_id(long.as_str().into())).refusal;
        assert_eq!(r.map(|r| r.reason), Some(INVALID_WIRE_FORMAT));
        let ok = "i".repeat(MAX_MESSAGE_ID_LEN);
        assert_eq!(check(&valid().with_message_id(ok.as_str().into())).refusal, None);
        let mut headers = FieldTable::default();
        headers.insert(H_SESSION_ID.into(), AMQPValue::LongString(long.as_str().into()));
        let r = check(&valid().with_headers(headers)).refusal.map(|r| r.description);
        assert_eq!(
            r.as_deref(),
            Some("x-courier-session-id has 129 bytes; Courier's session ids have 1 to 128")
        );

        let p = valid();
        let big = super::super::wire::decode(&p, vec![b' '; 2000], false, false, None, chrono::Utc::now()).envelope;
        let r = inspect(&p, &big, 1024).refusal;
        assert_eq!(r.as_ref().map(|r| r.reason), Some(MESSAGE_TOO_LARGE));
        assert!(r.is_some_and(|r| r.description.contains("limit is 1024")));
    }

    #[test]
    fn whatever_a_message_holds_it_decodes() {
        let mut headers = FieldTable::default();
        headers.insert(received(b"k\xff"), AMQPValue::Boolean(true));
        headers.insert("bytes".into(), AMQPValue::LongString(LongString::from(&b"\xff"[..])));
        headers.insert("text".into(), AMQPValue::LongString("ok".into()));
        let p = valid().with_message_id(received(b"\xff\xfe")).with_headers(headers);
        let d = super::super::wire::decode(&p, b"{}".to_vec(), true, false, None, chrono::Utc::now());
        assert_eq!(d.envelope.message_id, "\u{FFFD}\u{FFFD}");
        // The name that is not UTF-8 and the value that is not are no properties.
        let names: Vec<&String> = d.envelope.properties.keys().collect();
        assert_eq!(names, ["text"]);
    }

    #[test]
    fn wrong_typed_or_unknown_courier_headers_are_ignored_with_a_reason() {
        let mut headers = FieldTable::default();
        headers.insert(H_ENQUEUED_TIME.into(), AMQPValue::LongString("yesterday".into()));
        headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongString("soon".into()));
        headers.insert(H_SESSION_ID.into(), AMQPValue::LongLongInt(5));
        headers.insert("x-courier-sequence".into(), AMQPValue::LongLongInt(5));
        headers.insert("x-death-note".into(), AMQPValue::LongLongInt(5)); // not Courier's
        let f = check(&valid().with_headers(headers));
        assert_eq!(f.refusal, None);
        assert_eq!(f.ignored.len(), 4, "{:?}", f.ignored);
        assert!(
            f.ignored
                .iter()
                .any(|(h, why)| h == H_ENQUEUED_TIME && why == "a LongString, not an integer"),
            "{:?}",
            f.ignored
        );
    }

    #[test]
    fn a_time_to_live_no_courier_sender_sends_is_refused_naming_it_and_its_value() {
        let max = i64::try_from(crate::entity::MAX_TIME_TO_LIVE.as_millis()).unwrap_or(i64::MAX);
        let refusal = |p: BasicProperties| check(&p).refusal.map(|r| (r.reason, r.description));
        let tail = "ms; Courier's time-to-lives are 1 ms to 100 years (a Courier sender refuses another)";
        for ms in [0, -1, max + 1, i64::MAX, i64::MIN] {
            let mut headers = FieldTable::default();
            headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongLongInt(ms));
            assert_eq!(
                refusal(valid().with_headers(headers)),
                Some((INVALID_WIRE_FORMAT, format!("x-courier-time-to-live is {ms} {tail}"))),
            );
        }
        let mut headers = FieldTable::default();
        headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::Timestamp(u64::MAX));
        assert_eq!(
            refusal(valid().with_headers(headers)),
            Some((
                INVALID_WIRE_FORMAT,
                format!("x-courier-time-to-live is {} {tail}", u64::MAX)
            )),
        );
        for text in ["0", "00", "+0", "-1", "99999999999999999999999"] {
            let shown = if text.len() > 20 {
                text.to_owned()
            } else {
                text.parse::<i64>().unwrap_or(1).to_string()
            };
            assert_eq!(
                refusal(valid().with_expiration(text.into())),
                Some((INVALID_WIRE_FORMAT, format!("expiration is {shown} {tail}"))),
                "{text}"
            );
        }
        // Both at once: each is named.
        let mut headers = FieldTable::default();
        headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongInt(0));
        let both = refusal(valid().with_headers(headers).with_expiration("0".into())).map(|r| r.1);
        assert_eq!(
            both,
            Some(format!("expiration is 0 {tail}; x-courier-time-to-live is 0 {tail}"))
        );
        // Courier's own range passes, at both ends; an expiration that is no integer is not
        // read (RabbitMQ refuses it at publish).
        for ms in [1, 60_000, max] {
            let mut headers = FieldTable::default();
            headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongLongInt(ms));
            let p = valid()
                .with_headers(headers)
                .with_expiration(ms.to_string().as_str().into());
            assert_eq!(check(&p).refusal, None, "{ms}");
        }
        assert_eq!(check(&valid().with_expiration("soon".into())).refusal, None);
    }
}
