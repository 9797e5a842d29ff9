//! What is particular to the embedded broker's engine: batching, cancel safety, limits.

use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::{ErrorKind, LockToken};

async fn broker() -> (Embedded, VirtualClock) {
    let clock = VirtualClock::starting_now();
    let broker = Embedded::builder()
        .in_memory()
        .clock(Arc::new(clock.clone()))
        .open()
        .await
        .unwrap();
    (broker, clock)
}

/// Receives that arrive together share one statement; each gets its own messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_receives_share_messages_without_overlap() {
    let (broker, _clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let mut waiting = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let r = receiver.clone();
        waiting.spawn(async move { r.receive(3, Duration::from_secs(10)).await.unwrap() });
    }
    sender
        .send_batch((0..24).map(|i| Envelope::new(format!("m{i}"))).collect())
        .await
        .unwrap();
    let mut seen = std::collections::HashSet::new();
    while let Some(got) = waiting.join_next().await {
        let got = got.unwrap();
        assert!(!got.is_empty() && got.len() <= 3);
        for d in got {
            assert!(seen.insert(d.message().sequence_number()), "delivered twice");
        }
    }
    let rest = receiver.receive(100, Duration::ZERO).await.unwrap();
    assert_eq!(seen.len() + rest.len(), 24);
}

/// A receive whose future is dropped while it waits gives back what the engine locked for
/// it, with the delivery count restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_receive_gives_its_messages_back() {
    let (broker, _clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    for _ in 0..20 {
        // Start a waiting receive, let it park, drop it, and send: whatever the engine
        // locked for the dropped receive must come back unlocked.
        let r = receiver.clone();
        let waiting = tokio::spawn(async move { r.receive(1, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        waiting.abort();
        sender.send(Envelope::new("x")).await.unwrap();
        // The clock stands still: a message left locked would never come back.
        let got = receiver.receive(1, Duration::from_secs(5)).await.unwrap();
        assert_eq!(got.len(), 1, "the message came back");
        assert_eq!(
            got[0].message().delivery_count(),
            1,
            "a lost receive must not count as a delivery"
        );
        got.into_iter().next().unwrap().complete().await.unwrap();
    }
}

/// A receive dropped after the engine answered it (its messages sent to it, never read)
/// gives them back at once, its delivery not counted. Regression: they stayed locked until
/// the lock expired, which a virtual clock standing still never reaches (a test hung).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_dropped_after_its_answer_gives_the_messages_back() {
    let (broker, _clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let queue = EntityPath::queue("q");
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = broker.receiver(&queue).await.unwrap();
    for round in 0..5 {
        let mut waiting = receiver.receive(1, Duration::from_secs(30));
        // One poll: the receive is with the engine.
        tokio::select! {
            biased;
            _ = &mut waiting => panic!("round {round}: nothing was there to receive"),
            () = std::future::ready(()) => {}
        }
        sender.send(Envelope::new(format!("m{round}"))).await.unwrap();
        // A later command is answered after the engine sent the receive its message.
        assert_eq!(broker.counts(&queue).await.unwrap().active, 1);
        drop(waiting);
        let got = receiver.receive(1, Duration::from_secs(2)).await.unwrap();
        assert_eq!(got.len(), 1, "round {round}: the message came back at once");
        assert_eq!(
            got[0].message().delivery_count(),
            1,
            "the dropped receive did not count"
        );
        got.into_iter().next().unwrap().complete().await.unwrap();
    }
}

/// A lock token of another queue is unknown here, even though the broker issued it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_of_another_queue_is_unknown() {
    let (broker, _clock) = broker().await;
    for q in ["a", "b"] {
        broker.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let sender = broker.sender("a", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("x")).await.unwrap();
    let a = broker.receiver(&EntityPath::queue("a")).await.unwrap();
    let b = broker.receiver(&EntityPath::queue("b")).await.unwrap();
    let d = a.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    let token: LockToken = d.lock_token().unwrap();
    let err = b.settle_by_token(token, Settlement::Complete).await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::UnknownLockToken { .. }), "{err}");
    a.settle_by_token(token, Settlement::Complete).await.unwrap();
    assert!(a.receive(1, Duration::ZERO).await.unwrap().is_empty());
}

/// Messages over the configured size are refused and handed back; the broker keeps
/// serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_size_limit_is_enforced() {
    let broker = Embedded::builder()
        .in_memory()
        .max_message_size(2048)
        .open()
        .await
        .unwrap();
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let err = sender.send(Envelope::new(vec![0u8; 4096])).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::MessageTooLarge { limit: 2048, .. }),
        "{err}"
    );
    assert_eq!(err.messages.len(), 1);
    assert_eq!(err.messages[0].body.len(), 4096);
    sender.send(Envelope::new(vec![0u8; 1024])).await.unwrap();
    assert_eq!(broker.counts(&EntityPath::queue("q")).await.unwrap().active, 1);
}

