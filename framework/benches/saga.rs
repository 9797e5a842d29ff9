//! Saga throughput and timeout precision, on the embedded broker with each store.
//!
//! Run: `cargo bench -p courier --features postgres --bench saga` (add `-- --quick` for a
//! short run, `--only postgres` / `--skip-precision` for one part; Postgres is measured when `DATABASE_URL` names a server where the user may
//! create databases, default `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! * Throughput: instances per second for start + one continuing message + completion
//!   (three messages, three transactions per instance), 16 handlers at once.
//! * Timeout precision: `pending` timeouts stored (10 per instance), due one per
//!   millisecond (1,000 per second); how late each is handled (handler start minus due
//!   time), p50 / p99 / max.
//!
//! `-- --history`: the throughput alone, with each store, without a history, with one
//! (no bodies, the default) and with one keeping bodies, alternating in the same run; the
//! saga keeps a 200-byte note in its state, so each event holds a state before and after
//! of about 250 bytes. Prints each ratio against the target of issue 33, 85% of the
//! throughput without a history (docs/history.md, "Cost"); `--rounds N` (3 by default),
//! `--instances N`; `--variant off|on|bodies`: one variant alone, for a profiler.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs
)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use courier::prelude::*;
use courier::saga::{Correlate, Saga, SagaContext, SagaHandlers};
use courier::{BoxFuture, Durability, PostgresStore, RunningEndpoint, SqliteStore, Store};
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Open")]
struct Open {
    id: u64,
    /// Kept in the saga's state (`--history`: a realistic state's size).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
    /// Timeouts to request: due at these Unix milliseconds.
    due_ms: Vec<i64>,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Step")]
struct Step {
    id: u64,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Close")]
struct Close {
    id: u64,
}

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Tick")]
struct Tick {
    due_ms: i64,
}

#[derive(Default, Serialize, Deserialize)]
struct Bench {
    steps: u32,
    ticks: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    note: String,
}

/// Lateness of handled ticks, in milliseconds.
#[derive(Default)]
struct Lateness(Mutex<Vec<f64>>);

impl Bench {
    async fn open(&mut self, m: Open, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.note = m.note;
        for due in m.due_ms {
            let at = DateTime::<Utc>::from_timestamp_millis(due).unwrap();
            ctx.request_timeout_keyed_at(due.to_string(), at, &Tick { due_ms: due })?;
        }
        Ok(())
    }

    async fn step(&mut self, _m: Step, _ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        self.steps += 1;
        Ok(())
    }

    async fn close(&mut self, _m: Close, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        ctx.complete();
        Ok(())
    }

    async fn tick(&mut self, m: Tick, ctx: &mut SagaContext<'_>) -> Result<(), HandlerError> {
        let late = (Utc::now().timestamp_micros() - m.due_ms * 1000) as f64 / 1000.0;
        ctx.state::<Arc<Lateness>>()?.0.lock().unwrap().push(late);
        self.ticks += 1;
        Ok(())
    }
}

macro_rules! saga_fn {
    ($name:ident, $msg:ty) => {
        fn $name<'a, 'b>(
            s: &'a mut Bench,
            m: $msg,
            ctx: &'a mut SagaContext<'b>,
        ) -> BoxFuture<'a, Result<(), HandlerError>> {
            Box::pin(s.$name(m, ctx))
        }
    };
}

impl Saga for Bench {
    const NAME: &'static str = "bench.Bench";
    fn register(h: &mut SagaHandlers<Self>) {
        saga_fn!(open, Open);
        saga_fn!(step, Step);
        saga_fn!(close, Close);
        saga_fn!(tick, Tick);
        h.start("open", Correlate::by(|m: &Open| m.id.to_string()), open)
            .handle("step", Correlate::by(|m: &Step| m.id.to_string()), step)
            .handle("close", Correlate::by(|m: &Close| m.id.to_string()), close)
            .timeout("tick", tick);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    /// The store in the broker's own file: one transaction per message.
    Embedded,
    /// A SQLite store in a file of its own (inbox + outbox).
    Sqlite,
    /// Postgres (inbox + outbox), the broker in a SQLite file.
    Postgres,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Embedded => "embedded broker + its own file (one transaction)",
            Kind::Sqlite => "embedded broker + SQLite store file",
            Kind::Postgres => "embedded broker + Postgres store",
        }
    }
}

struct Setup {
    endpoint: RunningEndpoint,
    lateness: Arc<Lateness>,
    broker: Embedded,
    pg: Option<(String, sqlx::postgres::PgConnectOptions)>,
    _dir: tempfile::TempDir,
}

fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

