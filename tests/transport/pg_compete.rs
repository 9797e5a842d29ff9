//! Two endpoint processes compete on one queue of the Postgres transport, each with the
//! transport's own store (one transaction per handling; one of them with group commit),
//! and one is killed with SIGKILL in the middle of the run (issue 15, point 5: "two
//! processes competing with effects counted once"). Every message's effect (a row keyed
//! by its message id, written through `Context::transaction`) happens exactly once,
//! nothing is left active or locked in the queue, and the dead-letter queue is empty: the
//! killed process's open transactions roll back with its connections, its locks end with
//! its lock holder's connection, and the survivor takes its messages at once.
//!
//! The processes are `courier-test-pg-worker` (`tests/src/pg_worker.rs`). A test binary
//! of its own, so that the children's load does not slow other tests down.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use courier::{EntityPath, Message, PostgresTransport, QueueOptions, SenderOptions, Transport};
use courier_tests::CrashJob;
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use sqlx::PgPool;

/// A worker process, killed when dropped.
struct Worker(Child);

impl Worker {
    /// Starts a worker on `url` and waits until its endpoint has started.
    fn start(url: &str, queue: &str, group: usize) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_courier-test-pg-worker"))
            .args([url, queue, &group.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let line = BufReader::new(stdout).lines().next().unwrap().unwrap();
        assert_eq!(line, "READY");
        Self(child)
    }

    fn pid(&self) -> i64 {
        i64::from(self.0.id())
    }

    /// SIGKILL: no shutdown, no rollback of its own; its connections just drop.
    fn kill(mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn count(pool: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_compete_and_a_killed_one_loses_nothing_and_repeats_nothing() {
    const N: u32 = 600;
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    let transport = PostgresTransport::from_pool(pool.clone()).open().await.unwrap();
    sqlx::query("CREATE TABLE effects (message_id text NOT NULL, pid bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    transport
        .create_queue("work", &QueueOptions::default().lock_duration(Duration::from_secs(30)))
        .await
        .unwrap();
    let sender = transport.sender("work", SenderOptions::default()).await.unwrap();
    for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
        let batch = chunk
            .iter()
            .map(|n| {
                CrashJob { n: *n }
                    .to_envelope()
                    .unwrap()
                    .with_message_id(format!("job-{n}"))
            })
            .collect();
        sender.send_batch(batch).await.unwrap();
    }

    let url = db.url();
    let grouped = Worker::start(&url, "work", 4);
    let alone = Worker::start(&url, "work", 1);
    let victim = grouped.pid();
    eventually("both processes handled some", || async {
        let by: Vec<i64> = sqlx::query_scalar("SELECT pid FROM effects GROUP BY pid")
            .fetch_all(&pool)
            .await
            .unwrap();
        by.len() == 2 && count(&pool, "SELECT count(*) FROM effects").await >= i64::from(N / 5)
    })
    .await;
    grouped.kill();
    let at_kill = count(&pool, "SELECT count(*) FROM effects").await;
    assert!(at_kill < i64::from(N), "killed mid-run: {at_kill} of {N} done");

    let queue = EntityPath::queue("work");
    eventually("every message handled", || async {
        let c = transport.counts(&queue).await.unwrap();
        c.active == 0 && c.scheduled == 0 && c.deferred == 0
    })
    .await;
    drop(alone);

    let (rows, distinct) = (
        count(&pool, "SELECT count(*) FROM effects").await,
        count(&pool, "SELECT count(DISTINCT message_id) FROM effects").await,
    );
    assert_eq!(distinct, i64::from(N), "every message's effect happened");
    assert_eq!(rows, i64::from(N), "and only once");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM courier.inbox").await,
        i64::from(N),
        "one inbox record each"
    );
    let victim_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM effects WHERE pid = $1")
        .bind(victim)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(victim_rows > 0 && victim_rows < i64::from(N), "{victim_rows}");
    let counts = transport.counts(&queue).await.unwrap();
    assert_eq!(counts.dead_lettered, 0, "nothing dead-lettered");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM courier.message").await,
        0,
        "no row left in the queue table: none active, locked, scheduled or dead-lettered"
    );
    transport.close().await;
    pool.close().await;
    db.drop_now().await;
}
