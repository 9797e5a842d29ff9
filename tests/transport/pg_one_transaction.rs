//! The rest of the one-transaction unit of work on the Postgres transport (issue 15,
//! point 2), piece by piece, with a fault between what used to be two steps:
//!
//! - `start()` says at info whether the unit of work is one transaction, and if not which
//!   steps are separate;
//! - saga state and timeout rows commit with the completion (a lost lock leaves neither);
//! - a delayed retry is the scheduled copy and the completion of the received message in
//!   one transaction (a lock lost before it schedules nothing);
//! - a due saga timeout is claimed and enqueued in one transaction (a failing insert
//!   leaves the claim undone).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    Begin, Clock, Context, Endpoint, EntityPath, Envelope, HandlerError, PostgresStore, PostgresTransport,
    QueueOptions, RetryPolicy, Routes, Store, Timeout, TimeoutClaim, Transport, VirtualClock,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::Semaphore;

#[path = "../endpoint/tracing_capture.rs"]
#[allow(dead_code, unreachable_pub)]
mod tracing_capture;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pgone.Job")]
struct Job {
    n: i64,
}

/// What the handler shares with its test: how often it ran, and a gate it waits at after
/// writing its row (inside its transaction), before it fails.
#[derive(Clone)]
struct Probe {
    calls: Arc<AtomicU32>,
    gate: Arc<Semaphore>,
}

/// Writes a row, waits at the gate, then fails on its first attempt.
#[courier::handler]
async fn fail_once(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    let first = ctx.attempt() == 1 && ctx.delayed_retries() == 0;
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(job.n)
        .execute(&mut *tx)
        .await?;
    probe.calls.fetch_add(1, Ordering::SeqCst);
    probe
        .gate
        .acquire()
        .await
        .map_err(|_| HandlerError::msg("the gate closed"))?
        .forget();
    if first {
        return Err(HandlerError::msg("the first attempt fails"));
    }
    Ok(())
}

struct Env {
    db: TestDatabase,
    pool: PgPool,
    clock: VirtualClock,
    transport: Arc<PostgresTransport>,
}

impl Env {
    async fn new(queues: &[&str]) -> Self {
        let (db, pool) = super::database_with_effects().await;
        let clock = VirtualClock::starting_now();
        let shared: Arc<dyn Clock> = Arc::new(clock.clone());
        let transport = Arc::new(
            PostgresTransport::from_pool(db.pool().await)
                .clock(shared)
                .open()
                .await
                .unwrap(),
        );
        for q in queues {
            transport.create_queue(q, &QueueOptions::default()).await.unwrap();
        }
        Self {
            db,
            pool,
            clock,
            transport,
        }
    }

    async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(&self.pool).await.unwrap()
    }

    /// Moves the lock of the message `id` on, as another process's receive would.
    async fn steal_lock(&self, id: &str) {
        let stolen =
            sqlx::query("UPDATE courier.message SET delivery_count = delivery_count + 1 WHERE message_id = $1")
                .bind(id)
                .execute(&self.pool)
                .await
                .unwrap();
        assert_eq!(stolen.rows_affected(), 1);
    }

    async fn finish(self) {
        self.transport.close().await;
        self.pool.close().await;
        self.db.drop_now().await;
    }
}

/// The info line of `start()`: ONE transaction with the transport's own store; with a
/// `PostgresStore` beside the transport, the steps that are separate.
#[tokio::test]
async fn the_startup_log_says_whether_the_unit_of_work_is_one_transaction() {
    // With one scoped subscriber alone, tracing computes a callsite's interest from the
    // subscriber of the thread that meets it first: another test's thread, which has
    // none, would switch the callsite off for this one too. A second one keeps the
    // interest computed over all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let capture = tracing_capture::Capture::default();
    let _guard = tracing::subscriber::set_default(capture.subscriber());
    let env = Env::new(&["one", "beside"]).await;
    let lines = |endpoint: &str| -> Vec<tracing_capture::CapturedEvent> {
        capture
            .events()
            .into_iter()
            .filter(|e| {
                e.level == tracing::Level::INFO
                    && e.message.starts_with("unit of work")
                    && e.fields.get("endpoint").map(String::as_str) == Some(endpoint)
            })
            .collect()
    };

    let one = Endpoint::builder("one")
        .transport(env.transport.clone())
        .store(env.transport.store())
        .handler(fail_once)
        .start()
        .await
        .unwrap();
    let said = lines("one");
    assert_eq!(said.len(), 1, "{:?}", capture.events());
    let text = &said[0].message;
    assert!(text.contains("ONE postgres-transport transaction"), "{text}");
    for piece in [
        "completion of the received message",
        "inbox",
        "handler's writes",
        "saga state and timeouts",
        "sends and publishes",
        "delayed retry",
    ] {
        assert!(text.contains(piece), "{piece:?} missing: {text}");
    }
    assert_eq!(said[0].fields.get("one_transaction").map(String::as_str), Some("true"));
    one.shutdown().await.unwrap();

    let beside = Endpoint::builder("beside")
        .transport(env.transport.clone())
        .store(Arc::new(PostgresStore::from_pool(env.pool.clone())))
        .handler(fail_once)
        .start()
        .await
        .unwrap();
    let said = lines("beside");
    assert_eq!(said.len(), 1, "{:?}", capture.events());
    let text = &said[0].message;
    assert!(!text.contains("ONE"), "{text}");
    for piece in [
        "separate steps",
        "dispatching the outbox to postgres",
        "completing the received message",
        "sending due saga timeouts",
        "delayed retry",
    ] {
        assert!(text.contains(piece), "{piece:?} missing: {text}");
    }
    assert_eq!(said[0].fields.get("one_transaction").map(String::as_str), Some("false"));
    beside.shutdown().await.unwrap();
    env.finish().await;
}

