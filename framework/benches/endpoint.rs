//! End-to-end handler throughput of an endpoint (no-op handler, 1 KiB JSON messages)
//! next to the raw embedded broker's receive + complete, measured in the same run on the
//! same kind of broker (a file, durability NORMAL), with the same parallelism.
//!
//! Run: `cargo bench -p courier --bench endpoint` (add `-- --quick` for a short run).
//! Each round drains a queue pre-filled with `n` messages, once with the raw API and once
//! with an endpoint, alternating; the median of the rounds is reported.
//!
//! `-- --metrics`: the endpoint without a metrics recorder next to the same endpoint
//! reporting to a Prometheus recorder (rendered every second, as a scrape would),
//! alternating in the same run (docs/observability.md).
//!
//! `-- --history`: the endpoint with the broker's store (the inbox in the broker's
//! transaction) and no history, next to the same endpoint keeping a history without
//! bodies (the default) and with bodies, alternating in the same run; prints each ratio
//! against the target of issue 33, 85% of the throughput without a history
//! (docs/history.md, "Cost").

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
use courier::{BoxFuture, Durability};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::task::JoinSet;

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Work")]
struct Work {
    n: u64,
    payload: String,
}

/// A no-op handler that counts and tells the bench when the last message arrived.
struct Count {
    seen: Arc<AtomicU64>,
    total: u64,
    done: Arc<Notify>,
}

impl Handler for Count {
    type Message = Work;
    fn name(&self) -> &'static str {
        "count"
    }
    fn handle<'a>(&'a self, _m: Work, _ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.total {
            self.done.notify_one();
        }
        Box::pin(async { Ok(()) })
    }
}

struct Bench {
    transport: Arc<dyn Transport>,
    broker: Embedded,
    dir: tempfile::TempDir,
}

