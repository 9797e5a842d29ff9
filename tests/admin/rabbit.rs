//! Queues and dead letters on RabbitMQ through `QueueAdmin` on `AmqpAdmin`, against the
//! real broker (tests/src/rabbit.rs): the entities the transport recorded in its
//! schedule store, counts from passive declares, dead letters read in their DLQ and
//! numbered in the schedule store (SQLite and Postgres), more of them than RabbitMQ hands
//! one consumer unacknowledged, a reading that is cut or meets a message twice, resubmit
//! (confirmed copies, then the dead letters taken), delete, a subscription's dead letters,
//! an interrupted resubmit that leaves every message somewhere (in both at worst, with the
//! same message id), and an admin without a store. What reading must not move, the bytes
//! a resubmit sends and its time-to-live are in `rabbit_reading.rs`. Each test has its own
//! names (a random suffix) and its own schedule store.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use courier::admin::{AdminError, AmqpAdmin, BodyView, EntityKind, QueueAdmin};
use courier::recoverability::{headers, reasons};
use courier::{
    AmqpTransport, Clock, Endpoint, EntityPath, Envelope, PostgresStore, PropertyValue, QueueOptions, RetryPolicy,
    Routes, ScheduleStore, SenderOptions, Store, SubscriptionOptions, TopicOptions, Transport, VirtualClock,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use courier_tests::rabbit::{amqp_url, memory_store, transport};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

use super::{Flaky, PlaceOrder, poll_then_drop};

/// Waits until the admin counts `n` dead letters of `queue` (RabbitMQ counts what a
/// reading gave back a moment after it closed its channels).
pub(crate) async fn settles(admin: &AmqpAdmin, queue: &str, n: u64) {
    eventually("the dead letters counted", || async {
        dead_count(admin, queue).await == n
    })
    .await;
}

pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..10])
}

/// A transport and an admin on its connection, scheduled messages in SQLite in memory.
pub(crate) async fn setup() -> (AmqpTransport, AmqpAdmin, VirtualClock) {
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let admin = AmqpAdmin::new(&t);
    (t, admin, clock)
}

/// As [`setup`], with the schedule store in a file: a cut transaction closes its
/// connection, and an in-memory database would be gone with it.
async fn file_setup() -> (AmqpTransport, AmqpAdmin, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store = courier::SqliteStore::open(dir.path().join("schedules.db"))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let clock = VirtualClock::starting_now();
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let admin = AmqpAdmin::new(&t);
    (t, admin, dir)
}

/// Sends `bodies` to `send_to` (ids `send_to-i`, with failure headers) and dead-letters
/// them from `path`.
pub(crate) async fn dead_letter_all(t: &AmqpTransport, send_to: &str, path: &EntityPath, bodies: &[Vec<u8>]) {
    let sender = t.sender(send_to, SenderOptions::default()).await.unwrap();
    let mut batch = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let mut m = Envelope::new(body.clone());
        m.message_id = format!("{send_to}-{i}");
        m.message_type = Some("admin.Test".into());
        m.properties
            .insert(headers::FAILURE_ERROR.into(), PropertyValue::from("boom"));
        m.properties
            .insert(headers::FAILURE_ATTEMPTS.into(), PropertyValue::from(4));
        m.properties
            .insert(headers::DELAYED_RETRIES.into(), PropertyValue::from(3));
        m.properties
            .insert(headers::DELAYED_RETRY_SEAL.into(), PropertyValue::from("00"));
        m.properties.insert("tenant".into(), PropertyValue::from("acme"));
        batch.push(m);
    }
    for chunk in batch.chunks(200) {
        sender.send_batch(chunk.to_vec()).await.unwrap();
    }
    let receiver = t.receiver(path).await.unwrap();
    let mut got = 0;
    while got < bodies.len() {
        for d in receiver
            .receive((bodies.len() - got).min(200), Duration::from_secs(5))
            .await
            .unwrap()
        {
            d.dead_letter("test.Poison", "broken on purpose").await.unwrap();
            got += 1;
        }
    }
}

pub(crate) fn json_bodies(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("{{\"n\":{i}}}").into_bytes()).collect()
}

pub(crate) async fn counts(t: &AmqpTransport, path: &EntityPath) -> courier::EntityCounts {
    t.counts(path).await.unwrap()
}

