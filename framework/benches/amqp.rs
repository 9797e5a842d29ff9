//! Throughput of the RabbitMQ transport next to raw lapin, measured in the same run
//! against the same broker, with the same limits: 1 KiB bodies, at most `F` publishes
//! awaiting their confirm, a consumer prefetch of `P`, one connection per side.
//!
//! Run (needs a RabbitMQ, `AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! `cargo bench -p courier --features amqp,postgres --bench amqp` (add `-- --quick` for a
//! short run, `-- --rounds 7` for more rounds, `-- --only receive` for the scenarios whose
//! name contains `receive`, `-- --profile` for where the time goes).
//!
//! Every scenario runs on fresh, uniquely named quorum queues declared with the arguments
//! Courier's `create_queue` uses (the raw side declares them itself), which are deleted
//! afterwards. Each of 3 rounds runs raw and Courier, alternating which goes first; the
//! table shows the medians.
//!
//! | scenario | raw lapin | Courier |
//! |---|---|---|
//! | send | a task per message (at most F): `basic_publish`, await the confirm | a task per message (at most F): `Sender::send` |
//! | send, batches of 100 | a task per 100 (at most F messages): publish 100, await the 100 confirms | a task per 100: `Sender::send_batch` |
//! | receive | `basic_qos(P)`, `basic_consume`, `ack` each delivery in turn | `receive(P, wait)`, `complete` each delivery in turn |
//! | receive, settles spawned | each `ack` spawned, not awaited | `receive(P - running completes, wait)`, each `complete` spawned, not awaited |
//! | end to end | send and receive above at the same time | the same |
//!
//! The receive scenarios drain a queue holding N messages written by Courier's sender
//! (the same bytes on both sides); the time includes opening the consumer.
//!
//! Columns: the medians of raw and Courier; `ratio`, Courier / raw of the medians;
//! `paired ratio`, the median of each round's Courier / raw (the two ran back to back, so
//! it suffers less from a machine whose load changes); CPU time per message of this
//! process (both clients) and of the broker (`beam.smp`, when it runs on this machine),
//! from `/proc` in 10 ms ticks. `--profile` adds a scenario (a raw publisher sending
//! Courier's properties and headers), the cost of a `timeout(Duration::ZERO, ..)`, the cost
//! of each per-message step Courier adds, and where each receive scenario spends its time.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    missing_docs
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use courier::{AmqpTransport, EntityPath, Envelope, QueueOptions, Receiver, Sender, SenderOptions, Transport};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Body size.
const BODY: usize = 1024;
/// Publishes awaiting their confirm, at most (both sides).
const F: usize = 256;
/// Consumer prefetch (both sides).
const P: u16 = 64;
/// Batch size of the batched send.
const BATCH: usize = 100;
/// Rounds; the table shows the medians.
const ROUNDS: usize = 3;

struct Bench {
    transport: AmqpTransport,
    raw: Connection,
    body: Bytes,
    next: AtomicU64,
    profile: bool,
    /// The broker's pid, when it runs on this machine (for its CPU time).
    broker: Option<String>,
}

/// Where a receive scenario spent its time: waiting for deliveries, and settling them.
#[derive(Default, Clone, Copy)]
struct Split {
    receive: Duration,
    settle: Duration,
    calls: u64,
}

impl Bench {
    /// A fresh queue name, unique in this run and across runs.
    fn name(&self, what: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("bench-amqp-{}-{n}-{what}", std::process::id())
    }

    /// The arguments `courier`'s `create_queue` gives a queue (`conn.rs`, `queue_arguments`).
    fn courier_like_arguments(queue: &str) -> FieldTable {
        let mut args = FieldTable::default();
        args.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        args.insert("x-delivery-limit".into(), AMQPValue::LongLongInt(9));
        args.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
        args.insert(
            "x-dead-letter-routing-key".into(),
            AMQPValue::LongString(format!("{queue}::dlq").as_str().into()),
        );
        args.insert(
            "x-dead-letter-strategy".into(),
            AMQPValue::LongString("at-least-once".into()),
        );
        args.insert("x-overflow".into(), AMQPValue::LongString("reject-publish".into()));
        args
    }

