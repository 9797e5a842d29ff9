//! `courier-chaos`: Courier's promise (each effect exactly once, nothing lost, nothing
//! stuck) checked under sustained faults.
//!
//! `courier-chaos run --config embedded|sqlite|rabbitmq|postgres` starts worker processes of one
//! endpoint (this program's `worker` subcommand), feeds them `--messages` flows (a saga
//! per key with a timeout, a handler in between, an effect row at each step; see
//! `workflow.rs`), and meanwhile injects `--faults` faults, one every `--every`: workers
//! killed and paused, connections dropped, and with `--own-servers` Postgres and RabbitMQ
//! restarted (containers of the run's own). At the end it stops the workers and checks,
//! from the database and the queue: every expected effect exactly once, no message left
//! or dead-lettered (on the Postgres transport: no row left in `courier.message`, locked
//! or not), no saga left, no timeout left or dead-lettered, no outbox row left.
//! It prints a table and exits 0 only if all of that holds (1 if not, 2 on a setup
//! error). docs/reliability.md gives the commands and the figures.
//!
//! `--config rabbitmq-sessions` runs another workload (`sessions.rs`, `session_run.rs`):
//! `--sessions` x `--per-session` ordered messages on a RabbitMQ session queue, workers
//! killed (`--kills`) and connections dropped (`--drops`), checked for order, overlap,
//! loss and duplicates.
//!
//! `--config rabbitmq-cluster` runs the same flows as `rabbitmq` on a cluster of three
//! RabbitMQ containers of the run's own (it needs a Docker engine), with `--workers`
//! processes given the three nodes in one URL (`cluster_run.rs`). Its faults are its own
//! (not `--faults`/`--every`): the node the workers are connected to (as RabbitMQ lists
//! their connections) is stopped, then started again; later the node they are on then
//! (`--pause-leader`: the node of the queue's leader) is paused for `--node-pause`
//! seconds (three heartbeats of `?heartbeat=5`), then unpaused. It prints how long the
//! workers took to move to another node and to write an effect again after each, and
//! checks the end as `rabbitmq` does.

// A binary: `pub` marks what its modules share, nothing is exported.
#![allow(clippy::print_stdout, clippy::print_stderr, unreachable_pub)]

mod cluster_run;
mod faults;
mod report;
mod session_run;
mod sessions;
mod setup;
mod workflow;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use courier::{Bus, EntityPath, SendOptions, Transport};

use faults::{Dice, Fault, Tally, Workers};
use setup::{Config, Place, Setup};

/// A failure of the harness itself (setup, a server it cannot reach): exit code 2.
#[derive(Debug)]
pub struct Error(pub String);

impl<E: std::error::Error> From<E> for Error {
    fn from(e: E) -> Self {
        Error(e.to_string())
    }
}

/// An [`Error`] with `message`.
pub fn fail<T>(message: impl Into<String>) -> Result<T, Error> {
    Err(Error(message.into()))
}

#[derive(Parser)]
#[command(
    name = "courier-chaos",
    about = "Courier's exactly-once promise under sustained faults"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the workflow under faults and checks the outcome.
    Run(RunArgs),
    /// One worker process (started by `run`).
    Worker {
        #[command(flatten)]
        place: Place,
        /// Also feed the queue (single-process configurations): this many flows.
        #[arg(long, default_value_t = 0)]
        feed: u64,
        /// Flows fed per second.
        #[arg(long, default_value_t = 200)]
        rate: u64,
    },
}

#[derive(clap::Args, Clone)]
struct RunArgs {
    /// What the endpoint runs on.
    #[arg(long, value_enum)]
    config: Config,
    /// Flows (one saga each, three or four effects each).
    #[arg(long, default_value_t = 1000)]
    messages: u64,
    /// Flows sent per second.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Worker processes (1 for the single-process configurations).
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Faults to inject.
    #[arg(long, default_value_t = 5)]
    faults: u32,
    /// Milliseconds between faults.
    #[arg(long, default_value_t = 1000)]
    every: u64,
    /// Start the configuration's servers (Postgres, RabbitMQ) in containers of the run's
    /// own and restart them: each once, or Postgres twice when it is the only server.
    #[arg(long)]
    own_servers: bool,
    /// Seed of the fault choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give up when no effect was written for this many seconds.
    #[arg(long, default_value_t = 90)]
    stall: u64,
    /// `rabbitmq-sessions`: the sessions (`--rate` is then messages a second).
    #[arg(long, default_value_t = 200)]
    sessions: u64,
    /// `rabbitmq-sessions`: the messages of each session.
    #[arg(long, default_value_t = 50)]
    per_session: u64,
    /// `rabbitmq-sessions`: workers killed (SIGKILL), spread over the run (instead of
    /// `--faults`, `--every`).
    #[arg(long, default_value_t = 2)]
    kills: u32,
    /// `rabbitmq-sessions`: times every RabbitMQ connection of the run is closed.
    #[arg(long, default_value_t = 1)]
    drops: u32,
    /// `rabbitmq-cluster`: seconds the workers' node stays paused (3 heartbeats of 5 s).
    #[arg(long, default_value_t = 15)]
    node_pause: u64,
    /// `rabbitmq-cluster`: pause the node of the queue's leader instead of the workers'
    /// (they may be the same).
    #[arg(long)]
    pause_leader: bool,
    /// Leave the run's database and virtual host on the shared servers for inspection
    /// (their URLs are printed) instead of removing them. The database lasts until the
    /// next test process on this machine drops the databases of ended ones; delete the
    /// virtual host by hand (`rabbitmqctl delete_vhost`).
    #[arg(long)]
    keep: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let outcome = match Cli::parse().command {
        Command::Run(args) => Box::pin(run(args)).await,
        Command::Worker { place, feed, rate } => worker(place, feed, rate).await.map(|()| true),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(Error(e)) => {
            eprintln!("courier-chaos: {e}");
            ExitCode::from(2)
        }
    }
}

