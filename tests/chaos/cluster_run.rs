//! The `rabbitmq-cluster` run (issue 36): the `rabbitmq` workload (`workflow.rs`, effects
//! in Postgres) on a cluster of three RabbitMQ nodes ([`courier_tests::cluster`], the
//! run's own containers), `--workers` processes given the three nodes in one URL with
//! `?heartbeat=5`, the feeder in the driver on the same URL.
//!
//! Two faults, by progress: when a fifth of the expected effects are written, the node
//! the workers are connected to is stopped (`docker stop`) and, once they went on
//! elsewhere, started again; when two fifths are (or as soon as that node is back), the
//! node they are connected to then (with `--pause-leader`, the node of the leader of the
//! endpoint's quorum queue) is paused (`docker pause`) for `--node-pause` seconds (three
//! heartbeats by default) and unpaused. The workers' node is found from RabbitMQ:
//! `rabbitmqctl list_connections` lists each connection's process, which names its node,
//! and its client properties, which carry the connection name `chaos-<pid>` of each
//! worker process ([`connection_name`]); the queue's leader from `rabbitmqctl
//! list_queues name leader`.
//!
//! Each worker also prints a line `CONNECTED <connections made> <node URL>` whenever its
//! transport makes a connection ([`report_connections`]); the driver keeps them with the
//! time they came ([`Workers::reports`]). After a fault it measures, from the fault's
//! start: when every worker had connected to another node, the first effect written
//! after that (from the effect count), and the longest time without a new effect. A
//! fault after which the workers had not all moved and written an effect within two
//! minutes fails the run. The feeder goes on past `--messages` flows until both faults
//! were injected (a node's stop and start took from 16 s to 34 s on one machine), so no
//! fault comes after the work; the table says how many more flows that took. The
//! end-of-run checks are the `rabbitmq` configuration's (`report.rs`), over every flow fed.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use courier::AmqpTransport;
use courier_tests::cluster::Cluster;

use crate::faults::{Fault, Report, Tally, Workers};
use crate::setup::{Db, Setup, connection_name};
use crate::{Error, Feed, RunArgs, fail, report, send_flows, workflow};

/// The heartbeat the workers and the feeder ask for (seconds): a node that stops
/// answering is noticed after about twice that.
pub const HEARTBEAT: u64 = 5;

/// The share of the expected effects written when each fault comes: (numerator,
/// denominator).
const STOP_AT: (i64, i64) = (1, 5);
const PAUSE_AT: (i64, i64) = (2, 5);

/// How long a fault may leave the workers without writing an effect before it fails the
/// run.
const RESUME_WITHIN: Duration = Duration::from_secs(120);

/// The prefix of the lines a worker prints when its transport connects.
const CONNECTED: &str = "CONNECTED";

