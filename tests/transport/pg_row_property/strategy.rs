//! The generator of rows: a proptest strategy for every column of the odd row (NULLs, the
//! extremes of every integer, the far times, long texts and bodies, properties of any JSON
//! shape) and for the whole `Row`.

use std::time::Duration;

use proptest::prelude::*;

use super::row::{Body, Holder, Json, Row, Session, Shape, Target, Text, Time};
use super::{HORIZON_DAYS, MAX_TTL};

pub(crate) fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![5 => Just(Shape::Queue), 3 => Just(Shape::Topic), 3 => Just(Shape::Sessions)]
}

pub(crate) fn target() -> impl Strategy<Value = Target> {
    prop_oneof![16 => Just(Target::Receiving), 6 => Just(Target::Topic), 1 => Just(Target::Missing)]
}

/// Milliseconds from now: at it, around it, around a lock duration + 5 min, and up to
/// 100 years either way.
pub(crate) fn offset() -> impl Strategy<Value = i64> {
    let years = HORIZON_DAYS * 24 * 3600 * 1000;
    prop_oneof![
        Just(0_i64),
        -2_000_i64..=2_000,
        -120_000_i64..=120_000,
        -400_000_i64..=400_000,
        -years..=years,
    ]
}

fn time(null_weight: u32) -> impl Strategy<Value = Time> {
    prop_oneof![
        null_weight => Just(Time::Null),
        8 => offset().prop_map(Time::Now),
        1 => (-1_000_i64..=1_000).prop_map(Time::Horizon),
        1 => Just(Time::Infinity),
        1 => Just(Time::MinusInfinity),
        1 => Just(Time::FarPast),
        1 => Just(Time::FarFuture),
        1 => Just(Time::BeyondChrono),
        1 => Just(Time::Epoch),
    ]
}

fn i64_edge() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0_i64),
        Just(-1),
        Just(1),
        Just(i64::MIN),
        Just(i64::MAX),
        any::<i64>()
    ]
}

fn holder() -> impl Strategy<Value = Holder> {
    prop_oneof![2 => Just(Holder::Null), 3 => Just(Holder::Alive), 3 => i64_edge().prop_map(Holder::Key)]
}

fn state() -> impl Strategy<Value = Option<i16>> {
    prop_oneof![
        8 => Just(Some(0_i16)),
        24 => (1_i16..=3).prop_map(Some),
        1 => Just(None),
        1 => prop::sample::select(vec![i16::MIN, -1, 4, i16::MAX]).prop_map(Some),
    ]
}

fn delivery_count() -> impl Strategy<Value = Option<i32>> {
    prop_oneof![
        8 => Just(Some(0_i32)),
        12 => (1_i32..=12).prop_map(Some),
        3 => prop::sample::select(vec![i32::MIN, -1, i32::MAX - 1, i32::MAX]).prop_map(Some),
        1 => any::<i32>().prop_map(Some),
        1 => Just(None),
    ]
}

fn ttl_ms() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![
        8 => Just(None),
        4 => (1_i64..=3_600_000).prop_map(Some),
        2 => prop::sample::select(vec![
            i64::MIN,
            -1,
            0,
            1,
            3_162_240_000_000,
            3_162_240_000_001,
            10_000_000_000_000_000,
            i64::MAX,
        ])
        .prop_map(Some),
        1 => any::<i64>().prop_map(Some),
    ]
}

fn seq() -> impl Strategy<Value = Option<i64>> {
    prop_oneof![6 => Just(None), 1 => i64_edge().prop_map(Some)]
}

/// A text: short, empty, any Unicode (Postgres text holds no NUL), terminal escapes,
/// around 128 bytes (one- and two-byte characters), 70 KB and 1 MiB.
pub(crate) fn text_value() -> impl Strategy<Value = String> {
    prop_oneof![
        20 => "[a-z0-9.-]{1,12}",
        4 => Just(String::new()),
        6 => any::<String>().prop_map(|s| s.replace('\0', "")),
        2 => Just("\u{1b}[31mred\u{1b}[0m\r\nnext".to_owned()),
        4 => (120_usize..=132).prop_map(|n| "a".repeat(n)),
        2 => (62_usize..=66).prop_map(|n| "é".repeat(n)),
        1 => Just("x".repeat(70_000)),
        1 => Just("y".repeat(1 << 20)),
    ]
}

