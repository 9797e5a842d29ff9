//! The dead letters of a topic's subscription on the embedded broker: resubmitted to that
//! subscription alone (the topic's other subscriptions do not get the message again), and
//! deleted.

use std::time::Duration;

use courier::admin::{EmbeddedAdmin, QueueAdmin};
use courier::{EntityPath, Envelope, SenderOptions, SubscriptionOptions, TopicOptions, Transport};

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
            out.push((d.message().envelope.message_id.clone(), d.message().broker.delivery_count));
            d.complete().await.unwrap();
        }
    }
}

#[tokio::test]
async fn a_subscriptions_dead_letter_goes_back_to_that_subscription_alone() {
    let (broker, _clock) = broker().await;
    broker.create_topic("adm-sub-events", &TopicOptions::default()).await.unwrap();
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
    // A message published after the resubmit is numbered after it, in both subscriptions:
    // the resubmitted copy's number came from the topic, so nothing collides.
    publisher.send(Envelope::new("{}").with_message_id("e-4")).await.unwrap();
    let outcome = admin.delete_many(name, &[second]).await.unwrap();
    assert_eq!(outcome.done, vec![second]);

    let counts = broker.counts(&audit).await.unwrap();
    assert_eq!((counts.active, counts.dead_lettered), (2, 0));
    // Back in audit, with a delivery count that starts again, before e-4.
    assert_eq!(drain(&broker, &audit).await, [("e-1".to_owned(), 1), ("e-4".to_owned(), 1)]);
    // billing was not given e-1 again.
    let billing_ids: Vec<String> = drain(&broker, &billing).await.into_iter().map(|(id, _)| id).collect();
    assert_eq!(billing_ids, ["e-1", "e-2", "e-3", "e-4"]);

    // Resubmitting what is no longer there says so; a topic has no dead letters to change.
    assert!(matches!(
        admin.resubmit(name, first).await,
        Err(courier::admin::AdminError::NotFound { .. })
    ));
    assert!(matches!(
        admin.resubmit("adm-sub-events", first).await,
        Err(courier::admin::AdminError::Refused { .. })
    ));
}
