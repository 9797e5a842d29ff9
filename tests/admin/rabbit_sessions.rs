//! Session queues on RabbitMQ in the operations API (issue 35; docs/rabbitmq.md,
//! "Sessions"): a session queue is 16 partition queues and one `::dlq`, with no RabbitMQ
//! queue of its own name. The admin lists it (recorded by the transport that declared it,
//! or named by the operator and found by its first partition) with the ready messages of
//! its partitions, reads its dead letters by the session queue's name, and resubmits each
//! to the partition of its session id; a dead letter without a valid session id (a foreign
//! producer's, dead-lettered by the hub) is refused with what to do, and stays.

use std::time::Duration;

use courier::admin::{AmqpAdmin, EntityKind, QueueAdmin};
use courier::{
    EntityPath, Envelope, QueueOptions, ScheduleStore, SenderOptions, SessionSelector, Transport, VirtualClock,
};
use courier_tests::eventually;
use courier_tests::rabbit::{amqp_url, management_url, memory_store, transport};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};

use crate::rabbit::unique;

/// The partition queue of `session` (docs/rabbitmq.md: FNV-1a 64 of the UTF-8 bytes, mod 16).
fn partition(queue: &str, session: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{queue}::session-{}-of-16", hash % 16)
}

/// Publishes `body` straight into `to` as a foreign producer would, with `headers`.
async fn publish_raw(to: &str, body: &[u8], headers: FieldTable) {
    let conn = Connection::connect(&amqp_url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let p = BasicProperties::default()
        .with_message_id(format!("raw-{}", uuid::Uuid::new_v4().simple()).as_str().into())
        .with_headers(headers);
    channel
        .basic_publish("".into(), to.into(), BasicPublishOptions::default(), body, p)
        .await
        .unwrap()
        .await
        .unwrap();
    conn.close(200, "OK".into()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_session_queue_is_listed_and_its_dead_letters_go_back_to_their_sessions() {
    let clock = VirtualClock::starting_now();
    let store = ScheduleStore::from(&memory_store().await);
    let t = transport(&clock, store.clone()).await;
    let admin = AmqpAdmin::new(&t);
    let queue = unique("rbadm-sq");
    let path = EntityPath::queue(&queue);
    t.create_queue(&queue, &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    let sender = t.sender(&queue, SenderOptions::default()).await.unwrap();
    sender
        .send_batch(vec![
            Envelope::new("a1").with_session_id("alice"),
            Envelope::new("b1").with_session_id("bob"),
            Envelope::new("b2").with_session_id("bob"),
        ])
        .await
        .unwrap();
    // A foreign producer's message without a session id: the hub dead-letters it.
    publish_raw(&partition(&queue, "bob"), b"no session", FieldTable::default()).await;

    let listed = || async { admin.queues().await.unwrap().into_iter().find(|q| q.name == queue) };
    let q = listed().await.expect("the session queue is listed");
    assert_eq!(q.kind, EntityKind::Queue);
    assert_eq!(q.active, 4, "the ready messages of its partitions");

    // alice's message is dead-lettered by a handler.
    let alice = t
        .accept_session(&path, SessionSelector::Named("alice".into()), Duration::from_secs(10))
        .await
        .unwrap();
    let a1 = alice.receive(1, Duration::from_secs(10)).await.unwrap().pop().unwrap();
    a1.dead_letter("test.Poison", "broken on purpose").await.unwrap();
    alice.release().await.unwrap();
    eventually("two dead letters listed", || async {
        listed().await.is_some_and(|q| q.dead_lettered == 2)
    })
    .await;

    let page = admin.dead_letters(&queue, 0, 50).await.unwrap();
    assert_eq!(page.total, 2);
    let by_reason = |r: &str| {
        page.items
            .iter()
            .find(|d| d.reason.as_deref() == Some(r))
            .unwrap_or_else(|| panic!("a dead letter {r}: {:?}", page.items))
            .sequence_number
    };
    let (poison, foreign) = (by_reason("test.Poison"), by_reason("courier.InvalidWireFormat"));
    let shown = admin.dead_letter(&queue, poison).await.unwrap();
    assert_eq!(shown.source.as_deref(), Some(queue.as_str()));
    assert_eq!(shown.resubmit_refused, None);
    // What a dry run shows: the one without a session id would be refused, and why.
    let (asked, _) = admin.dead_letter_summaries(&queue, &[poison, foreign]).await.unwrap();
    let refused: Vec<_> = asked
        .iter()
        .map(|d| (d.sequence_number, d.resubmit_refused.is_some()))
        .collect();
    assert!(
        refused.contains(&(poison, false)) && refused.contains(&(foreign, true)),
        "{asked:?}"
    );

    // The one without a session id cannot go back: refused with what to do, and kept.
    let outcome = admin.resubmit_many(&queue, &[poison, foreign]).await.unwrap();
    assert_eq!(outcome.done, vec![poison]);
    assert_eq!(outcome.failed.len(), 1, "{outcome:?}");
    let (n, why) = &outcome.failed[0];
    assert_eq!(*n, foreign);
    assert!(
        why.contains("no valid session id") && why.contains("delete it"),
        "{why}"
    );

    // alice's message is back in her session, before anything sent to it later.
    sender.send(Envelope::new("a2").with_session_id("alice")).await.unwrap();
    let alice = t
        .accept_session(&path, SessionSelector::Named("alice".into()), Duration::from_secs(10))
        .await
        .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        for d in alice.receive(2, Duration::from_secs(10)).await.unwrap() {
            got.push(String::from_utf8_lossy(d.message().body()).into_owned());
            d.complete().await.unwrap();
        }
    }
    assert_eq!(got, ["a1", "a2"]);
    alice.release().await.unwrap();
    eventually("one dead letter left", || async {
        listed().await.is_some_and(|q| q.dead_lettered == 1)
    })
    .await;
    let left = admin.dead_letters(&queue, 0, 50).await.unwrap();
    assert_eq!(
        left.items.iter().map(|d| d.sequence_number).collect::<Vec<_>>(),
        [foreign]
    );

    // An admin on another connection, without the store, finds the queue by the name
    // an operator gives.
    let other = AmqpAdmin::connect(&amqp_url().await, None)
        .await
        .unwrap()
        .with_queues([queue.clone()]);
    let q = other
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == queue)
        .expect("found by its partitions");
    // bob's two messages are held by `t`'s hub (delivered, unacknowledged: LOCKED with
    // the management API), so none is ready.
    assert_eq!((q.kind, q.active, q.dead_lettered), (EntityKind::Queue, 0, 1));
    other.close().await;
    // With the management API, they are counted as locked: the sum over the partitions.
    let managed = AmqpAdmin::new(&t).with_management(&management_url().await).unwrap();
    eventually("bob's two messages counted as locked", || async {
        managed
            .queues()
            .await
            .unwrap()
            .into_iter()
            .any(|q| q.name == queue && q.locked == 2)
    })
    .await;

    admin.delete_many(&queue, &[foreign]).await.unwrap();
    t.delete(&path).await.unwrap();
    assert!(
        admin.queues().await.unwrap().iter().all(|q| q.name != queue),
        "no longer listed once deleted"
    );
}
