//! Throughput of endpoints on a RabbitMQ session queue next to the same endpoints on a
//! plain queue, with 1, 2 and 4 consumer processes on one machine, in one run (issue 35,
//! "Scale"). The target: with 4 processes, sessions reach at least 70% of the plain
//! queue's throughput (the paired ratio below); the output says whether they did.
//!
//! Run (needs a RabbitMQ, `AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! `cargo bench -p courier --features amqp,postgres --bench amqp_sessions` (add `-- --quick`
//! for a short run: 5,000 messages in 250 sessions, 1 round; `-- --rounds 5` for more
//! rounds; `-- --messages 40000`, `-- --sessions 500` to change the load;
//! `-- --concurrency 16` for the endpoints' concurrency; `-- --processes 4` or
//! `-- --processes 1,4` for some process counts only; `-- --only sessions` or
//! `-- --only plain` for one mode only).
//!
//! **What one measurement is.** A fresh, uniquely named queue, created through
//! `AmqpTransport::create_queue`: a session queue (`QueueOptions::requires_session(true)`,
//! on RabbitMQ 16 single-active-consumer quorum partition queues
//! `<queue>::session-<i>-of-16`, docs/rabbitmq.md "Sessions") or a plain one (one quorum
//! queue). It is preloaded, before anything is timed, with `M` messages (20,000 by
//! default) of about 1 KiB of JSON (`bench.SessionWork`: a session number, the message's
//! number in its session, a payload) through Courier's sender, in batches of 100: `S`
//! sessions (1,000 by default), round-robin, so each session has `M / S` messages (20),
//! sent in their order (every session's message `j` is confirmed before any session's
//! message `j + 1` is sent). The plain queue gets the same bodies without a session id.
//! Then `k` consumer processes start: this bench binary again (`--consumer <queue>
//! sessions|plain <concurrency>`), each opens its own `AmqpTransport` and tells the parent
//! it is ready; when all are, the parent writes `go` to each and the clock starts. Each
//! child then starts a Courier endpoint on the queue (concurrency 8, the default
//! prefetch, immediate retries only, no store, a handler that counts and checks the
//! order) and reports its count on stdout every 10 ms. The clock stops when the counts
//! of the children add up to `M` and `Transport::counts` of the queue (polled every
//! 50 ms from then on) shows no message left. Throughput = `M` / that time: it includes
//! the endpoints' start (on a session queue: the hub's 16 consumers, and the balance
//! that shares the partitions between the processes every 2 s) but not the processes'
//! start-up nor the connection. Then the parent writes `stop`, each child shuts its
//! endpoint down and reports its totals, and the queue is deleted (also when a
//! measurement fails: each runs in a task, the children are killed when it unwinds).
//!
//! **Rounds.** For each process count, each round measures sessions and plain back to
//! back, alternating which goes first (3 rounds; the table shows the medians). `ratio` is
//! sessions / plain of the medians; `paired` the median of each round's sessions / plain
//! (the two ran back to back, so it suffers less from a machine whose load changes): the
//! target is judged on the paired ratio at 4 processes. The load average is printed per
//! process count: the processes, the bench and the broker share this machine's cores.
//!
//! **The order check.** With sessions, each child remembers per session the highest
//! message number it handled; a message of a session with a lower number is a
//! *backwards* violation, one with the same number a *repeat* (a redelivery). A session
//! moves between processes only at a hand-over of its partition (after the old holder
//! settled everything of it), so the check is per process: weaker than a global one, but
//! a session that went backwards in one process shows (the first 3 of each process are
//! printed on stderr, with the partition and the time since `go`). The table prints the sums, the
//! totals handled (more than `M` means repeats) and how the messages and partitions were
//! shared between the processes (the partition of a session is 64-bit FNV-1a of its id
//! modulo 16, as the sender computes it).
//!
//! **The number of partitions** is not chosen per queue: it is 16 in this version
//! (`SESSION_PARTITIONS` in `framework/src/amqp/sessions.rs`), part of the partition
//! queues' names, and bounds the processes that share a session queue's work (one active
//! consumer per partition). Changing it is a repartitioning (a new session queue,
//! drained into by switching senders first), docs/rabbitmq.md "The partition count".

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    missing_docs
)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use courier::prelude::*;
use courier::{AmqpTransport, BoxFuture};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

