//! Session ids on RabbitMQ, as properties (issue 35; docs/rabbitmq.md, "Sessions"):
//!
//! * any session id a producer can give `SendOptions::session_id` / `Envelope::session_id`
//!   (empty, very long, any Unicode, control characters): the send is either refused with
//!   a typed, permanent error that says what to do, or the message reaches exactly one
//!   session, the one a receiver accepts by that id, and nothing else; never lost, never
//!   a panic;
//! * what another producer writes straight into a partition (lapin): a session id header
//!   that is not UTF-8, of another type, missing, or of a session whose hash is another
//!   partition: dead-lettered with a reason or handled, and the partition goes on (a
//!   message sent after them is received).
//!
//! The partition of a session id is computed here as docs/rabbitmq.md gives it (64-bit
//! FNV-1a of the id's UTF-8 bytes, modulo 16), which also checks the docs.

use std::sync::Arc;
use std::time::Duration;

use courier::{
    AmqpTransport, EntityPath, Envelope, ErrorKind, QueueOptions, Receiver, SenderOptions, SessionSelector, Transport,
};
use courier_tests::rabbit::amqp_url;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::support::unique;

/// docs/rabbitmq.md: FNV-1a (64 bits) of the UTF-8 bytes, modulo 16.
pub(crate) fn partition_of(id: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash % 16
}

fn session_id() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just(" ".to_owned()),
        "\\PC{1,40}",
        ".{1,40}",
        "[\\x00-\\x1f\\u{7f}\\u{202e}\\u{feff}]{1,8}",
        (200usize..9000).prop_map(|n| "\u{1F980}x".repeat(n / 2)),
        (1usize..3000).prop_map(|n| "a".repeat(n)),
    ]
}

/// Receives the next message of `r`, waiting up to 15 s.
async fn one(r: &dyn Receiver) -> Option<courier::Delivery> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < deadline {
        if let Some(d) = r.receive(1, Duration::from_millis(300)).await.ok()?.pop() {
            return Some(d);
        }
    }
    None
}

#[test]
fn any_session_id_is_refused_with_a_reason_or_reaches_exactly_its_session() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (t, queue) = rt.block_on(async {
        let t = Arc::new(AmqpTransport::connect(amqp_url().await).await.unwrap());
        let queue = unique("sid");
        t.create_queue(&queue, &QueueOptions::default().requires_session(true))
            .await
            .unwrap();
        (t, queue)
    });
    let path = EntityPath::queue(&queue);
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(24), &session_id(), |n, id| {
        let (t, path, queue) = (t.clone(), path.clone(), queue.clone());
        async move {
            let sender = t.sender(&queue, SenderOptions::default()).await.unwrap();
            let body = format!("case-{n}");
            let sent = sender
                .send(Envelope::new(body.clone()).with_session_id(id.clone()))
                .await;
            if let Err(e) = sent {
                prop_assert!(
                    matches!(
                        e.kind(),
                        ErrorKind::InvalidMessage { .. } | ErrorKind::MessageTooLarge { .. }
                    ),
                    "{id:?}: refused with an untyped error: {e}"
                );
                prop_assert!(!e.is_transient(), "{id:?}: {e}");
                prop_assert!(e.to_string().contains("session"), "{id:?}: the error says what: {e}");
                return Ok(());
            }
            let session = t
                .accept_session(&path, SessionSelector::Named(id.clone()), Duration::from_secs(5))
                .await
                .map_err(|e| TestCaseError::fail(format!("{id:?}: accept: {e}")))?;
            let got = one(session.as_ref()).await;
            let Some(d) = got else {
                return Err(TestCaseError::fail(format!(
                    "{id:?}: sent, never received in its session"
                )));
            };
            prop_assert_eq!(d.message().body(), body.as_bytes());
            prop_assert_eq!(d.message().envelope.session_id.as_deref(), Some(id.as_str()));
            d.complete().await.unwrap();
            session.release().await.unwrap();
            // Nothing of it anywhere else: no session has a message left.
            match t
                .accept_session(&path, SessionSelector::Next, Duration::from_millis(100))
                .await
            {
                Ok(other) => {
                    let left = other.receive(10, Duration::from_millis(200)).await.unwrap();
                    prop_assert!(left.is_empty(), "{id:?}: a copy in session {:?}", other.session_id());
                    other.release().await.unwrap();
                }
                Err(e) => prop_assert!(matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }), "{id:?}: {e}"),
            }
            Ok(())
        }
    });
    rt.block_on(async {
        let dlq = t.receiver(&path.clone().dead_letter()).await.unwrap();
        let dead = dlq.receive(10, Duration::from_millis(500)).await.unwrap();
        assert!(
            dead.is_empty(),
            "nothing a Courier sender sent was dead-lettered: {dead:?}"
        );
        t.delete(&path).await.unwrap();
        t.close().await;
    });
}

/// What a raw publish into partition 3 carries as its session id header.
#[derive(Debug, Clone)]
enum Header {
    Missing,
    /// Any bytes as a long string: a session id when they are one a sender would take
    /// (valid UTF-8, 1 to 128 bytes), else refused. Bytes from 0x80 up are often not UTF-8
    /// but can be (`C2 80` is U+0080), so the case decides by the bytes, not by the
    /// generator.
    Bytes(Vec<u8>),
    Integer(i64),
    /// A session whose hash is another partition.
    OtherPartition(String),
}

