//! Property test: any envelope a program may hand `Sender::send` on the Postgres
//! transport, over the whole space of its texts (any characters, NUL among them, empty,
//! longer than the limits) and properties (any names, booleans, integers, floats
//! infinite and NaN included, strings), is either stored and received back as it was
//! sent, or refused with a typed reason (`InvalidMessage`, `MessageTooLarge`) before
//! anything is stored; never a storage error. A text holding a NUL character (which
//! Postgres' `text` and `jsonb` cannot hold) is refused with a reason that says so:
//! before, the insert failed with SQLSTATE 22021 or 22P05, and in a commit group with
//! the group. `COURIER_FUZZ_CASES` sets the number of cases (64: each is a round trip
//! to the server).

use std::time::Duration;

use courier::{EntityPath, Envelope, ErrorKind, PropertyValue, QueueOptions, SenderOptions, Transport, VirtualClock};
use courier_tests::pg_transport::transport;
use proptest::prelude::*;
use uuid::Uuid;

/// Texts: short plain ones, any Unicode, and ones made of a few awkward characters (NUL,
/// DEL, a two-byte letter, the last code point) so that each case meets NUL often.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9-]{1,12}",
        any::<String>(),
        "[a\\x00\\x7fé\\u{10ffff}]{0,6}",
        "[a-z]{120,140}",
    ]
}

fn value() -> impl Strategy<Value = PropertyValue> {
    prop_oneof![
        any::<bool>().prop_map(PropertyValue::Bool),
        any::<i64>().prop_map(PropertyValue::Int),
        prop_oneof![
            any::<f64>(),
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY)
        ]
        .prop_map(PropertyValue::Float),
        text().prop_map(PropertyValue::String),
    ]
}

fn envelope() -> impl Strategy<Value = Envelope> {
    (
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::collection::btree_map(text(), value(), 0..4),
        proptest::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(
                message_id,
                correlation_id,
                causation_id,
                message_type,
                content_type,
                reply_to,
                session_id,
                properties,
                body,
            )| {
                let mut m = Envelope::new(body);
                m.message_id = message_id;
                m.correlation_id = correlation_id;
                m.causation_id = causation_id;
                m.message_type = message_type;
                m.content_type = content_type;
                m.reply_to = reply_to;
                m.session_id = session_id;
                m.properties = properties;
                m
            },
        )
}

/// Whether any text of `m` holds a NUL character.
fn holds_nul(m: &Envelope) -> bool {
    let texts = [
        Some(&m.message_id),
        m.correlation_id.as_ref(),
        m.causation_id.as_ref(),
        m.message_type.as_ref(),
        m.content_type.as_ref(),
        m.reply_to.as_ref(),
        m.session_id.as_ref(),
    ];
    texts.iter().flatten().any(|t| t.contains('\0'))
        || m.properties
            .iter()
            .any(|(k, v)| k.contains('\0') || matches!(v, PropertyValue::String(s) if s.contains('\0')))
}

#[test]
fn any_envelope_is_sent_and_received_as_it_was_or_refused_with_a_reason() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clock = VirtualClock::starting_now();
    let q = format!("any-envelope-{}", Uuid::new_v4().simple());
    let (t, sender, receiver) = rt.block_on(async {
        let t = transport(&clock).await;
        t.create_queue(&q, &QueueOptions::default()).await.unwrap();
        let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
        let receiver = t.receiver(&EntityPath::queue(&q)).await.unwrap();
        (t, sender, receiver)
    });
    let cases = std::env::var("COURIER_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64);
    let config = ProptestConfig {
        cases,
        ..ProptestConfig::default()
    };
    proptest!(config, |(m in envelope())| {
        let nul = holds_nul(&m);
        match rt.block_on(sender.send(m.clone())) {
            Ok(_) => {
                prop_assert!(!nul, "a text with a NUL character was accepted");
                let got = rt.block_on(async {
                    let mut received = Vec::new();
                    for d in receiver.receive(1, Duration::from_secs(5)).await.unwrap() {
                        received.push(d.message().envelope.clone());
                        d.complete().await.unwrap();
                    }
                    received
                });
                prop_assert_eq!(got.len(), 1);
                let e = &got[0];
                prop_assert_eq!(&e.message_id, &m.message_id);
                prop_assert_eq!(&e.correlation_id, &m.correlation_id);
                prop_assert_eq!(&e.causation_id, &m.causation_id);
                prop_assert_eq!(&e.message_type, &m.message_type);
                prop_assert_eq!(&e.content_type, &m.content_type);
                prop_assert_eq!(&e.reply_to, &m.reply_to);
                prop_assert_eq!(&e.session_id, &m.session_id);
                prop_assert_eq!(&e.properties, &m.properties);
                prop_assert_eq!(&e.body, &m.body);
            }
            Err(refused) => {
                let kind = refused.error.kind();
                prop_assert!(
                    matches!(kind, ErrorKind::InvalidMessage { .. } | ErrorKind::MessageTooLarge { .. }),
                    "refused with a storage error or another kind: {}", kind
                );
            }
        }
    });
    rt.block_on(async {
        let counts = t.counts(&EntityPath::queue(&q)).await.unwrap();
        assert_eq!(counts.active + counts.dead_lettered, 0, "nothing refused was stored");
        t.close().await;
    });
}

/// A NUL character in each text of an otherwise valid message: refused, with a reason that
/// names the field and says what to do.
#[tokio::test]
async fn a_nul_character_is_refused_naming_its_field() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = format!("nul-{}", Uuid::new_v4().simple());
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    let nul = || Some("a\0b".to_owned());
    type Set = fn(&mut Envelope, Option<String>);
    let cases: [(&str, Set); 9] = [
        ("message id", |m, v| m.message_id = v.unwrap_or_default()),
        ("correlation id", |m, v| m.correlation_id = v),
        ("causation id", |m, v| m.causation_id = v),
        ("message type", |m, v| m.message_type = v),
        ("content type", |m, v| m.content_type = v),
        ("reply-to address", |m, v| m.reply_to = v),
        ("session id", |m, v| m.session_id = v),
        ("value of property", |m, v| {
            m.properties
                .insert("note".to_owned(), PropertyValue::String(v.unwrap_or_default()));
        }),
        ("name of property", |m, v| {
            m.properties.insert(v.unwrap_or_default(), PropertyValue::Int(1));
        }),
    ];
    for (field, set) in cases {
        let mut m = Envelope::new("{}");
        set(&mut m, nul());
        let refused = sender.send(m).await.expect_err(field);
        let text = refused.error.to_string();
        assert!(
            matches!(refused.error.kind(), ErrorKind::InvalidMessage { .. }),
            "{field}: {text}"
        );
        assert!(
            text.contains(field) && text.contains("NUL") && text.contains("remove it"),
            "{field}: {text}"
        );
    }
    assert_eq!(t.counts(&EntityPath::queue(&q)).await.unwrap().active, 0);
    t.close().await;
}
