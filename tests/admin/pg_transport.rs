//! Queues and dead letters of the Postgres transport through `QueueAdmin` on
//! `PostgresAdmin`: a poison message dead-lettered by a running endpoint, resubmitted
//! and handled again; counts of every state; paging; bodies; resubmit one, many and all;
//! delete; a subscription's dead letters going back to that subscription; interrupted
//! resubmits. The tests share the process's transport database (tests/src/pg_transport.rs)
//! and stay apart by their queue names.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use courier::admin::{AdminError, BodyView, EntityKind, PostgresAdmin, QueueAdmin};
use courier::recoverability::{headers, reasons};
use courier::{
    Clock, Endpoint, EntityPath, Envelope, PostgresTransport, PropertyValue, QueueOptions, RetryPolicy, Routes,
    SenderOptions, SubscriptionOptions, TopicOptions, Transport, VirtualClock,
};
use courier_tests::eventually;
use courier_tests::pg_transport::transport;

use super::{Flaky, PlaceOrder, poll_then_drop};

/// A transport and an admin on the same database and virtual clock.
async fn setup() -> (PostgresTransport, PostgresAdmin, VirtualClock) {
    let clock = VirtualClock::starting_now();
    let transport = transport(&clock).await;
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let admin = PostgresAdmin::new(transport.pool().clone()).clock(shared);
    (transport, admin, clock)
}

/// Sends `n` messages with failure headers to `path`'s entity and dead-letters them.
async fn dead_letter_n(t: &PostgresTransport, send_to: &str, path: &EntityPath, n: usize) {
    let sender = t.sender(send_to, SenderOptions::default()).await.unwrap();
    let mut batch = Vec::new();
    for i in 0..n {
        let mut m = Envelope::new(format!("{{\"n\":{i}}}"));
        m.message_id = format!("{send_to}-{i}");
        m.properties
            .insert(headers::FAILURE_ERROR.into(), PropertyValue::from("boom"));
        m.properties
            .insert(headers::DELAYED_RETRIES.into(), PropertyValue::from(3));
        m.properties
            .insert(headers::DELAYED_RETRY_SEAL.into(), PropertyValue::from("00"));
        m.properties.insert("tenant".into(), PropertyValue::from("acme"));
        batch.push(m);
    }
    for chunk in batch.chunks(500) {
        sender.send_batch(chunk.to_vec()).await.unwrap();
    }
    let receiver = t.receiver(path).await.unwrap();
    let mut got = 0;
    while got < n {
        for d in receiver.receive(n - got, Duration::from_secs(5)).await.unwrap() {
            d.dead_letter("test.Poison", "broken on purpose").await.unwrap();
            got += 1;
        }
    }
}

async fn queue_with_dead_letters(t: &PostgresTransport, admin: &PostgresAdmin, queue: &str, n: usize) -> Vec<i64> {
    t.create_queue(queue, &QueueOptions::default()).await.unwrap();
    dead_letter_n(t, queue, &EntityPath::queue(queue), n).await;
    admin.all_dead_letters(queue).await.unwrap()
}

async fn counts(t: &PostgresTransport, queue: &str) -> courier::EntityCounts {
    t.counts(&EntityPath::queue(queue)).await.unwrap()
}

#[tokio::test]
async fn pg_a_poison_message_is_listed_shown_resubmitted_and_then_handled() {
    let (t, admin, clock) = setup().await;
    let flaky = Flaky::default();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let endpoint = Endpoint::builder("pgadm-orders")
        .transport(t.clone())
        .store(t.store())
        .clock(shared)
        .routes(Routes::new().send::<PlaceOrder>("pgadm-orders"))
        .recoverability(RetryPolicy::none())
        .handler(flaky.clone())
        .start()
        .await
        .unwrap();
    let id = endpoint.bus().send(&PlaceOrder { id: 7 }).await.unwrap();
    eventually("the message dead-lettered", || async {
        counts(&t, "pgadm-orders").await.dead_lettered == 1
    })
    .await;

    let queue = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == "pgadm-orders")
        .unwrap();
    assert_eq!(
        (queue.kind, queue.dead_lettered, queue.active),
        (EntityKind::Queue, 1, 0)
    );
    let page = admin.dead_letters("pgadm-orders", 0, 50).await.unwrap();
    assert_eq!((page.total, page.items.len(), page.next_after), (1, 1, None));
    let listed = &page.items[0];
    assert_eq!(listed.message_id, id);
    assert_eq!(listed.message_type.as_deref(), Some("admin.PlaceOrder"));
    assert_eq!(listed.reason.as_deref(), Some(reasons::RETRIES_EXHAUSTED));
    assert!(listed.error.as_deref().unwrap().contains("the tax service said no"));

    let shown = admin.dead_letter("pgadm-orders", listed.sequence_number).await.unwrap();
    assert_eq!(shown.message_id, id);
    assert_eq!(shown.body, BodyView::Json(serde_json::json!({"id": 7})));
    assert_eq!(shown.delivery_count, 1);
    assert!(shown.headers.contains_key(headers::FAILURE_HANDLER));
    assert_eq!(shown.source.as_deref(), Some("pgadm-orders"));

    flaky.fixed.store(true, Ordering::SeqCst);
    admin.resubmit("pgadm-orders", listed.sequence_number).await.unwrap();
    eventually("the resubmitted message handled", || async {
        !flaky.handled.lock().unwrap().is_empty()
    })
    .await;
    let handled = flaky.handled.lock().unwrap().clone();
    // Same message id (an inbox still recognises it), the delivery count started again.
    assert_eq!(handled, vec![(id, 1, PlaceOrder { id: 7 })]);
    eventually("the queue empty", || async {
        let c = counts(&t, "pgadm-orders").await;
        c.active == 0 && c.dead_lettered == 0
    })
    .await;
    endpoint.shutdown().await.unwrap();
}