/// A worker: runs the endpoint until its standard input closes (or it is killed).
async fn worker(place: Place, feed: u64, rate: u64) -> Result<(), Error> {
    // On a cluster the worker says when its transport connects, and to which node.
    let (transport, store, amqp) = if place.config == Config::RabbitmqCluster {
        let (amqp, store) = place.open_amqp().await?;
        let transport: Arc<dyn Transport> = amqp.clone();
        let store: Arc<dyn courier::Store> = Arc::new(store);
        (transport, store, Some(amqp))
    } else {
        let (transport, store) = place.open().await?;
        (transport, store, None)
    };
    let builder = if place.config == Config::RabbitmqSessions {
        sessions::endpoint(&place, transport.clone(), store).await?
    } else {
        place.endpoint(transport.clone(), store)
    };
    let running = builder.start().await?;
    let feeder = (feed > 0).then(|| {
        tokio::spawn(send_flows(
            transport.clone(),
            place.queue.clone(),
            feed,
            rate,
            Arc::default(),
        ))
    });
    println!("READY");
    let reporter = amqp.map(|amqp| tokio::spawn(cluster_run::report_connections(amqp)));
    tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    })
    .await
    .map_err(|e| Error(format!("waiting for standard input: {e}")))?;
    if let Some(feeder) = feeder {
        feeder.abort();
        let _ = feeder.await;
        // A fed worker started again feeds from the start, so it may still be sending
        // copies when the run ends: the last one sent before the abort must be received
        // (and dropped by the inbox) before the endpoint stops, or the run's final check
        // finds it in the queue (seen: one copy, never delivered, 1 run in 3 of seed 11).
        drain(&*transport, &place.queue).await;
    }
    if let Some(reporter) = reporter {
        reporter.abort();
    }
    running.shutdown().await?;
    transport.close().await;
    Ok(())
}

