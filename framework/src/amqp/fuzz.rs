//! Property tests of what a RabbitMQ receiver reads from a producer it does not control:
//! arbitrary properties and headers (text that is not UTF-8, ids of any length, nested
//! tables, values of every AMQP type under Courier's own header names) through
//! `wire::decode` and `inspect::inspect`. Nothing may panic; every message that is not
//! refused decodes to an envelope that keeps Courier's limits, and no header makes a
//! message skip its retry policy: a producer's `x-delivery-count` counts for nothing on a
//! first delivery, and no time-to-live outside 1 ms to 100 years is carried.
//!
//! `cargo test -p courier --features amqp --lib fuzz` runs a short version (256 cases);
//! `COURIER_FUZZ_CASES=200000` a long one (see docs/rabbitmq.md).

use chrono::Utc;
use lapin::BasicProperties;
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use proptest::prelude::*;

use super::inspect::inspect;
use super::wire::{H_SESSION_ID, H_TIME_TO_LIVE, decode};
use crate::checks::MAX_MESSAGE_ID_LEN;
use crate::entity::MAX_TIME_TO_LIVE;

use crate::fuzz::cases;

/// A short string as the patched parser makes it from received bytes (at most 255).
fn short_string() -> impl Strategy<Value = ShortString> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(ShortString::from),
        proptest::collection::vec(any::<u8>(), 0..255).prop_map(ShortString::from_received_bytes),
    ]
}

/// Courier's header names, and others.
fn header_name() -> impl Strategy<Value = ShortString> {
    prop_oneof![
        prop::sample::select(vec![
            "x-courier-enqueued-time",
            "x-courier-sequence-number",
            "x-courier-time-to-live",
            "x-courier-session-id",
            "x-courier-causation-id",
            "x-courier-dead-letter-reason",
            "x-courier-dead-letter-description",
            "x-courier-dead-letter-source",
            "x-courier-delivery-count",
            "x-delivery-count",
            "x-courier-unknown",
            "x-death",
            "traceparent",
            "courier.saga.timeout",
        ])
        .prop_map(ShortString::from),
        short_string(),
    ]
}

/// The longest time-to-live Courier sends, in milliseconds.
fn max_ttl_ms() -> i64 {
    i64::try_from(crate::entity::MAX_TIME_TO_LIVE.as_millis()).unwrap_or(i64::MAX)
}

/// Integers at the edges of the counts and time-to-lives Courier reads.
fn edge_int() -> impl Strategy<Value = i64> {
    prop::sample::select(vec![
        i64::MIN,
        -1,
        0,
        1,
        2,
        9_999,
        10_000,
        10_001,
        max_ttl_ms(),
        max_ttl_ms() + 1,
        i64::MAX,
    ])
}

/// An `expiration`: any short string, or an integer as text (RabbitMQ delivers 0 to 10
/// years; a raw message may hold anything).
fn expiration() -> impl Strategy<Value = ShortString> {
    prop_oneof![
        short_string(),
        prop_oneof![edge_int(), any::<i64>()].prop_map(|ms| ShortString::from(ms.to_string())),
        prop::sample::select(vec!["00", "+0", "+5", "99999999999999999999999", "-0"]).prop_map(ShortString::from),
    ]
}

fn leaf() -> impl Strategy<Value = AMQPValue> {
    prop_oneof![
        edge_int().prop_map(AMQPValue::LongLongInt),
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        any::<f64>().prop_map(AMQPValue::Double),
        short_string().prop_map(AMQPValue::ShortString),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        Just(AMQPValue::Void),
    ]
}

fn value() -> impl Strategy<Value = AMQPValue> {
    leaf().prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            proptest::collection::vec((header_name(), inner), 0..6).prop_map(|entries| {
                let mut t = FieldTable::default();
                for (k, v) in entries {
                    t.insert(k, v);
                }
                AMQPValue::FieldTable(t)
            }),
        ]
    })
}

