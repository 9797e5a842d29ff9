//! Throughput of the RabbitMQ transport next to raw lapin, measured in the same run
//! against the same broker, with the same limits: 1 KiB bodies, at most `F` publishes
//! awaiting their confirm, a consumer prefetch of `P`, one connection per side.
//!
//! Run (needs a RabbitMQ, `AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! `cargo bench -p courier --features amqp,postgres --bench amqp` (add `-- --quick` for a
//! short run, `-- --profile` for where the time of the receive scenarios goes).
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
//! | receive, completes spawned | (the same raw figure) | `receive(P, wait)`, each `complete` spawned |
//! | end to end | send and receive above at the same time | the same |
//!
//! The receive scenarios drain a queue holding N messages written by Courier's sender
//! (the same bytes on both sides); the time includes opening the consumer.

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

fn confirmed(c: Confirmation) {
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
    let channel = raw_confirm_channel(&b.raw).await;
    let permits = Arc::new(Semaphore::new(F));
    let q: Arc<str> = q.into();
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let permit = permits.clone().acquire_owned().await.unwrap();
        let (channel, q, body) = (channel.clone(), q.clone(), b.body.clone());
        tasks.spawn(async move {
            let confirm = channel
                .basic_publish("".into(), q.as_ref().into(), mandatory(), &body, raw_properties())
                .await
                .unwrap();
            confirmed(confirm.await.unwrap());
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
                confirmed(c.await.unwrap());
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

/// Raw lapin: prefetch `P`, consume, ack each delivery in turn, until `n`.
async fn raw_receive(conn: &Connection, q: &str, n: u64) -> (Duration, Split) {
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
    let mut got = 0;
    while got < n {
        let t = Instant::now();
        let d = consumer.next().await.unwrap().unwrap();
        let t2 = Instant::now();
        split.receive += t2 - t;
        split.calls += 1;
        d.acker.ack(BasicAckOptions::default()).await.unwrap();
        split.settle += t2.elapsed();
        got += 1;
    }
    let elapsed = start.elapsed();
    let _ = channel.close(200, "done".into()).await;
    (elapsed, split)
}

/// Courier: `receive(P, wait)`, then `complete` each delivery in turn (or all spawned at
/// once), until `n`.
async fn courier_receive(receiver: &Arc<dyn Receiver>, n: u64, spawned: bool) -> (Duration, Split) {
    let start = Instant::now();
    let mut split = Split::default();
    let mut got = 0;
    while got < n {
        let t = Instant::now();
        let batch = receiver.receive(usize::from(P), Duration::from_secs(10)).await.unwrap();
        let t2 = Instant::now();
        split.receive += t2 - t;
        split.calls += 1;
        got += batch.len() as u64;
        if spawned {
            let mut completes = JoinSet::new();
            for d in batch {
                completes.spawn(d.complete());
            }
            while let Some(r) = completes.join_next().await {
                r.unwrap().unwrap();
            }
        } else {
            for d in batch {
                d.complete().await.unwrap();
            }
        }
        split.settle += t2.elapsed();
    }
    (start.elapsed(), split)
}

/// Raw lapin, end to end: the send and receive scenarios at the same time.
async fn raw_end_to_end(b: &Arc<Bench>, q: &str, n: u64) -> Duration {
    let start = Instant::now();
    let consumer = {
        let (b, q) = (b.clone(), q.to_owned());
        tokio::spawn(async move { raw_receive(&b.raw, &q, n).await })
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
    SendBatch,
    Receive,
    ReceiveSpawned,
    EndToEnd,
}

impl Scenario {
    const ALL: [Scenario; 5] = [
        Scenario::Send,
        Scenario::SendBatch,
        Scenario::Receive,
        Scenario::ReceiveSpawned,
        Scenario::EndToEnd,
    ];

    fn label(self) -> &'static str {
        match self {
            Scenario::Send => "send (confirmed, F in flight)",
            Scenario::SendBatch => "send, batches of 100",
            Scenario::Receive => "receive + ack/complete in turn",
            Scenario::ReceiveSpawned => "receive, completes spawned",
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

/// One side of one scenario on fresh queues; returns msg/s.
async fn measure(b: &Arc<Bench>, s: Scenario, raw: bool, n: u64) -> f64 {
    let q = if raw {
        b.raw_queue("raw").await
    } else {
        b.courier_queue("courier").await
    };
    let elapsed = match (s, raw) {
        (Scenario::Send, true) => raw_send(b, &q, n).await,
        (Scenario::Send, false) => courier_send(b, &q, n).await,
        (Scenario::SendBatch, true) => raw_send_batch(b, &q, n).await,
        (Scenario::SendBatch, false) => courier_send_batch(b, &q, n).await,
        (Scenario::Receive | Scenario::ReceiveSpawned, true) => {
            b.prefill(&q, n).await;
            let (d, split) = raw_receive(&b.raw, &q, n).await;
            if b.profile {
                println!("    raw lapin:                {}", per_message(split, n));
            }
            d
        }
        (Scenario::Receive | Scenario::ReceiveSpawned, false) => {
            b.prefill(&q, n).await;
            let receiver = b.transport.receiver(&EntityPath::queue(&q)).await.unwrap();
            let spawned = s == Scenario::ReceiveSpawned;
            let (d, split) = courier_receive(&receiver, n, spawned).await;
            if b.profile {
                let what = if spawned {
                    "Courier (spawned):"
                } else {
                    "Courier:          "
                };
                println!("    {what}         {}", per_message(split, n));
            }
            d
        }
        (Scenario::EndToEnd, true) => raw_end_to_end(b, &q, n).await,
        (Scenario::EndToEnd, false) => courier_end_to_end(b, &q, n).await,
    };
    if raw {
        b.raw_delete(&q).await;
    } else {
        b.courier_delete(&q).await;
    }
    rate(n, elapsed)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let profile = std::env::args().any(|a| a == "--profile");
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
        let version = raw
            .server_properties()
            .inner()
            .get("version")
            .map(|v| match v {
                AMQPValue::LongString(s) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
                other => format!("{other:?}"),
            })
            .unwrap_or_else(|| "?".into());
        let b = Arc::new(Bench {
            transport,
            raw,
            body: Bytes::from(vec![b'x'; BODY]),
            next: AtomicU64::new(0),
            profile,
        });
        println!(
            "RabbitMQ {version}, quorum queues; {n} messages of {BODY} B per scenario, at most {F} in flight, \
             prefetch {P}, {ROUNDS} rounds (medians); load at start {}",
            load()
        );
        let mut raw_rates: Vec<Vec<f64>> = vec![Vec::new(); Scenario::ALL.len()];
        let mut courier_rates: Vec<Vec<f64>> = vec![Vec::new(); Scenario::ALL.len()];
        for round in 0..ROUNDS {
            for (i, s) in Scenario::ALL.into_iter().enumerate() {
                // The raw figure of ReceiveSpawned is the same scenario as Receive's.
                let raw_side = s != Scenario::ReceiveSpawned;
                let raw_first = (round + i) % 2 == 0;
                for side in [raw_first, !raw_first] {
                    if side && !raw_side {
                        continue;
                    }
                    let r = measure(&b, s, side, n).await;
                    if side {
                        raw_rates[i].push(r);
                    } else {
                        courier_rates[i].push(r);
                    }
                }
            }
            println!("  round {} done, load {}", round + 1, load());
        }
        // The raw side of "completes spawned" is the raw receive scenario.
        raw_rates[3] = raw_rates[2].clone();
        println!();
        println!(
            "{:<32} {:>11} {:>13} {:>7}   rounds raw | Courier (msg/s)",
            "scenario", "raw msg/s", "Courier msg/s", "ratio"
        );
        for (i, s) in Scenario::ALL.into_iter().enumerate() {
            let (r, c) = (median(&raw_rates[i]), median(&courier_rates[i]));
            let list = |v: &[f64]| v.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ");
            println!(
                "{:<32} {:>11.0} {:>13.0} {:>6.0}%   {} | {}",
                s.label(),
                r,
                c,
                100.0 * c / r,
                list(&raw_rates[i]),
                list(&courier_rates[i])
            );
        }
        println!("load at end {}", load());
        b.transport.close().await;
        let _ = b.raw.close(200, "done".into()).await;
    });
}
