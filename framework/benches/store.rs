//! An endpoint with a Postgres store next to the raw-SQL handler baseline, in one run.
//!
//! Run: `cargo bench -p courier --features postgres --bench store` (add `-- --quick` for
//! a short run; `DATABASE_URL` names a server where the user may create databases,
//! default `postgres://postgres@127.0.0.1:5432/postgres`; needs `psql`, `pgbench`, `bc`).
//!
//! Courier: messages received from the embedded broker (a file), the inbox insert, one
//! user row written through `ctx.transaction()`, one 1 KB message sent through the outbox
//! (to a queue nobody drains), the outbox row deleted after dispatch, the message
//! completed. The denominator: `scripts/baselines/pg-handler-baseline.sh`, the same
//! work as one hand-written SQL statement per message (and per ten messages), 8 clients.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::prelude::*;
use courier::{Durability, PostgresStore, Store};
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;
use tokio::sync::Notify;

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Order")]
struct Order {
    n: u64,
    payload: String,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Accepted")]
struct Accepted {
    n: u64,
    payload: String,
}

struct Progress {
    seen: AtomicU64,
    total: u64,
    done: Notify,
}

#[courier::handler]
async fn accept(order: Order, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO orders (n) VALUES ($1)")
        .bind(i64::try_from(order.n).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
    ctx.send(&Accepted {
        n: order.n,
        payload: order.payload,
    })?;
    let progress = ctx.state::<Arc<Progress>>()?;
    if progress.seen.fetch_add(1, Ordering::Relaxed) + 1 == progress.total {
        progress.done.notify_one();
    }
    Ok(())
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// Messages per second through an endpoint with `concurrency` handlers.
async fn courier_rate(n: u64, concurrency: usize) -> f64 {
    let admin: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
    let name = format!("courier_bench_{}", uuid::Uuid::new_v4().simple());
    let mut conn = admin.connect().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(u32::try_from(concurrency).unwrap() + 2)
        .connect_with(admin.clone().database(&name))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE orders (n bigint NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("broker.db"))
        .durability(Durability::Normal)
        .open()
        .await
        .unwrap();
    for q in ["work", "accepted"] {
        broker.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let sender = broker.sender("work", SenderOptions::default()).await.unwrap();
    let payload = "x".repeat(1000);
    let mut i = 0;
    while i < n {
        let batch: Vec<Envelope> = (i..(i + 100).min(n))
            .map(|k| {
                Order {
                    n: k,
                    payload: payload.clone(),
                }
                .to_envelope()
                .unwrap()
            })
            .collect();
        i += batch.len() as u64;
        sender.send_batch(batch).await.unwrap();
    }
    let progress = Arc::new(Progress {
        seen: AtomicU64::new(0),
        total: n,
        done: Notify::new(),
    });
    let start = Instant::now();
    let running = Endpoint::builder("work")
        .transport(Arc::new(broker.clone()))
        .routes(Routes::new().send::<Accepted>("accepted"))
        .store(Arc::new(store))
        .state(progress.clone())
        .concurrency(concurrency)
        .handler(accept)
        .start()
        .await
        .unwrap();
    progress.done.notified().await;
    let report = running.shutdown().await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(report.completed, n);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, i64::try_from(n).unwrap());
    broker.close().await;
    pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    rate
}

/// The baseline's two figures: one and ten messages per transaction.
fn baseline(secs: u32) -> (f64, f64) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/baselines/pg-handler-baseline.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .arg(database_url())
        .arg(secs.to_string())
        .arg("8")
        .output()
        .expect("run the baseline script");
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = |per_tx: &str| -> f64 {
        text.lines()
            .find(|l| l.contains(&format!(", {per_tx} msg/tx,")))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim_end_matches(" messages/s").parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "baseline output not understood: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    (rate("1"), rate("10"))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, secs) = if quick { (5_000, 8) } else { (20_000, 15) };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (one, ten) = baseline(secs);
    println!(
        "raw SQL baseline (pg-handler-baseline.sh, 8 clients, {secs} s): {one:.0} msg/s one per transaction, {ten:.0} msg/s ten per transaction"
    );
    for concurrency in [8, 16] {
        let rate = rt.block_on(courier_rate(n, concurrency));
        println!(
            "courier, {concurrency:>2} handlers ({n} messages): {rate:>6.0} msg/s = {:>5.1}% of one per transaction, {:>5.1}% of ten",
            rate / one * 100.0,
            rate / ten * 100.0
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}