/// The partition count of a session queue on RabbitMQ (`SESSION_PARTITIONS`).
const PARTITIONS: u16 = 16;
/// Payload characters: with the rest of the JSON, about 1 KiB per message.
const PAYLOAD: usize = 1000;
/// Messages per send batch of the preload.
const BATCH: usize = 100;
/// Rounds; the table shows the medians.
const ROUNDS: usize = 3;
/// The endpoints' concurrency (session workers per process, with sessions).
const CONCURRENCY: usize = 8;
/// Sessions / plain at 4 processes, at least.
const TARGET: f64 = 0.70;
/// A measurement that takes longer than this failed.
const DEADLINE: Duration = Duration::from_secs(600);

#[derive(Serialize, Deserialize, courier::Message)]
#[message(name = "bench.SessionWork")]
struct Work {
    session: u32,
    seq: u32,
    payload: String,
}

fn session_id(s: u32) -> String {
    format!("session-{s:05}")
}

/// The partition of `session` among 16, as the sender computes it (docs/rabbitmq.md).
fn partition_of(session: &str) -> u16 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    u16::try_from(hash % u64::from(PARTITIONS)).unwrap()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Sessions,
    Plain,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Mode::Sessions => "sessions",
            Mode::Plain => "plain",
        }
    }
    fn options(self) -> QueueOptions {
        QueueOptions::default().requires_session(self == Mode::Sessions)
    }
}

// ---- the consumer process ----

/// What a child's handler saw.
#[derive(Default)]
struct Seen {
    handled: AtomicU64,
    /// Per session: the highest message number handled.
    last: Mutex<HashMap<u32, u32>>,
    backwards: AtomicU64,
    repeats: AtomicU64,
    /// Per partition: the messages handled.
    partitions: Mutex<[u64; PARTITIONS as usize]>,
}

/// A no-op handler that counts and checks each session's order.
struct Check {
    seen: Arc<Seen>,
    sessions: bool,
    go: Instant,
}

impl Handler for Check {
    type Message = Work;
    fn name(&self) -> &'static str {
        "check"
    }
    fn handle<'a>(&'a self, m: Work, _ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        if self.sessions {
            let mut last = self.seen.last.lock().unwrap();
            match last.get(&m.session).copied() {
                Some(l) if m.seq < l => {
                    // The first few, on stderr: which session, partition, numbers, when.
                    if self.seen.backwards.fetch_add(1, Ordering::Relaxed) < 3 {
                        let id = session_id(m.session);
                        eprintln!(
                            "  consumer {}: {id} (partition {}) message {} after message {l}, {} ms after go",
                            std::process::id(),
                            partition_of(&id),
                            m.seq,
                            self.go.elapsed().as_millis()
                        );
                    }
                }
                Some(l) if m.seq == l => {
                    self.seen.repeats.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    last.insert(m.session, m.seq);
                }
            }
            drop(last);
            self.seen.partitions.lock().unwrap()[usize::from(partition_of(&session_id(m.session)))] += 1;
        }
        self.seen.handled.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(()) })
    }
}

/// `--consumer <queue> <mode> <concurrency>`: connects, says `ready`, waits for `go` on
/// stdin, runs an endpoint on the queue reporting `n <handled>` every 10 ms, and at
/// `stop` (or the end of stdin) shuts it down and says
/// `done <handled> <backwards> <repeats> <start ms> <per-partition counts, comma-separated>`.
fn consumer(url: &str, queue: &str, mode: &str, concurrency: usize) {
    let sessions = mode == "sessions";
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                return;
            }
        }
        let _ = tx.send("stop".into());
    });
    let say = |line: String| {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let transport: Arc<dyn Transport> = Arc::new(AmqpTransport::connect(url).await.unwrap());
        say("ready".into());
        while rx.recv().await.as_deref().is_some_and(|l| l != "go") {}
        let go = Instant::now();
        let seen = Arc::new(Seen::default());
        let options = if sessions {
            QueueOptions::default().requires_session(true)
        } else {
            QueueOptions::default()
        };
        let running = Endpoint::builder(queue)
            .transport(transport.clone())
            .queue_options(options)
            .recoverability(RetryPolicy::default().immediate(3).delayed([]))
            .concurrency(concurrency)
            .shutdown_timeout(Duration::from_secs(10))
            .handler(Check {
                seen: seen.clone(),
                sessions,
                go,
            })
            .start()
            .await
            .unwrap();
        let started = go.elapsed();
        let reporter = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut told = u64::MAX;
                loop {
                    let n = seen.handled.load(Ordering::Relaxed);
                    if n != told {
                        say(format!("n {n}"));
                        told = n;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        while rx.recv().await.as_deref().is_some_and(|l| l != "stop") {}
        running.shutdown().await.unwrap();
        reporter.abort();
        let partitions = seen.partitions.lock().unwrap().map(|n| n.to_string()).join(",");
        say(format!(
            "done {} {} {} {} {partitions}",
            seen.handled.load(Ordering::Relaxed),
            seen.backwards.load(Ordering::Relaxed),
            seen.repeats.load(Ordering::Relaxed),
            started.as_millis()
        ));
        transport.close().await;
    });
}

