//! The operations API on a large dead-letter queue of the RabbitMQ transport, whose dead
//! letters the admin reads where they are and numbers in the schedule store
//! (docs/operations.md, "On RabbitMQ"): the first page of a fresh DLQ, taking all of them
//! (every number: what `--all`, a dry run and a confirmation page read), the first page
//! and a page in the middle once numbered, showing one in the middle, and "resubmit all",
//! next to the transport's send rate for the same messages (batches of 256, with
//! publisher confirms, measured in the same run, before and after, on the same broker).
//! It asserts that the listing saw every dead letter, that reading left every one in the
//! DLQ, and that the resubmit moved every one.
//!
//! Run: `cargo bench -p courier --features amqp,postgres --bench admin_amqp` (100,000 dead
//! letters of 1 KiB; add `-- --quick` for 10,000; add `-- --postgres` to number them in a
//! Postgres schedule store, a database of its own on the server `DATABASE_URL` names,
//! instead of a SQLite file). It needs RabbitMQ: `AMQP_URL`, else a container (see
//! `courier::test_servers`); it makes a virtual host of its own and deletes it. The dead
//! letters are published straight into `orders::dlq` with the headers the transport's
//! dead-lettering writes (a failing endpoint would take minutes to make 100,000).

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

use courier::admin::{AmqpAdmin, QueueAdmin};
use courier::prelude::*;
use courier::{AmqpTransport, PostgresStore, PropertyValue, ScheduleStore, SqliteStore, Store};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection, ConnectionProperties};

const BODY: usize = 1024;
/// How many messages each send-rate measurement sends.
const SEND_SAMPLE: usize = 20_000;
/// How many times a page or a show is timed (the median is reported).
const ROUNDS: usize = 21;

fn body(i: usize) -> String {
    let head = format!("{{\"n\":{i},\"pad\":\"");
    format!("{head}{}\"}}", "x".repeat(BODY - head.len() - 2))
}

fn message(i: usize) -> Envelope {
    let mut m = Envelope::new(body(i));
    m.message_type = Some("bench.Order".into());
    m.properties.insert(
        "courier.failure.error".into(),
        PropertyValue::from("made for the benchmark"),
    );
    m
}

/// The send rate on a queue of its own, deleted afterwards (RabbitMQ keeps no backlog).
async fn send_rate(t: &AmqpTransport, n: usize) -> f64 {
    t.create_queue("peer", &QueueOptions::default()).await.unwrap();
    let rate = send_all(t, "peer", n, message).await;
    t.delete(&EntityPath::queue("peer")).await.unwrap();
    rate
}

/// Publishes `n` dead letters into `dlq` as the transport's dead-lettering writes them.
async fn publish_dead_letters(url: &str, dlq: &str, n: usize) {
    let conn = Connection::connect(url, ConnectionProperties::default()).await.unwrap();
    let channel = conn.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let text = |s: &str| AMQPValue::LongString(LongString::from(s.as_bytes()));
    let base = chrono::Utc::now().timestamp_micros();
    let mut i = 0;
    while i < n {
        let mut confirms = Vec::new();
        for j in i..(i + 1000).min(n) {
            let mut h = FieldTable::default();
            h.insert("courier.failure.error".into(), text("made for the benchmark"));
            h.insert("courier.failure.attempts".into(), AMQPValue::LongLongInt(5));
            h.insert("x-courier-dead-letter-reason".into(), text("bench.Poison"));
            h.insert(
                "x-courier-dead-letter-description".into(),
                text("made for the benchmark"),
            );
            h.insert("x-courier-dead-letter-source".into(), text("orders"));
            h.insert("x-courier-enqueued-time".into(), AMQPValue::LongLongInt(base / 1000));
            h.insert(
                "x-courier-sequence-number".into(),
                AMQPValue::LongLongInt(base + j as i64),
            );
            let p = BasicProperties::default()
                .with_message_id(format!("order-{j}").as_str().into())
                .with_type("bench.Order".into())
                .with_delivery_mode(2)
                .with_headers(h);
            let c = channel
                .basic_publish(
                    "".into(),
                    dlq.into(),
                    BasicPublishOptions::default(),
                    body(j).as_bytes(),
                    p,
                )
                .await
                .unwrap();
            confirms.push(c);
        }
        i += confirms.len();
        for c in confirms {
            assert!(c.await.unwrap().is_ack());
        }
    }
    conn.close(200, "done".into()).await.unwrap();
}

