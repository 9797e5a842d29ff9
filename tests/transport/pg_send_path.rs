//! The Postgres transport's send of one message, which has a statement of its own (the
//! batch statement is planned afresh at every execution; `framework/src/postgres/send.rs`):
//! it stores what the batch stores, fans a topic's message out the same way, schedules on
//! the entity itself, and a sender whose queue was deleted and created again is refused
//! instead of writing into the new queue; the endpoint's store (`transport.store()`), which
//! keeps the ids of the queues a handling sends to, sends to a queue deleted and created
//! again as a fresh lookup would.

use std::time::Duration;

use courier::{
    Begin, Clock, Committed, EntityPath, Envelope, ErrorKind, PostgresTransport, QueueOptions, SenderOptions, Store,
    SubscriptionOptions, TopicOptions, Transport, VirtualClock,
};
use courier_tests::pg_transport::transport;
use uuid::Uuid;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

/// Every field a sender sets.
fn full(body: &str) -> Envelope {
    Envelope::new(body.to_owned())
        .with_correlation_id("corr")
        .with_causation_id("cause")
        .with_message_type("Shipped")
        .with_content_type("text/plain")
        .with_reply_to("replies")
        .with_property("n", 7_i64)
        .with_property("flag", true)
        .with_time_to_live(Duration::from_secs(600))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_is_stored_as_a_batch_stores_it() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = unique("q");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    let (alone, in_batch) = (full("alone"), full("in a batch"));
    sender.send(alone.clone()).await.unwrap();
    sender
        .send_batch(vec![in_batch.clone(), Envelope::new("second of the batch")])
        .await
        .unwrap();

    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let got = r.receive(3, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].message().envelope, alone, "every field of the single send");
    assert_eq!(got[1].message().envelope, in_batch, "every field of the batch");
    for (d, first) in got.iter().zip([true, false, false]) {
        let b = &d.message().broker;
        let off = (b.enqueued_time - clock.now()).num_microseconds().map(i64::abs);
        assert!(off.is_some_and(|us| us < 1_000), "stamped by the transport's clock");
        if first {
            let ttl = b.expires_at.map(|at| at - b.enqueued_time);
            assert_eq!(
                ttl,
                Some(chrono::Duration::seconds(600)),
                "expires after its time-to-live"
            );
        }
    }
    assert!(got[0].message().sequence_number() < got[1].message().sequence_number());
    assert!(got[1].message().sequence_number() < got[2].message().sequence_number());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_message_to_a_topic_goes_to_each_subscription_and_a_session_one_dead_letters_it() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let topic = unique("t");
    t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
    t.create_subscription(&topic, "plain", &SubscriptionOptions::default())
        .await
        .unwrap();
    t.create_subscription(
        &topic,
        "sessions",
        &SubscriptionOptions::default().requires_session(true),
    )
    .await
    .unwrap();
    let sender = t.sender(&topic, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("news")).await.unwrap();

    let plain = t.receiver(&EntityPath::subscription(&topic, "plain")).await.unwrap();
    let got = plain.receive(5, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().body().as_ref(), b"news");
    let dead = t
        .peek(&EntityPath::subscription(&topic, "sessions").dead_letter(), 0, 5)
        .await
        .unwrap();
    assert_eq!(
        dead.len(),
        1,
        "no session id: dead-lettered on the session subscription"
    );
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some("SessionIdMissing"));
    assert_eq!(
        dead[0].broker.dead_letter_source.as_deref(),
        Some(format!("{topic}/subscriptions/sessions").as_str())
    );
    assert_eq!(
        dead[0].sequence_number(),
        got[0].message().sequence_number(),
        "the copies share the number"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_scheduled_message_to_a_topic_waits_on_the_topic_and_fans_out_when_due() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let topic = unique("t");
    t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
    t.create_subscription(&topic, "s", &SubscriptionOptions::default())
        .await
        .unwrap();
    let sender = t.sender(&topic, SenderOptions::default()).await.unwrap();
    let at = clock.now() + chrono::Duration::seconds(60);
    let seq = sender.schedule(Envelope::new("later"), at).await.unwrap();

    let r = t.receiver(&EntityPath::subscription(&topic, "s")).await.unwrap();
    assert!(
        r.receive(1, Duration::ZERO).await.unwrap().is_empty(),
        "not before its time"
    );
    clock.advance(Duration::from_secs(61));
    let got = r.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1, "fanned out once due");
    assert_eq!(got[0].message().body().as_ref(), b"later");
    assert_ne!(
        got[0].message().sequence_number(),
        seq,
        "numbered again at activation (S5.4)"
    );
}

