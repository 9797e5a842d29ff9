//! The transport conformance suite: one test per rule of `docs/semantics.md` (S1-S6), written
//! once and run against every transport.
//!
//! A transport crate instantiates it with a factory that returns a fresh [`Fixture`]:
//!
//! ```no_run
//! use std::sync::Arc;
//! use courier::conformance::Fixture;
//!
//! async fn fixture() -> Fixture {
//!     let clock = courier::VirtualClock::starting_now();
//!     let broker = courier::Embedded::builder()
//!         .in_memory()
//!         .clock(Arc::new(clock.clone()))
//!         .open()
//!         .await
//!         .expect("broker");
//!     Fixture::new(Arc::new(broker), clock)
//! }
//!
//! courier::conformance_suite!(fixture);
//! # fn main() {}
//! ```
//!
//! Each test creates its own uniquely named queues and topics, so the suite runs in
//! parallel against a shared broker and against one that earlier runs left behind. A rule
//! that the transport declares bent ([`Capabilities::bends`](crate::Capabilities::bends))
//! is not skipped: the test prints the declaration and checks that the transport refuses
//! the operation with [`ErrorKind::Unsupported`], or, where the declaration says the
//! transport does something else instead, checks that substitute.
//!
//! One file, though over 1,200 lines: it is the executable form of the rule table, one
//! test per rule in the order of `docs/semantics.md` (S1 to S6, then the checks outside
//! the rules), with the shared helpers at the top and `conformance_suite!` listing every
//! test once. Read beside the table it is a single document; split by rule, each part
//! would hold a few tests and the helpers would have to be shared across files.
//!
//! Where a check needs to browse (S6.1) and the transport bends it, the suite reads the
//! messages instead (receive and complete) at a point of the test where that changes
//! nothing that is checked afterwards. Where a test needs locks to be lost (lock expiry,
//! S2.5-S2.7), it calls [`Fixture::lose_locks`]: by default that moves the virtual clock
//! past the 60 s lock; a broker without lock durations gives a hook that drops its
//! connection instead.
//!
//! Why one file of about 1,200 lines: it is a catalogue, one independent test function
//! per rule in the order of `docs/semantics.md`, read beside that page; the rule number
//! that starts each test's name is its map, and no test calls another. A reader looks up
//! one rule, never holds the whole file. Issue 19 split the rooms a newcomer must hold in
//! their head (the engine, the runtime); this one was left whole on purpose. Should it
//! grow, the split is by rule group (S1 sends, S2 PeekLock, ...), one file each.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::{
    Clock, Delivery, EntityPath, Envelope, ErrorKind, LockToken, MessageState, Properties, PropertyValue, QueueOptions,
    ReceivedMessage, Receiver, SenderOptions, SessionSelector, Settlement, TopicOptions, Transport, VirtualClock,
    reasons,
};

/// Makes every lock of a transport's receivers lost (for brokers without lock durations).
pub type LoseLocks = Arc<dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> + Send + Sync>;

/// What a test gets: a transport driven by a virtual clock.
pub struct Fixture {
    /// The transport under test.
    pub transport: Arc<dyn Transport>,
    /// The clock the transport reads.
    pub clock: VirtualClock,
    /// How locks are lost; `None`: the clock moves past the lock duration.
    pub lose_locks: Option<LoseLocks>,
}

impl Fixture {
    /// A fixture whose locks expire with the clock.
    pub fn new(transport: Arc<dyn Transport>, clock: VirtualClock) -> Self {
        Self {
            transport,
            clock,
            lose_locks: None,
        }
    }

    /// Loses every lock held: the messages come back with their delivery count raised.
    pub async fn lose_locks(&self) {
        match &self.lose_locks {
            Some(hook) => hook().await,
            None => self.clock.advance(Duration::from_secs(61)),
        }
    }

    /// What `path` holds: browsed where the transport can (S6.1), else received and
    /// completed (so only where the test checks nothing of them afterwards).
    async fn contents(&self, path: &EntityPath) -> Vec<ReceivedMessage> {
        if self.transport.capabilities().bends("S6.1").is_none() {
            return self.peek_all(path).await;
        }
        let r = self.receiver(path).await;
        let mut out = Vec::new();
        loop {
            let got = r.receive(100, Duration::from_millis(300)).await.unwrap();
            if got.is_empty() {
                return out;
            }
            for d in got {
                out.push(d.message().clone());
                d.complete().await.unwrap();
            }
        }
    }

    /// Scheduled messages of `queue`: browsed, or counted where browsing is bent.
    async fn scheduled_count(&self, queue: &str) -> u64 {
        if self.transport.capabilities().bends("S6.1").is_none() {
            let seen = self.peek_all(&EntityPath::queue(queue)).await;
            return seen
                .iter()
                .filter(|m| m.broker.state == MessageState::Scheduled)
                .count() as u64;
        }
        self.transport
            .counts(&EntityPath::queue(queue))
            .await
            .unwrap()
            .scheduled
    }

    /// A fresh entity name with this prefix.
    pub fn unique(&self, prefix: &str) -> String {
        format!("{prefix}-{}", Uuid::new_v4().simple())
    }

    async fn queue(&self, options: QueueOptions) -> String {
        let name = self.unique("q");
        self.transport.create_queue(&name, &options).await.unwrap();
        name
    }

    async fn receiver(&self, path: &EntityPath) -> Arc<dyn Receiver> {
        self.transport.receiver(path).await.unwrap()
    }

    async fn send(&self, queue: &str, messages: Vec<Envelope>) {
        let sender = self.transport.sender(queue, SenderOptions::default()).await.unwrap();
        sender.send_batch(messages).await.unwrap();
    }

