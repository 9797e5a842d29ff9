//! Throughput and latency of the embedded broker on a file, with its default durability
//! (WAL, synchronous=NORMAL), next to the raw SQLite baseline measured in the same run.
//!
//! Run: `cargo bench -p courier --bench embedded` (add `-- --quick` for a short run;
//! `-- --batch-handlers` for the batch handlers and the baseline alone). The batch
//! handlers (issue 32) are an endpoint on the broker's own store whose batch handler
//! writes each batch's rows with one multi-row INSERT, against the baseline's handler at
//! 10 messages per transaction.
//! The baseline is `scripts/baselines/sqlite-handler-baseline.py` (python3); when it
//! cannot be found or run, the ratios are left out and the reason printed.

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

use courier::Durability;
use courier::prelude::*;
use tokio::task::JoinSet;

const BODY: usize = 1024;

struct Bench {
    broker: Embedded,
    _dir: tempfile::TempDir,
}

async fn broker() -> Bench {
    broker_with(Durability::Normal).await
}

async fn broker_with(durability: Durability) -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("bench.db"))
        .durability(durability)
        .open()
        .await
        .unwrap();
    Bench { broker, _dir: dir }
}

fn body() -> Vec<u8> {
    vec![b'x'; BODY]
}

/// `producers` tasks send `n` messages one per call; `consumers` tasks receive one per call
/// and complete it. Returns messages per second, end to end.
async fn one_at_a_time(n: u64, producers: u64, consumers: u64) -> f64 {
    one_at_a_time_with(Durability::Normal, n, producers, consumers).await
}

