//! What a batch handler's transaction writes on the embedded broker's own store (issue
//! 32's batch handlers, issue 33's history): one handled event per fresh member and a
//! duplicate event per redelivery the inbox dropped; every event of a batch past SQLite's
//! bound on parameters, written with the batch's `COMMIT`; and the completion of every
//! member fenced by every lock, so that one lock lost leaves nothing of the batch. The
//! handler and its helpers are `batch.rs`'s.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use courier::{BatchOptions, Clock, ErrorKind, QueueOptions, SendOptions, Store, Transport, VirtualClock};
use courier_tests::eventually;

use super::batch::{Click, Seen, advancing_until, clicks_endpoint, embedded, send_clicks, sqlite_rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_batch_records_each_handled_message_and_each_duplicate_in_the_history() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let seen = Seen::default();
    let options = BatchOptions::new().max_messages(4).max_wait(Duration::from_millis(200));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(Arc::new(broker.store()) as Arc<dyn Store>)
        .history(courier::HistoryOptions::new())
        .start()
        .await
        .unwrap();
    for _ in 0..3 {
        e.bus()
            .send_with(
                &Click { n: 100, poison: false },
                SendOptions::new().message_id("click-100"),
            )
            .await
            .unwrap();
    }
    send_clicks(&e, 1..4, u32::MAX).await;
    advancing_until(&clock, Duration::from_millis(100), "all six settled", || async {
        let c = broker.counts(&courier::EntityPath::queue("clicks")).await.unwrap();
        c.active == 0
    })
    .await;
    e.shutdown().await.unwrap();
    let events: Vec<(String, String)> =
        sqlx::query_as("SELECT kind, message_id FROM courier_history_all ORDER BY kind, message_id")
            .fetch_all(broker.read_pool())
            .await
            .unwrap();
    let handled: Vec<&str> = events
        .iter()
        .filter(|(k, _)| k == "handled")
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(handled.len(), 4, "one handled event per message: {events:?}");
    assert_eq!(handled.iter().filter(|id| **id == "click-100").count(), 1);
    let duplicates: Vec<&str> = events
        .iter()
        .filter(|(k, _)| k == "duplicate")
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(duplicates, vec!["click-100", "click-100"], "{events:?}");
}

/// A batch's events are written with its COMMIT in as few queries as SQLite's bound on
/// parameters allows: a batch of 3,000 (33,000 parameters) takes two queries, and every
/// event is written, in the batch's order, with the batch. (Numbered parameters,
/// `?12`, in the later statements of one query are bound from the wrong place by sqlx:
/// the batch failed with "NOT NULL constraint failed" while the writer used them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_batch_past_sqlites_parameter_bound_records_every_event() {
    const N: u32 = 3_000;
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    broker.create_queue("clicks", &QueueOptions::default()).await.unwrap();
    let sender = broker
        .sender("clicks", courier::SenderOptions::default())
        .await
        .unwrap();
    let clicks: Vec<courier::Envelope> = (0..N)
        .map(|n| courier::Message::to_envelope(&Click { n, poison: false }).unwrap())
        .collect();
    sender.send_batch(clicks).await.unwrap();
    let seen = Seen::default();
    let options = BatchOptions::new()
        .max_messages(N as usize)
        .max_wait(Duration::from_millis(200));
    let e = clicks_endpoint(Arc::new(broker.clone()), &clock, "clicks", &seen, options)
        .store(Arc::new(broker.store()) as Arc<dyn Store>)
        .history(courier::HistoryOptions::new())
        .start()
        .await
        .unwrap();
    eventually("the batch settled", || async {
        broker
            .counts(&courier::EntityPath::queue("clicks"))
            .await
            .unwrap()
            .active
            == 0
    })
    .await;
    e.shutdown().await.unwrap();
    assert_eq!(seen.calls().len(), 1, "one batch of {N}, handed over full");
    let handled: Vec<(String,)> =
        sqlx::query_as("SELECT message_id FROM courier_history_all WHERE kind = 'handled' ORDER BY id")
            .fetch_all(broker.read_pool())
            .await
            .unwrap();
    let rows = sqlite_rows(&broker).await;
    assert_eq!(handled.len(), N as usize, "an event per message");
    let id_of: HashMap<i64, String> = rows.into_iter().map(|(id, n)| (n, id)).collect();
    let in_batch: Vec<String> = seen.calls()[0].iter().map(|n| id_of[&i64::from(*n)].clone()).collect();
    let events: Vec<String> = handled.into_iter().map(|(id,)| id).collect();
    // The batch's lead's event (it tells what the batch sent) is written by the commit,
    // after the others'.
    let mut expected = in_batch[1..].to_vec();
    expected.push(in_batch[0].clone());
    assert!(
        events == expected,
        "each message's event once, in the batch's order, the lead's last"
    );
}

/// A batch's transaction on the embedded broker's store completes its members with one
/// statement, fenced by every lock: when one member's lock expired, the commit fails
/// with `LockLost` and nothing of the batch stays (no completion, no inbox record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_a_batch_whose_one_lock_expired_commits_nothing() {
    let clock = VirtualClock::starting_now();
    let broker = embedded(&clock).await;
    let queue = courier::EntityPath::queue("clicks");
    broker
        .create_queue(
            "clicks",
            &QueueOptions::default().lock_duration(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let sender = broker
        .sender("clicks", courier::SenderOptions::default())
        .await
        .unwrap();
    for n in 0..3 {
        sender
            .send(courier::Message::to_envelope(&Click { n, poison: false }).unwrap())
            .await
            .unwrap();
    }
    let receiver = broker.receiver(&queue).await.unwrap();
    let first = receiver.receive(1, Duration::from_secs(1)).await.unwrap();
    clock.advance(Duration::from_secs(20));
    let rest = receiver.receive(2, Duration::from_secs(1)).await.unwrap();
    assert_eq!((first.len(), rest.len()), (1, 2));
    // The first lock (30 s) has expired; the two others have 15 s left.
    clock.advance(Duration::from_secs(15));
    let members: Vec<(String, Option<courier::LockToken>)> = first
        .iter()
        .chain(&rest)
        .map(|d| (d.message().envelope.message_id.clone(), d.message().broker.lock_token))
        .collect();
    let store = broker.store();
    let begun = store.begin_batch("clicks", members, clock.now()).await.unwrap();
    let work = begun.work.expect("three fresh members");
    let e = work.commit().await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::LockLost), "{e}");
    let counts = broker.counts(&queue).await.unwrap();
    assert_eq!(counts.active, 3, "no member completed");
    let inbox: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_inbox")
        .fetch_one(broker.read_pool())
        .await
        .unwrap();
    assert_eq!(inbox, 0, "the inbox records rolled back with the batch");
}