    async fn peek_all(&self, path: &EntityPath) -> Vec<ReceivedMessage> {
        self.transport.peek(path, 0, 5000).await.unwrap()
    }

    /// A fresh topic with these subscriptions.
    async fn topic(&self, subscriptions: &[&str]) -> String {
        let topic = self.unique("t");
        self.transport
            .create_topic(&topic, &TopicOptions::default())
            .await
            .unwrap();
        for s in subscriptions {
            self.transport
                .create_subscription(&topic, s, &QueueOptions::default())
                .await
                .unwrap();
        }
        topic
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Reports a bent rule; `true` when the test should only check the refusal.
    fn bent(&self, rule: &str) -> bool {
        match self.transport.capabilities().bends(rule) {
            Some(b) => {
                eprintln!(
                    "{rule} bent by {}: {}; instead: {}",
                    self.transport.name(),
                    b.reason,
                    b.substitute
                );
                true
            }
            None => false,
        }
    }
}

fn body(m: &ReceivedMessage) -> String {
    String::from_utf8_lossy(m.body()).into_owned()
}

fn msg(text: &str) -> Envelope {
    Envelope::new(text.to_owned())
}

fn assert_unsupported<T: std::fmt::Debug>(r: crate::Result<T>) {
    let e = r.unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Unsupported { .. }),
        "expected Unsupported, got {e}"
    );
}

/// Receives until `n` messages came or 10 s passed.
async fn receive_n(r: &dyn Receiver, n: usize) -> Vec<Delivery> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {n} messages, got {} within 10 s",
            out.len()
        );
        out.extend(r.receive(n - out.len(), Duration::from_millis(500)).await.unwrap());
    }
    out
}

async fn receive_one(r: &dyn Receiver) -> Delivery {
    receive_n(r, 1).await.pop().unwrap()
}

async fn assert_empty(r: &dyn Receiver) {
    let got = r.receive(10, Duration::from_millis(200)).await.unwrap();
    let bodies: Vec<String> = got.iter().map(|d| body(d.message())).collect();
    assert!(got.is_empty(), "expected nothing receivable, got {bodies:?}");
}

// ---------------------------------------------------------------------------------------
// S1 Send settlement

pub async fn s1_1_send_returns_after_the_broker_accepted(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    sender.send(msg("one").with_message_id("m-1")).await.unwrap();
    let seen = fx.contents(&EntityPath::queue(&q)).await;
    assert_eq!(seen.len(), 1, "an acknowledged send is visible at once");
    assert_eq!(seen[0].message_id(), "m-1");
    assert!(seen[0].sequence_number() > 0);
    assert_eq!(seen[0].broker.state, MessageState::Active);
}

pub async fn s1_2_rejected_send_carries_reason_tracking_id_and_the_message(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();

    let big = Envelope::new(vec![b'x'; 2 * 1024 * 1024]);
    let e = sender.send(big).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::MessageTooLarge { .. }), "{e}");
    assert!(!e.is_transient());
    assert!(!e.error.tracking_id().is_nil());
    assert_eq!(e.messages.len(), 1, "the message is handed back");
    assert_eq!(e.messages[0].body.len(), 2 * 1024 * 1024);

    let e = sender
        .send(msg("x").with_message_id("i".repeat(129)))
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidMessage { .. }), "{e}");
    assert!(e.to_string().contains("message id"), "{e}");

    fx.transport.delete(&EntityPath::queue(&q)).await.unwrap();
    let e = sender.send(msg("gone")).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::EntityNotFound { .. }), "{e}");
    assert!(!e.is_transient());
    assert_eq!(e.messages.len(), 1);
    assert_eq!(e.messages[0].body.as_ref(), b"gone");
}

pub async fn s1_3_pipelined_sends_all_arrive_once(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let s = sender.clone();
        tasks.spawn(async move { s.send(msg(&format!("m{i}")).with_message_id(format!("m{i}"))).await });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    let seen = fx.contents(&EntityPath::queue(&q)).await;
    let ids: HashSet<&str> = seen.iter().map(ReceivedMessage::message_id).collect();
    assert_eq!(seen.len(), 200);
    assert_eq!(ids.len(), 200, "each message exactly once");

    let q2 = fx.queue(QueueOptions::default()).await;
    let batch = fx.transport.sender(&q2, SenderOptions::default()).await.unwrap();
    batch
        .send_batch((0..10).map(|i| msg(&format!("b{i}"))).collect())
        .await
        .unwrap();
    let seen = fx.contents(&EntityPath::queue(&q2)).await;
    let bodies: Vec<String> = seen.iter().map(body).collect();
    assert_eq!(bodies, (0..10).map(|i| format!("b{i}")).collect::<Vec<_>>());
    if fx.bent("S3.1") {
        return;
    }
    for w in seen.windows(2) {
        assert_eq!(
            w[1].sequence_number(),
            w[0].sequence_number() + 1,
            "a batch is consecutive"
        );
    }
}

