//! What every part of the bench shares: the server and the databases of its own that each
//! measured system gets, the machine's load, the counter of handled messages, the messages
//! themselves and the raw-SQL baseline scripts.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use courier::test_servers::{TestDatabase, postgres_database_on};
use serde::{Deserialize, Serialize};
use sqlx::ConnectOptions;
use sqlx::postgres::PgConnectOptions;
use tokio::sync::Notify;

/// The message every system handles: about 1 KiB of JSON (`{"n":..,"payload":"xx.."}`).
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "bench.PlaceOrder")]
pub(crate) struct PlaceOrder {
    pub(crate) n: u64,
    pub(crate) payload: String,
}

impl PlaceOrder {
    pub(crate) fn new(n: u64) -> Self {
        Self {
            n,
            payload: "x".repeat(1000),
        }
    }
}

/// The message the PeekLock-work handler sends for each one it handles: about 1 KiB of
/// JSON, as the baseline's enqueue (`repeat('y', 1000)`).
#[derive(Debug, Clone, Serialize, Deserialize, courier::Message)]
#[message(name = "bench.Shipment")]
pub(crate) struct Shipment {
    pub(crate) n: u64,
    pub(crate) payload: String,
}

impl Shipment {
    pub(crate) fn new(n: u64) -> Self {
        Self {
            n,
            payload: "y".repeat(1000),
        }
    }
}

/// The saga rows of the PeekLock work, as in `scripts/baselines/peeklock-baseline.sh`:
/// message `n` updates row `n % SAGA_ROWS`.
pub(crate) const SAGA_ROWS: u64 = 10_000;
pub(crate) const CREATE_SAGA: &str =
    "CREATE TABLE saga (id integer PRIMARY KEY, state bigint NOT NULL DEFAULT 0, version integer NOT NULL DEFAULT 0)";
pub(crate) const FILL_SAGA: &str = "INSERT INTO saga (id) SELECT g FROM generate_series(0, 9999) g";
pub(crate) const UPDATE_SAGA: &str = "UPDATE saga SET state = state + 1, version = version + 1 WHERE id = $1";

/// The one statement of the peers' handler: one row per message, the payload's length read
/// from the message.
pub(crate) const INSERT_ORDER: &str = "INSERT INTO orders (n, bytes) VALUES ($1, $2)";
pub(crate) const CREATE_ORDERS: &str = "CREATE TABLE orders (n bigint PRIMARY KEY, bytes integer NOT NULL)";

pub(crate) fn order_key(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

pub(crate) fn order_bytes(payload: &str) -> i32 {
    i32::try_from(payload.len()).unwrap_or(i32::MAX)
}

/// Counts handled messages and tells the bench when the last one ran.
#[derive(Debug)]
pub(crate) struct Progress {
    seen: AtomicU64,
    total: u64,
    pub(crate) done: Notify,
}

impl Progress {
    pub(crate) fn new(total: u64) -> Self {
        Self {
            seen: AtomicU64::new(0),
            total,
            done: Notify::new(),
        }
    }

    /// One more handled; the last one wakes the bench (`notify_one` keeps the wake-up if
    /// nobody waits yet).
    pub(crate) fn tick(&self) {
        if self.seen.fetch_add(1, Ordering::Relaxed) + 1 == self.total {
            self.done.notify_one();
        }
    }

    pub(crate) fn seen(&self) -> u64 {
        self.seen.load(Ordering::Relaxed)
    }
}

pub(crate) fn database_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub(crate) fn admin_options() -> PgConnectOptions {
    database_url()
        .parse::<PgConnectOptions>()
        .expect("DATABASE_URL is a postgres:// URL")
}

pub(crate) async fn admin_connection() -> sqlx::PgConnection {
    admin_options().connect().await.expect("connect to DATABASE_URL")
}

/// A fresh database on the server (`courier_test_<host>_<pid>_<random>`: one a killed run
/// left is dropped by the next run, as the tests' are).
pub(crate) async fn fresh_database() -> TestDatabase {
    postgres_database_on(&admin_options())
        .await
        .expect("create a database (DATABASE_URL's user must be allowed to)")
}

/// A builder of Courier's Postgres transport on `url` with `max_connections(pool)`, as
/// every part of the bench opens it: with `--notify-interval-ms M`, `notify_interval(M ms)`.
pub(crate) fn courier_transport(url: String, pool: u32) -> courier::PgTransportBuilder {
    let builder = courier::PostgresTransport::builder(url).max_connections(pool);
    match crate::arg::<u64>("--notify-interval-ms") {
        Some(ms) => builder.notify_interval(Duration::from_millis(ms)),
        None => builder,
    }
}

/// The 1-, 5- and 15-minute load averages.
pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The load before and after one part of the run.
#[derive(Debug, Clone)]
pub(crate) struct Load {
    pub(crate) before: String,
    pub(crate) after: String,
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}", self.before, self.after)
    }
}

