//! A scheduled message whose destination is not there when it comes due (RabbitMQ
//! restarting answers "no such queue" for a moment) is kept and published once the
//! destination is back, never dropped. Found by `courier-chaos` (docs/reliability.md):
//! a delayed retry, due while RabbitMQ restarted, was dropped and its flow never ended.

use std::time::Duration;

use courier::{EntityPath, Envelope, QueueOptions, SenderOptions, Transport, VirtualClock};
use courier_tests::rabbit::amqp_url;

use super::support::{database, rabbit, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_message_whose_queue_is_missing_when_due_is_kept_until_it_is_back() {
    let (db, store) = database().await;
    let clock = VirtualClock::starting_now();
    let transport = rabbit(&store, Some(&clock)).await;
    let name = unique("sched");
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    let sender = transport.sender(&name, SenderOptions::default()).await.unwrap();
    let at = courier::Clock::now(&clock) + chrono::Duration::seconds(10);
    sender
        .schedule(Envelope::new("later").with_message_id("kept-1"), at)
        .await
        .unwrap();

    // The queue goes away behind Courier's back (its scheduled row stays), and the
    // message comes due meanwhile.
    let conn = lapin::Connection::connect(&amqp_url().await, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel
        .queue_delete(name.as_str().into(), lapin::options::QueueDeleteOptions::default())
        .await
        .unwrap();
    clock.advance(Duration::from_secs(11));
    // The dispatcher's round ran and found no queue: the row is kept (before, it was
    // deleted and the message lost).
    courier_tests::eventually("the round that finds no queue", || async {
        sqlx::query_scalar::<_, chrono::DateTime<chrono::Utc>>(
            "SELECT due_at FROM courier.amqp_scheduled WHERE destination = $1",
        )
        .bind(&name)
        .fetch_optional(store.pool())
        .await
        .unwrap()
        .is_some_and(|due| due > at)
    })
    .await;

    // Back: published at the next try.
    transport.create_queue(&name, &QueueOptions::default()).await.unwrap();
    clock.advance(Duration::from_secs(31));
    let receiver = transport.receiver(&EntityPath::queue(&name)).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..50 {
        for d in receiver.receive(1, Duration::from_millis(200)).await.unwrap() {
            got.push(d.message().envelope.message_id.clone());
            d.complete().await.unwrap();
        }
        if !got.is_empty() {
            break;
        }
        clock.advance(Duration::from_secs(1));
    }
    assert_eq!(got, vec!["kept-1".to_owned()], "the scheduled message arrived once");
    // The row is deleted in the transaction that published it, which commits after the
    // broker's confirm: the message can arrive first (a read at once failed 1 run in 3).
    courier_tests::eventually("the row deleted", || async {
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier.amqp_scheduled WHERE destination = $1")
            .bind(&name)
            .fetch_one(store.pool())
            .await
            .unwrap();
        left == 0
    })
    .await;
    let _ = transport.delete(&EntityPath::queue(&name)).await;
    let _ = conn.close(200, "done".into()).await;
    transport.close().await;
    db.drop_now().await;
}
