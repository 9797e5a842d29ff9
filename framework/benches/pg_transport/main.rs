//! Courier on the Postgres transport against two raw-SQL baselines and two peers, in one
//! run on the same server (issues 15 and 32; docs/measurements.md).
//!
//! Run: `cargo bench -p courier --features postgres --bench pg_transport`. Options after
//! `--`:
//! - `--quick`: a smoke run (fewer messages, shorter baseline);
//! - `--messages N` per drain (default 20000, quick 2000); `--secs S`, the baseline's
//!   seconds per figure (default 10, quick 3); `--clients C`, its pgbench clients (8);
//! - `--handlers 8,32`: handlers at once; `--group G`: Courier's group commit for the
//!   grouped runs (default 10); `--pool P`: connections of each system's pool (default
//!   20, the same for all);
//! - `--parts baseline,peeklock,courier,batch,apalis,graphile,counter,send`: which parts run
//!   (default all; `--no-baselines` leaves the `peeklock` part's baselines out):
//!   `baseline` is the set-based `pg-handler-baseline.sh` (with `--clients`),
//!   `peeklock` the PeekLock baseline `peeklock-baseline.sh` at each number of handlers
//!   with Courier doing the same work next to it, `courier` Courier with the peers' handler;
//! - `--parts batch`: a batch handler (one multi-row insert per batch) of each of
//!   `--batch-sizes` (default `10,100`) messages, `--clients` batches at once, compared
//!   with the set-based baseline at 10 messages per transaction, and with the PeekLock
//!   baseline doing a batch handler's statements (`PEEKLOCK_BATCH=1`) as the line that
//!   says where the difference lies;
//! - `--senders 1,8,32` and `--counter-secs S` (default 5, quick 2): the numbering part
//!   and the send path;
//! - `--parts send`: the send path (`send_path.rs`): `Sender::send` against the raw INSERT
//!   with its `pg_notify`, and `Sender::send_batch` of `--batch N` (default 100) against
//!   one multi-row INSERT, in turns, `--send-rounds R` times (default 3, quick 1), at each
//!   number of `--senders`, for `--counter-secs` each; with `--log-statements` the server
//!   logs every statement of those databases;
//! - `--notify-interval-ms M`: every Courier transport of the bench (drains, send path,
//!   numbering) notifies with `notify_interval(M ms)` (`common::courier_transport`);
//!   `--schema-sql FILE`: the SQL in FILE runs on each Courier database of the drains once
//!   the transport opened it (what a piece of the schema costs: drop it there);
//! - `--soak SECS` (with `--soak-every S`, default 60, and `--soak-vacuum`): only the
//!   soak of point 3, see `soak.rs`.
//!
//! `DATABASE_URL` names the server (default `postgres://postgres@127.0.0.1:5432/postgres`);
//! its user must be allowed to create databases. Each measured system runs in a database
//! of its own, created for it and dropped after it. The baseline needs `psql`, `pgbench`
//! and `bc`.
//!
//! Every system drains `N` prefilled 1 KiB JSON messages with the same handler: read the
//! message, insert one row, complete. Timed from the start of the consumer until the
//! database shows every message completed; then the consumer is shut down (untimed) and
//! the bench checks that every row was written once and every message completed.
//!
//! The `peeklock` part measures, for each number of handlers H, the PeekLock baseline with
//! H pgbench clients, then Courier with H handlers doing the baseline's work (the inbox
//! record, one saga row updated, one 1 KiB message sent, per message: `Work::PeekLock`),
//! one message per transaction and with `group_commit(G)`; it prints Courier's ratio to
//! the baseline at 1 and at 10 messages per transaction for each H. More lines per H say
//! where the difference lies: the baseline with a `pg_notify` in each enqueue (as
//! Courier's send has), the baseline with a savepoint per message (as a member of a
//! commit group has), the baseline's statements sent by sqlx on tokio instead of pgbench
//! (`sqlx_peeklock.rs`: what a Rust client costs by itself, at 1 and 10 per transaction,
//! and at 10 with a savepoint per message), and Courier with `group_commit(G)` and H x G
//! handlers, as many messages in flight as the baseline's H clients at 10 per transaction
//! (its pool is still `--pool`).

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::large_futures,
    missing_docs
)]

