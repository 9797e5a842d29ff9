//! Sagas on the three stores: persisted state, correlation, timeouts that fire once or
//! never, completion, concurrency. The saga here is written by hand against
//! `courier::saga::Saga` (the `#[courier::saga]` macro has its own tests); the clock is
//! virtual, so an hour-long timeout takes milliseconds.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::saga::{Completion, Correlate, NotFound, Saga, SagaContext, SagaHandlers, SagaOptions, TimeoutHandle};
use courier::{
    BoxFuture, Clock, Endpoint, EndpointBuilder, EntityPath, HandlerError, Message as _, RetryPolicy, Routes,
    RunningEndpoint, SendOptions, SenderOptions,
};
mod counting;
mod crash;
mod harness;

use counting::CountingClaims;

use courier_tests::eventually;
use courier_tests::stores::{StoreEnv, StoreKind};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.Begin")]
struct Begin {
    id: String,
    /// Request a reminder after this many seconds.
    remind_after: Option<u64>,
    /// Request two reminders due at the same time; the first to fire completes the saga.
    twice: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.Bump")]
struct Bump {
    id: String,
}

/// Correlated by the `x-flow` header.
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.Confirm")]
struct Confirm;

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.Finish")]
struct Finish {
    id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "saga.Remind")]
struct Remind;

/// The saga's state.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Flow {
    starts: u32,
    count: u32,
    reminders: Vec<TimeoutHandle>,
    complete_on_remind: bool,
    /// Starts that found a completed instance's marker (`SagaContext::completed_before`).
    restarts: u32,
}

/// What the test observes of the handlers.
#[derive(Default)]
struct Probe {
    fired: AtomicU32,
    /// Attempts of the reminder handler, failed ones included.
    attempts: AtomicU32,
    /// The reminder handler fails.
    failing: std::sync::atomic::AtomicBool,
    /// The reminder handler saw the timeout's seal among its headers (it must not).
    saw_seal: std::sync::atomic::AtomicBool,
    /// Two racing starts wait for each other on their first attempt (Postgres only).
    barrier: Option<tokio::sync::Barrier>,
}

impl Flow {
    async fn begin(&mut self, msg: Begin, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        if let Some(barrier) = &ctx.state::<Arc<Probe>>()?.barrier
            && ctx.attempt() == 1
        {
            barrier.wait().await;
        }
        self.starts += 1;
        if ctx.completed_before().is_some() {
            self.restarts += 1;
        }
        if let Some(secs) = msg.remind_after {
            let first = ctx.request_timeout(Duration::from_secs(secs), &Remind)?;
            self.reminders.push(first);
            if msg.twice {
                let due = ctx.clock().now() + chrono::Duration::seconds(i64::try_from(secs).unwrap());
                self.reminders
                    .push(ctx.request_timeout_keyed_at("second", due, &Remind)?);
                self.complete_on_remind = true;
            }
        }
        Ok(())
    }

    async fn bump(&mut self, _msg: Bump, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.count += 1;
        Ok(())
    }

    async fn confirm(&mut self, _msg: Confirm, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        for r in self.reminders.drain(..) {
            ctx.cancel_timeout_handle(&r);
        }
        Ok(())
    }

    async fn finish(&mut self, _msg: Finish, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }

    async fn remind(&mut self, _msg: Remind, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let probe = ctx.state::<Arc<Probe>>()?;
        probe.attempts.fetch_add(1, Ordering::SeqCst);
        if ctx.header(courier::saga::headers::TIMEOUT_SEAL).is_some() {
            probe.saw_seal.store(true, Ordering::SeqCst);
        }
        if probe.failing.load(Ordering::SeqCst) {
            return Err(HandlerError::msg("the reminder cannot be handled"));
        }
        probe.fired.fetch_add(1, Ordering::SeqCst);
        if self.complete_on_remind {
            ctx.complete();
        }
        Ok(())
    }
}

macro_rules! saga_fn {
    ($name:ident, $msg:ty) => {
        fn $name<'a, 'b>(
            s: &'a mut Flow,
            m: $msg,
            ctx: &'a mut SagaContext<'b>,
        ) -> BoxFuture<'a, Result<(), HandlerError>> {
            Box::pin(s.$name(m, ctx))
        }
    };
}

