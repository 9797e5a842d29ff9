//! The worker processes and the faults done to them and to the servers: SIGKILL (and a
//! new process in its place), SIGSTOP past the lock duration (then SIGCONT), Postgres
//! connections ended by `pg_terminate_backend`, RabbitMQ connections closed by
//! `rabbitmqctl`, restarts of servers the run owns, and (`rabbitmq-cluster`) a node of the
//! cluster stopped or paused. The workers' standard output after `READY` is kept, line by
//! line, with the time it came ([`Workers::reports`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::setup::{LOCK, Setup};
use crate::{Error, fail};

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// A worker killed with SIGKILL, a new one started.
    Kill,
    /// A worker stopped with SIGSTOP past the lock duration, then continued.
    Pause,
    /// Every Postgres connection of the workers ended by the server.
    DropPostgres,
    /// Every AMQP connection of the run closed by the broker.
    DropRabbit,
    /// The run's own Postgres stopped and started.
    RestartPostgres,
    /// The run's own RabbitMQ application stopped and started.
    RestartRabbit,
    /// The cluster node the workers are connected to stopped (`docker stop`), then
    /// started again.
    StopNode,
    /// The cluster node the workers are connected to paused (`docker pause`) for three
    /// heartbeats, then unpaused.
    PauseNode,
}

impl Fault {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "worker killed (SIGKILL)",
            Fault::Pause => "worker paused past its lock (SIGSTOP)",
            Fault::DropPostgres => "Postgres connections ended",
            Fault::DropRabbit => "RabbitMQ connections closed",
            Fault::RestartPostgres => "Postgres restarted",
            Fault::RestartRabbit => "RabbitMQ restarted",
            Fault::StopNode => "RabbitMQ node stopped (docker stop)",
            Fault::PauseNode => "RabbitMQ node paused (docker pause)",
        }
    }

    /// Whether the fault is an outage of a server, after which recovery is timed.
    pub fn outage(self) -> bool {
        !matches!(self, Fault::Kill | Fault::Pause)
    }
}

/// A small deterministic generator (xorshift64*), so that a seed replays a run's choices.
pub struct Dice(u64);

impl Dice {
    /// Seeded; 0 is replaced (xorshift needs a bit set).
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        usize::try_from(r % u64::try_from(n.max(1)).unwrap_or(1)).unwrap_or(0)
    }
}

/// One worker process.
struct Worker {
    child: Child,
}

/// A line a worker printed after `READY`: its process id, when the line came, the line.
#[derive(Debug, Clone)]
pub struct Report {
    /// The worker's process id.
    pub pid: u32,
    /// When the driver read the line.
    pub at: Instant,
    /// The line.
    pub line: String,
}

/// The worker processes of a run.
pub struct Workers {
    exe: PathBuf,
    args: Vec<String>,
    running: Vec<Worker>,
    /// Workers started, in all.
    pub started: u32,
    /// What the workers printed after `READY`, in the order it came.
    pub reports: Arc<Mutex<Vec<Report>>>,
}

