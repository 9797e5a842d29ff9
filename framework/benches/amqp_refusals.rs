//! Refusing a message against dead-lettering one, on RabbitMQ, in the same run (issue 31,
//! point 9): a burst of refused messages must cost no more than a burst of messages the
//! endpoint dead-letters, and must not hold back the valid message behind it.
//!
//! Run (needs a RabbitMQ, `AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! `cargo bench -p courier --features amqp --bench amqp_refusals` (`-- --quick` for 300
//! messages a burst, `-- --rounds 5` for more rounds).
//!
//! Each round fills two fresh queues (declared by Courier's `create_queue`, deleted
//! afterwards) with N messages of 1 KiB through raw lapin, then one valid message of a
//! type the endpoint handles:
//!
//! - **refused**: message ids of 200 bytes (Courier's ids have at most 128): the
//!   receiver refuses each (`courier.InvalidWireFormat`) and moves it to the dead-letter
//!   queue itself;
//! - **dead-lettered**: a message type no handler knows: the endpoint dead-letters each
//!   (`courier.UnknownMessageType`) through its settlement.
//!
//! Then one endpoint (no store, 16 at once, prefetch 64) starts on the queue; the time runs
//! from its start until the dead-letter queue holds N (the rate: N / time) and until the
//! valid message behind them is handled (`valid after`). The two kinds alternate which
//! goes first; the table shows the medians and each round.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use courier::{
    AmqpTransport, BoxFuture, Context, Endpoint, EntityPath, Handler, HandlerError, QueueOptions, Routes,
    RunningEndpoint, Transport,
};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

/// Messages a burst.
const N: u64 = 2_000;
/// Rounds; the table shows the medians.
const ROUNDS: usize = 3;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Valid")]
struct Valid {
    n: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Refused,
    DeadLettered,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Refused => "refused (id of 200 bytes)",
            Kind::DeadLettered => "dead-lettered (unknown type)",
        }
    }
}

struct Measured {
    rate: f64,
    valid_after: Duration,
}

async fn fill(raw: &Connection, queue: &str, kind: Kind, n: u64) {
    let channel = raw.create_channel().await.unwrap();
    channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
    let body = vec![b' '; 1024];
    let mut confirms = Vec::new();
    for i in 0..=n {
        let (id, kind_name, body) = if i == n {
            (
                format!("valid-{i}"),
                "bench.Valid",
                serde_json::to_vec(&Valid { n: i }).unwrap(),
            )
        } else {
            match kind {
                Kind::Refused => (format!("{i:0>200}"), "bench.Valid", body.clone()),
                Kind::DeadLettered => (format!("dead-{i}"), "bench.Nobody", body.clone()),
            }
        };
        let p = BasicProperties::default()
            .with_message_id(ShortString::from(id))
            .with_type(ShortString::from(kind_name))
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2);
        let c = channel
            .basic_publish("".into(), queue.into(), BasicPublishOptions::default(), &body, p)
            .await
            .unwrap();
        confirms.push(c);
        if confirms.len() >= 512 {
            for c in confirms.drain(..) {
                c.await.unwrap();
            }
        }
    }
    for c in confirms {
        c.await.unwrap();
    }
    let _ = channel.close(200, "done".into()).await;
}

/// Tells the bench the valid message was handled.
struct Notifying(Arc<Notify>);

impl Handler for Notifying {
    type Message = Valid;
    fn name(&self) -> &'static str {
        "valid"
    }
    fn handle<'a>(&'a self, _m: Valid, _ctx: &'a mut Context) -> BoxFuture<'a, Result<(), HandlerError>> {
        self.0.notify_one();
        Box::pin(async { Ok(()) })
    }
}

async fn endpoint(transport: &Arc<AmqpTransport>, queue: &str, handled: Arc<Notify>) -> RunningEndpoint {
    let handler = Notifying(handled);
    Endpoint::builder(queue)
        .transport(transport.clone())
        .routes(Routes::new().send::<Valid>(queue))
        .concurrency(16)
        .prefetch(64)
        .handler(handler)
        .start()
        .await
        .unwrap()
}