impl Saga for Flow {
    const NAME: &'static str = "tests.Flow";

    fn register(handlers: &mut SagaHandlers<Self>) {
        saga_fn!(begin, Begin);
        saga_fn!(bump, Bump);
        saga_fn!(confirm, Confirm);
        saga_fn!(finish, Finish);
        saga_fn!(remind, Remind);
        handlers
            .start("begin", Correlate::by(|m: &Begin| m.id.clone()), begin)
            .handle("bump", Correlate::by(|m: &Bump| m.id.clone()), bump)
            .handle("confirm", Correlate::header("x-flow"), confirm)
            .handle("finish", Correlate::by(|m: &Finish| m.id.clone()), finish)
            .timeout("remind", remind);
    }
}

fn routes() -> Routes {
    Routes::new()
        .send::<Begin>("flows")
        .send::<Bump>("flows")
        .send::<Confirm>("flows")
        .send::<Finish>("flows")
}

struct Env {
    env: StoreEnv,
    probe: Arc<Probe>,
}

impl Env {
    async fn new(kind: StoreKind) -> Self {
        Self::with_probe(kind, Probe::default()).await
    }

    async fn with_probe(kind: StoreKind, probe: Probe) -> Self {
        Self {
            env: StoreEnv::new(kind).await,
            probe: Arc::new(probe),
        }
    }

    fn builder(&self, options: SagaOptions) -> EndpointBuilder {
        self.builder_named("flows", options)
    }

    fn builder_named(&self, name: &str, options: SagaOptions) -> EndpointBuilder {
        let clock: Arc<dyn Clock> = Arc::new(self.env.fx.clock.clone());
        Endpoint::builder(name)
            .transport(self.env.fx.transport.clone())
            .clock(clock)
            .routes(routes())
            .store(self.env.store.clone())
            .state(self.probe.clone())
            .saga_with::<Flow>(options)
    }

    async fn start(&self) -> RunningEndpoint {
        self.builder(SagaOptions::default()).start().await.unwrap()
    }

    fn fired(&self) -> u32 {
        self.probe.fired.load(Ordering::SeqCst)
    }

    fn advance(&self, secs: u64) {
        self.env.fx.clock.advance(Duration::from_secs(secs));
    }

    async fn rows(&self, table: &str) -> i64 {
        self.env
            .count(&format!("SELECT COUNT(*) FROM {}", self.env.kind.table(table)))
            .await
    }

    /// A number in the instance's state.
    async fn field(&self, id: &str, field: &str) -> i64 {
        let sql = if self.env.kind.postgres() {
            format!("SELECT (state->>'{field}')::bigint FROM courier.saga WHERE correlation = '{id}'")
        } else {
            format!("SELECT json_extract(state, '$.{field}') FROM courier_saga WHERE correlation = '{id}'")
        };
        self.env.count(&sql).await
    }

    async fn finish(self) {
        self.env.finish().await;
    }
}

fn begin(id: &str, remind_after: Option<u64>) -> Begin {
    Begin {
        id: id.into(),
        remind_after,
        twice: false,
    }
}

/// Sends `message` and waits until the endpoint completed `n` messages in all.
async fn handled<M: courier::Message>(flows: &RunningEndpoint, message: &M, n: u64) {
    flows.bus().send(message).await.unwrap();
    eventually("the message handled", || async { flows.stats().completed >= n }).await;
}

