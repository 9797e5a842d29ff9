//! What is particular to the Postgres transport: lock tokens that fence across processes,
//! several transports (processes) competing on one queue, receivers woken by another
//! process's send, and a receiver that recovers after its connections were killed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use courier::{
    Clock, EntityPath, Envelope, ErrorKind, PostgresTransport, QueueOptions, SenderOptions, Settlement, Transport,
    VirtualClock,
};
use courier_tests::pg_transport::{database, transport};
use uuid::Uuid;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", Uuid::new_v4().simple())
}

/// A transport of its own (its own pool and LISTEN connection, as another process has)
/// on the process's database, with `application_name` set so its connections can be
/// found in `pg_stat_activity`, polling every `poll`.
async fn process(clock: &VirtualClock, application_name: &str, poll: Duration) -> PostgresTransport {
    let options = database().await.application_name(application_name);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    PostgresTransport::from_pool(pool)
        .clock(shared)
        .migrate(false)
        .poll_interval(poll)
        .open()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_an_older_lock_of_the_same_message_is_lock_lost() {
    let clock = VirtualClock::starting_now();
    let paused = transport(&clock).await;
    let other = process(&clock, &unique("other"), Duration::from_secs(1)).await;
    let q = unique("q");
    paused.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = paused.sender(&q, SenderOptions::default()).await.unwrap();
    sender.send(Envelope::new("x")).await.unwrap();

    // A process takes the message, then pauses past its lock; another takes it again.
    let first = paused.receiver(&EntityPath::queue(&q)).await.unwrap();
    let stale = first.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    let stale_token = stale.lock_token().unwrap();
    clock.advance(Duration::from_secs(61));
    let second = other.receiver(&EntityPath::queue(&q)).await.unwrap();
    let fresh = second.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    assert_eq!(fresh.message().delivery_count(), 2);

    // The paused process wakes up: its settlements and renewals fail, whatever they are.
    let e = first
        .settle_by_token(stale_token, Settlement::Complete)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::LockLost), "{e}");
    let e = stale.complete().await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::LockLost), "{e}");
    assert_eq!(
        other.counts(&EntityPath::queue(&q)).await.unwrap().active,
        1,
        "the stale lock completed nothing"
    );
    fresh.complete().await.unwrap();
    assert_eq!(other.counts(&EntityPath::queue(&q)).await.unwrap().active, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_of_another_queue_or_database_is_unknown() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let (a, b) = (unique("a"), unique("b"));
    for q in [&a, &b] {
        t.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    t.sender(&a, SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("x"))
        .await
        .unwrap();
    let ra = t.receiver(&EntityPath::queue(&a)).await.unwrap();
    let d = ra.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    let token = d.lock_token().unwrap();
    let rb = t.receiver(&EntityPath::queue(&b)).await.unwrap();
    let e = rb.settle_by_token(token, Settlement::Complete).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::UnknownLockToken { .. }), "{e}");
    let e = ra
        .settle_by_token(courier::LockToken::from_uuid(Uuid::new_v4()), Settlement::Complete)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::UnknownLockToken { .. }), "{e}");
    ra.settle_by_token(token, Settlement::Complete).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_compete_and_each_message_is_received_once() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    let one = process(&clock, &unique("one"), Duration::from_millis(200)).await;
    let two = process(&clock, &unique("two"), Duration::from_millis(200)).await;
    one.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = one.sender(&q, SenderOptions::default()).await.unwrap();
    for chunk in 0..10 {
        sender
            .send_batch((0..50).map(|i| Envelope::new(format!("{chunk}-{i}"))).collect())
            .await
            .unwrap();
    }
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for t in [&one, &two] {
        for _ in 0..3 {
            let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
            let seen = seen.clone();
            tasks.spawn(async move {
                loop {
                    let got = r.receive(7, Duration::from_millis(500)).await.unwrap();
                    if got.is_empty() {
                        return;
                    }
                    for d in got {
                        seen.lock().unwrap().push(d.message().message_id().to_owned());
                        d.complete().await.unwrap();
                    }
                }
            });
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let unique_ids: HashSet<&String> = seen.iter().collect();
    assert_eq!(seen.len(), 500, "every message received once");
    assert_eq!(unique_ids.len(), 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_receiver_is_woken_by_another_process_send() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    // Polling once an hour: only the notification can end the wait with a message.
    let waiting = process(&clock, &unique("waiting"), Duration::from_secs(3600)).await;
    let sending = process(&clock, &unique("sending"), Duration::from_secs(3600)).await;
    waiting.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let r = waiting.receiver(&EntityPath::queue(&q)).await.unwrap();
    let receive = tokio::spawn(async move { r.receive(1, Duration::from_secs(60)).await });
    let sender = sending.sender(&q, SenderOptions::default()).await.unwrap();
    // Nothing outside tells when the receive has made its first (empty) attempt and
    // waits: a pause makes that the usual order. Should the send come first, the attempt
    // finds the message; either way the message must come within the wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    sender.send(Envelope::new("wake up")).await.unwrap();
    let got = receive.await.unwrap().unwrap();
    assert_eq!(got.len(), 1, "woken by the notification, not by the end of the wait");
    assert_eq!(got[0].message().body().as_ref(), b"wake up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_recovers_after_its_connections_are_killed() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    let name = unique("killed");
    let t = process(&clock, &name, Duration::from_millis(200)).await;
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    assert!(r.receive(1, Duration::ZERO).await.unwrap().is_empty());

    let admin = process(&clock, &unique("admin"), Duration::from_secs(1)).await;
    let killed: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&name)
            .fetch_all(admin.pool())
            .await
            .unwrap();
    assert!(!killed.is_empty(), "the transport's connections were found");

    admin
        .sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("after the kill"))
        .await
        .unwrap();
    // A call on a killed pooled connection may fail once (transient); the next works.
    let mut got = Vec::new();
    for _ in 0..20 {
        match r.receive(1, Duration::from_secs(2)).await {
            Ok(d) if !d.is_empty() => {
                got = d;
                break;
            }
            Ok(_) => {}
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
    }
    assert_eq!(
        got.len(),
        1,
        "the message is received after the connections were killed"
    );
    got.pop().unwrap().complete().await.unwrap();
}

/// The connection a transport LISTENs on is killed (with every other of its
/// connections) while nothing polls (one poll an hour): the transport listens again on a
/// new connection, so a message another process sends afterwards still ends a waiting
/// receive long before its poll would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_is_woken_again_after_its_listen_connection_is_killed() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    let name = unique("listening");
    let t = process(&clock, &name, Duration::from_secs(3600)).await;
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    assert!(r.receive(1, Duration::ZERO).await.unwrap().is_empty());

    let admin = process(&clock, &unique("admin"), Duration::from_secs(3600)).await;
    let listening = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'";
    let killed: Vec<bool> =
        sqlx::query_scalar("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1")
            .bind(&name)
            .fetch_all(admin.pool())
            .await
            .unwrap();
    assert!(killed.iter().any(|k| *k), "the transport's connections were found");
    courier_tests::eventually("a new LISTEN connection", || async {
        sqlx::query_scalar::<_, i64>(listening)
            .bind(&name)
            .fetch_one(admin.pool())
            .await
            .unwrap()
            == 1
    })
    .await;

    let waiting = {
        let r = r.clone();
        tokio::spawn(async move {
            // A call on a killed pooled connection may fail once (transient).
            loop {
                match r.receive(1, Duration::from_secs(60)).await {
                    Ok(d) => return d,
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    admin
        .sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("after the kill"))
        .await
        .unwrap();
    let got = waiting.await.unwrap();
    assert_eq!(got.len(), 1, "woken by the notification, not by the end of the wait");
    got.into_iter().next().unwrap().complete().await.unwrap();
}

/// Locks are volatile (S2.7): the locks of a transport that went away (its process died,
/// here it closed) end at once, not after their lock duration; the clock does not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_of_a_transport_that_went_away_are_released_at_once() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    let gone = process(&clock, &unique("gone"), Duration::from_millis(200)).await;
    let alive = process(&clock, &unique("alive"), Duration::from_millis(200)).await;
    gone.create_queue(&q, &QueueOptions::default()).await.unwrap();
    gone.sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send_batch(vec![Envelope::new("held"), Envelope::new("other")])
        .await
        .unwrap();
    let r = gone.receiver(&EntityPath::queue(&q)).await.unwrap();
    let held = r.receive(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(held.len(), 1);
    let other = alive.receiver(&EntityPath::queue(&q)).await.unwrap();
    let kept = other.receive(1, Duration::from_secs(5)).await.unwrap().pop().unwrap();
    assert_eq!(kept.message().body().as_ref(), b"other", "a live holder's lock is kept");

    gone.close().await;
    let again = other.receive(1, Duration::from_secs(20)).await.unwrap();
    assert_eq!(again.len(), 1, "released once its holder went away, not after 60 s");
    assert_eq!(again[0].message().body().as_ref(), b"held");
    assert_eq!(again[0].message().delivery_count(), 2);
    // The live holder's lock is still good.
    kept.complete().await.unwrap();
}

/// A transport whose lock holder's connection was ended (`pg_terminate_backend`, a
/// restart of Postgres) hands out no message until its keeper holds the lock again: a
/// lock stamped with a holder that is gone would be released by the next receive at once,
/// and a busy receiver would take the message again and again until its delivery count
/// ran out and it was dead-lettered without ever failing (found by courier-chaos).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_whose_lock_holder_dropped_does_not_use_up_delivery_counts() {
    let clock = VirtualClock::starting_now();
    let q = unique("q");
    let name = unique("holder-dropped");
    // The keeper looks at its connection every 3 s.
    let t = process(&clock, &name, Duration::from_secs(3)).await;
    t.create_queue(&q, &QueueOptions::default().max_delivery_count(5))
        .await
        .unwrap();
    t.sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(Envelope::new("x"))
        .await
        .unwrap();
    let admin = process(&clock, &unique("admin"), Duration::from_secs(1)).await;
    let ended: Vec<(i32, bool)> = sqlx::query_as(
        "SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
         WHERE a.application_name = $1 AND l.locktype = 'advisory'",
    )
    .bind(&name)
    .fetch_all(admin.pool())
    .await
    .unwrap();
    assert_eq!(ended.len(), 1, "one lock holder");
    assert!(ended[0].1, "the holder's connection was ended");
    // pg_terminate_backend only signals the backend: until it has exited, its advisory
    // lock still shows, and a receive would lock the message for a holder about to go
    // (whose lock the next count ends: a flake seen under load). Wait for the exit.
    let pid = ended[0].0;
    courier_tests::eventually("the holder's backend gone", || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(admin.pool())
            .await
            .unwrap()
            == 0
    })
    .await;

    // A busy receiver (an endpoint's, handling what it took) receives again and again.
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let mut taken = Vec::new();
    for _ in 0..8 {
        taken.extend(r.receive(1, Duration::ZERO).await.unwrap());
    }
    assert!(
        taken.len() <= 1,
        "handed out {} times while its holder was gone",
        taken.len()
    );
    assert_eq!(
        admin.counts(&EntityPath::queue(&q)).await.unwrap().dead_lettered,
        0,
        "dead-lettered without ever failing"
    );

    // Once the keeper holds the lock again, the message is handled as usual.
    if taken.is_empty() {
        taken = r.receive(1, Duration::from_secs(20)).await.unwrap();
    }
    let delivery = taken.pop().expect("received once the holder is back");
    assert_eq!(delivery.message().delivery_count(), 1);
    delivery.complete().await.unwrap();
}

/// A receiver whose claims are filled runs the maintenance (here: the activation of due
/// scheduled messages) at most every 250 ms of the transport's clock, and a claim that
/// comes back short after a skip runs it and claims again (docs/postgres-reference.md, "How
/// it works"). An activated message is numbered at its activation, so the order it comes in
/// shows when that was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_receiver_runs_the_maintenance_less_often_and_never_returns_less_for_it() {
    let clock = VirtualClock::starting_now();
    let t = transport(&clock).await;
    let q = unique("q");
    t.create_queue(&q, &QueueOptions::default()).await.unwrap();
    let sender = t.sender(&q, SenderOptions::default()).await.unwrap();
    for i in 0..4 {
        sender.send(Envelope::new(format!("m{i}"))).await.unwrap();
    }
    let r = t.receiver(&EntityPath::queue(&q)).await.unwrap();
    let ms = chrono::Duration::milliseconds;
    // Receives up to `n` at once, completes them and says what they were.
    let take = async |n: usize| -> Vec<String> {
        let mut bodies = Vec::new();
        for d in r.receive(n, Duration::ZERO).await.unwrap() {
            bodies.push(String::from_utf8(d.message().envelope.body.to_vec()).unwrap());
            d.complete().await.unwrap();
        }
        bodies
    };

    // The first receive runs the maintenance, and its claim is filled.
    assert_eq!(take(2).await, ["m0", "m1"]);
    // `d1` is due 1 ms later, but the next filled claims, within 250 ms, skip its
    // activation: `m4`, sent after it, comes first.
    sender.schedule(Envelope::new("d1"), clock.now() + ms(1)).await.unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(take(1).await, ["m2"]);
    sender.send(Envelope::new("m4")).await.unwrap();
    assert_eq!(take(1).await, ["m3"]);
    // 250 ms after the last, the maintenance runs before the claim.
    clock.advance(Duration::from_millis(249));
    assert_eq!(take(1).await, ["m4"]);

    // A claim that comes back short runs it at once: `d2`, due, comes in the same receive.
    sender.schedule(Envelope::new("d2"), clock.now() + ms(1)).await.unwrap();
    clock.advance(Duration::from_millis(1));
    assert_eq!(take(5).await, ["d1", "d2"]);
    assert!(take(1).await.is_empty());
}