/// The admin's dead-letter count of `queue`: its DLQ's ready messages and its parked rows.
pub(crate) async fn dead_count(admin: &AmqpAdmin, queue: &str) -> u64 {
    admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == queue)
        .map_or(0, |q| q.dead_lettered)
}

/// Publishes `n` messages straight into `dlq` as the transport's dead-lettering writes
/// them (failure and dead-letter headers, a sequence number of its own each, ids
/// `prefix-i`), with publisher confirms: thousands of dead letters in a second.
pub(crate) async fn publish_dead_letters(dlq: &str, prefix: &str, first_sequence: i64, n: usize) {
    let conn = Connection::connect(&amqp_url().await, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes()));
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let mut confirms = Vec::new();
        for &i in chunk {
            let mut h = FieldTable::default();
            h.insert(headers::FAILURE_ERROR.into(), text("boom"));
            h.insert(headers::FAILURE_ATTEMPTS.into(), AMQPValue::LongLongInt(4));
            h.insert(headers::DELAYED_RETRIES.into(), AMQPValue::LongLongInt(3));
            h.insert(headers::DELAYED_RETRY_SEAL.into(), text("00"));
            h.insert("tenant".into(), text("acme"));
            h.insert("x-courier-dead-letter-reason".into(), text("test.Poison"));
            h.insert("x-courier-dead-letter-description".into(), text("broken on purpose"));
            h.insert("x-courier-dead-letter-source".into(), text(dlq));
            h.insert(
                "x-courier-enqueued-time".into(),
                AMQPValue::LongLongInt(1_700_000_000_000),
            );
            let seq = first_sequence + i64::try_from(i).unwrap();
            h.insert("x-courier-sequence-number".into(), AMQPValue::LongLongInt(seq));
            let p = BasicProperties::default()
                .with_message_id(format!("{prefix}-{i}").as_str().into())
                .with_type("admin.Test".into())
                .with_delivery_mode(2)
                .with_headers(h);
            let body = format!("{{\"n\":{i}}}");
            confirms.push(
                channel
                    .basic_publish(
                        "".into(),
                        dlq.into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        p,
                    )
                    .await
                    .unwrap(),
            );
        }
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
    }
    conn.close(200, "done".into()).await.unwrap();
}

/// Receives (and deletes) everything `path` holds until `n` came, checking each copy.
async fn receive_resubmitted(t: &AmqpTransport, path: &EntityPath, n: usize) -> Vec<String> {
    let receiver = t.receiver(path).await.unwrap();
    let mut ids = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while ids.len() < n {
        assert!(std::time::Instant::now() < deadline, "received {} of {n}", ids.len());
        for m in receiver
            .receive_and_delete(500, Duration::from_millis(500))
            .await
            .unwrap()
        {
            assert!(!m.envelope.properties.contains_key(headers::FAILURE_ERROR));
            assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRIES));
            assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRY_SEAL));
            assert!(m.broker.dead_letter_reason.is_none());
            assert_eq!(m.envelope.properties.get("tenant"), Some(&PropertyValue::from("acme")));
            ids.push(m.envelope.message_id);
        }
    }
    ids
}

