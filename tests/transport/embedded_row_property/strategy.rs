//! The generator of rows: every value of the columns' own types, and in a third of the
//! rows values of other types too, which the table refuses.

use std::time::Duration;

use proptest::prelude::*;

use super::row::{Cell, Id, Row, SEQ_BITS, Seq, Session, Time};
use super::{Json, MAX_TTL, Shape, Target, offset, properties, shape, target, text_value};

/// A value of another type than the column's.
fn odd_type() -> impl Strategy<Value = Cell> {
    prop_oneof![
        prop::sample::select(vec![1.5_f64, -0.5, 1e300, -1e300, 0.0]).prop_map(Cell::Real),
        prop::sample::select(vec!["0", "1", "abc", "", "9223372036854775808"]).prop_map(|s| Cell::Text(s.into())),
        prop::collection::vec(any::<u8>(), 0..9).prop_map(Cell::Blob),
    ]
}

/// A NOT NULL integer column: `good`; with `refused`, sometimes NULL or another type.
fn int(good: impl Strategy<Value = i64> + 'static, refused: bool) -> BoxedStrategy<Cell> {
    if refused {
        prop_oneof![24 => good.prop_map(Cell::Int), 1 => Just(Cell::Null), 1 => odd_type()].boxed()
    } else {
        good.prop_map(Cell::Int).boxed()
    }
}

fn i64_edge() -> impl Strategy<Value = i64> {
    prop::sample::select(vec![
        0,
        -1,
        1,
        i64::MIN,
        i64::MAX,
        i64::from(i32::MAX),
        i64::from(u32::MAX),
        (1 << SEQ_BITS) - 1,
        1 << SEQ_BITS,
    ])
}

fn state(refused: bool) -> BoxedStrategy<Cell> {
    int(
        prop_oneof![
            8 => Just(0_i64),
            30 => 1_i64..=4,
            1 => prop::sample::select(vec![-1_i64, 5, i64::MAX]),
        ],
        refused,
    )
}

fn delivery_count(refused: bool) -> BoxedStrategy<Cell> {
    int(
        prop_oneof![8 => Just(0_i64), 12 => 1_i64..=12, 4 => i64_edge(), 1 => any::<i64>()],
        refused,
    )
}

fn ttl_ms(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        8 => Just(Cell::Null),
        4 => (1_i64..=3_600_000).prop_map(Cell::Int),
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
        .prop_map(Cell::Int),
        1 => any::<i64>().prop_map(Cell::Int),
    ];
    if refused {
        prop_oneof![16 => admitted, 1 => odd_type()].boxed()
    } else {
        admitted.boxed()
    }
}

/// A time column: NULL (weight `null_weight`, 0 for none), times, and with `refused`
/// a value of another type.
fn time(null_weight: u32, refused: bool) -> BoxedStrategy<Time> {
    let times = prop_oneof![
        10 => offset().prop_map(Time::Now),
        1 => (-1_000_i64..=1_000).prop_map(Time::Horizon),
        2 => prop::sample::select(vec![i64::MIN, i64::MAX, 0, -1, i64::MAX / 2]).prop_map(Time::Micros),
    ];
    match (null_weight, refused) {
        (0, false) => times.boxed(),
        (0, true) => prop_oneof![13 => times, 1 => odd_type().prop_map(Time::Odd)].boxed(),
        (n, false) => prop_oneof![n => Just(Time::Null), 13 => times].boxed(),
        (n, true) => prop_oneof![
            n => Just(Time::Null),
            13 => times,
            1 => odd_type().prop_map(Time::Odd),
        ]
        .boxed(),
    }
}

