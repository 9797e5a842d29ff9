//! Resubmits on the embedded broker, which moves dead letters inside the database: a
//! topic's subscription's go back to that subscription alone (the topic's other
//! subscriptions do not get the message again); one without the session id its
//! subscription requires stays and says why; property values come back exactly; the
//! time-to-live counts from the resubmit.

use std::time::Duration;

use courier::Clock;
use courier::admin::{AdminError, EmbeddedAdmin, QueueAdmin};
use courier::recoverability::headers;
use courier::{
    EntityPath, Envelope, PropertyValue, QueueOptions, SenderOptions, SubscriptionOptions, TopicOptions, Transport,
};

use super::broker;

/// Receives every message of `path` now (nothing waits), completes them, and returns
/// their message ids and delivery counts in order.
async fn drain(broker: &courier::Embedded, path: &EntityPath) -> Vec<(String, u32)> {
    let receiver = broker.receiver(path).await.unwrap();
    let mut out = Vec::new();
    loop {
        let got = receiver.receive(100, Duration::from_millis(50)).await.unwrap();
        if got.is_empty() {
            return out;
        }
        for d in got {
            out.push((
                d.message().envelope.message_id.clone(),
                d.message().broker.delivery_count,
            ));
            d.complete().await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_subscriptions_dead_letter_goes_back_to_that_subscription_alone() {
    let (broker, _clock) = broker().await;
    broker
        .create_topic("adm-sub-events", &TopicOptions::default())
        .await
        .unwrap();
    for sub in ["audit", "billing"] {
        broker
            .create_subscription("adm-sub-events", sub, &SubscriptionOptions::default())
            .await
            .unwrap();
    }
    let audit = EntityPath::subscription("adm-sub-events", "audit");
    let billing = EntityPath::subscription("adm-sub-events", "billing");
    let publisher = broker.sender("adm-sub-events", SenderOptions::default()).await.unwrap();
    for id in ["e-1", "e-2", "e-3"] {
        publisher.send(Envelope::new("{}").with_message_id(id)).await.unwrap();
    }
    // audit dead-letters e-1 and e-3.
    let receiver = broker.receiver(&audit).await.unwrap();
    let mut seen = 0;
    while seen < 3 {
        for d in receiver.receive(3, Duration::from_secs(5)).await.unwrap() {
            seen += 1;
            if d.message().envelope.message_id == "e-2" {
                d.complete().await.unwrap();
            } else {
                d.dead_letter("test.Poison", "broken on purpose").await.unwrap();
            }
        }
    }
    drop(receiver);

    let admin = EmbeddedAdmin::new(broker.clone());
    let name = "adm-sub-events/subscriptions/audit";
    let page = admin.dead_letters(name, 0, 10).await.unwrap();
    let ids: Vec<&str> = page.items.iter().map(|d| d.message_id.as_str()).collect();
    assert_eq!(ids, ["e-1", "e-3"]);
    let (first, second) = (page.items[0].sequence_number, page.items[1].sequence_number);

    admin.resubmit(name, first).await.unwrap();
    // Put back in place: it keeps its number, so it comes before a message published
    // after the resubmit.
    publisher
        .send(Envelope::new("{}").with_message_id("e-4"))
        .await
        .unwrap();
    let outcome = admin.delete_many(name, &[second]).await.unwrap();
    assert_eq!(outcome.done, vec![second]);

    let counts = broker.counts(&audit).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (2, 0));
    // Back in audit, with a delivery count that starts again, before e-4.
    assert_eq!(
        drain(&broker, &audit).await,
        [("e-1".to_owned(), 1), ("e-4".to_owned(), 1)]
    );
    // billing was not given e-1 again.
    let billing_ids: Vec<String> = drain(&broker, &billing).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(billing_ids, ["e-1", "e-2", "e-3", "e-4"]);

    // Resubmitting what is no longer there says so; a topic has no dead letters to change.
    assert!(matches!(
        admin.resubmit(name, first).await,
        Err(AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.resubmit("adm-sub-events", first).await,
        Err(AdminError::Refused { .. })
    ));
}

#[tokio::test]
async fn a_dead_letter_without_the_session_its_subscription_requires_stays_and_says_why() {
    let (broker, _clock) = broker().await;
    broker
        .create_topic("adm-sess-events", &TopicOptions::default())
        .await
        .unwrap();
    broker
        .create_subscription(
            "adm-sess-events",
            "by-customer",
            &SubscriptionOptions::default().requires_session(true),
        )
        .await
        .unwrap();
    let publisher = broker
        .sender("adm-sess-events", SenderOptions::default())
        .await
        .unwrap();
    publisher
        .send(Envelope::new("{}").with_message_id("no-session"))
        .await
        .unwrap();
    let mut with = Envelope::new("{}").with_message_id("with-session");
    with.session_id = Some("c-1".into());
    publisher.send(with).await.unwrap();
    let name = "adm-sess-events/subscriptions/by-customer";
    let admin = EmbeddedAdmin::new(broker.clone());
    // The fan-out dead-lettered the message without a session id (SessionIdMissing).
    let page = admin.dead_letters(name, 0, 10).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let seq = page.items[0].sequence_number;

    let refused = admin.resubmit(name, seq).await.unwrap_err();
    assert!(matches!(refused, AdminError::Refused { .. }), "{refused}");
    assert!(refused.to_string().contains("requires sessions"), "{refused}");
    let outcome = admin.resubmit_many(name, &[seq]).await.unwrap();
    assert!(outcome.done.is_empty() && outcome.not_found.is_empty());
    assert_eq!(outcome.failed.len(), 1);
    assert_eq!(outcome.failed[0].0, seq);
    let path = EntityPath::subscription("adm-sess-events", "by-customer");
    let counts = broker.counts(&path).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (1, 1));
    // It can be deleted.
    assert_eq!(admin.delete_many(name, &[seq]).await.unwrap().done, vec![seq]);
    assert_eq!(broker.counts(&path).await.unwrap().dead_lettered, 0);
}

#[tokio::test]
async fn property_values_come_back_exactly_and_the_time_to_live_counts_from_the_resubmit() {
    // A file (WAL: reads never wait for the engine's maintenance, which the clock's jumps
    // start), not the in-memory database, whose readers share the writer's table locks.
    let dir = tempfile::tempdir().unwrap();
    let clock = courier::VirtualClock::starting_now();
    let broker = courier::Embedded::builder()
        .path(dir.path().join("ttl.db"))
        .clock(std::sync::Arc::new(clock.clone()))
        .open()
        .await
        .unwrap();
    broker.create_queue("adm-ttl", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("adm-ttl", SenderOptions::default()).await.unwrap();
    let mut m = Envelope::new("{}").with_message_id("ttl-1");
    m.time_to_live = Some(Duration::from_secs(60));
    let values = [
        ("float", PropertyValue::from(0.1_f64 + 0.2_f64)),
        ("big", PropertyValue::from(i64::MAX - 1)),
        ("yes", PropertyValue::from(true)),
        ("text", PropertyValue::from("caf\u{e9} \"quoted\" \\ $.x")),
    ];
    for (k, v) in &values {
        m.properties.insert((*k).into(), v.clone());
    }
    for h in headers::FAILURE_HEADERS {
        m.properties.insert(h.into(), PropertyValue::from("stale"));
    }
    sender.send(m).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("adm-ttl")).await.unwrap();
    let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    got.into_iter()
        .next()
        .unwrap()
        .dead_letter("test.Poison", "x")
        .await
        .unwrap();

    // Ten minutes later: long past the message's first time-to-live.
    clock.advance(Duration::from_secs(600));
    let admin = EmbeddedAdmin::new(broker.clone());
    let seq = admin.dead_letters("adm-ttl", 0, 10).await.unwrap().items[0].sequence_number;
    admin.resubmit("adm-ttl", seq).await.unwrap();
    clock.advance(Duration::from_secs(30));
    let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    let d = got
        .into_iter()
        .next()
        .expect("the resubmitted message, within its time-to-live");
    let props = &d.message().envelope.properties;
    for (k, v) in &values {
        assert_eq!(props.get(*k), Some(v), "{k}");
    }
    for h in headers::FAILURE_HEADERS {
        assert!(!props.contains_key(h), "{h} left on the resubmitted message");
    }
    assert_eq!(d.message().envelope.time_to_live, Some(Duration::from_secs(60)));
    assert_eq!(
        d.message().broker.enqueued_time,
        clock.now() - chrono::Duration::seconds(30)
    );
    // Given back, it expires 60 s after the resubmit.
    d.abandon().await.unwrap();
    clock.advance(Duration::from_secs(31));
    assert!(receiver.receive(1, Duration::from_millis(50)).await.unwrap().is_empty());
    let counts = broker.counts(&EntityPath::queue("adm-ttl")).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (0, 1));
}