#[tokio::test]
async fn pg_a_resubmitted_message_has_no_failure_headers_and_a_new_sequence_number() {
    let (t, admin, clock) = setup().await;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-headers", 1).await;
    clock.advance(Duration::from_secs(30));
    admin.resubmit("pgadm-headers", seqs[0]).await.unwrap();
    let back = t.peek(&EntityPath::queue("pgadm-headers"), 0, 10).await.unwrap();
    assert_eq!(back.len(), 1);
    let m = &back[0];
    assert_eq!(m.envelope.message_id, "pgadm-headers-0");
    assert_eq!(m.broker.delivery_count, 0);
    assert!(m.broker.dead_letter_reason.is_none());
    assert!(!m.envelope.properties.contains_key(headers::FAILURE_ERROR));
    assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRIES));
    assert!(!m.envelope.properties.contains_key(headers::DELAYED_RETRY_SEAL));
    assert_eq!(m.envelope.properties.get("tenant"), Some(&PropertyValue::from("acme")));
    assert!(m.broker.sequence_number > seqs[0]);
    assert_eq!(m.broker.enqueued_time, clock.now());
    assert!(matches!(
        admin.resubmit("pgadm-headers", seqs[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    // Received again, from a delivery count of zero.
    let receiver = t.receiver(&EntityPath::queue("pgadm-headers")).await.unwrap();
    let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got[0].message().broker.delivery_count, 1);
    got.into_iter().next().unwrap().complete().await.unwrap();
}

#[tokio::test]
async fn pg_bodies_show_as_json_text_or_bytes() {
    let (t, admin, _clock) = setup().await;
    t.create_queue("pgadm-bodies", &QueueOptions::default()).await.unwrap();
    let sender = t.sender("pgadm-bodies", SenderOptions::default()).await.unwrap();
    for body in [&b"{\"a\":[1,2]}"[..], b"<script>alert(1)</script>", &[0xff, 0x00, 0x10]] {
        sender.send(Envelope::new(body.to_vec())).await.unwrap();
    }
    let receiver = t.receiver(&EntityPath::queue("pgadm-bodies")).await.unwrap();
    let mut got = 0;
    while got < 3 {
        for d in receiver.receive(3, Duration::from_secs(5)).await.unwrap() {
            d.dead_letter("test.Poison", "x").await.unwrap();
            got += 1;
        }
    }
    let seqs = admin.all_dead_letters("pgadm-bodies").await.unwrap();
    let mut bodies = Vec::new();
    for s in &seqs {
        let d = admin.dead_letter("pgadm-bodies", *s).await.unwrap();
        assert_eq!(d.reason.as_deref(), Some("test.Poison"));
        bodies.push((d.body, d.body_size));
    }
    assert_eq!(
        bodies,
        vec![
            (BodyView::Json(serde_json::json!({"a": [1, 2]})), 11),
            (BodyView::Text("<script>alert(1)</script>".into()), 25),
            (BodyView::Bytes(vec![0xff, 0x00, 0x10]), 3),
        ]
    );
}

#[tokio::test]
async fn pg_counts_show_every_state_and_the_oldest_age() {
    let (t, admin, clock) = setup().await;
    t.create_queue("pgadm-counts", &QueueOptions::default()).await.unwrap();
    t.create_topic("pgadm-events", &TopicOptions::default()).await.unwrap();
    t.create_subscription("pgadm-events", "audit", &SubscriptionOptions::default())
        .await
        .unwrap();
    let start = clock.now();
    let sender = t.sender("pgadm-counts", SenderOptions::default()).await.unwrap();
    for _ in 0..4 {
        sender.send(Envelope::new("x")).await.unwrap();
    }
    sender
        .schedule(Envelope::new("later"), start + chrono::Duration::hours(1))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(90));
    let receiver = t.receiver(&EntityPath::queue("pgadm-counts")).await.unwrap();
    let mut got = receiver.receive(2, Duration::from_secs(5)).await.unwrap();
    while got.len() < 2 {
        got.extend(receiver.receive(2 - got.len(), Duration::from_secs(5)).await.unwrap());
    }
    let mut got = got.into_iter();
    got.next().unwrap().defer().await.unwrap();
    got.next().unwrap().dead_letter("test", "x").await.unwrap();
    let _held = receiver.receive(1, Duration::from_secs(5)).await.unwrap();

    let queues = admin.queues().await.unwrap();
    let mine: Vec<_> = queues.iter().filter(|q| q.name.starts_with("pgadm-")).collect();
    let find = |name: &str| *mine.iter().find(|q| q.name == name).unwrap();
    let q = find("pgadm-counts");
    assert_eq!(q.kind, EntityKind::Queue);
    assert_eq!(
        (q.active, q.locked, q.scheduled, q.deferred, q.dead_lettered),
        (1, 1, 1, 1, 1)
    );
    assert_eq!(q.oldest_age(admin.now()), Some(chrono::Duration::seconds(90)));
    assert_eq!(find("pgadm-events").kind, EntityKind::Topic);
    assert_eq!(find("pgadm-events/subscriptions/audit").kind, EntityKind::Subscription);
    // Sorted by name.
    let names: Vec<&str> = queues.iter().map(|q| q.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);
    assert!(matches!(
        admin.dead_letters("pgadm-events", 0, 10).await,
        Err(AdminError::Refused { .. })
    ));
}

#[tokio::test]
async fn pg_pages_follow_each_other_and_resubmit_many_and_all_report_each_message() {
    let (t, admin, _clock) = setup().await;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-many", 7).await;
    assert_eq!(seqs.len(), 7);
    let first = admin.dead_letters("pgadm-many", 0, 3).await.unwrap();
    assert_eq!((first.items.len(), first.total), (3, 7));
    let second = admin
        .dead_letters("pgadm-many", first.next_after.unwrap(), 3)
        .await
        .unwrap();
    let third = admin
        .dead_letters("pgadm-many", second.next_after.unwrap(), 3)
        .await
        .unwrap();
    assert_eq!((second.items.len(), third.items.len(), third.next_after), (3, 1, None));
    let paged: Vec<i64> = [first, second, third]
        .iter()
        .flat_map(|p| p.items.iter().map(|d| d.sequence_number))
        .collect();
    assert_eq!(paged, seqs);

    let outcome = admin
        .resubmit_many("pgadm-many", &[seqs[0], seqs[1], 999_999_999_999])
        .await
        .unwrap();
    assert_eq!(outcome.done, vec![seqs[0], seqs[1]]);
    assert_eq!(outcome.not_found, vec![999_999_999_999]);
    assert!(outcome.failed.is_empty());
    let all = admin.all_dead_letters("pgadm-many").await.unwrap();
    assert_eq!(all, seqs[2..].to_vec());
    let outcome = admin.resubmit_many("pgadm-many", &all).await.unwrap();
    assert_eq!(outcome.done.len(), 5);
    let c = counts(&t, "pgadm-many").await;
    assert_eq!((c.active, c.dead_lettered), (7, 0));
    // In their old order, with new numbers.
    let ids: Vec<String> = t
        .peek(&EntityPath::queue("pgadm-many"), 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.envelope.message_id)
        .collect();
    let expected: Vec<String> = (0..7).map(|i| format!("pgadm-many-{i}")).collect();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn pg_delete_removes_a_dead_letter_and_unknown_names_are_not_found() {
    let (t, admin, _clock) = setup().await;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-delete", 3).await;
    admin.delete_dead_letter("pgadm-delete", seqs[0]).await.unwrap();
    let c = counts(&t, "pgadm-delete").await;
    assert_eq!((c.active, c.dead_lettered), (0, 2));
    assert!(matches!(
        admin.dead_letter("pgadm-delete", seqs[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.delete_dead_letter("pgadm-delete", seqs[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    for unknown in ["pgadm-no-such-queue", "pgadm-no-topic/subscriptions/x"] {
        assert!(matches!(
            admin.dead_letters(unknown, 0, 10).await,
            Err(AdminError::NotFound { .. })
        ));
        assert!(matches!(
            admin.resubmit(unknown, 1).await,
            Err(AdminError::NotFound { .. })
        ));
    }
    let outcome = admin.delete_many("pgadm-delete", &[seqs[1], seqs[2], 5]).await.unwrap();
    assert_eq!((outcome.done, outcome.not_found), (vec![seqs[1], seqs[2]], vec![5]));
    assert_eq!(counts(&t, "pgadm-delete").await.dead_lettered, 0);
}

#[tokio::test]
async fn pg_a_dead_letter_locked_by_a_receiver_of_the_dead_letter_queue_is_not_taken() {
    let (t, admin, _clock) = setup().await;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-locked", 1).await;
    let dlq = t
        .receiver(&EntityPath::queue("pgadm-locked").dead_letter())
        .await
        .unwrap();
    let held = dlq.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(held.len(), 1);
    assert!(matches!(
        admin.resubmit("pgadm-locked", seqs[0]).await,
        Err(AdminError::NotFound { .. })
    ));
    held.into_iter().next().unwrap().abandon().await.unwrap();
    admin.resubmit("pgadm-locked", seqs[0]).await.unwrap();
    assert_eq!(counts(&t, "pgadm-locked").await.active, 1);
}

#[tokio::test]
async fn pg_a_subscription_dead_letter_goes_back_to_its_subscription_only() {
    let (t, admin, _clock) = setup().await;
    t.create_topic("pgadm-topic", &TopicOptions::default()).await.unwrap();
    for sub in ["billing", "audit"] {
        t.create_subscription("pgadm-topic", sub, &SubscriptionOptions::default())
            .await
            .unwrap();
    }
    let billing = EntityPath::subscription("pgadm-topic", "billing");
    let audit = EntityPath::subscription("pgadm-topic", "audit");
    dead_letter_n(&t, "pgadm-topic", &billing, 2).await;
    let name = "pgadm-topic/subscriptions/billing";
    let page = admin.dead_letters(name, 0, 10).await.unwrap();
    assert_eq!(page.total, 2);
    let q = admin
        .queues()
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.name == name)
        .unwrap();
    assert_eq!((q.kind, q.dead_lettered, q.active), (EntityKind::Subscription, 2, 0));
    let all = admin.all_dead_letters(name).await.unwrap();
    let outcome = admin.resubmit_many(name, &all).await.unwrap();
    assert_eq!(outcome.done.len(), 2);
    let b = t.counts(&billing).await.unwrap();
    assert_eq!((b.active, b.dead_lettered), (2, 0));
    // The other subscription kept its own two copies; nothing was published again.
    let a = t.counts(&audit).await.unwrap();
    assert_eq!((a.active, a.dead_lettered), (2, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_an_interrupted_resubmit_leaves_each_message_in_exactly_one_place() {
    let (t, admin, _clock) = setup().await;
    let n = 2500;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-interrupt", n).await;
    assert_eq!(seqs.len(), n);
    let mut dropped = 0;
    for polls in 0..16 {
        let rest = admin.all_dead_letters("pgadm-interrupt").await.unwrap();
        if rest.is_empty() {
            break;
        }
        if !poll_then_drop(admin.resubmit_many("pgadm-interrupt", &rest), polls).await {
            dropped += 1;
        }
        // A statement cut by the drop is rolled back or committed by Postgres as a whole.
        let c = counts(&t, "pgadm-interrupt").await;
        assert_eq!(
            c.active + c.dead_lettered,
            u64::try_from(n).unwrap(),
            "after {polls} polls: {c:?}"
        );
    }
    assert!(dropped > 0);
    let rest = admin.all_dead_letters("pgadm-interrupt").await.unwrap();
    let outcome = admin.resubmit_many("pgadm-interrupt", &rest).await.unwrap();
    assert_eq!((outcome.done.len(), outcome.not_found.len()), (rest.len(), 0));
    let c = counts(&t, "pgadm-interrupt").await;
    assert_eq!((c.active, c.dead_lettered), (u64::try_from(n).unwrap(), 0));
    let receiver = t.receiver(&EntityPath::queue("pgadm-interrupt")).await.unwrap();
    let mut ids = Vec::new();
    while ids.len() < n {
        for m in receiver.receive_and_delete(1000, Duration::from_secs(5)).await.unwrap() {
            ids.push(m.envelope.message_id);
        }
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n, "each message once");
}

#[tokio::test]
async fn pg_a_failing_connection_leaves_every_dead_letter_where_it_was() {
    let (t, admin, _clock) = setup().await;
    let seqs = queue_with_dead_letters(&t, &admin, "pgadm-failing", 3).await;
    // An admin whose pool is closed cannot reach the database: nothing moves.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(courier_tests::pg_transport::database().await)
        .await
        .unwrap();
    let cut = PostgresAdmin::new(pool.clone());
    pool.close().await;
    assert!(cut.resubmit_many("pgadm-failing", &seqs).await.is_err());
    assert!(cut.resubmit("pgadm-failing", seqs[0]).await.is_err());
    let c = counts(&t, "pgadm-failing").await;
    assert_eq!((c.active, c.dead_lettered), (0, 3));
}