/// A text column: a text, NULL (`nullable`), bytes that are not UTF-8 (as text), or an
/// integer (kept as its text); with `refused`, bytes as a blob, and NULL in a NOT NULL
/// column.
fn text(nullable: bool, refused: bool) -> BoxedStrategy<Cell> {
    let not_utf8 = || prop::sample::select(vec![vec![0xff_u8, 0xfe], b"corr-\xff".to_vec(), vec![0xc3]]);
    let admitted = prop_oneof![
        30 => text_value().prop_map(Cell::Text),
        2 => not_utf8().prop_map(Cell::NotUtf8),
        1 => any::<i64>().prop_map(Cell::Int),
    ];
    let value = if refused {
        prop_oneof![33 => admitted, 2 => not_utf8().prop_map(Cell::Blob)].boxed()
    } else {
        admitted.boxed()
    };
    match (nullable, refused) {
        (true, _) => prop_oneof![3 => Just(Cell::Null), 10 => value].boxed(),
        (false, true) => prop_oneof![40 => value, 1 => Just(Cell::Null)].boxed(),
        (false, false) => value,
    }
}

fn session(refused: bool) -> impl Strategy<Value = Session> {
    prop_oneof![3 => text(true, refused).prop_map(Session::Cell), 1 => Just(Session::SameAsTheValidMessage)]
}

fn props(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        10 => properties().prop_map(|Json(v)| v.map_or(Cell::Null, |v| Cell::Text(v.to_string()))),
        1 => Just(Cell::NotUtf8(b"{\"a\":\"\xff\"}".to_vec())),
        1 => Just(Cell::Text("{\"a\":".into())),
        1 => Just(Cell::Int(7)),
    ];
    if refused {
        prop_oneof![13 => admitted, 1 => Just(Cell::Blob(b"{\"a\":\"\xff\"}".to_vec()))].boxed()
    } else {
        admitted.boxed()
    }
}

fn body(refused: bool) -> BoxedStrategy<Cell> {
    let admitted = prop_oneof![
        10 => Just(Cell::Blob(b"{}".to_vec())),
        4 => prop::collection::vec(any::<u8>(), 0..32).prop_map(Cell::Blob),
        2 => Just(Cell::Blob(Vec::new())),
        1 => Just(Cell::Blob(vec![b'b'; 1 << 20])),
        1 => Just(Cell::Blob(vec![b'b'; (1 << 20) + 1])),
    ];
    if refused {
        prop_oneof![
            18 => admitted,
            1 => Just(Cell::Text("{}".into())),
            1 => prop_oneof![4 => Just(Cell::Int(0)), 1 => Just(Cell::Null)],
        ]
        .boxed()
    } else {
        admitted.boxed()
    }
}

/// A row: in a third of the cases any column may hold a value of a type the table refuses
/// (a real, a text or a blob where an integer belongs, a blob in a text column, text as the
/// body, NULL in a NOT NULL column); in the others every value has its column's type, so
/// that most rows get past the table's types to its CHECK constraints and the broker.
pub(super) fn row() -> impl Strategy<Value = Row> {
    prop_oneof![1 => row_of(true), 2 => row_of(false)]
}

fn row_of(refused: bool) -> impl Strategy<Value = Row> {
    let entities = (
        shape(),
        prop::sample::select(vec![10_u32, 1, 3]),
        prop_oneof![4 => Just(None), 1 => Just(Some(Duration::from_secs(3600))), 1 => Just(Some(MAX_TTL))],
        target(),
        prop_oneof![12 => Just(Id::OfItsEntity), 1 => any::<i64>().prop_map(Id::Value)],
        prop_oneof![
            12 => Just(Seq::Next),
            1 => Just(Seq::NextNotRaised),
            1 => i64_edge().prop_map(Seq::Value),
        ],
    );
    let numbers = (state(refused), delivery_count(refused), ttl_ms(refused));
    let times = (
        time(12, refused),
        prop_oneof![6 => Just(Time::Now(0)), 4 => time(u32::from(refused), refused)],
        time(4, refused),
        time(4, refused),
    );
    let texts = (
        session(refused),
        text(false, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
    );
    let rest = (
        props(refused),
        text(true, refused),
        text(true, refused),
        text(true, refused),
        body(refused),
    );
    (entities, numbers, times, texts, rest).prop_map(
        |(
            (shape, max_delivery_count, default_ttl, target, id, seq),
            (state, delivery_count, ttl_ms),
            (locked_until, enqueued_at, scheduled_at, expires_at),
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
            id,
            seq,
            state,
            delivery_count,
            locked_until,
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
