//! The operations API on a large dead-letter queue of the RabbitMQ transport: how long the
//! first page of a listing takes (a listing reads the whole DLQ: see docs/operations.md,
//! "On RabbitMQ"), and how fast "resubmit all" moves messages back, next to the
//! transport's send rate for the same messages (batches of 256, with publisher confirms,
//! measured in the same run, before and after, on the same broker).
//!
//! Run: `cargo bench -p courier --features amqp,postgres --bench admin_amqp` (100,000 dead letters;
//! add `-- --quick` for 10,000). It needs RabbitMQ: `AMQP_URL`, else a container (see
//! `courier::test_servers`); it makes a virtual host of its own and deletes it. The
//! schedule store (where the transport records its queues) is a SQLite file.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::time::{Duration, Instant};

use courier::admin::{AmqpAdmin, QueueAdmin, SqliteAdmin};
use courier::prelude::*;
use courier::{AmqpTransport, PropertyValue, SqliteStore, Store};
use tokio::task::JoinSet;

const BODY: usize = 1024;
const BATCH: usize = 256;

fn message(i: usize) -> Envelope {
    let mut m = Envelope::new(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(BODY)));
    m.message_type = Some("bench.Order".into());
    m.properties.insert(
        "courier.failure.error".into(),
        PropertyValue::from("made for the benchmark"),
    );
    m
}

/// Sends `n` messages to `queue` in batches; returns messages per second.
async fn send_all(t: &AmqpTransport, queue: &str, n: usize) -> f64 {
    let sender = t.sender(queue, SenderOptions::default()).await.unwrap();
    let start = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<Envelope> = (i..(i + BATCH).min(n)).map(message).collect();
        i += batch.len();
        sender.send_batch(batch).await.unwrap();
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Moves every message of `queue` to its dead-letter queue, as a failing endpoint would.
async fn dead_letter_all(t: &AmqpTransport, queue: &str, n: usize) {
    let receiver = t.receiver(&EntityPath::queue(queue)).await.unwrap();
    let mut moved = 0;
    while moved < n {
        let deliveries = receiver.receive(1000, Duration::from_secs(5)).await.unwrap();
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

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 10_000 } else { 100_000 };
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let url = vhost.url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("schedules.db");
    let store = SqliteStore::open(&file).await.unwrap();
    store.migrate().await.unwrap();
    let t = AmqpTransport::builder(url.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    t.create_queue("orders", &QueueOptions::default()).await.unwrap();
    t.create_queue("peer", &QueueOptions::default()).await.unwrap();

    let send_rate = send_all(&t, "orders", n).await;
    dead_letter_all(&t, "orders", n).await;
    // Its receiver's consumer would take the resubmitted messages: a transport without
    // a consumer from here on.
    t.close().await;
    let t = AmqpTransport::builder(url.as_str())
        .schedules(&store)
        .open()
        .await
        .unwrap();
    let sqlite = SqliteAdmin::open(&file).await.unwrap();
    let admin = AmqpAdmin::connect(&url, Some(courier::ScheduleStore::from(&sqlite)))
        .await
        .unwrap();
    // Wait until RabbitMQ counts every dead letter.
    loop {
        let q = admin.queues().await.unwrap();
        if q.iter().any(|q| q.name == "orders" && q.dead_lettered == n as u64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A listing holds every message it reads, unacknowledged; RabbitMQ stops delivering
    // to a quorum queue's consumer at 2,000 unacknowledged messages even with an unlimited
    // prefetch, so a listing sees at most that many (measured here; see the note in
    // docs/operations.md). The bench reports what it saw instead of asserting the whole.
    let mut firsts = Vec::new();
    let mut listed = 0;
    for _ in 0..3 {
        let start = Instant::now();
        let page = admin.dead_letters("orders", 0, 50).await.unwrap();
        firsts.push(start.elapsed());
        assert_eq!(page.items.len(), 50);
        listed = page.total;
    }
    let mut listings = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        admin.queues().await.unwrap();
        listings.push(start.elapsed());
    }

    let start = Instant::now();
    let all = admin.all_dead_letters("orders").await.unwrap();
    let collected = start.elapsed();
    let outcome = admin.resubmit_many("orders", &all).await.unwrap();
    let resubmit = start.elapsed();
    let moved = outcome.done.len();
    let resubmit_rate = moved as f64 / resubmit.as_secs_f64();

    let send_rate_after = send_all(&t, "peer", n).await;
    let peer = (send_rate + send_rate_after) / 2.0;

    println!("admin on RabbitMQ, {n} dead letters of {BODY} B");
    println!(
        "  a listing saw {listed} of them; \"resubmit all\" took {} and moved {moved}",
        all.len()
    );
    println!("  first page (50) of the list: median of 3 {:?}", median(firsts));
    println!("  queues with their counts:    median {:?}", median(listings));
    println!("  resubmit all: {resubmit_rate:.0} msg/s ({resubmit:?}, of which {collected:?} to list them)");
    println!("  send (peer, batches of {BATCH}): {send_rate:.0} msg/s before, {send_rate_after:.0} msg/s after");
    println!("  resubmit all / send: {:.0}%", 100.0 * resubmit_rate / peer);
    for q in ["orders", "peer"] {
        t.delete(&EntityPath::queue(q)).await.unwrap();
    }
    t.close().await;
    vhost.delete().await.unwrap();
}