/// Runs `part`, noting the load before and after it.
pub(crate) fn with_load<T>(part: impl FnOnce() -> T) -> (T, Load) {
    let before = loadavg();
    let out = part();
    (
        out,
        Load {
            before,
            after: loadavg(),
        },
    )
}

/// Lets the disk and Postgres settle between measurements.
pub(crate) fn quiesce(secs: u64) {
    let _ = std::process::Command::new("sync").status();
    std::thread::sleep(Duration::from_secs(secs));
}

/// Transactions committed and rolled back so far in database `name`.
pub(crate) async fn xacts(conn: &mut sqlx::PgConnection, name: &str) -> i64 {
    // A new snapshot of the statistics, not the one cached in this transaction.
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query_scalar("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// The raw-SQL baselines, in `scripts/baselines/` (the repository's copies of
/// `../shared/baselines/`, as `benches/embedded.rs` and `benches/pg_endpoint.rs` find theirs).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Baseline {
    /// `pg-handler-baseline.sh`: one set-based statement per transaction, the row lock as
    /// the claim.
    SetBased,
    /// `peeklock-baseline.sh`: a claim in its own transaction, then a statement per step of
    /// each message.
    PeekLock,
    /// The same with a `pg_notify` in each enqueue (`PEEKLOCK_NOTIFY=1`), as Courier's send
    /// has: what the notification costs.
    PeekLockNotify,
    /// The same with a savepoint before each message's statements
    /// (`PEEKLOCK_SAVEPOINT=1`), as a member of a commit group has: what it costs.
    PeekLockSavepoint,
    /// The claim of `peeklock-baseline.sh`, then what a batch handler does: one multi-row
    /// inbox insert, one multi-row insert of the application's rows, the delete
    /// (`PEEKLOCK_BATCH=1`).
    PeekLockBatch,
}

impl Baseline {
    pub(crate) fn script(self) -> &'static str {
        match self {
            Self::SetBased => "pg-handler-baseline.sh",
            Self::PeekLock | Self::PeekLockNotify | Self::PeekLockSavepoint | Self::PeekLockBatch => {
                "peeklock-baseline.sh"
            }
        }
    }
}

