//! The send path (issue 32, part 3): Courier's `Sender::send` against the raw statement that
//! does the same with one INSERT and its `pg_notify`, and `Sender::send_batch` of `batch`
//! messages against one multi-row INSERT with one `pg_notify`.
//!
//! On a fresh database per figure, `senders` tasks send 1 KiB messages to ONE queue for
//! `secs` seconds, each send in a transaction of its own (autocommit), every connection
//! opened before the clock starts:
//! - `Raw`: `INSERT ... VALUES (queue, nextval(seq), body)` with `pg_notify` in the same
//!   statement (the numbering part's "one sequence + pg_notify");
//! - `RawListened`: the same while a connection of the same pool `LISTEN`s on the channel
//!   and reads every notification, as the transport's own `LISTEN` connection does (what
//!   a wake-up costs Postgres and the client beyond the notify itself);
//! - `Courier`: `Sender::send` of the Postgres transport;
//! - `RawBatch`: `batch` rows in one `INSERT ... SELECT FROM unnest($bodies)` with one
//!   `pg_notify`;
//! - `CourierBatch`: `Sender::send_batch` of `batch` messages.
//!
//! The raw and Courier figures of one number of senders are measured in turns, `rounds`
//! times, so that a change of the machine's load touches both; the ratio of each round is
//! printed, and the median of them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::prelude::*;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::task::JoinSet;

use crate::common::{PlaceOrder, admin_connection, fresh_database, xacts};

const SCHEMA: &[&str] = &[
    "CREATE SEQUENCE bench_seq",
    "CREATE TABLE bench_message (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
     queue integer NOT NULL, seq bigint NOT NULL, body bytea NOT NULL)",
    "CREATE INDEX bench_message_seq ON bench_message (queue, seq)",
];

const ONE: &str = "WITH m AS (INSERT INTO bench_message (queue, seq, body) \
                   VALUES ($1, nextval('bench_seq'), $2) RETURNING queue) \
                   SELECT pg_notify('bench', queue::text) FROM m";
const MANY: &str = "WITH m AS (INSERT INTO bench_message (queue, seq, body) \
                    SELECT $1, nextval('bench_seq'), b FROM unnest($2::bytea[]) b RETURNING queue) \
                    SELECT pg_notify('bench', $1::text), (SELECT count(*) FROM m)";

/// What sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Way {
    Raw,
    RawListened,
    Courier,
    RawBatch,
    CourierBatch,
}

impl Way {
    pub(crate) fn label(self, batch: usize) -> String {
        match self {
            Self::Raw => "raw INSERT + pg_notify, one message per statement".into(),
            Self::RawListened => {
                "raw INSERT + pg_notify, one message per statement, a LISTEN connection reading".into()
            }
            Self::Courier => "Courier's Sender::send".into(),
            Self::RawBatch => format!("raw multi-row INSERT of {batch} + one pg_notify"),
            Self::CourierBatch => format!("Courier's Sender::send_batch of {batch}"),
        }
    }

    fn courier(self) -> bool {
        matches!(self, Self::Courier | Self::CourierBatch)
    }

    fn per_send(self, batch: usize) -> usize {
        if matches!(self, Self::RawBatch | Self::CourierBatch) {
            batch
        } else {
            1
        }
    }
}

/// One figure: messages per second, and Postgres transactions per send in its database
/// (the `LISTEN` connection's included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) messages: f64,
    pub(crate) tx_per_send: f64,
}

/// Messages per second with `senders` concurrent senders to one queue for `secs` seconds.
pub(crate) async fn rate(way: Way, senders: usize, secs: f64, batch: usize) -> Rate {
    let db = fresh_database().await;
    let mut stats = admin_connection().await;
    if std::env::args().any(|a| a == "--log-statements") {
        let set = format!("ALTER DATABASE \"{}\" SET log_statement = 'all'", db.name());
        sqlx::query(sqlx::AssertSqlSafe(set)).execute(&mut stats).await.unwrap();
        println!("    logging every statement of database {}", db.name());
    }
    let conns = u32::try_from(senders).unwrap_or(u32::MAX);
    let pool = PgPoolOptions::new()
        .max_connections(conns + 1)
        .connect(&db.url())
        .await
        .unwrap();
    for statement in SCHEMA {
        sqlx::query(*statement).execute(&pool).await.unwrap();
    }
    let transport = if way.courier() {
        let t = crate::common::courier_transport(db.url(), conns + 2)
            .open()
            .await
            .unwrap();
        t.create_queue("q", &QueueOptions::default()).await.unwrap();
        Some(t)
    } else {
        None
    };
    let sender = match &transport {
        Some(t) => Some(t.sender("q", SenderOptions::default()).await.unwrap()),
        None => None,
    };
    let listener = if way == Way::RawListened {
        let mut l = PgListener::connect_with(&pool).await.unwrap();
        l.listen("bench").await.unwrap();
        Some(tokio::spawn(async move {
            while let Ok(Some(n)) = l.try_recv().await {
                std::hint::black_box(n.payload().parse::<i64>().ok());
            }
        }))
    } else {
        None
    };
    // Every connection opened before the clock starts.
    let warm = transport.as_ref().map_or(&pool, |t| t.pool());
    let mut held = Vec::new();
    for _ in 0..senders {
        held.push(warm.acquire().await.unwrap());
    }
    drop(held);
    let xacts_before = xacts(&mut stats, db.name()).await;
    let body = serde_json::to_vec(&PlaceOrder::new(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sends = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..senders {
        let (pool, body, stop, sends, sender) =
            (pool.clone(), body.clone(), stop.clone(), sends.clone(), sender.clone());
        tasks.spawn(async move {
            let bodies = vec![body.clone(); batch];
            while !stop.load(Ordering::Relaxed) {
                match (&sender, way) {
                    (Some(sender), Way::CourierBatch) => {
                        let batch = bodies.iter().map(|b| Envelope::new(b.clone())).collect();
                        sender.send_batch(batch).await.unwrap();
                    }
                    (Some(sender), _) => sender.send(Envelope::new(body.clone())).await.unwrap(),
                    (None, Way::RawBatch) => {
                        sqlx::query(MANY)
                            .bind(1_i32)
                            .bind(&bodies)
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                    (None, _) => {
                        sqlx::query(ONE).bind(1_i32).bind(&body).execute(&pool).await.unwrap();
                    }
                }
                sends.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let sent = sends.load(Ordering::Relaxed);
    let stored: i64 = match &transport {
        Some(t) => sqlx::query_scalar("SELECT count(*) FROM courier.message")
            .fetch_one(t.pool())
            .await
            .unwrap(),
        None => sqlx::query_scalar("SELECT count(*) FROM bench_message")
            .fetch_one(&pool)
            .await
            .unwrap(),
    };
    let messages = sent * u64::try_from(way.per_send(batch)).unwrap_or(1);
    assert_eq!(
        u64::try_from(stored).unwrap_or(0),
        messages,
        "every message sent is stored"
    );
    if let Some(l) = listener {
        l.abort();
    }
    if let Some(t) = transport {
        t.close().await;
    }
    pool.close().await;
    // A backend reports its transactions when it exits (or at its next idle moment).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tx = xacts(&mut stats, db.name()).await - xacts_before;
    drop(stats);
    db.drop_database().await.unwrap();
    Rate {
        messages: messages as f64 / elapsed,
        tx_per_send: tx as f64 / sent.max(1) as f64,
    }
}

/// The median of `xs` (0 for none).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => f64::midpoint(v[n / 2 - 1], v[n / 2]),
    }
}
