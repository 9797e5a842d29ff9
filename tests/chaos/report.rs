//! What a chaos run found: progress while it runs, the checks at the end (effects
//! exactly once, nothing left in the queue (or, on the Postgres transport, in
//! `courier.message`), the sagas, the timeouts or the outbox), and
//! the table it prints.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use courier::EntityCounts;

use crate::Error;
use crate::RunArgs;
use crate::faults::Tally;
use crate::setup::{Config, Db, Setup};
use crate::workflow::{self, STEPS};

const DISTINCT: &str =
    "SELECT COUNT(*) FROM (SELECT DISTINCT key, step FROM chaos_effects WHERE step <> 'early') AS distinct_rows";

/// The effect rows `n` flows must leave, each exactly once.
pub fn expected_rows(n: u64) -> i64 {
    let timed_out = (0..n).filter(|&i| !workflow::key(i).1).count();
    i64::try_from(3 * n).unwrap_or(i64::MAX) + i64::try_from(timed_out).unwrap_or(i64::MAX)
}

/// How many distinct expected effects are written.
pub async fn distinct_rows(db: &Db) -> Result<i64, Error> {
    db.count(DISTINCT).await
}

/// When the effects last grew.
pub struct Progress {
    last: i64,
    at: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            last: 0,
            at: Instant::now(),
        }
    }
}

impl Progress {
    /// Notes a count of distinct effects.
    pub fn saw(&mut self, n: i64) {
        if n > self.last {
            self.last = n;
            self.at = Instant::now();
        }
    }

    /// The last count.
    pub fn last(&self) -> i64 {
        self.last
    }

    /// Since when nothing grew.
    pub fn since_last(&self) -> Duration {
        self.at.elapsed()
    }
}

