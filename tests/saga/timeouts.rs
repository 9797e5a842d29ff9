//! Timeouts that must not loop or linger (issue 13): a timeout whose handler keeps
//! failing is dead-lettered once and never sent again; one the broker dead-letters by
//! itself is sent a bounded number of times; one waiting for a delayed retry is not sent
//! a second time beside it; a start message that arrives twice leaves one timeout. On the
//! three stores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    Clock, Endpoint, EndpointBuilder, EntityPath, QueueOptions, RetryPolicy, RunningEndpoint, SendOptions,
    SenderOptions,
};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;

use super::{Confirm, CountingClaims, Env, Flow, begin, handled, routes};

/// The longest move of the clock at once in `advance_past_claims`: shorter than the
/// default lock (60 s).
const MAX_STEP: u64 = 50;

impl Env {
    /// An endpoint whose store counts the dispatcher's claims, with `policy`.
    async fn start_counting(&self, policy: RetryPolicy) -> (RunningEndpoint, Arc<CountingClaims>) {
        self.start_losing(policy, 0).await
    }

    /// As `start_counting`, the replies of the first `lost` claims that take something
    /// lost after their commit.
    async fn start_losing(&self, policy: RetryPolicy, lost: u32) -> (RunningEndpoint, Arc<CountingClaims>) {
        self.start_configured(policy, lost, |b| b).await
    }

    /// As `start_losing`, the builder finished by `configure`.
    async fn start_configured(
        &self,
        policy: RetryPolicy,
        lost: u32,
        configure: impl FnOnce(EndpointBuilder) -> EndpointBuilder,
    ) -> (RunningEndpoint, Arc<CountingClaims>) {
        let store = Arc::new(CountingClaims {
            inner: self.env.store.clone(),
            claims: AtomicU32::new(0),
            lose_replies: AtomicU32::new(lost),
        });
        let clock: Arc<dyn Clock> = Arc::new(self.env.fx.clock.clone());
        let flows = Endpoint::builder("flows")
            .transport(self.env.fx.transport.clone())
            .clock(clock)
            .routes(routes())
            .store(store.clone())
            .state(self.probe.clone())
            .recoverability(policy)
            .saga::<Flow>();
        let flows = configure(flows).start().await.unwrap();
        (flows, store)
    }