/// A fresh broker file holding `n` messages of about 1 KiB of JSON in queue `work`.
async fn prefilled(n: u64) -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("bench.db"))
        .durability(Durability::Normal)
        .open()
        .await
        .unwrap();
    broker.create_queue("work", &QueueOptions::default()).await.unwrap();
    let sender = broker.sender("work", SenderOptions::default()).await.unwrap();
    let payload = "x".repeat(1000);
    let mut i = 0;
    while i < n {
        let batch: Vec<Envelope> = (i..(i + 100).min(n))
            .map(|k| {
                Work {
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
    Bench {
        transport: Arc::new(broker.clone()),
        broker,
        dir,
    }
}

/// Raw: `loops` receive loops, each taking up to `batch` messages per call and
/// completing them concurrently before it asks again. Messages per second.
async fn raw(n: u64, batch: usize, loops: usize) -> f64 {
    let b = prefilled(n).await;
    let receiver = b.transport.receiver(&EntityPath::queue("work")).await.unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..loops {
        let (receiver, done) = (receiver.clone(), done.clone());
        tasks.spawn(async move {
            while done.load(Ordering::Relaxed) < n {
                let got = receiver.receive(batch, Duration::from_millis(20)).await.unwrap();
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
    let rate = n as f64 / start.elapsed().as_secs_f64();
    b.transport.close().await;
    rate
}

/// Endpoint: `concurrency` handlers at once, the default prefetch (twice that); timed
/// from start until the graceful shutdown after the last message returned (every message
/// completed).
async fn endpoint(n: u64, concurrency: usize) -> f64 {
    endpoint_with(n, concurrency, concurrency * 2).await
}

async fn endpoint_with(n: u64, concurrency: usize, prefetch: usize) -> f64 {
    endpoint_recorded(n, concurrency, prefetch, None, false).await
}

/// As [`endpoint_with`], reporting to `recorder` when given: the endpoint registers its
/// metrics with it as it starts (the recorder is this thread's default meanwhile), and a
/// task renders the Prometheus text every second while the messages are handled.
async fn endpoint_recorded(
    n: u64,
    concurrency: usize,
    prefetch: usize,
    recorder: Option<&metrics_exporter_prometheus::PrometheusRecorder>,
    scrape_every_second: bool,
) -> f64 {
    let b = prefilled(n).await;
    let seen = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let start = Instant::now();
    let guard = recorder.map(|r| metrics::set_default_local_recorder(r));
    let running = Endpoint::builder("work")
        .transport(b.transport.clone())
        .concurrency(concurrency)
        .prefetch(prefetch)
        .handler(Count {
            seen: seen.clone(),
            total: n,
            done: done.clone(),
        })
        .start()
        .await
        .unwrap();
    drop(guard);
    let scrapes = recorder.filter(|_| scrape_every_second).map(|r| {
        let handle = r.handle();
        tokio::spawn(async move {
            let mut bytes = 0;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                bytes += handle.render().len();
                std::hint::black_box(bytes);
            }
        })
    });
    done.notified().await;
    if let Some(task) = scrapes {
        task.abort();
    }
    if let Some(r) = recorder {
        std::hint::black_box(r.handle().render());
    }
    let report = running.shutdown().await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(report.completed, n);
    b.transport.close().await;
    rate
}

async fn quiesce() {
    let _ = std::process::Command::new("sync").status();
    tokio::time::sleep(Duration::from_secs(3)).await;
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, rounds) = if quick { (5_000, 1) } else { (20_000, 3) };
    // `--rounds N`: more rounds, for a median that holds against the machine's spread.
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(rounds);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // `--profile endpoint|raw|store|history`: one long run of one scenario, for a profiler.
        if let Some(what) = std::env::args().skip_while(|a| a != "--profile").nth(1) {
            let rate = match what.as_str() {
                "raw" => raw(100_000, 16, 2).await,
                "raw1" => raw(100_000, 16, 1).await,
                "p32" => endpoint_with(100_000, 16, 32).await,
                "c32" => endpoint_with(100_000, 32, 16).await,
                "c8" => endpoint_with(100_000, 8, 8).await,
                // The broker's store, without and with a history (`--history`).
                "store" => endpoint_with_store(100_000, 16, None).await,
                "history" => endpoint_with_store(100_000, 16, Some(HistoryOptions::new())).await,
                _ => endpoint(100_000, 16).await,
            };
            println!("{what}: {rate:.0} msg/s");
            return;
        }
        // `--instructions off|on|raw N`: one run of N messages without or with a Prometheus
        // recorder (rendered once, at the end), or of the embedded broker alone (`raw`),
        // for `valgrind --tool=callgrind`, whose
        // instruction counts do not depend on what else the machine runs. The cost per
        // message is the difference of two sizes divided by their difference
        // (docs/observability.md, "What it costs").
        if let Some(mode) = std::env::args().skip_while(|a| a != "--instructions").nth(1) {
            let n: u64 = std::env::args()
                .skip_while(|a| a != "--instructions")
                .nth(2)
                .and_then(|n| n.parse().ok())
                .unwrap_or(2_000);
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets(&[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
                .unwrap()
                .build_recorder();
            let rate = match mode.as_str() {
                // The embedded broker alone: receive and complete, 16 at a time, 2 loops.
                "raw" => raw(n, 16, 2).await,
                _ => endpoint_recorded(n, 16, 32, (mode == "on").then_some(&recorder), false).await,
            };
            println!("instructions {mode}: {n} messages, {rate:.0} msg/s");
            return;
        }
        if std::env::args().any(|a| a == "--history") {
            history_overhead(n, rounds).await;
            return;
        }
        if std::env::args().any(|a| a == "--metrics") {
            metrics_overhead(n, rounds).await;
            return;
        }
        println!("endpoint vs raw embedded broker: file, durability NORMAL, ~1 KiB JSON, {n} messages, median of {rounds}");
        println!("  (raw: the best of 1 and 2 receive loops of that batch size; the endpoint runs that many");
        println!("   handlers at once with its default prefetch of twice as many)");
        for parallel in [16, 32] {
            let (mut r1, mut r2, mut e) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..rounds {
                quiesce().await;
                r1.push(raw(n, parallel, 1).await);
                quiesce().await;
                r2.push(raw(n, parallel, 2).await);
                quiesce().await;
                e.push(endpoint(n, parallel).await);
            }
            let (r1, r2, e) = (median(r1), median(r2), median(e));
            let r = r1.max(r2);
            let overhead_us = (1.0 / e - 1.0 / r) * 1e6;
            println!(
                "  {parallel:>2} at once: raw 1 loop {r1:>7.0} msg/s, 2 loops {r2:>7.0} msg/s | endpoint {e:>7.0} msg/s | {:>5.1}% of the best raw | overhead {overhead_us:+.1} us/msg",
                e / r * 100.0
            );
        }
    });
}

/// The endpoint without a recorder and with a Prometheus recorder, alternating.
async fn metrics_overhead(n: u64, rounds: usize) {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
        .unwrap()
        .build_recorder();
    println!(
        "endpoint without and with a Prometheus recorder: file, durability NORMAL, ~1 KiB JSON, {n} messages, median of {rounds}"
    );
    for parallel in [16, 32] {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            quiesce().await;
            off.push(endpoint_recorded(n, parallel, parallel * 2, None, true).await);
            quiesce().await;
            on.push(endpoint_recorded(n, parallel, parallel * 2, Some(&recorder), true).await);
        }
        let (off, on) = (median(off), median(on));
        println!(
            "  {parallel:>2} at once: without {off:>7.0} msg/s | with Prometheus {on:>7.0} msg/s | {:+.1}%",
            (on / off - 1.0) * 100.0
        );
    }
}

/// As [`endpoint`], with the broker's store (the inbox record in the broker's transaction
/// of the complete), keeping a history when `history` is given.
async fn endpoint_with_store(n: u64, concurrency: usize, history: Option<HistoryOptions>) -> f64 {
    let b = prefilled(n).await;
    let seen = Arc::new(AtomicU64::new(0));
    let done = Arc::new(Notify::new());
    let start = Instant::now();
    let mut builder = Endpoint::builder("work")
        .transport(b.transport.clone())
        .store(b.broker.store())
        .concurrency(concurrency)
        .prefetch(concurrency * 2)
        .handler(Count {
            seen: seen.clone(),
            total: n,
            done: done.clone(),
        });
    let keeps_history = history.is_some();
    if let Some(options) = history {
        builder = builder.history(options);
    }
    let running = builder.start().await.unwrap();
    done.notified().await;
    let report = running.shutdown().await.unwrap();
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(report.completed, n);
    let events = history_events(&b).await;
    assert_eq!(
        events,
        if keeps_history { n } else { 0 },
        "one handled event per message"
    );
    b.transport.close().await;
    rate
}

/// The events in the broker file's history (read after the run).
async fn history_events(b: &Bench) -> u64 {
    use sqlx::ConnectOptions;
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(b.dir.path().join("bench.db"))
        .read_only(true)
        .connect()
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_history_all")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    n as u64
}

/// The endpoint with the broker's store and no history, with a history (no bodies), and
/// with a history keeping bodies, alternating; the ratios against the target (85%).
async fn history_overhead(n: u64, rounds: usize) {
    println!(
        "endpoint with the broker's store, history off / on / on with bodies: file, durability NORMAL, ~1 KiB JSON, {n} messages, median of {rounds} (alternating)"
    );
    let variants = [
        ("history off", None),
        ("history on", Some(HistoryOptions::new())),
        ("history on + bodies", Some(HistoryOptions::new().with_bodies(true))),
    ];
    for parallel in [16, 32] {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for _ in 0..rounds {
            for (i, (_, history)) in variants.iter().enumerate() {
                quiesce().await;
                rates[i].push(endpoint_with_store(n, parallel, history.clone()).await);
            }
        }
        let medians: Vec<f64> = rates.iter().map(|r| median(r.clone())).collect();
        println!(
            "  {parallel:>2} at once: {} {:>7.0} msg/s (rounds {})",
            variants[0].0,
            medians[0],
            rounds_text(&rates[0])
        );
        for (i, (label, _)) in variants.iter().enumerate().skip(1) {
            let ratio = medians[i] / medians[0];
            println!(
                "             {label:<19} {:>7.0} msg/s (rounds {}) | {:>5.1}% of off (target >= 85%: {}) | {:+.1} us/msg",
                medians[i],
                rounds_text(&rates[i]),
                ratio * 100.0,
                if ratio >= 0.85 { "PASS" } else { "BELOW" },
                (1.0 / medians[i] - 1.0 / medians[0]) * 1e6
            );
        }
    }
}

fn rounds_text(v: &[f64]) -> String {
    v.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ")
}
