//! Courier on the Postgres transport against the raw-SQL handler baseline and two peers,
//! in one run on the same server (issue 15, "Performance"; docs/measurements.md).
//!
//! Run: `cargo bench -p courier --features postgres --bench pg_transport`. Options after
//! `--`:
//! - `--quick`: a smoke run (fewer messages, shorter baseline);
//! - `--messages N` per drain (default 20000, quick 2000); `--secs S`, the baseline's
//!   seconds per figure (default 10, quick 3); `--clients C`, its pgbench clients (8);
//! - `--handlers 8,32`: handlers at once; `--group G`: Courier's group commit for the
//!   grouped runs (default 10); `--pool P`: connections of each system's pool (default
//!   20, the same for all);
//! - `--parts baseline,courier,apalis,graphile,counter`: which parts run (default all);
//! - `--senders 1,8,32` and `--counter-secs S` (default 5, quick 2): the numbering part;
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
mod soak;

use common::{Drain, Load, baseline, loadavg, quiesce, with_load};
use counter::Numbering;

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
                ["baseline", "courier", "apalis", "graphile", "counter"]
                    .map(String::from)
                    .to_vec()
            }),
            senders: list("--senders").unwrap_or_else(|| if quick { vec![1, 8] } else { vec![1, 8, 32] }),
            counter_secs: arg("--counter-secs").unwrap_or(if quick { 2.0 } else { 5.0 }),
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
    drain: Drain,
    load: Load,
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
        "{} messages of 1 KiB JSON per drain; handler: read, insert one row, complete; pool {} connections each",
        opts.messages, opts.pool
    );
    println!();

    let mut base: Option<((f64, f64), Load)> = None;
    if opts.runs("baseline") {
        println!(
            "baseline: scripts/baselines/pg-handler-baseline.sh, {} clients, {} s per figure",
            opts.clients, opts.secs
        );
        let (b, load) = with_load(|| baseline(&rt, opts.secs, opts.clients));
        match b {
            Ok(b) => base = Some((b, load)),
            Err(e) => println!("  baseline not measured: {e}"),
        }
    }

    let mut figures: Vec<Figure> = Vec::new();
    let mut measure = |label: String, run: &dyn Fn() -> Drain| {
        quiesce(3);
        let (drain, load) = with_load(run);
        println!(
            "  {label}: {:.0} msg/s, {:.2} Postgres transactions/msg, then shutdown {:.1} s (load {load})",
            drain.rate,
            drain.tx_per_msg,
            drain.shutdown.as_secs_f64()
        );
        figures.push(Figure { label, drain, load });
    };
    let n = opts.messages;
    let pool = opts.pool;
    if opts.runs("courier") {
        println!("courier: Postgres transport + transport.store() (PgTransportStore)");
        for &h in &opts.handlers {
            measure(format!("courier, {h} at once, one transaction per message"), &|| {
                rt.block_on(courier_side::drain(n, h, 1, pool))
            });
        }
        for &h in &opts.handlers {
            let g = opts.group;
            measure(format!("courier, {h} at once, group_commit({g})"), &|| {
                rt.block_on(courier_side::drain(n, h, g, pool))
            });
        }
    }
    if opts.runs("apalis") {
        println!("apalis 1.0 + apalis-postgres 1.0 (PostgresStorage, default config)");
        for &h in &opts.handlers {
            measure(format!("apalis, {h} at once"), &|| {
                rt.block_on(peers::apalis(n, h, pool))
            });
        }
    }
    if opts.runs("graphile") {
        println!("graphile_worker 0.14 (default options, with its LocalQueue: see peers.rs)");
        for &h in &opts.handlers {
            measure(format!("graphile_worker, {h} at once"), &|| {
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

    report(&opts, base.as_ref(), &figures, &counters);
}

fn report(
    opts: &Opts,
    base: Option<&((f64, f64), Load)>,
    figures: &[Figure],
    counters: &[(Numbering, usize, f64, Load)],
) {
    println!();
    println!("| | msg/s | / baseline 1 msg/tx | / baseline 10 msg/tx | Postgres tx/msg | load before -> after |");
    println!("|---|---:|---:|---:|---:|---|");
    if let Some(((one, ten), load)) = base {
        println!(
            "| baseline, 1 msg/tx, {} clients | {one:.0} | | | 1 | {load} |",
            opts.clients
        );
        println!(
            "| baseline, 10 msg/tx, {} clients | {ten:.0} | | | 0.1 | (same run) |",
            opts.clients
        );
    }
    let pct = |rate: f64, of: Option<f64>| of.map_or_else(String::new, |b| format!("{:.0}%", 100.0 * rate / b));
    let (one, ten) = (base.map(|b| b.0.0), base.map(|b| b.0.1));
    for f in figures {
        println!(
            "| {} | {:.0} | {} | {} | {:.2} | {} |",
            f.label,
            f.drain.rate,
            pct(f.drain.rate, one),
            pct(f.drain.rate, ten),
            f.drain.tx_per_msg,
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
    targets(opts, one, ten, figures);
}

/// The targets, for each number of handlers.
fn targets(opts: &Opts, one: Option<f64>, ten: Option<f64>, figures: &[Figure]) {
    let find = |label: &str| figures.iter().find(|f| f.label == label).map(|f| f.drain.rate);
    println!();
    for &h in &opts.handlers {
        let alone = find(&format!("courier, {h} at once, one transaction per message"));
        let grouped = find(&format!("courier, {h} at once, group_commit({})", opts.group));
        let peers = [
            find(&format!("apalis, {h} at once")),
            find(&format!("graphile_worker, {h} at once")),
        ];
        let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
        if let (Some(a), Some(b)) = (alone, one) {
            println!(
                "target, {h} at once: >= 80% of the baseline at 1 msg/tx without group commit: {:.0}%, {}",
                100.0 * a / b,
                verdict(a >= 0.8 * b)
            );
        }
        if let (Some(g), Some(b)) = (grouped, ten) {
            println!(
                "target, {h} at once: >= 80% of the baseline at 10 msg/tx with group_commit({}): {:.0}%, {}",
                opts.group,
                100.0 * g / b,
                verdict(g >= 0.8 * b)
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