/// The user confirms in time: the reminder is cancelled with the state change and never
/// fires, even long after its due time.
async fn confirmation_in_time_cancels_the_timeout(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-1", Some(3600)), 1).await;
    assert_eq!(
        env.rows("saga_timeout").await,
        1,
        "the reminder is stored with the saga"
    );
    flows
        .bus()
        .send_with(&Confirm, SendOptions::new().header("x-flow", "f-1"))
        .await
        .unwrap();
    eventually("the confirmation", || async { flows.stats().completed == 2 }).await;
    assert_eq!(env.rows("saga_timeout").await, 0, "cancelled in the same transaction");
    env.advance(7200);
    handled(&flows, &Bump { id: "f-1".into() }, 3).await;
    assert_eq!(env.fired(), 0);
    assert_eq!(flows.stats().timeouts_dispatched, 0);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Nobody confirms: the reminder fires once, and only once.
async fn no_confirmation_fires_the_timeout_once(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-2", Some(3600)), 1).await;
    env.advance(3599);
    handled(&flows, &Bump { id: "f-2".into() }, 2).await;
    assert_eq!(env.fired(), 0, "not before its time");
    env.advance(2);
    eventually("the reminder", || async { env.fired() == 1 }).await;
    eventually("its completion", || async { flows.stats().completed == 3 }).await;
    env.advance(7200);
    handled(&flows, &Bump { id: "f-2".into() }, 4).await;
    assert_eq!(env.fired(), 1, "once");
    assert_eq!(env.rows("saga_timeout").await, 0);
    assert_eq!(env.field("f-2", "count").await, 2);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// An endpoint given no clock of its own runs by its transport's: a program that gives a
/// virtual clock to the transport alone fires a saga's one-hour timeout by moving it.
/// (Before, the endpoint ran by the system clock: the timeout came due an hour of real
/// time later, and the test found no reminder.)
async fn the_transports_clock_drives_the_timeouts(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = Endpoint::builder("flows")
        .transport(env.env.fx.transport.clone())
        .routes(routes())
        .store(env.env.store.clone())
        .state(env.probe.clone())
        .saga::<Flow>()
        .start()
        .await
        .unwrap();
    handled(&flows, &begin("f-clock", Some(3600)), 1).await;
    env.advance(3601);
    eventually("the reminder, by the transport's clock", || async { env.fired() == 1 }).await;
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// Two reminders fire together; the first completes the saga. The second is already in
/// the queue: it is discarded, never handled.
async fn a_timeout_after_completion_is_discarded(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    let mut b = begin("f-3", Some(60));
    b.twice = true;
    handled(&flows, &b, 1).await;
    assert_eq!(env.rows("saga_timeout").await, 2);
    env.advance(61);
    eventually("one handled, one discarded", || async {
        flows.stats().timeouts_discarded == 1 && flows.stats().completed == 3
    })
    .await;
    assert_eq!(env.fired(), 1);
    assert_eq!(flows.stats().timeouts_dispatched, 2);
    assert_eq!(env.rows("saga").await, 0, "completed: the instance is gone");
    assert_eq!(env.rows("saga_timeout").await, 0);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// 100 messages to one instance at once, on one endpoint with 16 handlers and on two
/// instances of the endpoint (two processes' worth of locks): no update is lost.
async fn concurrent_messages_lose_no_update(kind: StoreKind) {
    let env = Env::new(kind).await;
    let policy = RetryPolicy::default().immediate(100).delayed([]);
    let a = env
        .builder(SagaOptions::default())
        .concurrency(16)
        .recoverability(policy.clone())
        .start()
        .await
        .unwrap();
    handled(&a, &begin("f-4", None), 1).await;
    let bumps: Vec<_> = (0..100).map(|_| Bump { id: "f-4".into() }).collect();
    for b in &bumps {
        a.bus().send(b).await.unwrap();
    }
    eventually("100 bumps", || async { a.stats().completed == 101 }).await;
    assert_eq!(env.field("f-4", "count").await, 100);
    assert_eq!(
        a.stats().saga_conflicts,
        0,
        "one process: its instance lock serializes them"
    );
    let b = env
        .builder(SagaOptions::default())
        .concurrency(16)
        .recoverability(policy)
        .start()
        .await
        .unwrap();
    for m in &bumps {
        a.bus().send(m).await.unwrap();
    }
    eventually("100 more bumps", || async {
        a.stats().completed + b.stats().completed == 201
    })
    .await;
    assert_eq!(env.field("f-4", "count").await, 200);
    assert_eq!(a.stats().dead_lettered + b.stats().dead_lettered, 0);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    env.finish().await;
}

/// Two start messages of one instance race on two endpoints (two processes' worth of
/// instance locks; the saga's instances are shared through the store): one instance is
/// created; the loser's insert conflicts, is retried and continues it.
async fn racing_starts_make_one_instance(kind: StoreKind) {
    // Only Postgres lets two transactions be inside a handler at once; SQLite serializes
    // them, so the race is settled before it starts.
    let probe = Probe {
        barrier: (kind == StoreKind::Postgres).then(|| tokio::sync::Barrier::new(2)),
        ..Probe::default()
    };
    let env = Env::with_probe(kind, probe).await;
    let a = env
        .builder_named("flows-a", SagaOptions::default())
        .start()
        .await
        .unwrap();
    let b = env
        .builder_named("flows-b", SagaOptions::default())
        .start()
        .await
        .unwrap();
    for to in ["flows-a", "flows-b"] {
        a.bus()
            .send_with(&begin("f-5", None), SendOptions::new().to(to))
            .await
            .unwrap();
    }
    eventually("both starts", || async {
        a.stats().completed + b.stats().completed == 2
    })
    .await;
    assert_eq!(env.rows("saga").await, 1, "one instance");
    assert_eq!(env.field("f-5", "starts").await, 2, "both starts applied to it");
    if kind == StoreKind::Postgres {
        assert!(a.stats().saga_conflicts + b.stats().saga_conflicts >= 1);
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    env.finish().await;
}

/// The process stops after the saga's state and timeout committed, long before the
/// timeout is due; a new process dispatches it when due, once.
async fn a_restart_keeps_the_timeout(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-6", Some(3600)), 1).await;
    // Stopped, not dropped: a dropped endpoint's dispatcher may finish the poll it is in
    // and claim the timeout just before it dies, which is the lost dispatch of
    // `a_lost_dispatch_is_reclaimed` (taken back after the send lease), not this scenario.
    flows.shutdown().await.unwrap();
    env.advance(3601);
    let again = env.start().await;
    eventually("the reminder after the restart", || async { env.fired() == 1 }).await;
    eventually("its completion", || async { again.stats().completed == 1 }).await;
    assert_eq!(env.rows("saga_timeout").await, 0);
    again.shutdown().await.unwrap();
    env.finish().await;
}

/// A dispatcher claimed a due timeout and died before sending it: the claim, never
/// confirmed sent, is taken back after the send lease (30 s) and the timeout fires, once.
async fn a_lost_dispatch_is_reclaimed(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-7", Some(60)), 1).await;
    flows.shutdown().await.unwrap();
    env.advance(61);
    let now = courier::Clock::now(&env.env.fx.clock);
    let claimed = env
        .env
        .store
        .claim_due_timeouts(
            "flows",
            courier::TimeoutClaim {
                now,
                // As the dispatcher marks a claim it has yet to send: taken back 30 s on.
                marked_at: now - chrono::Duration::seconds(270),
                due_until: now,
                reclaim_before: now - chrono::Duration::minutes(5),
                limit: 10,
                max_dispatches: courier::DEFAULT_MAX_TIMEOUT_DISPATCHES,
                // As the dispatcher of an endpoint on the store's own broker claims.
                enqueue: kind.one_transaction(),
                history: false,
            },
        )
        .await
        .unwrap();
    assert_eq!(claimed.claimed, 1);
    drop(claimed); // "crashed" before sending what it claimed
    let again = env.start().await;
    if !kind.one_transaction() {
        // Separate store: the claimed message was never sent; nothing fires until the
        // claim is taken back.
        handled(&again, &Bump { id: "f-7".into() }, 1).await;
        assert_eq!(env.fired(), 0);
        env.advance(31);
    }
    eventually("the reminder", || async { env.fired() == 1 }).await;
    // The handler ran; wait for its transaction to commit (the row goes with it) before
    // moving time: an hour's jump would otherwise expire the lock of a handling still in
    // flight, which (rightly) rolls it back and handles the timeout again.
    eventually("the reminder committed", || async {
        env.rows("saga_timeout").await == 0
    })
    .await;
    env.advance(3600);
    eventually("settled", || async { again.stats().running == 0 }).await;
    assert_eq!(env.fired(), 1, "once");
    again.shutdown().await.unwrap();
    env.finish().await;
}

/// Each commit that stores a timeout signals the dispatcher. One due far later than its
/// next wake changes nothing: no claim (a write transaction, on SQLite one more for the
/// single writer) per handled message. Before, every signal made a claim that found
/// nothing due. The timeouts still fire when due.
async fn timeouts_stored_far_ahead_cost_no_claim(kind: StoreKind) {
    let env = Env::new(kind).await;
    let store = Arc::new(CountingClaims {
        inner: env.env.store.clone(),
        claims: AtomicU32::new(0),
        lose_replies: AtomicU32::new(0),
    });
    let clock: Arc<dyn Clock> = Arc::new(env.env.fx.clock.clone());
    let flows = Endpoint::builder("flows")
        .transport(env.env.fx.transport.clone())
        .clock(clock)
        .routes(routes())
        .store(store.clone())
        .state(env.probe.clone())
        .saga::<Flow>()
        .start()
        .await
        .unwrap();
    // The dispatcher's first claim, at its start.
    eventually("the first claim", || async { store.claims.load(Ordering::SeqCst) >= 1 }).await;
    for i in 1..=10u64 {
        handled(&flows, &begin(&format!("far-{i}"), Some(3600)), i).await;
    }
    assert_eq!(env.rows("saga_timeout").await, 10);
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "no claim for timeouts due in an hour"
    );
    env.advance(3601);
    eventually("the reminders", || async { env.fired() == 10 }).await;
    eventually("their handling", || async { flows.stats().completed == 20 }).await;
    assert_eq!(env.rows("saga_timeout").await, 0);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

/// A continuing message for no instance: completed and counted by default, dead-lettered
/// with `courier.SagaNotFound` when configured.
async fn not_found_policy(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &Bump { id: "nobody".into() }, 1).await;
    assert_eq!(flows.stats().sagas_not_found, 1);
    assert_eq!(
        flows.stats().sagas_not_found_handled,
        0,
        "no not-found handler: the policy"
    );
    assert_eq!(env.rows("saga").await, 0, "a continuing message creates nothing");
    flows.shutdown().await.unwrap();
    let strict = env
        .builder(SagaOptions::new().not_found(NotFound::DeadLetter))
        .start()
        .await
        .unwrap();
    strict.bus().send(&Bump { id: "nobody".into() }).await.unwrap();
    eventually("the dead letter", || async { strict.stats().dead_lettered == 1 }).await;
    let dead = env
        .env
        .fx
        .transport
        .peek(&EntityPath::queue("flows").dead_letter(), 0, 10)
        .await
        .unwrap();
    assert_eq!(
        dead[0].broker.dead_letter_reason.as_deref(),
        Some(courier::saga::reasons::SAGA_NOT_FOUND)
    );
    strict.shutdown().await.unwrap();
    env.finish().await;
}

/// Completion deletes the instance and its timeouts, or archives the instance.
async fn completion_deletes_or_archives(kind: StoreKind) {
    let env = Env::new(kind).await;
    let flows = env.start().await;
    handled(&flows, &begin("f-8", Some(60)), 1).await;
    handled(&flows, &Finish { id: "f-8".into() }, 2).await;
    assert_eq!((env.rows("saga").await, env.rows("saga_timeout").await), (0, 0));
    assert_eq!(env.rows("saga_archive").await, 0);
    flows.shutdown().await.unwrap();
    let archiving = env
        .builder(SagaOptions::new().completion(Completion::Archive))
        .start()
        .await
        .unwrap();
    handled(&archiving, &begin("f-9", None), 1).await;
    handled(&archiving, &Bump { id: "f-9".into() }, 2).await;
    handled(&archiving, &Finish { id: "f-9".into() }, 3).await;
    assert_eq!(env.rows("saga").await, 0);
    assert_eq!(env.rows("saga_archive").await, 1);
    archiving.shutdown().await.unwrap();
    env.finish().await;
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::Sqlite).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::Postgres).await;
                }
            )*
        }
        mod embedded {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::Embedded).await;
                }
            )*
        }
        mod pg_transport {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    super::$scenario(courier_tests::stores::StoreKind::PgTransport).await;
                }
            )*
        }
    };
}

