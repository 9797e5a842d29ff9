//! Postgres goes away in the middle of a run of an endpoint on the Postgres transport
//! with the transport's own store (one transaction per handling, in commit groups of
//! four): every connection drops, new ones are refused for a while, then the server is
//! back. The endpoint goes on by itself; every message's effect (a row keyed by its
//! message id, written through `Context::transaction`) happens exactly once, nothing is
//! lost, nothing is left in the queue or its dead-letter queue.
//!
//! Which server goes away: when a Docker engine answers, a Postgres container of the
//! test's own ([`PgServer::container`]), stopped and started again, whatever
//! `DATABASE_URL` says. Without an engine the test never restarts the server
//! `DATABASE_URL` names (other tests use it): it works in a database of its own there and
//! takes that database away the way a restart does, for its connections: it refuses new
//! connections to it (`ALTER DATABASE ... ALLOW_CONNECTIONS false`) and terminates every
//! backend of it (`pg_terminate_backend`, the error a client gets when the server shuts
//! down) again and again for two seconds, then allows connections again. Other databases'
//! connections are not touched. What this does not cover that a real restart would: the
//! loss of what the server had not flushed (nothing committed is lost: `fsync` is the
//! server's business), and a server that comes back at another address.
//!
//! A test binary of its own, so that the outage does not slow other tests down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::{Context, PostgresTransport, RunningEndpoint};
use courier_tests::CrashJob;
use courier_tests::eventually;
use courier_tests::pg::PgServer;
use sqlx::{ConnectOptions, Connection, PgPool};

#[courier::handler]
async fn record(_job: CrashJob, ctx: &mut Context) -> Result<(), HandlerError> {
    let id = ctx.message_id().to_owned();
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (message_id) VALUES ($1)")
        .bind(&id)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The server that goes away: a container of the test's own, or the shared server where
/// only the test's database goes away.
enum Outage {
    Container(Box<PgServer>),
    Database(&'static PgServer),
}

impl Outage {
    async fn server() -> Self {
        if courier_tests::containers::engine_answers() {
            Outage::Container(Box::new(PgServer::container().await))
        } else {
            Outage::Database(PgServer::shared().await)
        }
    }

    fn server_ref(&self) -> &PgServer {
        match self {
            Outage::Container(s) => s,
            Outage::Database(s) => s,
        }
    }

    /// Takes the server (or the database `name`) away and brings it back. Returns how
    /// many backends of the database were terminated (none counted for a container).
    async fn run(&self, name: &str) -> usize {
        match self {
            Outage::Container(server) => {
                server.restart().await;
                0
            }
            Outage::Database(server) => {
                let mut admin = server.admin.connect().await.unwrap();
                let quoted = format!("\"{}\"", name.replace('"', "\"\""));
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "ALTER DATABASE {quoted} ALLOW_CONNECTIONS false"
                )))
                .execute(&mut admin)
                .await
                .unwrap();
                let until = tokio::time::Instant::now() + Duration::from_secs(2);
                let mut terminated = 0;
                while tokio::time::Instant::now() < until {
                    let ended: Vec<bool> = sqlx::query_scalar(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                         WHERE datname = $1 AND pid <> pg_backend_pid()",
                    )
                    .bind(name)
                    .fetch_all(&mut admin)
                    .await
                    .unwrap();
                    terminated += ended.into_iter().filter(|t| *t).count();
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "ALTER DATABASE {quoted} ALLOW_CONNECTIONS true"
                )))
                .execute(&mut admin)
                .await
                .unwrap();
                admin.close().await.unwrap();
                terminated
            }
        }
    }
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    // The test's own pool reconnects too: a statement on a dropped connection is tried again.
    for _ in 0..50 {
        if let Ok(n) = sqlx::query_scalar(sql).fetch_one(pool).await {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the database did not answer {sql}");
}

async fn send(running: &RunningEndpoint, jobs: std::ops::Range<u32>) {
    for n in jobs {
        let job = CrashJob { n }
            .to_envelope()
            .unwrap()
            .with_message_id(format!("job-{n}"));
        // A send during the outage fails (transient) and is sent again, with the same id.
        let mut tries = 0;
        while let Err(e) = running.bus().send_envelope("work", job.clone()).await {
            tries += 1;
            assert!(tries < 200, "the send never went through: {e}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_run_loses_nothing_and_repeats_nothing() {
    let outage = Outage::server().await;
    let db = outage.server_ref().database().await;
    let pool = db.pool().await;
    sqlx::query("CREATE TABLE effects (message_id text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let transport = PostgresTransport::builder(db.url())
        .poll_interval(Duration::from_millis(250))
        .open()
        .await
        .unwrap();
    transport
        .create_queue(
            "work",
            &QueueOptions::default()
                .lock_duration(Duration::from_secs(5))
                .max_delivery_count(100),
        )
        .await
        .unwrap();
    let running = Endpoint::builder("work")
        .transport(transport.clone())
        .store(transport.store())
        .routes(Routes::new().send::<CrashJob>("work"))
        .recoverability(RetryPolicy::none().immediate(50))
        .concurrency(8)
        .group_commit(4)
        .handler(record)
        .start()
        .await
        .unwrap();
    send(&running, 0..300).await;
    eventually("some jobs handled", || async {
        count(&pool, "SELECT count(*) FROM effects").await >= 30
    })
    .await;

    let outage = Arc::new(outage);
    let going = outage.clone();
    let name = db.name.clone();
    let down = tokio::spawn(async move { going.run(&name).await });
    send(&running, 300..400).await;
    let terminated = down.await.unwrap();
    if let Outage::Database(_) = &*outage {
        // The endpoint's connections (receivers, lock holder, LISTEN, handlings) at least.
        assert!(terminated >= 3, "the outage ended {terminated} connections");
    }
    send(&running, 400..500).await;

    let all = 500;
    eventually("every job handled", || async {
        count(&pool, "SELECT count(DISTINCT message_id) FROM effects").await == all
    })
    .await;
    eventually("the queue drained", || async {
        count(&pool, "SELECT count(*) FROM courier.message").await == 0
    })
    .await;
    running.shutdown().await.unwrap();
    assert_eq!(count(&pool, "SELECT count(*) FROM effects").await, all, "each once");
    transport.close().await;
    pool.close().await;
    if let Outage::Database(_) = &*outage {
        db.drop_now().await;
    }
}