fn text(nullable: bool) -> BoxedStrategy<Text> {
    if nullable {
        prop_oneof![3 => Just(Text(None)), 10 => text_value().prop_map(|s| Text(Some(s)))].boxed()
    } else {
        prop_oneof![40 => text_value().prop_map(|s| Text(Some(s))), 1 => Just(Text(None))].boxed()
    }
}

fn session() -> impl Strategy<Value = Session> {
    prop_oneof![3 => text(true).prop_map(Session::Text), 1 => Just(Session::SameAsTheValidMessage)]
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        10 => Just(Body(Some(b"{}".to_vec()))),
        4 => prop::collection::vec(any::<u8>(), 0..32).prop_map(|b| Body(Some(b))),
        2 => Just(Body(Some(Vec::new()))),
        1 => Just(Body(Some(vec![b'b'; 1 << 20]))),
        1 => Just(Body(Some(vec![b'b'; (1 << 20) + 1]))),
        1 => prop_oneof![9 => Just(Body(Some(b"[]".to_vec()))), 1 => Just(Body(None))],
    ]
}

/// Text with no NUL, which neither `text` nor `jsonb` holds.
fn no_nul(v: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(s.replace('\0', "")),
        Value::Array(a) => Value::Array(a.into_iter().map(no_nul).collect()),
        Value::Object(o) => Value::Object(o.into_iter().map(|(k, v)| (k.replace('\0', ""), no_nul(v))).collect()),
        other => other,
    }
}

/// Any JSON value, nested a few levels.
fn json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
        any::<String>().prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

fn scalar() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (-1e300_f64..1e300).prop_map(serde_json::Value::from),
        "[ -~]{0,8}".prop_map(serde_json::Value::from),
    ]
}

/// Properties: none, Courier's (an object of scalars), Courier's own header names with odd
/// values, and any JSON.
pub(crate) fn properties() -> impl Strategy<Value = Json> {
    let reserved = (
        prop::sample::select(vec![
            "courier.retry.delayed",
            "courier.failure.attempts",
            "courier.message.version",
            "courier.saga.timeout_due",
            "traceparent",
        ]),
        prop::sample::select(vec![
            serde_json::json!(-1),
            serde_json::json!(0),
            serde_json::json!(1),
            serde_json::json!(i64::MAX),
            serde_json::json!(u64::MAX),
            serde_json::json!(1.5),
            serde_json::json!("x"),
            serde_json::json!(true),
            serde_json::json!(null),
        ]),
    )
        .prop_map(|(k, v)| serde_json::json!({ k: v }));
    prop_oneof![
        4 => Just(Json(None)),
        3 => prop::collection::btree_map("[a-z.]{1,8}", scalar(), 0..4)
            .prop_map(|m| Json(Some(serde_json::Value::Object(m.into_iter().collect())))),
        2 => reserved.prop_map(|v| Json(Some(v))),
        2 => json().prop_map(|v| Json(Some(no_nul(v)))),
    ]
}

pub(super) fn row() -> impl Strategy<Value = Row> {
    let entities = (
        shape(),
        prop::sample::select(vec![10_u32, 1, 3]),
        prop_oneof![4 => Just(None), 1 => Just(Some(Duration::from_secs(3600))), 1 => Just(Some(MAX_TTL))],
        target(),
    );
    let numbers = (seq(), state(), delivery_count(), ttl_ms());
    let times = (
        time(14),
        holder(),
        prop_oneof![6 => Just(Time::Now(0)), 4 => time(1)],
        time(4),
        time(4),
    );
    let texts = (
        session(),
        text(false),
        text(true),
        text(true),
        text(true),
        text(true),
        text(true),
    );
    let rest = (properties(), text(true), text(true), text(true), body());
    (entities, numbers, times, texts, rest).prop_map(
        |(
            (shape, max_delivery_count, default_ttl, target),
            (seq, state, delivery_count, ttl_ms),
            (locked_until, holder, enqueued_at, scheduled_at, expires_at),
            (session_id, message_id, correlation_id, causation_id, message_type, content_type, reply_to),
            (properties, dl_reason, dl_description, dl_source, body),
        )| Row {
            shape,
            max_delivery_count,
            default_ttl,
            target: if target == Target::Topic && shape != Shape::Topic {
                Target::Receiving
            } else {
                target
            },
            seq,
            state,
            delivery_count,
            locked_until,
            holder,
            session_id,
            enqueued_at,
            scheduled_at,
            expires_at,
            ttl_ms,
            message_id,
            correlation_id,
            causation_id,
            message_type,
            content_type,
            reply_to,
            properties,
            dl_reason,
            dl_description,
            dl_source,
            body,
        },
    )
}
