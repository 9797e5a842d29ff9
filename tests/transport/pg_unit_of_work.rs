//! The one-transaction unit of work on the Postgres transport (issue 15, point 2): with
//! `PostgresTransport::store()` as the endpoint's store, completing the received message,
//! the inbox record, the handler's own writes and the messages it sent commit together,
//! with no outbox row; a failed handling leaves none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use courier::{
    Context, Endpoint, EntityPath, HandlerError, PostgresTransport, QueueOptions, RetryPolicy, Routes, Transport,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::Semaphore;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.Job")]
struct Job {
    n: i64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.Done")]
struct Done {
    n: i64,
}

/// Writes the job into the application's table and sends `Done`; a negative job fails
/// after both.
#[courier::handler]
async fn record(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(job.n)
        .execute(&mut *tx)
        .await?;
    ctx.send(&Done { n: job.n })?;
    if job.n < 0 {
        return Err(HandlerError::msg("a negative job"));
    }
    Ok(())
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.GatedJob")]
struct GatedJob {
    n: i64,
}

/// What the gated handler shares with its test: how often it ran, and a gate it waits at
/// after writing its row and sending, inside its transaction.
#[derive(Clone)]
struct Probe {
    calls: Arc<AtomicU32>,
    gate: Arc<Semaphore>,
}

#[courier::handler]
async fn record_gated(job: GatedJob, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(job.n)
        .execute(&mut *tx)
        .await?;
    ctx.send(&Done { n: job.n })?;
    probe.calls.fetch_add(1, Ordering::SeqCst);
    probe
        .gate
        .acquire()
        .await
        .map_err(|_| HandlerError::msg("the gate closed"))?
        .forget();
    Ok(())
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_inbox_writes_and_sends_commit_in_one_transaction() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let transport = Arc::new(PostgresTransport::from_pool(pool.clone()).open().await.unwrap());
    for q in ["jobs", "done"] {
        transport.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let jobs = Endpoint::builder("jobs")
        .transport(transport.clone())
        .store(transport.store())
        .routes(Routes::new().send::<Job>("jobs").send::<Done>("done"))
        .handler(record)
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();

    jobs.bus().send(&Job { n: 1 }).await.unwrap();
    let done = EntityPath::queue("done");
    eventually("the sent message in its queue", || async {
        transport.counts(&done).await.unwrap().active == 1
    })
    .await;
    // Visible together: nothing of the handling commits without the rest.
    assert_eq!(count(&pool, "SELECT count(*) FROM effects WHERE n = 1").await, 1);
    assert_eq!(count(&pool, "SELECT count(*) FROM courier.inbox").await, 1);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM courier.outbox").await,
        0,
        "sent in the transaction, not through the outbox"
    );
    let left = transport.counts(&EntityPath::queue("jobs")).await.unwrap();
    assert_eq!(left.active, 0, "the received message completed");

    // Writes and sends, then fails: all of it rolled back, the message dead-lettered.
    jobs.bus().send(&Job { n: -1 }).await.unwrap();
    eventually("the failed job dead-lettered", || async {
        transport
            .counts(&EntityPath::queue("jobs"))
            .await
            .unwrap()
            .dead_lettered
            == 1
    })
    .await;
    assert_eq!(count(&pool, "SELECT count(*) FROM effects WHERE n = -1").await, 0);
    assert_eq!(
        transport.counts(&done).await.unwrap().active,
        1,
        "no Done of the failed job"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM courier.inbox").await, 1);

    jobs.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
    db.drop_now().await;
}

/// The lock of the message is lost while its handler runs (another process locked it
/// again: its delivery count moved on). The completion at the commit fails, so the
/// handler's write and its send roll back with it: with an outbox store they would have
/// been committed before the completion failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_before_the_commit_leaves_no_effect() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let transport = Arc::new(PostgresTransport::from_pool(pool.clone()).open().await.unwrap());
    for q in ["gated", "done"] {
        transport.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let probe = Probe {
        calls: Arc::new(AtomicU32::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let gated = Endpoint::builder("gated")
        .transport(transport.clone())
        .store(transport.store())
        .routes(Routes::new().send::<GatedJob>("gated").send::<Done>("done"))
        .state(probe.clone())
        .handler(record_gated)
        .recoverability(RetryPolicy::none())
        .concurrency(1)
        .start()
        .await
        .unwrap();

    gated.bus().send(&GatedJob { n: 7 }).await.unwrap();
    eventually("the handler wrote and sent", || async {
        probe.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // Another process's lock: the row's delivery count moves on.
    let stolen = sqlx::query("UPDATE courier.message SET delivery_count = delivery_count + 1 WHERE message_id IN \
         (SELECT m.message_id FROM courier.message m JOIN courier.entity e ON e.id = m.entity_id WHERE e.name = 'gated')")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(stolen.rows_affected(), 1);
    probe.gate.add_permits(1);
    eventually("the handling ended", || async { gated.stats().running == 0 }).await;

    assert_eq!(gated.stats().completed, 0, "the completion failed");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effects").await,
        0,
        "the write rolled back"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM courier.inbox").await,
        0,
        "the inbox record too"
    );
    assert_eq!(
        transport.counts(&EntityPath::queue("done")).await.unwrap().active,
        0,
        "and the send"
    );
    assert_eq!(
        transport.counts(&EntityPath::queue("gated")).await.unwrap().active,
        1,
        "the message stays, for whoever holds its lock now"
    );

    gated.shutdown().await.unwrap();
    transport.close().await;
    pool.close().await;
    db.drop_now().await;
}