/// Prints `CONNECTED <connections made> <node URL>` (the URL without its password)
/// whenever the transport's connection count or node changes, until the process ends.
pub async fn report_connections(transport: Arc<AmqpTransport>) {
    use std::io::Write;
    let mut last = (0, None);
    loop {
        let now = (transport.connections_made(), transport.connected_node());
        if now != last {
            let node = now.1.clone().unwrap_or_else(|| "(none)".to_owned());
            // The driver reads every line; should it have gone, nothing is lost.
            let _ = writeln!(std::io::stdout().lock(), "{CONNECTED} {} {node}", now.0);
            last = now;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The node of the cluster whose AMQP port `url` names.
fn node_of_url(cluster: &Cluster, url: &str) -> Option<usize> {
    cluster
        .nodes()
        .iter()
        .position(|n| url.contains(&format!(":{}/", n.port())))
}

/// The node each worker `pids` is connected to, as RabbitMQ lists the connections (asked
/// of node `ask`): `None` for a worker it does not list.
async fn broker_view(cluster: &Cluster, ask: usize, pids: &[u32]) -> Vec<Option<usize>> {
    let listing = cluster
        .rabbitmqctl(
            ask,
            &["list_connections", "--no-table-headers", "pid", "client_properties"],
        )
        .await;
    pids.iter()
        .map(|&pid| {
            let name = connection_name(pid);
            listing
                .lines()
                .find(|line| {
                    line.match_indices(&name).any(|(at, _)| {
                        !line[at + name.len()..]
                            .chars()
                            .next()
                            .is_some_and(|c| c.is_ascii_digit())
                    })
                })
                .and_then(|line| {
                    // The connection's process, `<rabbit@host.123.456.0>`, names its node.
                    let erlang = line.split_once('<')?.1.split_once('.')?.0;
                    cluster.nodes().iter().position(|n| n.node_name() == erlang)
                })
        })
        .collect()
}

/// The node of the leader of the quorum queue `queue`, as node `ask` lists it.
async fn queue_leader(cluster: &Cluster, ask: usize, queue: &str) -> Option<usize> {
    let listing = cluster
        .rabbitmqctl(ask, &["list_queues", "--no-table-headers", "name", "leader"])
        .await;
    let leader = listing
        .lines()
        .find_map(|line| line.strip_prefix(queue)?.strip_prefix('\t'))?
        .trim()
        .to_owned();
    cluster.nodes().iter().position(|n| n.node_name() == leader)
}

/// The node each worker last said it connected to.
fn own_view(cluster: &Cluster, reports: &[Report], pids: &[u32]) -> Vec<Option<usize>> {
    pids.iter()
        .map(|&pid| {
            reports
                .iter()
                .rev()
                .filter(|r| r.pid == pid)
                .find_map(|r| connected_to(cluster, r))
        })
        .collect()
}

/// The node a `CONNECTED` report names.
fn connected_to(cluster: &Cluster, report: &Report) -> Option<usize> {
    let rest = report.line.strip_prefix(CONNECTED)?;
    node_of_url(cluster, rest)
}

fn shown(nodes: &[Option<usize>]) -> String {
    let each: Vec<String> = nodes
        .iter()
        .map(|n| n.map_or_else(|| "?".to_owned(), |i| i.to_string()))
        .collect();
    each.join(", ")
}

/// Finds the node the workers are connected to, from RabbitMQ's list of connections
/// (asked of a node that is up); the one most of them are on, should they be on
/// several. Notes what RabbitMQ and the workers themselves say, and where the leader of
/// `queue` (the endpoint's quorum queue) is.
async fn placement(cluster: &Cluster, workers: &Workers, queue: &str, tally: &mut Tally) -> Result<Placement, Error> {
    let pids = workers.pids();
    let broker = broker_view(cluster, 0, &pids).await;
    let own = {
        let reports = workers
            .reports
            .lock()
            .map_err(|_| Error("the reports' lock".to_owned()))?;
        own_view(cluster, &reports, &pids)
    };
    let on: Vec<Option<usize>> = broker.iter().zip(&own).map(|(b, o)| b.or(*o)).collect();
    let mut count = vec![0; cluster.nodes().len()];
    for i in broker.iter().flatten() {
        count[*i] += 1;
    }
    let Some(node) = (0..count.len()).filter(|&i| count[i] > 0).max_by_key(|&i| count[i]) else {
        return fail(format!(
            "rabbitmqctl list_connections lists no connection of the workers (processes {pids:?}); they say \
             they are on nodes {}",
            shown(&own)
        ));
    };
    let leader = queue_leader(cluster, 0, queue).await;
    tally.notes.push(format!(
        "workers {pids:?} on nodes [{}] by rabbitmqctl list_connections, [{}] by their own account: node {node} \
         ({}); the queue's leader on node {}",
        shown(&broker),
        shown(&own),
        cluster.nodes()[node].node_name(),
        shown(&[leader])
    ));
    Ok(Placement { node, on, leader })
}

/// Where the workers and the queue's leader are before a fault.
struct Placement {
    /// The node most workers are connected to.
    node: usize,
    /// Each worker's node (RabbitMQ's account, else the worker's own), in the order of
    /// the pids.
    on: Vec<Option<usize>>,
    /// The node of the queue's leader.
    leader: Option<usize>,
}

/// What followed a fault, from its start.
struct Resumed {
    /// When each worker connected to a node other than the faulted one (its first such
    /// connection), in the order of the pids; `Some(ZERO)` for one that was on another
    /// node already (`stayed`).
    reconnected: Vec<Option<Duration>>,
    /// The workers that were not on the faulted node.
    stayed: Vec<bool>,
    /// The first effect written after the last of those.
    handled: Option<Duration>,
    /// The longest time without a new effect, from the fault to `handled` (or to the end
    /// of the wait).
    longest_gap: Duration,
}

/// Waits (at most [`RESUME_WITHIN`]) until every worker that was on `from` (`on`, in the
/// order of [`Workers::pids`]) connected to another node after `fault`, and an effect
/// was written after that. The feeder goes on while faults remain, so the work cannot
/// end during the wait.
async fn resumed(
    cluster: &Cluster,
    workers: &Workers,
    db: &Db,
    on: &[Option<usize>],
    from: usize,
    fault: Instant,
) -> Resumed {
    let pids = workers.pids();
    let stayed: Vec<bool> = (0..pids.len())
        .map(|i| on.get(i).copied().flatten().is_some_and(|n| n != from))
        .collect();
    let mut reconnected: Vec<Option<Duration>> = stayed.iter().map(|&s| s.then_some(Duration::ZERO)).collect();
    let mut last_count = report::distinct_rows(db).await.unwrap_or(0);
    let mut last_growth = fault;
    let mut longest_gap = Duration::ZERO;
    // The effect count when the last worker had moved.
    let mut moved_at: Option<i64> = None;
    let mut handled = None;
    while fault.elapsed() < RESUME_WITHIN {
        let count = report::distinct_rows(db).await.unwrap_or(last_count);
        if count > last_count {
            let now = Instant::now();
            longest_gap = longest_gap.max(now.duration_since(last_growth));
            last_growth = now;
            last_count = count;
            if moved_at.is_some_and(|at| count > at) {
                handled = Some(fault.elapsed());
                break;
            }
        }
        if moved_at.is_none() {
            if let Ok(reports) = workers.reports.lock() {
                for (i, pid) in pids.iter().enumerate() {
                    if reconnected[i].is_none() {
                        reconnected[i] = reports
                            .iter()
                            .filter(|r| r.pid == *pid && r.at >= fault)
                            .find(|r| connected_to(cluster, r).is_some_and(|n| n != from))
                            .map(|r| r.at.duration_since(fault));
                    }
                }
            }
            if reconnected.iter().all(Option::is_some) {
                moved_at = Some(count);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if handled.is_none() {
        longest_gap = longest_gap.max(last_growth.elapsed());
    }
    Resumed {
        reconnected,
        stayed,
        handled,
        longest_gap,
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// Notes what followed a fault on `node`; a fault after which no effect came fails the
/// run.
fn note(tally: &mut Tally, fault: Fault, node: usize, r: &Resumed, more: &str) {
    let each: Vec<String> = r
        .reconnected
        .iter()
        .zip(&r.stayed)
        .map(|(d, &stayed)| if stayed { "stayed".to_owned() } else { secs(*d) })
        .collect();
    tally.notes.push(format!(
        "{} (node {node}{more}): workers on another node after [{}], an effect again after {}, longest \
         without an effect {:.2} s",
        fault.name(),
        each.join(", "),
        secs(r.handled),
        r.longest_gap.as_secs_f64()
    ));
    if r.handled.is_none() {
        tally.failures.push(format!(
            "{}: the workers did not all move to another node and write an effect within {RESUME_WITHIN:?}",
            fault.name()
        ));
    }
}

/// Stops the workers' node, measures what follows, then starts the node again.
async fn stop_node(cluster: &Cluster, workers: &Workers, setup: &Setup, tally: &mut Tally) -> Result<(), Error> {
    let placed = placement(cluster, workers, &setup.place.queue, tally).await?;
    let node = placed.node;
    eprintln!("courier-chaos: stopping node {node}, where the workers are");
    let fault = Instant::now();
    // Side by side: RabbitMQ closes its connections early in its shutdown, before
    // `docker stop` returns.
    let (stopped_in, r) = tokio::join!(
        async {
            cluster.stop(node).await;
            fault.elapsed()
        },
        resumed(cluster, workers, &setup.db, &placed.on, node, fault)
    );
    let back = Instant::now();
    cluster.start_again(node).await;
    let more = format!(
        "; docker stop took {:.1} s, docker start until the node ran {:.1} s; then the queue's leader on node {}",
        stopped_in.as_secs_f64(),
        back.elapsed().as_secs_f64(),
        shown(&[queue_leader(cluster, 0, &setup.place.queue).await])
    );
    note(tally, Fault::StopNode, node, &r, &more);
    *tally.injected.entry(Fault::StopNode).or_insert(0) += 1;
    Ok(())
}

/// Pauses the workers' node (with `leader`, the node of the queue's leader) for
/// `paused_for`, measuring what follows, then unpauses it.
async fn pause_node(
    cluster: &Cluster,
    workers: &Workers,
    setup: &Setup,
    tally: &mut Tally,
    (paused_for, leader): (Duration, bool),
) -> Result<(), Error> {
    let placed = placement(cluster, workers, &setup.place.queue, tally).await?;
    let node = match (leader, placed.leader) {
        (false, _) => placed.node,
        (true, Some(node)) => node,
        (true, None) => {
            return fail("rabbitmqctl list_queues names no leader of the queue: --pause-leader cannot pause it");
        }
    };
    eprintln!(
        "courier-chaos: pausing node {node}{}",
        if leader {
            ", the queue's leader's"
        } else {
            ", where the workers are"
        }
    );
    let fault = Instant::now();
    cluster.pause(node).await;
    let ((), r) = tokio::join!(
        async {
            tokio::time::sleep(paused_for.saturating_sub(fault.elapsed())).await;
            cluster.unpause(node).await;
        },
        resumed(cluster, workers, &setup.db, &placed.on, node, fault)
    );
    let more = format!(
        "; unpaused after {:.0} s; then the queue's leader on node {}",
        paused_for.as_secs_f64(),
        shown(&[queue_leader(cluster, 0, &setup.place.queue).await])
    );
    note(tally, Fault::PauseNode, node, &r, &more);
    *tally.injected.entry(Fault::PauseNode).or_insert(0) += 1;
    Ok(())
}

/// Runs the workflow on the cluster through its two faults and checks it; returns
/// whether it passed.
pub async fn drive(args: &RunArgs, setup: &Setup) -> Result<bool, Error> {
    let Some(cluster) = &setup.cluster else {
        return fail("the rabbitmq-cluster configuration has no cluster");
    };
    let exe = std::env::current_exe().map_err(|e| Error(format!("this program's path: {e}")))?;
    let mut workers = Workers::new(exe, setup.place.args());
    for _ in 0..args.workers.max(1) {
        workers.spawn().await?;
    }
    let began = Instant::now();
    let (transport, _) = setup.place.open().await?;
    // The feeder goes on past `--messages` until both faults were injected: how long a
    // node takes to stop and start again varies with the machine (16 s to 34 s seen), and
    // a fault that comes after the work proves nothing.
    let feed = Arc::new(Feed::default());
    feed.more.store(true, Ordering::SeqCst);
    let feeder = tokio::spawn(send_flows(
        transport.clone(),
        setup.place.queue.clone(),
        args.messages,
        args.rate,
        feed.clone(),
    ));
    let expected = report::expected_rows(args.messages);
    let at = |(n, d): (i64, i64)| expected.saturating_mul(n) / d;
    let mut plan = vec![(Fault::StopNode, at(STOP_AT)), (Fault::PauseNode, at(PAUSE_AT))]
        .into_iter()
        .peekable();
    let mut tally = Tally::default();
    let mut progress = report::Progress::default();
    let mut stalled = false;
    loop {
        let done = report::distinct_rows(&setup.db).await.unwrap_or(0);
        progress.saw(done);
        if plan.peek().is_none() {
            feed.more.store(false, Ordering::SeqCst);
        }
        if feeder.is_finished() && done >= report::expected_rows(feed.sent.load(Ordering::SeqCst)) {
            break;
        }
        if progress.since_last() > Duration::from_secs(args.stall) {
            stalled = true;
            break;
        }
        if let Some(&(fault, when)) = plan.peek()
            && done >= when
        {
            plan.next();
            match fault {
                Fault::StopNode => stop_node(cluster, &workers, setup, &mut tally).await?,
                _ => {
                    let pause = (Duration::from_secs(args.node_pause), args.pause_leader);
                    pause_node(cluster, &workers, setup, &mut tally, pause).await?;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = began.elapsed();
    for (fault, _) in plan {
        tally.failures.push(format!(
            "{} not injected: the effects stopped growing first",
            fault.name()
        ));
    }
    feed.more.store(false, Ordering::SeqCst);
    if feeder.is_finished() {
        match feeder.await {
            Ok(Ok(failures)) => tally.notes.push(format!(
                "the feeder's sends that failed with a transient error and were sent again: {failures}"
            )),
            Ok(Err(Error(e))) => tally.failures.push(format!("the feeder failed: {e}")),
            Err(e) => tally.failures.push(format!("the feeder's task failed: {e}")),
        }
    } else {
        feeder.abort();
    }
    transport.close().await;
    tokio::time::sleep(workflow::FIRES_AFTER + Duration::from_secs(2)).await;
    report::outbox_drained(&setup.db, Duration::from_secs(60)).await;
    let killed_at_stop = workers.stop_all(Duration::from_secs(30)).await;
    let sent = feed.sent.load(Ordering::SeqCst);
    if sent > args.messages {
        tally.notes.push(format!(
            "flows fed past --messages {} until both faults were injected: {}",
            args.messages,
            sent - args.messages
        ));
    }
    let outcome = report::check(sent, setup).await?;
    let fed = RunArgs {
        messages: sent,
        ..args.clone()
    };
    Ok(report::print(
        &fed,
        &tally,
        &outcome,
        elapsed,
        stalled,
        killed_at_stop,
        workers.started,
    ))
}