pub async fn s1_4_outstanding_sends_are_bounded(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let e = fx
        .transport
        .sender(&q, SenderOptions::default().max_in_flight(0))
        .await
        .err()
        .expect("a zero bound is refused");
    assert!(matches!(e.kind(), ErrorKind::InvalidOptions { .. }), "{e}");

    let sender = fx
        .transport
        .sender(&q, SenderOptions::default().max_in_flight(4))
        .await
        .unwrap();
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (sender, most, done) = (sender.clone(), most.clone(), done.clone());
        tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < 100 {
                most.fetch_max(sender.in_flight(), Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (s, done) = (sender.clone(), done.clone());
        tasks.spawn(async move {
            let r = s.send(msg(&format!("m{i}"))).await;
            done.fetch_add(1, Ordering::Relaxed);
            r
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    monitor.await.unwrap();
    assert!(
        most.load(Ordering::Relaxed) <= 4,
        "in flight went up to {}",
        most.load(Ordering::Relaxed)
    );
    assert_eq!(sender.in_flight(), 0);
    assert_eq!(fx.contents(&EntityPath::queue(&q)).await.len(), 100);
}

pub async fn s1_5_presettled_send_is_off_by_default(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let e = sender.send_presettled(msg("x")).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidOperation { .. }), "{e}");
    assert_eq!(e.messages.len(), 1);

    let sender = fx
        .transport
        .sender(&q, SenderOptions::default().allow_presettled(true))
        .await
        .unwrap();
    sender.send_presettled(msg("fire-and-forget")).await.unwrap();
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    assert_eq!(body(receive_one(r.as_ref()).await.message()), "fire-and-forget");
}

// ---------------------------------------------------------------------------------------
// S2 Receive modes

pub async fn s2_1_receive_and_delete_removes_the_message(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("a"), msg("b")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let got = r.receive_and_delete(1, Duration::from_secs(5)).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(body(&got[0]), "a");
    assert!(got[0].broker.lock_token.is_none());
    let left = fx.contents(&EntityPath::queue(&q)).await;
    assert_eq!(left.iter().map(body).collect::<Vec<_>>(), vec!["b"]);
}

pub async fn s2_2_competing_receivers_never_share_a_locked_message(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("1"), msg("2")]).await;
    let a = fx.receiver(&EntityPath::queue(&q)).await;
    let b = fx.receiver(&EntityPath::queue(&q)).await;
    let first = receive_one(a.as_ref()).await;
    let second = receive_one(b.as_ref()).await;
    assert_eq!(body(first.message()), "1");
    assert_eq!(body(second.message()), "2", "B gets the next unlocked message");
    assert_empty(a.as_ref()).await;

    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, (0..100).map(|i| msg(&i.to_string())).collect()).await;
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..2 {
        let (r, seen) = (fx.receiver(&EntityPath::queue(&q)).await, seen.clone());
        tasks.spawn(async move {
            loop {
                let got = r.receive(5, Duration::from_millis(300)).await.unwrap();
                if got.is_empty() {
                    return;
                }
                for d in got {
                    seen.lock().unwrap().push(d.message().sequence_number());
                    d.complete().await.unwrap();
                }
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let unique: HashSet<i64> = seen.iter().copied().collect();
    assert_eq!(seen.len(), 100, "every message received");
    assert_eq!(unique.len(), 100, "no message delivered twice");
}

pub async fn s2_3_lock_duration_is_set_per_queue(fx: Fixture) {
    if fx.bent("S2.3") {
        assert_unsupported(
            fx.transport
                .create_queue(
                    &fx.unique("q"),
                    &QueueOptions::default().lock_duration(Duration::from_secs(30)),
                )
                .await,
        );
        return;
    }
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("x")]).await;
    let d = receive_one(fx.receiver(&EntityPath::queue(&q)).await.as_ref()).await;
    assert_eq!(
        d.locked_until().unwrap(),
        fx.now() + chrono::Duration::seconds(60),
        "default 60 s"
    );

    let q = fx
        .queue(QueueOptions::default().lock_duration(Duration::from_secs(30)))
        .await;
    fx.send(&q, vec![msg("x")]).await;
    let d = receive_one(fx.receiver(&EntityPath::queue(&q)).await.as_ref()).await;
    assert_eq!(d.locked_until().unwrap(), fx.now() + chrono::Duration::seconds(30));

    let e = fx
        .transport
        .create_queue(
            &fx.unique("q"),
            &QueueOptions::default().lock_duration(Duration::from_secs(301)),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::InvalidOptions { .. }),
        "at most 5 min: {e}"
    );
}