// ---- the parent ----

/// A child's totals, from its `done` line.
#[derive(Clone, Debug, Default)]
struct Totals {
    handled: u64,
    backwards: u64,
    repeats: u64,
    start_ms: u64,
    partitions: Vec<u64>,
}

/// A consumer process: killed when dropped (a failed measurement).
struct Consumer {
    child: Child,
    stdin: Option<ChildStdin>,
    handled: Arc<AtomicU64>,
    ready: Arc<AtomicU64>,
    totals: Arc<Mutex<Option<Totals>>>,
}

impl Consumer {
    fn spawn(queue: &str, mode: Mode, concurrency: usize) -> Consumer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--consumer", queue, mode.arg(), &concurrency.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (handled, ready) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let totals = Arc::new(Mutex::new(None));
        {
            let (handled, ready, totals) = (handled.clone(), ready.clone(), totals.clone());
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { return };
                    let words: Vec<&str> = line.split_whitespace().collect();
                    match words.as_slice() {
                        ["ready"] => ready.store(1, Ordering::Release),
                        ["n", n] => handled.store(n.parse().unwrap_or(0), Ordering::Release),
                        ["done", h, b, r, s, p] => {
                            let num = |w: &str| w.parse::<u64>().unwrap_or(0);
                            *totals.lock().unwrap() = Some(Totals {
                                handled: num(h),
                                backwards: num(b),
                                repeats: num(r),
                                start_ms: num(s),
                                partitions: p.split(',').map(num).collect(),
                            });
                        }
                        _ => {}
                    }
                }
            });
        }
        Consumer {
            child,
            stdin,
            handled,
            ready,
            totals,
        }
    }

    fn tell(&mut self, what: &str) {
        if let Some(stdin) = self.stdin.as_mut() {
            stdin.write_all(format!("{what}\n").as_bytes()).unwrap();
            stdin.flush().unwrap();
        }
    }

    /// Says `stop`, waits for the totals and the exit.
    async fn stop(mut self) -> Totals {
        self.tell("stop");
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(t) = self.totals.lock().unwrap().clone()
                && self.child.try_wait().unwrap().is_some()
            {
                return t;
            }
            assert!(Instant::now() < until, "a consumer did not stop within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One measurement.
#[derive(Clone, Debug)]
struct Measured {
    rate: f64,
    elapsed: Duration,
    totals: Vec<Totals>,
}

struct Load {
    messages: u64,
    sessions: u32,
    concurrency: usize,
}

/// Fills `queue` with the load (not timed): every session's message `j`, in batches of
/// `BATCH` sent at once, confirmed before any session's message `j + 1` is sent.
async fn preload(sender: &Arc<dyn Sender>, mode: Mode, load: &Load) {
    let payload = "x".repeat(PAYLOAD);
    let per_session = u32::try_from(load.messages / u64::from(load.sessions)).unwrap();
    for seq in 0..per_session {
        let mut sends = JoinSet::new();
        let envelopes: Vec<Envelope> = (0..load.sessions)
            .map(|session| {
                let e = Work {
                    session,
                    seq,
                    payload: payload.clone(),
                }
                .to_envelope()
                .unwrap();
                match mode {
                    Mode::Sessions => e.with_session_id(session_id(session)),
                    Mode::Plain => e,
                }
            })
            .collect();
        let mut envelopes = envelopes.into_iter().peekable();
        while envelopes.peek().is_some() {
            let batch: Vec<Envelope> = envelopes.by_ref().take(BATCH).collect();
            let sender = sender.clone();
            sends.spawn(async move { sender.send_batch(batch).await.unwrap() });
        }
        while let Some(r) = sends.join_next().await {
            r.unwrap();
        }
    }
}

/// One measurement on the fresh queue `queue` (created by the caller, deleted by it).
async fn measure(transport: Arc<AmqpTransport>, queue: String, mode: Mode, k: usize, load: Arc<Load>) -> Measured {
    let sender = transport
        .sender(&queue, SenderOptions::default().max_in_flight(256))
        .await
        .unwrap();
    preload(&sender, mode, &load).await;
    let path = EntityPath::queue(&queue);
    assert_eq!(
        transport.counts(&path).await.unwrap().active,
        load.messages,
        "preloaded"
    );
    let mut consumers: Vec<Consumer> = (0..k)
        .map(|_| Consumer::spawn(&queue, mode, load.concurrency))
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while consumers.iter().any(|c| c.ready.load(Ordering::Acquire) == 0) {
        assert!(Instant::now() < until, "a consumer was not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for c in &mut consumers {
        c.tell("go");
    }
    let start = Instant::now();
    let handled = |cs: &[Consumer]| cs.iter().map(|c| c.handled.load(Ordering::Acquire)).sum::<u64>();
    while handled(&consumers) < load.messages {
        assert!(
            start.elapsed() < DEADLINE,
            "{mode:?}, {k} processes: {} of {} handled after {DEADLINE:?}",
            handled(&consumers),
            load.messages
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while transport.counts(&path).await.unwrap().active > 0 {
        assert!(start.elapsed() < DEADLINE, "{mode:?}, {k} processes: messages left");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = start.elapsed();
    let mut totals = Vec::new();
    for c in consumers {
        totals.push(c.stop().await);
    }
    Measured {
        rate: load.messages as f64 / elapsed.as_secs_f64(),
        elapsed,
        totals,
    }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter().skip_while(|a| *a != name).nth(1).cloned()
}

/// One line about a measurement: time, endpoints' start, and the share of each process.
fn describe(m: &Measured) -> String {
    let share: Vec<String> = m
        .totals
        .iter()
        .map(|t| {
            let parts = t.partitions.iter().filter(|&&n| n > 0).count();
            if t.partitions.iter().any(|&n| n > 0) {
                format!("{} msgs/{parts} partitions", t.handled)
            } else {
                format!("{} msgs", t.handled)
            }
        })
        .collect();
    let start = m.totals.iter().map(|t| t.start_ms).max().unwrap_or(0);
    format!(
        "{:>6.0} msg/s in {:>5.2} s (endpoint start {start} ms; {})",
        m.rate,
        m.elapsed.as_secs_f64(),
        share.join(" | ")
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    if let Some(at) = args.iter().position(|a| a == "--consumer") {
        let queue = &args[at + 1];
        let mode = &args[at + 2];
        let concurrency = args[at + 3].parse().unwrap();
        consumer(&url, queue, mode, concurrency);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = arg(&args, "--rounds").map_or(if quick { 1 } else { ROUNDS }, |r| r.parse().unwrap());
    let messages: u64 = arg(&args, "--messages").map_or(if quick { 5_000 } else { 20_000 }, |m| m.parse().unwrap());
    let sessions: u32 = arg(&args, "--sessions").map_or(if quick { 250 } else { 1_000 }, |s| s.parse().unwrap());
    let concurrency: usize = arg(&args, "--concurrency").map_or(CONCURRENCY, |c| c.parse().unwrap());
    let processes: Vec<usize> =
        arg(&args, "--processes").map_or(vec![1, 2, 4], |p| p.split(',').map(|k| k.parse().unwrap()).collect());
    let modes: Vec<Mode> = match arg(&args, "--only").as_deref() {
        Some("sessions") => vec![Mode::Sessions],
        Some("plain") => vec![Mode::Plain],
        _ => vec![Mode::Sessions, Mode::Plain],
    };
    assert!(
        messages.is_multiple_of(u64::from(sessions)),
        "--messages must be a multiple of --sessions"
    );
    let load = Arc::new(Load {
        messages,
        sessions,
        concurrency,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let transport = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap_or_else(|e| {
            panic!("cannot connect to RabbitMQ at AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f): {e}")
        }));
        println!(
            "RabbitMQ, quorum queues: a session queue of {PARTITIONS} partitions vs a plain queue; {messages} messages \
             of ~1 KiB JSON ({sessions} sessions x {} in order, round-robin), endpoints of concurrency {concurrency}, \
             no store, no-op handler; {rounds} round(s), medians; load at start {}",
            messages / u64::from(sessions),
            loadavg()
        );
        let mut next = 0u32;
        // [process count][mode] -> measurements.
        let mut all: Vec<[Vec<Measured>; 2]> = vec![[Vec::new(), Vec::new()]; processes.len()];
        let mut loads: Vec<String> = vec![String::new(); processes.len()];
        for round in 0..rounds {
            for (i, &k) in processes.iter().enumerate() {
                let mut order = modes.clone();
                if (round + i) % 2 == 1 {
                    order.reverse();
                }
                for mode in order {
                    next += 1;
                    let queue = format!("bench-sessions-{}-{next}-{}", std::process::id(), mode.arg());
                    transport.create_queue(&queue, &mode.options()).await.unwrap();
                    let run = tokio::spawn(measure(transport.clone(), queue.clone(), mode, k, load.clone())).await;
                    // Deleted also when the measurement failed (its consumers were killed).
                    transport.delete(&EntityPath::queue(&queue)).await.unwrap();
                    let m = match run {
                        Ok(m) => m,
                        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                        Err(e) => panic!("{e}"),
                    };
                    println!(
                        "  round {} | {k} process(es) | {:<8} {}",
                        round + 1,
                        mode.arg(),
                        describe(&m)
                    );
                    all[i][usize::from(mode == Mode::Plain)].push(m);
                }
                loads[i] = loadavg();
            }
        }
        println!();
        println!(
            "{:>9} {:>10} {:>10} {:>6} {:>7}   {:>22}   {:>14}   rounds sessions | plain (msg/s)",
            "processes", "sessions", "plain", "ratio", "paired", "order check (sessions)", "load avg"
        );
        println!(
            "{:>9} {:>10} {:>10} {:>6} {:>7}   {:>22}",
            "", "msg/s", "msg/s", "", "ratio", "handled/back/repeats"
        );
        let mut verdict = None;
        for (i, &k) in processes.iter().enumerate() {
            let [s, p] = &all[i];
            let rates = |v: &[Measured]| v.iter().map(|m| m.rate).collect::<Vec<_>>();
            let (ms, mp) = (median(&rates(s)), median(&rates(p)));
            let paired: Vec<f64> = s.iter().zip(p).map(|(s, p)| s.rate / p.rate).collect();
            let paired = median(&paired);
            let sum = |f: fn(&Totals) -> u64| s.iter().flat_map(|m| &m.totals).map(f).sum::<u64>();
            let list = |v: &[Measured]| v.iter().map(|m| format!("{:.0}", m.rate)).collect::<Vec<_>>().join(" ");
            println!(
                "{k:>9} {ms:>10.0} {mp:>10.0} {:>5.0}% {:>6.0}%   {:>22}   {:>14}   {} | {}",
                100.0 * ms / mp,
                100.0 * paired,
                format!("{}/{}/{}", sum(|t| t.handled), sum(|t| t.backwards), sum(|t| t.repeats)),
                loads[i],
                list(s),
                list(p)
            );
            if k == 4 && !paired.is_nan() {
                verdict = Some(paired);
            }
        }
        let backwards: u64 = all
            .iter()
            .flat_map(|m| &m[0])
            .flat_map(|m| &m.totals)
            .map(|t| t.backwards)
            .sum();
        println!(
            "order: {}",
            if backwards == 0 {
                "no session went backwards in any process".to_owned()
            } else {
                format!("{backwards} VIOLATIONS: messages of a session handled after a later one of it")
            }
        );
        match verdict {
            Some(r) => println!(
                "target: sessions >= {:.0}% of plain at 4 processes (paired ratio): {:.0}%, {}",
                TARGET * 100.0,
                r * 100.0,
                if r >= TARGET { "met" } else { "NOT met" }
            ),
            None => println!(
                "target: sessions >= {:.0}% of plain at 4 processes: not measured in this run",
                TARGET * 100.0
            ),
        }
        println!("load at end {}", loadavg());
        transport.close().await;
    });
}