/// Waits (at most 10 s) until `queue` has no active message, seen twice 200 ms apart.
async fn drain(transport: &dyn Transport, queue: &str) {
    let path = EntityPath::queue(queue.to_owned());
    let mut empty_once = false;
    for _ in 0..50 {
        let empty = transport.counts(&path).await.is_ok_and(|c| c.active == 0);
        if empty && empty_once {
            return;
        }
        empty_once = empty;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How far a feeder got, read while it runs, and whether it should go on past its `n`
/// flows (`more`, cleared by the driver once every fault of its plan was injected, so
/// that a slow fault cannot outlast the work).
#[derive(Default)]
pub struct Feed {
    /// The flows sent so far (each flow `0..sent` was sent).
    pub sent: AtomicU64,
    /// Go on sending past `n` flows while this holds.
    pub more: AtomicBool,
}

/// Sends flows `0..n` (and on while `feed.more` holds) at `rate` a second, each with its
/// fixed message id, again after a transient failure (a copy that did arrive is dropped
/// by the inbox). A fed worker that is killed and started again feeds from the start:
/// the copies are dropped the same way. Returns the sends that failed and were made
/// again.
async fn send_flows(
    transport: Arc<dyn Transport>,
    queue: String,
    n: u64,
    rate: u64,
    feed: Arc<Feed>,
) -> Result<u64, Error> {
    let bus = Bus::new(transport, workflow::routes(&queue));
    let started = Instant::now();
    let mut failures = 0;
    let mut i = 0;
    while i < n || feed.more.load(Ordering::SeqCst) {
        let (key, cancel) = workflow::key(i);
        loop {
            let once = SendOptions::new().message_id(format!("open-{key}"));
            match bus
                .send_with(
                    &workflow::Open {
                        key: key.clone(),
                        cancel,
                    },
                    once,
                )
                .await
            {
                Ok(_) => break,
                Err(e) if e.is_transient() => {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return fail(format!("sending flow {key} failed for good: {e}")),
            }
        }
        i += 1;
        feed.sent.store(i, Ordering::SeqCst);
        let due = started + Duration::from_secs_f64(i as f64 / rate.max(1) as f64);
        tokio::time::sleep_until(due.into()).await;
    }
    Ok(failures)
}

/// The faults of a run, in order: the server restarts (with `--own-servers`) at a third
/// and two thirds of the way, the rest drawn from what the configuration allows.
fn schedule(args: &RunArgs, setup: &Setup, dice: &mut Dice) -> Vec<Fault> {
    let mut kinds = vec![Fault::Kill, Fault::Pause];
    if args.config.on_postgres() {
        kinds.push(Fault::DropPostgres);
    }
    if args.config == Config::Rabbitmq {
        kinds.push(Fault::DropRabbit);
    }
    let mut plan: Vec<Fault> = (0..args.faults).map(|_| kinds[dice.below(kinds.len())]).collect();
    if args.own_servers && setup.pg_restartable() {
        let n = plan.len();
        plan.insert(n / 3, Fault::RestartPostgres);
        // The Postgres transport's only server is restarted twice, RabbitMQ + Postgres
        // restart each of theirs once.
        let second = if args.config == Config::Rabbitmq {
            Fault::RestartRabbit
        } else {
            Fault::RestartPostgres
        };
        plan.insert((2 * plan.len()) / 3, second);
    }
    plan
}

async fn run(args: RunArgs) -> Result<bool, Error> {
    let setup = Setup::make(args.config, args.own_servers).await?;
    let outcome = match args.config {
        Config::RabbitmqSessions => session_run::drive(&args, &setup).await,
        Config::RabbitmqCluster => cluster_run::drive(&args, &setup).await,
        _ => drive(&args, &setup).await,
    };
    if args.keep {
        let rabbit = setup.rabbit.as_ref().map(|r| r.url.clone());
        eprintln!(
            "courier-chaos: kept the run's database {} and virtual host {}",
            setup.place.postgres.as_deref().unwrap_or("(none)"),
            rabbit.as_deref().unwrap_or("(none)")
        );
    } else {
        setup.remove().await;
    }
    outcome
}

async fn drive(args: &RunArgs, setup: &Setup) -> Result<bool, Error> {
    let exe = std::env::current_exe().map_err(|e| Error(format!("this program's path: {e}")))?;
    let mut worker_args = setup.place.args();
    let processes = if args.config.competing() {
        args.workers.max(1)
    } else {
        1
    };
    if !args.config.competing() {
        worker_args.extend(["--feed".to_owned(), args.messages.to_string()]);
        worker_args.extend(["--rate".to_owned(), args.rate.to_string()]);
    }
    let mut workers = Workers::new(exe, worker_args);
    for _ in 0..processes {
        workers.spawn().await?;
    }
    let began = Instant::now();
    let feeder = if args.config.competing() {
        let (transport, _) = setup.place.open().await?;
        Some(tokio::spawn(send_flows(
            transport,
            setup.place.queue.clone(),
            args.messages,
            args.rate,
            Arc::default(),
        )))
    } else {
        None
    };
    let mut dice = Dice::new(args.seed);
    let plan = schedule(args, setup, &mut dice);
    let expected = report::expected_rows(args.messages);
    let mut tally = Tally::default();
    let mut progress = report::Progress::default();
    let mut next_fault = Instant::now() + Duration::from_millis(args.every);
    let mut plan = plan.into_iter();
    let mut stalled = false;
    loop {
        let done = report::distinct_rows(&setup.db).await.unwrap_or(0);
        progress.saw(done);
        if done >= expected {
            break;
        }
        if progress.since_last() > Duration::from_secs(args.stall) {
            stalled = true;
            break;
        }
        if Instant::now() >= next_fault {
            if let Some(fault) = plan.next() {
                let before = done;
                inject(fault, &mut dice, &mut workers, setup).await?;
                *tally.injected.entry(fault).or_insert(0) += 1;
                if fault.outage() {
                    let back = Instant::now();
                    let recovered = report::next_effect(&setup.db, before.max(progress.last()), expected).await;
                    tally
                        .recoveries
                        .push((fault, recovered.map(|at| at.duration_since(back))));
                }
            }
            next_fault = Instant::now() + Duration::from_millis(args.every);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = began.elapsed();
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    // Late copies (a redelivery, a reclaimed timeout) would show within a few seconds;
    // outbox rows a killed worker dispatched but could not delete are sent again (and
    // dropped by the inbox) by the sweeper once they are 30 s old.
    tokio::time::sleep(workflow::FIRES_AFTER + Duration::from_secs(2)).await;
    report::outbox_drained(&setup.db, Duration::from_secs(60)).await;
    let killed_at_stop = workers.stop_all(Duration::from_secs(30)).await;
    let outcome = report::check(args.messages, setup).await?;
    let ok = report::print(
        args,
        &tally,
        &outcome,
        elapsed,
        stalled,
        killed_at_stop,
        workers.started,
    );
    Ok(ok)
}

async fn inject(fault: Fault, dice: &mut Dice, workers: &mut Workers, setup: &Setup) -> Result<(), Error> {
    eprintln!("courier-chaos: {}", fault.name());
    faults::inject(fault, dice, workers, setup).await
}
