//! A RabbitMQ cluster of three nodes loses the node an endpoint is connected to, twice:
//! `docker stop` (then `docker start`), and later `docker pause` for three heartbeats
//! (then `docker unpause`). The endpoint, given the three nodes in one URL, moves to a
//! node left and goes on each time; a stream of jobs sent through the faults (a send that
//! fails with a transient error is sent again with the same message id) and jobs scheduled
//! to fall due during each fault (published by the transport's dispatcher through the
//! nodes left) end with every job's effect once in the endpoint's SQLite store, nothing in
//! the queue or its dead-letter queue. The queue has a member on each node. How long the
//! endpoint took to resume after each fault is printed, a measurement, not asserted.
//!
//! The pause is the case the operation timeout exists for (`AmqpBuilder::operation_timeout`,
//! `tests/amqp/silent.rs`): before it, a send in flight at the pause could wait for as
//! long as the node stayed paused.
//!
//! A test binary of its own: three RabbitMQ nodes are the load of this binary alone (2
//! cores). It needs a Docker engine ([`courier_tests::cluster`]).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use courier::{
    AmqpTransport, Context, Endpoint, EntityPath, HandlerError, RunningEndpoint, ScheduleStore, SqliteStore, Transport,
};
use courier_tests::cluster::Cluster;
use courier_tests::rabbit::{Job, JobDone, job_routes, memory_store};

/// The heartbeat asked for (seconds): a node that stops answering is noticed after about
/// twice that.
const HEARTBEAT: u64 = 5;

/// Records the job in the store's transaction (no unique key: a second effect of a job
/// would be a second row) and publishes `JobDone` through the outbox.
#[courier::handler]
async fn work(job: Job, ctx: &mut Context) -> Result<(), HandlerError> {
    let tx = ctx.transaction::<sqlx::Sqlite>()?;
    sqlx::query("INSERT INTO effects (n) VALUES (?)")
        .bind(i64::from(job.n))
        .execute(&mut *tx)
        .await?;
    ctx.publish(&JobDone { n: job.n })?;
    Ok(())
}

async fn effects(store: &SqliteStore) -> (i64, i64) {
    sqlx::query_as("SELECT count(*), count(DISTINCT n) FROM effects")
        .fetch_one(store.pool())
        .await
        .unwrap()
}