impl Workers {
    /// Workers of `exe` (this program) with `args` (the `worker` subcommand's).
    pub fn new(exe: PathBuf, args: Vec<String>) -> Self {
        Self {
            exe,
            args,
            running: Vec::new(),
            started: 0,
            reports: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// Starts one and waits for its `READY` (it retries while a server is down, within
    /// a minute).
    pub async fn spawn(&mut self) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut child = Command::new(&self.exe)
                .arg("worker")
                .args(&self.args)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| Error(format!("cannot start a worker: {e}")))?;
            let stdout = child.stdout.take();
            let ready = match stdout {
                Some(out) => {
                    let mut lines = BufReader::new(out).lines();
                    let ready = matches!(
                        tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await,
                        Ok(Ok(Some(line))) if line == "READY"
                    );
                    if let (true, Some(pid)) = (ready, child.id()) {
                        tokio::spawn(keep_reports(pid, lines, self.reports.clone()));
                    }
                    ready
                }
                None => false,
            };
            if ready {
                self.started += 1;
                self.running.push(Worker { child });
                return Ok(());
            }
            let _ = child.kill().await;
            if Instant::now() > deadline {
                return fail("a worker did not become ready within a minute");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// How many are running.
    pub fn count(&self) -> usize {
        self.running.len()
    }

    /// The index of the running worker whose process id is `pid`.
    pub fn index_of(&self, pid: u32) -> Option<usize> {
        self.running.iter().position(|w| w.child.id() == Some(pid))
    }

    /// The process id of worker `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.running.get(i).and_then(|w| w.child.id())
    }

    /// The process ids of the running workers.
    pub fn pids(&self) -> Vec<u32> {
        self.running.iter().filter_map(|w| w.child.id()).collect()
    }

    /// Kills worker `i` with SIGKILL and starts another.
    pub async fn kill(&mut self, i: usize) -> Result<(), Error> {
        if i < self.running.len() {
            let mut worker = self.running.swap_remove(i);
            let _ = worker.child.kill().await;
        }
        self.spawn().await
    }

    /// Stops worker `i` with SIGSTOP for the lock duration and a second more, then
    /// continues it.
    pub async fn pause(&mut self, i: usize) -> Result<(), Error> {
        let Some(pid) = self.running.get(i).and_then(|w| w.child.id()) else {
            return Ok(());
        };
        signal(pid, "-STOP").await?;
        tokio::time::sleep(LOCK + Duration::from_secs(1)).await;
        signal(pid, "-CONT").await
    }

    /// Asks every worker to stop (its standard input closes) and waits for each, at most
    /// `within`; a worker still running then is killed. Returns how many had to be.
    pub async fn stop_all(&mut self, within: Duration) -> usize {
        let mut killed = 0;
        for mut worker in self.running.drain(..) {
            drop(worker.child.stdin.take());
            if tokio::time::timeout(within, worker.child.wait()).await.is_err() {
                let _ = worker.child.kill().await;
                killed += 1;
            }
        }
        killed
    }
}

/// Keeps what worker `pid` prints, line by line, until its standard output closes.
async fn keep_reports(
    pid: u32,
    mut lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    reports: Arc<Mutex<Vec<Report>>>,
) {
    while let Ok(Some(line)) = lines.next_line().await {
        let report = Report {
            pid,
            at: Instant::now(),
            line,
        };
        if let Ok(mut reports) = reports.lock() {
            reports.push(report);
        }
    }
}

async fn signal(pid: u32, which: &str) -> Result<(), Error> {
    let status = Command::new("kill")
        .args([which, &pid.to_string()])
        .status()
        .await
        .map_err(|e| Error(format!("cannot run kill {which}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        fail(format!("kill {which} {pid} failed"))
    }
}

/// Faults injected, by kind, and the recovery times measured after outages.
#[derive(Default)]
pub struct Tally {
    /// How many of each kind.
    pub injected: BTreeMap<Fault, u32>,
    /// For each outage: its kind and the time from the server's return to the next effect.
    pub recoveries: Vec<(Fault, Option<Duration>)>,
    /// Lines printed under the faults (what a cluster run measured at each fault).
    pub notes: Vec<String>,
    /// What went wrong at a fault (a worker that did not resume): each fails the run.
    pub failures: Vec<String>,
}

/// Injects `fault` on `workers` and `setup`. Returns when the fault is over (the process
/// replaced, continued, or the server back).
pub async fn inject(fault: Fault, dice: &mut Dice, workers: &mut Workers, setup: &Setup) -> Result<(), Error> {
    match fault {
        Fault::Kill => workers.kill(dice.below(workers.count())).await,
        Fault::Pause => workers.pause(dice.below(workers.count())).await,
        Fault::DropPostgres => setup.db.terminate_others().await.map(|_| ()),
        Fault::DropRabbit => match &setup.rabbit {
            Some(rabbit) => rabbit.close_connections().await,
            None => Ok(()),
        },
        Fault::RestartPostgres => setup.restart_postgres().await,
        Fault::RestartRabbit => match &setup.rabbit {
            Some(rabbit) => rabbit.restart(Duration::from_secs(2)).await,
            None => Ok(()),
        },
        // Injected and measured by the cluster run (`cluster_run.rs`), never drawn.
        Fault::StopNode | Fault::PauseNode => fail(format!("{} is only injected by the cluster run", fault.name())),
    }
}
