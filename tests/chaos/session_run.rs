//! The `rabbitmq-sessions` run: worker processes on the session queue, the feeder, the
//! faults (`--kills` SIGKILLs of a worker in the middle of a handler call, each
//! replaced, and `--drops` closings of every RabbitMQ connection of the run's virtual
//! host, interleaved and spread evenly over the run by progress: fault `i` of `n` when
//! `(i+1)/(n+1)` of the messages are committed), then the checks on the rows
//! `sessions.rs` describes and on the queues, and the table.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use courier::EntityCounts;

use crate::faults::{self, Dice, Fault, Tally, Workers};
use crate::setup::{Db, Setup};
use crate::{Error, RunArgs, sessions};

/// The faults of the run, in order: a kill first, a drop after each kill while drops
/// remain, so that the defaults (2 kills, 1 drop) are kill, drop, kill.
pub fn plan(kills: u32, drops: u32) -> Vec<Fault> {
    let (mut k, mut d) = (kills, drops);
    let mut plan = Vec::new();
    while k + d > 0 {
        if k > 0 && (d == 0 || plan.last() != Some(&Fault::Kill)) {
            plan.push(Fault::Kill);
            k -= 1;
        } else {
            plan.push(Fault::DropRabbit);
            d -= 1;
        }
    }
    plan
}

async fn committed(db: &Db) -> Result<i64, Error> {
    db.count("SELECT COUNT(*) FROM (SELECT DISTINCT session, seq FROM chaos_session_done) AS d")
        .await
}