pub async fn s2_4_renew_extends_the_lock(fx: Fixture) {
    let lock = if fx.transport.capabilities().bends("S2.3").is_some() {
        QueueOptions::default().lock_duration
    } else {
        Duration::from_secs(30)
    };
    let q = fx.queue(QueueOptions::default().lock_duration(lock)).await;
    fx.send(&q, vec![msg("x")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let mut d = receive_one(r.as_ref()).await;
    if fx.bent("S2.4") {
        assert_unsupported(d.renew_lock().await);
        return;
    }
    fx.clock.advance(Duration::from_secs(20));
    let until = d.renew_lock().await.unwrap();
    assert_eq!(until, fx.now() + chrono::Duration::seconds(30));
    fx.clock.advance(Duration::from_secs(20)); // 40 s after the receive: past the first lock
    assert_empty(r.as_ref()).await;
    d.complete().await.unwrap();
    assert!(fx.peek_all(&EntityPath::queue(&q)).await.is_empty());
}

pub async fn s2_4_auto_renew_keeps_the_lock_while_work_runs(fx: Fixture) {
    if fx.bent("S2.4") {
        return; // checked by s2_4_renew_extends_the_lock
    }
    let q = fx
        .queue(QueueOptions::default().lock_duration(Duration::from_secs(30)))
        .await;
    fx.send(&q, vec![msg("x")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let mut d = receive_one(r.as_ref()).await;
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let clock = fx.clock.clone();
    let transport = fx.transport.clone();
    let path = EntityPath::queue(&q);
    let driver = tokio::spawn(async move {
        // Move time in 10 s steps; after each, wait until the renewal shows.
        for _ in 0..9 {
            clock.advance(Duration::from_secs(10));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let m = transport.peek(&path, 0, 1).await.unwrap();
                if m[0]
                    .broker
                    .locked_until
                    .is_some_and(|u| u > clock.now() + chrono::Duration::seconds(10))
                {
                    break;
                }
                assert!(tokio::time::Instant::now() < deadline, "the lock was not renewed");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        release.send(()).unwrap();
    });
    let clock: VirtualClock = fx.clock.clone();
    let (out, failure) = d
        .renew_while(&clock, Duration::from_secs(600), async { released.await.is_ok() })
        .await;
    driver.await.unwrap();
    assert!(out);
    assert!(failure.is_none(), "{failure:?}");
    d.complete().await.unwrap();
}

pub async fn s2_5_complete_removes_the_message(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("x")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    receive_one(r.as_ref()).await.complete().await.unwrap();
    assert!(fx.contents(&EntityPath::queue(&q)).await.is_empty());
    fx.lose_locks().await;
    assert_empty(r.as_ref()).await;
}

pub async fn s2_5_abandon_puts_the_message_first_again(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("m1"), msg("m2")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let d = receive_one(r.as_ref()).await;
    assert_eq!(body(d.message()), "m1");
    let mut props = Properties::new();
    props.insert("reason".into(), PropertyValue::from("try later"));
    d.abandon_with(props).await.unwrap();
    let again = receive_one(r.as_ref()).await;
    assert_eq!(body(again.message()), "m1", "abandoned message comes first");
    assert_eq!(again.message().delivery_count(), 2);
    if fx.bent("S2.5 abandon") {
        assert!(!again.message().envelope.properties.contains_key("reason"));
        return;
    }
    assert_eq!(
        again.message().envelope.properties.get("reason"),
        Some(&PropertyValue::from("try later"))
    );
}

pub async fn s2_5_lock_expiry_has_the_effect_of_abandon(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("m1"), msg("m2")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let _held = receive_one(r.as_ref()).await;
    fx.lose_locks().await;
    let again = receive_one(r.as_ref()).await;
    assert_eq!(body(again.message()), "m1");
    assert_eq!(again.message().delivery_count(), 2);
}

pub async fn s2_5_dead_letter_keeps_reason_and_description(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("bad")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    receive_one(r.as_ref())
        .await
        .dead_letter("validation", "amount must be positive")
        .await
        .unwrap();
    assert_empty(r.as_ref()).await;
    let dlq = fx.receiver(&EntityPath::queue(&q).dead_letter()).await;
    let d = receive_one(dlq.as_ref()).await;
    let m = d.message();
    assert_eq!(body(m), "bad");
    assert_eq!(m.broker.state, MessageState::DeadLettered);
    assert_eq!(m.broker.dead_letter_reason.as_deref(), Some("validation"));
    assert_eq!(
        m.broker.dead_letter_description.as_deref(),
        Some("amount must be positive")
    );
    let e = dlq.receive(1, Duration::ZERO).await.unwrap();
    assert!(e.is_empty(), "a locked dead-lettered message is not handed out twice");
    d.complete().await.unwrap();
    assert!(fx.contents(&EntityPath::queue(&q).dead_letter()).await.is_empty());
}

pub async fn s2_5_defer_then_receive_by_sequence_number(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("later")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let d = receive_one(r.as_ref()).await;
    if fx.bent("S2.5") {
        assert_unsupported(d.defer().await);
        return;
    }
    let seq = d.defer().await.unwrap();
    assert_empty(r.as_ref()).await;
    assert_eq!(
        fx.peek_all(&EntityPath::queue(&q)).await[0].broker.state,
        MessageState::Deferred
    );
    let mut got = r.receive_deferred(&[seq]).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(body(got[0].message()), "later");
    got.pop().unwrap().complete().await.unwrap();
    assert!(fx.peek_all(&EntityPath::queue(&q)).await.is_empty());
    let e = r.receive_deferred(&[seq + 1000]).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::MessageNotFound { .. }), "{e}");
}

pub async fn s2_6_max_delivery_count_dead_letters_after_tenth_lock(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("poison")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    for n in 1..=10 {
        let d = receive_one(r.as_ref()).await;
        assert_eq!(d.message().delivery_count(), n);
        d.abandon().await.unwrap();
    }
    assert_empty(r.as_ref()).await;
    let dead = fx.contents(&EntityPath::queue(&q).dead_letter()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
    );
}

pub async fn s2_6_max_delivery_count_through_lock_expiry(fx: Fixture) {
    let q = fx.queue(QueueOptions::default().max_delivery_count(2)).await;
    fx.send(&q, vec![msg("poison")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    for _ in 0..2 {
        let _lost = receive_one(r.as_ref()).await;
        fx.lose_locks().await;
    }
    assert_empty(r.as_ref()).await;
    let dlq = fx.receiver(&EntityPath::queue(&q).dead_letter()).await;
    let d = receive_one(dlq.as_ref()).await;
    assert_eq!(
        d.message().broker.dead_letter_reason.as_deref(),
        Some(reasons::MAX_DELIVERY_COUNT_EXCEEDED)
    );
}

pub async fn s2_7_settling_after_lock_expiry_is_lock_lost(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("x")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let d = receive_one(r.as_ref()).await;
    fx.lose_locks().await;
    let e = d.complete().await.unwrap_err();
    assert!(e.is_lock_lost(), "{e}");
    assert!(matches!(e.kind(), ErrorKind::LockLost));
    let again = receive_one(r.as_ref()).await;
    assert_eq!(body(again.message()), "x", "the message comes back");
    again.complete().await.unwrap();

    let e = r
        .settle_by_token(LockToken::from_uuid(Uuid::new_v4()), Settlement::Complete)
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::UnknownLockToken { .. }), "{e}");
}

pub async fn s2_8_redelivery_keeps_the_sender_message_id(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("x").with_message_id("order-42")]).await;
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    receive_one(r.as_ref()).await.abandon().await.unwrap();
    let again = receive_one(r.as_ref()).await;
    assert_eq!(again.message().message_id(), "order-42");
    assert_eq!(again.message().delivery_count(), 2);
}

// ---------------------------------------------------------------------------------------
// S3 Sequence numbers and timestamps

pub async fn s3_1_sequence_numbers_are_gap_free_and_increasing(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    for i in 0..10 {
        sender.send(msg(&format!("s{i}"))).await.unwrap();
    }
    if fx.bent("S3.1") {
        // The substitute: numbers unique and increasing for one sending process.
        let seen = fx.contents(&EntityPath::queue(&q)).await;
        assert_eq!(seen.len(), 10);
        for w in seen.windows(2) {
            assert!(w[1].sequence_number() > w[0].sequence_number(), "increasing per sender");
        }
        return;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let s = sender.clone();
        tasks.spawn(async move { s.send(msg(&format!("c{i}"))).await });
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    sender
        .send_batch((0..20).map(|i| msg(&format!("b{i}"))).collect())
        .await
        .unwrap();
    let seen = fx.peek_all(&EntityPath::queue(&q)).await;
    assert_eq!(seen.len(), 50);
    for w in seen.windows(2) {
        assert_eq!(w[1].sequence_number(), w[0].sequence_number() + 1, "gap-free");
    }

    let topic = fx.topic(&["a", "b"]).await;
    fx.send(&topic, (0..5).map(|i| msg(&i.to_string())).collect()).await;
    let a = fx.peek_all(&EntityPath::subscription(&topic, "a")).await;
    let b = fx.peek_all(&EntityPath::subscription(&topic, "b")).await;
    let seq = |v: &[ReceivedMessage]| v.iter().map(ReceivedMessage::sequence_number).collect::<Vec<_>>();
    assert_eq!(seq(&a), seq(&b), "copies carry the topic's numbers");
    for w in a.windows(2) {
        assert_eq!(w[1].sequence_number(), w[0].sequence_number() + 1);
    }
}

pub async fn s3_2_enqueued_time_is_the_broker_clock_in_utc(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.clock.advance(Duration::from_secs(7));
    let now = fx.now();
    fx.send(&q, vec![msg("x")]).await;
    let seen = fx.contents(&EntityPath::queue(&q)).await;
    assert_eq!(seen[0].broker.enqueued_time, now);
}

pub async fn s3_4_processing_order_is_not_sequence_order(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(&q, vec![msg("1"), msg("2")]).await;
    let a = fx.receiver(&EntityPath::queue(&q)).await;
    let b = fx.receiver(&EntityPath::queue(&q)).await;
    let one = receive_one(a.as_ref()).await;
    let two = receive_one(b.as_ref()).await;
    assert!(one.message().sequence_number() < two.message().sequence_number());
    two.complete().await.unwrap();
    one.complete().await.unwrap();
    assert!(fx.contents(&EntityPath::queue(&q)).await.is_empty());
}

// ---------------------------------------------------------------------------------------
// S4 Sessions

async fn session_queue(fx: &Fixture) -> Option<String> {
    let name = fx.unique("sq");
    let r = fx
        .transport
        .create_queue(&name, &QueueOptions::default().requires_session(true))
        .await;
    if fx.bent("S4.1") {
        assert_unsupported(r);
        return None;
    }
    r.unwrap();
    Some(name)
}

pub async fn s4_1_a_session_is_held_by_one_receiver_in_order(fx: Fixture) {
    let Some(q) = session_queue(&fx).await else { return };
    let e = fx
        .transport
        .sender(&q, SenderOptions::default())
        .await
        .unwrap()
        .send(msg("no session"))
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidMessage { .. }), "{e}");
    fx.send(
        &q,
        vec![
            msg("a1").with_session_id("a"),
            msg("b1").with_session_id("b"),
            msg("a2").with_session_id("a"),
            msg("a3").with_session_id("a"),
        ],
    )
    .await;
    let plain = fx.receiver(&EntityPath::queue(&q)).await;
    let e = plain.receive(1, Duration::ZERO).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidOperation { .. }), "{e}");

    let path = EntityPath::queue(&q);
    let a = fx
        .transport
        .accept_session(&path, SessionSelector::Named("a".into()), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(a.session_id(), "a");
    let e = fx
        .transport
        .accept_session(&path, SessionSelector::Named("a".into()), Duration::ZERO)
        .await
        .err()
        .expect("a held session cannot be accepted twice");
    assert!(matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }), "{e}");
    let got = receive_n(a.as_ref(), 3).await;
    assert_eq!(
        got.iter().map(|d| body(d.message())).collect::<Vec<_>>(),
        ["a1", "a2", "a3"]
    );
    for d in got {
        d.complete().await.unwrap();
    }
    a.release().await.unwrap();
    let again = fx
        .transport
        .accept_session(&path, SessionSelector::Named("a".into()), Duration::ZERO)
        .await
        .unwrap();
    assert_empty(again.as_ref()).await;
}

