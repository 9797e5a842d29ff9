//! The S3.1 question of docs/postgres-reference.md: what gap-free sequence numbers per queue would
//! cost concurrent senders, against the one database sequence the transport uses.
//!
//! On a fresh database, `senders` tasks each send 1 KiB messages to ONE queue, one
//! message per transaction (autocommit), for `secs` seconds, in three ways:
//! - `sequence`: `nextval` of one sequence, as the transport numbers messages (not
//!   gap-free: a rolled-back send leaves a hole, and numbers may commit out of order);
//! - `counter`: a counter row per queue, raised in the sending transaction
//!   (`UPDATE ... RETURNING`), which is gap-free and commits in number order, because the
//!   row lock is held until the commit: each sender waits for the one before it to commit
//!   (its WAL flush included);
//! - `sequence + notify`: the same with a `pg_notify` in the statement, as the transport's
//!   send does (Postgres serialises the commits of notifying transactions);
//! - `courier`: the transport's own `Sender::send` (the sequence, plus its notification),
//!   for reference.
//!
//! The counter's numbers are checked gap-free at the end (max = count).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use courier::prelude::*;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;

use crate::common::{PlaceOrder, fresh_database};

const SCHEMA: &[&str] = &[
    "CREATE SEQUENCE bench_seq",
    "CREATE TABLE bench_message (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, \
     queue integer NOT NULL, seq bigint NOT NULL, body bytea NOT NULL)",
    "CREATE INDEX bench_message_seq ON bench_message (queue, seq)",
    "CREATE TABLE bench_counter (queue integer PRIMARY KEY, next_seq bigint NOT NULL)",
    "INSERT INTO bench_counter VALUES (1, 0)",
];

const BY_SEQUENCE: &str = "INSERT INTO bench_message (queue, seq, body) VALUES ($1, nextval('bench_seq'), $2)";
const BY_SEQUENCE_NOTIFY: &str = "WITH m AS (INSERT INTO bench_message (queue, seq, body) \
                                  VALUES ($1, nextval('bench_seq'), $2) RETURNING queue) \
                                  SELECT pg_notify('bench', queue::text) FROM m";
const BY_COUNTER: &str = "WITH c AS (UPDATE bench_counter SET next_seq = next_seq + 1 WHERE queue = $1 \
                          RETURNING next_seq) \
                          INSERT INTO bench_message (queue, seq, body) SELECT $1, next_seq, $2 FROM c";

/// How a send is numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Numbering {
    Sequence,
    SequenceNotify,
    Counter,
    Courier,
}

impl Numbering {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Sequence => "one sequence (the transport's choice), raw SQL",
            Self::SequenceNotify => "one sequence + pg_notify in the same statement, raw SQL",
            Self::Counter => "gap-free counter row per queue, raw SQL",
            Self::Courier => "Courier's Sender::send (sequence + notify)",
        }
    }
}

/// Sends per second with `senders` concurrent senders to one queue for `secs` seconds.
pub(crate) async fn sends(numbering: Numbering, senders: usize, secs: f64) -> f64 {
    let db = fresh_database().await;
    let pool = PgPoolOptions::new()
        .max_connections(u32::try_from(senders).unwrap_or(u32::MAX))
        .connect(&db.url())
        .await
        .unwrap();
    for statement in SCHEMA {
        sqlx::query(*statement).execute(&pool).await.unwrap();
    }
    let transport = if numbering == Numbering::Courier {
        let t = crate::common::courier_transport(db.url(), u32::try_from(senders).unwrap_or(u32::MAX) + 2)
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
    // Every connection opened before the clock starts.
    let warm = transport.as_ref().map_or(&pool, |t| t.pool());
    let mut held = Vec::new();
    for _ in 0..senders {
        held.push(warm.acquire().await.unwrap());
    }
    drop(held);
    let body = serde_json::to_vec(&PlaceOrder::new(0)).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..senders {
        let (pool, body, stop, sent, sender) = (pool.clone(), body.clone(), stop.clone(), sent.clone(), sender.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match (&sender, numbering) {
                    (Some(sender), _) => sender.send(Envelope::new(body.clone())).await.unwrap(),
                    (None, Numbering::Counter) => {
                        sqlx::query(BY_COUNTER)
                            .bind(1_i32)
                            .bind(&body)
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                    (None, Numbering::SequenceNotify) => {
                        sqlx::query(BY_SEQUENCE_NOTIFY)
                            .bind(1_i32)
                            .bind(&body)
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                    (None, _) => {
                        sqlx::query(BY_SEQUENCE)
                            .bind(1_i32)
                            .bind(&body)
                            .execute(&pool)
                            .await
                            .unwrap();
                    }
                }
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    while tasks.join_next().await.is_some() {}
    let rate = sent.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    if numbering == Numbering::Counter {
        let (count, max): (i64, Option<i64>) = sqlx::query_as("SELECT count(*), max(seq) FROM bench_message")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(Some(count), max, "the counter's numbers are gap-free");
    }
    if let Some(t) = transport {
        t.close().await;
    }
    pool.close().await;
    db.drop_database().await.unwrap();
    rate
}