mod common;
mod counter;
mod courier_side;
mod peers;
mod send_path;
mod soak;
mod sqlx_peeklock;

use std::collections::BTreeMap;

use common::{Baseline, Drain, Load, baseline, loadavg, quiesce, with_load};
use counter::Numbering;
use courier_side::Work;
use send_path::Way;

/// The value after `--flag`, if any.
fn arg<T: std::str::FromStr>(flag: &str) -> Option<T> {
    std::env::args()
        .skip_while(|a| a != flag)
        .nth(1)
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{flag} {v}: not understood")))
}

/// A comma-separated list after `--flag`, if any.
fn list<T: std::str::FromStr>(flag: &str) -> Option<Vec<T>> {
    arg::<String>(flag).map(|v| {
        v.split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{flag} {v}: not understood"))
            })
            .collect()
    })
}

struct Opts {
    messages: u64,
    secs: u32,
    clients: usize,
    handlers: Vec<usize>,
    group: usize,
    pool: u32,
    parts: Vec<String>,
    senders: Vec<usize>,
    counter_secs: f64,
    batch: usize,
    send_rounds: usize,
    batch_sizes: Vec<usize>,
}

impl Opts {
    fn parse() -> Self {
        let quick = std::env::args().any(|a| a == "--quick");
        Self {
            messages: arg("--messages").unwrap_or(if quick { 2_000 } else { 20_000 }),
            secs: arg("--secs").unwrap_or(if quick { 3 } else { 10 }),
            clients: arg("--clients").unwrap_or(8),
            handlers: list("--handlers").unwrap_or_else(|| vec![8, 32]),
            group: arg("--group").unwrap_or(10),
            pool: arg("--pool").unwrap_or(20),
            parts: list("--parts").unwrap_or_else(|| {
                [
                    "baseline", "peeklock", "courier", "batch", "apalis", "graphile", "counter", "send",
                ]
                .map(String::from)
                .to_vec()
            }),
            senders: list("--senders").unwrap_or_else(|| if quick { vec![1, 8] } else { vec![1, 8, 32] }),
            counter_secs: arg("--counter-secs").unwrap_or(if quick { 2.0 } else { 5.0 }),
            batch: arg("--batch").unwrap_or(100),
            send_rounds: arg("--send-rounds").unwrap_or(if quick { 1 } else { 3 }),
            batch_sizes: list("--batch-sizes").unwrap_or_else(|| vec![10, 100]),
        }
    }

    fn runs(&self, part: &str) -> bool {
        self.parts.iter().any(|p| p == part)
    }
}

/// The commit the bench was built from, so a figure names the code it measured (the
/// `Postgres tx/msg` column shows whether group commit took effect in it).
fn build() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    match git(&["log", "-1", "--format=%h %cs %s"]) {
        Some(head) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            format!("{head}{}", if dirty { " (with uncommitted changes)" } else { "" })
        }
        None => "unknown (not a git checkout)".into(),
    }
}

/// One line of the results.
struct Figure {
    label: String,
    /// Handlers at once (the PeekLock ratio compares with the baseline at as many clients).
    handlers: usize,
    drain: Drain,
    load: Load,
}

/// A baseline's figures at 1 and at 10 messages per transaction, and the load around them.
type Base = ((f64, f64), Load);

/// The PeekLock baselines at one number of clients: plain, with `pg_notify`, and with a
/// batch handler's statements (measured by the `batch` part).
#[derive(Default)]
struct PeekLockBase {
    plain: Option<Base>,
    notify: Option<Base>,
    savepoint: Option<Base>,
    batch: Option<Base>,
    /// The plain baseline's statements through sqlx (`sqlx_peeklock.rs`), in the order of
    /// [`SQLX_FIGURES`].
    sqlx: [Option<(sqlx_peeklock::Rate, Load)>; 3],
}