/// A delayed retry on the transport's own store: the scheduled copy and the completion of
/// the received message are one transaction. When the lock was lost before it (another
/// process has the message), nothing is scheduled: before, the copy was sent and the
/// completion then failed, so the message was there twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_retry_is_scheduled_with_the_completion_or_not_at_all() {
    let env = Env::new(&["jobs"]).await;
    let probe = Probe {
        calls: Arc::new(AtomicU32::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let jobs = Endpoint::builder("jobs")
        .transport(env.transport.clone())
        .store(env.transport.store())
        .clock(Arc::new(env.clock.clone()))
        .routes(Routes::new().send::<Job>("jobs"))
        .state(probe.clone())
        .handler(fail_once)
        .recoverability(RetryPolicy::none().delayed([Duration::from_secs(10)]))
        .concurrency(1)
        .start()
        .await
        .unwrap();
    let queue = EntityPath::queue("jobs");

    // The lock is lost while the handler runs: its failure schedules nothing.
    let mut job = courier::Message::to_envelope(&Job { n: 1 }).unwrap();
    job.message_id = "job-1".into();
    env.transport
        .sender("jobs", courier::SenderOptions::default())
        .await
        .unwrap()
        .send(job)
        .await
        .unwrap();
    eventually("the handler wrote", || async {
        probe.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    env.steal_lock("job-1").await;
    probe.gate.add_permits(1);
    eventually("the handling ended", || async { jobs.stats().running == 0 }).await;
    let counts = env.transport.counts(&queue).await.unwrap();
    assert_eq!(counts.scheduled, 0, "no copy was scheduled");
    assert_eq!(counts.active, 1, "the message stays, for whoever holds its lock");
    assert_eq!(jobs.stats().retried, 0);
    assert_eq!(env.count("SELECT count(*) FROM effects").await, 0);

    // Its lock expires; this time the failure schedules the copy and completes the
    // message together; the copy, due 10 s later, is handled.
    env.clock.advance(Duration::from_secs(61));
    probe.gate.add_permits(10);
    eventually("the delayed retry scheduled", || async {
        let c = env.transport.counts(&queue).await.unwrap();
        c.scheduled == 1 && c.active == 0
    })
    .await;
    assert_eq!(jobs.stats().retried, 1);
    env.clock.advance(Duration::from_secs(11));
    eventually("the retry handled", || async { jobs.stats().completed == 1 }).await;
    assert_eq!(env.count("SELECT count(*) FROM effects").await, 1, "once");
    let counts = env.transport.counts(&queue).await.unwrap();
    assert_eq!((counts.active, counts.scheduled, counts.dead_lettered), (0, 0, 0));
    jobs.shutdown().await.unwrap();
    env.finish().await;
}

/// Saga state and timeout rows are written in the handling's transaction: when the
/// completion's fence fails (the lock was lost), neither is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saga_state_and_timeouts_commit_with_the_completion() {
    let env = Env::new(&["flows"]).await;
    let store = env.transport.store();
    let send = |id: &'static str| {
        let transport = env.transport.clone();
        async move {
            let sender = transport
                .sender("flows", courier::SenderOptions::default())
                .await
                .unwrap();
            sender.send(Envelope::new("{}").with_message_id(id)).await.unwrap();
        }
    };
    let receiver = env.transport.receiver(&EntityPath::queue("flows")).await.unwrap();
    for (id, steal) in [("m-lost", true), ("m-kept", false)] {
        send(id).await;
        let delivery = receiver
            .receive(1, Duration::from_secs(5))
            .await
            .unwrap()
            .pop()
            .unwrap();
        let now = env.clock.now();
        let Begin::Fresh(mut work) = store.begin("flows", id, delivery.lock_token(), now).await.unwrap() else {
            panic!("a fresh id");
        };
        work.save_saga("flow", id, "{}", 1, None, now).await.unwrap();
        let timeout = Timeout {
            id: format!("t-{id}"),
            key: None,
            due: now + chrono::Duration::seconds(30),
            envelope: Envelope::new("{}").with_message_id(format!("t-{id}")),
        };
        work.add_timeouts("flows", "flow", id, vec![timeout], now)
            .await
            .unwrap();
        if steal {
            env.steal_lock(id).await;
            let e = work.commit().await.unwrap_err();
            assert!(e.is_lock_lost(), "{e}");
        } else {
            assert_eq!(work.commit().await.unwrap(), courier::Committed::Settled);
        }
        drop(delivery);
    }
    let rows = |sql: &'static str| env.count(sql);
    assert_eq!(
        rows("SELECT count(*) FROM courier.saga WHERE correlation = 'm-lost'").await,
        0
    );
    assert_eq!(
        rows("SELECT count(*) FROM courier.saga_timeout WHERE correlation = 'm-lost'").await,
        0
    );
    assert_eq!(
        rows("SELECT count(*) FROM courier.saga WHERE correlation = 'm-kept'").await,
        1
    );
    assert_eq!(
        rows("SELECT count(*) FROM courier.saga_timeout WHERE correlation = 'm-kept'").await,
        1
    );
    env.finish().await;
}

/// Claims as the timeout dispatcher of an endpoint on this transport does.
fn claim(now: chrono::DateTime<chrono::Utc>) -> TimeoutClaim {
    TimeoutClaim {
        now,
        marked_at: now - chrono::Duration::seconds(270),
        due_until: now + chrono::Duration::seconds(1),
        reclaim_before: now - chrono::Duration::minutes(5),
        limit: 10,
        max_dispatches: courier::DEFAULT_MAX_TIMEOUT_DISPATCHES,
        enqueue: true,
        history: false,
    }
}

/// A due saga timeout is claimed and enqueued in the endpoint's queue in ONE transaction:
/// nothing is handed back to send, and when the insert fails (a failing statement, as a
/// connection dropped between the two would) the claim is undone with it, so the timeout
/// is not left claimed and unsent for the reclaim wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_timeout_is_claimed_and_enqueued_in_one_transaction() {
    let env = Env::new(&["flows"]).await;
    let store = env.transport.store();
    let now = env.clock.now();
    let Begin::Fresh(mut work) = store.begin("flows", "m-1", None, now).await.unwrap() else {
        panic!("a fresh id");
    };
    for n in 1..=2 {
        let timeout = Timeout {
            id: format!("t-{n}"),
            key: None,
            due: now + chrono::Duration::seconds(10),
            envelope: Envelope::new("{}").with_message_id(format!("t-{n}")),
        };
        work.add_timeouts("flows", "flow", &format!("c-{n}"), vec![timeout], now)
            .await
            .unwrap();
    }
    work.commit().await.unwrap();
    env.clock.advance(Duration::from_secs(10));

    // The insert fails: the claim rolls back with it.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER refuse BEFORE INSERT ON courier.message FOR EACH ROW EXECUTE FUNCTION refuse()",
    )
    .execute(&env.pool)
    .await
    .unwrap();
    let failed = store.claim_due_timeouts("flows", claim(env.clock.now())).await;
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        env.count("SELECT count(*) FROM courier.saga_timeout WHERE dispatched_at IS NULL AND dispatches = 0")
            .await,
        2,
        "neither is claimed"
    );

    sqlx::query("DROP TRIGGER refuse ON courier.message")
        .execute(&env.pool)
        .await
        .unwrap();
    let due = store.claim_due_timeouts("flows", claim(env.clock.now())).await.unwrap();
    assert_eq!(due.claimed, 2);
    assert!(due.to_send.is_empty(), "nothing left to send: {:?}", due.to_send);
    let counts = env.transport.counts(&EntityPath::queue("flows")).await.unwrap();
    assert_eq!(counts.active, 2, "enqueued in the claiming transaction");
    assert_eq!(
        env.count("SELECT count(*) FROM courier.saga_timeout WHERE dispatched_at IS NOT NULL AND dispatches = 1")
            .await,
        2
    );
    env.finish().await;
}
