//! The one-transaction unit of work on the Postgres transport (issue 15, point 2): with
//! `PostgresTransport::store()` as the endpoint's store, completing the received message,
//! the inbox record, the handler's own writes and the messages it sent commit together,
//! with no outbox row; a failed handling leaves none of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use courier::{
    Context, Endpoint, EntityPath, HandlerError, PostgresTransport, QueueOptions, RetryPolicy, Routes, RunningEndpoint,
    Transport,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::Semaphore;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.Job")]
pub(crate) struct Job {
    pub(crate) n: i64,
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.Done")]
pub(crate) struct Done {
    n: i64,
}

/// Writes the job into the application's table and sends `Done`; a negative job fails
/// after both.
#[courier::handler]
pub(crate) async fn record(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
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

/// A database of its own with the application's table `effects`, and a Postgres
/// transport on it with `queues` created.
async fn setup(queues: &[&str]) -> (TestDatabase, PgPool, Arc<PostgresTransport>) {
    let (db, pool) = super::database_with_effects().await;
    let transport = Arc::new(PostgresTransport::from_pool(pool.clone()).open().await.unwrap());
    for q in queues {
        transport.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    (db, pool, transport)
}

/// The endpoint `jobs` on `transport` with the transport's store: [`record`], its `Done`
/// sent to the queue `done`, no retries, `group` messages a transaction (1: each alone).
pub(crate) async fn jobs_endpoint(transport: &Arc<PostgresTransport>, group: usize) -> RunningEndpoint {
    Endpoint::builder("jobs")
        .transport(transport.clone())
        .store(transport.store())
        .routes(Routes::new().send::<Job>("jobs").send::<Done>("done"))
        .handler(record)
        .recoverability(RetryPolicy::none())
        .group_commit(group)
        .start()
        .await
        .unwrap()
}

/// Waits until the queue `jobs` holds `n` dead letters.
async fn jobs_dead_lettered(transport: &PostgresTransport, n: u64, what: &str) {
    eventually(what, || async {
        transport
            .counts(&EntityPath::queue("jobs"))
            .await
            .unwrap()
            .dead_lettered
            == n
    })
    .await;
}

/// Closes what `setup` opened and drops the database.
async fn finish(db: TestDatabase, pool: PgPool, transport: &PostgresTransport) {
    transport.close().await;
    pool.close().await;
    db.drop_now().await;
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

/// No connection of this database sits in a transaction, open or aborted, once the
/// handlings are over: the store ends every one it began (a connection back in the pool
/// inside a transaction would run the next user's statements in it).
async fn no_connection_left_in_a_transaction(pool: &PgPool) {
    eventually("no connection left in a transaction", || async {
        count(
            pool,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
             AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'",
        )
        .await
            == 0
    })
    .await;
}

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "pguow.Nested")]
struct Nested {
    n: i64,
}

/// Uses the handling's connection as an application would: a transaction of its own on it
/// (sqlx makes it a savepoint of the handling's), one rolled back and one committed.
#[courier::handler]
async fn record_nested(job: Nested, ctx: &mut Context) -> Result<(), HandlerError> {
    use sqlx::Connection as _;
    let conn = ctx.transaction::<sqlx::Postgres>()?;
    let mut undone = conn.begin().await?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(-job.n)
        .execute(&mut *undone)
        .await?;
    undone.rollback().await?;
    let mut kept = conn.begin().await?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(job.n)
        .execute(&mut *kept)
        .await?;
    kept.commit().await?;
    Ok(())
}

/// A message id of quotes, backslashes, SQL and non-ASCII letters is recorded in the inbox
/// as it is; a second message with the same id is recognised as a duplicate and completed
/// without a handling; a handler's own transactions on the handling's connection are
/// savepoints of it (sqlx counts the handling's transaction), so a handler's `commit`
/// does not commit the handling; and no connection goes back to the pool inside a
/// transaction. (Written for an attempt at sending the inbox record with `BEGIN` in one
/// simple query, its texts spelled out in SQL; kept as the guard of whatever the store's
/// begin becomes.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_message_ids_duplicates_and_a_handlers_own_transactions() {
    let (db, pool, transport) = setup(&["nested"]).await;
    let nested = Endpoint::builder("nested")
        .transport(transport.clone())
        .store(transport.store())
        .routes(Routes::new().send::<Nested>("nested"))
        .handler(record_nested)
        .recoverability(RetryPolicy::none())
        .start()
        .await
        .unwrap();

    let id = "it's \\x27 '); DROP TABLE effects; -- \u{e9}t\u{e9} \u{1f4e8}";
    let sender = transport
        .sender("nested", courier::SenderOptions::default())
        .await
        .unwrap();
    for n in [5, 6] {
        let mut m = courier::Envelope::new(format!("{{\"n\":{n}}}"));
        m.message_id = id.to_owned();
        m.message_type = Some("pguow.Nested".into());
        m.content_type = Some("application/json".into());
        sender.send(m).await.unwrap();
        eventually("the message handled or found a duplicate", || async {
            transport.counts(&EntityPath::queue("nested")).await.unwrap().active == 0 && nested.stats().running == 0
        })
        .await;
    }
    let recorded: Vec<String> = sqlx::query_scalar("SELECT message_id FROM courier.inbox")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(recorded, vec![id.to_owned()], "the id recorded as it is, once");
    let effects: Vec<i64> = sqlx::query_scalar("SELECT n FROM effects ORDER BY n")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        effects,
        vec![5],
        "the savepoint rolled back, the other kept, the duplicate not handled"
    );
    assert_eq!(nested.stats().completed, 2, "the duplicate completed too");
    assert_eq!(
        transport
            .counts(&EntityPath::queue("nested"))
            .await
            .unwrap()
            .dead_lettered,
        0
    );
    no_connection_left_in_a_transaction(&pool).await;

