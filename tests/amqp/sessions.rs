//! Session queues on RabbitMQ across processes (docs/rabbitmq.md, "Sessions"): two
//! transports, each with a connection of its own, stand for two processes. What the bent
//! rule `S4.1 across processes` promises instead is checked here: a session's messages
//! go to the one process RabbitMQ made the active consumer of the session's partition, and
//! to another when that one goes away, in order; and within a process, an abandoned
//! message of a session comes back before the session's later ones.

use std::sync::Arc;
use std::time::Duration;

use courier::{
    AmqpTransport, Delivery, EntityPath, Envelope, QueueOptions, Receiver, SenderOptions, SessionSelector, Transport,
};
use courier_tests::rabbit::amqp_url;

use crate::support::unique;

fn body(d: &Delivery) -> String {
    String::from_utf8_lossy(d.message().body()).into_owned()
}

/// Receives until `n` messages came, or fails after 15 s.
async fn receive_n(r: &dyn Receiver, n: usize) -> Vec<Delivery> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {n} messages, got {} within 15 s",
            out.len()
        );
        out.extend(r.receive(n - out.len(), Duration::from_millis(500)).await.unwrap());
    }
    out
}

fn sessions() -> QueueOptions {
    QueueOptions::default().requires_session(true)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_handled_by_the_process_of_its_partition_and_handed_over_when_it_goes() {
    let url = amqp_url().await;
    let a = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap());
    let b = Arc::new(AmqpTransport::connect(url).await.unwrap());
    let q = unique("sq");
    a.create_queue(&q, &sessions()).await.unwrap();
    let path = EntityPath::queue(&q);
    // `b` did not declare the queue: it finds it by its partitions.
    let sender = b.sender(&q, SenderOptions::default()).await.unwrap();
    let e = sender.send(Envelope::new("no session")).await.unwrap_err();
    assert!(e.to_string().contains("requires sessions"), "{e}");
    sender.send(Envelope::new("x1").with_session_id("x")).await.unwrap();

    let in_a = a
        .accept_session(&path, SessionSelector::Named("x".into()), Duration::ZERO)
        .await
        .unwrap();
    let first = receive_n(in_a.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&first), "x1");
    // `a` is the active consumer of the partition of `x` now; `b`'s waits.
    sender
        .send_batch(vec![
            Envelope::new("x2").with_session_id("x"),
            Envelope::new("x3").with_session_id("x"),
        ])
        .await
        .unwrap();
    let in_b = b
        .accept_session(&path, SessionSelector::Named("x".into()), Duration::ZERO)
        .await
        .unwrap();
    let nothing = in_b.receive(10, Duration::from_millis(700)).await.unwrap();
    assert!(
        nothing.is_empty(),
        "only the process consuming the partition gets the session's messages"
    );
    first.complete().await.unwrap();
    let second = receive_n(in_a.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&second), "x2");

    // `a` goes away with x2 unsettled: RabbitMQ hands the partition to `b`, in order.
    a.close().await;
    let got = receive_n(in_b.as_ref(), 2).await;
    assert_eq!(got.iter().map(body).collect::<Vec<_>>(), ["x2", "x3"]);
    for d in got {
        d.complete().await.unwrap();
    }
    drop(second);
    assert_eq!(b.counts(&path).await.unwrap().active, 0);
    b.delete(&path).await.unwrap();
    assert!(
        b.sender(&q, SenderOptions::default()).await.is_err(),
        "deleted with its partitions"
    );
    b.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_message_comes_back_before_the_later_ones_of_its_session() {
    let t = AmqpTransport::connect(amqp_url().await).await.unwrap();
    let q = unique("sq");
    t.create_queue(&q, &sessions()).await.unwrap();
    let path = EntityPath::queue(&q);
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    sender
        .send_batch(
            ["a1", "a2", "a3"]
                .map(|b| Envelope::new(b).with_session_id("a"))
                .to_vec(),
        )
        .await
        .unwrap();
    let s = t
        .accept_session(&path, SessionSelector::Next, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(s.session_id(), "a");
    let mut got = receive_n(s.as_ref(), 2).await.into_iter();
    let (a1, a2) = (got.next().unwrap(), got.next().unwrap());
    assert_eq!((body(&a1), body(&a2)), ("a1".into(), "a2".into()));
    a1.abandon().await.unwrap();
    a2.complete().await.unwrap();
    let again = receive_n(s.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&again), "a1");
    assert_eq!(again.message().broker.delivery_count, 2);
    again.complete().await.unwrap();
    let last = receive_n(s.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&last), "a3");
    last.complete().await.unwrap();
    // A session released with a message unsettled gives it back to the next holder.
    sender.send(Envelope::new("a4").with_session_id("a")).await.unwrap();
    let a4 = receive_n(s.as_ref(), 1).await.pop().unwrap();
    s.release().await.unwrap();
    let e = a4.complete().await.unwrap_err();
    assert!(e.is_lock_lost(), "{e}");
    let next = t
        .accept_session(&path, SessionSelector::Named("a".into()), Duration::ZERO)
        .await
        .unwrap();
    let back = receive_n(next.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&back), "a4");
    back.complete().await.unwrap();
    t.delete(&path).await.unwrap();
    t.close().await;
}

