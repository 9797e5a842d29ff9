//! The operations API on a large dead-letter queue of the Postgres transport: how long
//! the first page of a listing takes, and how fast "resubmit all" moves messages back,
//! next to the transport's send rate for the same messages (batches of 256, measured in
//! the same run, before and after, on the same database).
//!
//! Run: `cargo bench -p courier --features postgres --bench admin_pg` (100,000 dead
//! letters; add `-- --quick` for 10,000). It needs Postgres: `DATABASE_URL`, else a
//! container (see `courier::test_servers`); it makes a database of its own and drops it.
//! The messages are dead-lettered with one `UPDATE` (what a receiver's dead-letter does
//! to each row), so the setup does not dominate the run.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

mod admin_shared;
use admin_shared::{BATCH, median, send_all};

use std::time::Instant;

use courier::admin::{PostgresAdmin, QueueAdmin};
use courier::prelude::*;
use courier::{PostgresTransport, PropertyValue, Store};

const BODY: usize = 1024;

fn message(i: usize) -> Envelope {
    let mut m = Envelope::new(format!("{{\"n\":{i},\"pad\":\"{}\"}}", "x".repeat(BODY)));
    m.message_type = Some("bench.Order".into());
    m.properties.insert(
        "courier.failure.error".into(),
        PropertyValue::from("made for the benchmark"),
    );
    m
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 10_000 } else { 100_000 };
    let db = courier::test_servers::postgres_database().await.unwrap();
    let pool = db.pool(10).await.unwrap();
    courier::PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
    let t = PostgresTransport::from_pool(pool.clone())
        .migrate(false)
        .open()
        .await
        .unwrap();
    t.create_queue("orders", &QueueOptions::default()).await.unwrap();
    t.create_queue("peer", &QueueOptions::default()).await.unwrap();

    let send_rate = send_all(&t, "orders", n, message).await;
    sqlx::query(
        "UPDATE courier.message SET state = 3, dl_reason = 'bench.Poison', dl_description = 'made for the benchmark', \
         dl_source = 'orders', delivery_count = 1 WHERE entity_id = (SELECT id FROM courier.entity WHERE name = 'orders')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE courier.message")
        .execute(&pool)
        .await
        .unwrap();
    let admin = PostgresAdmin::new(pool.clone());

    let mut firsts = Vec::new();
    for _ in 0..21 {
        let start = Instant::now();
        let page = admin.dead_letters("orders", 0, 50).await.unwrap();
        firsts.push(start.elapsed());
        assert_eq!((page.items.len(), page.total), (50, n as u64));
    }
    let all = admin.all_dead_letters("orders").await.unwrap();
    let mut middles = Vec::new();
    for k in 0..21 {
        let after = all[(all.len() / 21) * k];
        let start = Instant::now();
        admin.dead_letters("orders", after, 50).await.unwrap();
        middles.push(start.elapsed());
    }
    let mut shows = Vec::new();
    for k in 0..21 {
        let start = Instant::now();
        admin
            .dead_letter("orders", all[(all.len() / 22) * (k + 1)])
            .await
            .unwrap();
        shows.push(start.elapsed());
    }
    let mut listings = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        let queues = admin.queues().await.unwrap();
        listings.push(start.elapsed());
        assert_eq!(queues[0].dead_lettered, n as u64);
    }

    let start = Instant::now();
    let all = admin.all_dead_letters("orders").await.unwrap();
    let collected = start.elapsed();
    let outcome = admin.resubmit_many("orders", &all).await.unwrap();
    let resubmit = start.elapsed();
    assert_eq!(outcome.done.len(), n);
    let resubmit_rate = n as f64 / resubmit.as_secs_f64();

    // The peer again after the resubmit, on a queue of its own: the table is as large as
    // it was for the resubmit.
    let send_rate_after = send_all(&t, "peer", n, message).await;
    let peer = (send_rate + send_rate_after) / 2.0;

    println!("admin on the Postgres transport, {n} dead letters of {BODY} B");
    println!("  first page (50) of the list: median {:?}", median(firsts));
    println!("  a page in the middle:        median {:?}", median(middles));
    println!("  show one:                    median {:?}", median(shows));
    println!("  queues with their counts:    median {:?}", median(listings));
    println!("  resubmit all: {resubmit_rate:.0} msg/s ({resubmit:?}, of which {collected:?} to list them)");
    println!("  send (peer, batches of {BATCH}): {send_rate:.0} msg/s before, {send_rate_after:.0} msg/s after");
    println!("  resubmit all / send: {:.0}%", 100.0 * resubmit_rate / peer);
    t.close().await;
    pool.close().await;
    db.drop_database().await.unwrap();
}
