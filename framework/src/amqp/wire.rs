//! How Courier's entities and messages look on RabbitMQ: names, AMQP properties, headers.
//! `docs/rabbitmq.md` documents the same for producers written in other languages.

use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

use crate::endpoint::recoverability::headers::FAILURE_PREFIX;
use crate::entity::{EntityPath, SubQueue};
use crate::error::{Error, ErrorKind, Result};
use crate::message::{BrokerProperties, Envelope, LockToken, MessageState, Properties, PropertyValue, reasons};

/// Separates a topic from a subscription, and an entity from its dead-letter queue, in
/// queue names. Entity names cannot contain it, so a generated name never collides with a
/// name a user chose.
pub(crate) const SEPARATOR: &str = "::";

/// The suffix of a dead-letter queue.
pub(crate) const DEAD_LETTER_SUFFIX: &str = "::dlq";

/// Header: the message that caused this one.
pub(crate) const H_CAUSATION_ID: &str = "x-courier-causation-id";
/// Header: the session id (carried, not acted on: sessions are bent).
pub(crate) const H_SESSION_ID: &str = "x-courier-session-id";
/// Header: enqueued time, milliseconds since the Unix epoch, from the sender's clock.
pub(crate) const H_ENQUEUED_TIME: &str = "x-courier-enqueued-time";
/// Header: the sequence number the sending process stamped.
pub(crate) const H_SEQUENCE_NUMBER: &str = "x-courier-sequence-number";
/// Header: time-to-live in milliseconds (also in the AMQP `expiration` property).
pub(crate) const H_TIME_TO_LIVE: &str = "x-courier-time-to-live";
/// Header of a dead letter Courier moved: the time-to-live in milliseconds the message had
/// (a resubmitted copy gets it again, counted from the resubmit).
pub(crate) const H_DEAD_LETTER_TIME_TO_LIVE: &str = "x-courier-dead-letter-time-to-live";
/// Header: why the message was dead-lettered.
pub(crate) const H_DEAD_LETTER_REASON: &str = "x-courier-dead-letter-reason";
/// Header: the description given with the reason.
pub(crate) const H_DEAD_LETTER_DESCRIPTION: &str = "x-courier-dead-letter-description";
/// Header: the queue the message was dead-lettered from.
pub(crate) const H_DEAD_LETTER_SOURCE: &str = "x-courier-dead-letter-source";
/// RabbitMQ's header on a redelivered message of a quorum queue: earlier failed deliveries.
/// Read only on a redelivery: on a first delivery to a consumer RabbitMQ passes on the
/// header a producer set, as it was set (see [`decode`]).
pub(crate) const H_DELIVERY_COUNT: &str = "x-delivery-count";
/// The most earlier deliveries read from [`H_DELIVERY_COUNT`]: a queue's max delivery
/// count is at most 10000 (`QueueOptions::validate`), and its quorum queue's delivery
/// limit one less, so RabbitMQ never writes more.
const MAX_EARLIER_DELIVERIES: i64 = 10_000;
/// RabbitMQ's header on a message the broker dead-lettered.
pub(crate) const H_DEATH: &str = "x-death";

/// The RabbitMQ queue that holds `path`'s messages.
pub(crate) fn queue_of(path: &EntityPath) -> String {
    let mut name = match path.topic() {
        Some(topic) => subscription_queue(topic, path.name()),
        None => path.name().to_owned(),
    };
    if path.sub_queue() == SubQueue::DeadLetter {
        name.push_str(DEAD_LETTER_SUFFIX);
    }
    name
}

/// The queue of a topic's subscription: `topic::subscription`.
pub(crate) fn subscription_queue(topic: &str, subscription: &str) -> String {
    format!("{topic}{SEPARATOR}{subscription}")
}

/// The dead-letter queue of a queue.
pub(crate) fn dead_letter_queue(queue: &str) -> String {
    format!("{queue}{DEAD_LETTER_SUFFIX}")
}

