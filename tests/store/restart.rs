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

use courier::{Context, Embedded, Endpoint, HandlerError, PostgresStore, RetryPolicy, Routes, Store};
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

async fn effects(store: &PostgresStore) -> Option<(i64, i64)> {
    sqlx::query_as("SELECT count(*), count(DISTINCT n) FROM effects")
        .fetch_one(store.pool())
        .await
        .ok()
}

/// What the test restarts.
enum Restart {
    Container(PgServer),
    Connections,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_run_loses_no_job_and_repeats_no_effect() {
    let (restart, db): (Restart, TestDatabase) = if containers::engine_answers() {
        let server = PgServer::container().await;
        let db = server.database().await;
        (Restart::Container(server), db)
    } else {
        (Restart::Connections, TestDatabase::create().await)
    };
    let store = PostgresStore::from_pool(db.pool().await);
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE effects (n bigint NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let broker = Arc::new(Embedded::builder().in_memory().open().await.unwrap());
    let running = Endpoint::builder("pg-restart")
        .transport(broker)
        .store(Arc::new(store.clone()))
        .routes(Routes::new().send::<RestartJob>("pg-restart"))
        .handler(record)
        // Enough retries, far enough apart, to outlast the restart (a few seconds).
        .recoverability(RetryPolicy::default().immediate(2).delayed_linear(30, Duration::from_millis(500)))
        .concurrency(8)
        .start()
        .await
        .unwrap();

    // Queued before the restart, most of them still waiting when it comes.
    let total = 1000;
    for n in 0..total {
        running.bus().send(&RestartJob { n }).await.unwrap();
    }
    courier_tests::eventually("some jobs handled", || async {
        effects(&store).await.is_some_and(|(_, d)| d >= 20)
    })
    .await;
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
    let after_restart = effects(&store).await.map_or(0, |(_, d)| d);
    assert!(after_restart < i64::from(total), "the restart came after the last job, not mid-run");

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some((all, distinct)) = effects(&store).await {
            assert_eq!(all, distinct, "a job had its effect twice");
            if distinct == i64::from(total) {
                break;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every job had its effect within 60 s of the restart: {:?}",
            effects(&store).await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = running.stats();
    running.shutdown().await.unwrap();
    eprintln!("postgres restart: {total} jobs, {after_restart} done before the restart; {stats:?}");
    db.drop_now().await;
    if let Restart::Container(server) = restart
        && let Some(container) = server.container
    {
        container.rm().await.unwrap();
    }
}