async fn setup(kind: Kind, history: Option<HistoryOptions>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("broker.db"))
        .durability(Durability::Normal)
        .open()
        .await
        .unwrap();
    let mut pg = None;
    let store: Arc<dyn Store> = match kind {
        Kind::Embedded => Arc::new(broker.store()),
        Kind::Sqlite => Arc::new(SqliteStore::open(dir.path().join("store.db")).await.unwrap()),
        Kind::Postgres => {
            let admin: sqlx::postgres::PgConnectOptions = database_url().parse().unwrap();
            let name = format!("courier_bench_{}", uuid::Uuid::new_v4().simple());
            let mut conn = admin.connect().await.unwrap();
            sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                .execute(&mut conn)
                .await
                .unwrap();
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(16)
                .connect_with(admin.clone().database(&name))
                .await
                .unwrap();
            pg = Some((name, admin));
            Arc::new(PostgresStore::from_pool(pool))
        }
    };
    store.migrate().await.unwrap();
    let lateness = Arc::new(Lateness::default());
    let routes = Routes::new()
        .send::<Open>("bench")
        .send::<Step>("bench")
        .send::<Close>("bench");
    let mut builder = Endpoint::builder("bench")
        .transport(Arc::new(broker.clone()))
        .routes(routes)
        .store(store)
        .state(lateness.clone())
        .concurrency(16)
        .saga::<Bench>();
    if let Some(options) = history {
        builder = builder.history(options);
    }
    let endpoint = builder.start().await.unwrap();
    Setup {
        endpoint,
        lateness,
        broker,
        pg,
        _dir: dir,
    }
}

async fn teardown(s: Setup) {
    s.endpoint.shutdown().await.unwrap();
    s.broker.close().await;
    if let Some((name, admin)) = s.pg {
        let mut conn = admin.connect().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
        )))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}