fn short(what: &str, value: &str) -> Result<ShortString> {
    ShortString::try_new(value).map_err(|_| {
        Error::new(ErrorKind::InvalidMessage {
            reason: format!("the {what} has {} bytes; AMQP allows at most 255", value.len()),
        })
    })
}

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes()))
}

/// Milliseconds since the Unix epoch.
pub(crate) fn millis(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// The time of `ms` milliseconds since the Unix epoch.
pub(crate) fn from_millis(ms: i64) -> Option<DateTime<Utc>> {
    Utc.timestamp_millis_opt(ms).single()
}

/// The AMQP properties and headers of `m`, stamped with its enqueued time and sequence
/// number. The body is sent as it is.
pub(crate) fn properties(m: &Envelope, enqueued: DateTime<Utc>, sequence_number: i64) -> Result<BasicProperties> {
    let mut headers = FieldTable::default();
    for (key, value) in &m.properties {
        let dead_letter = [
            H_DEAD_LETTER_REASON,
            H_DEAD_LETTER_DESCRIPTION,
            H_DEAD_LETTER_SOURCE,
            H_DEAD_LETTER_TIME_TO_LIVE,
        ];
        if key.starts_with("x-") && !dead_letter.contains(&key.as_str()) {
            return Err(Error::new(ErrorKind::InvalidMessage {
                reason: format!("property {key:?}: names starting with \"x-\" are reserved on RabbitMQ"),
            }));
        }
        let key = short("property name", key)?;
        let value = match value {
            PropertyValue::Bool(v) => AMQPValue::Boolean(*v),
            PropertyValue::Int(v) => AMQPValue::LongLongInt(*v),
            PropertyValue::Float(v) => AMQPValue::Double(*v),
            PropertyValue::String(v) => long(v),
        };
        headers.insert(key, value);
    }
    if let Some(c) = &m.causation_id {
        headers.insert(H_CAUSATION_ID.into(), long(c));
    }
    if let Some(s) = &m.session_id {
        headers.insert(H_SESSION_ID.into(), long(s));
    }
    headers.insert(H_ENQUEUED_TIME.into(), AMQPValue::LongLongInt(millis(enqueued)));
    headers.insert(H_SEQUENCE_NUMBER.into(), AMQPValue::LongLongInt(sequence_number));
    let mut p = BasicProperties::default()
        .with_message_id(short("message id", &m.message_id)?)
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(enqueued.timestamp()).unwrap_or(0));
    if let Some(ttl) = m.time_to_live {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1);
        headers.insert(H_TIME_TO_LIVE.into(), AMQPValue::LongLongInt(ms));
        p = p.with_expiration(ShortString::from(ms.to_string()));
    }
    if let Some(c) = &m.correlation_id {
        p = p.with_correlation_id(short("correlation id", c)?);
    }
    if let Some(t) = &m.message_type {
        p = p.with_type(short("message type", t)?);
    }
    if let Some(c) = &m.content_type {
        p = p.with_content_type(short("content type", c)?);
    }
    if let Some(r) = &m.reply_to {
        p = p.with_reply_to(short("reply-to address", r)?);
    }
    Ok(p.with_headers(headers))
}

