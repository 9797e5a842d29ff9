//! The PeekLock baseline's statements sent by a Rust client instead of pgbench: sqlx on the
//! bench's tokio runtime, one connection a task, no framework. Between pgbench's figure and
//! Courier's, it says how much of the difference a Rust client with sqlx costs by itself
//! (its round trips, its statement handling, tokio's wake-ups on the same cores as the
//! server) and how much is Courier's own.
//!
//! The work is `scripts/baselines/peeklock-baseline.sh`'s, statement for statement: the
//! claim in a transaction of its own (lock time and delivery count), then per message the
//! inbox insert, the saga update and the 1 KiB enqueue, the delete of the claimed messages,
//! `COMMIT`; with `savepoint`, a `SAVEPOINT` before each message's statements, as a member
//! of a commit group has (`PEEKLOCK_SAVEPOINT=1` of the script). Each statement is
//! prepared once per connection (sqlx's statement cache, as pgbench's `-M prepared`).
//! Fresh tables for each figure: 200,000 waiting messages, 10,000 saga rows.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::common::{CREATE_SAGA, Cpu, CpuMark, FILL_SAGA, SAGA_ROWS, UPDATE_SAGA, fresh_database};

/// The claim: the `per_tx` oldest unlocked messages, locked for 30 s and counted.
const CLAIM: &str = "WITH claimed AS (UPDATE q SET locked_until = now() + interval '30 seconds', \
                     deliveries = deliveries + 1 WHERE id IN (SELECT id FROM q WHERE locked_until < now() \
                     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) RETURNING id) SELECT id FROM claimed ORDER BY id";
const INBOX: &str = "INSERT INTO inbox (msg_id) VALUES ($1) ON CONFLICT DO NOTHING";
const ENQUEUE: &str = "INSERT INTO q (payload) VALUES (repeat('y', 1000))";
const DELETE: &str = "DELETE FROM q WHERE id = ANY($1)";

const SCHEMA: [&str; 8] = [
    "CREATE TABLE q (id bigserial PRIMARY KEY, payload text NOT NULL, \
     locked_until timestamptz NOT NULL DEFAULT '-infinity', deliveries integer NOT NULL DEFAULT 0)",
    "CREATE TABLE inbox (msg_id bigint PRIMARY KEY)",
    CREATE_SAGA,
    FILL_SAGA,
    "INSERT INTO q (payload) SELECT repeat('x', 1000) FROM generate_series(1, 200000)",
    "VACUUM ANALYZE q",
    "VACUUM ANALYZE saga",
    "VACUUM ANALYZE inbox",
];

/// One figure: messages a second, and the CPU a message while it ran.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) messages: f64,
    pub(crate) cpu: Cpu,
}

/// The baseline's work with `per_tx` messages a transaction (each under a savepoint of its
/// own with `savepoint`), `clients` tasks at once, each on a connection of its own, for
/// `secs` seconds in a fresh database.
pub(crate) async fn peeklock(secs: u32, clients: usize, per_tx: i64, savepoint: bool) -> Rate {
    let db = fresh_database().await;
    let options: PgConnectOptions = db.url().parse().expect("the test database's URL");
    let mut setup = options.connect().await.expect("connect to the baseline's database");
    for statement in SCHEMA {
        sqlx::query(statement).execute(&mut setup).await.unwrap();
    }
    let mut connections = Vec::with_capacity(clients);
    for _ in 0..clients {
        connections.push(options.connect().await.expect("connect a client"));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let handled = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let cpu = CpuMark::now();
    let tasks: Vec<_> = connections
        .into_iter()
        .map(|mut conn| {
            let (stop, handled) = (stop.clone(), handled.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let ids: Vec<i64> = sqlx::query_scalar(CLAIM)
                        .bind(per_tx)
                        .fetch_all(&mut conn)
                        .await
                        .unwrap();
                    assert!(!ids.is_empty(), "the baseline's queue ran dry: raise its prefill");
                    let mut tx = conn.begin().await.unwrap();
                    for &id in &ids {
                        if savepoint {
                            sqlx::query("SAVEPOINT member").execute(&mut *tx).await.unwrap();
                        }
                        sqlx::query(INBOX).bind(id).execute(&mut *tx).await.unwrap();
                        let saga = i32::try_from(id.rem_euclid(SAGA_ROWS as i64)).unwrap_or(0);
                        sqlx::query(UPDATE_SAGA).bind(saga).execute(&mut *tx).await.unwrap();
                        sqlx::query(ENQUEUE).execute(&mut *tx).await.unwrap();
                    }
                    sqlx::query(DELETE).bind(&ids).execute(&mut *tx).await.unwrap();
                    tx.commit().await.unwrap();
                    handled.fetch_add(ids.len() as u64, Ordering::Relaxed);
                }
                conn.close().await.unwrap();
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(secs.into())).await;
    stop.store(true, Ordering::Relaxed);
    let n = handled.load(Ordering::Relaxed);
    let rate = Rate {
        messages: n as f64 / start.elapsed().as_secs_f64(),
        cpu: cpu.per_message(n),
    };
    for task in tasks {
        task.await.unwrap();
    }
    // Every handled message left its inbox row and one saga increment.
    let (inbox, updates): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM inbox), (SELECT sum(state)::int8 FROM saga)")
            .fetch_one(&mut setup)
            .await
            .unwrap();
    assert_eq!(inbox, updates, "inbox rows and saga updates");
    assert!(
        inbox >= i64::try_from(n).unwrap_or(i64::MAX),
        "every counted message was committed"
    );
    setup.close().await.unwrap();
    db.drop_database().await.unwrap();
    rate
}