/// What one stand-in process handled: (session, message number, when, by whom), "when"
/// from one counter shared by both.
type Handled = Arc<std::sync::Mutex<Vec<(String, u32, u64, &'static str)>>>;

/// A session worker of `t`: accepts the next session, completes its messages, releases
/// it; until `stop`.
async fn work(
    t: Arc<AmqpTransport>,
    path: EntityPath,
    who: &'static str,
    handled: Handled,
    clock: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let Ok(s) = t
            .accept_session(&path, SessionSelector::Next, Duration::from_millis(300))
            .await
        else {
            continue;
        };
        loop {
            let got = s.receive(8, Duration::from_millis(100)).await.unwrap_or_default();
            if got.is_empty() {
                break;
            }
            for d in got {
                let text = body(&d);
                let (session, n) = text.split_once('/').unwrap();
                let n: u32 = n.parse().unwrap();
                if d.complete().await.is_ok() {
                    let at = clock.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    handled.lock().unwrap().push((session.to_owned(), n, at, who));
                }
            }
        }
        let _ = s.release().await;
    }
}

/// Issue 35, scale-out: a process started after another, while the first is the active
/// consumer of every partition, gets partitions of its own (the first hands over the
/// excess of its fair share), and no session's order breaks in the hand-over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_gets_a_share_of_the_partitions_and_every_session_keeps_its_order() {
    let url = amqp_url().await;
    let a = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap());
    let b = Arc::new(AmqpTransport::connect(url).await.unwrap());
    let q = unique("sq-share");
    a.create_queue(&q, &sessions()).await.unwrap();
    let path = EntityPath::queue(&q);
    let sender = a.sender(&q, SenderOptions::default()).await.unwrap();
    let (sessions_n, rounds) = (64u32, 20u32);
    let send_round = |round: u32| {
        let batch: Vec<Envelope> = (0..sessions_n)
            .map(|s| Envelope::new(format!("s{s}/{round}")).with_session_id(format!("s{s}")))
            .collect();
        let sender = sender.clone();
        async move { sender.send_batch(batch).await.unwrap() }
    };
    send_round(0).await;
    let handled: Handled = Arc::default();
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..4 {
        workers.spawn(work(
            a.clone(),
            path.clone(),
            "a",
            handled.clone(),
            clock.clone(),
            stop.clone(),
        ));
    }
    // `a` is the active consumer of every partition (it received from all) before `b` starts.
    let every_session = || async {
        let h = handled.lock().unwrap();
        h.iter()
            .map(|(s, ..)| s.clone())
            .collect::<std::collections::HashSet<_>>()
            .len()
            == sessions_n as usize
    };
    courier_tests::eventually("a handles a message of every session", every_session).await;
    for _ in 0..4 {
        workers.spawn(work(
            b.clone(),
            path.clone(),
            "b",
            handled.clone(),
            clock.clone(),
            stop.clone(),
        ));
    }
    for round in 1..rounds {
        send_round(round).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let total = (sessions_n * rounds) as usize;
    courier_tests::eventually("every message handled", || async {
        handled.lock().unwrap().len() >= total
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    while workers.join_next().await.is_some() {}

    let h = handled.lock().unwrap().clone();
    assert_eq!(h.len(), total, "each message completed once");
    let mut by_session: std::collections::HashMap<String, Vec<(u64, u32)>> = std::collections::HashMap::new();
    for (s, n, at, _) in &h {
        by_session.entry(s.clone()).or_default().push((*at, *n));
    }
    for (s, mut seen) in by_session {
        seen.sort_unstable();
        let order: Vec<u32> = seen.iter().map(|(_, n)| *n).collect();
        assert_eq!(order, (0..rounds).collect::<Vec<_>>(), "session {s} in send order");
    }
    let partitions_of = |who: &str| {
        h.iter()
            .filter(|(.., w)| *w == who)
            .map(|(s, ..)| crate::session_ids::partition_of(s.as_bytes()))
            .collect::<std::collections::HashSet<_>>()
    };
    let (pa, pb) = (partitions_of("a"), partitions_of("b"));
    assert!(
        pb.len() >= 4,
        "the second process took partitions of its own: a {pa:?}, b {pb:?}"
    );
    a.delete(&path).await.unwrap();
    a.close().await;
    b.close().await;
}

/// A process whose session workers stopped while its transport stays open (an endpoint
/// shut down, its transport shared) lets its partitions go once its hub has been idle a
/// while: the messages RabbitMQ delivered to it and those sent later go to the other
/// process. Before, its hub kept them for as long as the transport lived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_stops_accepting_sessions_lets_its_partitions_go() {
    let url = amqp_url().await;
    let a = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap());
    let b = Arc::new(AmqpTransport::connect(url).await.unwrap());
    let q = unique("sq-idle");
    a.create_queue(&q, &sessions()).await.unwrap();
    let path = EntityPath::queue(&q);
    let sender = a.sender(&q, SenderOptions::default()).await.unwrap();
    let batch = |round: u32| -> Vec<Envelope> {
        (0..32)
            .map(|s| Envelope::new(format!("s{s}/{round}")).with_session_id(format!("s{s}")))
            .collect()
    };
    sender.send_batch(batch(0)).await.unwrap();
    let handled: Handled = Arc::default();
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (stop_a, stop_b) = (
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
        Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    let mut a_workers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        a_workers.spawn(work(
            a.clone(),
            path.clone(),
            "a",
            handled.clone(),
            clock.clone(),
            stop_a.clone(),
        ));
    }
    courier_tests::eventually("a handles the first round", || async {
        handled.lock().unwrap().len() == 32
    })
    .await;
    stop_a.store(true, std::sync::atomic::Ordering::SeqCst);
    while a_workers.join_next().await.is_some() {}
    // `a`'s hub holds every partition (and what RabbitMQ delivers it meanwhile).
    sender.send_batch(batch(1)).await.unwrap();
    let mut b_workers = tokio::task::JoinSet::new();
    for _ in 0..2 {
        b_workers.spawn(work(
            b.clone(),
            path.clone(),
            "b",
            handled.clone(),
            clock.clone(),
            stop_b.clone(),
        ));
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while handled.lock().unwrap().len() < 64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "b got {} of the 32 later messages within 60 s",
            handled.lock().unwrap().len() - 32
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_b.store(true, std::sync::atomic::Ordering::SeqCst);
    while b_workers.join_next().await.is_some() {}
    let h = handled.lock().unwrap().clone();
    assert!(h[32..].iter().all(|(.., who)| *who == "b"), "the later round went to b");
    assert_eq!(h.len(), 64, "each once");
    a.delete(&path).await.unwrap();
    a.close().await;
    b.close().await;
}

/// What a process held of a partition without handing it out does not count as a
/// delivery: RabbitMQ counts every return of it (a process that dies, loses its
/// connection, or hands the partition on), and before the hub counted its own hand-outs a
/// message behind a few such faults reached the max delivery count (here 2, RabbitMQ's
/// limit 1) and was dead-lettered without a handler ever seeing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_held_through_returns_it_was_never_handed_out_for_keeps_its_deliveries() {
    let url = amqp_url().await;
    let q = unique("sq-held");
    let options = sessions().max_delivery_count(2);
    let path = EntityPath::queue(&q);
    // `y` shares the partition of `x`: a process that takes a message of `x` holds every
    // message of `y` sent before it.
    let x = "x".to_owned();
    let y = (0..)
        .map(|i| format!("y{i}"))
        .find(|y| crate::session_ids::partition_of(y.as_bytes()) == crate::session_ids::partition_of(x.as_bytes()))
        .unwrap();
    let owner = AmqpTransport::connect(url.clone()).await.unwrap();
    owner.create_queue(&q, &options).await.unwrap();
    let sender = owner.sender(&q, SenderOptions::default()).await.unwrap();
    sender
        .send(Envelope::new("y1").with_session_id(y.clone()))
        .await
        .unwrap();
    for round in 0..3 {
        let process = AmqpTransport::connect(url.clone()).await.unwrap();
        process.create_queue(&q, &options).await.unwrap();
        sender
            .send(Envelope::new(format!("x{round}")).with_session_id(x.clone()))
            .await
            .unwrap();
        let session = process
            .accept_session(&path, SessionSelector::Named(x.clone()), Duration::from_secs(10))
            .await
            .unwrap();
        let got = receive_n(session.as_ref(), 1).await.pop().unwrap();
        assert_eq!(body(&got), format!("x{round}"));
        got.complete().await.unwrap();
        // The process goes with `y1` held, never handed out.
        process.close().await;
    }
    let last = AmqpTransport::connect(url).await.unwrap();
    let session = last
        .accept_session(&path, SessionSelector::Named(y.clone()), Duration::from_secs(10))
        .await
        .unwrap();
    let got = receive_n(session.as_ref(), 1).await.pop().unwrap();
    assert_eq!(body(&got), "y1");
    assert_eq!(
        got.message().broker.delivery_count,
        1,
        "held three times, handed out once"
    );
    got.complete().await.unwrap();
    session.release().await.unwrap();
    let dlq = last.receiver(&path.clone().dead_letter()).await.unwrap();
    assert!(dlq.receive(10, Duration::from_millis(500)).await.unwrap().is_empty());
    last.delete(&path).await.unwrap();
    last.close().await;
    owner.close().await;
}