/// The properties of a refused delivery's copy in the dead-letter queue: those received,
/// byte for byte (a message id or header name that is not UTF-8 stays those bytes, so a
/// resubmit sends what was received and is refused again), with the dead-letter headers
/// added, without the producer's `courier.failure.*` headers (whose names are UTF-8: one
/// that is not is why the message is refused, and stays) and without `expiration` (a DLQ
/// keeps what it holds). The transport seals the record when it publishes the copy.
pub(crate) fn refused_copy(p: &BasicProperties, reason: &str, description: &str, source: &str) -> BasicProperties {
    let mut headers = FieldTable::default();
    // A producer's failure headers are not the record of this refusal (a resubmit leaves
    // them out anyway).
    for (k, v) in p.headers().as_ref().map(FieldTable::inner).into_iter().flatten() {
        let failure = k.invalid_utf8().is_none() && k.as_str().starts_with(FAILURE_PREFIX);
        if !failure {
            headers.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in [
        (H_DEAD_LETTER_REASON, reason),
        (H_DEAD_LETTER_DESCRIPTION, description),
        (H_DEAD_LETTER_SOURCE, source),
    ] {
        headers.insert(k.into(), long(v));
    }
    let mut copy = BasicProperties::default();
    if let Some(v) = p.content_type() {
        copy = copy.with_content_type(v.clone());
    }
    if let Some(v) = p.content_encoding() {
        copy = copy.with_content_encoding(v.clone());
    }
    if let Some(v) = p.delivery_mode() {
        copy = copy.with_delivery_mode(*v);
    }
    if let Some(v) = p.priority() {
        copy = copy.with_priority(*v);
    }
    if let Some(v) = p.correlation_id() {
        copy = copy.with_correlation_id(v.clone());
    }
    if let Some(v) = p.reply_to() {
        copy = copy.with_reply_to(v.clone());
    }
    if let Some(v) = p.message_id() {
        copy = copy.with_message_id(v.clone());
    }
    if let Some(v) = p.timestamp() {
        copy = copy.with_timestamp(*v);
    }
    if let Some(v) = p.kind() {
        copy = copy.with_type(v.clone());
    }
    if let Some(v) = p.user_id() {
        copy = copy.with_user_id(v.clone());
    }
    if let Some(v) = p.app_id() {
        copy = copy.with_app_id(v.clone());
    }
    if let Some(v) = p.cluster_id() {
        copy = copy.with_cluster_id(v.clone());
    }
    copy.with_headers(headers)
}

/// The dead-letter headers added to a copy moved to a dead-letter queue by Courier. The
/// copy has no time-to-live (a DLQ keeps what it holds); the message's own is kept in
/// [`H_DEAD_LETTER_TIME_TO_LIVE`], for a resubmitted copy to count it again from the
/// resubmit.
pub(crate) fn dead_letter_headers(m: &mut Envelope, reason: &str, description: &str, source: &str) {
    for (k, v) in [
        (H_DEAD_LETTER_REASON, reason),
        (H_DEAD_LETTER_DESCRIPTION, description),
        (H_DEAD_LETTER_SOURCE, source),
    ] {
        m.properties.insert(k.to_owned(), PropertyValue::from(v));
    }
    if let Some(ttl) = m.time_to_live.take() {
        let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        m.properties
            .insert(H_DEAD_LETTER_TIME_TO_LIVE.to_owned(), PropertyValue::Int(ms));
    }
}

/// The session id of a message as published (header [`H_SESSION_ID`]) when it is one a
/// sender would take: a string of valid UTF-8, 1 to `MAX_MESSAGE_ID_LEN` bytes.
pub(crate) fn session_id_of(p: &BasicProperties) -> Option<String> {
    let id = match p.headers().as_ref()?.inner().get(H_SESSION_ID)? {
        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?.to_owned(),
        AMQPValue::ShortString(s) if s.invalid_utf8().is_none() => s.as_str().to_owned(),
        _ => return None,
    };
    (!id.is_empty() && id.len() <= crate::checks::MAX_MESSAGE_ID_LEN).then_some(id)
}

fn text(v: &AMQPValue) -> Option<String> {
    match v {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

/// An AMQP integer header value (of any width, or a timestamp) as an `i64`.
pub(super) fn int(v: &AMQPValue) -> Option<i64> {
    match v {
        AMQPValue::ShortShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortInt(n) => Some(i64::from(*n)),
        AMQPValue::ShortUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// An application property; a long string that is not UTF-8 is bytes, and ignored as a
/// byte array is.
pub(super) fn property(v: &AMQPValue) -> Option<PropertyValue> {
    match v {
        AMQPValue::Boolean(b) => Some(PropertyValue::Bool(*b)),
        AMQPValue::Float(f) => Some(PropertyValue::Float(f64::from(*f))),
        AMQPValue::Double(f) => Some(PropertyValue::Float(*f)),
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok().map(PropertyValue::String),
        AMQPValue::ShortString(s) if s.invalid_utf8().is_none() => Some(PropertyValue::String(s.as_str().to_owned())),
        other => int(other).map(PropertyValue::Int),
    }
}

/// What RabbitMQ's own dead-lettering says, mapped onto Courier's reasons.
fn death_reason(headers: &FieldTable) -> Option<(String, String, Option<String>)> {
    let AMQPValue::FieldArray(deaths) = headers.inner().get(H_DEATH)? else {
        return None;
    };
    let AMQPValue::FieldTable(first) = deaths.as_slice().first()? else {
        return None;
    };
    let raw = first.inner().get("reason").and_then(text)?;
    let queue = first.inner().get("queue").and_then(text);
    let (reason, description) = match raw.as_str() {
        "delivery_limit" if queue.as_deref().is_some_and(super::sessions::is_partition_queue) => (
            reasons::MAX_DELIVERY_COUNT_EXCEEDED,
            "the message went back to its session partition more often than the partition's limit (100): each \
             time a process holding it died, lost its connection or handed the partition on; a message whose \
             handling kills its process does this (docs/rabbitmq.md, \"Sessions\")",
        ),
        "delivery_limit" => (
            reasons::MAX_DELIVERY_COUNT_EXCEEDED,
            "the message was delivered more often than the queue's max delivery count",
        ),
        "expired" => (reasons::TTL_EXPIRED, "the message's time-to-live passed"),
        "maxlen" => ("QueueLengthExceeded", "the queue was full"),
        _ => ("Rejected", "a consumer rejected the message without requeueing it"),
    };
    Some((reason.to_owned(), description.to_owned(), queue))
}

/// A received AMQP message as Courier's [`ReceivedMessage`](crate::ReceivedMessage) parts.
pub(crate) struct Decoded {
    pub(crate) envelope: Envelope,
    pub(crate) broker: BrokerProperties,
}

/// A time-to-live in milliseconds, if Courier's senders could send it: 1 ms to
/// [`MAX_TIME_TO_LIVE`](crate::entity::MAX_TIME_TO_LIVE).
pub(crate) fn time_to_live_of(ms: i64) -> Option<Duration> {
    let ttl = Duration::from_millis(u64::try_from(ms).ok()?);
    (!ttl.is_zero() && ttl <= crate::entity::MAX_TIME_TO_LIVE).then_some(ttl)
}

/// The delivery count of a delivery: 1 on a first delivery (`redelivered` false),
/// whatever a producer wrote in `x-delivery-count`; on a redelivery, the earlier
/// deliveries RabbitMQ's quorum queue wrote there, plus this one. RabbitMQ 3.10 passes a
/// producer's header on to a consumer as it was set on a first delivery, and writes its own
/// count over it on every redelivery (`tests/amqp/retry_headers.rs` checks both), so the
/// header counts only where the broker set the `redelivered` flag. What is read is held
/// to 1 (a redelivery had an earlier delivery) to [`MAX_EARLIER_DELIVERIES`]; a missing
/// or non-integer header on a redelivery counts as one earlier delivery.
fn delivery_count(headers: &FieldTable, redelivered: bool) -> u32 {
    if !redelivered {
        return 1;
    }
    let earlier = headers
        .inner()
        .get(H_DELIVERY_COUNT)
        .and_then(int)
        .unwrap_or(1)
        .clamp(1, MAX_EARLIER_DELIVERIES);
    // 2 to 10001: always a u32.
    u32::try_from(earlier.saturating_add(1)).unwrap_or(u32::MAX)
}

/// Decodes what RabbitMQ delivered. Missing Courier headers (a producer in another
/// language) fall back: no message id leaves the envelope's id empty (the endpoint
/// decides: see `EndpointBuilder::accept_messages_without_id`), no enqueued time takes
/// the AMQP timestamp, then `now`. `redelivered` is the delivery's flag (false where
/// there is none: a parked dead letter); the delivery count trusts `x-delivery-count` only
/// when it is set.
pub(crate) fn decode(
    p: &BasicProperties,
    body: Vec<u8>,
    dead_letter_queue: bool,
    redelivered: bool,
    lock_token: Option<LockToken>,
    now: DateTime<Utc>,
) -> Decoded {
    let empty = FieldTable::default();
    let headers = p.headers().as_ref().unwrap_or(&empty);
    let get = |k: &str| headers.inner().get(k);
    let mut properties = Properties::new();
    for (k, v) in headers {
        // A name that is not UTF-8 (kept by the patched parser) is no property: a main
        // queue's receiver refuses the message (`inspect`), a DLQ's reads the rest.
        if k.as_str().starts_with("x-") || k.invalid_utf8().is_some() {
            continue;
        }
        if let Some(v) = property(v) {
            properties.insert(k.as_str().to_owned(), v);
        }
    }
    let enqueued_time = get(H_ENQUEUED_TIME)
        .and_then(int)
        .and_then(from_millis)
        .or_else(|| {
            p.timestamp()
                .and_then(|s| i64::try_from(s).ok())
                .and_then(|s| Utc.timestamp_opt(s, 0).single())
        })
        .unwrap_or(now);
    // Courier's header, else `expiration`; a value outside Courier's range is none: a main
    // queue's receiver refuses the message (`inspect`), a DLQ's reads it without one.
    let time_to_live = get(H_TIME_TO_LIVE)
        .and_then(int)
        .or_else(|| p.expiration().as_ref().and_then(|e| e.as_str().parse::<i64>().ok()))
        .and_then(time_to_live_of);
    let expires_at = time_to_live
        .and_then(|ttl| chrono::Duration::from_std(ttl).ok())
        .and_then(|ttl| enqueued_time.checked_add_signed(ttl));
    let delivery_count = delivery_count(headers, redelivered);
    let mut dead_letter_reason = get(H_DEAD_LETTER_REASON).and_then(text);
    let mut dead_letter_description = get(H_DEAD_LETTER_DESCRIPTION).and_then(text);
    let mut dead_letter_source = get(H_DEAD_LETTER_SOURCE).and_then(text);
    for k in [H_DEAD_LETTER_REASON, H_DEAD_LETTER_DESCRIPTION, H_DEAD_LETTER_SOURCE] {
        properties.remove(k);
    }
    if dead_letter_queue
        && dead_letter_reason.is_none()
        && let Some((reason, description, source)) = death_reason(headers)
    {
        dead_letter_reason = Some(reason);
        dead_letter_description = Some(description);
        dead_letter_source = source;
    }
    let envelope = Envelope {
        message_id: p
            .message_id()
            .as_ref()
            .map_or_else(String::new, |id| id.as_str().to_owned()),
        correlation_id: p.correlation_id().as_ref().map(|s| s.as_str().to_owned()),
        causation_id: get(H_CAUSATION_ID).and_then(text),
        message_type: p.kind().as_ref().map(|s| s.as_str().to_owned()),
        content_type: p.content_type().as_ref().map(|s| s.as_str().to_owned()),
        body: body.into(),
        properties,
        session_id: get(H_SESSION_ID).and_then(text),
        reply_to: p.reply_to().as_ref().map(|s| s.as_str().to_owned()),
        time_to_live,
        scheduled_enqueue_time: None,
    };
    let broker = BrokerProperties {
        sequence_number: get(H_SEQUENCE_NUMBER).and_then(int).unwrap_or(0),
        enqueued_time,
        delivery_count,
        lock_token,
        locked_until: None,
        state: if dead_letter_queue {
            MessageState::DeadLettered
        } else {
            MessageState::Active
        },
        expires_at,
        dead_letter_reason,
        dead_letter_description,
        dead_letter_source,
    };
    Decoded { envelope, broker }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_survives_the_round_trip() {
        let now = Utc::now();
        let at = from_millis(millis(now)).unwrap_or(now);
        let m = Envelope::new("body")
            .with_message_id("m-1")
            .with_correlation_id("c")
            .with_causation_id("cause")
            .with_message_type("billing.Charge")
            .with_content_type("application/json")
            .with_reply_to("replies")
            .with_time_to_live(Duration::from_secs(10))
            .with_property("s", "text")
            .with_property("i", 7_i64)
            .with_property("b", true)
            .with_property("f", 1.5);
        let p = properties(&m, at, 42).unwrap_or_default();
        let d = decode(&p, b"body".to_vec(), false, false, None, now);
        assert_eq!(d.envelope, m);
        assert_eq!(d.broker.sequence_number, 42);
        assert_eq!(d.broker.enqueued_time, at);
        assert_eq!(d.broker.delivery_count, 1);
        assert_eq!(d.broker.expires_at, Some(at + chrono::Duration::seconds(10)));
    }

    #[test]
    fn a_partition_limit_says_what_returned_the_message() {
        let death = |queue: &str| {
            let mut entry = FieldTable::default();
            entry.insert("reason".into(), AMQPValue::LongString("delivery_limit".into()));
            entry.insert("queue".into(), AMQPValue::LongString(queue.into()));
            let mut headers = FieldTable::default();
            headers.insert(
                H_DEATH.into(),
                AMQPValue::FieldArray(vec![AMQPValue::FieldTable(entry)].into()),
            );
            death_reason(&headers)
        };
        let plain = death("orders");
        let partition = death("orders::session-3-of-16");
        assert_eq!(
            plain.as_ref().map(|d| d.0.as_str()),
            Some(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        );
        assert_eq!(
            partition.as_ref().map(|d| d.0.as_str()),
            Some(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
        );
        assert!(plain.is_some_and(|d| d.1.contains("max delivery count")));
        assert!(partition.is_some_and(|d| d.1.contains("kills its process")));
    }

    #[test]
    fn a_foreign_message_gets_defaults_and_a_long_id_is_refused() {
        let now = Utc::now();
        let d = decode(&BasicProperties::default(), Vec::new(), false, false, None, now);
        assert_eq!(d.envelope.message_id, "", "a missing id is not made up");
        assert_eq!(d.broker.enqueued_time, now);
        let long = Envelope::new("x").with_correlation_id("c".repeat(300));
        let e = properties(&long, now, 1).err().map(|e| e.kind().clone());
        assert!(matches!(e, Some(ErrorKind::InvalidMessage { .. })), "{e:?}");
        let reserved = Envelope::new("x").with_property("x-courier-time-to-live", 5_i64);
        let e = properties(&reserved, now, 1).err().map(|e| e.kind().clone());
        assert!(matches!(e, Some(ErrorKind::InvalidMessage { .. })), "{e:?}");
    }

    fn with_header(name: &str, value: AMQPValue) -> BasicProperties {
        let mut headers = FieldTable::default();
        headers.insert(name.into(), value);
        BasicProperties::default().with_headers(headers)
    }

    #[test]
    fn a_producers_delivery_count_is_not_read_on_a_first_delivery() {
        let now = Utc::now();
        for value in [
            AMQPValue::LongLongInt(1000),
            AMQPValue::LongLongInt(-5),
            AMQPValue::LongLongInt(i64::MAX),
            AMQPValue::LongLongInt(i64::MIN),
            AMQPValue::LongInt(i32::MAX),
            AMQPValue::Timestamp(u64::MAX),
            AMQPValue::LongString("1000".into()),
        ] {
            let p = with_header(H_DELIVERY_COUNT, value.clone());
            for dead_letter_queue in [false, true] {
                let d = decode(&p, Vec::new(), dead_letter_queue, false, None, now);
                assert_eq!(d.broker.delivery_count, 1, "{value:?}");
            }
        }
    }

    #[test]
    fn on_a_redelivery_rabbitmqs_count_is_read_within_range() {
        let now = Utc::now();
        let count = |value: Option<AMQPValue>| {
            let p = value.map_or_else(BasicProperties::default, |v| with_header(H_DELIVERY_COUNT, v));
            decode(&p, Vec::new(), false, true, None, now).broker.delivery_count
        };
        // What RabbitMQ writes: earlier deliveries.
        assert_eq!(count(Some(AMQPValue::LongLongInt(1))), 2);
        assert_eq!(count(Some(AMQPValue::LongLongInt(4))), 5);
        assert_eq!(count(Some(AMQPValue::LongInt(9_999))), 10_000);
        // A redelivery had an earlier delivery; no more than a queue's max delivery count.
        assert_eq!(count(Some(AMQPValue::LongLongInt(0))), 2);
        assert_eq!(count(Some(AMQPValue::LongLongInt(-5))), 2);
        assert_eq!(count(None), 2);
        assert_eq!(count(Some(AMQPValue::LongString("3".into()))), 2);
        assert_eq!(count(Some(AMQPValue::LongLongInt(i64::MAX))), 10_001);
        assert_eq!(count(Some(AMQPValue::Timestamp(u64::MAX))), 2);
    }

    #[test]
    fn a_time_to_live_out_of_courier_s_range_is_not_carried() {
        let now = Utc::now();
        let max = i64::try_from(crate::entity::MAX_TIME_TO_LIVE.as_millis()).unwrap_or(i64::MAX);
        let ttl = |p: BasicProperties| {
            let d = decode(&p, Vec::new(), false, false, None, now);
            (d.envelope.time_to_live, d.broker.expires_at.is_some())
        };
        for ms in [0, -1, max + 1, i64::MAX, i64::MIN] {
            let header = with_header(H_TIME_TO_LIVE, AMQPValue::LongLongInt(ms));
            assert_eq!(ttl(header), (None, false), "header {ms}");
            let expiration = BasicProperties::default().with_expiration(ms.to_string().as_str().into());
            assert_eq!(ttl(expiration), (None, false), "expiration {ms}");
        }
        // The header decides when it is an integer, even out of range: no fallback.
        let both = with_header(H_TIME_TO_LIVE, AMQPValue::LongLongInt(0)).with_expiration("5000".into());
        assert_eq!(ttl(both), (None, false));
        for ms in [1, 5000, max] {
            let want = (Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))), true);
            assert_eq!(ttl(with_header(H_TIME_TO_LIVE, AMQPValue::LongLongInt(ms))), want);
            let expiration = BasicProperties::default().with_expiration(ms.to_string().as_str().into());
            assert_eq!(ttl(expiration), want);
        }
        // A header that is no integer falls back to the expiration.
        let text = with_header(H_TIME_TO_LIVE, AMQPValue::LongString("soon".into())).with_expiration("+5".into());
        assert_eq!(ttl(text), (Some(Duration::from_millis(5)), true));
    }

    #[test]
    fn names_cannot_collide_with_user_names() {
        assert_eq!(queue_of(&EntityPath::queue("billing")), "billing");
        assert_eq!(queue_of(&EntityPath::queue("billing").dead_letter()), "billing::dlq");
        assert_eq!(
            queue_of(&EntityPath::subscription("orders", "billing")),
            "orders::billing"
        );
        assert!(crate::entity::validate_name("billing::dlq").is_err());
    }
}