prop_compose! {
    fn properties()(
        message_id in proptest::option::of(short_string()),
        correlation_id in proptest::option::of(short_string()),
        kind in proptest::option::of(short_string()),
        content_type in proptest::option::of(short_string()),
        reply_to in proptest::option::of(short_string()),
        expiration in proptest::option::of(expiration()),
        timestamp in proptest::option::of(any::<u64>()),
        headers in proptest::collection::vec((header_name(), value()), 0..10),
    ) -> BasicProperties {
        let mut table = FieldTable::default();
        for (k, v) in headers {
            table.insert(k, v);
        }
        let mut p = BasicProperties::default().with_headers(table);
        if let Some(v) = message_id { p = p.with_message_id(v); }
        if let Some(v) = correlation_id { p = p.with_correlation_id(v); }
        if let Some(v) = kind { p = p.with_type(v); }
        if let Some(v) = content_type { p = p.with_content_type(v); }
        if let Some(v) = reply_to { p = p.with_reply_to(v); }
        if let Some(v) = expiration { p = p.with_expiration(v); }
        if let Some(v) = timestamp { p = p.with_timestamp(v); }
        p
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    /// Whatever a producer publishes, decoding and inspecting it neither panics nor lets
    /// through a message that breaks Courier's limits.
    #[test]
    fn any_delivery_decodes_or_is_refused(
        p in properties(),
        body in proptest::collection::vec(any::<u8>(), 0..256),
        dead_letter_queue in any::<bool>(),
        redelivered in any::<bool>(),
        limit in 64usize..4096,
    ) {
        let decoded = decode(&p, body, dead_letter_queue, redelivered, None, Utc::now());
        let findings = inspect(&p, &decoded.envelope, limit);
        // A time-to-live is carried only in Courier's range (a delayed retry's copy keeps
        // it and must be sendable), in a dead-letter queue too.
        prop_assert!(decoded.envelope.time_to_live.is_none_or(|t| !t.is_zero() && t <= MAX_TIME_TO_LIVE));
        // The count is RabbitMQ's only on a redelivery, and within a queue's range.
        if redelivered {
            prop_assert!((2..=10_001).contains(&decoded.broker.delivery_count));
        } else {
            prop_assert_eq!(decoded.broker.delivery_count, 1);
        }
        // An integer time-to-live out of range, in the header or `expiration`, is refused.
        let header_ttl = p
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get(H_TIME_TO_LIVE).cloned())
            .and_then(|v| match v {
                AMQPValue::Timestamp(n) => Some(i128::from(n)),
                other => super::wire::int(&other).map(i128::from),
            });
        let expiration_ttl = p.expiration().as_ref().and_then(|e| e.as_str().parse::<i128>().ok());
        for ms in [header_ttl, expiration_ttl].into_iter().flatten() {
            let in_range = (1..=i128::from(max_ttl_ms())).contains(&ms);
            prop_assert!(in_range || findings.refusal.is_some(), "{} ms was not refused", ms);
        }
        if findings.refusal.is_none() {
            let e = &decoded.envelope;
            prop_assert!(e.message_id.len() <= MAX_MESSAGE_ID_LEN);
            prop_assert!(e.size() <= limit);
            // Text that is not UTF-8 is refused, never passed on as lossy text.
            for text in [p.message_id(), p.correlation_id(), p.kind(), p.content_type(), p.reply_to()] {
                prop_assert!(text.as_ref().is_none_or(|t| t.invalid_utf8().is_none()));
            }
        } else {
            let refusal = findings.refusal.as_ref().map(|r| r.description.clone()).unwrap_or_default();
            prop_assert!(!refusal.is_empty());
        }
        prop_assert!(decoded.broker.delivery_count >= 1);
    }

    /// Where a resubmit sends a dead letter of a session queue, whatever its headers: the
    /// partition of its session id when that id is one a sender takes (a string of valid
    /// UTF-8, 1 to 128 bytes, the same the receiver decodes), else a refusal that says what
    /// to do; never a guess from lossy text, never a panic.
    #[test]
    fn any_dead_letter_of_a_session_queue_goes_to_its_partition_or_is_refused(
        p in properties(),
        session in proptest::option::of(prop_oneof![
            "\\PC{0,140}".prop_map(|s| AMQPValue::LongString(LongString::from(s))),
            proptest::collection::vec(any::<u8>(), 0..140).prop_map(|b| AMQPValue::LongString(LongString::from(b))),
            short_string().prop_map(AMQPValue::ShortString),
            leaf(),
        ]),
    ) {
        let mut p = p;
        if let Some(v) = session {
            let mut headers = p.headers().clone().unwrap_or_default();
            headers.insert(H_SESSION_ID.into(), v);
            p = p.with_headers(headers);
        }
        let to = super::admin::ResubmitTo::Sessions("orders".into());
        let valid = match p.headers().as_ref().and_then(|h| h.inner().get(H_SESSION_ID)) {
            Some(AMQPValue::LongString(s)) => std::str::from_utf8(s.as_bytes()).ok().map(str::to_owned),
            Some(AMQPValue::ShortString(s)) => s.invalid_utf8().is_none().then(|| s.as_str().to_owned()),
            _ => None,
        }
        .filter(|id| !id.is_empty() && id.len() <= MAX_MESSAGE_ID_LEN);
        match (to.target(&p), valid) {
            (Ok(target), Some(id)) => {
                prop_assert_eq!(target, super::publish::Target::Queue(super::sessions::queue_for("orders", &id)));
                let decoded = decode(&p, Vec::new(), true, false, None, Utc::now());
                prop_assert_eq!(decoded.envelope.session_id, Some(id));
            }
            (Err(why), None) => prop_assert!(why.contains("no valid session id") && why.contains("delete it")),
            (got, valid) => prop_assert!(false, "{:?} for a valid id {:?}", got, valid),
        }
    }

    /// The trace header of any text: a context or none, never a panic; what it accepts
    /// it writes back the same.
    #[test]
    fn any_traceparent_parses_or_is_ignored(text in "\\PC{0,80}") {
        if let Some(t) = crate::TraceContext::parse(&text) {
            prop_assert_eq!(crate::TraceContext::parse(&t.to_string()), Some(t));
        }
    }

    /// A well-formed W3C header parses.
    #[test]
    fn a_wellformed_traceparent_parses(trace in "[0-9a-f]{32}", span in "[0-9a-f]{16}", flags in "0[01]") {
        prop_assume!(trace != "0".repeat(32) && span != "0".repeat(16));
        let header = format!("00-{trace}-{span}-{flags}");
        prop_assert!(crate::TraceContext::parse(&header).is_some(), "{}", header);
    }
}