async fn timed<T, F: std::future::Future<Output = T>>(f: impl Fn() -> F) -> Duration {
    let mut all = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let start = Instant::now();
        f().await;
        all.push(start.elapsed());
    }
    median(all)
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let postgres = std::env::args().any(|a| a == "--postgres");
    let n = if quick { 10_000 } else { 100_000 };
    let sample = SEND_SAMPLE.min(n);
    let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
    let url = vhost.url().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let mut database = None;
    let store = if postgres {
        let db = courier::test_servers::postgres_database().await.unwrap();
        let store = PostgresStore::from_pool(db.pool(8).await.unwrap());
        store.migrate().await.unwrap();
        database = Some(db);
        ScheduleStore::from(&store)
    } else {
        let store = SqliteStore::open(dir.path().join("schedules.db")).await.unwrap();
        store.migrate().await.unwrap();
        ScheduleStore::from(&store)
    };
    let t = AmqpTransport::builder(url.as_str())
        .schedules(store.clone())
        .open()
        .await
        .unwrap();
    t.create_queue("orders", &QueueOptions::default()).await.unwrap();

    let send_before = send_rate(&t, sample).await;
    publish_dead_letters(&url, "orders::dlq", n).await;
    let admin = AmqpAdmin::connect(&url, Some(store)).await.unwrap();
    // Wait until RabbitMQ counts every dead letter.
    loop {
        let q = admin.queues().await.unwrap();
        if q.iter().any(|q| q.name == "orders" && q.dead_lettered == n as u64) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let start = Instant::now();
    let page = admin.dead_letters("orders", 0, 50).await.unwrap();
    let first_listing = start.elapsed();
    assert_eq!(page.total, n as u64, "the listing saw every dead letter");
    assert_eq!(page.items.len(), 50);
    let start = Instant::now();
    let all = admin.all_dead_letters("orders").await.unwrap();
    let park_rest = start.elapsed();
    assert_eq!(all.len(), n);
    // Reading moved nothing: RabbitMQ's DLQ holds every dead letter.
    let dead = admin.queues().await.unwrap();
    assert!(
        dead.iter().any(|q| q.name == "orders" && q.dead_lettered == n as u64),
        "reading left every dead letter in the DLQ"
    );
    let first_page = timed(|| async { admin.dead_letters("orders", 0, 50).await.unwrap() }).await;
    let middle = all[n / 2];
    let middle_page = timed(|| async {
        let p = admin.dead_letters("orders", middle, 50).await.unwrap();
        assert_eq!(p.items.len(), 50);
    })
    .await;
    let show = timed(|| async { admin.dead_letter("orders", middle).await.unwrap() }).await;
    let mut counts = Vec::new();
    for _ in 0..5 {
        let start = Instant::now();
        admin.queues().await.unwrap();
        counts.push(start.elapsed());
    }

    let start = Instant::now();
    let all = admin.all_dead_letters("orders").await.unwrap();
    let collected = start.elapsed();
    let outcome = admin.resubmit_many("orders", &all).await.unwrap();
    let resubmit = start.elapsed();
    assert_eq!(outcome.done.len(), n, "the resubmit moved every dead letter");
    assert!(outcome.failed.is_empty() && outcome.not_found.is_empty());
    let resubmit_rate = n as f64 / resubmit.as_secs_f64();
    loop {
        let q = admin.queues().await.unwrap();
        if q.iter()
            .any(|q| q.name == "orders" && q.active == n as u64 && q.dead_lettered == 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let send_after = send_rate(&t, sample).await;
    let mean = (send_before + send_after) / 2.0;
    let store_name = if postgres { "Postgres" } else { "SQLite file" };
    println!("admin on RabbitMQ, {n} dead letters of {BODY} B, numbered in a {store_name} schedule store");
    println!("  first page (50) of the fresh DLQ:   {first_listing:?}");
    println!("  every number (reads all {n}, moves none): {park_rest:?}");
    println!("  first page (50) once numbered: median of {ROUNDS} {first_page:?}");
    println!("  a page (50) in the middle:     median of {ROUNDS} {middle_page:?}");
    println!("  show one:                      median of {ROUNDS} {show:?}");
    println!("  queues with their counts:      median of 5 {:?}", median(counts));
    println!("  resubmit all: {resubmit_rate:.0} msg/s ({resubmit:?}, of which {collected:?} to list them), moved {n}");
    println!(
        "  send ({sample} messages, batches of {BATCH}): {send_before:.0} msg/s before, {send_after:.0} msg/s after"
    );
    println!("  resubmit all / mean send: {:.0}%", 100.0 * resubmit_rate / mean);
    t.delete(&EntityPath::queue("orders")).await.unwrap();
    admin.close().await;
    t.close().await;
    vhost.delete().await.unwrap();
    if let Some(db) = database {
        db.drop_database().await.unwrap();
    }
}
