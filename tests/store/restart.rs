//! Postgres restarts in the middle of a run: the endpoint's store connections drop, the
//! handlings that fail meanwhile are retried, and once the server is back every job has
//! had its effect exactly once.
//!
//! The server restarted is one the test started: a Postgres container of its own
//! (stopped and started again, its data kept). Without a Docker engine the test never
//! restarts the server `DATABASE_URL` names: it ends every connection to its own database
//! instead (`pg_terminate_backend`), which is what the endpoint sees of a restart.

use std::sync::Arc;
use std::time::Duration;

use courier::{
    Context, Embedded, Endpoint, HandlerError, Message, PostgresStore, QueueOptions, RetryPolicy, Routes,
    SenderOptions, Store, Transport,
};
use courier_tests::containers;
use courier_tests::pg::{PgServer, TestDatabase};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "store.RestartJob")]
struct RestartJob {
    n: u32,
}

/// One row per handling that committed: a repeated effect shows as a second row.
#[courier::handler]
async fn record(job: RestartJob, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (n) VALUES ($1)")
        .bind(i64::from(job.n))
        .execute(&mut *tx)
        .await?;
    Ok(())
}

async fn effects(pool: &sqlx::PgPool) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT count(*), count(DISTINCT n) FROM effects")
        .fetch_one(pool)
        .await
        .ok()
}

/// What the test restarts.
enum Restart {
    Container(Box<PgServer>),
    Connections,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_run_loses_no_job_and_repeats_no_effect() {
    let (restart, db): (Restart, TestDatabase) = if containers::engine_answers() {
        let server = PgServer::container().await;
        let db = server.database().await;
        (Restart::Container(Box::new(server)), db)
    } else {
        (Restart::Connections, TestDatabase::create().await)
    };
    let store = PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    // The test's own connections: the store's are busy with the handlings.
    let probe = db.pool().await;
    let broker = Arc::new(Embedded::builder().in_memory().open().await.unwrap());
    let routes = || Routes::new().send::<RestartJob>("pg-restart");
    broker
        .create_queue("pg-restart", &QueueOptions::default())
        .await
        .unwrap();
    // Queued before the endpoint starts, so that most of them still wait when the
    // restart comes.
    let total = 1000;
    let sender = broker.sender("pg-restart", SenderOptions::default()).await.unwrap();
    let batch = (0..total).map(|n| RestartJob { n }.to_envelope().unwrap()).collect();
    sender.send_batch(batch).await.unwrap();
    let running = Endpoint::builder("pg-restart")
        .transport(broker)
        .store(Arc::new(store.clone()))
        .routes(routes())
        .handler(record)
        // Enough retries, far enough apart, to outlast the restart (a few seconds).
        .recoverability(
            RetryPolicy::default()
                .immediate(2)
                .delayed_linear(30, Duration::from_millis(500)),
        )
        .concurrency(8)
        .start()
        .await
        .unwrap();
    courier_tests::eventually("some jobs handled", || async {
        effects(&probe).await.is_some_and(|(_, d)| d >= 20)
    })
    .await;
    let before_restart = effects(&probe).await.map_or(0, |(_, d)| d);
    assert!(
        before_restart < i64::from(total),
        "every job was done before the restart began"
    );
    match &restart {
        Restart::Container(server) => server.restart().await,
        Restart::Connections => {
            let admin = sqlx::PgPool::connect_with(db.options.clone().database("postgres"))
                .await
                .unwrap();
            sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
                .bind(&db.name)
                .execute(&admin)
                .await
                .unwrap();
            admin.close().await;
        }
    }

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((all, distinct)) = effects(&probe).await {
            assert_eq!(all, distinct, "a job had its effect twice");
            if distinct == i64::from(total) {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every job had its effect within 60 s of the restart: {:?}",
            effects(&probe).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = running.stats();
    running.shutdown().await.unwrap();
    eprintln!("postgres restart: {total} jobs, {before_restart} done before the restart; {stats:?}");
    db.drop_now().await;
    if let Restart::Container(server) = restart
        && let Some(container) = server.container
    {
        container.rm().await.unwrap();
    }
}
