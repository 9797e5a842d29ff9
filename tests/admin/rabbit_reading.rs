//! What an operator's reading of RabbitMQ dead letters must not change, and what a
//! resubmit must send (issue 31, points 1, 2 and 5), against the real broker:
//!
//! * listing any page (the first, a deep one, one past the end), showing one, every
//!   number (what `--all`, a dry run and the console's confirmation page read) and the
//!   summaries a dry run prints each leave RabbitMQ's DLQ holding every message, in order;
//! * a resubmit sends the bytes received: two messages whose ids differ only in bytes that
//!   are not UTF-8 are both refused again by the receiver (neither handled, neither lost),
//!   and header names that are not UTF-8 keep their bytes;
//! * a resubmitted copy has its time-to-live again, whether Courier or RabbitMQ moved it
//!   to the DLQ.

use std::collections::BTreeSet;
use std::time::Duration;

use courier::admin::QueueAdmin;
use courier::reasons::INVALID_WIRE_FORMAT;
use courier::{EntityPath, Envelope, QueueOptions, SenderOptions, Transport};
use courier_tests::eventually;
use courier_tests::rabbit::amqp_url;
use lapin::message::BasicGetMessage;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::rabbit::{counts, dead_count, publish_dead_letters, settles, setup, unique};

/// Waits until RabbitMQ's DLQ of `path` holds `n` ready messages.
async fn dlq_holds(t: &courier::AmqpTransport, path: &EntityPath, n: u64, after: &str) {
    eventually(after, || async { counts(t, path).await.dead_lettered == n }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_listing_paging_dry_runs_and_confirmations_move_nothing() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbread-still");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let n = 120;
    let base = chrono::Utc::now().timestamp_micros();
    publish_dead_letters(&format!("{queue}::dlq"), &queue, base, n).await;
    dlq_holds(&t, &path, 120, "the dead letters in the DLQ").await;

    let first = admin.dead_letters(&queue, 0, 50).await.unwrap();
    assert_eq!((first.items.len(), first.total), (50, 120));
    dlq_holds(&t, &path, 120, "a first page moved nothing").await;

    let all = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(all.len(), 120);
    dlq_holds(
        &t,
        &path,
        120,
        "every number (--all, a confirmation page) moved nothing",
    )
    .await;

    let deep = admin.dead_letters(&queue, all[99], 50).await.unwrap();
    assert_eq!((deep.items.len(), deep.total, deep.next_after), (20, 120, None));
    assert_eq!(deep.items[0].message_id, format!("{queue}-100"));
    dlq_holds(&t, &path, 120, "a deep page moved nothing").await;

    let past = admin.dead_letters(&queue, all[119] + 10_000, 50).await.unwrap();
    assert_eq!(
        (past.items.len(), past.total),
        (0, 120),
        "an empty page still counts them all"
    );
    dlq_holds(&t, &path, 120, "a page past the end moved nothing").await;

    let (summaries, missing) = admin
        .dead_letter_summaries(&queue, &[all[3], all[117], all[119] + 1])
        .await
        .unwrap();
    assert_eq!(missing, vec![all[119] + 1]);
    let ids: Vec<&str> = summaries.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(ids, [format!("{queue}-3"), format!("{queue}-117")]);
    dlq_holds(&t, &path, 120, "a dry run's summaries moved nothing").await;

    let shown = admin.dead_letter(&queue, all[60]).await.unwrap();
    assert_eq!(shown.message_id, format!("{queue}-60"));
    dlq_holds(&t, &path, 120, "a show moved nothing").await;

    // After all of that, the same numbers, in the order the messages were dead-lettered.
    let again = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(again, all);
    let mut listed = Vec::new();
    let mut after = 0;
    loop {
        let page = admin.dead_letters(&queue, after, 50).await.unwrap();
        listed.extend(page.items.into_iter().map(|d| d.message_id));
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    let sent: Vec<String> = (0..n).map(|i| format!("{queue}-{i}")).collect();
    assert_eq!(listed, sent, "the DLQ kept its order");
    assert_eq!(dead_count(&admin, &queue).await, 120);
    t.delete(&path).await.unwrap();
}

/// Receives from `path` until its DLQ holds `n`: the receiver refuses every message (it
/// hands none out).
async fn all_refused(t: &courier::AmqpTransport, path: &EntityPath, n: u64, what: &str) {
    let receiver = t.receiver(path).await.unwrap();
    eventually(what, || async {
        let handed = receiver.receive(10, Duration::from_millis(200)).await.unwrap();
        assert!(handed.is_empty(), "a refused message was handed out");
        counts(t, path).await.dead_lettered == n
    })
    .await;
}

/// A channel of its own on the test broker, with publisher confirms.
async fn raw_channel() -> (Connection, Channel) {
    let conn = Connection::connect(&amqp_url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    (conn, channel)
}

async fn publish_raw(channel: &Channel, queue: &str, p: BasicProperties) {
    let confirm = channel
        .basic_publish(
            "".into(),
            queue.into(),
            BasicPublishOptions::default(),
            b"{\"id\":1}",
            p.with_type("admin.Test".into()).with_delivery_mode(2),
        )
        .await
        .unwrap();
    assert!(confirm.await.unwrap().is_ack());
}

/// Every message `queue` holds, taken with `basic.get`.
async fn get_all(channel: &Channel, queue: &str, n: usize) -> Vec<BasicGetMessage> {
    let mut got = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(std::time::Instant::now() < deadline, "got {} of {n}", got.len());
        match channel
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .unwrap()
        {
            Some(m) => got.push(m),
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    got
}

fn raw(s: &ShortString) -> Vec<u8> {
    s.invalid_utf8().unwrap_or(s.as_str().as_bytes()).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_resubmit_sends_the_bytes_it_received() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbread-bytes");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let (conn, channel) = raw_channel().await;
    let ids: [&[u8]; 2] = [b"coll-\xff-x", b"coll-\xfe-x"];
    for id in ids {
        let p = BasicProperties::default().with_message_id(ShortString::from_received_bytes(id.to_vec()));
        publish_raw(&channel, &queue, p).await;
    }
    let mut h = FieldTable::default();
    h.insert(
        ShortString::from_received_bytes(b"h\xff".to_vec()),
        AMQPValue::LongString(LongString::from("one")),
    );
    h.insert(
        ShortString::from_received_bytes(b"h\xfe".to_vec()),
        AMQPValue::LongString(LongString::from("two")),
    );
    publish_raw(
        &channel,
        &queue,
        BasicProperties::default()
            .with_message_id("header-names".into())
            .with_headers(h),
    )
    .await;
    // The receiver refuses all three (and hands none to a handler).
    all_refused(&t, &path, 3, "the three refused").await;

    let page = admin.dead_letters(&queue, 0, 10).await.unwrap();
    let shown: BTreeSet<&str> = page.items.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(
        shown,
        BTreeSet::from([r"coll-\xfe-x", r"coll-\xff-x", "header-names"]),
        "two ids that differ only in bytes that are not UTF-8 are listed apart"
    );
    assert!(
        page.items
            .iter()
            .all(|d| d.reason.as_deref() == Some(INVALID_WIRE_FORMAT))
    );
    // The header names that are not UTF-8 are shown, in hex.
    let named = page.items.iter().find(|d| d.message_id == "header-names").unwrap();
    let shown = admin.dead_letter(&queue, named.sequence_number).await.unwrap();
    assert!(
        shown.headers.contains_key("(not UTF-8, hex 68ff)"),
        "{:?}",
        shown.headers
    );
    assert!(
        shown.headers.contains_key("(not UTF-8, hex 68fe)"),
        "{:?}",
        shown.headers
    );
    let numbers: Vec<i64> = page.items.iter().map(|d| d.sequence_number).collect();
    let outcome = admin.resubmit_many(&queue, &numbers).await.unwrap();
    assert_eq!(outcome.done.len(), 3, "{outcome:?}");

    // The copies are the bytes received.
    let copies = get_all(&channel, &queue, 3).await;
    let got_ids: BTreeSet<Vec<u8>> = copies
        .iter()
        .map(|m| raw(m.delivery.properties.message_id().as_ref().unwrap()))
        .collect();
    let want: BTreeSet<Vec<u8>> = [ids[0].to_vec(), ids[1].to_vec(), b"header-names".to_vec()].into();
    assert_eq!(got_ids, want);
    let named = copies
        .iter()
        .find(|m| m.delivery.properties.message_id().as_ref().unwrap().as_str() == "header-names")
        .unwrap();
    let names: BTreeSet<Vec<u8>> = named
        .delivery
        .properties
        .headers()
        .as_ref()
        .unwrap()
        .inner()
        .keys()
        .map(raw)
        .filter(|k| k.starts_with(b"h"))
        .collect();
    assert_eq!(names, BTreeSet::from([b"h\xfe".to_vec(), b"h\xff".to_vec()]));
    // Sent again to the queue: the receiver refuses all three again, with their reason.
    for m in &copies {
        let again = channel
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                BasicPublishOptions::default(),
                &m.delivery.data,
                m.delivery.properties.clone(),
            )
            .await
            .unwrap();
        assert!(again.await.unwrap().is_ack());
        m.delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    all_refused(&t, &path, 3, "refused again, none handled, none lost").await;
    let again = admin.dead_letters(&queue, 0, 10).await.unwrap();
    assert_eq!(again.total, 3);
    assert!(
        again
            .items
            .iter()
            .all(|d| d.reason.as_deref() == Some(INVALID_WIRE_FORMAT))
    );
    conn.close(200, "done".into()).await.unwrap();
    t.delete(&path).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_resubmitted_copy_has_its_time_to_live_again() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbread-ttl");
    // One delivery: an abandoned message goes to the DLQ by RabbitMQ's delivery limit.
    t.create_queue(&queue, &QueueOptions::default().max_delivery_count(1))
        .await
        .unwrap();
    let path = EntityPath::queue(&queue);
    let sender = t.sender(&queue, SenderOptions::default()).await.unwrap();
    for id in ["by-courier", "by-rabbitmq"] {
        let mut m = Envelope::new(b"{}".to_vec());
        m.message_id = id.into();
        m.time_to_live = Some(Duration::from_secs(3600));
        sender.send(m).await.unwrap();
    }
    let receiver = t.receiver(&path).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.extend(receiver.receive(2 - got.len(), Duration::from_secs(5)).await.unwrap());
    }
    for d in got {
        if d.message().envelope.message_id == "by-courier" {
            d.dead_letter("test.Poison", "moved by Courier").await.unwrap();
        } else {
            d.abandon().await.unwrap();
        }
    }
    drop(receiver);
    settles(&admin, &queue, 2).await;
    let all = admin.all_dead_letters(&queue).await.unwrap();
    let outcome = admin.resubmit_many(&queue, &all).await.unwrap();
    assert_eq!(outcome.done.len(), 2, "{outcome:?}");
    let (conn, channel) = raw_channel().await;
    for m in get_all(&channel, &queue, 2).await {
        let p = &m.delivery.properties;
        let id = p.message_id().as_ref().unwrap().as_str().to_owned();
        assert_eq!(
            p.expiration().as_ref().map(ShortString::as_str),
            Some("3600000"),
            "{id}: RabbitMQ expires the copy an hour after the resubmit"
        );
        let h = p.headers().as_ref().unwrap().inner();
        assert_eq!(
            h.get("x-courier-time-to-live"),
            Some(&AMQPValue::LongLongInt(3_600_000)),
            "{id}"
        );
        assert!(!h.contains_key("x-courier-dead-letter-time-to-live"), "{id}");
        m.delivery.acker.ack(BasicAckOptions::default()).await.unwrap();
    }
    conn.close(200, "done".into()).await.unwrap();
    t.delete(&path).await.unwrap();
}

/// Deletes `queue`'s DLQ outside Courier.
async fn delete_dlq(queue: &str) {
    let (conn, channel) = raw_channel().await;
    channel
        .queue_delete(
            format!("{queue}::dlq").as_str().into(),
            lapin::options::QueueDeleteOptions::default(),
        )
        .await
        .unwrap();
    conn.close(200, "done".into()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_missing_dead_letter_queue_is_declared_again_and_receives() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbread-nodlq");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    delete_dlq(&queue).await;
    // A dead-lettering by Courier (a handler's failure) and a refusal (an id that is not
    // UTF-8), both while the DLQ is missing.
    let sender = t.sender(&queue, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new(b"{}".to_vec())).await.unwrap();
    let receiver = t.receiver(&path).await.unwrap();
    let got = loop {
        let mut got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
        if let Some(d) = got.pop() {
            break d;
        }
    };
    got.dead_letter("test.Poison", "while the DLQ was missing")
        .await
        .unwrap();
    dlq_holds(&t, &path, 1, "the DLQ declared again, with the dead letter").await;
    delete_dlq(&queue).await;
    let (conn, channel) = raw_channel().await;
    publish_raw(
        &channel,
        &queue,
        BasicProperties::default().with_message_id(ShortString::from_received_bytes(b"x\xff".to_vec())),
    )
    .await;
    conn.close(200, "done".into()).await.unwrap();
    eventually("the refusal declared it again", || async {
        assert!(
            receiver
                .receive(1, Duration::from_millis(200))
                .await
                .unwrap()
                .is_empty()
        );
        counts(&t, &path).await.dead_lettered == 1
    })
    .await;
    let page = admin.dead_letters(&queue, 0, 10).await.unwrap();
    assert_eq!(page.items[0].reason.as_deref(), Some(INVALID_WIRE_FORMAT));
    t.delete(&path).await.unwrap();
}

/// A reading of more dead letters than one channel holds (1,000) gives them back in
/// queue order: the DLQ's head afterwards is its head before, and a later resubmit or
/// page reads them in the order they were dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_reading_of_several_channels_keeps_the_queue_order() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbread-order");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let n = 2_500;
    let base = chrono::Utc::now().timestamp_micros();
    publish_dead_letters(&format!("{queue}::dlq"), &queue, base, n).await;
    dlq_holds(&t, &path, 2_500, "the dead letters in the DLQ").await;
    for _ in 0..2 {
        let all = admin.all_dead_letters(&queue).await.unwrap();
        assert_eq!(all.len(), n);
        dlq_holds(&t, &path, 2_500, "the reading gave everything back").await;
    }
    let (conn, channel) = raw_channel().await;
    let got = get_all(&channel, &format!("{queue}::dlq"), n).await;
    let ids: Vec<String> = got
        .iter()
        .map(|m| m.delivery.properties.message_id().as_ref().unwrap().as_str().to_owned())
        .collect();
    let sent: Vec<String> = (0..n).map(|i| format!("{queue}-{i}")).collect();
    let first_out_of_order = ids.iter().zip(&sent).position(|(a, b)| a != b);
    assert_eq!(first_out_of_order, None, "head after the readings: {:?}", &ids[..5]);
    conn.close(200, "done".into()).await.unwrap();
    t.delete(&path).await.unwrap();
}