/// The label of Courier's line with the PeekLock work, `group_commit(g)` and `h` x `g`
/// handlers (compared with the baseline at `h` clients).
fn in_flight_label(h: usize, g: usize) -> String {
    format!(
        "courier (PeekLock work), {} at once, group_commit({g}): as many in flight as {h} clients x {g}",
        h * g
    )
}

/// The figures of the PeekLock baseline through sqlx: messages per transaction, and
/// whether each message has a savepoint of its own.
const SQLX_FIGURES: [(i64, bool); 3] = [(1, false), (10, false), (10, true)];

/// The label of the PeekLock baseline's line through sqlx.
fn sqlx_label(per_tx: i64, savepoint: bool, h: usize) -> String {
    let with = if savepoint { " with a savepoint per message" } else { "" };
    format!("PeekLock baseline through sqlx (no framework){with}, {per_tx} msg/tx, {h} tasks")
}

/// The label of Courier's line with `work`, `h` handlers at once and `group_commit(group)`.
fn courier_label(work: Work, h: usize, group: usize) -> String {
    let who = match work {
        Work::Row => "courier",
        Work::PeekLock => "courier (PeekLock work)",
        Work::Batch(max, at_once) => {
            return format!("courier batch handler of {max}, {at_once} batches at once, one insert per batch");
        }
    };
    if group <= 1 {
        format!("{who}, {h} at once, one transaction per message")
    } else {
        format!("{who}, {h} at once, group_commit({group})")
    }
}

/// The PeekLock baselines at `h` clients: pgbench's (plain, with `pg_notify`, with a
/// savepoint per message), then the same statements through sqlx.
fn peeklock_baselines(rt: &tokio::runtime::Runtime, opts: &Opts, h: usize, bases: &mut PeekLockBase) {
    for which in [
        Baseline::PeekLock,
        Baseline::PeekLockNotify,
        Baseline::PeekLockSavepoint,
    ] {
        quiesce(3);
        let (b, load) = with_load(|| baseline(rt, which, opts.secs, h));
        match (b, which) {
            (Ok(b), Baseline::PeekLock) => bases.plain = Some((b, load)),
            (Ok(b), Baseline::PeekLockSavepoint) => bases.savepoint = Some((b, load)),
            (Ok(b), _) => bases.notify = Some((b, load)),
            (Err(e), _) => println!("  {which:?} baseline at {h} clients not measured: {e}"),
        }
    }
    for (slot, (per_tx, savepoint)) in bases.sqlx.iter_mut().zip(SQLX_FIGURES) {
        quiesce(3);
        let (rate, load) = with_load(|| rt.block_on(sqlx_peeklock::peeklock(opts.secs, h, per_tx, savepoint)));
        println!(
            "    {}: {:.0} messages/s, CPU per message {:.0} µs in the bench's process, {:.0} µs on the \
             machine (load {load})",
            sqlx_label(per_tx, savepoint, h),
            rate.messages,
            rate.cpu.process_us,
            rate.cpu.machine_us
        );
        *slot = Some((rate, load));
    }
}