async fn measure(transport: &Arc<AmqpTransport>, raw: &Connection, kind: Kind, n: u64, round: usize) -> Measured {
    let queue = format!("bench-refusals-{}-{round}-{kind:?}", std::process::id()).to_lowercase();
    transport.create_queue(&queue, &QueueOptions::default()).await.unwrap();
    fill(raw, &queue, kind, n).await;
    let handled = Arc::new(Notify::new());
    let started = Instant::now();
    let running = endpoint(transport, &queue, handled.clone()).await;
    let valid = tokio::spawn({
        let handled = handled.clone();
        async move {
            handled.notified().await;
            started.elapsed()
        }
    });
    let path = EntityPath::queue(&queue);
    let dead_at = loop {
        let counts = transport.counts(&path).await.unwrap();
        if counts.dead_lettered >= n {
            break started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(600), "{kind:?}: {counts:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let valid_after = tokio::time::timeout(Duration::from_secs(600), valid)
        .await
        .expect("the valid message is handled")
        .unwrap();
    running.shutdown().await.unwrap();
    transport.delete(&path).await.unwrap();
    #[allow(clippy::cast_precision_loss)]
    let rate = n as f64 / dead_at.as_secs_f64();
    Measured { rate, valid_after }
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds: usize = args
        .iter()
        .skip_while(|a| *a != "--rounds")
        .nth(1)
        .map_or(ROUNDS, |r| r.parse().unwrap());
    let n = if quick { 300 } else { N };
    let url = std::env::var("AMQP_URL").unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let transport = Arc::new(AmqpTransport::connect(url.clone()).await.unwrap_or_else(|e| {
            panic!("cannot connect to RabbitMQ at AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/%2f): {e}")
        }));
        let raw = Connection::connect(&url, ConnectionProperties::default())
            .await
            .unwrap();
        println!(
            "RabbitMQ, quorum queues; bursts of {n} messages of 1 KiB then one valid message; endpoint without a \
             store, 16 at once, prefetch 64; {rounds} rounds; load at start {}",
            load()
        );
        let mut all: [Vec<Measured>; 2] = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            let first = if round % 2 == 0 {
                Kind::Refused
            } else {
                Kind::DeadLettered
            };
            let second = if first == Kind::Refused {
                Kind::DeadLettered
            } else {
                Kind::Refused
            };
            for kind in [first, second] {
                let m = measure(&transport, &raw, kind, n, round).await;
                all[usize::from(kind == Kind::DeadLettered)].push(m);
            }
            println!("  round {} done, load {}", round + 1, load());
        }
        println!();
        println!(
            "{:<30} {:>10} {:>16}   rounds (msg/s; valid after, ms)",
            "burst", "msg/s", "valid after (ms)"
        );
        for kind in [Kind::Refused, Kind::DeadLettered] {
            let v = &all[usize::from(kind == Kind::DeadLettered)];
            let rates: Vec<f64> = v.iter().map(|m| m.rate).collect();
            let after: Vec<f64> = v.iter().map(|m| m.valid_after.as_secs_f64() * 1000.0).collect();
            let list = v
                .iter()
                .map(|m| format!("{:.0}; {:.0}", m.rate, m.valid_after.as_secs_f64() * 1000.0))
                .collect::<Vec<_>>()
                .join(" | ");
            println!(
                "{:<30} {:>10.0} {:>16.0}   {list}",
                kind.label(),
                median(&rates),
                median(&after)
            );
        }
        let refused = median(&all[0].iter().map(|m| m.rate).collect::<Vec<_>>());
        let dead = median(&all[1].iter().map(|m| m.rate).collect::<Vec<_>>());
        println!("refused / dead-lettered: {:.0}%", 100.0 * refused / dead);
        println!("load at end {}", load());
        transport.close().await;
        let _ = raw.close(200, "done".into()).await;
    });
}