#[tokio::test]
async fn rabbit_a_poison_message_is_listed_shown_resubmitted_and_then_handled() {
    let clock = VirtualClock::starting_now();
    let store = ScheduleStore::from(&memory_store().await);
    let t = transport(&clock, store.clone()).await;
    let admin = AmqpAdmin::new(&t);
    let queue = unique("rbadm-orders");
    let flaky = Flaky::default();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    // The endpoint's transport keeps its scheduled messages (and the secret that seals
    // its dead letters) in the admin's schedule store.
    let endpoint = Endpoint::builder(&queue)
        .transport(
            AmqpTransport::builder(amqp_url().await)
                .clock(shared.clone())
                .schedules(store.clone())
                .open()
                .await
                .unwrap(),
        )
        .clock(shared)
        .routes(Routes::new().send::<PlaceOrder>(&queue))
        .recoverability(RetryPolicy::none())
        .handler(flaky.clone())
        .start()
        .await
        .unwrap();
    // The endpoint's transport records no entities: the operator names the queue.
    let admin = admin.with_queues([queue.clone()]);
    let id = endpoint.bus().send(&PlaceOrder { id: 7 }).await.unwrap();
    let path = EntityPath::queue(&queue);
    eventually("the message dead-lettered", || async {
        counts(&t, &path).await.dead_lettered == 1
    })
    .await;
    let q = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == queue)
        .unwrap();
    assert_eq!((q.kind, q.dead_lettered, q.active), (EntityKind::Queue, 1, 0));

    let page = admin.dead_letters(&queue, 0, 50).await.unwrap();
    assert_eq!((page.total, page.items.len(), page.next_after), (1, 1, None));
    let listed = &page.items[0];
    assert_eq!(listed.message_id, id);
    assert_eq!(listed.message_type.as_deref(), Some("admin.PlaceOrder"));
    assert_eq!(listed.reason.as_deref(), Some(reasons::RETRIES_EXHAUSTED));
    assert!(listed.error.as_deref().unwrap().contains("the tax service said no"));
    let shown = admin.dead_letter(&queue, listed.sequence_number).await.unwrap();
    assert_eq!(shown.message_id, id);
    assert_eq!(shown.body, BodyView::Json(serde_json::json!({"id": 7})));
    assert_eq!(shown.source.as_deref(), Some(queue.as_str()));
    assert!(shown.headers.contains_key(headers::FAILURE_HANDLER));
    // Reading it moved nothing: it is still in RabbitMQ's DLQ (given back a moment after
    // the reading closed its channels).
    eventually("the dead letter still in the DLQ", || async {
        counts(&t, &path).await.dead_lettered == 1
    })
    .await;
    assert_eq!(dead_count(&admin, &queue).await, 1);

    flaky.fixed.store(true, Ordering::SeqCst);
    admin.resubmit(&queue, listed.sequence_number).await.unwrap();
    eventually("the resubmitted message handled", || async {
        !flaky.handled.lock().unwrap().is_empty()
    })
    .await;
    let handled = flaky.handled.lock().unwrap().clone();
    // Same message id, the delivery count started again.
    assert_eq!(handled, vec![(id, 1, PlaceOrder { id: 7 })]);
    eventually("the DLQ empty", || async {
        let c = counts(&t, &path).await;
        c.active == 0 && c.dead_lettered == 0
    })
    .await;
    assert_eq!(dead_count(&admin, &queue).await, 0);
    endpoint.shutdown().await.unwrap();
    t.delete(&path).await.unwrap();
}

#[tokio::test]
async fn rabbit_pages_are_stable_and_the_dlq_keeps_its_messages() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbadm-pages");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    dead_letter_all(&t, &queue, &path, &json_bodies(7)).await;

    let first = admin.dead_letters(&queue, 0, 3).await.unwrap();
    assert_eq!((first.items.len(), first.total), (3, 7));
    let second = admin.dead_letters(&queue, first.next_after.unwrap(), 3).await.unwrap();
    let third = admin.dead_letters(&queue, second.next_after.unwrap(), 3).await.unwrap();
    assert_eq!((second.items.len(), third.items.len(), third.next_after), (3, 1, None));
    let paged: Vec<i64> = [&first, &second, &third]
        .iter()
        .flat_map(|p| p.items.iter().map(|d| d.sequence_number))
        .collect();
    let all = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(paged, all, "the same numbers at every listing, in order");
    // Numbered in queue order: the ids in the order they were dead-lettered.
    let ids: Vec<String> = [&first, &second, &third]
        .iter()
        .flat_map(|p| p.items.iter().map(|d| d.message_id.clone()))
        .collect();
    let sent: Vec<String> = (0..7).map(|i| format!("{queue}-{i}")).collect();
    assert_eq!(ids, sent);
    let d = &first.items[0];
    assert_eq!(d.reason.as_deref(), Some("test.Poison"));
    // The producer wrote courier.failure.attempts = 4 and courier.failure.error = "boom":
    // not Courier's record (the dead-lettering gave no failure headers), so they are
    // dropped from the copy and the description the dead-lettering wrote is shown
    // (issue 31, point 6).
    assert_eq!(d.delivery_count, 0, "no count of Courier's");
    assert_eq!(d.error.as_deref(), Some("broken on purpose"));
    assert!(paged.windows(2).all(|w| w[0] < w[1]), "{paged:?}");
    // Every reading gave everything back: RabbitMQ's DLQ holds the seven.
    eventually("the DLQ keeps every dead letter", || async {
        let c = counts(&t, &path).await;
        (c.active, c.dead_lettered) == (0, 7)
    })
    .await;
    assert_eq!(dead_count(&admin, &queue).await, 7);
    // Deleting the queue deletes its dead letters and their numbers.
    t.delete(&path).await.unwrap();
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    assert_eq!(admin.dead_letters(&queue, 0, 10).await.unwrap().total, 0);
    t.delete(&path).await.unwrap();
}

