//! Every dead-lettering is counted in `courier.messages.dead_lettered` with its reason
//! (issue 31, point 8): those the transports do themselves too, labelled with the
//! transport (`messaging.system`) and the queue (`messaging.destination.name`): a message
//! whose time-to-live ran out and one delivered more often than the queue's max delivery
//! count on the embedded broker and the Postgres transport, an abandon at the max
//! delivery count and what the embedded broker dead-letters as its file opens, a
//! wire-format refusal and an expiry by the transport's clock on RabbitMQ. Each test uses
//! queues of its own.

use std::sync::Arc;
use std::time::Duration;

use courier::conformance::Fixture;
use courier::observability::{labels, names};
use courier::{EntityPath, Envelope, QueueOptions, SenderOptions, Transport, reasons as broker};
use courier_tests::raw_amqp::{Confirm, RawProperties, RawPublisher};
use courier_tests::{eventually, rabbit};

use crate::recorder::{counter, install};

fn dead(system: &str, queue: &str, reason: &str) -> u64 {
    counter(
        names::DEAD_LETTERED,
        &[
            (labels::SYSTEM, system),
            (labels::DESTINATION, queue),
            (labels::REASON, reason),
        ],
    )
}

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// On `fx`'s transport (`system`): a message expires, another is delivered once more than
/// its queue allows; each is counted once, with its reason, under the queue's name.
async fn expiry_and_max_delivery_count_are_counted(fx: &Fixture, system: &str) {
    install();
    let t: &Arc<dyn Transport> = &fx.transport;
    let name = unique("obs-ttl");
    let options = QueueOptions::default()
        .max_delivery_count(1)
        .lock_duration(Duration::from_secs(30));
    t.create_queue(&name, &options).await.unwrap();
    let sender = t.sender(&name, SenderOptions::default()).await.unwrap();
    let expiring = Envelope::json(&serde_json::json!({"n": 1}))
        .unwrap()
        .with_message_id("expires")
        .with_time_to_live(Duration::from_secs(1));
    sender.send(expiring).await.unwrap();
    assert_eq!(dead(system, &name, broker::TTL_EXPIRED), 0);
    fx.clock.advance(Duration::from_secs(2));
    // A count runs the broker's maintenance, which dead-letters it.
    eventually("the expired message dead-lettered", || async {
        t.counts(&EntityPath::queue(&name)).await.unwrap().dead_lettered == 1
    })
    .await;
    eventually("the expiry counted", || async {
        dead(system, &name, broker::TTL_EXPIRED) == 1
    })
    .await;

    sender
        .send(
            Envelope::json(&serde_json::json!({"n": 2}))
                .unwrap()
                .with_message_id("held"),
        )
        .await
        .unwrap();
    let receiver = t.receiver(&EntityPath::queue(&name)).await.unwrap();
    let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    // Its lock runs out at its last delivery: the broker dead-letters it.
    fx.clock.advance(Duration::from_secs(31));
    eventually("the exhausted message dead-lettered", || async {
        t.counts(&EntityPath::queue(&name)).await.unwrap().dead_lettered == 2
    })
    .await;
    eventually("the max delivery count counted", || async {
        dead(system, &name, broker::MAX_DELIVERY_COUNT_EXCEEDED) == 1
    })
    .await;
    assert_eq!(dead(system, &name, broker::TTL_EXPIRED), 1, "each once");
    drop(got);
    t.delete(&EntityPath::queue(&name)).await.unwrap();
}

#[tokio::test]
async fn the_embedded_brokers_own_dead_letterings_are_counted() {
    let fx = courier_tests::embedded_fixture().await;
    expiry_and_max_delivery_count_are_counted(&fx, "embedded").await;
}

#[tokio::test]
async fn the_postgres_transports_own_dead_letterings_are_counted() {
    let fx = courier_tests::pg_transport::pg_fixture().await;
    expiry_and_max_delivery_count_are_counted(&fx, "postgres").await;
}