    async fn raw_queue(&self, what: &str) -> String {
        let q = self.name(what);
        let c = self.raw.create_channel().await.unwrap();
        let mut quorum = FieldTable::default();
        quorum.insert("x-queue-type".into(), AMQPValue::LongString("quorum".into()));
        c.queue_declare(
            format!("{q}::dlq").as_str().into(),
            QueueDeclareOptions::durable(),
            quorum,
        )
        .await
        .unwrap();
        c.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions::durable(),
            Self::courier_like_arguments(&q),
        )
        .await
        .unwrap();
        c.close(200, "declared".into()).await.unwrap();
        q
    }

    async fn raw_delete(&self, q: &str) {
        let c = self.raw.create_channel().await.unwrap();
        c.queue_delete(q.into(), QueueDeleteOptions::default()).await.unwrap();
        c.queue_delete(format!("{q}::dlq").as_str().into(), QueueDeleteOptions::default())
            .await
            .unwrap();
        c.close(200, "deleted".into()).await.unwrap();
    }

    async fn courier_queue(&self, what: &str) -> String {
        let q = self.name(what);
        self.transport.create_queue(&q, &QueueOptions::default()).await.unwrap();
        q
    }

    async fn courier_delete(&self, q: &str) {
        self.transport.delete(&EntityPath::queue(q)).await.unwrap();
    }

    async fn courier_sender(&self, q: &str) -> Arc<dyn Sender> {
        self.transport
            .sender(q, SenderOptions::default().max_in_flight(F))
            .await
            .unwrap()
    }

    /// Fills `q` with `n` messages through Courier's sender (not measured).
    async fn prefill(&self, q: &str, n: u64) {
        let sender = self.courier_sender(q).await;
        let mut tasks = JoinSet::new();
        let mut left = n;
        while left > 0 {
            let k = left.min(BATCH as u64);
            left -= k;
            let (sender, body) = (sender.clone(), self.body.clone());
            tasks.spawn(async move {
                let batch = (0..k).map(|_| Envelope::new(body.clone())).collect();
                sender.send_batch(batch).await.unwrap();
            });
            while tasks.len() >= 8 {
                tasks.join_next().await.unwrap().unwrap();
            }
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
    }
}

fn confirmed(c: &Confirmation) {
    assert!(matches!(c, Confirmation::Ack(None)), "publish not confirmed: {c:?}");
}

fn raw_properties() -> BasicProperties {
    BasicProperties::default().with_delivery_mode(2)
}

async fn raw_confirm_channel(conn: &Connection) -> Channel {
    let c = conn.create_channel().await.unwrap();
    c.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    c
}

fn mandatory() -> BasicPublishOptions {
    BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    }
}

/// Raw lapin: a task per message, at most `F` at once, each publishes and awaits its
/// confirm. Returns the elapsed time.
async fn raw_send(b: &Bench, q: &str, n: u64) -> Duration {
    raw_send_with(b, q, n, false).await
}