/// The baseline's figures, messages per second at one and at ten messages per transaction,
/// with `clients` pgbench clients for `secs` seconds each, in a database of its own.
pub(crate) fn baseline(
    rt: &tokio::runtime::Runtime,
    which: Baseline,
    secs: u32,
    clients: usize,
) -> Result<(f64, f64), String> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts/baselines")
        .join(which.script());
    if !script.exists() {
        return Err(format!("{} not found", script.display()));
    }
    let db = rt.block_on(fresh_database());
    let out = std::process::Command::new("bash")
        .env(
            "PEEKLOCK_NOTIFY",
            if matches!(which, Baseline::PeekLockNotify) {
                "1"
            } else {
                "0"
            },
        )
        .env(
            "PEEKLOCK_SAVEPOINT",
            if matches!(which, Baseline::PeekLockSavepoint) {
                "1"
            } else {
                "0"
            },
        )
        .env(
            "PEEKLOCK_BATCH",
            if matches!(which, Baseline::PeekLockBatch) {
                "1"
            } else {
                "0"
            },
        )
        .arg(&script)
        .arg(with_database(&database_url(), db.name()))
        .arg(secs.to_string())
        .arg(clients.to_string())
        .output();
    rt.block_on(db.drop_database()).expect("drop the baseline's database");
    let out = out.map_err(|e| format!("bash {}: {e}", script.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        println!("    {line}");
    }
    let rate = |per_tx: u32| -> Result<f64, String> {
        // "baseline handler, 1 msg/tx, 8 clients: 5123 messages/s" (and "peeklock baseline, ...")
        text.lines()
            .find(|l| l.contains(&format!(", {per_tx} msg/tx,")))
            .and_then(|l| l.rsplit(": ").next())
            .and_then(|v| v.trim().trim_end_matches(" messages/s").parse().ok())
            .ok_or_else(|| {
                format!(
                    "baseline output not understood (status {}; it needs psql, pgbench and bc): {}{}",
                    out.status,
                    text.trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
    };
    Ok((rate(1)?, rate(10)?))
}

/// `url` naming database `name` instead, its query string kept (a URL psql takes: the
/// test database's own URL carries sqlx's options).
fn with_database(url: &str, name: &str) -> String {
    let (base, query) = url.split_once('?').map_or((url, None), |(b, q)| (b, Some(q)));
    let (scheme, rest) = base.split_once("://").expect("DATABASE_URL is a postgres:// URL");
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    match query {
        Some(q) => format!("{scheme}://{authority}/{name}?{q}"),
        None => format!("{scheme}://{authority}/{name}"),
    }
}

/// Waits until `left` (a `SELECT count(*)` of the messages not yet completed) reads 0:
/// called once the last handler ran, so its polls cost nothing during the drain.
pub(crate) async fn completed(pool: &sqlx::PgPool, left: &str) {
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(left.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap();
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One measured drain: `n` prefilled messages, timed from the start of the consumer until
/// the database shows every one completed (the consumer's shutdown is not timed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Drain {
    pub(crate) rate: f64,
    /// How long the consumer's graceful shutdown took after that (not in `rate`).
    pub(crate) shutdown: Duration,
    /// Postgres transactions (commits and rollbacks) in the system's database per
    /// message, everything included (fetching, handling, completing, bookkeeping).
    pub(crate) tx_per_msg: f64,
    /// Where the CPU went during the timed part.
    pub(crate) cpu: Cpu,
}

/// CPU time during a drain, per message: the bench's own process (the measured system's
/// client side: Courier or the peer) and the whole machine (the server, the kernel, the
/// other work on the machine included), from `/proc` (Linux; zeros elsewhere).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cpu {
    /// Microseconds of this process's CPU per message.
    pub(crate) process_us: f64,
    /// Microseconds of busy CPU, all cores, per message.
    pub(crate) machine_us: f64,
    /// The machine's busy share of all its cores during the drain.
    pub(crate) busy: f64,
}

/// A reading of `/proc/self/stat` and `/proc/stat`, in clock ticks (USER_HZ, 100 a second
/// on Linux).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CpuMark {
    process: u64,
    busy: u64,
    total: u64,
}

const TICK_US: f64 = 10_000.0;

impl CpuMark {
    pub(crate) fn now() -> Self {
        let process = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| {
                // The fields after the command's closing parenthesis: state is the first,
                // utime the 12th and stime the 13th.
                let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
                Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
            })
            .unwrap_or(0);
        let (busy, total) = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| {
                let line = s.lines().next()?;
                let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
                // user nice system idle iowait irq softirq steal (guest time is in user).
                let total: u64 = v.iter().take(8).sum();
                let idle = v.get(3)? + v.get(4)?;
                Some((total - idle, total))
            })
            .unwrap_or((0, 0));
        Self { process, busy, total }
    }

    /// The CPU since this mark, per message of `n`.
    pub(crate) fn per_message(self, n: u64) -> Cpu {
        let now = Self::now();
        let n = n.max(1) as f64;
        let total = now.total.saturating_sub(self.total);
        Cpu {
            process_us: now.process.saturating_sub(self.process) as f64 * TICK_US / n,
            machine_us: now.busy.saturating_sub(self.busy) as f64 * TICK_US / n,
            busy: if total == 0 {
                0.0
            } else {
                now.busy.saturating_sub(self.busy) as f64 / total as f64
            },
        }
    }
}