/// Locks expire on the virtual clock without any call: a receiver waiting on an empty
/// queue gets the message whose lock expired, as soon as the clock passes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_receiver_gets_message_when_lock_expires() {
    let (broker, clock) = broker().await;
    broker
        .create_queue("q", &QueueOptions::default().lock_duration(Duration::from_secs(30)))
        .await
        .unwrap();
    broker
        .sender("q", SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("x"))
        .await
        .unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let first = receiver.receive(1, Duration::ZERO).await.unwrap();
    assert_eq!(first.len(), 1);
    let r = receiver.clone();
    let waiting = tokio::spawn(async move { r.receive(1, Duration::from_secs(30)).await.unwrap() });
    tokio::task::yield_now().await;
    clock.advance(Duration::from_secs(31));
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().delivery_count(), 2);
}

/// Regression: a receiver waiting on a dead-letter sub-queue is served when a message is
/// dead-lettered (by a receiver, by expiry) and when a dead-lettered message's lock expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_receivers_are_woken() {
    let (broker, clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let main = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let dlq = broker.receiver(&EntityPath::queue("q").dead_letter()).await.unwrap();

    let r = dlq.clone();
    let waiting = tokio::spawn(async move { r.receive(1, Duration::from_secs(30)).await.unwrap() });
    sender.send(Envelope::new("bad")).await.unwrap();
    let d = main.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    d.dead_letter("test", "wake the waiter").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.len(), 1, "dead-lettering serves a waiting dead-letter receiver");

    let r = dlq.clone();
    let waiting = tokio::spawn(async move { r.receive(1, Duration::from_secs(30)).await.unwrap() });
    tokio::task::yield_now().await;
    clock.advance(Duration::from_secs(61));
    let again = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again.len(), 1, "an expired dead-letter lock serves a waiting receiver");
    assert_eq!(
        again[0].message().delivery_count(),
        3,
        "one main lock, two dead-letter locks"
    );

    let r = dlq.clone();
    let waiting = tokio::spawn(async move { r.receive(5, Duration::from_secs(30)).await.unwrap() });
    sender
        .send(Envelope::new("short").with_time_to_live(Duration::from_secs(5)))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(6));
    let expired = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    assert!(
        expired.iter().any(|d| d.message().body().as_ref() == b"short"),
        "an expired message serves a waiting dead-letter receiver"
    );
}

/// A message scheduled on a topic is fanned out when it activates, with the topic's next
/// sequence number (S5.4), to the subscriptions that exist then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_topic_message_fans_out_on_activation() {
    let (broker, clock) = broker().await;
    broker.create_topic("t", &TopicOptions::default()).await.unwrap();
    broker
        .create_subscription("t", "early", &QueueOptions::default())
        .await
        .unwrap();
    let sender = broker.sender("t", SenderOptions::default()).await.unwrap();
    let seq = sender
        .schedule(Envelope::new("tick"), clock.now() + chrono::Duration::minutes(5))
        .await
        .unwrap();
    broker
        .create_subscription("t", "late", &QueueOptions::default())
        .await
        .unwrap();
    let early = broker.receiver(&EntityPath::subscription("t", "early")).await.unwrap();
    assert!(early.receive(1, Duration::ZERO).await.unwrap().is_empty());
    clock.advance(Duration::from_secs(300));
    for sub in ["early", "late"] {
        let r = broker.receiver(&EntityPath::subscription("t", sub)).await.unwrap();
        let d = r.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
        assert_eq!(d.message().body().as_ref(), b"tick");
        assert_eq!(d.message().sequence_number(), seq + 1, "{sub}");
    }
}