pub async fn s4_2_different_sessions_go_to_different_receivers(fx: Fixture) {
    let Some(q) = session_queue(&fx).await else { return };
    fx.send(&q, vec![msg("a1").with_session_id("a"), msg("b1").with_session_id("b")])
        .await;
    let path = EntityPath::queue(&q);
    let one = fx
        .transport
        .accept_session(&path, SessionSelector::Next, Duration::from_secs(5))
        .await
        .unwrap();
    let two = fx
        .transport
        .accept_session(&path, SessionSelector::Next, Duration::from_secs(5))
        .await
        .unwrap();
    assert_ne!(one.session_id(), two.session_id());
    let x = receive_one(one.as_ref()).await;
    let y = receive_one(two.as_ref()).await;
    assert_eq!(x.message().envelope.session_id.as_deref(), Some(one.session_id()));
    assert_eq!(y.message().envelope.session_id.as_deref(), Some(two.session_id()));
    let e = fx
        .transport
        .accept_session(&path, SessionSelector::Next, Duration::ZERO)
        .await
        .err()
        .expect("no third session");
    assert!(matches!(e.kind(), ErrorKind::SessionNotAvailable { .. }), "{e}");
}

pub async fn s4_3_session_state_is_kept(fx: Fixture) {
    let Some(q) = session_queue(&fx).await else { return };
    let path = EntityPath::queue(&q);
    let s = fx
        .transport
        .accept_session(&path, SessionSelector::Named("order-7".into()), Duration::ZERO)
        .await
        .unwrap();
    if fx.bent("S4.3") {
        assert_unsupported(s.session_state().await);
        assert_unsupported(s.set_session_state(Some("paid".into())).await);
        return;
    }
    assert_eq!(s.session_state().await.unwrap(), None);
    s.set_session_state(Some("paid".into())).await.unwrap();
    s.release().await.unwrap();
    let s = fx
        .transport
        .accept_session(&path, SessionSelector::Named("order-7".into()), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(s.session_state().await.unwrap().as_deref(), Some(&b"paid"[..]));
}

pub async fn s4_session_lock_expires_and_can_be_renewed(fx: Fixture) {
    let Some(q) = session_queue(&fx).await else { return };
    fx.send(&q, vec![msg("a1").with_session_id("a"), msg("a2").with_session_id("a")])
        .await;
    let path = EntityPath::queue(&q);
    let s = fx
        .transport
        .accept_session(&path, SessionSelector::Named("a".into()), Duration::ZERO)
        .await
        .unwrap();
    let first = receive_one(s.as_ref()).await;
    fx.clock.advance(Duration::from_secs(40));
    let until = s.renew_session_lock().await.unwrap();
    assert_eq!(until, fx.now() + chrono::Duration::seconds(60));
    fx.clock.advance(Duration::from_secs(40)); // 80 s: alive only thanks to the renewal
    first.complete().await.unwrap();
    let second = receive_one(s.as_ref()).await;
    fx.clock.advance(Duration::from_secs(61));
    let e = second.complete().await.unwrap_err();
    assert!(e.is_lock_lost(), "{e}");
    let e = s.renew_session_lock().await.unwrap_err();
    assert!(e.is_lock_lost(), "{e}");
    let other = fx
        .transport
        .accept_session(&path, SessionSelector::Next, Duration::from_secs(5))
        .await
        .unwrap();
    let back = receive_one(other.as_ref()).await;
    assert_eq!(body(back.message()), "a2", "the message comes back with its session");
}

// ---------------------------------------------------------------------------------------
// S5 Scheduled messages

pub async fn s5_1_schedule_returns_a_sequence_number(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let at = fx.now() + chrono::Duration::minutes(5);
    let seq = sender.schedule(msg("code expiry"), at).await.unwrap();
    assert!(seq > 0);
    sender
        .send(msg("via envelope").with_scheduled_enqueue_time(at))
        .await
        .unwrap();
    if fx.bent("S6.1") {
        assert_eq!(fx.scheduled_count(&q).await, 2);
        fx.clock.set(at);
        let r = fx.receiver(&EntityPath::queue(&q)).await;
        let got = receive_n(r.as_ref(), 2).await;
        let mut bodies: Vec<String> = got.iter().map(|d| body(d.message())).collect();
        bodies.sort();
        assert_eq!(bodies, vec!["code expiry", "via envelope"]);
        return;
    }
    let seen = fx.peek_all(&EntityPath::queue(&q)).await;
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|m| m.broker.state == MessageState::Scheduled));
    assert_eq!(seen[0].sequence_number(), seq);
}