    nested.shutdown().await.unwrap();
    finish(db, pool, &transport).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_inbox_writes_and_sends_commit_in_one_transaction() {
    let (db, pool, transport) = setup(&["jobs", "done"]).await;
    let jobs = jobs_endpoint(&transport, 1).await;

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
    jobs_dead_lettered(&transport, 1, "the failed job dead-lettered").await;
    assert_eq!(count(&pool, "SELECT count(*) FROM effects WHERE n = -1").await, 0);
    assert_eq!(
        transport.counts(&done).await.unwrap().active,
        1,
        "no Done of the failed job"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM courier.inbox").await, 1);

    jobs.shutdown().await.unwrap();
    finish(db, pool, &transport).await;
}

/// The lock of the message is lost while its handler runs (another process locked it
/// again: its delivery count moved on). The completion at the commit fails, so the
/// handler's write and its send roll back with it: with an outbox store they would have
/// been committed before the completion failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_before_the_commit_leaves_no_effect() {
    lock_lost_leaves_no_effect(false).await;
}

/// The same once the destination's id is known (an earlier handling sent to it): the send
/// and the fenced completion are then one statement, and a lost lock still rolls back
/// the send with everything else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_before_a_send_with_its_completion_leaves_no_effect() {
    lock_lost_leaves_no_effect(true).await;
}