#[tokio::test]
async fn rabbit_show_decodes_bodies_and_delete_and_unknowns_behave() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbadm-bodies");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let bodies = vec![
        b"{\"a\":[1,2]}".to_vec(),
        b"<script>alert(1)</script>".to_vec(),
        vec![0xff, 0x00, 0x10],
    ];
    dead_letter_all(&t, &queue, &path, &bodies).await;
    let all = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(all.len(), 3);
    let mut shown = Vec::new();
    for s in &all {
        let d = admin.dead_letter(&queue, *s).await.unwrap();
        assert_eq!(d.reason.as_deref(), Some("test.Poison"));
        assert_eq!(d.description.as_deref(), Some("broken on purpose"));
        assert_eq!(d.headers.get("tenant"), Some(&PropertyValue::from("acme")));
        shown.push((d.message_id, d.body, d.body_size));
    }
    shown.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        shown.into_iter().map(|(_, b, n)| (b, n)).collect::<Vec<_>>(),
        vec![
            (BodyView::Json(serde_json::json!({"a": [1, 2]})), 11),
            (BodyView::Text("<script>alert(1)</script>".into()), 25),
            (BodyView::Bytes(vec![0xff, 0x00, 0x10]), 3),
        ]
    );
    admin.delete_dead_letter(&queue, all[0]).await.unwrap();
    assert!(matches!(
        admin.dead_letter(&queue, all[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.resubmit(&queue, all[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    settles(&admin, &queue, 2).await;
    let outcome = admin.delete_many(&queue, &[all[1], 12345]).await.unwrap();
    assert_eq!((outcome.done, outcome.not_found), (vec![all[1]], vec![12345]));
    settles(&admin, &queue, 1).await;
    let missing = unique("rbadm-none");
    assert!(matches!(
        admin.dead_letters(&missing, 0, 10).await,
        Err(AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.resubmit(&missing, 1).await,
        Err(AdminError::NotFound { .. })
    ));
    t.delete(&path).await.unwrap();
}

#[tokio::test]
async fn rabbit_resubmit_many_and_all_move_copies_without_failure_headers() {
    let (t, admin, _clock) = setup().await;
    let queue = unique("rbadm-many");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    dead_letter_all(&t, &queue, &path, &json_bodies(6)).await;
    let all = admin.all_dead_letters(&queue).await.unwrap();
    let outcome = admin.resubmit_many(&queue, &[all[0], all[1], 7]).await.unwrap();
    assert_eq!((outcome.done, outcome.not_found), (vec![all[0], all[1]], vec![7]));
    let rest = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(rest, all[2..].to_vec());
    let outcome = admin.resubmit_many(&queue, &rest).await.unwrap();
    assert_eq!(outcome.done.len(), 4);
    eventually("every copy in the queue", || async {
        let c = counts(&t, &path).await;
        (c.active, c.dead_lettered) == (6, 0)
    })
    .await;
    let receiver = t.receiver(&path).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 6 {
        got.extend(receiver.receive(6 - got.len(), Duration::from_secs(5)).await.unwrap());
    }
    let mut ids = BTreeSet::new();
    for d in got {
        let m = d.message();
        assert_eq!(m.broker.delivery_count, 1, "a new delivery count");
        assert!(!m.envelope.properties.contains_key(headers::FAILURE_ERROR));
        assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRIES));
        assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRY_SEAL));
        assert!(m.broker.dead_letter_reason.is_none());
        assert_eq!(m.envelope.properties.get("tenant"), Some(&PropertyValue::from("acme")));
        ids.insert(m.envelope.message_id.clone());
        d.complete().await.unwrap();
    }
    assert_eq!(ids.len(), 6, "each message once, with its id");
    t.delete(&path).await.unwrap();
}

#[tokio::test]
async fn rabbit_recorded_entities_are_listed_and_a_subscription_dlq_goes_back_to_it() {
    // Scheduled messages (and the record of entities) in Postgres this time.
    let db = TestDatabase::create().await;
    let store = PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    let clock = VirtualClock::starting_now();
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let admin = AmqpAdmin::connect(&amqp_url().await, Some(ScheduleStore::from(&store)))
        .await
        .unwrap();
    let (queue, topic) = (unique("rbadm-q"), unique("rbadm-t"));
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    t.create_topic(&topic, &TopicOptions::default()).await.unwrap();
    for sub in ["billing", "audit"] {
        t.create_subscription(&topic, sub, &SubscriptionOptions::default())
            .await
            .unwrap();
    }
    let sender = t.sender(&queue, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("now")).await.unwrap();
    sender
        .schedule(Envelope::new("later"), clock.now() + chrono::Duration::hours(1))
        .await
        .unwrap();
    let billing = EntityPath::subscription(&topic, "billing");
    let audit = EntityPath::subscription(&topic, "audit");
    dead_letter_all(&t, &topic, &billing, &json_bodies(2)).await;

    let sub_name = format!("{topic}/subscriptions/billing");
    let queues = admin.queues().await.unwrap();
    let summary: Vec<(String, EntityKind, u64, u64, u64)> = queues
        .iter()
        .map(|q| (q.name.clone(), q.kind, q.active, q.scheduled, q.dead_lettered))
        .collect();
    let mut expected = vec![
        (queue.clone(), EntityKind::Queue, 1, 1, 0),
        (topic.clone(), EntityKind::Topic, 0, 0, 0),
        (
            format!("{topic}/subscriptions/audit"),
            EntityKind::Subscription,
            2,
            0,
            0,
        ),
        (sub_name.clone(), EntityKind::Subscription, 0, 0, 2),
    ];
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(summary, expected);

    let all = admin.all_dead_letters(&sub_name).await.unwrap();
    let outcome = admin.resubmit_many(&sub_name, &all).await.unwrap();
    assert_eq!(outcome.done.len(), 2);
    eventually("the copies in the subscription", || async {
        let b = counts(&t, &billing).await;
        (b.active, b.dead_lettered) == (2, 0)
    })
    .await;
    // Not published to the topic again: the other subscription still has its two.
    let a = counts(&t, &audit).await;
    assert_eq!((a.active, a.dead_lettered), (2, 0));
    assert!(matches!(
        admin.dead_letters(&topic, 0, 10).await,
        Err(AdminError::Refused { .. })
    ));

    // A deleted entity is no longer recorded.
    t.delete(&EntityPath::queue(&queue)).await.unwrap();
    assert!(!admin.queues().await.unwrap().iter().any(|q| q.name == queue));
    for p in [&billing, &audit] {
        t.delete(p).await.unwrap();
    }
    t.delete(&EntityPath::queue(&topic)).await.unwrap();
    admin.close().await;
    t.close().await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_an_interrupted_resubmit_leaves_every_message_somewhere() {
    let (t, admin, _dir) = file_setup().await;
    let queue = unique("rbadm-cut");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let n = 600;
    dead_letter_all(&t, &queue, &path, &json_bodies(n)).await;
    let mut dropped = 0;
    for polls in [0, 3, 10, 30, 100, 300] {
        let rest = admin.all_dead_letters(&queue).await.unwrap();
        if rest.is_empty() {
            break;
        }
        if !poll_then_drop(admin.resubmit_many(&queue, &rest), polls).await {
            dropped += 1;
        }
        // Copies confirmed, rows not deleted yet: in both places, never in neither.
        eventually("every message in the queue or parked", || async {
            let c = counts(&t, &path).await;
            c.active + dead_count(&admin, &queue).await >= u64::try_from(n).unwrap()
        })
        .await;
    }
    assert!(dropped > 0);
    // What the cut scans' channels give back may come a moment later: resubmit until none
    // is left.
    let rest = admin.all_dead_letters(&queue).await.unwrap();
    admin.resubmit_many(&queue, &rest).await.unwrap();
    settles(&admin, &queue, 0).await;
    // Every message is there, at least once; a copy twice (cut between the confirm and
    // the ack) has the same message id, so an inbox drops the second.
    let receiver = t.receiver(&path).await.unwrap();
    let mut ids = Vec::new();
    loop {
        let got = receiver
            .receive_and_delete(500, Duration::from_millis(500))
            .await
            .unwrap();
        if got.is_empty() {
            break;
        }
        ids.extend(got.into_iter().map(|m| m.envelope.message_id));
    }
    let distinct: BTreeSet<&String> = ids.iter().collect();
    eprintln!(
        "interrupted resubmits: {dropped}; messages received {}, distinct {}",
        ids.len(),
        distinct.len()
    );
    assert_eq!(distinct.len(), n, "never in neither");
    t.delete(&path).await.unwrap();
}

/// More dead letters than RabbitMQ 3.10 hands one consumer of a quorum queue
/// unacknowledged (2,000): every one listed, shown, resubmitted by the numbers of a
/// listing, deleted, then the rest resubmitted; each copy arrives once, without its
/// failure headers.
async fn more_than_two_thousand(t: &AmqpTransport, admin: &AmqpAdmin, queue: &str) {
    let n = 2_500;
    t.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(queue);
    let base = chrono::Utc::now().timestamp_micros();
    publish_dead_letters(&format!("{queue}::dlq"), queue, base, n).await;
    eventually("RabbitMQ counts every dead letter", || async {
        dead_count(admin, queue).await == u64::try_from(n).unwrap()
    })
    .await;

    let mut listed = Vec::new();
    let mut after = 0;
    loop {
        let page = admin.dead_letters(queue, after, 1000).await.unwrap();
        assert_eq!(page.total, u64::try_from(n).unwrap());
        listed.extend(page.items);
        match page.next_after {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(listed.len(), n, "the listing saw every dead letter");
    let distinct: BTreeSet<&str> = listed.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(distinct.len(), n);
    let d = &listed[1234];
    // Published straight into the DLQ: a record without Courier's seal is not shown as
    // Courier's (issue 31, point 6); what it carried is among its headers.
    assert_eq!(
        (d.reason.as_deref(), d.error.as_deref(), d.delivery_count),
        (Some("Unverified"), None, 0)
    );
    let shown = admin.dead_letter(queue, d.sequence_number).await.unwrap();
    assert_eq!(shown.message_id, d.message_id);
    assert_eq!(
        shown.headers.get("(unverified) x-courier-dead-letter-description"),
        Some(&PropertyValue::from("broken on purpose"))
    );
    assert_eq!(shown.headers.get("tenant"), Some(&PropertyValue::from("acme")));
    assert!(matches!(shown.body, BodyView::Json(_)));

    // Resubmit 300 by the numbers of that listing (from its start, middle and end).
    let numbers: Vec<i64> = listed[..100]
        .iter()
        .chain(&listed[1200..1300])
        .chain(&listed[2400..])
        .map(|d| d.sequence_number)
        .collect();
    let outcome = admin.resubmit_many(queue, &numbers).await.unwrap();
    assert_eq!((outcome.done.len(), outcome.not_found.len()), (300, 0));
    let first = receive_resubmitted(t, &path, 300).await;
    let expected: BTreeSet<String> = listed[..100]
        .iter()
        .chain(&listed[1200..1300])
        .chain(&listed[2400..])
        .map(|d| d.message_id.clone())
        .collect();
    assert_eq!(first.iter().cloned().collect::<BTreeSet<_>>(), expected);
    // Numbers of that listing resubmitted already are not found again.
    let again = admin.resubmit_many(queue, &numbers[..5]).await.unwrap();
    assert_eq!((again.done.len(), again.not_found.len()), (0, 5));

    let deleted: Vec<i64> = listed[300..500].iter().map(|d| d.sequence_number).collect();
    let outcome = admin.delete_many(queue, &deleted).await.unwrap();
    assert_eq!(outcome.done, deleted);
    settles(admin, queue, 2_000).await;

    let rest = admin.all_dead_letters(queue).await.unwrap();
    assert_eq!(rest.len(), 2_000);
    let outcome = admin.resubmit_many(queue, &rest).await.unwrap();
    assert_eq!((outcome.done.len(), outcome.failed.len()), (2_000, 0));
    let second = receive_resubmitted(t, &path, 2_000).await;
    let all: BTreeSet<&String> = first.iter().chain(&second).collect();
    assert_eq!((first.len() + second.len(), all.len()), (2_300, 2_300), "each once");
    settles(admin, queue, 0).await;
    let receiver = t.receiver(&path).await.unwrap();
    assert!(
        receiver
            .receive_and_delete(10, Duration::from_millis(300))
            .await
            .unwrap()
            .is_empty()
    );
    t.delete(&path).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_more_than_2000_dead_letters_in_a_sqlite_store() {
    let (t, admin, _clock) = setup().await;
    more_than_two_thousand(&t, &admin, &unique("rbadm-big-lite")).await;
    t.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_more_than_2000_dead_letters_in_a_postgres_store() {
    let db = TestDatabase::create().await;
    let store = PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    let clock = VirtualClock::starting_now();
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let admin = AmqpAdmin::connect(&amqp_url().await, Some(ScheduleStore::from(&store)))
        .await
        .unwrap();
    more_than_two_thousand(&t, &admin, &unique("rbadm-big-pg")).await;
    admin.close().await;
    t.close().await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_a_reading_cut_short_gives_back_and_copies_share_a_number() {
    let (t, admin, _dir) = file_setup().await;
    let queue = unique("rbadm-cut-read");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    let dlq = format!("{queue}::dlq");
    let n = 1_200;
    let base = chrono::Utc::now().timestamp_micros();
    publish_dead_letters(&dlq, &queue, base, n).await;
    // Readings cut at many moments (a dropped future): RabbitMQ gives back what they held.
    for polls in [0, 2, 5, 10, 20, 40, 80] {
        poll_then_drop(admin.all_dead_letters(&queue), polls).await;
    }
    eventually("every dead letter back in the DLQ", || async {
        counts(&t, &path).await.dead_lettered == u64::try_from(n).unwrap()
    })
    .await;
    let all = admin.all_dead_letters(&queue).await.unwrap();
    assert_eq!(all.len(), n, "each numbered once");
    // The same messages again in the DLQ (at-least-once dead-lettering can leave two
    // copies): a copy has the number of its message.
    publish_dead_letters(&dlq, &queue, base, n).await;
    eventually("both copies counted", || async {
        dead_count(&admin, &queue).await == 2 * u64::try_from(n).unwrap()
    })
    .await;
    assert_eq!(admin.all_dead_letters(&queue).await.unwrap(), all);
    assert_eq!(
        admin.dead_letters(&queue, 0, 10).await.unwrap().total,
        2 * u64::try_from(n).unwrap()
    );
    t.delete(&path).await.unwrap();
}

#[tokio::test]
async fn rabbit_without_a_schedule_store_dead_letters_say_which_store_to_give() {
    let clock = VirtualClock::starting_now();
    let store = memory_store().await;
    let t = transport(&clock, ScheduleStore::from(&store)).await;
    let queue = unique("rbadm-nostore");
    t.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue(&queue);
    dead_letter_all(&t, &queue, &path, &json_bodies(2)).await;
    let admin = AmqpAdmin::connect(&amqp_url().await, None)
        .await
        .unwrap()
        .with_queues([queue.clone()]);
    // Counts work (from RabbitMQ alone).
    eventually("the dead letters counted", || async {
        dead_count(&admin, &queue).await == 2
    })
    .await;
    for e in [
        admin.dead_letters(&queue, 0, 10).await.err(),
        admin.dead_letter(&queue, 1).await.err(),
        admin.resubmit_many(&queue, &[1]).await.err(),
        admin.delete_many(&queue, &[1]).await.err(),
    ] {
        let Some(AdminError::Refused { reason }) = e else {
            panic!("{e:?}")
        };
        assert!(reason.contains("--postgres URL or --sqlite FILE"), "{reason}");
    }
    // Nothing was taken from the DLQ.
    assert_eq!(counts(&t, &path).await.dead_lettered, 2);
    admin.close().await;
    t.delete(&path).await.unwrap();
    t.close().await;
}