/// RabbitMQ: a message whose id is not UTF-8 is refused (`courier.InvalidWireFormat`) and
/// one expired by the transport's clock is moved by the receiver (`TTLExpiredException`);
/// each is counted
/// under `amqp` and the queue. (What RabbitMQ dead-letters itself, it counts itself:
/// docs/observability.md.)
#[tokio::test]
async fn rabbitmqs_refusals_and_expiries_by_the_receiver_are_counted() {
    install();
    let clock = courier::VirtualClock::starting_now();
    let store = rabbit::memory_store().await;
    let transport = rabbit::transport(&clock, courier::ScheduleStore::from(&store)).await;
    let name = unique("obs-refused");
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    let mut raw = RawPublisher::connect(&rabbit::amqp_url().await).await.unwrap();
    let bad = RawProperties {
        message_id: Some(b"bad-\xff".to_vec()),
        kind: Some(b"obs.Nobody".to_vec()),
        ..RawProperties::default()
    };
    assert_eq!(
        raw.publish("", name.as_bytes(), &bad, b"{}").await.unwrap(),
        Confirm::Ack
    );
    let sender = transport.sender(&name, SenderOptions::default()).await.unwrap();
    sender
        .send(
            Envelope::json(&serde_json::json!({"n": 1}))
                .unwrap()
                .with_message_id("expires")
                .with_time_to_live(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    clock.advance(Duration::from_secs(120));
    let receiver = transport.receiver(&EntityPath::queue(&name)).await.unwrap();
    eventually("both moved to the dead-letter queue", || async {
        let got = receiver.receive(5, Duration::from_millis(200)).await.unwrap();
        assert!(got.is_empty(), "refused and expired ones are not handed out");
        let (refused, expired) = (
            dead("amqp", &name, broker::INVALID_WIRE_FORMAT),
            dead("amqp", &name, broker::TTL_EXPIRED),
        );
        refused == 1 && expired == 1
    })
    .await;
    assert_eq!(transport.wire_stats().invalid, 1, "an expiry is no refusal");
    transport.delete(&EntityPath::queue(&name)).await.unwrap();
}

/// The embedded broker: an abandon at the queue's max delivery count dead-letters the
/// message (S2.6), and is counted once under the queue with its reason.
#[tokio::test]
async fn an_embedded_abandon_at_the_max_delivery_count_is_counted() {
    install();
    let fx = courier_tests::embedded_fixture().await;
    let t = &fx.transport;
    let name = unique("obs-abandon");
    t.create_queue(&name, &QueueOptions::default().max_delivery_count(2))
        .await
        .unwrap();
    let path = EntityPath::queue(&name);
    let sender = t.sender(&name, SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new(b"x".to_vec()).with_message_id("abandoned"))
        .await
        .unwrap();
    let receiver = t.receiver(&path).await.unwrap();
    for _ in 0..2 {
        let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1);
        got.into_iter().next().unwrap().abandon().await.unwrap();
    }
    assert_eq!(t.counts(&path).await.unwrap().dead_lettered, 1);
    eventually("the abandon at the max delivery count counted", || async {
        dead("embedded", &name, broker::MAX_DELIVERY_COUNT_EXCEEDED) == 1
    })
    .await;
    t.delete(&path).await.unwrap();
}

/// The embedded broker's file: a message locked at its last delivery when the broker
/// stopped is dead-lettered when the file opens again, and counted under its queue.
#[tokio::test]
async fn rows_the_embedded_broker_dead_letters_when_its_file_opens_are_counted() {
    install();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("broker.db");
    let clock = courier::VirtualClock::starting_now();
    let open = || async {
        courier::Embedded::builder()
            .path(&file)
            .clock(Arc::new(clock.clone()))
            .open()
            .await
            .unwrap()
    };
    let name = unique("obs-open");
    let path = EntityPath::queue(&name);
    let first = open().await;
    first
        .create_queue(&name, &QueueOptions::default().max_delivery_count(1))
        .await
        .unwrap();
    let sender = first.sender(&name, SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new(b"x".to_vec()).with_message_id("locked-at-the-end"))
        .await
        .unwrap();
    let receiver = first.receiver(&path).await.unwrap();
    let held = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(held.len(), 1);
    std::mem::forget(held);
    drop((sender, receiver));
    first.close().await;
    drop(first);

    let before = dead("embedded", &name, broker::MAX_DELIVERY_COUNT_EXCEEDED);
    let again = open().await;
    assert_eq!(again.counts(&path).await.unwrap().dead_lettered, 1);
    assert_eq!(
        dead("embedded", &name, broker::MAX_DELIVERY_COUNT_EXCEEDED),
        before + 1,
        "counted when the file opened"
    );
    again.close().await;
}