/// Waits (at most two minutes) for the first effect after `before`: when the endpoint
/// recovered from an outage. `None` when all was done already, or nothing came.
pub async fn next_effect(db: &Db, before: i64, expected: i64) -> Option<Instant> {
    if before >= expected {
        return None;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        if distinct_rows(db).await.is_ok_and(|n| n > before) {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Waits, at most `within`, until the outbox is empty (its sweeper takes rows 30 s old).
pub async fn outbox_drained(db: &Db, within: Duration) {
    let sql = format!("SELECT COUNT(*) FROM {}", db.courier_table("outbox"));
    let deadline = Instant::now() + within;
    while Instant::now() < deadline && !db.count(&sql).await.is_ok_and(|n| n == 0) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the run left behind.
pub struct Outcome {
    expected: i64,
    written: i64,
    early: i64,
    lost: Vec<String>,
    duplicated: Vec<String>,
    unexpected: Vec<String>,
    queue: EntityCounts,
    sagas_left: i64,
    timeouts_left: i64,
    timeouts_dead: i64,
    outbox_left: i64,
    outbox_dead: i64,
    /// On the Postgres transport: the rows left in `courier.message` (any entity of the
    /// run's database), and how many of them carry a lock.
    transport_rows: Option<(i64, i64)>,
    /// Those rows, as `message id (type), state, deliveries, reason: description` lines
    /// (at most five).
    transport_detail: Vec<String>,
    /// The timeouts left, as `due .. dispatched ..` lines (at most five).
    timeouts_detail: Vec<String>,
    /// The messages left in the queue (at most five).
    queue_detail: Vec<String>,
}

/// Reads the outcome of `n` flows (the workers are stopped).
pub async fn check(n: u64, setup: &Setup) -> Result<Outcome, Error> {
    let db = &setup.db;
    let queue = setup.queue_left().await?;
    let mut rows: HashMap<(String, String), i64> = HashMap::new();
    let mut early = 0;
    let mut written = 0;
    for (key, step, count) in db.effects().await? {
        if step == "early" {
            early += count;
        } else {
            written += count;
            rows.insert((key, step), count);
        }
    }
    let mut lost = Vec::new();
    let mut duplicated = Vec::new();
    for i in 0..n {
        let (key, cancel) = workflow::key(i);
        for step in STEPS {
            let want = i64::from(step != "deadline" || !cancel);
            let got = rows.remove(&(key.clone(), step.to_owned())).unwrap_or(0);
            if got < want {
                lost.push(format!("{key}/{step}"));
            } else if got > want.max(1) || (want == 0 && got > 0) {
                duplicated.push(format!("{key}/{step} x{got}"));
            }
        }
    }
    let unexpected = rows.keys().map(|(k, s)| format!("{k}/{s}")).collect();
    let saga = db.courier_table("saga");
    let timeout = db.courier_table("saga_timeout");
    let outbox = db.courier_table("outbox");
    let outbox_dead = db.courier_table("outbox_dead_letters");
    let transport_rows = if setup.place.config == Config::Postgres {
        Some((
            db.count("SELECT COUNT(*) FROM courier.message").await?,
            db.count("SELECT COUNT(*) FROM courier.message WHERE locked_until IS NOT NULL")
                .await?,
        ))
    } else {
        None
    };
    let transport_detail = if transport_rows.is_some_and(|(n, _)| n > 0) {
        db.lines(
            "SELECT message_id || ' (' || COALESCE(message_type, '?') || '), state ' || state || \
             ', deliveries ' || delivery_count || ', ' || COALESCE(dl_reason, 'no reason') || ': ' || \
             COALESCE(dl_description, '') FROM courier.message ORDER BY id LIMIT 5",
        )
        .await?
    } else {
        Vec::new()
    };
    Ok(Outcome {
        expected: expected_rows(n),
        written,
        early,
        lost,
        duplicated,
        unexpected,
        queue: queue.0,
        queue_detail: queue.1,
        sagas_left: db
            .count(&format!("SELECT COUNT(*) FROM {saga} WHERE saga_type = 'chaos.Flow'"))
            .await?,
        timeouts_left: db
            .count(&format!(
                "SELECT COUNT(*) FROM {timeout} WHERE saga_type = 'chaos.Flow'"
            ))
            .await?,
        timeouts_dead: db
            .count(&format!(
                "SELECT COUNT(*) FROM {timeout} WHERE saga_type = 'chaos.Flow' AND dead_lettered_at IS NOT NULL"
            ))
            .await?,
        outbox_left: db.count(&format!("SELECT COUNT(*) FROM {outbox}")).await?,
        outbox_dead: db.count(&format!("SELECT COUNT(*) FROM {outbox_dead}")).await?,
        transport_rows,
        transport_detail,
        timeouts_detail: db
            .lines(&format!(
                "SELECT correlation || ': due ' || CAST(due_at AS TEXT) || ', claimed ' || \
                 COALESCE(CAST(dispatched_at AS TEXT), 'never') FROM {timeout} \
                 WHERE saga_type = 'chaos.Flow' ORDER BY due_at LIMIT 5"
            ))
            .await?,
    })
}

fn some(list: &[String]) -> String {
    match list {
        [] => "0".to_owned(),
        many => format!(
            "{} (first: {})",
            many.len(),
            many.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Prints the table; returns whether the run passed.
pub fn print(
    args: &RunArgs,
    tally: &Tally,
    o: &Outcome,
    elapsed: Duration,
    stalled: bool,
    killed_at_stop: usize,
    started: u32,
) -> bool {
    let q = &o.queue;
    let mut failures = tally.failures.clone();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            failures.push(what.to_owned());
        }
    };
    need(!stalled, "the run stalled");
    need(o.lost.is_empty(), "effects lost");
    need(o.duplicated.is_empty(), "effects duplicated");
    need(o.unexpected.is_empty(), "unexpected effects");
    need(
        q.active == 0 && q.scheduled == 0 && q.deferred == 0,
        "messages left in the queue",
    );
    need(q.dead_lettered == 0, "messages dead-lettered");
    need(o.sagas_left == 0, "sagas left");
    need(o.timeouts_left == 0, "timeouts left");
    need(o.outbox_left == 0 && o.outbox_dead == 0, "outbox rows left");
    need(
        o.transport_rows.is_none_or(|(rows, _)| rows == 0),
        "rows left in courier.message",
    );
    println!(
        "courier-chaos: {:?}, {} flows at {}/s, {} worker process(es) ({} started in all), seed {}, {:.1} s",
        args.config,
        args.messages,
        args.rate,
        if args.config.competing() { args.workers } else { 1 },
        started,
        args.seed,
        elapsed.as_secs_f64()
    );
    println!("  faults injected");
    if tally.injected.is_empty() {
        println!("    none (the work ended first)");
    }
    for (fault, n) in &tally.injected {
        println!("    {:<42} {n:>6}", fault.name());
    }
    for (fault, took) in &tally.recoveries {
        let took = took.map_or_else(
            || "no effect followed".to_owned(),
            |d| format!("{:.2} s", d.as_secs_f64()),
        );
        println!("    recovery after {:<27} {took:>9}", fault.name());
    }
    for note in &tally.notes {
        println!("    {note}");
    }
    println!("  outcome");
    let mut rows: Vec<(&str, String)> = vec![
        ("effects expected", o.expected.to_string()),
        ("effect rows written", o.written.to_string()),
        ("timeouts come early, asked again", o.early.to_string()),
        ("lost", some(&o.lost)),
        ("duplicated", some(&o.duplicated)),
        ("unexpected", some(&o.unexpected)),
        (
            "stuck in the queue (active/scheduled/deferred)",
            format!("{}/{}/{}", q.active, q.scheduled, q.deferred),
        ),
        ("dead letters", q.dead_lettered.to_string()),
        ("sagas left", o.sagas_left.to_string()),
        ("timeouts left", o.timeouts_left.to_string()),
        ("timeouts dead-lettered", o.timeouts_dead.to_string()),
        (
            "outbox rows left / dead letters",
            format!("{}/{}", o.outbox_left, o.outbox_dead),
        ),
        ("workers killed at the final stop", killed_at_stop.to_string()),
    ];
    if let Some((left, locked)) = o.transport_rows {
        rows.insert(
            8,
            ("rows left in courier.message (locked)", format!("{left} ({locked})")),
        );
    }
    for (what, value) in rows {
        println!("    {what:<48} {value}");
    }
    for line in &o.timeouts_detail {
        println!("      timeout left: {line}");
    }
    for line in &o.transport_detail {
        println!("      message left: {line}");
    }
    for line in &o.queue_detail {
        println!("      in the queue: {line}");
    }
    if failures.is_empty() {
        println!("  PASS");
        true
    } else {
        println!("  FAIL: {}", failures.join("; "));
        false
    }
}