impl Header {
    /// The session a message with this header is handled in, if it is handled at all.
    fn names(&self) -> Option<String> {
        match self {
            Header::Bytes(bytes) => std::str::from_utf8(bytes)
                .ok()
                .filter(|s| (1..=128).contains(&s.len()))
                .map(str::to_owned),
            Header::OtherPartition(s) => Some(s.clone()),
            Header::Missing | Header::Integer(_) => None,
        }
    }
}

fn header() -> impl Strategy<Value = Header> {
    prop_oneof![
        Just(Header::Missing),
        proptest::collection::vec(0x80u8..=0xff, 1..20).prop_map(Header::Bytes),
        proptest::collection::vec(any::<u8>(), 0..140).prop_map(Header::Bytes),
        any::<i64>().prop_map(Header::Integer),
        "[a-z]{1,12}"
            .prop_filter("not partition 3", |s| partition_of(s.as_bytes()) != 3)
            .prop_map(Header::OtherPartition),
    ]
}

#[test]
fn a_raw_message_with_a_bad_session_header_never_blocks_its_partition() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let setup = rt.block_on(async {
        let t = Arc::new(AmqpTransport::connect(amqp_url().await).await.unwrap());
        let queue = unique("sidraw");
        t.create_queue(&queue, &QueueOptions::default().requires_session(true))
            .await
            .unwrap();
        let conn = lapin::Connection::connect(&amqp_url().await, lapin::ConnectionProperties::default())
            .await
            .unwrap();
        let channel = conn.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        (t, queue, conn, channel)
    });
    let (t, queue, _conn, channel) = &setup;
    let path = EntityPath::queue(queue);
    // A session of partition 3: what a Courier sender sends after each raw message.
    let good = (0..)
        .map(|i| format!("good-{i}"))
        .find(|s| partition_of(s.as_bytes()) == 3)
        .unwrap();
    courier_tests::run_property(&rt, courier_tests::fuzz_cases(16), &header(), |n, h| {
        let (path, good) = (path.clone(), good.clone());
        async move {
            let mut headers = FieldTable::default();
            match &h {
                Header::Missing => {}
                Header::Bytes(bytes) => {
                    headers.insert(
                        "x-courier-session-id".into(),
                        AMQPValue::LongString(LongString::from(bytes.clone())),
                    );
                }
                Header::Integer(i) => {
                    headers.insert("x-courier-session-id".into(), AMQPValue::LongLongInt(*i));
                }
                Header::OtherPartition(s) => {
                    headers.insert(
                        "x-courier-session-id".into(),
                        AMQPValue::LongString(LongString::from(s.as_bytes().to_vec())),
                    );
                }
            }
            let raw_id = format!("raw-{n}");
            let properties = lapin::BasicProperties::default()
                .with_message_id(raw_id.as_str().into())
                .with_delivery_mode(2)
                .with_headers(headers);
            let partition = format!("{queue}::session-3-of-16");
            let confirm = channel
                .basic_publish(
                    "".into(),
                    partition.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    b"raw",
                    properties,
                )
                .await
                .unwrap()
                .await
                .unwrap();
            prop_assert!(confirm.is_ack());
            let sender = t.sender(queue, SenderOptions::default()).await.unwrap();
            let body = format!("after-{n}");
            sender
                .send(Envelope::new(body.clone()).with_session_id(good.clone()))
                .await
                .unwrap();
            // The partition goes on: the message sent after the raw one is received.
            let session = t
                .accept_session(&path, SessionSelector::Named(good.clone()), Duration::from_secs(5))
                .await
                .unwrap();
            let got = one(session.as_ref()).await;
            let Some(d) = got else {
                return Err(TestCaseError::fail(format!("{h:?}: the partition is blocked")));
            };
            prop_assert_eq!(d.message().body(), body.as_bytes());
            d.complete().await.unwrap();
            session.release().await.unwrap();
            // The raw one: in the DLQ with a reason, or in the session it names.
            // (RabbitMQ cannot browse: the DLQ is received, and emptied, each case.)
            let dlq = t.receiver(&path.clone().dead_letter()).await.unwrap();
            // The refusal is confirmed before the partition goes on, so a dead letter is
            // there by now; the wait only covers a slow consumer start.
            let wait = if h.names().is_some() { 300 } else { 3000 };
            let dead = dlq.receive(10, Duration::from_millis(wait)).await.unwrap();
            let mut found = false;
            for d in dead {
                let m = d.message().clone();
                d.complete().await.unwrap();
                prop_assert_eq!(&m.envelope.message_id, &raw_id, "{:?}: another dead letter", &h);
                prop_assert!(m.broker.dead_letter_reason.is_some(), "{h:?}: {m:?}");
                prop_assert!(m.broker.dead_letter_description.is_some(), "{h:?}: {m:?}");
                found = true;
            }
            if found {
                prop_assert!(
                    h.names().is_none(),
                    "{:?}: a session id a sender takes was dead-lettered",
                    &h
                );
                return Ok(());
            }
            let Some(s) = h.names() else {
                return Err(TestCaseError::fail(format!("{h:?}: neither dead-lettered nor handled")));
            };
            let other = t
                .accept_session(&path, SessionSelector::Named(s), Duration::from_secs(5))
                .await
                .unwrap();
            let got = one(other.as_ref()).await;
            let Some(d) = got else {
                return Err(TestCaseError::fail(format!("{h:?}: neither dead-lettered nor handled")));
            };
            prop_assert_eq!(&d.message().envelope.message_id, &raw_id);
            d.complete().await.unwrap();
            other.release().await.unwrap();
            Ok(())
        }
    });
    rt.block_on(async {
        t.delete(&path).await.unwrap();
        t.close().await;
    });
}
