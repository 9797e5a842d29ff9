//! The `rabbitmq-sessions` workload (issue 35): ordered sessions on RabbitMQ under faults.
//!
//! The driver sends `--sessions` sessions of `--per-session` messages `Step { session,
//! seq }`, each with its session id and a fixed message id, interleaved (the first of
//! every session, then the second of every session, ...), each session's messages in
//! send order. Worker processes run an endpoint of concurrency 8 on the session queue
//! with a Postgres store. For each call the handler
//!
//! 1. writes a *start* row outside the handling's transaction (autocommit, a pool of its
//!    own): the session, the number, the worker's pid, the attempt, the database's
//!    `clock_timestamp()`, and whether the session's previous message was committed when
//!    the statement began (`prev_committed`, read from the committed rows) and whether
//!    this one already was (`own_committed`);
//! 2. sleeps 20 ms, so that an overlap would show and a kill can land in the middle;
//! 3. writes a *done* row in the handling's transaction (`ctx.transaction()`, committed
//!    with the inbox record, or not at all): the same, with `finished_at` and
//!    `prev_committed` read inside the transaction.
//!
//! Start rows of attempts in killed processes stay; done rows exist only for committed
//! handlings. `session_run.rs` drives the run and checks the rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::prelude::*;
use courier::{Bus, QueueOptions, RetryPolicy, SendOptions, Store, Transport};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::setup::Place;
use crate::{Error, fail};

/// How long the handler works between its start row and its done row.
const WORK: Duration = Duration::from_millis(20);

/// The tables of the workload, made by the driver before any worker starts.
pub const CREATE: &str = "\
CREATE TABLE IF NOT EXISTS chaos_session_starts (\
  id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL, seq INT NOT NULL, pid INT NOT NULL, \
  attempt INT NOT NULL, started_at TIMESTAMPTZ NOT NULL, prev_committed BOOLEAN NOT NULL, \
  own_committed BOOLEAN NOT NULL);\
CREATE TABLE IF NOT EXISTS chaos_session_done (\
  id BIGSERIAL PRIMARY KEY, session TEXT NOT NULL, seq INT NOT NULL, pid INT NOT NULL, \
  started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ NOT NULL, prev_committed BOOLEAN NOT NULL);\
CREATE INDEX IF NOT EXISTS chaos_session_done_key ON chaos_session_done (session, seq);\
CREATE INDEX IF NOT EXISTS chaos_session_starts_key ON chaos_session_starts (session, seq);";

/// One message of a session: its session and its number in it (0, 1, ...).
#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "chaos.SessionStep")]
pub struct Step {
    /// The session (`s-0042`), also the message's session id.
    pub session: String,
    /// Its number in the session, in send order.
    pub seq: i32,
}

/// The name of session `n`.
pub fn session(n: u64) -> String {
    format!("s-{n:04}")
}

/// What the handler reads with `ctx.state`: the pool its start rows go through (not the
/// handling's transaction), and this process's id.
struct Starts {
    pool: PgPool,
    pid: i32,
}

/// The routes of the workload: the steps go to the session queue itself.
pub fn routes(queue: &str) -> Routes {
    Routes::new().send::<Step>(queue)
}

/// Records the start (autocommit), works, then writes the done row in the handling's
/// transaction.
#[courier::handler]
pub async fn step(msg: Step, ctx: &mut Context) -> Result<(), HandlerError> {
    let attempt = i32::try_from(ctx.attempt()).unwrap_or(i32::MAX);
    let (pool, pid) = {
        let starts = ctx.state::<Starts>()?;
        (starts.pool.clone(), starts.pid)
    };
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
        "INSERT INTO chaos_session_starts (session, seq, pid, attempt, started_at, prev_committed, own_committed) \
         VALUES ($1, $2, $3, $4, clock_timestamp(), \
           $2 = 0 OR EXISTS (SELECT 1 FROM chaos_session_done WHERE session = $1 AND seq = $2 - 1), \
           EXISTS (SELECT 1 FROM chaos_session_done WHERE session = $1 AND seq = $2)) \
         RETURNING started_at",
    )
    .bind(&msg.session)
    .bind(msg.seq)
    .bind(pid)
    .bind(attempt)
    .fetch_one(&pool)
    .await?;
    tokio::time::sleep(WORK).await;
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query(
        "INSERT INTO chaos_session_done (session, seq, pid, started_at, finished_at, prev_committed) \
         VALUES ($1, $2, $3, $4, clock_timestamp(), \
           $2 = 0 OR EXISTS (SELECT 1 FROM chaos_session_done WHERE session = $1 AND seq = $2 - 1))",
    )
    .bind(&msg.session)
    .bind(msg.seq)
    .bind(pid)
    .bind(started)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// The endpoint of a `rabbitmq-sessions` worker: the session queue, concurrency 8, the
/// Postgres store, retries in place only (a session queue takes no delayed retries).
pub async fn endpoint(
    place: &Place,
    transport: Arc<dyn Transport>,
    store: Arc<dyn Store>,
) -> Result<courier::EndpointBuilder, Error> {
    let Some(url) = place.postgres.as_deref() else {
        return fail("the rabbitmq-sessions configuration needs --postgres");
    };
    let pool = PgPoolOptions::new().max_connections(8).connect(url).await?;
    let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    Ok(courier::Endpoint::builder(&place.queue)
        .transport(transport)
        .store(store)
        .routes(routes(&place.queue))
        .queue_options(QueueOptions::default().requires_session(true))
        .recoverability(RetryPolicy::default().immediate(5).delayed([]))
        .state(Starts { pool, pid })
        .handler(step)
        .concurrency(8)
        .shutdown_timeout(Duration::from_secs(10)))
}

/// Sends `sessions` x `per_session` steps at `rate` a second, interleaved, each with its
/// session id and the fixed message id `<session>-<seq>`; a send that fails transiently
/// is sent again before the session's next (a copy that did arrive is dropped by the
/// inbox, and comes before the next one in its partition). Returns the transient
/// failures.
pub async fn feed(
    transport: Arc<dyn Transport>,
    queue: String,
    sessions: u64,
    per_session: u64,
    rate: u64,
) -> Result<u64, Error> {
    let bus = Bus::new(transport, routes(&queue));
    let started = Instant::now();
    let mut failures = 0;
    let mut sent: u64 = 0;
    for seq in 0..per_session {
        for s in 0..sessions {
            let name = session(s);
            let message = Step {
                session: name.clone(),
                seq: i32::try_from(seq).unwrap_or(i32::MAX),
            };
            loop {
                let options = SendOptions::new()
                    .session_id(name.clone())
                    .message_id(format!("{name}-{seq}"));
                match bus.send_with(&message, options).await {
                    Ok(_) => break,
                    Err(e) if e.is_transient() => {
                        failures += 1;
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return fail(format!("sending {name}/{seq} failed for good: {e}")),
                }
            }
            sent += 1;
            let due = started + Duration::from_secs_f64(sent as f64 / rate.max(1) as f64);
            tokio::time::sleep_until(due.into()).await;
        }
    }
    Ok(failures)
}
