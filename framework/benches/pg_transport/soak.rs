//! `--soak SECS` (issue 15, point 3, "rows do not pile up"): the endpoint of the main part
//! (Postgres transport, its store, the same handler) at full speed for SECS seconds, with
//! senders keeping a bounded backlog in its queue, and the size of `courier.message`
//! (table, indexes, TOAST), its live and dead rows and its autovacuum runs before, every
//! `--soak-every` seconds (default 60), and after; then the autovacuum settings in force
//! on the table. `--soak-vacuum` adds a `VACUUM courier.message` after each sample, for a
//! server whose autovacuum is off.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::PostgresTransport;
use courier::prelude::*;
use tokio::task::JoinSet;

use crate::common::{Progress, loadavg};
use crate::courier_side::{open, place, send_orders};

/// Sending stops while this many messages wait in the queue.
const BACKLOG: u64 = 2_000;
/// Senders, each sending batches of 100.
const SENDERS: u64 = 2;

struct Sample {
    total: i64,
    heap: i64,
    indexes: i64,
    toast: i64,
    live: i64,
    dead: i64,
    autovacuums: i64,
    last_autovacuum: Option<String>,
}

async fn sample(pool: &sqlx::PgPool) -> Sample {
    let (total, heap, indexes, toast): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT pg_total_relation_size(c.oid), pg_relation_size(c.oid), pg_indexes_size(c.oid), \
                coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0) \
         FROM pg_class c WHERE c.oid = 'courier.message'::regclass",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await
        .unwrap();
    let (live, dead, autovacuums, last_autovacuum): (i64, i64, i64, Option<String>) = sqlx::query_as(
        "SELECT n_live_tup, n_dead_tup, autovacuum_count, to_char(last_autovacuum, 'HH24:MI:SS') \
         FROM pg_stat_user_tables WHERE relid = 'courier.message'::regclass",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    Sample {
        total,
        heap,
        indexes,
        toast,
        live,
        dead,
        autovacuums,
        last_autovacuum,
    }
}

fn kib(bytes: i64) -> String {
    format!("{} KiB", bytes / 1024)
}

fn row(label: &str, handled: u64, rate: f64, s: &Sample) {
    println!(
        "| {label} | {handled} | {rate:.0} | {} | {} | {} | {} | {} | {} | {} ({}) | {} |",
        kib(s.total),
        kib(s.heap),
        kib(s.indexes),
        kib(s.toast),
        s.live,
        s.dead,
        s.autovacuums,
        s.last_autovacuum.as_deref().unwrap_or("never"),
        loadavg()
    );
}

/// Prints the autovacuum settings in force on the table; whether autovacuum runs at all.
async fn settings(transport: &PostgresTransport) -> bool {
    let options: Option<Vec<String>> =
        sqlx::query_scalar("SELECT reloptions FROM pg_class WHERE oid = 'courier.message'::regclass")
            .fetch_one(transport.pool())
            .await
            .unwrap();
    println!(
        "autovacuum settings on courier.message (the migration's): {}",
        options.map_or_else(|| "none (server defaults)".into(), |o| o.join(", "))
    );
    let server: Vec<(String, String)> = sqlx::query_as(
        "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN ('autovacuum', \
         'autovacuum_naptime', 'autovacuum_vacuum_cost_limit', 'autovacuum_vacuum_cost_delay', \
         'autovacuum_vacuum_scale_factor', 'autovacuum_vacuum_threshold', 'autovacuum_max_workers', \
         'vacuum_cost_limit') ORDER BY name",
    )
    .fetch_all(transport.pool())
    .await
    .unwrap();
    let on = server.iter().any(|(k, v)| k == "autovacuum" && v == "on");
    let server: Vec<String> = server.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!("server settings: {}", server.join(", "));
    if !on {
        println!(
            "WARNING: autovacuum is off on this server: nothing reclaims the deleted rows' space, so the \
             table grows with every message (run with --soak-vacuum for a VACUUM after each sample instead, \
             or on a server with autovacuum on)"
        );
    }
    on
}

/// Runs the soak for `secs` seconds, sampling every `every` seconds.
/// With `vacuum`, runs `VACUUM courier.message` after each sample (a stand-in for a
/// server whose autovacuum is off).
pub(crate) async fn soak(secs: u64, every: u64, handlers: usize, group: usize, pool: u32, vacuum: bool) {
    let (db, transport) = open(pool).await;
    println!(
        "soak: {secs} s at full speed, {handlers} handlers at once, group_commit({group}), pool {pool}, \
         {SENDERS} senders keeping at most {BACKLOG} messages waiting; database {}",
        db.name()
    );
    settings(&transport).await;
    if vacuum {
        println!("--soak-vacuum: VACUUM courier.message after each sample");
    }
    println!();
    println!(
        "| when | handled | msg/s since last | courier.message total | heap | indexes | TOAST | live rows | dead rows | autovacuums (last) | load |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|");
    row("before", 0, 0.0, &sample(transport.pool()).await);

    // Counts handled messages; `total` is never reached, the senders stop by time.
    let progress = Arc::new(Progress::new(u64::MAX));
    let running = Endpoint::builder("orders")
        .transport(transport.clone())
        .store(transport.store())
        .state(progress.clone())
        .concurrency(handlers)
        .group_commit(group)
        .handler(place)
        .start()
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let mut senders = JoinSet::new();
    for _ in 0..SENDERS {
        let (stop, sent, progress) = (stop.clone(), sent.clone(), progress.clone());
        let sender = transport.sender("orders", SenderOptions::default()).await.unwrap();
        senders.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if sent.load(Ordering::Relaxed).saturating_sub(progress.seen()) >= BACKLOG {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let from = sent.fetch_add(100, Ordering::Relaxed);
                send_orders(&sender, from, from + 100).await;
            }
        });
    }
    let start = Instant::now();
    let (mut last_at, mut last_seen) = (start, 0);
    let mut largest = 0;
    while start.elapsed() < Duration::from_secs(secs) {
        let left = Duration::from_secs(secs).saturating_sub(start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(every))).await;
        let seen = progress.seen();
        let s = sample(transport.pool()).await;
        largest = largest.max(s.total);
        let rate = (seen - last_seen) as f64 / last_at.elapsed().as_secs_f64();
        row(&format!("{:.0} s", start.elapsed().as_secs_f64()), seen, rate, &s);
        (last_at, last_seen) = (Instant::now(), seen);
        if vacuum {
            let began = Instant::now();
            sqlx::query("VACUUM courier.message")
                .execute(transport.pool())
                .await
                .unwrap();
            println!(
                "| (VACUUM, {:.1} s) | | | | | | | | | | |",
                began.elapsed().as_secs_f64()
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    while senders.join_next().await.is_some() {}
    // The backlog is handled before the shutdown.
    let sent = sent.load(Ordering::Relaxed);
    while progress.seen() < sent {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = running.shutdown().await.unwrap();
    let elapsed = start.elapsed().as_secs_f64();
    let s = sample(transport.pool()).await;
    row("after (drained)", progress.seen(), 0.0, &s);
    println!();
    println!(
        "handled {} messages in {elapsed:.0} s ({:.0} msg/s), completed {}; courier.message at most {} at a sample, {} after",
        progress.seen(),
        progress.seen() as f64 / elapsed,
        report.completed,
        kib(largest),
        kib(s.total)
    );
    transport.close().await;
    db.drop_database().await.unwrap();
}