/// `known`: a first handling sends to `done` and commits before the one whose lock is
/// lost.
async fn lock_lost_leaves_no_effect(known: bool) {
    let (db, pool, transport) = setup(&["gated", "done"]).await;
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

    let earlier = i64::from(known);
    if known {
        probe.gate.add_permits(1);
        gated.bus().send(&GatedJob { n: 6 }).await.unwrap();
        eventually("the first handling committed", || async {
            gated.stats().completed == 1
        })
        .await;
    }
    gated.bus().send(&GatedJob { n: 7 }).await.unwrap();
    eventually("the handler wrote and sent", || async {
        probe.calls.load(Ordering::SeqCst) == 1 + u32::from(known)
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

    assert_eq!(gated.stats().completed, earlier as u64, "the completion failed");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM effects").await,
        earlier,
        "the write rolled back"
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM courier.inbox").await,
        earlier,
        "the inbox record too"
    );
    assert_eq!(
        transport.counts(&EntityPath::queue("done")).await.unwrap().active,
        earlier as u64,
        "and the send"
    );
    assert_eq!(
        transport.counts(&EntityPath::queue("gated")).await.unwrap().active,
        1,
        "the message stays, for whoever holds its lock now"
    );
    no_connection_left_in_a_transaction(&pool).await;

    gated.shutdown().await.unwrap();
    finish(db, pool, &transport).await;
}

/// A destination queue deleted and made again after a handling sent to it (its id kept
/// by the store): the next handling's send finds no queue under the kept id, looks the
/// name up again and sends to the new queue, completing its message once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_to_a_queue_made_again_goes_to_the_new_queue() {
    let (db, pool, transport) = setup(&["jobs", "done"]).await;
    let jobs = jobs_endpoint(&transport, 1).await;
    let done = EntityPath::queue("done");
    jobs.bus().send(&Job { n: 1 }).await.unwrap();
    eventually("the first handling", || async { jobs.stats().completed == 1 }).await;
    transport.delete(&done).await.unwrap();
    transport.create_queue("done", &QueueOptions::default()).await.unwrap();

    jobs.bus().send(&Job { n: 2 }).await.unwrap();
    eventually("the second handling", || async { jobs.stats().completed == 2 }).await;
    assert_eq!(
        transport.counts(&done).await.unwrap().active,
        1,
        "its Done, in the new queue"
    );
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, 2);
    assert_eq!(
        transport.counts(&EntityPath::queue("jobs")).await.unwrap().active,
        0,
        "both completed"
    );
    assert_eq!(
        transport
            .counts(&EntityPath::queue("jobs"))
            .await
            .unwrap()
            .dead_lettered,
        0
    );

    // Deleted and not made again: the send fails, and nothing of the handling commits.
    transport.delete(&done).await.unwrap();
    jobs.bus().send(&Job { n: 3 }).await.unwrap();
    jobs_dead_lettered(&transport, 1, "the third job dead-lettered").await;
    assert_eq!(count(&pool, "SELECT count(*) FROM effects WHERE n = 3").await, 0);
    assert_eq!(jobs.stats().completed, 2);
    no_connection_left_in_a_transaction(&pool).await;
    jobs.shutdown().await.unwrap();
    finish(db, pool, &transport).await;
}

/// A batch's transaction on the transport's own store completes every member in one
/// statement, fenced by every lock (a batch that sends nothing): all three complete with
/// their inbox records; and when one member's lock moved on (`stolen`: its index), the
/// commit fails with `LockLost` and nothing of the batch stays.
async fn batch_completion(stolen: Option<usize>) {
    use courier::Store;
    let (_db, pool, transport) = setup(&["jobs"]).await;
    let sender = transport
        .sender("jobs", courier::SenderOptions::default())
        .await
        .unwrap();
    for n in 0..3 {
        sender
            .send(courier::Message::to_envelope(&Job { n }).unwrap())
            .await
            .unwrap();
    }
    let receiver = transport.receiver(&EntityPath::queue("jobs")).await.unwrap();
    let mut received = Vec::new();
    while received.len() < 3 {
        received.extend(receiver.receive(3, std::time::Duration::from_secs(5)).await.unwrap());
    }
    received.sort_by_key(|d| d.message().envelope.message_id.clone());
    if let Some(i) = stolen {
        // Another process's lock: the row's delivery count moves on.
        let moved = sqlx::query("UPDATE courier.message SET delivery_count = delivery_count + 1 WHERE message_id = $1")
            .bind(&received[i].message().envelope.message_id)
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(moved.rows_affected(), 1);
    }
    let members = received
        .iter()
        .map(|d| (d.message().envelope.message_id.clone(), d.lock_token()))
        .collect();
    let store = transport.store();
    let begun = store.begin_batch("jobs", members, chrono::Utc::now()).await.unwrap();
    let committed = begun.work.expect("three fresh members").commit().await;
    let active = transport.counts(&EntityPath::queue("jobs")).await.unwrap().active;
    let inbox = count(&pool, "SELECT count(*) FROM courier.inbox").await;
    match stolen {
        None => {
            committed.unwrap();
            assert_eq!((active, inbox), (0, 3), "every member completed, each recorded");
        }
        Some(i) => {
            let e = committed
                .err()
                .unwrap_or_else(|| panic!("member {i}'s lock was lost, yet the batch committed"));
            assert!(matches!(e.kind(), courier::ErrorKind::LockLost), "{e}");
            assert_eq!((active, inbox), (3, 0), "no member completed, no inbox record stayed");
        }
    }
    no_connection_left_in_a_transaction(&pool).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_completes_every_member_in_its_transaction() {
    batch_completion(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_first_lock_was_lost_commits_nothing() {
    batch_completion(Some(0)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_last_lock_was_lost_commits_nothing() {
    batch_completion(Some(2)).await;
}