mod completed;
mod forged_timeouts;
mod history;
mod not_found_retry;
mod order;
mod sessions;
mod timeouts;
mod versions;

on_every_store!(
    confirmation_in_time_cancels_the_timeout,
    no_confirmation_fires_the_timeout_once,
    the_transports_clock_drives_the_timeouts,
    a_timeout_after_completion_is_discarded,
    concurrent_messages_lose_no_update,
    racing_starts_make_one_instance,
    a_restart_keeps_the_timeout,
    a_lost_dispatch_is_reclaimed,
    not_found_policy,
    completion_deletes_or_archives,
    timeouts_stored_far_ahead_cost_no_claim,
);

/// Mistakes in wiring a saga are refused when the endpoint starts.
#[tokio::test]
async fn a_saga_needs_a_store() {
    let fx = courier_tests::embedded_fixture().await;
    let err = Endpoint::builder("flows")
        .transport(fx.transport.clone())
        .saga::<Flow>()
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a store"), "{err}");
}

/// A saga endpoint with a group commit on Postgres. Bumps of four instances arrive in
/// rounds of `g-1 g-2 g-2 g-1 g-3 g-4 g-4 g-3`. In groups of four, one group holds two
/// messages of one instance: its members take the instance's lock in turn (the group
/// owns it). In groups of two, the groups `g-1 g-2` and `g-2 g-1` need each other's
/// instances: one gives way with a conflict and is retried. No update is lost either way.
async fn grouped_saga_messages_lose_no_update(group: usize) {
    let env = Env::new(StoreKind::Postgres).await;
    let policy = RetryPolicy::default().immediate(100).delayed([]);
    let flows = env
        .builder(SagaOptions::default())
        .concurrency(8)
        .group_commit(group)
        .recoverability(policy)
        .start()
        .await
        .unwrap();
    for id in ["g-1", "g-2", "g-3", "g-4"] {
        flows.bus().send(&begin(id, None)).await.unwrap();
    }
    eventually("four instances", || async { flows.stats().completed == 4 }).await;
    let round = ["g-1", "g-2", "g-2", "g-1", "g-3", "g-4", "g-4", "g-3"];
    let bumps: Vec<Bump> = (0..25).flat_map(|_| round.map(|id| Bump { id: id.into() })).collect();
    let sender = env
        .env
        .fx
        .transport
        .sender("flows", SenderOptions::default())
        .await
        .unwrap();
    let envelopes = bumps.iter().map(|b| b.to_envelope().unwrap()).collect();
    sender.send_batch(envelopes).await.unwrap();
    eventually("200 bumps", || async { flows.stats().completed == 204 }).await;
    for id in ["g-1", "g-2", "g-3", "g-4"] {
        assert_eq!(env.field(id, "count").await, 50, "{id}");
    }
    assert_eq!(flows.stats().dead_lettered, 0);
    flows.shutdown().await.unwrap();
    env.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_saga_messages_of_one_instance_share_its_lock() {
    grouped_saga_messages_lose_no_update(4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_saga_messages_in_crossing_groups() {
    grouped_saga_messages_lose_no_update(2).await;
}

/// A saga that handles one message type twice is refused: which correlation finds the
/// instance would be ambiguous.
#[tokio::test]
async fn a_message_type_handled_twice_is_refused() {
    #[derive(Default, Serialize, Deserialize)]
    struct Twice;
    impl Saga for Twice {
        const NAME: &'static str = "tests.Twice";
        fn register(h: &mut SagaHandlers<Self>) {
            fn noop<'a, 'b>(
                _: &'a mut Twice,
                _: Bump,
                _: &'a mut SagaContext<'b>,
            ) -> BoxFuture<'a, Result<(), HandlerError>> {
                Box::pin(async { Ok(()) })
            }
            h.start("one", Correlate::by(|m: &Bump| m.id.clone()), noop)
                .handle("two", Correlate::header("x"), noop);
        }
    }
    let env = StoreEnv::new(StoreKind::Sqlite).await;
    let err = Endpoint::builder("twice")
        .transport(env.fx.transport.clone())
        .store(env.store.clone())
        .saga::<Twice>()
        .start()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("handles saga.Bump twice"), "{err}");
}