async fn one_at_a_time_with(durability: Durability, n: u64, producers: u64, consumers: u64) -> f64 {
    let b = broker_with(durability).await;
    b.broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = b.broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = b.broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for p in 0..producers {
        let sender = sender.clone();
        tasks.spawn(async move {
            for _ in (p..n).step_by(producers as usize) {
                sender.send(Envelope::new(body())).await.unwrap();
            }
        });
    }
    for _ in 0..consumers {
        let (receiver, done) = (receiver.clone(), done.clone());
        tasks.spawn(async move {
            while done.load(Ordering::Relaxed) < n {
                for d in receiver.receive(1, Duration::from_millis(50)).await.unwrap() {
                    d.complete().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let rate = n as f64 / start.elapsed().as_secs_f64();
    b.broker.close().await;
    rate
}

/// Sends in batches of `batch`, receives up to `batch` per call and completes them
/// concurrently. Returns messages per second, end to end.
async fn batched(n: u64, batch: usize, producers: u64, consumers: u64) -> f64 {
    let b = broker().await;
    b.broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = b.broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = b.broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    let batches = n / batch as u64;
    for p in 0..producers {
        let sender = sender.clone();
        tasks.spawn(async move {
            for _ in (p..batches).step_by(producers as usize) {
                let msgs = (0..batch).map(|_| Envelope::new(body())).collect();
                sender.send_batch(msgs).await.unwrap();
            }
        });
    }
    let total = batches * batch as u64;
    for _ in 0..consumers {
        let (receiver, done) = (receiver.clone(), done.clone());
        tasks.spawn(async move {
            while done.load(Ordering::Relaxed) < total {
                let got = receiver.receive(batch, Duration::from_millis(50)).await.unwrap();
                let k = got.len() as u64;
                let mut completes = JoinSet::new();
                for d in got {
                    completes.spawn(d.complete());
                }
                while let Some(r) = completes.join_next().await {
                    r.unwrap().unwrap();
                }
                done.fetch_add(k, Ordering::Relaxed);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let rate = total as f64 / start.elapsed().as_secs_f64();
    b.broker.close().await;
    rate
}

/// What the batch handler counts: the messages it wrote.
#[derive(Clone, Default)]
struct Written(Arc<AtomicU64>);

#[derive(serde::Serialize, serde::Deserialize, courier::Message)]
#[message(name = "bench.Click")]
struct Click {
    n: u64,
    payload: String,
}

/// The batch handler: the batch's rows in one multi-row INSERT, in the transaction that
/// also records every message in the inbox and completes it (the broker's own store).
#[courier::handler]
async fn write_clicks(batch: Batch<Click>, ctx: &mut BatchContext) -> Result<(), HandlerError> {
    let mut insert = String::from("INSERT INTO clicks (n, bytes) VALUES ");
    let rows: Vec<String> = (0..batch.len())
        .map(|i| format!("(?{}, ?{})", 2 * i + 1, 2 * i + 2))
        .collect();
    insert.push_str(&rows.join(", "));
    let mut query = courier::sqlx::query(courier::sqlx::AssertSqlSafe(insert));
    for click in batch.messages() {
        query = query
            .bind(i64::try_from(click.n).unwrap_or(i64::MAX))
            .bind(i64::try_from(click.payload.len()).unwrap_or(0));
    }
    query.execute(&mut *ctx.transaction::<courier::sqlx::Sqlite>()?).await?;
    let written = ctx.state::<Written>()?.0.clone();
    written.fetch_add(batch.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// An endpoint with a batch handler of `max` on the broker's own store drains `n`
/// prefilled messages of 1 KiB, `at_once` batches at once; returns messages per second,
/// from the endpoint's start until every row is written.
async fn batch_handler(n: u64, max: usize, at_once: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("migrations")).unwrap();
    std::fs::write(
        dir.path().join("migrations/0001_clicks.sql"),
        "CREATE TABLE clicks (n INTEGER PRIMARY KEY, bytes INTEGER NOT NULL);",
    )
    .unwrap();
    let migrator = courier::sqlx::migrate::Migrator::new(dir.path().join("migrations"))
        .await
        .unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("bench.db"))
        .migrations(migrator)
        .open()
        .await
        .unwrap();
    broker.create_queue("clicks", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("clicks", SenderOptions::default()).await.unwrap();
    let payload = "x".repeat(BODY - 40);
    for from in (0..n).step_by(100) {
        let batch = (from..(from + 100).min(n))
            .map(|k| {
                Click {
                    n: k,
                    payload: payload.clone(),
                }
                .to_envelope()
                .unwrap()
            })
            .collect();
        sender.send_batch(batch).await.unwrap();
    }
    let written = Written::default();
    let start = Instant::now();
    let endpoint = Endpoint::builder("clicks")
        .transport(broker.clone())
        .store(broker.store())
        .state(written.clone())
        .batch_handler(
            write_clicks,
            BatchOptions::new()
                .max_messages(max)
                .max_wait(Duration::from_millis(20))
                .concurrency(at_once),
        )
        .start()
        .await
        .unwrap();
    while written.0.load(Ordering::Relaxed) < n {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let rate = n as f64 / start.elapsed().as_secs_f64();
    let report = endpoint.shutdown().await.unwrap();
    assert_eq!(report.completed, n, "every message completed");
    let rows: i64 = courier::sqlx::query_scalar("SELECT count(*) FROM clicks")
        .fetch_one(broker.read_pool())
        .await
        .unwrap();
    assert_eq!(rows, i64::try_from(n).unwrap(), "each row once");
    broker.close().await;
    rate
}

/// Lets one scenario's writes settle before the next one starts: flushes the page cache
/// and waits 5 s. Without it, the kernel's writeback of the previous scenario's hundreds of
/// megabytes (and the deletion of its files) stalls the next scenario's writes; measured
/// here, p99 latency went from about 2 ms to 15-50 ms.
async fn quiesce() {
    let _ = std::process::Command::new("sync").status();
    tokio::time::sleep(Duration::from_secs(5)).await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// Sends at `rate` messages per second for `secs`; a receiver records send-to-receive
/// latency. Returns (p50, p99, count).
async fn latency(rate: f64, secs: f64) -> (Duration, Duration, usize) {
    let (p50, p99, n, _) = latency_detail(rate, secs).await;
    (p50, p99, n)
}

async fn latency_detail(rate: f64, secs: f64) -> (Duration, Duration, usize, Vec<Duration>) {
    let b = broker().await;
    b.broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = b.broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = b.broker.receiver(&EntityPath::queue("q")).await.unwrap();
    let base = Instant::now();
    let total = (rate * secs) as u64;
    let consumer = tokio::spawn(async move {
        let mut lat = Vec::with_capacity(total as usize);
        while (lat.len() as u64) < total {
            for d in receiver.receive(64, Duration::from_millis(200)).await.unwrap() {
                let sent_ns = u64::from_le_bytes(d.message().body()[..8].try_into().unwrap());
                lat.push(base.elapsed().saturating_sub(Duration::from_nanos(sent_ns)));
                tokio::spawn(d.complete());
            }
        }
        lat
    });
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sends = JoinSet::new();
    for _ in 0..total {
        ticker.tick().await;
        let sender = sender.clone();
        sends.spawn(async move {
            let mut b = body();
            b[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
            sender.send(Envelope::new(b)).await.unwrap();
        });
        while sends.try_join_next().is_some() {}
    }
    while sends.join_next().await.is_some() {}
    let mut lat = consumer.await.unwrap();
    lat.sort();
    b.broker.close().await;
    (percentile(&lat, 0.5), percentile(&lat, 0.99), lat.len(), lat)
}

/// Schedules `n` messages over the next `secs` seconds (system clock) and records how late
/// each is received after its scheduled time. Returns (p50, p99, max).
async fn schedule_lateness(n: usize, secs: f64) -> (Duration, Duration, Duration) {
    let b = broker().await;
    b.broker.create_queue("q", &QueueOptions::default()).await.unwrap();
    let sender = b.broker.sender("q", SenderOptions::default()).await.unwrap();
    let receiver = b.broker.receiver(&EntityPath::queue("q")).await.unwrap();
    // Scheduled in batches, all before the first one is due.
    let start = chrono::Utc::now() + chrono::Duration::milliseconds(1000);
    let all: Vec<Envelope> = (0..n)
        .map(|i| {
            let at = start + chrono::Duration::microseconds((secs * 1e6 * i as f64 / n as f64) as i64);
            Envelope::new(body()).with_scheduled_enqueue_time(at)
        })
        .collect();
    for chunk in all.chunks(100) {
        sender.send_batch(chunk.to_vec()).await.unwrap();
    }
    assert!(
        chrono::Utc::now() < start,
        "scheduling took too long to measure lateness"
    );
    let mut late = Vec::with_capacity(n);
    while late.len() < n {
        for d in receiver.receive(64, Duration::from_secs(2)).await.unwrap() {
            let now = chrono::Utc::now();
            let at = d.message().envelope.scheduled_enqueue_time.unwrap();
            late.push((now - at).to_std().unwrap_or(Duration::ZERO));
            tokio::spawn(d.complete());
        }
    }
    late.sort();
    b.broker.close().await;
    (percentile(&late, 0.5), percentile(&late, 0.99), *late.last().unwrap())
}

/// Runs the raw SQLite baseline; returns (handler 1 msg/tx, handler 10 msg/tx) at
/// synchronous=NORMAL and handler 1 msg/tx at synchronous=FULL.
fn baseline() -> Result<(f64, f64, f64), String> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/baselines/sqlite-handler-baseline.py");
    if !script.exists() {
        return Err(format!("{} not found", script.display()));
    }
    let out = std::process::Command::new("python3")
        .arg(&script)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!(
        "{}",
        text.lines().map(|l| format!("    baseline: {l}\n")).collect::<String>()
    );
    let find_in = |mode: &str, what: &str| {
        text.lines()
            .find(|l| l.starts_with(mode) && l.contains(what))
            .and_then(|l| l.split_whitespace().rev().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no '{mode} {what}' line in the baseline's output"))
    };
    let find = |what: &str| find_in("NORMAL", what);
    Ok((
        find("handler 1 msg/tx")?,
        find("handler 10 msg/tx")?,
        find_in("FULL", "handler 1 msg/tx")?,
    ))
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 1 } else { 4 };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        if let Some(rate) = std::env::args().skip_while(|a| a != "--latency").nth(1) {
            let rate: f64 = rate.parse().unwrap();
            let (p50, p99, n, lat) = latency_detail(rate, 5.0).await;
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            println!(
                "latency at {rate} msg/s, {n} messages: p50 {:.2} ms, p90 {:.2}, p99 {:.2}, p99.9 {:.2}, max {:.2}",
                ms(p50),
                ms(percentile(&lat, 0.9)),
                ms(p99),
                ms(percentile(&lat, 0.999)),
                ms(*lat.last().unwrap())
            );
            return;
        }
        if std::env::args().any(|a| a == "--batch-handlers") {
            let h10 = batch_handler(20_000 * scale, 10, 2).await;
            quiesce().await;
            let h100 = batch_handler(20_000 * scale, 100, 2).await;
            quiesce().await;
            let raw = baseline().map(|(_, b10raw, _)| b10raw);
            for (label, rate) in [("batch handler of 10", h10), ("batch handler of 100", h100)] {
                match &raw {
                    Ok(b10raw) => println!(
                        "  {label}, 2 at once: {rate:.0} msg/s, {:.0}% of the raw handler at 10 msg/tx ({b10raw:.0})",
                        100.0 * rate / b10raw
                    ),
                    Err(e) => println!("  {label}, 2 at once: {rate:.0} msg/s (baseline not measured: {e})"),
                }
            }
            return;
        }
        println!("embedded broker, file, durability NORMAL, {BODY} B messages");
        quiesce().await;
        let seq = one_at_a_time(2_000 * scale, 1, 1).await;
        println!("  one at a time, 1 sender / 1 receiver (strictly sequential): {seq:>9.0} msg/s");
        quiesce().await;
        let one = one_at_a_time(10_000 * scale, 64, 8).await;
        println!("  one at a time, 64 senders / 8 receivers (pipelined):        {one:>9.0} msg/s");
        quiesce().await;
        let (p50, p99, count) = latency(one / 2.0, if quick { 2.0 } else { 5.0 }).await;
        println!(
            "  latency at half load ({:.0} msg/s, {count} messages): p50 {:.2} ms, p99 {:.2} ms",
            one / 2.0,
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
        quiesce().await;
        let (s50, s99, smax) = schedule_lateness(2_000 * scale as usize, 2.0).await;
        println!(
            "  scheduled delivery after its time: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            s50.as_secs_f64() * 1e3,
            s99.as_secs_f64() * 1e3,
            smax.as_secs_f64() * 1e3
        );
        quiesce().await;
        let b10 = batched(20_000 * scale, 10, 8, 8).await;
        println!("  batches of 10, 8 senders / 8 receivers:                     {b10:>9.0} msg/s");
        quiesce().await;
        let b100 = batched(20_000 * scale, 100, 4, 2).await;
        println!("  batches of 100, 4 senders / 2 receivers:                    {b100:>9.0} msg/s");
        quiesce().await;
        let full = one_at_a_time_with(Durability::Full, 5_000 * scale, 64, 8).await;
        println!("  Durability::Full, one at a time, 64 senders / 8 receivers:  {full:>9.0} msg/s");
        quiesce().await;
        let h10 = batch_handler(20_000 * scale, 10, 2).await;
        println!("  batch handler of 10 (endpoint, own store), 2 at once:      {h10:>9.0} msg/s");
        quiesce().await;
        let h100 = batch_handler(20_000 * scale, 100, 2).await;
        println!("  batch handler of 100 (endpoint, own store), 2 at once:     {h100:>9.0} msg/s");
        quiesce().await;
        match baseline() {
            Ok((b1, b10raw, f1)) => {
                println!(
                    "  ratio Full one at a time / raw FULL handler 1 msg/tx: {:.0}% ({full:.0} / {f1:.0})",
                    100.0 * full / f1
                );
                println!(
                    "  ratio one at a time / raw handler 1 msg/tx:  {:.0}% ({one:.0} / {b1:.0})",
                    100.0 * one / b1
                );
                println!(
                    "  ratio batched (10) / raw handler 10 msg/tx:  {:.0}% ({b10:.0} / {b10raw:.0})",
                    100.0 * b10 / b10raw
                );
                println!(
                    "  ratio batched (100) / raw handler 10 msg/tx: {:.0}% ({b100:.0} / {b10raw:.0})",
                    100.0 * b100 / b10raw
                );
                println!(
                    "  ratio batch handler of 10 / raw handler 10 msg/tx:  {:.0}% ({h10:.0} / {b10raw:.0})",
                    100.0 * h10 / b10raw
                );
                println!(
                    "  ratio batch handler of 100 / raw handler 10 msg/tx: {:.0}% ({h100:.0} / {b10raw:.0})",
                    100.0 * h100 / b10raw
                );
            }
            Err(e) => println!("  baseline not measured: {e}"),
        }
    });
}
