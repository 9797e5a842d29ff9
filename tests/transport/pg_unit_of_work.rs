//! The one-transaction unit of work on the Postgres transport (issue 15, point 2): with
//! `PostgresTransport::store()` as the endpoint's store, completing the received message,
//! the inbox record, the handler's own writes and the messages it sent commit together,
//! with no outbox row; a failed handling leaves none of them.

use std::sync::Arc;

use courier::{
    Context, Endpoint, EntityPath, HandlerError, PostgresTransport, QueueOptions, RetryPolicy, Routes, Transport,
};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

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