fn main() {
    let opts = Opts::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let mut command = String::from("cargo bench -p courier --features postgres --bench pg_transport");
    if !args.is_empty() {
        command = format!("{command} -- {}", args.join(" "));
    }
    println!("{command}");
    println!("build: {}", build());
    println!(
        "server {}; load (1, 5, 15 min) at the start: {}; {} cores",
        common::database_url(),
        loadavg(),
        std::thread::available_parallelism().map_or(0, usize::from)
    );

    if let Some(secs) = arg::<u64>("--soak") {
        let every = arg("--soak-every").unwrap_or(60);
        let handlers = opts.handlers.first().copied().unwrap_or(8);
        let group = arg("--group").unwrap_or(1);
        let vacuum = std::env::args().any(|a| a == "--soak-vacuum");
        rt.block_on(soak::soak(secs, every, handlers, group, opts.pool, vacuum));
        return;
    }

    println!(
        "{} messages of 1 KiB JSON per drain; handler: read, insert one row, complete (PeekLock work: \
         update one saga row, send one 1 KiB message, complete); pool {} connections each",
        opts.messages, opts.pool
    );
    println!();

    let mut base: Option<Base> = None;
    if opts.runs("baseline") {
        println!(
            "baseline: scripts/baselines/pg-handler-baseline.sh, {} clients, {} s per figure",
            opts.clients, opts.secs
        );
        let (b, load) = with_load(|| baseline(&rt, Baseline::SetBased, opts.secs, opts.clients));
        match b {
            Ok(b) => base = Some((b, load)),
            Err(e) => println!("  baseline not measured: {e}"),
        }
    }

    let mut figures: Vec<Figure> = Vec::new();
    let mut measure = |label: String, handlers: usize, run: &dyn Fn() -> Drain| {
        quiesce(3);
        let (drain, load) = with_load(run);
        println!(
            "  {label}: {:.0} msg/s, {:.2} Postgres transactions/msg, CPU per message {:.0} µs in the bench's \
             process, {:.0} µs on the machine ({:.0}% busy), then shutdown {:.1} s (load {load})",
            drain.rate,
            drain.tx_per_msg,
            drain.cpu.process_us,
            drain.cpu.machine_us,
            100.0 * drain.cpu.busy,
            drain.shutdown.as_secs_f64()
        );
        figures.push(Figure {
            label,
            handlers,
            drain,
            load,
        });
    };
    let n = opts.messages;
    let pool = opts.pool;
    let g = opts.group;
    // One transaction per message, then group commit (unless `--group 1` asks for none).
    let groups: Vec<usize> = if g > 1 { vec![1, g] } else { vec![1] };
    let mut peeklock: BTreeMap<usize, PeekLockBase> = BTreeMap::new();
    if opts.runs("peeklock") {
        println!(
            "PeekLock: scripts/baselines/peeklock-baseline.sh ({} s per figure), then Courier doing its work \
             (PeekLock work), at each number of handlers",
            opts.secs
        );
        for &h in &opts.handlers {
            // `--no-baselines`: Courier's figures alone (to compare builds or schemas in turns).
            if !std::env::args().any(|a| a == "--no-baselines") {
                peeklock_baselines(&rt, &opts, h, peeklock.entry(h).or_default());
            }
            for &group in &groups {
                measure(courier_label(Work::PeekLock, h, group), h, &|| {
                    rt.block_on(courier_side::drain(n, h, group, pool, Work::PeekLock))
                });
            }
            if g > 1 {
                let (label, many) = (in_flight_label(h, g), h * g);
                measure(label, h, &|| {
                    rt.block_on(courier_side::drain(n, many, g, pool, Work::PeekLock))
                });
            }
        }
    }
    if opts.runs("courier") {
        println!("courier: Postgres transport + transport.store() (PgTransportStore)");
        for &group in &groups {
            for &h in &opts.handlers {
                measure(courier_label(Work::Row, h, group), h, &|| {
                    rt.block_on(courier_side::drain(n, h, group, pool, Work::Row))
                });
            }
        }
    }
    if opts.runs("batch") {
        println!(
            "courier batch handlers: Postgres transport + transport.store(), {} batches at once (the set-based \
             baseline's clients)",
            opts.clients
        );
        quiesce(3);
        let (b, load) = with_load(|| baseline(&rt, Baseline::PeekLockBatch, opts.secs, opts.clients));
        match b {
            Ok(b) => peeklock.entry(opts.clients).or_default().batch = Some((b, load)),
            Err(e) => println!("  PeekLockBatch baseline at {} clients not measured: {e}", opts.clients),
        }
        for &max in &opts.batch_sizes {
            let work = Work::Batch(max, opts.clients);
            measure(courier_label(work, opts.clients, 1), opts.clients, &|| {
                rt.block_on(courier_side::drain(n, opts.clients, 1, pool, work))
            });
        }
    }
    if opts.runs("apalis") {
        println!("apalis 1.0 + apalis-postgres 1.0 (PostgresStorage, default config)");
        for &h in &opts.handlers {
            measure(format!("apalis, {h} at once"), h, &|| {
                rt.block_on(peers::apalis(n, h, pool))
            });
        }
    }
    if opts.runs("graphile") {
        println!("graphile_worker 0.14 (default options, with its LocalQueue: see peers.rs)");
        for &h in &opts.handlers {
            measure(format!("graphile_worker, {h} at once"), h, &|| {
                rt.block_on(peers::graphile(n, h, pool))
            });
        }
    }

    let mut counters: Vec<(Numbering, usize, f64, Load)> = Vec::new();
    if opts.runs("counter") {
        println!(
            "numbering (S3.1): senders to one queue, one 1 KiB message per transaction, {} s each",
            opts.counter_secs
        );
        for numbering in [
            Numbering::Sequence,
            Numbering::SequenceNotify,
            Numbering::Counter,
            Numbering::Courier,
        ] {
            for &s in &opts.senders {
                quiesce(1);
                let (rate, load) = with_load(|| rt.block_on(counter::sends(numbering, s, opts.counter_secs)));
                println!("  {}, {s} senders: {rate:.0} sends/s (load {load})", numbering.label());
                counters.push((numbering, s, rate, load));
            }
        }
    }

    let mut sends: Vec<SendFigure> = Vec::new();
    if opts.runs("send") {
        println!(
            "send path (issue 32, part 3): senders to one queue, 1 KiB messages, one send per transaction, {} s \
             each, raw and Courier in turns, {} rounds",
            opts.counter_secs, opts.send_rounds
        );
        for &s in &opts.senders {
            for round in 1..=opts.send_rounds {
                for way in [
                    Way::Raw,
                    Way::Courier,
                    Way::RawListened,
                    Way::RawBatch,
                    Way::CourierBatch,
                ] {
                    quiesce(1);
                    let (rate, load) =
                        with_load(|| rt.block_on(send_path::rate(way, s, opts.counter_secs, opts.batch)));
                    println!(
                        "  {}, {s} senders, round {round}: {:.0} msg/s, {:.2} Postgres transactions/send (load {load})",
                        way.label(opts.batch),
                        rate.messages,
                        rate.tx_per_send
                    );
                    sends.push(SendFigure {
                        way,
                        senders: s,
                        round,
                        rate,
                    });
                }
            }
        }
    }

    report(&opts, base.as_ref(), &peeklock, &figures, &counters);
    send_report(&opts, &sends);
}

