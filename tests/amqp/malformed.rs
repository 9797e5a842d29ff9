//! Messages no Courier sender would publish, from a raw producer: text properties that are
//! not UTF-8, an over-long id, a body over the size limit, `x-courier-*` headers of the
//! wrong type. Each malformed one is dead-lettered at once with a Courier reason, the
//! valid ones around it are handled at their first delivery, and a Courier receiver
//! drains the dead-letter queue (docs/rabbitmq.md, "What a receiver refuses").

use std::sync::{Arc, Mutex};
use std::time::Duration;

use courier::{AmqpTransport, Context, Endpoint, EntityPath, HandlerError, QueueOptions, Routes, Transport};
use courier_tests::logs::Logs;
use courier_tests::rabbit::amqp_url;
use courier_tests::raw_amqp::{Confirm, Field, RawProperties, RawPublisher, nested_tables};
use serde::{Deserialize, Serialize};

use super::support::unique;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "malformed.Ping")]
struct Ping {
    n: u32,
}

/// What the handler saw: (n, delivery count), in handling order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(u32, u32)>>>);

#[courier::handler]
async fn ping(msg: Ping, ctx: &mut Context) -> Result<(), HandlerError> {
    let seen = ctx.state::<Seen>()?.clone();
    seen.0.lock().unwrap().push((msg.n, ctx.delivery_count()));
    Ok(())
}

const LIMIT: usize = 64 * 1024;