/// Sends jobs `0..` with fixed message ids until `stop`, then `tail` more; a send that
/// fails with a transient error is sent again (the same job, the same id). The number sent.
async fn send_stream(running: Arc<RunningEndpoint>, stop: Arc<AtomicBool>, tail: u32, retried: Arc<AtomicU32>) -> u32 {
    let mut n = 0;
    let mut stopped_at = None;
    while stopped_at.is_none_or(|s| n < s + tail) {
        if stopped_at.is_none() && stop.load(Ordering::Acquire) {
            stopped_at = Some(n);
        }
        let once = courier::SendOptions::new().message_id(format!("job-{n}"));
        match running.bus().send_with(&Job { n }, once).await {
            Ok(_) => n += 1,
            Err(e) => {
                assert!(e.is_transient(), "a send failed for good: {e}");
                eprintln!("job {n}: the send failed with a transient error and is sent again: {e}");
                retried.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    n
}

/// Jobs `from..from + LATE`, each due `delay` from now: held in the transport's schedule
/// store, and published by its dispatcher through whichever node it is connected to when
/// they fall due.
async fn schedule_late(running: &RunningEndpoint, from: u32, delay: Duration) {
    for n in from..from + LATE {
        let later = courier::SendOptions::new()
            .message_id(format!("late-{n}"))
            .deliver_after(delay);
        running.bus().send_with(&Job { n }, later).await.unwrap();
    }
}

/// How many jobs are scheduled before each fault, and where their numbers start (far
/// above the stream's).
const LATE: u32 = 5;
const LATE_AT_STOP: u32 = 1_000_000;
const LATE_AT_PAUSE: u32 = 2_000_000;

/// How long the endpoint may take to resume after a stop before the test fails.
const STUCK: Duration = Duration::from_secs(90);

/// And after a pause: a queue whose leader is on the paused node takes messages again only
/// once the other nodes have declared that node down (Erlang's `net_ticktime`, 60 s by
/// default: about 60 to 75 s), and a send waiting for it fails at the operation timeout
/// (30 s) and is sent again.
const STUCK_AFTER_PAUSE: Duration = Duration::from_secs(180);

/// How long after `fault` node `other` no longer counted node `gone` among its peers
/// (polled every 2 s, for at most `limit`); `None` if it still did.
async fn declared_down(
    cluster: &Cluster,
    other: usize,
    gone: usize,
    fault: Instant,
    limit: Duration,
) -> Option<Duration> {
    let query = format!("lists:member('{}', nodes()).", cluster.nodes()[gone].node_name());
    while fault.elapsed() < limit {
        if cluster.rabbitmqctl(other, &["eval", &query]).await.trim() == "false" {
            return Some(fault.elapsed());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    None
}

/// Waits until the transport made a new connection (after `made`) and a job had its
/// effect after it; the two times from `fault`. After [`STUCK`], says where it is.
async fn resumed(
    transport: &AmqpTransport,
    store: &SqliteStore,
    made: u64,
    (fault, limit): (Instant, Duration),
) -> Result<(Duration, Duration), String> {
    let reconnected = loop {
        if transport.connections_made() > made {
            break fault.elapsed();
        }
        if fault.elapsed() > limit {
            return Err(format!("no new connection {limit:?} after the fault"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let before = effects(store).await.0;
    loop {
        if effects(store).await.0 > before {
            return Ok((reconnected, fault.elapsed()));
        }
        if fault.elapsed() > limit {
            return Err(format!(
                "no job handled {limit:?} after the fault (the transport reconnected {reconnected:?} after it, to {:?})",
                transport.connected_node()
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Panics with `why` and what a node other than `faulty` says of the cluster and `queue`.
async fn stuck(cluster: &Cluster, faulty: usize, queue: &str, why: String) -> ! {
    let other = (faulty + 1) % cluster.nodes().len();
    panic!("{why}\nnode {other} says:\n{}", cluster.describe(other, queue).await);
}

async fn wait_all(store: &SqliteStore, sent: i64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (all, distinct) = effects(store).await;
        assert_eq!(all, distinct, "a job had its effect twice");
        if distinct == sent {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{distinct} of {sent} jobs had their effect within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_on_a_cluster_that_loses_its_node_moves_to_another_and_loses_no_job_and_repeats_no_effect() {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_test_writer()
        .try_init();
    let began = Instant::now();
    let cluster = Cluster::start().await;
    eprintln!("cluster of three nodes up and joined in {:?}", began.elapsed());
    let store = memory_store().await;
    sqlx::query("CREATE TABLE effects (n integer NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let transport = Arc::new(
        AmqpTransport::builder(cluster.url(&format!("?heartbeat={HEARTBEAT}")))
            .schedules(ScheduleStore::from(&store))
            .connection_name("cluster-test")
            .open()
            .await
            .unwrap(),
    );
    let name = format!("cluster-{}", uuid::Uuid::new_v4().simple());
    let running = Arc::new(
        Endpoint::builder(&name)
            .transport(transport.clone())
            .store(Arc::new(store.clone()))
            .routes(job_routes(&name, &format!("{name}-done")))
            .handler(work)
            .concurrency(8)
            .shutdown_timeout(Duration::from_secs(10))
            .start()
            .await
            .unwrap(),
    );
    // The queue has a member on every node (RabbitMQ's default initial group size, which
    // Courier does not set: docs/rabbitmq-cluster.md).
    let members = cluster.rabbitmqctl(0, &["list_queues", "name", "members"]).await;
    let line = members
        .lines()
        .find(|l| l.starts_with(&format!("{name}\t")))
        .unwrap_or_else(|| {
            panic!("{name} is not listed: {members}");
        });
    for node in cluster.nodes() {
        assert!(
            line.contains(&node.node_name()),
            "{name} has no member on {}: {line}",
            node.node_name()
        );
    }

    let stop = Arc::new(AtomicBool::new(false));
    let retried = Arc::new(AtomicU32::new(0));
    let sender = tokio::spawn(send_stream(running.clone(), stop.clone(), 200, retried.clone()));
    courier_tests::eventually("some jobs handled", || async { effects(&store).await.0 >= 50 }).await;

    // Jobs that fall due while the endpoint is moving away from the stopped node.
    schedule_late(&running, LATE_AT_STOP, Duration::from_secs(3)).await;
    // A node stopped: the one the endpoint is connected to.
    let first = cluster.node_of(&transport.connected_node().unwrap());
    let made = transport.connections_made();
    let fault = Instant::now();
    // The stop and the wait for the endpoint run side by side: RabbitMQ closes its
    // connections early in its shutdown, before `docker stop` returns.
    let (stopped_in, resumed_now) = tokio::join!(
        async {
            cluster.stop(first).await;
            fault.elapsed()
        },
        resumed(&transport, &store, made, (fault, STUCK))
    );
    let (reconnected, resumed_after) = match resumed_now {
        Ok(times) => times,
        Err(why) => stuck(&cluster, first, &name, why).await,
    };
    let moved_to = cluster.node_of(&transport.connected_node().unwrap());
    assert_ne!(moved_to, first, "the endpoint moved to another node");
    eprintln!(
        "node {first} stopped (docker stop took {stopped_in:?}): the endpoint connected to node {moved_to} \
         {reconnected:?} after the stop began, and handled a job again {resumed_after:?} after it"
    );
    cluster.start_again(first).await;
    courier_tests::eventually("jobs handled after the node came back", || async {
        effects(&store).await.0 > 0
    })
    .await;

    // A node paused for three heartbeats: the one the endpoint is connected to now. Its
    // connections stay open and answer nothing; the endpoint notices the silence (about
    // two heartbeats), moves to a node left and goes on while the node is still paused.
    let paused = cluster.node_of(&transport.connected_node().unwrap());
    // And jobs that fall due while the node is paused, before the endpoint has left it.
    schedule_late(&running, LATE_AT_PAUSE, Duration::from_secs(4)).await;
    let made = transport.connections_made();
    let fault = Instant::now();
    cluster.pause(paused).await;
    let other = (paused + 1) % cluster.nodes().len();
    let (resumed_now, down) = tokio::join!(
        resumed(&transport, &store, made, (fault, STUCK_AFTER_PAUSE)),
        declared_down(&cluster, other, paused, fault, STUCK_AFTER_PAUSE)
    );
    let (reconnected, resumed_after) = match resumed_now {
        Ok(times) => times,
        Err(why) => {
            cluster.unpause(paused).await;
            stuck(&cluster, paused, &name, why).await
        }
    };
    let moved_to = cluster.node_of(&transport.connected_node().unwrap());
    assert_ne!(moved_to, paused, "the endpoint moved away from the paused node");
    eprintln!(
        "node {paused} paused: the endpoint connected to node {moved_to} {reconnected:?} after the pause, \
         and handled a job again {resumed_after:?} after it; node {other} declared node {paused} down {down:?} \
         after the pause"
    );
    let left = Duration::from_secs(3 * HEARTBEAT).saturating_sub(fault.elapsed());
    tokio::time::sleep(left).await;
    cluster.unpause(paused).await;

    stop.store(true, Ordering::Release);
    let sent = sender.await.unwrap();
    wait_all(&store, i64::from(sent) + 2 * i64::from(LATE)).await;
    let (late,): (i64,) = sqlx::query_as("SELECT count(DISTINCT n) FROM effects WHERE n >= ?")
        .bind(i64::from(LATE_AT_STOP))
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        late,
        2 * i64::from(LATE),
        "every scheduled job was published when due, through the nodes left"
    );
    let counts = transport.counts(&EntityPath::queue(&name)).await.unwrap();
    assert_eq!(
        (counts.active, counts.dead_lettered),
        (0, 0),
        "nothing left in the queue or its dead letters"
    );
    eprintln!(
        "{sent} jobs, each with its effect once; {} sends failed with a transient error and were sent again; \
         {} connections made; {:?} in all",
        retried.load(Ordering::Relaxed),
        transport.connections_made(),
        began.elapsed()
    );
    Arc::try_unwrap(running)
        .map_err(|_| "the endpoint is still shared")
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    transport.close().await;
    cluster.remove().await;
}