/// Sends `messages` in batches and waits until the endpoint completed `until` in all.
async fn wave<M: courier::Message>(s: &Setup, messages: impl Iterator<Item = M>, until: u64) {
    let sender = s.broker.sender("bench", SenderOptions::default()).await.unwrap();
    let mut batch = Vec::new();
    for m in messages {
        batch.push(m.to_envelope().unwrap());
        if batch.len() == 100 {
            sender.send_batch(std::mem::take(&mut batch)).await.unwrap();
        }
    }
    if !batch.is_empty() {
        sender.send_batch(batch).await.unwrap();
    }
    while s.endpoint.stats().completed < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Instances per second: start, one step, completion.
async fn throughput(kind: Kind, n: u64) -> f64 {
    throughput_with(kind, n, None, "").await
}

/// As [`throughput`], keeping `note` in each instance's state and a history when
/// `history` is given.
async fn throughput_with(kind: Kind, n: u64, history: Option<HistoryOptions>, note: &str) -> f64 {
    let s = setup(kind, history).await;
    let start = Instant::now();
    wave(
        &s,
        (0..n).map(|id| Open {
            id,
            note: note.to_owned(),
            due_ms: Vec::new(),
        }),
        n,
    )
    .await;
    wave(&s, (0..n).map(|id| Step { id }), 2 * n).await;
    wave(&s, (0..n).map(|id| Close { id }), 3 * n).await;
    let rate = n as f64 / start.elapsed().as_secs_f64();
    assert_eq!(s.endpoint.stats().dead_lettered, 0);
    teardown(s).await;
    rate
}

/// Lateness (ms) of `pending` timeouts due 1,000 per second, starting `lead` after the
/// setup began.
async fn precision(kind: Kind, pending: u64, lead: Duration) -> (Vec<f64>, Duration) {
    let s = setup(kind, None).await;
    let first_due = Utc::now().timestamp_millis() + i64::try_from(lead.as_millis()).unwrap();
    let per_instance = 10u64;
    let instances = pending / per_instance;
    let setup_started = Instant::now();
    wave(
        &s,
        (0..instances).map(|id| Open {
            id,
            note: String::new(),
            due_ms: (0..per_instance)
                .map(|k| first_due + i64::try_from(k * instances + id).unwrap())
                .collect(),
        }),
        instances,
    )
    .await;
    let setup_took = setup_started.elapsed();
    let handled = Arc::new(AtomicU64::new(0));
    loop {
        let n = s.lateness.0.lock().unwrap().len() as u64;
        handled.store(n, Ordering::Relaxed);
        if n >= pending {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut late = std::mem::take(&mut *s.lateness.0.lock().unwrap());
    late.sort_by(f64::total_cmp);
    teardown(s).await;
    (late, setup_took)
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (n, pending, lead) = if quick {
        (500, 10_000, Duration::from_secs(10))
    } else {
        (2_000, 100_000, Duration::from_secs(40))
    };
    let with_pg = std::env::args().all(|a| a != "--no-postgres");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut kinds = vec![Kind::Embedded, Kind::Sqlite];
    if with_pg {
        kinds.push(Kind::Postgres);
    }
    // `--only embedded|sqlite|postgres`, `--skip-precision`: one part, for a profiler.
    if let Some(only) = std::env::args().skip_while(|a| a != "--only").nth(1) {
        kinds.retain(|k| match k {
            Kind::Embedded => only == "embedded",
            Kind::Sqlite => only == "sqlite",
            Kind::Postgres => only == "postgres",
        });
    }
    let precision_too = std::env::args().all(|a| a != "--skip-precision");
    if std::env::args().any(|a| a == "--history") {
        let rounds = std::env::args()
            .skip_while(|a| a != "--rounds")
            .nth(1)
            .map_or(if quick { 1 } else { 3 }, |v| v.parse().unwrap());
        let n = std::env::args()
            .skip_while(|a| a != "--instances")
            .nth(1)
            .map_or(n, |v| v.parse().unwrap());
        if let Some(variant) = std::env::args().skip_while(|a| a != "--variant").nth(1) {
            let history = match variant.as_str() {
                "off" => None,
                "on" => Some(HistoryOptions::new()),
                _ => Some(HistoryOptions::new().with_bodies(true)),
            };
            for &kind in &kinds {
                let rate = rt.block_on(throughput_with(kind, n, history.clone(), &"n".repeat(200)));
                println!("{} history {variant}: {rate:.0} instances/s", kind.label());
            }
            return;
        }
        rt.block_on(history_overhead(&kinds, n, rounds));
        return;
    }
    rt.block_on(async {
        println!("saga throughput: {n} instances, each start + one step + completion (3 messages), 16 at once");
        for &kind in &kinds {
            let rate = throughput(kind, n).await;
            println!(
                "  {:<50} {rate:>7.0} instances/s ({:>6.0} messages/s)",
                kind.label(),
                rate * 3.0
            );
        }
        println!(
            "timeout precision: {pending} timeouts pending, due 1,000 per second from {} s after the start",
            lead.as_secs()
        );
        for &kind in kinds.iter().filter(|_| precision_too) {
            let (late, setup) = precision(kind, pending, lead).await;
            println!(
                "  {:<50} lateness p50 {:>6.1} ms, p99 {:>6.1} ms, max {:>7.1} ms (setup {:.1} s{})",
                kind.label(),
                pct(&late, 0.5),
                pct(&late, 0.99),
                late.last().copied().unwrap_or(0.0),
                setup.as_secs_f64(),
                if setup > lead {
                    ", LONGER than the lead: early timeouts were late"
                } else {
                    ""
                }
            );
        }
    });
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Lets the disk settle between measurements.
async fn quiesce() {
    let _ = std::process::Command::new("sync").status();
    tokio::time::sleep(Duration::from_secs(2)).await;
}

/// Each store without a history, with one (no bodies) and with one keeping bodies,
/// alternating; the ratios against the target (85%).
async fn history_overhead(kinds: &[Kind], n: u64, rounds: usize) {
    let note = "n".repeat(200);
    println!(
        "saga throughput, history off / on / on with bodies: {n} instances, each start + one step + completion (3 messages), 16 at once, a state of ~250 bytes, median of {rounds} (alternating)"
    );
    let variants = [
        ("history off", None),
        ("history on", Some(HistoryOptions::new())),
        ("history on + bodies", Some(HistoryOptions::new().with_bodies(true))),
    ];
    for &kind in kinds {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for _ in 0..rounds {
            for (i, (_, history)) in variants.iter().enumerate() {
                quiesce().await;
                rates[i].push(throughput_with(kind, n, history.clone(), &note).await);
            }
        }
        let medians: Vec<f64> = rates.iter().map(|r| median(r.clone())).collect();
        let rounds_text = |v: &[f64]| v.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / ");
        println!("  {}", kind.label());
        println!(
            "    {:<19} {:>6.0} instances/s (rounds {})",
            variants[0].0,
            medians[0],
            rounds_text(&rates[0])
        );
        for (i, (label, _)) in variants.iter().enumerate().skip(1) {
            let ratio = medians[i] / medians[0];
            println!(
                "    {label:<19} {:>6.0} instances/s (rounds {}) | {:>5.1}% of off (target >= 85%: {}) | {:+.1} us/message",
                medians[i],
                rounds_text(&rates[i]),
                ratio * 100.0,
                if ratio >= 0.85 { "PASS" } else { "BELOW" },
                (1.0 / medians[i] - 1.0 / medians[0]) * 1e6 / 3.0
            );
        }
    }
}