/// Runs the workload under its faults and checks it; returns whether it passed.
pub async fn drive(args: &RunArgs, setup: &Setup) -> Result<bool, Error> {
    let Some(rabbit) = &setup.rabbit else {
        return crate::fail("the rabbitmq-sessions configuration has no RabbitMQ");
    };
    setup.db.exec(sessions::CREATE).await?;
    let exe = std::env::current_exe().map_err(|e| Error(format!("this program's path: {e}")))?;
    let mut workers = Workers::new(exe, setup.place.args());
    for _ in 0..args.workers.max(1) {
        workers.spawn().await?;
    }
    let began = Instant::now();
    let (transport, _) = setup.place.open().await?;
    let feeder = tokio::spawn(sessions::feed(
        transport.clone(),
        setup.place.queue.clone(),
        args.sessions,
        args.per_session,
        args.rate,
    ));
    let expected = i64::try_from(args.sessions * args.per_session).unwrap_or(i64::MAX);
    let plan = plan(args.kills, args.drops);
    let at = |i: usize| expected * i64::try_from(i + 1).unwrap_or(0) / i64::try_from(plan.len() + 1).unwrap_or(1);
    let mut dice = Dice::new(args.seed);
    let mut tally = Tally::default();
    let mut progress = crate::report::Progress::default();
    let mut next = 0;
    let mut stalled = false;
    let mut kills = Vec::new();
    loop {
        let done = committed(&setup.db).await.unwrap_or(0);
        progress.saw(done);
        if done >= expected {
            break;
        }
        if progress.since_last() > Duration::from_secs(args.stall) {
            stalled = true;
            break;
        }
        if let Some(&fault) = plan.get(next)
            && done >= at(next)
        {
            next += 1;
            match fault {
                Fault::Kill => kills.push(kill_latest(&mut workers, &mut dice, setup, done).await?),
                _ => {
                    eprintln!("courier-chaos: {} at {done} committed", fault.name());
                    faults::inject(fault, &mut dice, &mut workers, setup).await?;
                    let back = Instant::now();
                    let recovered = wait_next(&setup.db, expected).await?;
                    tally
                        .recoveries
                        .push((fault, recovered.map(|t| t.duration_since(back))));
                }
            }
            *tally.injected.entry(fault).or_insert(0) += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = began.elapsed();
    let fed = match tokio::time::timeout(Duration::from_secs(30), feeder).await {
        Ok(Ok(Ok(failures))) => Ok(failures),
        Ok(Ok(Err(Error(e)))) => Err(e),
        Ok(Err(e)) => Err(format!("the feeder failed: {e}")),
        Err(_) => Err("the feeder had not finished 30 s after the last commit".to_owned()),
    };
    transport.close().await;
    // Copies a kill or a drop sent again would be handled within a few seconds.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let killed_at_stop = workers.stop_all(Duration::from_secs(30)).await;
    let mut outcome = check(args, setup).await?;
    if outcome.queue.dead_lettered > 0 {
        outcome.dead = dead_letters(&rabbit.url, &setup.place.queue).await?;
    }
    // A quorum queue's counts reach `rabbitmqctl` at its ticks (every 5 s): a message
    // settled just before the stop may show a few seconds more.
    let listing = Instant::now();
    let mut queues = rabbit.list_queues().await?;
    while queues.iter().any(|(_, ready, unacked, _)| ready + unacked > 0) && listing.elapsed() < Duration::from_secs(15)
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        queues = rabbit.list_queues().await?;
    }
    Ok(print(
        args,
        &Run {
            planned: plan.len(),
            listed_after: listing.elapsed(),
            tally,
            kills,
            elapsed,
            stalled,
            killed_at_stop,
            started: workers.started,
            fed,
        },
        &outcome,
        &queues,
    ))
}

/// A handler call in flight (started in the last second, not committed), as its pid
/// and `session/seq`: the latest.
const IN_FLIGHT: &str = "SELECT s.pid || ' ' || s.session || '/' || s.seq FROM chaos_session_starts s \
     WHERE s.started_at > clock_timestamp() - INTERVAL '1 second' AND NOT EXISTS (SELECT 1 \
       FROM chaos_session_done d WHERE d.session = s.session AND d.seq = s.seq) ORDER BY s.id DESC LIMIT 1";

/// Kills a worker in the middle of a handler call (the first one seen in flight within
/// 3 s; else the one that started the latest message, else one drawn), and starts
/// another. Returns what the table says of it.
async fn kill_latest(workers: &mut Workers, dice: &mut Dice, setup: &Setup, done: i64) -> Result<String, Error> {
    let looking = Instant::now();
    let mut target = None;
    while target.is_none() && looking.elapsed() < Duration::from_secs(3) {
        let lines = setup.db.lines(IN_FLIGHT).await?;
        target = lines.first().and_then(|line| {
            let (pid, call) = line.split_once(' ')?;
            let i = workers.index_of(pid.parse().ok()?)?;
            Some((i, format!("it was handling {call}")))
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if target.is_none() {
        let latest = setup
            .db
            .count("SELECT COALESCE((SELECT pid FROM chaos_session_starts ORDER BY id DESC LIMIT 1), 0)::BIGINT")
            .await?;
        target = u32::try_from(latest)
            .ok()
            .and_then(|pid| workers.index_of(pid))
            .map(|i| (i, "it had started the latest message".to_owned()));
    }
    let (i, why) = target.unwrap_or_else(|| (dice.below(workers.count()), "drawn".to_owned()));
    let pid = workers.pid(i).unwrap_or(0);
    eprintln!("courier-chaos: {} (pid {pid}) at {done} committed", Fault::Kill.name());
    workers.kill(i).await?;
    Ok(format!("pid {pid} at {done} committed, {why}"))
}

/// Waits (at most two minutes) for the commit of a handler call that started after now
/// (by the database's clock): when the endpoint recovered from an outage. `None` when all
/// was committed already, or nothing came.
async fn wait_next(db: &Db, expected: i64) -> Result<Option<Instant>, Error> {
    let now = db.lines("SELECT CAST(clock_timestamp() AS TEXT)").await?;
    let Some(now) = now.first() else {
        return Ok(None);
    };
    let sql = format!("SELECT COUNT(*) FROM chaos_session_done WHERE started_at > '{now}'::timestamptz");
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && committed(db).await.is_ok_and(|n| n < expected) {
        if db.count(&sql).await.is_ok_and(|n| n > 0) {
            return Ok(Some(Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// What the rows and the queue show.
pub struct Outcome {
    expected: i64,
    done_rows: i64,
    attempts: i64,
    retries: i64,
    cut_short: i64,
    after_own_commit: i64,
    lost: Vec<String>,
    duplicated: Vec<String>,
    unexpected: Vec<String>,
    out_of_order: (i64, Vec<String>),
    started_out_of_order: (i64, Vec<String>),
    overlaps: (i64, Vec<String>),
    after_lost: i64,
    by_pid: Vec<String>,
    queue: EntityCounts,
    /// The dead letters read: how many by reason, and the first five.
    dead: (Vec<String>, Vec<String>),
}

/// Calls that started before the previous message of their session committed (by
/// what the call's statement saw, or by the clock), of a previous message that did
/// commit. Those whose previous message never committed follow a lost one
/// ([`AFTER_LOST`]).
const OVERLAP: &str = "FROM chaos_session_starts s WHERE s.seq > 0 AND (NOT s.prev_committed OR \
     s.started_at <= (SELECT MIN(d.finished_at) FROM chaos_session_done d \
       WHERE d.session = s.session AND d.seq = s.seq - 1)) AND EXISTS (SELECT 1 \
     FROM chaos_session_done d WHERE d.session = s.session AND d.seq = s.seq - 1)";

/// Calls whose previous message never committed (it is lost: dead-lettered).
const AFTER_LOST: &str = "FROM chaos_session_starts s WHERE s.seq > 0 AND NOT EXISTS (SELECT 1 \
     FROM chaos_session_done d WHERE d.session = s.session AND d.seq = s.seq - 1)";

const OVERLAP_LINES: &str = "SELECT s.session || '/' || s.seq || ' attempt ' || s.attempt || ' in pid ' || s.pid || \
     ' started ' || to_char(s.started_at, 'HH24:MI:SS.US') || CASE WHEN s.prev_committed THEN '' \
       ELSE ' while ' || s.session || '/' || (s.seq - 1) || ' was not committed' END || \
     COALESCE((SELECT ', its commit: pid ' || d.pid || ' finished ' || to_char(d.finished_at, 'HH24:MI:SS.US') \
       FROM chaos_session_done d WHERE d.session = s.session AND d.seq = s.seq - 1 \
       ORDER BY d.finished_at LIMIT 1), ', never committed') ";

/// Handler calls that did not commit: in a process killed, or whose transaction failed.
const CUT_SHORT: &str = "SELECT COUNT(*) FROM chaos_session_starts s WHERE NOT EXISTS (SELECT 1 \
     FROM chaos_session_done d WHERE d.session = s.session AND d.seq = s.seq AND d.pid = s.pid \
       AND d.started_at = s.started_at)";

/// Commits before the commit of the previous message of their session, which did commit
/// (later).
const UNORDERED: &str = "FROM chaos_session_done d WHERE d.seq > 0 AND NOT d.prev_committed AND EXISTS \
     (SELECT 1 FROM chaos_session_done p WHERE p.session = d.session AND p.seq = d.seq - 1)";

const STARTED_UNORDERED: &str = "FROM chaos_session_starts a JOIN chaos_session_starts b \
     ON b.session = a.session AND b.id > a.id AND b.seq < a.seq AND NOT b.own_committed";

async fn counted(db: &Db, from: &str, lines: &str) -> Result<(i64, Vec<String>), Error> {
    let n = db.count(&format!("SELECT COUNT(*) {from}")).await?;
    let first = if n > 0 {
        db.lines(&format!("{lines} {from} LIMIT 5")).await?
    } else {
        Vec::new()
    };
    Ok((n, first))
}

/// Reads the outcome (the workers are stopped).
pub async fn check(args: &RunArgs, setup: &Setup) -> Result<Outcome, Error> {
    let db = &setup.db;
    let mut rows: HashMap<(String, i32), i64> = db
        .pairs("SELECT session, seq, COUNT(*) FROM chaos_session_done GROUP BY session, seq")
        .await?
        .into_iter()
        .map(|(s, q, n)| ((s, q), n))
        .collect();
    let (mut lost, mut duplicated) = (Vec::new(), Vec::new());
    for s in 0..args.sessions {
        let name = sessions::session(s);
        for seq in 0..i32::try_from(args.per_session).unwrap_or(i32::MAX) {
            match rows.remove(&(name.clone(), seq)).unwrap_or(0) {
                0 => lost.push(format!("{name}/{seq}")),
                1 => {}
                n => duplicated.push(format!("{name}/{seq} x{n}")),
            }
        }
    }
    let unexpected = rows.keys().map(|(s, q)| format!("{s}/{q}")).collect();
    let by_pid = db
        .lines("SELECT 'pid ' || pid || ': ' || COUNT(*) FROM chaos_session_done GROUP BY pid ORDER BY MIN(id)")
        .await?;
    Ok(Outcome {
        expected: i64::try_from(args.sessions * args.per_session).unwrap_or(i64::MAX),
        done_rows: db.count("SELECT COUNT(*) FROM chaos_session_done").await?,
        attempts: db.count("SELECT COUNT(*) FROM chaos_session_starts").await?,
        retries: db
            .count("SELECT COUNT(*) FROM chaos_session_starts WHERE attempt > 1")
            .await?,
        cut_short: db.count(CUT_SHORT).await?,
        after_own_commit: db
            .count("SELECT COUNT(*) FROM chaos_session_starts WHERE own_committed")
            .await?,
        lost,
        duplicated,
        unexpected,
        out_of_order: counted(
            db,
            UNORDERED,
            "SELECT d.session || '/' || d.seq || ' committed by pid ' || d.pid || ' at ' || \
             to_char(d.finished_at, 'HH24:MI:SS.US') || ' before ' || d.session || '/' || (d.seq - 1)",
        )
        .await?,
        started_out_of_order: counted(
            db,
            STARTED_UNORDERED,
            "SELECT a.session || ': ' || a.seq || ' started (pid ' || a.pid || ') before ' || b.seq || \
             ' (pid ' || b.pid || '), which was not committed yet'",
        )
        .await?,
        overlaps: counted(db, OVERLAP, OVERLAP_LINES).await?,
        after_lost: db.count(&format!("SELECT COUNT(*) {AFTER_LOST}")).await?,
        by_pid,
        queue: setup.queue_counts().await?,
        dead: (Vec::new(), Vec::new()),
    })
}

/// Reads the session queue's dead-letter queue (`basic.get`, at most 5,000, left in
/// place: the channel closes unacknowledged): how many by reason, and the first five as
/// `message id, delivery count: reason: description`.
async fn dead_letters(url: &str, queue: &str) -> Result<(Vec<String>, Vec<String>), Error> {
    use lapin::options::BasicGetOptions;
    use lapin::types::AMQPValue;
    let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
    let channel = conn.create_channel().await?;
    let dlq = format!("{queue}::dlq");
    let mut by_reason: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut first = Vec::new();
    for _ in 0..5000 {
        let Some(m) = channel
            .basic_get(dlq.as_str().into(), BasicGetOptions::default())
            .await?
        else {
            break;
        };
        let properties = &m.delivery.properties;
        let header = |name: &str| {
            properties.headers().as_ref().and_then(|h| {
                h.inner()
                    .iter()
                    .find(|(k, _)| k.as_str() == name)
                    .map(|(_, v)| v.clone())
            })
        };
        let text = |name: &str| match header(name) {
            Some(AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).into_owned(),
            Some(other) => format!("{other:?}"),
            None => "-".to_owned(),
        };
        let reason = text("x-courier-dead-letter-reason");
        *by_reason.entry(reason.clone()).or_insert(0) += 1;
        if first.len() < 5 {
            let id = properties
                .message_id()
                .as_ref()
                .map_or_else(|| "-".to_owned(), |i| i.as_str().to_owned());
            first.push(format!(
                "{id}, delivery count {}: {reason}: {}",
                text("x-delivery-count"),
                text("x-courier-dead-letter-description")
            ));
        }
    }
    let _ = conn.close(200, "read".into()).await;
    Ok((by_reason.into_iter().map(|(r, n)| format!("{r}: {n}")).collect(), first))
}

/// What the driver saw of the run.
pub struct Run {
    planned: usize,
    listed_after: Duration,
    tally: Tally,
    kills: Vec<String>,
    elapsed: Duration,
    stalled: bool,
    killed_at_stop: usize,
    started: u32,
    fed: Result<u64, String>,
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

/// Prints the table; returns whether the run passed. `queues` are the run's virtual
/// host's queues as `name, ready, unacked, consumers`.
pub fn print(args: &RunArgs, run: &Run, o: &Outcome, queues: &[(String, u64, u64, u64)]) -> bool {
    let q = &o.queue;
    let left: Vec<String> = queues
        .iter()
        .filter(|(_, ready, unacked, _)| ready + unacked > 0)
        .map(|(name, ready, unacked, consumers)| {
            format!("{name}: {ready} ready, {unacked} unacked, {consumers} consumers")
        })
        .collect();
    let partitions = queues
        .iter()
        .filter(|(n, ..)| n.contains("::session-") && n.ends_with("-of-16"))
        .count();
    let mut failures = Vec::new();
    let mut need = |ok: bool, what: &str| {
        if !ok {
            failures.push(what.to_owned());
        }
    };
    need(!run.stalled, "the run stalled");
    let injected: u32 = run.tally.injected.values().sum();
    need(
        usize::try_from(injected).is_ok_and(|n| n >= run.planned),
        "the work ended before every planned fault (lower --rate)",
    );
    need(run.fed.is_ok(), "the feeder failed");
    need(o.lost.is_empty(), "messages lost");
    need(o.duplicated.is_empty(), "messages handled twice");
    need(o.unexpected.is_empty(), "unexpected rows");
    need(o.out_of_order.0 == 0, "committed out of order");
    need(o.started_out_of_order.0 == 0, "started out of send order");
    need(o.overlaps.0 == 0, "a session's messages overlapped");
    need(
        q.active == 0 && q.scheduled == 0 && q.deferred == 0,
        "messages left in the queue",
    );
    need(q.dead_lettered == 0, "messages dead-lettered");
    need(left.is_empty(), "messages left in the virtual host's queues");
    need(partitions == 16, "not 16 partitions");
    println!(
        "courier-chaos: RabbitmqSessions, {} sessions x {} messages at {}/s, {} worker process(es) ({} started in all), seed {}, {:.1} s",
        args.sessions,
        args.per_session,
        args.rate,
        args.workers,
        run.started,
        args.seed,
        run.elapsed.as_secs_f64()
    );
    println!("  faults injected ({injected} of {} planned)", run.planned);
    if run.tally.injected.is_empty() {
        println!("    none (the work ended first)");
    }
    for (fault, n) in &run.tally.injected {
        println!("    {:<42} {n:>6}", fault.name());
    }
    for kill in &run.kills {
        println!("    killed: {kill}");
    }
    for (fault, took) in &run.tally.recoveries {
        let took = took.map_or_else(
            || "no commit followed".to_owned(),
            |d| format!("{:.2} s", d.as_secs_f64()),
        );
        println!("    recovery after {:<27} {took:>9}", fault.name());
    }
    println!("  outcome");
    let rows: Vec<(&str, String)> = vec![
        ("messages sent (sessions x per session)", o.expected.to_string()),
        (
            "feeder: sends failed transiently, sent again",
            run.fed
                .clone()
                .map_or_else(|e| format!("FAILED: {e}"), |n| n.to_string()),
        ),
        ("committed rows", o.done_rows.to_string()),
        ("handler calls (start rows)", o.attempts.to_string()),
        ("calls redelivered or retried (attempt > 1)", o.retries.to_string()),
        ("calls that did not commit (killed, failed)", o.cut_short.to_string()),
        ("calls of a message already committed", o.after_own_commit.to_string()),
        ("committed by process", o.by_pid.join(", ")),
        ("lost", some(&o.lost)),
        ("handled twice (two committed rows)", some(&o.duplicated)),
        ("unexpected", some(&o.unexpected)),
        (
            "committed before the previous of its session",
            o.out_of_order.0.to_string(),
        ),
        (
            "started after a later one of its session",
            o.started_out_of_order.0.to_string(),
        ),
        (
            "overlap: started before the previous committed",
            o.overlaps.0.to_string(),
        ),
        ("calls after a lost message of their session", o.after_lost.to_string()),
        (
            "stuck in the queue (active/scheduled/deferred)",
            format!("{}/{}/{}", q.active, q.scheduled, q.deferred),
        ),
        ("dead letters", q.dead_lettered.to_string()),
        (
            "dead letters by reason",
            if o.dead.0.is_empty() {
                "-".to_owned()
            } else {
                o.dead.0.join(", ")
            },
        ),
        (
            "vhost queues (partitions); with messages",
            format!(
                "{} ({partitions}): {} (listed within {:.1} s)",
                queues.len(),
                some(&left),
                run.listed_after.as_secs_f64()
            ),
        ),
        ("workers killed at the final stop", run.killed_at_stop.to_string()),
    ];
    for (what, value) in rows {
        println!("    {what:<48} {value}");
    }
    for (title, lines) in [
        ("dead letter", &o.dead.1),
        ("out of order", &o.out_of_order.1),
        ("started out of order", &o.started_out_of_order.1),
        ("overlap", &o.overlaps.1),
    ] {
        for line in lines {
            println!("      {title}: {line}");
        }
    }
    if failures.is_empty() {
        println!("  PASS");
        true
    } else {
        println!("  FAIL: {}", failures.join("; "));
        false
    }
}