/// A message Courier would accept: id, type, content type, a JSON body.
fn valid(n: u32) -> (RawProperties, Vec<u8>) {
    let p = RawProperties {
        message_id: Some(format!("ok-{n}").into_bytes()),
        kind: Some(b"malformed.Ping".to_vec()),
        content_type: Some(b"application/json".to_vec()),
        delivery_mode: Some(2),
        ..RawProperties::default()
    };
    (p, format!(r#"{{"n":{n}}}"#).into_bytes())
}

/// A malformed message and the words its dead-letter description must hold.
struct Bad {
    n: u32,
    properties: RawProperties,
    body: Vec<u8>,
    reason: &'static str,
    names: &'static str,
}

fn bad_cases() -> Vec<Bad> {
    let mut cases = Vec::new();
    let mut push = |n: u32, edit: &dyn Fn(&mut RawProperties, &mut Vec<u8>), reason, names| {
        let (mut properties, mut body) = valid(n);
        edit(&mut properties, &mut body);
        cases.push(Bad {
            n,
            properties,
            body,
            reason,
            names,
        });
    };
    push(
        101,
        &|p, _| p.message_id = Some(b"id-\xff\xfe".to_vec()),
        "courier.InvalidWireFormat",
        "message_id",
    );
    push(
        102,
        &|p, _| p.kind = Some(b"malformed.Ping\xc3".to_vec()),
        "courier.InvalidWireFormat",
        "type",
    );
    push(
        103,
        &|p, _| p.headers = Some(vec![(b"tenant\xff".to_vec(), Field::Bytes(b"acme".to_vec()))]),
        "courier.InvalidWireFormat",
        "header name",
    );
    push(
        104,
        &|p, _| p.correlation_id = Some(vec![0xe2, 0x82]),
        "courier.InvalidWireFormat",
        "correlation_id",
    );
    push(
        107,
        &|p, _| p.content_type = Some(b"application/json\xff".to_vec()),
        "courier.InvalidWireFormat",
        "content_type",
    );
    push(
        108,
        &|p, _| p.reply_to = Some(b"replies\xc0\xaf".to_vec()),
        "courier.InvalidWireFormat",
        "reply_to",
    );
    push(
        105,
        &|p, _| p.message_id = Some(vec![b'i'; 200]),
        "courier.InvalidWireFormat",
        "message_id",
    );
    push(
        106,
        &|_, b| {
            let pad = " ".repeat(LIMIT);
            *b = format!(r#"{{"n":106,"pad":"{pad}"}}"#).into_bytes();
        },
        "courier.MessageTooLarge",
        "body",
    );
    cases
}

/// Messages with something odd that Courier does not read, or ignores with a warning:
/// they are handled normally.
fn odd_but_handled() -> Vec<(RawProperties, Vec<u8>)> {
    let (mut nested, nested_body) = valid(51);
    // A header name that is not UTF-8 inside a table value: Courier does not read tables.
    nested.headers = Some(vec![(
        b"meta".to_vec(),
        Field::Table(vec![(b"k\xff".to_vec(), Field::I64(1))]),
    )]);
    let (mut enqueued, enqueued_body) = valid(52);
    enqueued.headers = Some(vec![(
        b"x-courier-enqueued-time".to_vec(),
        Field::Bytes(b"yesterday".to_vec()),
    )]);
    let (mut causation, causation_body) = valid(53);
    causation.headers = Some(vec![
        (b"x-courier-causation-id".to_vec(), Field::I64(7)),
        (b"x-courier-enqueued-tme".to_vec(), Field::I64(7)),
    ]);
    // A header nested 15000 tables deep: parsed recursively, it overflowed the stack of
    // lapin's thread and aborted the process.
    let (mut deep, deep_body) = valid(54);
    deep.headers = Some(vec![(b"deep".to_vec(), nested_tables(15_000))]);
    vec![
        (nested, nested_body),
        (enqueued, enqueued_body),
        (causation, causation_body),
        (deep, deep_body),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_are_dead_lettered_at_once_and_the_valid_ones_around_them_are_handled_once() {
    let url = amqp_url().await;
    let name = unique("malformed");
    let transport = Arc::new(
        AmqpTransport::builder(url.clone())
            .max_message_size(LIMIT)
            .open()
            .await
            .unwrap(),
    );
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();

    // Everything is in the queue before the endpoint starts, so the malformed messages
    // are prefetched together with valid ones.
    let mut raw = RawPublisher::connect(&url).await.unwrap();
    let bad = bad_cases();
    let mut valid_ns = Vec::new();
    let mut n = 0;
    let mut publish_valid = async |raw: &mut RawPublisher, valid_ns: &mut Vec<u32>| {
        for _ in 0..2 {
            let (p, body) = valid(n);
            assert_eq!(raw.publish("", name.as_bytes(), &p, &body).await.unwrap(), Confirm::Ack);
            valid_ns.push(n);
            n += 1;
        }
    };
    publish_valid(&mut raw, &mut valid_ns).await;
    for b in &bad {
        let confirm = raw.publish("", name.as_bytes(), &b.properties, &b.body).await.unwrap();
        assert_eq!(confirm, Confirm::Ack, "RabbitMQ takes message {}", b.n);
        publish_valid(&mut raw, &mut valid_ns).await;
    }
    for (p, body) in odd_but_handled() {
        assert_eq!(raw.publish("", name.as_bytes(), &p, &body).await.unwrap(), Confirm::Ack);
        valid_ns.push(
            serde_json::from_slice::<serde_json::Value>(&body).unwrap()["n"]
                .as_u64()
                .unwrap() as u32,
        );
        publish_valid(&mut raw, &mut valid_ns).await;
    }
    // A routing key that is not UTF-8, through a fanout exchange bound to the queue (the
    // key means nothing to it): the message is valid.
    let fanout = format!("{name}-fanout");
    let lapin_conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = lapin_conn.create_channel().await.unwrap();
    channel
        .exchange_declare(
            fanout.as_str().into(),
            lapin::ExchangeKind::Fanout,
            lapin::options::ExchangeDeclareOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            name.as_str().into(),
            fanout.as_str().into(),
            "".into(),
            lapin::options::QueueBindOptions::default(),
            lapin::types::FieldTable::default(),
        )
        .await
        .unwrap();
    let (p, body) = valid(55);
    assert_eq!(
        raw.publish(&fanout, b"\xff\xfe", &p, &body).await.unwrap(),
        Confirm::Ack
    );
    valid_ns.push(55);
    // And one malformed message straight into the dead-letter queue: Courier reads it too.
    let (mut in_dlq, in_dlq_body) = valid(200);
    in_dlq.message_id = Some(b"\xff".to_vec());
    in_dlq.headers = Some(vec![(b"\xfe".to_vec(), Field::Bool(true))]);
    let dlq_queue = format!("{name}::dlq");
    assert_eq!(
        raw.publish("", dlq_queue.as_bytes(), &in_dlq, &in_dlq_body)
            .await
            .unwrap(),
        Confirm::Ack
    );

    let seen = Seen::default();
    let running = Endpoint::builder(name.clone())
        .transport(transport.clone())
        .routes(Routes::new().send::<Ping>(&name))
        .handler(ping)
        .state(seen.clone())
        .concurrency(16)
        .start()
        .await
        .unwrap();

    // A hang guard, not a timing claim: each malformed message once stalled the queue
    // for about 23 s, and the valid ones behind it were redelivered.
    let dlq = transport
        .receiver(&EntityPath::queue(&name).dead_letter())
        .await
        .unwrap();
    let mut dead = Vec::new();
    let guard = tokio::time::Instant::now() + Duration::from_secs(60);
    while dead.len() < bad.len() + 1 || seen.0.lock().unwrap().len() < valid_ns.len() {
        assert!(
            tokio::time::Instant::now() < guard,
            "after 60 s: {} of {} dead letters, handled {:?}",
            dead.len(),
            bad.len() + 1,
            seen.0.lock().unwrap()
        );
        for d in dlq.receive(16, Duration::from_millis(200)).await.unwrap() {
            dead.push(d.message().clone());
            d.complete().await.unwrap();
        }
    }
    running.shutdown().await.unwrap();

    let mut handled = seen.0.lock().unwrap().clone();
    handled.sort_unstable();
    let want: Vec<(u32, u32)> = {
        let mut v: Vec<(u32, u32)> = valid_ns.iter().map(|n| (*n, 1)).collect();
        v.sort_unstable();
        v
    };
    assert_eq!(handled, want, "every valid message handled once, at delivery count 1");

    for b in &bad {
        let m = dead
            .iter()
            .find(|m| m.body() == b.body.as_slice())
            .unwrap_or_else(|| panic!("message {} is in the dead-letter queue with its body", b.n));
        assert_eq!(
            m.broker.dead_letter_reason.as_deref(),
            Some(b.reason),
            "message {}",
            b.n
        );
        let description = m.broker.dead_letter_description.as_deref().unwrap_or_default();
        assert!(description.contains(b.names), "message {}: {description}", b.n);
        assert_eq!(m.broker.dead_letter_source.as_deref(), Some(name.as_str()));
        assert_eq!(m.broker.delivery_count, 1, "moved at once: {}", b.n);
    }
    let raw_dead = dead
        .iter()
        .find(|m| m.body() == in_dlq_body.as_slice())
        .expect("the malformed message published into the DLQ was read");
    assert_eq!(raw_dead.envelope.message_id, "\u{FFFD}");
    assert!(
        raw_dead.envelope.properties.is_empty(),
        "a header name that is not UTF-8 is no property"
    );
    // Drained: nothing is left.
    assert!(dlq.receive(1, Duration::from_millis(300)).await.unwrap().is_empty());

    let stats = transport.wire_stats();
    assert_eq!(stats.invalid, bad.len() as u64);
    // x-courier-enqueued-time as a string, x-courier-causation-id as a number, and an
    // unknown x-courier-* name.
    assert_eq!(stats.ignored_headers, 3);
    transport.delete(&EntityPath::queue(&name)).await.unwrap();
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        channel.exchange_delete(fanout.as_str().into(), Default::default()),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(5), lapin_conn.close(200, "done".into())).await;
}

// One thread, so the receiver's events reach this test's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn a_refused_delivery_is_logged_with_its_queue_and_delivery_tag_also_when_received_and_deleted() {
    let log = Logs::default();
    let _guard = log.capture();
    let url = amqp_url().await;
    let name = unique("refused");
    let transport = AmqpTransport::connect(url.clone()).await.unwrap();
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    let mut raw = RawPublisher::connect(&url).await.unwrap();
    let (mut bad, body) = valid(1);
    bad.message_id = Some(b"\xc3\x28".to_vec());
    let path = EntityPath::queue(&name);
    let receiver = transport.receiver(&path).await.unwrap();
    let guard = tokio::time::Instant::now() + Duration::from_secs(60);
    // Settled on receipt (basic.get): the refused one goes to the dead-letter queue all the
    // same.
    for p in [&bad, &valid(2).0] {
        assert_eq!(raw.publish("", name.as_bytes(), p, &body).await.unwrap(), Confirm::Ack);
    }
    let mut taken = Vec::new();
    while taken.is_empty() {
        assert!(
            tokio::time::Instant::now() < guard,
            "the first valid message was not received"
        );
        taken = receiver
            .receive_and_delete(2, Duration::from_millis(500))
            .await
            .unwrap();
    }
    assert_eq!(taken.len(), 1, "the refused one is not handed out");
    assert_eq!(taken[0].envelope.message_id, "ok-2");
    // PeekLock, on a consumer.
    for p in [&bad, &valid(3).0] {
        assert_eq!(raw.publish("", name.as_bytes(), p, &body).await.unwrap(), Confirm::Ack);
    }
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(
            tokio::time::Instant::now() < guard,
            "the second valid message was not received"
        );
        got = receiver.receive(2, Duration::from_millis(500)).await.unwrap();
    }
    assert_eq!(got.len(), 1, "the refused one is not handed out");
    assert_eq!(got[0].message().envelope.message_id, "ok-3");
    assert_eq!(got[0].message().broker.delivery_count, 1);
    got.pop().unwrap().complete().await.unwrap();
    assert_eq!(transport.wire_stats().invalid, 2);

    let text = log.text();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("breaks the wire format")).collect();
    // The second refusal of the same queue and reason is counted for the log limiter's
    // summary line, not logged in full (issue 31, point 8).
    assert_eq!(lines.len(), 1, "{text}");
    for line in lines {
        assert!(line.contains(&format!("queue={name}")), "{line}");
        assert!(line.contains("delivery_tag="), "{line}");
        assert!(line.contains("reason=\"courier.InvalidWireFormat\""), "{line}");
        assert!(line.contains("message_id is not UTF-8 (hex c328)"), "{line}");
    }
    let dlq = transport.receiver(&path.clone().dead_letter()).await.unwrap();
    let mut dead = 0;
    while dead < 2 {
        assert!(tokio::time::Instant::now() < guard, "{dead} of 2 dead letters");
        for d in dlq.receive(2, Duration::from_millis(500)).await.unwrap() {
            assert_eq!(d.message().envelope.message_id, "\u{FFFD}(");
            d.complete().await.unwrap();
            dead += 1;
        }
    }
    transport.delete(&path).await.unwrap();
}