/// [`raw_send`], with Courier's properties and headers when `same_wire`.
async fn raw_send_with(b: &Bench, q: &str, n: u64, same_wire: bool) -> Duration {
    let channel = raw_confirm_channel(&b.raw).await;
    let permits = Arc::new(Semaphore::new(F));
    let q: Arc<str> = q.into();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (channel, q, body) = (channel.clone(), q.clone(), b.body.clone());
        tasks.spawn(async move {
            let properties = if same_wire {
                let id = uuid::Uuid::now_v7().to_string();
                courier_like_properties(&id, chrono::Utc::now(), 1)
            } else {
                raw_properties()
            };
            let confirm = channel
                .basic_publish("".into(), q.as_ref().into(), mandatory(), &body, properties)
                .await
                .unwrap();
            confirmed(&confirm.await.unwrap());
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            r.unwrap();
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let elapsed = start.elapsed();
    let _ = channel.close(200, "done".into()).await;
    elapsed
}

/// Courier: a task per message, at most `F` at once (the sender's own bound is `F` too),
/// each `send`s.
async fn courier_send(b: &Bench, q: &str, n: u64) -> Duration {
    let sender = b.courier_sender(q).await;
    let permits = Arc::new(Semaphore::new(F));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (sender, body) = (sender.clone(), b.body.clone());
        tasks.spawn(async move {
            sender.send(Envelope::new(body)).await.unwrap();
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            r.unwrap();
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    start.elapsed()
}

/// Raw lapin: a task per `BATCH` messages, at most `F` messages at once; each publishes
/// its messages, then awaits their confirms.
async fn raw_send_batch(b: &Bench, q: &str, n: u64) -> Duration {
    let channel = raw_confirm_channel(&b.raw).await;
    let permits = Arc::new(Semaphore::new(F));
    let q: Arc<str> = q.into();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n / BATCH as u64 {
        let permit = permits.clone().acquire_many_owned(BATCH as u32).await.unwrap();
        let (channel, q, body) = (channel.clone(), q.clone(), b.body.clone());
        tasks.spawn(async move {
            let mut confirms = Vec::with_capacity(BATCH);
            for _ in 0..BATCH {
                let c = channel
                    .basic_publish("".into(), q.as_ref().into(), mandatory(), &body, raw_properties())
                    .await
                    .unwrap();
                confirms.push(c);
            }
            for c in confirms {
                confirmed(&c.await.unwrap());
            }
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            r.unwrap();
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    let elapsed = start.elapsed();
    let _ = channel.close(200, "done".into()).await;
    elapsed
}

/// Courier: a task per `BATCH` messages, at most `F` messages at once, each `send_batch`.
async fn courier_send_batch(b: &Bench, q: &str, n: u64) -> Duration {
    let sender = b.courier_sender(q).await;
    let permits = Arc::new(Semaphore::new(F));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n / BATCH as u64 {
        let permit = permits.clone().acquire_many_owned(BATCH as u32).await.unwrap();
        let (sender, body) = (sender.clone(), b.body.clone());
        tasks.spawn(async move {
            let batch = (0..BATCH).map(|_| Envelope::new(body.clone())).collect();
            sender.send_batch(batch).await.unwrap();
            drop(permit);
        });
        while let Some(r) = tasks.try_join_next() {
            r.unwrap();
        }
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap();
    }
    start.elapsed()
}

/// Raw lapin: prefetch `P`, consume, ack each delivery in turn (or spawn each ack), until `n`.
async fn raw_receive(conn: &Connection, q: &str, n: u64, spawned: bool) -> (Duration, Split) {
    let start = Instant::now();
    let channel = conn.create_channel().await.unwrap();
    channel.basic_qos(P, BasicQosOptions::default()).await.unwrap();
    let mut consumer = channel
        .basic_consume(
            q.into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut split = Split::default();
    let mut acks = JoinSet::new();
    let mut got = 0;
    while got < n {
        let t = Instant::now();
        let d = consumer.next().await.unwrap().unwrap();
        let t2 = Instant::now();
        split.receive += t2 - t;
        split.calls += 1;
        if spawned {
            acks.spawn(async move { d.acker.ack(BasicAckOptions::default()).await });
            while let Some(r) = acks.try_join_next() {
                assert!(r.unwrap().unwrap());
            }
        } else {
            assert!(d.acker.ack(BasicAckOptions::default()).await.unwrap());
        }
        split.settle += t2.elapsed();
        got += 1;
    }
    while let Some(r) = acks.join_next().await {
        assert!(r.unwrap().unwrap());
    }
    let elapsed = start.elapsed();
    let _ = channel.close(200, "done".into()).await;
    (elapsed, split)
}

/// Courier: `receive(P, wait)`, then `complete` each delivery in turn, until `n`. Or, with
/// `spawned`, each `complete` is spawned and not awaited (as the raw side's acks), and each
/// `receive` asks for `P` less the completes still running (as the endpoint asks for its
/// prefetch less what it holds), so that the prefetch stays `P`.
async fn courier_receive(receiver: &Arc<dyn Receiver>, n: u64, spawned: bool) -> (Duration, Split) {
    let start = Instant::now();
    let mut split = Split::default();
    let mut completes: JoinSet<courier::Result<()>> = JoinSet::new();
    let mut got = 0;
    while got < n {
        while let Some(r) = completes.try_join_next() {
            r.unwrap().unwrap();
        }
        let room = usize::from(P) - completes.len();
        if room == 0 {
            completes.join_next().await.unwrap().unwrap().unwrap();
            continue;
        }
        let t = Instant::now();
        let batch = receiver.receive(room, Duration::from_secs(10)).await.unwrap();
        let t2 = Instant::now();
        split.receive += t2 - t;
        split.calls += 1;
        got += batch.len() as u64;
        for d in batch {
            if spawned {
                completes.spawn(d.complete());
            } else {
                d.complete().await.unwrap();
            }
        }
        split.settle += t2.elapsed();
    }
    while let Some(r) = completes.join_next().await {
        r.unwrap().unwrap();
    }
    (start.elapsed(), split)
}

/// Raw lapin, end to end: the send and receive scenarios at the same time.
async fn raw_end_to_end(b: &Arc<Bench>, q: &str, n: u64) -> Duration {
    let start = Instant::now();
    let consumer = {
        let (b, q) = (b.clone(), q.to_owned());
        tokio::spawn(async move { raw_receive(&b.raw, &q, n, false).await })
    };
    raw_send(b, q, n).await;
    consumer.await.unwrap();
    start.elapsed()
}

/// Courier, end to end: the send and receive scenarios at the same time.
async fn courier_end_to_end(b: &Arc<Bench>, q: &str, n: u64) -> Duration {
    let receiver = b.transport.receiver(&EntityPath::queue(q)).await.unwrap();
    let start = Instant::now();
    let consumer = tokio::spawn(async move { courier_receive(&receiver, n, false).await });
    courier_send(b, q, n).await;
    consumer.await.unwrap();
    start.elapsed()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Send,
    /// `--profile` only: the raw side publishes what Courier publishes (a fresh message
    /// id, a timestamp, the enqueued-time and sequence-number headers), which tells the
    /// broker's share of the send gap from the client's.
    SendSameWire,
    SendBatch,
    Receive,
    ReceiveSpawned,
    EndToEnd,
}

impl Scenario {
    const ALL: [Scenario; 6] = [
        Scenario::Send,
        Scenario::SendSameWire,
        Scenario::SendBatch,
        Scenario::Receive,
        Scenario::ReceiveSpawned,
        Scenario::EndToEnd,
    ];

    fn label(self) -> &'static str {
        match self {
            Scenario::Send => "send (confirmed, F in flight)",
            Scenario::SendSameWire => "send, raw with Courier's headers",
            Scenario::SendBatch => "send, batches of 100",
            Scenario::Receive => "receive + ack/complete in turn",
            Scenario::ReceiveSpawned => "receive, acks/completes spawned",
            Scenario::EndToEnd => "end to end (send + receive)",
        }
    }
}

fn rate(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn per_message(split: Split, n: u64) -> String {
    format!(
        "receive {:.1} us/msg, ack/complete {:.1} us/msg, {:.1} msgs per receive call",
        split.receive.as_secs_f64() * 1e6 / n as f64,
        split.settle.as_secs_f64() * 1e6 / n as f64,
        n as f64 / split.calls.max(1) as f64
    )
}

/// CPU time (user + system) a process used so far, from `/proc/<pid>/stat` (clock ticks
/// of 10 ms).
fn cpu_time(pid: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// The broker's process on this machine (`beam.smp`), when there is one.
fn broker_pid() -> Option<String> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid = e.file_name().into_string().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        (comm.trim() == "beam.smp").then_some(pid)
    })
}

/// One side of one scenario.
#[derive(Clone, Copy)]
struct Measured {
    rate: f64,
    /// CPU of this process (both client libraries' threads and the bench) per message.
    client_us: f64,
    /// CPU of the broker per message, when it runs here.
    broker_us: f64,
}

/// One side of one scenario on fresh queues.
async fn measure(b: &Arc<Bench>, s: Scenario, raw: bool, n: u64) -> Measured {
    let q = if raw {
        b.raw_queue("raw").await
    } else {
        b.courier_queue("courier").await
    };
    let receiving = matches!(s, Scenario::Receive | Scenario::ReceiveSpawned);
    if receiving {
        b.prefill(&q, n).await;
    }
    let receiver = if receiving && !raw {
        Some(b.transport.receiver(&EntityPath::queue(&q)).await.unwrap())
    } else {
        None
    };
    let spawned = s == Scenario::ReceiveSpawned;
    let broker = b.broker.as_deref();
    let (client0, broker0) = (cpu_time("self"), broker.and_then(cpu_time));
    let elapsed = match (s, &receiver) {
        (Scenario::Send, _) if raw => raw_send(b, &q, n).await,
        (Scenario::SendSameWire, _) if raw => raw_send_with(b, &q, n, true).await,
        (Scenario::Send | Scenario::SendSameWire, _) => courier_send(b, &q, n).await,
        (Scenario::SendBatch, _) if raw => raw_send_batch(b, &q, n).await,
        (Scenario::SendBatch, _) => courier_send_batch(b, &q, n).await,
        (Scenario::Receive | Scenario::ReceiveSpawned, None) => {
            let (d, split) = raw_receive(&b.raw, &q, n, spawned).await;
            if b.profile {
                let what = if spawned {
                    "raw lapin (spawned):"
                } else {
                    "raw lapin:          "
                };
                println!("    {what}  {}", per_message(split, n));
            }
            d
        }
        (Scenario::Receive | Scenario::ReceiveSpawned, Some(receiver)) => {
            let (d, split) = courier_receive(receiver, n, spawned).await;
            if b.profile {
                let what = if spawned {
                    "Courier (spawned):  "
                } else {
                    "Courier:            "
                };
                println!("    {what}  {}", per_message(split, n));
            }
            d
        }
        (Scenario::EndToEnd, _) if raw => raw_end_to_end(b, &q, n).await,
        (Scenario::EndToEnd, _) => courier_end_to_end(b, &q, n).await,
    };
    let per = |t0: Option<Duration>, t1: Option<Duration>| match (t0, t1) {
        (Some(a), Some(b)) => (b - a).as_secs_f64() * 1e6 / n as f64,
        _ => f64::NAN,
    };
    let client_us = per(client0, cpu_time("self"));
    let broker_us = per(broker0, broker.and_then(cpu_time));
    drop(receiver);
    if raw {
        b.raw_delete(&q).await;
    } else {
        b.courier_delete(&q).await;
    }
    Measured {
        rate: rate(n, elapsed),
        client_us,
        broker_us,
    }
}

/// How long `tokio::time::timeout(Duration::ZERO, f)` takes to give up on a future that is
/// not ready (what `AmqpReceiver::receive` does to end a batch), next to polling it once.
async fn timeout_zero_probe() {
    let k = 200u32;
    let t = Instant::now();
    for _ in 0..k {
        let _ = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>()).await;
    }
    let zero = t.elapsed() / k;
    let t = Instant::now();
    for _ in 0..k {
        let _ = futures_lite::future::poll_once(std::future::pending::<()>()).await;
    }
    let once = t.elapsed() / k;
    println!("  probe: timeout(Duration::ZERO, not ready) takes {zero:?}; poll_once takes {once:?}");
}

/// What the settler map costs per delivery in `receiver.rs`: an insert in `accept`, a
/// remove in `settle` and another in the settler's `Drop`.
type PendingMap = std::sync::Mutex<std::collections::HashMap<courier::LockToken, std::sync::Weak<()>>>;

/// `wire::properties` as Courier builds them (message id, delivery mode, timestamp, the
/// enqueued-time and sequence-number headers), to time them.
fn courier_like_properties(message_id: &str, now: chrono::DateTime<chrono::Utc>, seq: i64) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-courier-enqueued-time".into(),
        AMQPValue::LongLongInt(now.timestamp_millis()),
    );
    headers.insert("x-courier-sequence-number".into(), AMQPValue::LongLongInt(seq));
    BasicProperties::default()
        .with_message_id(message_id.into())
        .with_delivery_mode(2)
        .with_timestamp(u64::try_from(now.timestamp()).unwrap_or(0))
        .with_headers(headers)
}

/// Times, one thread, no contention, the per-message steps Courier adds to lapin's.
async fn step_costs(b: &Bench) {
    const K: u32 = 100_000;
    fn each<T>(what: &str, mut f: impl FnMut() -> T) {
        let t = Instant::now();
        for _ in 0..K {
            std::hint::black_box(f());
        }
        println!(
            "    {what:<62} {:>7.0} ns",
            t.elapsed().as_nanos() as f64 / f64::from(K)
        );
    }
    let q = b.courier_queue("steps").await;
    b.prefill(&q, 1).await;
    let receiver = b.transport.receiver(&EntityPath::queue(&q)).await.unwrap();
    let d = receiver
        .receive(1, Duration::from_secs(10))
        .await
        .unwrap()
        .pop()
        .unwrap();
    println!("  per-message steps (ns per call, one thread):");
    each("send: Envelope::new (Uuid::now_v7 + to_string)", || {
        Envelope::new(b.body.clone())
    });
    let m = Envelope::new(b.body.clone());
    each("send: wire::properties (replica)", || {
        courier_like_properties(&m.message_id, chrono::Utc::now(), 1)
    });
    each("receive: Uuid::new_v4 (the lock token)", uuid::Uuid::new_v4);
    each("receive: ReceivedMessage clone (accept's `message.clone()`)", || {
        d.message().clone()
    });
    let channel = b.raw.create_channel().await.unwrap();
    each("lapin Channel clone + drop", || channel.clone());
    let slot = tokio::sync::Mutex::new(Some(channel.clone()));
    let t = Instant::now();
    for _ in 0..K {
        let guard = slot.lock().await;
        let c = guard.as_ref().filter(|c| c.status().connected()).cloned();
        drop(guard);
        std::hint::black_box(c);
    }
    println!(
        "    {:<62} {:>7.0} ns",
        "send: ConfirmChannel::get (tokio Mutex, status, Channel clone)",
        t.elapsed().as_nanos() as f64 / f64::from(K)
    );
    let pending = PendingMap::default();
    let weak = std::sync::Weak::new();
    each("receive: pending map insert + 2 removes (std Mutex, HashMap)", || {
        let token = courier::LockToken::from_uuid(uuid::Uuid::from_u128(7));
        pending.lock().unwrap().insert(token, weak.clone());
        pending.lock().unwrap().remove(&token);
        pending.lock().unwrap().remove(&token)
    });
    d.complete().await.unwrap();
    let _ = channel.close(200, "done".into()).await;
    drop(receiver);
    b.courier_delete(&q).await;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let profile = args.iter().any(|a| a == "--profile");
    let rounds: usize = args
        .iter()
        .skip_while(|a| *a != "--rounds")
        .nth(1)
        .map_or(ROUNDS, |r| r.parse().unwrap());
    let only: Option<String> = args.iter().skip_while(|a| *a != "--only").nth(1).cloned();
    let n: u64 = if quick { 5_000 } else { 20_000 };
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let transport = AmqpTransport::connect(url.clone()).await.unwrap_or_else(|e| {
            panic!("cannot connect to RabbitMQ at AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f): {e}")
        });
        let raw = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        let b = Arc::new(Bench {
            transport,
            raw,
            body: Bytes::from(vec![b'x'; BODY]),
            next: AtomicU64::new(0),
            profile,
            broker: broker_pid(),
        });
        println!(
            "RabbitMQ, quorum queues; {n} messages of {BODY} B per scenario, at most {F} in flight, \
             prefetch {P}, {rounds} rounds (medians); load at start {}",
            load()
        );
        if profile {
            timeout_zero_probe().await;
            step_costs(&b).await;
        }
        let mut all: Vec<[Vec<Measured>; 2]> = vec![[Vec::new(), Vec::new()]; Scenario::ALL.len()];
        for round in 0..rounds {
            for (i, s) in Scenario::ALL.into_iter().enumerate() {
                if only.as_ref().is_some_and(|o| !s.label().contains(o.as_str()))
                    || (s == Scenario::SendSameWire && !profile)
                {
                    continue;
                }
                let raw_first = (round + i) % 2 == 0;
                for raw in [raw_first, !raw_first] {
                    let m = measure(&b, s, raw, n).await;
                    all[i][usize::from(!raw)].push(m);
                }
            }
            println!("  round {} done, load {}", round + 1, load());
        }
        println!();
        println!(
            "{:<32} {:>9} {:>9} {:>6} {:>6}   {:>15}   {:>15}   rounds raw | Courier (msg/s)",
            "scenario", "raw msg/s", "Courier", "ratio", "paired", "client us/msg", "broker us/msg"
        );
        println!(
            "{:<32} {:>9} {:>9} {:>6} {:>6}   {:>15}   {:>15}",
            "", "", "msg/s", "", "ratio", "raw / Courier", "raw / Courier"
        );
        for (i, s) in Scenario::ALL.into_iter().enumerate() {
            let [raw, courier] = &all[i];
            if raw.is_empty() {
                continue;
            }
            let med = |v: &[Measured], f: fn(&Measured) -> f64| median(&v.iter().map(f).collect::<Vec<_>>());
            let (r, c) = (med(raw, |m| m.rate), med(courier, |m| m.rate));
            let list = |v: &[Measured]| v.iter().map(|m| format!("{:.0}", m.rate)).collect::<Vec<_>>().join(" ");
            // Raw and Courier of one round ran back to back: their ratio is less exposed to
            // the machine's load changing between rounds than the ratio of the medians.
            let paired: Vec<f64> = raw.iter().zip(courier).map(|(r, c)| c.rate / r.rate).collect();
            println!(
                "{:<32} {:>9.0} {:>9.0} {:>5.0}% {:>5.0}%   {:>6.1} / {:>6.1}   {:>6.1} / {:>6.1}   {} | {}",
                s.label(),
                r,
                c,
                100.0 * c / r,
                100.0 * median(&paired),
                med(raw, |m| m.client_us),
                med(courier, |m| m.client_us),
                med(raw, |m| m.broker_us),
                med(courier, |m| m.broker_us),
                list(raw),
                list(courier)
            );
        }
        println!("load at end {}", load());
        b.transport.close().await;
        let _ = b.raw.close(200, "done".into()).await;
    });
}