/// One figure of the send path.
struct SendFigure {
    way: Way,
    senders: usize,
    round: usize,
    rate: send_path::Rate,
}

/// The send path's table and its targets: each round's ratio of Courier to the raw
/// statement measured just before it, and their median.
fn send_report(opts: &Opts, sends: &[SendFigure]) {
    if sends.is_empty() {
        return;
    }
    let rate = |way: Way, s: usize, round: usize| {
        sends
            .iter()
            .find(|f| f.way == way && f.senders == s && f.round == round)
            .map(|f| f.rate)
    };
    let rounds = 1..=opts.send_rounds;
    println!();
    println!(
        "| send path, one queue | senders | msg/s, each round | Postgres tx/send | ratio, each round | median ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut verdicts = Vec::new();
    for &s in &opts.senders {
        for (way, of) in [
            (Way::Raw, None),
            (Way::RawListened, None),
            (Way::Courier, Some(Way::Raw)),
            (Way::RawBatch, None),
            (Way::CourierBatch, Some(Way::RawBatch)),
        ] {
            let figures: Vec<send_path::Rate> = rounds.clone().filter_map(|r| rate(way, s, r)).collect();
            if figures.is_empty() {
                continue;
            }
            let ratios: Vec<f64> = of.map_or_else(Vec::new, |of| {
                rounds
                    .clone()
                    .filter_map(|r| Some(rate(way, s, r)?.messages / rate(of, s, r)?.messages))
                    .collect()
            });
            let join = |xs: Vec<String>| xs.join(" / ");
            let median = send_path::median(&ratios);
            println!(
                "| {} | {s} | {} | {:.2} | {} | {} |",
                way.label(opts.batch),
                join(figures.iter().map(|f| format!("{:.0}", f.messages)).collect()),
                send_path::median(&figures.iter().map(|f| f.tx_per_send).collect::<Vec<_>>()),
                join(ratios.iter().map(|r| format!("{:.0}%", 100.0 * r)).collect()),
                if ratios.is_empty() {
                    String::new()
                } else {
                    format!("{:.0}%", 100.0 * median)
                }
            );
            if let Some(of) = of
                && !ratios.is_empty()
            {
                verdicts.push(format!(
                    "target (issue 32, part 3), {s} senders: {} >= 80% of the {}: median {:.0}% over {} rounds, {}",
                    way.label(opts.batch),
                    of.label(opts.batch),
                    100.0 * median,
                    ratios.len(),
                    if median >= 0.8 { "met" } else { "NOT met" }
                ));
            }
        }
    }
    println!();
    for v in verdicts {
        println!("{v}");
    }
}

fn report(
    opts: &Opts,
    base: Option<&Base>,
    peeklock: &BTreeMap<usize, PeekLockBase>,
    figures: &[Figure],
    counters: &[(Numbering, usize, f64, Load)],
) {
    println!();
    println!(
        "| | msg/s | / set-based 1 msg/tx | / set-based 10 msg/tx | / PeekLock 1 msg/tx | / PeekLock 10 msg/tx \
         | Postgres tx/msg | CPU µs/msg: bench process, machine (busy) | load before -> after |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let pct = |rate: f64, of: Option<f64>| of.map_or_else(String::new, |b| format!("{:.0}%", 100.0 * rate / b));
    if let Some(((one, ten), load)) = base {
        let c = opts.clients;
        println!("| set-based baseline, 1 msg/tx, {c} clients | {one:.0} | | | | | 1 | | {load} |");
        println!("| set-based baseline, 10 msg/tx, {c} clients | {ten:.0} | | | | | 0.1 | | (same run) |");
    }
    for (h, bases) in peeklock {
        for (name, base) in [
            ("PeekLock baseline", &bases.plain),
            ("PeekLock baseline with pg_notify", &bases.notify),
            ("PeekLock baseline with a savepoint per message", &bases.savepoint),
            ("PeekLock batch baseline", &bases.batch),
        ] {
            if let Some(((one, ten), load)) = base {
                let (p1, p10) = match (&bases.plain, base) {
                    (Some(((p1, p10), _)), _) if name != "PeekLock baseline" => {
                        (pct(*one, Some(*p1)), pct(*ten, Some(*p10)))
                    }
                    _ => (String::new(), String::new()),
                };
                println!("| {name}, 1 msg/tx, {h} clients | {one:.0} | | | {p1} | | 2 | | {load} |");
                println!("| {name}, 10 msg/tx, {h} clients | {ten:.0} | | | | {p10} | 0.2 | | (same run) |");
            }
        }
        for (figure, (per_tx, savepoint)) in bases.sqlx.iter().zip(SQLX_FIGURES) {
            let Some((rate, load)) = figure else { continue };
            let of = bases
                .plain
                .as_ref()
                .map(|((p1, p10), _)| if per_tx == 1 { *p1 } else { *p10 });
            let (p1, p10, tx) = if per_tx == 1 {
                (pct(rate.messages, of), String::new(), "2")
            } else {
                (String::new(), pct(rate.messages, of), "0.2")
            };
            println!(
                "| {} | {:.0} | | | {p1} | {p10} | {tx} | {:.0}, {:.0} ({:.0}%) | {load} |",
                sqlx_label(per_tx, savepoint, *h),
                rate.messages,
                rate.cpu.process_us,
                rate.cpu.machine_us,
                100.0 * rate.cpu.busy
            );
        }
    }
    let (one, ten) = (base.map(|b| b.0.0), base.map(|b| b.0.1));
    for f in figures {
        let peek = peeklock.get(&f.handlers).and_then(|b| b.plain.as_ref()).map(|b| b.0);
        println!(
            "| {} | {:.0} | {} | {} | {} | {} | {:.2} | {:.0}, {:.0} ({:.0}%) | {} |",
            f.label,
            f.drain.rate,
            pct(f.drain.rate, one),
            pct(f.drain.rate, ten),
            pct(f.drain.rate, peek.map(|p| p.0)),
            pct(f.drain.rate, peek.map(|p| p.1)),
            f.drain.tx_per_msg,
            f.drain.cpu.process_us,
            f.drain.cpu.machine_us,
            100.0 * f.drain.cpu.busy,
            f.load
        );
    }
    if !counters.is_empty() {
        println!();
        println!("| numbering, one queue | senders | sends/s | load before -> after |");
        println!("|---|---:|---:|---|");
        for (numbering, s, rate, load) in counters {
            println!("| {} | {s} | {rate:.0} | {load} |", numbering.label());
        }
    }
    targets(opts, one, ten, peeklock, figures);
}

/// The issues' targets, for each number of handlers.
fn targets(
    opts: &Opts,
    one: Option<f64>,
    ten: Option<f64>,
    peeklock: &BTreeMap<usize, PeekLockBase>,
    figures: &[Figure],
) {
    let find = |label: &str| figures.iter().find(|f| f.label == label).map(|f| f.drain.rate);
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let g = opts.group;
    println!();
    let batch_base = peeklock.get(&opts.clients).and_then(|b| b.batch.as_ref()).map(|b| b.0);
    for &max in &opts.batch_sizes {
        let c = opts.clients;
        let Some(rate) = find(&courier_label(Work::Batch(max, c), c, 1)) else {
            continue;
        };
        let set = ten.map_or_else(String::new, |b| {
            format!(
                "{rate:.0} / {b:.0} = {:.0}%, {}",
                100.0 * rate / b,
                verdict(rate >= 0.8 * b)
            )
        });
        let peek = batch_base.map_or_else(String::new, |(_, b)| {
            format!(
                "; the PeekLock batch baseline at 10 msg/tx (its claim in a transaction of its own, then the batch's \
                 statements): {b:.0}, Courier {:.0}% of it",
                100.0 * rate / b
            )
        });
        println!(
            "target (issue 32), a batch handler of {max}, {c} batches at once: >= 80% of the set-based baseline at \
             10 msg/tx ({c} clients): {set}{peek}"
        );
    }
    for &h in &opts.handlers {
        let alone = find(&courier_label(Work::PeekLock, h, 1));
        let grouped = find(&courier_label(Work::PeekLock, h, g));
        let base = peeklock.get(&h).and_then(|b| b.plain.as_ref()).map(|b| b.0);
        if let (Some(a), Some((b, _))) = (alone, base) {
            println!(
                "target (issue 32), {h} at once: Courier with the PeekLock work, one transaction per message, \
                 >= 80% of the PeekLock baseline at 1 msg/tx ({h} clients): {a:.0} / {b:.0} = {:.0}%, {}",
                100.0 * a / b,
                verdict(a >= 0.8 * b)
            );
        }
        if let (Some(a), Some((_, b))) = (grouped, base) {
            println!(
                "target (issue 32), {h} at once: Courier with the PeekLock work, group_commit({g}), \
                 >= 80% of the PeekLock baseline at 10 msg/tx ({h} clients): {a:.0} / {b:.0} = {:.0}%, {}",
                100.0 * a / b,
                verdict(a >= 0.8 * b)
            );
        }
        // What a Rust client with sqlx costs by itself: the same statements as pgbench's,
        // one per transaction, and ten (with and without savepoints) against Courier with as
        // many messages in flight.
        let through = |per_tx: i64, savepoint: bool| {
            let i = SQLX_FIGURES.iter().position(|f| *f == (per_tx, savepoint))?;
            peeklock.get(&h).and_then(|b| b.sqlx[i].as_ref()).map(|(r, _)| *r)
        };
        let drain = |label: &str| figures.iter().find(|f| f.label == label).map(|f| f.drain);
        if let (Some(c), Some(s), Some((b, _))) = (drain(&courier_label(Work::PeekLock, h, 1)), through(1, false), base)
        {
            println!(
                "  where the rest lies, {h} at once, one transaction per message: the PeekLock baseline's statements \
                 through sqlx on tokio (no framework): {:.0}, {:.0}% of pgbench's; Courier {:.0}% of it; CPU µs a \
                 message in the bench's process: sqlx {:.0}, Courier {:.0}",
                s.messages,
                100.0 * s.messages / b,
                100.0 * c.rate / s.messages,
                s.cpu.process_us,
                c.cpu.process_us
            );
        }
        if let (Some(c), Some(s), Some((_, b))) = (drain(&in_flight_label(h, g)), through(10, false), base) {
            let with = through(10, true).map_or_else(String::new, |sp| {
                format!(
                    "; with a savepoint per message: {:.0}, Courier {:.0}% of it (CPU µs {:.0})",
                    sp.messages,
                    100.0 * c.rate / sp.messages,
                    sp.cpu.process_us
                )
            });
            println!(
                "  where the rest lies, {h} at once, group_commit({g}) with {} handlers: the PeekLock baseline's \
                 statements through sqlx on tokio at 10 msg/tx: {:.0}, {:.0}% of pgbench's; Courier {:.0}% of it; CPU \
                 µs a message in the bench's process: sqlx {:.0}, Courier {:.0}{with}",
                h * g,
                s.messages,
                100.0 * s.messages / b,
                100.0 * c.rate / s.messages,
                s.cpu.process_us,
                c.cpu.process_us
            );
        }
        let many = find(&in_flight_label(h, g));
        let savepoint = peeklock.get(&h).and_then(|b| b.savepoint.as_ref()).map(|b| b.0.1);
        if let (Some(a), Some((_, b))) = (many, base) {
            let with = savepoint.map_or_else(String::new, |s| {
                format!(
                    "; the baseline with a savepoint per message: {s:.0} ({:.0}% of the baseline), Courier {:.0}% of it",
                    100.0 * s / b,
                    100.0 * a / s
                )
            });
            println!(
                "  where the rest lies, {h} at once: Courier with group_commit({g}) and {} handlers (as many in flight \
                 as the baseline): {a:.0}, {:.0}% of the PeekLock baseline at 10 msg/tx{with}",
                h * g,
                100.0 * a / b
            );
        }
    }
    for &h in &opts.handlers {
        let alone = find(&courier_label(Work::Row, h, 1));
        let grouped = find(&courier_label(Work::Row, h, g));
        let peers = [
            find(&format!("apalis, {h} at once")),
            find(&format!("graphile_worker, {h} at once")),
        ];
        if let (Some(a), Some(b)) = (alone, one) {
            println!(
                "target (issue 15), {h} at once: >= 80% of the set-based baseline at 1 msg/tx without group commit: \
                 {:.0}%, {}",
                100.0 * a / b,
                verdict(a >= 0.8 * b)
            );
        }
        if let (Some(gr), Some(b)) = (grouped, ten) {
            println!(
                "target (issue 15), {h} at once: >= 80% of the set-based baseline at 10 msg/tx with group_commit({g}): \
                 {:.0}%, {}",
                100.0 * gr / b,
                verdict(gr >= 0.8 * b)
            );
        }
        let best = alone
            .into_iter()
            .chain(grouped)
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        for (name, peer) in ["apalis", "graphile_worker"].iter().zip(peers) {
            if let (Some(c), Some(p)) = (alone, peer) {
                println!(
                    "target, {h} at once: ahead of {name}: courier {c:.0} (one tx per message), {} (best), {name} {p:.0}: {}",
                    best.map_or_else(String::new, |b| format!("{b:.0}")),
                    verdict(c > p)
                );
            }
        }
    }
}
