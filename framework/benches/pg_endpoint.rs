//! Handler throughput of an endpoint with a Postgres store, next to the raw-SQL handler
//! baseline (`scripts/baselines/pg-handler-baseline.sh`), measured in the same run on the
//! same server, as ratios.
//!
//! Run: `cargo bench -p courier --features postgres --bench pg_endpoint`. Options after
//! `--`:
//! - `--quick`: a short run; `--rounds N`; `--secs S`, the baseline's seconds per figure;
//!   `--messages N`, per Courier run;
//! - `--group G`: the group commit of the grouped runs (default 4; 1 runs only the
//!   ungrouped ones);
//! - `--breakdown`: adds the same endpoint without a store, with `--bare-at N` handlers
//!   (default 8);
//! - `--async-commit`: both sides on databases with `synchronous_commit = off`, which takes
//!   the disk's flush latency out and leaves CPU and round trips;
//! - `--profile N`: one long Courier run with N handlers (and `--group G`), for a profiler;
//! - `--history`: instead of the baseline, the endpoint without a history, with one (no
//!   bodies, the default) and with one keeping bodies, alternating in the same run, 16 at
//!   once alone and with `group_commit(G)`; prints each ratio against the target of
//!   issue 33, 85% of the throughput without a history (docs/history.md, "Cost").
//!
//! `DATABASE_URL` names a server where the user may create databases (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); the baseline needs `psql`, `pgbench`
//! and `bc`.
//!
//! Courier: messages received from the embedded broker (a file, durability NORMAL), the
//! inbox insert, one user row written through `ctx.transaction()`, one 1 KB message sent
//! through the outbox to a queue nobody drains (the baseline's enqueued messages are not
//! consumed within its run either), the outbox row deleted after dispatch, the message
//! completed. Each measurement gets a fresh database (`courier_bench_<uuid>`, dropped
//! after it). The baseline does the same work as one hand-written statement per message
//! (and per ten), with 8 pgbench clients. Each round runs the baseline, then Courier with
//! 8 and 16 handlers at once, each message in a transaction of its own, then the same
//! with `group_commit(G)` and 32 at once with `group_commit(2G)`; the medians of the
//! rounds are compared.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::prelude::*;
use courier::{Durability, PostgresStore, Store};
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::Notify;

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.PlaceOrder")]
struct PlaceOrder {
    n: u64,
    payload: String,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.OrderPlaced")]
struct OrderPlaced {
    n: u64,
    payload: String,
}

/// Counts handled messages and tells the bench when the last one ran.
struct Progress {
    seen: AtomicU64,
    total: u64,
    done: Notify,
}

/// The handler: one user row in the store's transaction, one 1 KB message through the
/// outbox (the inbox record is the endpoint's).
#[courier::handler]
async fn place(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Postgres>()?;
    sqlx::query("INSERT INTO orders (n, placed_at) VALUES ($1, now())")
        .bind(i64::try_from(order.n).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await?;
    ctx.send(&OrderPlaced {
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

/// One Courier measurement.
struct Run {
    rate: f64,
    /// Postgres transactions (commits and rollbacks) in the bench database per message.
    tx_per_msg: f64,
}

/// A fresh broker file (durability NORMAL) holding `n` orders of about 1 KB in queue
/// `orders`, and the queue `placed` they send to.
async fn prefilled(n: u64) -> (Embedded, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("broker.db"))
        .durability(Durability::Normal)
        .open()
        .await
        .unwrap();
    for q in ["orders", "placed"] {
        broker.create_queue(q, &QueueOptions::default()).await.unwrap();
    }
    let sender = broker.sender("orders", SenderOptions::default()).await.unwrap();
    let payload = "x".repeat(1000);
    let mut i = 0;
    while i < n {
        let batch: Vec<Envelope> = (i..(i + 100).min(n))
            .map(|k| {
                PlaceOrder {
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
    (broker, dir)
}

/// For `--breakdown`: the same endpoint and message without a store (no inbox, no user
/// row, the message sent straight to the broker): what the broker and the runtime cost.
#[courier::handler]
async fn place_without_store(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.send(&OrderPlaced {
        n: order.n,
        payload: order.payload,
    })?;
    let progress = ctx.state::<Arc<Progress>>()?;
    if progress.seen.fetch_add(1, Ordering::Relaxed) + 1 == progress.total {
        progress.done.notify_one();
    }
    Ok(())
}

async fn without_store_run(n: u64, concurrency: usize) -> f64 {
    let (broker, _dir) = prefilled(n).await;
    let progress = Arc::new(Progress {
        seen: AtomicU64::new(0),
        total: n,
        done: Notify::new(),
    });
    let start = Instant::now();
    let running = Endpoint::builder("orders")
        .transport(Arc::new(broker.clone()))
        .routes(Routes::new().send::<OrderPlaced>("placed"))
        .state(progress.clone())
        .concurrency(concurrency)
        .handler(place_without_store)
        .start()
        .await
        .unwrap();
    progress.done.notified().await;
    let report = running.shutdown().await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(report.completed, n);
    broker.close().await;
    rate
}

/// Drains `n` messages through an endpoint with `concurrency` handlers (default prefetch)
/// and a `PostgresStore` on a fresh database; timed from the start of the endpoint to the
/// end of its graceful shutdown (every message completed, the outbox emptied).
async fn courier_run(n: u64, concurrency: usize, group: usize, async_commit: bool) -> Run {
    courier_run_with(n, concurrency, group, async_commit, None).await
}

/// As [`courier_run`], keeping a history when `history` is given.
async fn courier_run_with(
    n: u64,
    concurrency: usize,
    group: usize,
    async_commit: bool,
    history: Option<HistoryOptions>,
) -> Run {
    let mut conn = admin_connection().await;
    let name = create_database(&mut conn, "courier_bench", async_commit).await;
    let url = with_database(&database_url(), &name);
    // The store as a user makes it: its own pool (up to 16 connections).
    let store = PostgresStore::connect(&url).await.unwrap();
    let pool = store.pool().clone();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (n bigint PRIMARY KEY, placed_at timestamptz NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    let (broker, _dir) = prefilled(n).await;
    let xacts_before = xacts(&mut conn, &name).await;

    let progress = Arc::new(Progress {
        seen: AtomicU64::new(0),
        total: n,
        done: Notify::new(),
    });
    let start = Instant::now();
    let keeps_history = history.is_some();
    let mut builder = Endpoint::builder("orders")
        .transport(Arc::new(broker.clone()))
        .routes(Routes::new().send::<OrderPlaced>("placed"))
        .store(Arc::new(store))
        .state(progress.clone())
        .concurrency(concurrency)
        .group_commit(group)
        .handler(place);
    if let Some(options) = history {
        builder = builder.history(options);
    }
    let running = builder.start().await.unwrap();
    progress.done.notified().await;
    let report = running.shutdown().await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(report.completed, n);

    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, i64::try_from(n).unwrap());
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier.outbox")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the outbox is empty after the shutdown");
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier.history")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(
        events,
        if keeps_history { rows } else { 0 },
        "one event per handled message"
    );
    let placed = broker.counts(&EntityPath::queue("placed")).await.unwrap().active;
    assert_eq!(placed, n, "every handled message sent one");
    // Closed connections flush their statistics.
    pool.close().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The three statements above and the migration check are a handful against thousands.
    let tx_per_msg = (xacts(&mut conn, &name).await - xacts_before) as f64 / n as f64;
    broker.close().await;
    drop_database(&mut conn, &name).await;
    Run { rate, tx_per_msg }
}

/// A fresh database `<prefix>_<uuid>`; with `async_commit`, its sessions commit without
/// waiting for the WAL flush (`synchronous_commit = off`), which takes the disk's flush
/// latency out of the figures and leaves the CPU and round trips.
async fn create_database(conn: &mut sqlx::PgConnection, prefix: &str, async_commit: bool) -> String {
    let name = format!("{prefix}_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut *conn)
        .await
        .unwrap();
    if async_commit {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "ALTER DATABASE {name} SET synchronous_commit = off"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
    }
    name
}

async fn drop_database(conn: &mut sqlx::PgConnection, name: &str) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
}

/// `url` naming database `name` instead (its query string kept).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let (scheme, rest) = base.split_once("://").expect("DATABASE_URL is a postgres:// URL");
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// Transactions committed and rolled back so far in database `name`.
async fn xacts(conn: &mut sqlx::PgConnection, name: &str) -> i64 {
    // A new snapshot of the statistics, not the one cached in this transaction.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// The baseline script, from the workspace root: `scripts/baselines/`.
fn baseline_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/baselines/pg-handler-baseline.sh")
}

/// The baseline's two figures: one and ten messages per transaction, 8 clients; on
/// `DATABASE_URL`'s database, or with `async_commit` on a fresh one set like Courier's.
fn baseline(rt: &tokio::runtime::Runtime, secs: u32, async_commit: bool) -> (f64, f64) {
    let (url, scratch) = if async_commit {
        let name = rt.block_on(async {
            let mut conn = admin_connection().await;
            create_database(&mut conn, "courier_bench_baseline", true).await
        });
        (with_database(&database_url(), &name), Some(name))
    } else {
        (database_url(), None)
    };
    let out = std::process::Command::new("bash")
        .arg(baseline_script())
        .arg(&url)
        .arg(secs.to_string())
        .arg("8")
        .output()
        .expect("run the baseline script");
    let text = String::from_utf8_lossy(&out.stdout);
    let rate = |per_tx: u32| -> f64 {
        // "baseline handler, 1 msg/tx, 8 clients: 5123 messages/s"
        text.lines()
            .find(|l| l.contains(&format!(", {per_tx} msg/tx,")))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim().trim_end_matches(" messages/s").parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "baseline output not understood (status {}):\n{text}\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let rates = (rate(1), rate(10));
    if let Some(name) = scratch {
        rt.block_on(async { drop_database(&mut admin_connection().await, &name).await });
    }
    rates
}

async fn admin_connection() -> sqlx::PgConnection {
    database_url()
        .parse::<PgConnectOptions>()
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Lets the disk and Postgres settle between measurements.
fn quiesce() {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(3));
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The value after `--flag`, if any.
fn arg<T: std::str::FromStr>(flag: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{flag} {v}: not understood")))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, rounds, secs) = if quick { (5_000, 1, 5) } else { (20_000, 3, 10) };
    let rounds: usize = arg("--rounds").unwrap_or(rounds);
    let secs: u32 = arg("--secs").unwrap_or(secs);
    let n: u64 = arg("--messages").unwrap_or(n);
    let async_commit = std::env::args().any(|a| a == "--async-commit");
    let breakdown = std::env::args().any(|a| a == "--breakdown");
    let group: usize = arg("--group").unwrap_or(4);
    let bare_at: usize = arg("--bare-at").unwrap_or(8);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    // `--profile N`: one long Courier run with N handlers at once, for a profiler.
    if let Some(concurrency) = arg::<usize>("--profile") {
        let run = rt.block_on(courier_run(n.max(60_000), concurrency, group, async_commit));
        println!(
            "courier, {concurrency} at once: {:.0} msg/s, {:.2} Postgres transactions/msg",
            run.rate, run.tx_per_msg
        );
        return;
    }

    if std::env::args().any(|a| a == "--history") {
        history_overhead(&rt, n, rounds, group, async_commit);
        return;
    }

    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut command = String::from("cargo bench -p courier --features postgres --bench pg_endpoint");
    if !args.is_empty() {
        command = format!("{command} -- {}", args.join(" "));
    }
    println!("{command}");
    println!("courier (embedded broker file NORMAL + PostgresStore: inbox, 1 user row, 1 x 1 KB through the outbox)");
    println!(
        "  vs pg-handler-baseline.sh (8 clients), DATABASE_URL {}",
        database_url()
    );
    println!("  {n} messages per Courier run, baseline {secs} s per figure, {rounds} round(s), medians compared");
    if async_commit {
        println!("  synchronous_commit = off on both sides (no wait for the WAL flush: CPU and round trips only)");
    }
    // (handlers at once, group commit): each message alone, then groups.
    let configs: Vec<(usize, usize)> = match group {
        1 => vec![(8, 1), (16, 1)],
        g => vec![(8, 1), (16, 1), (8, g), (16, g), (32, g * 2)],
    };
    let (mut one, mut ten) = (Vec::new(), Vec::new());
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut tx: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut bare = Vec::new();
    for round in 1..=rounds {
        quiesce();
        let (b1, b10) = baseline(&rt, secs, async_commit);
        let mut line = format!("  round {round}: baseline {b1:>6.0} msg/s 1/tx, {b10:>6.0} msg/s 10/tx | courier");
        for (i, &(at_once, g)) in configs.iter().enumerate() {
            quiesce();
            let r = rt.block_on(courier_run(n, at_once, g, async_commit));
            line.push_str(&format!(" {:.0} ({at_once}/{g})", r.rate));
            rates[i].push(r.rate);
            tx[i].push(r.tx_per_msg);
        }
        println!("{line}");
        if breakdown {
            quiesce();
            let r = rt.block_on(without_store_run(n, bare_at));
            println!("           courier without a store (broker + runtime only), {bare_at} at once: {r:>6.0} msg/s");
            bare.push(r);
        }
        one.push(b1);
        ten.push(b10);
    }
    let (one, ten) = (median(one), median(ten));
    println!();
    println!("| | msg/s | / baseline 1 msg/tx | / baseline 10 msg/tx | Postgres transactions/msg |");
    println!("|---|---:|---:|---:|---:|");
    println!("| baseline, 1 msg/tx, 8 clients | {one:.0} | | | 1 |");
    println!("| baseline, 10 msg/tx, 8 clients | {ten:.0} | | | 0.1 |");
    for (i, &(at_once, g)) in configs.iter().enumerate() {
        let rate = median(rates[i].clone());
        let label = if g == 1 {
            format!("courier, {at_once} at once, each message alone")
        } else {
            format!("courier, {at_once} at once, group_commit({g})")
        };
        println!(
            "| {label} | {rate:.0} | {:.1}% | {:.1}% | {:.2} |",
            rate / one * 100.0,
            rate / ten * 100.0,
            median(tx[i].clone())
        );
    }
    if !bare.is_empty() {
        let bare = median(bare);
        let with = median(rates[0].clone());
        println!(
            "| courier without a store, {bare_at} at once | {bare:.0} | {:.1}% | {:.1}% | |",
            bare / one * 100.0,
            bare / ten * 100.0
        );
        println!(
            "per message ({bare_at} without a store, 8 with, alone): {:.0} us without a store, {:.0} us with; the store adds {:.0} us",
            1e6 / bare,
            1e6 / with,
            1e6 / with - 1e6 / bare
        );
    }
}

/// The endpoint without a history, with one (no bodies) and with one keeping bodies,
/// alternating in each round, 16 at once alone and in groups; the ratios against the
/// target (85%).
fn history_overhead(rt: &tokio::runtime::Runtime, n: u64, rounds: usize, group: usize, async_commit: bool) {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    println!(
        "cargo bench -p courier --features postgres --bench pg_endpoint -- {}",
        args.join(" ")
    );
    println!(
        "courier (embedded broker file NORMAL + PostgresStore: inbox, 1 user row, 1 x 1 KB through the outbox), history off / on / on with bodies"
    );
    println!("  {n} messages per run, {rounds} round(s) alternating, medians compared");
    if async_commit {
        println!("  synchronous_commit = off");
    }
    let variants = [
        ("history off", None),
        ("history on", Some(HistoryOptions::new())),
        ("history on + bodies", Some(HistoryOptions::new().with_bodies(true))),
    ];
    let configs: Vec<(usize, usize)> = if group == 1 {
        vec![(16, 1)]
    } else {
        vec![(16, 1), (16, group)]
    };
    // rates[config][variant][round]
    let mut rates = vec![vec![Vec::new(); variants.len()]; configs.len()];
    for round in 1..=rounds {
        let mut line = format!("  round {round}:");
        for (c, &(at_once, g)) in configs.iter().enumerate() {
            line.push_str(&format!(" {at_once}/{g}"));
            for (v, (_, history)) in variants.iter().enumerate() {
                quiesce();
                let r = rt.block_on(courier_run_with(n, at_once, g, async_commit, history.clone()));
                line.push_str(&format!(" {:.0}", r.rate));
                rates[c][v].push(r.rate);
            }
            line.push_str(" |");
        }
        println!("{line}");
    }
    println!();
    println!("| handlers / group | history | msg/s | / history off | target >= 85% | us/msg added |");
    println!("|---|---|---:|---:|---|---:|");
    for (c, &(at_once, g)) in configs.iter().enumerate() {
        let off = median(rates[c][0].clone());
        for (v, (label, _)) in variants.iter().enumerate() {
            let rate = median(rates[c][v].clone());
            let grouping = if g == 1 {
                format!("{at_once}, each message alone")
            } else {
                format!("{at_once}, group_commit({g})")
            };
            if v == 0 {
                println!("| {grouping} | {label} | {rate:.0} | | | |");
            } else {
                let ratio = rate / off;
                println!(
                    "| {grouping} | {label} | {rate:.0} | {:.1}% | {} | {:+.0} |",
                    ratio * 100.0,
                    if ratio >= 0.85 { "PASS" } else { "BELOW" },
                    (1.0 / rate - 1.0 / off) * 1e6
                );
            }
        }
    }
}
