//! Receivers of another process are woken by what this process sends, though no send
//! notifies inside its own transaction any more: the transport's notifier notifies once
//! the sending transaction committed (`postgres/wake.rs`, `Notifier`). Every transport
//! here polls once an hour, so a receive that returns within the test's wait was woken by
//! a notification: sent by `Sender::send`, by a handler's transaction on the transport's
//! own store, alone and in a commit group, for a topic through its subscription, and by a
//! `send_batch` to a queue (its statement notifies itself).

use std::sync::Arc;
use std::time::Duration;

use courier::{
    EntityPath, Envelope, PostgresTransport, QueueOptions, SenderOptions, SubscriptionOptions, TopicOptions, Transport,
};
use sqlx::PgPool;

use super::pg_unit_of_work::{Job, jobs_endpoint};

/// Longer than any test waits: a receive that returns was woken, not polled.
const NEVER: Duration = Duration::from_secs(3600);

/// How long a woken receive may take on a loaded machine.
const WOKEN_WITHIN: Duration = Duration::from_secs(60);

/// A transport on `pool` that polls once an hour: a process of its own.
async fn process(pool: &PgPool) -> Arc<PostgresTransport> {
    Arc::new(
        PostgresTransport::from_pool(pool.clone())
            .poll_interval(NEVER)
            .open()
            .await
            .unwrap(),
    )
}

/// Receives `n` messages from `path` on `transport`, each receive woken within
/// [`WOKEN_WITHIN`]; completes them and returns their bodies.
async fn receive_woken(transport: &PostgresTransport, path: &EntityPath, n: usize) -> Vec<Vec<u8>> {
    let r = transport.receiver(path).await.unwrap();
    let mut bodies = Vec::new();
    while bodies.len() < n {
        let got = tokio::time::timeout(WOKEN_WITHIN, r.receive(n - bodies.len(), NEVER))
            .await
            .unwrap_or_else(|_| panic!("{path:?}: not woken ({} of {n} received)", bodies.len()))
            .unwrap();
        for d in got {
            bodies.push(d.message().body().to_vec());
            d.complete().await.unwrap();
        }
    }
    bodies
}

/// A handler's send, committed with its handling, wakes a receiver of another process;
/// `group`: messages a transaction. The endpoint's own receive (polling once an hour too)
/// is woken by the notification of `bus().send`.
async fn a_handlers_send_wakes_another_process(group: usize) {
    let (db, pool) = super::database_with_effects().await;
    let (ours, theirs) = (process(&pool).await, process(&pool).await);
    for q in ["jobs", "done"] {
        ours.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let jobs = jobs_endpoint(&ours, group).await;
    let done = EntityPath::queue("done");
    let waiting = tokio::spawn({
        let theirs = theirs.clone();
        async move { receive_woken(&theirs, &done, 4).await }
    });
    // The receive above waits before anything is sent (a first look finds nothing).
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in 1..=4 {
        jobs.bus().send(&Job { n }).await.unwrap();
    }
    let mut got: Vec<i64> = waiting
        .await
        .unwrap()
        .iter()
        .map(|b| {
            serde_json::from_slice::<serde_json::Value>(b).unwrap()["n"]
                .as_i64()
                .unwrap()
        })
        .collect();
    got.sort_unstable();
    assert_eq!(got, [1, 2, 3, 4], "every Done, each receive woken");
    jobs.shutdown().await.unwrap();
    ours.close().await;
    theirs.close().await;
    pool.close().await;
    db.drop_now().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_send_wakes_a_receiver_of_another_process() {
    a_handlers_send_wakes_another_process(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grouped_handlings_send_wakes_a_receiver_of_another_process() {
    a_handlers_send_wakes_another_process(4).await;
}

/// A message published to a topic, alone or in a batch, wakes the receiver of its
/// subscription (the notifier notifies a topic's subscriptions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_wakes_the_receiver_of_a_subscription_of_another_process() {
    let (db, pool) = super::database_with_effects().await;
    let (ours, theirs) = (process(&pool).await, process(&pool).await);
    ours.create_topic("events", &TopicOptions::default()).await.unwrap();
    ours.create_subscription("events", "audit", &SubscriptionOptions::default())
        .await
        .unwrap();
    let path = EntityPath::subscription("events", "audit");
    let waiting = tokio::spawn({
        let theirs = theirs.clone();
        async move { receive_woken(&theirs, &path, 3).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sender = ours.sender("events", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("one")).await.unwrap();
    sender
        .send_batch(vec![Envelope::new("two"), Envelope::new("later")])
        .await
        .unwrap();
    let got = waiting.await.unwrap();
    assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"later".to_vec()]);
    ours.close().await;
    theirs.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// A `send_batch` to a queue notifies in its own statement, once, when a message of it is
/// receivable: a batch of two, then a batch of one scheduled for later and one due, each
/// wakes a receiver of another process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_to_a_queue_wakes_a_receiver_of_another_process() {
    let (db, pool) = super::database_with_effects().await;
    let (ours, theirs) = (process(&pool).await, process(&pool).await);
    ours.create_queue("inbox", &QueueOptions::default()).await.unwrap();
    let path = EntityPath::queue("inbox");
    let sender = ours.sender("inbox", SenderOptions::default()).await.unwrap();

    let waiting = tokio::spawn({
        let (theirs, path) = (theirs.clone(), path.clone());
        async move { receive_woken(&theirs, &path, 2).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    sender
        .send_batch(vec![Envelope::new("one"), Envelope::new("two")])
        .await
        .unwrap();
    assert_eq!(waiting.await.unwrap(), [b"one".to_vec(), b"two".to_vec()]);

    let waiting = tokio::spawn({
        let (theirs, path) = (theirs.clone(), path.clone());
        async move { receive_woken(&theirs, &path, 1).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut later = Envelope::new("tomorrow");
    later.scheduled_enqueue_time = Some(chrono::Utc::now() + chrono::Duration::days(1));
    sender.send_batch(vec![later, Envelope::new("three")]).await.unwrap();
    assert_eq!(waiting.await.unwrap(), [b"three".to_vec()]);
    assert_eq!(ours.counts(&path).await.unwrap().scheduled, 1, "tomorrow's waits");

    ours.close().await;
    theirs.close().await;
    pool.close().await;
    db.drop_now().await;
}