pub async fn s5_2_scheduled_message_is_invisible_until_its_time(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    sender
        .schedule(msg("confirm-timeout"), fx.now() + chrono::Duration::hours(1))
        .await
        .unwrap();
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    assert_empty(r.as_ref()).await;
    assert_eq!(fx.scheduled_count(&q).await, 1, "browsing (or counting) shows it");
    fx.clock.advance(Duration::from_secs(3599));
    assert_empty(r.as_ref()).await;
    fx.clock.advance(Duration::from_secs(1));
    assert_eq!(body(receive_one(r.as_ref()).await.message()), "confirm-timeout");
}

pub async fn s5_3_cancelled_scheduled_message_never_appears(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let seq = sender
        .schedule(msg("cancelled"), fx.now() + chrono::Duration::minutes(5))
        .await
        .unwrap();
    sender.cancel_scheduled(seq).await.unwrap();
    assert_eq!(fx.scheduled_count(&q).await, 0, "cancelling deletes it");
    fx.clock.advance(Duration::from_secs(600));
    assert_empty(fx.receiver(&EntityPath::queue(&q)).await.as_ref()).await;
    let e = sender.cancel_scheduled(seq).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::MessageNotFound { .. }), "{e}");
}

pub async fn s5_4_activation_gives_a_new_sequence_number_and_time(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let at = fx.now() + chrono::Duration::minutes(5);
    let seq = sender.schedule(msg("later"), at).await.unwrap();
    sender.send(msg("now")).await.unwrap();
    fx.clock.set(at);
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let got = receive_n(r.as_ref(), 2).await;
    let later = got.iter().find(|d| body(d.message()) == "later").unwrap().message();
    assert!(later.sequence_number() > seq + 1, "activated as if sent now");
    assert_eq!(later.broker.enqueued_time, at);
}