    /// Moves the clock by `secs` and waits for two more claims of the dispatcher: at least
    /// one whole claim after the move. The clock moves only while the endpoint's queue
    /// holds no message (waiting or locked), in steps shorter than any lock: a copy
    /// received just before a move (or by a receive that read the clock before it) must
    /// not see its lock end before its handler runs (seen under load: 300 nudges of a
    /// second past a copy received and not yet started; a receive's reading from before a
    /// 61 s move locking a copy until a time already past).
    async fn advance_past_claims(&self, secs: u64, store: &CountingClaims) {
        let mut left = secs;
        while left > 0 {
            let step = left.min(MAX_STEP);
            self.queue_idle().await;
            self.advance(step);
            left -= step;
        }
        let before = store.claims.load(Ordering::SeqCst);
        eventually("two claims after moving the clock", || async {
            if store.claims.load(Ordering::SeqCst) < before + 2 {
                // The dispatcher sleeps by the virtual clock: nudge it, while no copy is
                // in the queue.
                if self.in_queue().await == 0 {
                    self.advance(1);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
                return false;
            }
            true
        })
        .await;
    }

    /// The messages in the endpoint's queue, waiting or locked.
    async fn in_queue(&self) -> u64 {
        self.env
            .fx
            .transport
            .counts(&EntityPath::queue("flows"))
            .await
            .unwrap()
            .active
    }

    /// Waits until the endpoint's queue holds no message (waiting or locked).
    async fn queue_idle(&self) {
        eventually("the queue idle", || async { self.in_queue().await == 0 }).await;
    }

    /// Creates the endpoint's queue with the longest lock (before the endpoint starts):
    /// the tests move the clock by a minute or more, and a receive that read the clock
    /// just before a move locks until a time counted from that reading.
    async fn longest_lock(&self, options: QueueOptions) {
        self.env
            .fx
            .transport
            .create_queue("flows", &options.lock_duration(courier::MAX_LOCK_DURATION))
            .await
            .unwrap();
    }

    async fn dead_lettered_timeouts(&self) -> i64 {
        self.dead_lettered_timeouts_with(courier::recoverability::reasons::RETRIES_EXHAUSTED)
            .await
    }

    /// The timeout rows marked dead-lettered with `reason`.
    async fn dead_lettered_timeouts_with(&self, reason: &str) -> i64 {
        self.env
            .count(&format!(
                "SELECT COUNT(*) FROM {} WHERE dead_lettered_at IS NOT NULL AND dead_letter_reason = '{reason}'",
                self.env.kind.table("saga_timeout"),
            ))
            .await
    }

    async fn dead_letters(&self) -> usize {
        self.env
            .fx
            .transport
            .peek(&EntityPath::queue("flows").dead_letter(), 0, 100)
            .await
            .unwrap()
            .len()
    }
}

/// Regression (issue 13, bug 1): a timeout whose handler keeps failing was dead-lettered,
/// but its row stayed claimed; the dispatcher took the claim back five minutes later and
/// sent it again, forever (13 dispatches and 12 dead letters in two hours). Now the row
/// is marked dead-lettered and never sent again.
async fn a_timeout_that_keeps_failing_is_dead_lettered_once(kind: StoreKind) {
    let env = Env::new(kind).await;
    env.probe.failing.store(true, Ordering::SeqCst);
    env.longest_lock(QueueOptions::default()).await;
    let (flows, store) = env.start_counting(RetryPolicy::none().immediate(1)).await;
    handled(&flows, &begin("f-dead", Some(60)), 1).await;
    env.advance(61);
    eventually("the timeout dead-lettered", || async {
        flows.stats().dead_lettered == 1
    })
    .await;
    assert_eq!(env.probe.attempts.load(Ordering::SeqCst), 2, "two attempts");
    assert_eq!(flows.stats().timeouts_dead_lettered, 1);
    assert_eq!(
        env.dead_lettered_timeouts().await,
        1,
        "the row is marked, with its reason"
    );
    // Two hours: past the reclaim wait many times over.
    for _ in 0..24 {
        env.advance_past_claims(301, &store).await;
    }
    assert_eq!(env.probe.attempts.load(Ordering::SeqCst), 2, "never sent again");
    assert_eq!(env.dead_letters().await, 1, "one dead letter");
    assert_eq!(flows.stats().timeouts_dispatched, 1);
    // The operator fixes the handler and resubmits the dead letter: it fires, once, and
    // its row goes.
    env.probe.failing.store(false, Ordering::SeqCst);
    let dead = env
        .env
        .fx
        .transport
        .receiver(&EntityPath::queue("flows").dead_letter())
        .await
        .unwrap();
    let letters = dead.receive(1, Duration::from_secs(5)).await.unwrap();
    let letter = letters.into_iter().next().expect("the dead letter");
    let mut copy = letter.message().envelope.clone();
    copy.properties.retain(|k, _| !k.starts_with("courier.failure."));
    let sender = env
        .env
        .fx
        .transport
        .sender("flows", SenderOptions::default())
        .await
        .unwrap();
    sender.send(copy).await.unwrap();
    letter.complete().await.unwrap();
    eventually("the resubmitted timeout handled", || async { env.fired() == 1 }).await;
    eventually("its row gone", || async { env.rows("saga_timeout").await == 0 }).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Regression (issue 13 audit): a timeout whose message the broker dead-letters by itself
/// (its max delivery count reached; here the queue allows one delivery and the endpoint's
/// immediate retry hands the message back) is never settled by a handling: the endpoint
/// does not see the dead-lettering, so the row stayed claimed and was sent again after
/// every five-minute reclaim wait, forever. Now it is sent at most
/// `max_timeout_dispatches` times, then its row is marked dead-lettered with its reason.
async fn a_timeout_the_broker_dead_letters_is_sent_a_bounded_number_of_times(kind: StoreKind) {
    const MAX: u32 = 3;
    let env = Env::new(kind).await;
    env.probe.failing.store(true, Ordering::SeqCst);
    // Created beforehand (by an operator, say) with one delivery: the endpoint keeps it.
    // The longest lock: a copy received but not yet started must not see its one
    // delivery end by the clock before its handler runs (CI saw 2 attempts of 3 on the
    // Postgres transport with the default 60 s).
    env.longest_lock(QueueOptions::default().max_delivery_count(1)).await;
    let policy = RetryPolicy::none().immediate(3);
    // With a history: each dispatch is an event, and so is the giving up (issue 33).
    let (flows, store) = env
        .start_configured(policy, 0, |b| {
            b.max_timeout_dispatches(MAX).history(courier::HistoryOptions::new())
        })
        .await;
    handled(&flows, &begin("f-broker", Some(60)), 1).await;
    env.advance(61);
    eventually("the broker dead-letters the first copy", || async {
        env.dead_letters().await == 1
    })
    .await;
    assert_eq!(flows.stats().dead_lettered, 0, "not the endpoint: the broker");
    let exhausted = courier::recoverability::reasons::TIMEOUT_DISPATCHES_EXHAUSTED;
    // Two hours: past the reclaim wait many times over.
    for _ in 0..24 {
        env.advance_past_claims(301, &store).await;
        // Every copy sent is handled (and dead-lettered by the broker) before the clock
        // jumps again: a jump while it is locked would end its one delivery before its
        // handler ran (the Postgres transport enqueues it in the claim, and its receive
        // may come after the next jump).
        // The queue empty too: the dispatcher counts a copy after its claim committed,
        // and the copy is receivable from that commit on (a jump in between ended a
        // copy's one delivery before its handler ran: 2 attempts of 3, seen under load).
        eventually("no copy in flight", || async {
            env.dead_letters().await as u64 == flows.stats().timeouts_dispatched && env.in_queue().await == 0
        })
        .await;
    }
    eventually("the last copy dead-lettered by the broker", || async {
        env.dead_letters().await == MAX as usize
    })
    .await;
    assert_eq!(
        env.probe.attempts.load(Ordering::SeqCst),
        MAX,
        "sent {MAX} times, no more"
    );
    assert_eq!(flows.stats().timeouts_dispatched, u64::from(MAX));
    assert_eq!(
        env.dead_lettered_timeouts_with(exhausted).await,
        1,
        "the row is marked dead-lettered, with its reason"
    );
    assert_eq!(flows.stats().timeouts_dead_lettered, 1);
    assert_eq!(env.rows("saga_timeout").await, 1, "kept for operators");
    let history = env.env.kind.table("history");
    let dispatches =
        |kind: &str| format!("SELECT COUNT(*) FROM {history} WHERE kind = '{kind}' AND message_type = 'saga.Remind'");
    assert_eq!(
        env.env.count(&dispatches("timeout_dispatched")).await,
        i64::from(MAX),
        "each dispatch in the history"
    );
    assert_eq!(
        env.env
            .count(&format!(
                "SELECT COUNT(*) FROM {history} WHERE kind = 'timeout_dead_lettered' AND attempt = {MAX}"
            ))
            .await,
        1,
        "the giving up, after the last dispatch"
    );
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// A timeout whose handler fails waits for a delayed retry longer than the dispatcher's
/// reclaim wait (five minutes): the claim is not taken back meanwhile, so no second copy
/// runs beside the retry (before, each reclaim started another chain of retries).
async fn a_timeout_waiting_for_a_delayed_retry_is_not_sent_again(kind: StoreKind) {
    let env = Env::new(kind).await;
    env.probe.failing.store(true, Ordering::SeqCst);
    let policy = RetryPolicy::none().delayed([Duration::from_secs(1800)]);
    env.longest_lock(QueueOptions::default()).await;
    let (flows, store) = env.start_counting(policy).await;
    handled(&flows, &begin("f-retry", Some(60)), 1).await;
    env.advance(61);
    eventually("the first attempt", || async { flows.stats().retried == 1 }).await;
    assert_eq!(env.probe.attempts.load(Ordering::SeqCst), 1);
    // 25 minutes: five reclaim waits, the delayed retry not yet due.
    for _ in 0..5 {
        env.advance_past_claims(301, &store).await;
    }
    assert_eq!(
        env.probe.attempts.load(Ordering::SeqCst),
        1,
        "no copy beside the delayed retry"
    );
    env.probe.failing.store(false, Ordering::SeqCst);
    env.advance(600);
    eventually("the delayed retry handled", || async { env.fired() == 1 }).await;
    eventually("its row gone", || async { env.rows("saga_timeout").await == 0 }).await;
    assert_eq!(env.probe.attempts.load(Ordering::SeqCst), 2);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Issue 13, bug 2, on every store: the start message arrives twice (a client retried
/// with a new message id) and each handling requests the reminder. A timeout is keyed by
/// its type: the second request replaces the first, one row stays, and cancelling by
/// type leaves none. (`harness::a_start_that_arrives_twice_...` runs the docs' pattern.)
async fn a_start_that_arrives_twice_leaves_one_timeout(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-twice", Some(600)), 1).await;
    handled(&flows, &begin("f-twice", Some(600)), 2).await;
    assert_eq!(env.field("f-twice", "starts").await, 2);
    assert_eq!(
        env.rows("saga_timeout").await,
        1,
        "the second request replaced the first"
    );
    // Cancelled by its type, with no handle.
    flows
        .bus()
        .send_with(&Confirm, SendOptions::new().header("x-flow", "f-twice"))
        .await
        .unwrap();
    eventually("the confirmation", || async { flows.stats().completed == 3 }).await;
    assert_eq!(env.rows("saga_timeout").await, 0);
    env.advance(3600);
    eventually("settled", || async { flows.stats().running == 0 }).await;
    assert_eq!(env.fired(), 0, "no orphaned timeout fires");
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Regression (found by `courier-chaos`, issue 18): a claim that committed but whose
/// reply the dispatcher never saw (its connection dropped; or the process died before it
/// sent what it claimed) left the timeout unsent for the whole five-minute reclaim wait: a
/// 2-second timeout fired five minutes late. A claim is now confirmed once its messages
/// are sent; an unconfirmed one is taken again after 30 s.
async fn a_claim_whose_reply_was_lost_is_taken_again_after_the_lease(kind: StoreKind) {
    let env = Env::new(kind).await;
    let (flows, store) = env.start_losing(RetryPolicy::default(), 1).await;
    handled(&flows, &begin("f-lost", Some(60)), 1).await;
    env.advance_past_claims(61, &store).await;
    if !kind.one_transaction() {
        // Claimed, never sent: nothing fires within the lease.
        assert_eq!(env.fired(), 0);
        env.advance_past_claims(20, &store).await;
        assert_eq!(env.fired(), 0, "not before the lease ends");
        env.advance(11);
    }
    // (The embedded broker's file enqueues at the claim, in the claim's transaction: the
    // lost reply lost nothing.)
    eventually("the reminder", || async { env.fired() == 1 }).await;
    eventually("the reminder committed", || async {
        env.rows("saga_timeout").await == 0
    })
    .await;
    env.advance(600);
    eventually("settled", || async { flows.stats().running == 0 }).await;
    assert_eq!(env.fired(), 1, "once");
    flows.shutdown().await.unwrap();
    env.finish().await;
}

on_every_store!(
    a_claim_whose_reply_was_lost_is_taken_again_after_the_lease,
    a_timeout_that_keeps_failing_is_dead_lettered_once,
    a_timeout_the_broker_dead_letters_is_sent_a_bounded_number_of_times,
    a_timeout_waiting_for_a_delayed_retry_is_not_sent_again,
    a_start_that_arrives_twice_leaves_one_timeout,
);