/// A sender keeps the id of the queue it was made for: once that queue is deleted and
/// another of the same name created, its sends are refused (the message handed back)
/// rather than written into a queue it never looked up; a new sender reaches the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_whose_queue_was_deleted_and_created_again_is_refused() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = unique("q");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let old = t.sender(&q, SenderOptions::default()).await.unwrap();
    old.send(Envelope::new("before")).await.unwrap();
    t.delete(&EntityPath::queue(&q)).await.unwrap();
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();

    for e in [
        old.send(Envelope::new("one")).await.unwrap_err(),
        old.send_batch(vec![Envelope::new("one"), Envelope::new("two")])
            .await
            .unwrap_err(),
    ] {
        assert!(matches!(e.kind(), ErrorKind::EntityNotFound { .. }), "{e}");
        assert!(!e.is_transient(), "{e}");
        assert!(e.to_string().contains(&q), "names the queue: {e}");
        assert_eq!(e.messages[0].body.as_ref(), b"one", "handed back");
    }
    assert_eq!(t.counts(&EntityPath::queue(&q)).await.unwrap().active, 0);

    let new = t.sender(&q, SenderOptions::default()).await.unwrap();
    new.send(Envelope::new("after")).await.unwrap();
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let got = r.receive(5, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().body().as_ref(), b"after");
}

/// One handling of a message of queue `from` by the transport's own store: it receives
/// the message sent with id `id`, sends `sends` (destination, whether a topic, body) in
/// the handling's transaction and commits it with the completion.
async fn handle(
    t: &PostgresTransport,
    clock: &VirtualClock,
    from: &str,
    id: &str,
    sends: &[(&str, bool, &str)],
) -> courier::Result<Committed> {
    let sender = t.sender(from, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("job").with_message_id(id)).await.unwrap();
    let receiver = t.receiver(&EntityPath::queue(from)).await.unwrap();
    let delivery = receiver
        .receive(1, Duration::from_secs(5))
        .await
        .unwrap()
        .pop()
        .unwrap();
    assert_eq!(delivery.message().envelope.message_id, id);
    let store = t.store();
    let now = clock.now();
    let Begin::Fresh(mut work) = store.begin(from, id, delivery.lock_token(), now).await.unwrap() else {
        panic!("a fresh id");
    };
    let outgoing = sends
        .iter()
        .map(|(to, topic, body)| ((*to).to_owned(), *topic, Envelope::new((*body).to_owned())))
        .collect();
    work.store_outgoing(outgoing, now).await.unwrap();
    work.commit().await
}

async fn bodies(t: &PostgresTransport, path: EntityPath) -> Vec<String> {
    let r = t.receiver(&path).await.unwrap();
    let got = r.receive_and_delete(10, Duration::ZERO).await.unwrap();
    got.iter()
        .map(|m| String::from_utf8_lossy(m.body().as_ref()).into_owned())
        .collect()
}

/// The store keeps the id of each queue and topic a handling sent to; a queue deleted and
/// created again since gets the next handling's messages (one message and a batch) as a
/// lookup at every send would give them, a topic deleted and created again its
/// subscription's copies, and a queue deleted for good fails the handling with
/// `EntityNotFound`, nothing of it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlings_send_reaches_a_queue_deleted_and_created_again() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let (from, to, topic) = (unique("from"), unique("to"), unique("t"));
    for q in [&from, &to] {
        t.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let create_topic = || async {
        t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
        t.create_subscription(&topic, "s", &SubscriptionOptions::default())
            .await
            .unwrap();
    };
    create_topic().await;
    let sub = || EntityPath::subscription(&topic, "s");

    let first = [(to.as_str(), false, "one"), (topic.as_str(), true, "news")];
    assert_eq!(
        handle(&t, &clock, &from, "m-1", &first).await.unwrap(),
        Committed::Settled
    );
    assert_eq!(bodies(&t, EntityPath::queue(&to)).await, ["one"]);
    assert_eq!(bodies(&t, sub()).await, ["news"]);

    t.delete(&EntityPath::queue(&to)).await.unwrap();
    t.create_queue(&to, &QueueOptions::default()).await.unwrap();
    t.delete(&EntityPath::queue(&topic)).await.unwrap(); // a topic by its name
    create_topic().await;
    let second = [(to.as_str(), false, "two"), (topic.as_str(), true, "more news")];
    assert_eq!(
        handle(&t, &clock, &from, "m-2", &second).await.unwrap(),
        Committed::Settled
    );
    assert_eq!(
        bodies(&t, EntityPath::queue(&to)).await,
        ["two"],
        "the new queue has it"
    );
    assert_eq!(bodies(&t, sub()).await, ["more news"], "the new topic fanned it out");

    t.delete(&EntityPath::queue(&to)).await.unwrap();
    t.create_queue(&to, &QueueOptions::default()).await.unwrap();
    let batch = [(to.as_str(), false, "three"), (to.as_str(), false, "four")];
    assert_eq!(
        handle(&t, &clock, &from, "m-3", &batch).await.unwrap(),
        Committed::Settled
    );
    assert_eq!(
        bodies(&t, EntityPath::queue(&to)).await,
        ["three", "four"],
        "a batch too"
    );

    t.delete(&EntityPath::queue(&to)).await.unwrap();
    let e = handle(&t, &clock, &from, "m-4", &[(to.as_str(), false, "lost")])
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::EntityNotFound { .. }), "{e}");
    assert!(e.to_string().contains(&to), "names the queue: {e}");
    let left = t.peek(&EntityPath::queue(&from), 0, 10).await.unwrap();
    assert_eq!(left.len(), 1, "the received message was not completed");
    assert_eq!(left[0].envelope.message_id, "m-4");
}