/// A copy for a session subscription without a session id is dead-lettered with a reason,
/// never stuck where no session receiver can reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_without_session_id_for_a_session_subscription_is_dead_lettered() {
    let (broker, _clock) = broker().await;
    broker.create_topic("t", &TopicOptions::default()).await.unwrap();
    broker
        .create_subscription("t", "ordered", &QueueOptions::default().requires_session(true))
        .await
        .unwrap();
    let sender = broker.sender("t", SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("no session")).await.unwrap();
    let dead = broker
        .peek(&EntityPath::subscription("t", "ordered").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some("SessionIdMissing"));
    assert_eq!(
        broker
            .counts(&EntityPath::subscription("t", "ordered"))
            .await
            .unwrap()
            .dead_lettered,
        1
    );
}

/// Deferred messages: receive-deferred is all or nothing, abandoning keeps the message
/// deferred, and a dead-lettered message cannot be dead-lettered again or deferred.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_and_dead_lettered_settlements() {
    let (broker, _clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    sender
        .send_batch(vec![Envelope::new("a"), Envelope::new("b")])
        .await
        .unwrap();
    let r = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let got = r.receive(2, Duration::from_secs(5)).await.unwrap();
    let mut seqs = Vec::new();
    for d in got {
        seqs.push(d.defer().await.unwrap());
    }
    let err = r.receive_deferred(&[seqs[0], 9999]).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::MessageNotFound {
                sequence_number: 9999,
                ..
            }
        ),
        "{err}"
    );
    let both = r.receive_deferred(&seqs).await.unwrap();
    assert_eq!(both.len(), 2, "nothing was locked by the failed call");
    let mut both = both.into_iter();
    both.next().unwrap().abandon().await.unwrap();
    let counts = broker.counts(&EntityPath::queue("q")).await.unwrap();
    assert_eq!(
        (counts.active, counts.deferred),
        (0, 2),
        "an abandoned deferred message stays deferred"
    );
    assert!(r.receive(1, Duration::ZERO).await.unwrap().is_empty());

    both.next()
        .unwrap()
        .dead_letter("test", "to the dead-letter queue")
        .await
        .unwrap();
    let dlq = broker.receiver(&EntityPath::queue("q").dead_letter()).await.unwrap();
    let d = dlq.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    let err = d.dead_letter("again", "no").await.unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::InvalidOperation { .. }), "{err}");
    let d = dlq.receive(1, Duration::ZERO).await.unwrap();
    assert!(d.is_empty(), "the refused settlement left the lock in place");
}

/// Regression: completes arriving together are grouped into one statement; a stale lock
/// (the message was locked again after it expired) completed in the same group as the
/// current lock must still get LockLost, not share the current lock's success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_lock_completed_together_with_the_current_one_is_refused() {
    let (broker, clock) = broker().await;
    broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = broker.receiver(&EntityPath::queue("q")).await.unwrap();
    for round in 0..10 {
        sender.send(Envelope::new(format!("m{round}"))).await.unwrap();
        let stale = receiver
            .receive(1, Duration::from_secs(5))
            .await
            .unwrap()
            .pop()
            .unwrap();
        clock.advance(Duration::from_secs(61));
        let fresh = receiver
            .receive(1, Duration::from_secs(5))
            .await
            .unwrap()
            .pop()
            .unwrap();
        assert_eq!(fresh.message().delivery_count(), 2);
        let (stale, fresh) = tokio::join!(stale.complete(), fresh.complete());
        assert!(
            stale.unwrap_err().is_lock_lost(),
            "round {round}: the stale lock completed"
        );
        fresh.unwrap();
    }
}