pub async fn s5_6_cancel_after_activation_fails(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let seq = sender
        .schedule(msg("x"), fx.now() + chrono::Duration::seconds(10))
        .await
        .unwrap();
    fx.clock.advance(Duration::from_secs(10));
    let _ = receive_one(fx.receiver(&EntityPath::queue(&q)).await.as_ref()).await;
    let e = sender.cancel_scheduled(seq).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::MessageNotFound { .. }), "{e}");
}

pub async fn s5_7_a_scheduled_message_is_enqueued_once(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    sender
        .schedule(msg("once"), fx.now() + chrono::Duration::seconds(10))
        .await
        .unwrap();
    fx.clock.advance(Duration::from_secs(10));
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    receive_one(r.as_ref()).await.complete().await.unwrap();
    fx.clock.advance(Duration::from_secs(7 * 24 * 3600));
    assert_empty(r.as_ref()).await;
}

pub async fn s5_schedule_time_out_of_range_is_refused(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    for at in [DateTime::<Utc>::MAX_UTC, DateTime::<Utc>::MIN_UTC] {
        let e = sender.schedule(msg("x"), at).await.unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::InvalidScheduleTime { .. }), "{e}");
        assert_eq!(e.messages.len(), 1);
    }
    assert!(fx.contents(&EntityPath::queue(&q)).await.is_empty());
}

// ---------------------------------------------------------------------------------------
// S6 Browsing

pub async fn s6_1_peek_shows_every_state_and_changes_nothing(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    if fx.bent("S6.1") {
        assert_unsupported(fx.transport.peek(&EntityPath::queue(&q), 0, 10).await);
        return;
    }
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    sender
        .send_batch(vec![msg("active"), msg("deferred"), msg("dead")])
        .await
        .unwrap();
    sender
        .schedule(msg("scheduled"), fx.now() + chrono::Duration::hours(1))
        .await
        .unwrap();
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let got = receive_n(r.as_ref(), 3).await;
    let mut got = got.into_iter();
    got.next().unwrap().abandon().await.unwrap();
    if !fx.bent("S2.5") {
        got.next().unwrap().defer().await.unwrap();
    } else {
        got.next().unwrap().abandon().await.unwrap();
    }
    got.next().unwrap().dead_letter("test", "peek shows me").await.unwrap();

    let main = fx.peek_all(&EntityPath::queue(&q)).await;
    let states: Vec<(String, MessageState)> = main.iter().map(|m| (body(m), m.broker.state)).collect();
    assert!(states.contains(&("active".into(), MessageState::Active)), "{states:?}");
    assert!(
        states.contains(&("scheduled".into(), MessageState::Scheduled)),
        "{states:?}"
    );
    if !fx.bent("S2.5") {
        assert!(
            states.contains(&("deferred".into(), MessageState::Deferred)),
            "{states:?}"
        );
    }
    let from = main[1].sequence_number();
    let tail = fx.transport.peek(&EntityPath::queue(&q), from, 10).await.unwrap();
    assert!(tail.iter().all(|m| m.sequence_number() >= from));
    assert_eq!(tail.len(), main.len() - 1);
    let dead = fx.peek_all(&EntityPath::queue(&q).dead_letter()).await;
    assert_eq!(dead.iter().map(body).collect::<Vec<_>>(), vec!["dead"]);

    // Peeking again shows the same, and the active message is still receivable, unlocked,
    // with the delivery count peek did not touch.
    let again = fx.peek_all(&EntityPath::queue(&q)).await;
    assert_eq!(again, main);
    assert!(main.iter().all(|m| m.broker.lock_token.is_none()));
    let d = receive_one(r.as_ref()).await;
    assert_eq!(body(d.message()), "active");
    assert_eq!(d.message().delivery_count(), 2);
}

// ---------------------------------------------------------------------------------------
// Topics, time-to-live, bad input

pub async fn topic_subscriptions_each_get_a_copy(fx: Fixture) {
    let topic = fx.topic(&["billing", "shipping"]).await;
    fx.send(&topic, vec![msg("order-placed")]).await;
    fx.transport
        .create_subscription(&topic, "late", &QueueOptions::default())
        .await
        .unwrap();
    for s in ["billing", "shipping"] {
        let r = fx.receiver(&EntityPath::subscription(&topic, s)).await;
        let d = receive_one(r.as_ref()).await;
        assert_eq!(body(d.message()), "order-placed");
        d.complete().await.unwrap();
    }
    let late = fx.receiver(&EntityPath::subscription(&topic, "late")).await;
    assert_empty(late.as_ref()).await;
    let e = fx.transport.receiver(&EntityPath::queue(&topic)).await.err().unwrap();
    assert!(matches!(e.kind(), ErrorKind::InvalidOperation { .. }), "{e}");
}

