//! The operations API on a large dead-letter queue of the embedded broker (a file, default
//! durability): how long the first page of a listing takes, and how fast "resubmit all"
//! moves messages back, next to the broker's send rate for the same messages (batches of
//! 256, measured in the same run).
//!
//! Run: `cargo bench -p courier --bench admin` (100,000 dead letters; add `-- --quick`
//! for 10,000).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

mod admin_shared;
use admin_shared::{BATCH, median, send_all};

use std::time::{Duration, Instant};

use courier::admin::{EmbeddedAdmin, QueueAdmin};
use courier::prelude::*;
use tokio::task::JoinSet;

const BODY: usize = 1024;

fn message(i: usize) -> Envelope {
    let mut m = Envelope::new(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(BODY)));
    m.message_type = Some("bench.Order".into());
    m
}

/// Moves every message of `queue` to its dead-letter sub-queue.
async fn dead_letter_all(broker: &Embedded, queue: &str, n: usize) {
    let receiver = broker.receiver(&EntityPath::queue(queue)).await.unwrap();
    let mut moved = 0;
    while moved < n {
        let deliveries = receiver.receive(2000, Duration::from_secs(5)).await.unwrap();
        let mut settles = JoinSet::new();
        for d in deliveries {
            settles.spawn(async move { d.dead_letter("bench.Poison", "made for the benchmark").await });
        }
        while let Some(r) = settles.join_next().await {
            r.unwrap().unwrap();
            moved += 1;
        }
    }
}

/// The CPU time this process has used (user + system, every thread), from
/// /proc/self/stat: less sensitive than wall time to what else the machine runs.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name; the
    // kernel counts them in ticks of 1/100 s.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 10_000 } else { 100_000 };
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::open(dir.path().join("bench.db")).await.unwrap();
    broker.create_queue("orders", &QueueOptions::default()).await.unwrap();
    broker.create_queue("peer", &QueueOptions::default()).await.unwrap();

    let cpu = cpu_time();
    let send_rate = send_all(&broker, "orders", n, message).await;
    let send_cpu = cpu_time() - cpu;
    dead_letter_all(&broker, "orders", n).await;
    let admin = EmbeddedAdmin::new(broker.clone());

    let mut firsts = Vec::new();
    for _ in 0..21 {
        let start = Instant::now();
        let page = admin.dead_letters("orders", 0, 50).await.unwrap();
        firsts.push(start.elapsed());
        assert_eq!((page.items.len(), page.total), (50, n as u64));
    }
    let mut middles = Vec::new();
    for k in 0..21u64 {
        let after = (n as i64 / 21) * k as i64;
        let start = Instant::now();
        admin.dead_letters("orders", after, 50).await.unwrap();
        middles.push(start.elapsed());
    }
    let mut listings = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let queues = admin.queues().await.unwrap();
        listings.push(start.elapsed());
        assert_eq!(queues[0].dead_lettered, n as u64);
    }
    let mut shows = Vec::new();
    for seq in (1..=21).map(|k| k * (n as i64 / 22)) {
        let start = Instant::now();
        admin.dead_letter("orders", seq).await.unwrap();
        shows.push(start.elapsed());
    }

    let start = Instant::now();
    let cpu = cpu_time();
    let all = admin.all_dead_letters("orders").await.unwrap();
    let collected = start.elapsed();
    let outcome = admin.resubmit_many("orders", &all).await.unwrap();
    let resubmit = start.elapsed();
    let resubmit_cpu = cpu_time() - cpu;
    assert_eq!(outcome.done.len(), n);
    let resubmit_rate = n as f64 / resubmit.as_secs_f64();

    // The peer again after the resubmit, on a queue of its own: the file is as large as
    // it was for the resubmit.
    let cpu = cpu_time();
    let send_rate_after = send_all(&broker, "peer", n, message).await;
    let send_cpu_after = cpu_time() - cpu;
    let peer = (send_rate + send_rate_after) / 2.0;

    println!("admin on the embedded broker, {n} dead letters of {BODY} B");
    println!("  first page (50) of the list: median {:?}", median(firsts));
    println!("  a page in the middle:        median {:?}", median(middles));
    println!("  show one:                    median {:?}", median(shows));
    println!("  queues with their counts:    median {:?}", median(listings));
    println!("  resubmit all: {resubmit_rate:.0} msg/s ({resubmit:?}, of which {collected:?} to list them)");
    println!("  send (peer, batches of {BATCH}): {send_rate:.0} msg/s before, {send_rate_after:.0} msg/s after");
    println!("  resubmit all / send: {:.0}%", 100.0 * resubmit_rate / peer);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "  CPU time a message: send {:.1} us before, {:.1} us after; resubmit {:.1} us; send / resubmit: {:.0}%",
        per(send_cpu),
        per(send_cpu_after),
        per(resubmit_cpu),
        100.0 * per(send_cpu + send_cpu_after) / 2.0 / per(resubmit_cpu)
    );
    broker.close().await;
}
