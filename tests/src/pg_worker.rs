//! An endpoint process on the Postgres transport, for the tests that run several of them
//! on one database and kill some (`tests/transport/pg_compete.rs`).
//!
//! `courier-test-pg-worker <database url> <queue> <group>`: opens the Postgres transport
//! on the database (its migrations applied already), and runs an endpoint on queue
//! `<queue>` with the transport's own store (`PostgresTransport::store`: one transaction
//! per handling), concurrency 8 and `group_commit(<group>)` (a group takes at most half
//! the handlers). Its handler of
//! [`courier_tests::CrashJob`] inserts one row `(message id, process id)` into the table
//! `effects` through `Context::transaction`, then sleeps a few milliseconds (so that a
//! run lasts long enough to be killed in the middle). Prints `READY` once started, then
//! runs until killed.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::time::Duration;

use courier::prelude::*;
use courier::{Context, PostgresTransport};

#[courier::handler]
async fn record(_job: courier_tests::CrashJob, ctx: &mut Context) -> Result<(), HandlerError> {
    let id = ctx.message_id().to_owned();
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO effects (message_id, pid) VALUES ($1, $2)")
        .bind(&id)
        .bind(i64::from(std::process::id()))
        .execute(&mut *tx)
        .await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (url, queue, group) = (&args[1], &args[2], args[3].parse::<usize>().expect("a group size"));
    let transport = PostgresTransport::builder(url)
        .migrate(false)
        .poll_interval(Duration::from_millis(250))
        .open()
        .await
        .expect("open the Postgres transport");
    let running = Endpoint::builder(queue.as_str())
        .transport(transport.clone())
        .store(transport.store())
        .concurrency(8)
        .group_commit(group)
        .handler(record)
        .start()
        .await
        .expect("start the endpoint");
    let mut out = std::io::stdout().lock();
    writeln!(out, "READY").unwrap();
    out.flush().unwrap();
    drop(out);
    std::future::pending::<()>().await;
    drop(running);
}