pub async fn expired_messages_are_dead_lettered_with_a_reason(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    fx.send(
        &q,
        vec![msg("short").with_time_to_live(Duration::from_secs(10)), msg("long")],
    )
    .await;
    fx.clock.advance(Duration::from_secs(11));
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    let d = receive_one(r.as_ref()).await;
    assert_eq!(body(d.message()), "long");
    let dlq = fx.receiver(&EntityPath::queue(&q).dead_letter()).await;
    let dead = receive_one(dlq.as_ref()).await;
    assert_eq!(body(dead.message()), "short");
    assert_eq!(
        dead.message().broker.dead_letter_reason.as_deref(),
        Some(reasons::TTL_EXPIRED)
    );

    let q = fx
        .queue(QueueOptions::default().default_time_to_live(Duration::from_secs(60)))
        .await;
    fx.send(&q, vec![msg("default ttl")]).await;
    fx.clock.advance(Duration::from_secs(61));
    assert_empty(fx.receiver(&EntityPath::queue(&q)).await.as_ref()).await;
    let dead = fx.contents(&EntityPath::queue(&q).dead_letter()).await;
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].broker.dead_letter_reason.as_deref(), Some(reasons::TTL_EXPIRED));
}

pub async fn invalid_names_are_refused_before_reaching_the_broker(fx: Fixture) {
    let long = "a".repeat(121);
    for bad in ["", long.as_str(), "q'; DROP TABLE x;--", "a b", "-x"] {
        let e = fx
            .transport
            .create_queue(bad, &QueueOptions::default())
            .await
            .unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::InvalidEntityName { .. }), "{bad:?}: {e}");
        assert!(!e.is_transient());
        let e = fx.transport.sender(bad, SenderOptions::default()).await.err().unwrap();
        assert!(matches!(e.kind(), ErrorKind::InvalidEntityName { .. }), "{bad:?}: {e}");
        let e = fx.transport.receiver(&EntityPath::queue(bad)).await.err().unwrap();
        assert!(matches!(e.kind(), ErrorKind::InvalidEntityName { .. }), "{bad:?}: {e}");
    }
    let e = fx
        .transport
        .receiver(&EntityPath::queue(fx.unique("missing")))
        .await
        .err()
        .unwrap();
    assert!(matches!(e.kind(), ErrorKind::EntityNotFound { .. }), "{e}");
}

pub async fn a_closed_transport_refuses_every_call(fx: Fixture) {
    let q = fx.queue(QueueOptions::default()).await;
    let sender = fx.transport.sender(&q, SenderOptions::default()).await.unwrap();
    let r = fx.receiver(&EntityPath::queue(&q)).await;
    fx.transport.close().await;
    let e = sender.send(msg("x")).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Closed), "{e}");
    assert_eq!(e.messages.len(), 1, "the message is handed back");
    let e = r.receive(1, Duration::ZERO).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Closed), "{e}");
    let e = fx
        .transport
        .create_queue(&fx.unique("q"), &QueueOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Closed), "{e}");
}

/// Instantiates the conformance suite: one `#[tokio::test]` per rule, each given a fresh
/// fixture from `$factory` (an `async fn() -> Fixture`).
#[macro_export]
macro_rules! conformance_suite {
    ($factory:path) => {
        $crate::conformance_suite!(@tests $factory;
            s1_1_send_returns_after_the_broker_accepted,
            s1_2_rejected_send_carries_reason_tracking_id_and_the_message,
            s1_3_pipelined_sends_all_arrive_once,
            s1_4_outstanding_sends_are_bounded,
            s1_5_presettled_send_is_off_by_default,
            s2_1_receive_and_delete_removes_the_message,
            s2_2_competing_receivers_never_share_a_locked_message,
            s2_3_lock_duration_is_set_per_queue,
            s2_4_renew_extends_the_lock,
            s2_4_auto_renew_keeps_the_lock_while_work_runs,
            s2_5_complete_removes_the_message,
            s2_5_abandon_puts_the_message_first_again,
            s2_5_lock_expiry_has_the_effect_of_abandon,
            s2_5_dead_letter_keeps_reason_and_description,
            s2_5_defer_then_receive_by_sequence_number,
            s2_6_max_delivery_count_dead_letters_after_tenth_lock,
            s2_6_max_delivery_count_through_lock_expiry,
            s2_7_settling_after_lock_expiry_is_lock_lost,
            s2_8_redelivery_keeps_the_sender_message_id,
            s3_1_sequence_numbers_are_gap_free_and_increasing,
            s3_2_enqueued_time_is_the_broker_clock_in_utc,
            s3_4_processing_order_is_not_sequence_order,
            s4_1_a_session_is_held_by_one_receiver_in_order,
            s4_2_different_sessions_go_to_different_receivers,
            s4_3_session_state_is_kept,
            s4_session_lock_expires_and_can_be_renewed,
            s5_1_schedule_returns_a_sequence_number,
            s5_2_scheduled_message_is_invisible_until_its_time,
            s5_3_cancelled_scheduled_message_never_appears,
            s5_4_activation_gives_a_new_sequence_number_and_time,
            s5_6_cancel_after_activation_fails,
            s5_7_a_scheduled_message_is_enqueued_once,
            s5_schedule_time_out_of_range_is_refused,
            s6_1_peek_shows_every_state_and_changes_nothing,
            topic_subscriptions_each_get_a_copy,
            expired_messages_are_dead_lettered_with_a_reason,
            invalid_names_are_refused_before_reaching_the_broker,
            a_closed_transport_refuses_every_call,
        );
    };
    (@tests $factory:path; $($name:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $crate::conformance::$name($factory().await).await
            }
        )*
    };
}
