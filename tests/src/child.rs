//! A child process for the durability tests: it works on an embedded broker file and
//! reports each step on stdout, until the test kills it with SIGKILL.
//!
//! `courier-test-child send <db> <queue>`: sends messages `m-0`, `m-1`, ... one at a time
//! and prints `ACK <i>` after each acknowledged send.
//! `courier-test-child lock <db> <queue>`: receives one message in PeekLock mode, prints
//! `LOCKED <sequence number> <delivery count>` and waits to be killed.
//! `courier-test-child endpoint <db> <queue>`: runs an endpoint whose handler of
//! [`courier_tests::CrashJob`] always fails, under [`courier_tests::crash_policy`]; prints
//! `ATTEMPT <attempt> <delayed retries>` per call and `SCHEDULED` once the delayed retry
//! is in the broker and the original completed, then waits to be killed.
//! `courier-test-child outbox <db> <queue> <store>`: runs an endpoint with a store
//! (`sqlite:<file>`, a `postgres://` URL, or `embedded` for the broker's own file) whose
//! handler of [`courier_tests::CrashJob`] inserts a row into `orders` and sends
//! [`courier_tests::CrashDone`] to queue `done`. With a separate store the send to `done`
//! never finishes: the child prints `DISPATCHING` once its transaction committed and the
//! dispatch began. With `embedded` the handler prints `IN_TRANSACTION` after its insert
//! and never returns. Either way it waits to be killed. `outbox-group` is the same with
//! `group_commit(4)`: messages received together commit in one transaction, then stall in
//! their dispatch.
//! `courier-test-child saga <db> <queue> <store>`: runs an endpoint with the saga
//! [`courier_tests::crash_saga::CrashFlow`] on a store as `outbox` takes it, starts
//! instance `flow-1` (whose timeout is due an hour later), prints `COMMITTED` once the
//! start is handled and waits to be killed, long before the timeout is due.
//! `courier-test-child history <db> <queue> <store>`: runs an endpoint with a history
//! (`EndpointBuilder::history`) on a store as `outbox` takes it, whose handler of
//! [`courier_tests::CrashJob`] inserts a row into `orders` and sends
//! [`courier_tests::CrashDone`]; prints `HANDLING` once 30 jobs are handled and goes on
//! handling, four at a time, until it is killed among commits.
//!
//! The test servers' cleanup (`tests/amqp/leftovers.rs`), modes without a broker file:
//! `courier-test-child watch <container>` starts the watcher of a container name
//! (`courier::test_servers::remove_when_process_ends`) and prints `READY`;
//! `courier-test-child containers` starts a Postgres container of the harness's
//! (testcontainers) and one of `courier::test_servers` and prints `READY`;
//! `courier-test-child databases` makes a database of the harness's and one of
//! `courier::test_servers` (and, with `AMQP_URL` set, a vhost) and prints `READY` and
//! their names. Each then waits to be killed.

#![allow(clippy::print_stdout, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use courier::prelude::*;
use courier::{Capabilities, SendError, SequenceNumber};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    if matches!(args[1].as_str(), "watch" | "containers" | "databases") {
        servers(&args[1], args.get(2)).await;
    }
    let (mode, db, queue) = (args[1].as_str(), &args[2], &args[3]);
    let broker = Embedded::open(db).await.expect("open broker");
    broker.create_queue(queue, &QueueOptions::default()).await.unwrap();
    let mut out = std::io::stdout().lock();
    match mode {
        "send" => {
            let sender = broker.sender(queue, SenderOptions::default()).await.unwrap();
            for i in 0u64.. {
                sender
                    .send(Envelope::new(vec![b'x'; 1024]).with_message_id(format!("m-{i}")))
                    .await
                    .unwrap();
                writeln!(out, "ACK {i}").unwrap();
                out.flush().unwrap();
            }
        }
        "lock" => {
            let receiver = broker.receiver(&EntityPath::queue(queue)).await.unwrap();
            let got = receiver.receive(1, Duration::from_secs(10)).await.unwrap();
            let m = got[0].message();
            writeln!(out, "LOCKED {} {}", m.sequence_number(), m.delivery_count()).unwrap();
            out.flush().unwrap();
            std::future::pending::<()>().await;
        }
        "endpoint" => {
            #[courier::handler]
            async fn always_fails(
                _job: courier_tests::CrashJob,
                ctx: &mut courier::Context,
            ) -> Result<(), HandlerError> {
                let mut out = std::io::stdout().lock();
                writeln!(out, "ATTEMPT {} {}", ctx.attempt(), ctx.delayed_retries()).unwrap();
                out.flush().unwrap();
                Err(HandlerError::msg("the job always fails"))
            }
            let broker = std::sync::Arc::new(broker);
            let transport: std::sync::Arc<dyn Transport> = broker.clone();
            let _running = Endpoint::builder(queue.as_str())
                .transport(transport)
                .recoverability(courier_tests::crash_policy())
                .handler(always_fails)
                .start()
                .await
                .unwrap();
            loop {
                let c = broker.counts(&EntityPath::queue(queue)).await.unwrap();
                if c.scheduled == 1 && c.active == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            writeln!(out, "SCHEDULED").unwrap();
            out.flush().unwrap();
            std::future::pending::<()>().await;
        }
        "outbox" => outbox(broker, queue, &args[4], 1).await,
        "outbox-group" => outbox(broker, queue, &args[4], 4).await,
        "saga" => saga(broker, queue, &args[4]).await,
        "history" => history(broker, queue, &args[4]).await,
        other => panic!("unknown mode {other}"),
    }
}

/// A transport that hands everything to the embedded broker, except that a send to queue
/// `done` announces itself and never finishes: the moment between an endpoint's commit
/// and the end of its dispatch, held open for the test to kill the process in.
struct StallDone(Embedded);

struct StallingSender;

#[async_trait::async_trait]
impl Sender for StallingSender {
    fn entity(&self) -> &str {
        "done"
    }
    fn in_flight(&self) -> usize {
        0
    }
    async fn send(&self, _message: Envelope) -> Result<(), SendError> {
        stall("DISPATCHING").await
    }
    async fn send_batch(&self, _messages: Vec<Envelope>) -> Result<(), SendError> {
        stall("DISPATCHING").await
    }
    async fn schedule(
        &self,
        _message: Envelope,
        _at: chrono::DateTime<chrono::Utc>,
    ) -> Result<SequenceNumber, SendError> {
        stall("DISPATCHING").await
    }
    async fn cancel_scheduled(&self, _sequence_number: SequenceNumber) -> courier::Result<()> {
        stall("DISPATCHING").await
    }
    async fn send_presettled(&self, _message: Envelope) -> Result<(), SendError> {
        stall("DISPATCHING").await
    }
}

/// Prints `line` and waits forever.
async fn stall<T>(line: &str) -> T {
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    }
    std::future::pending().await
}

#[async_trait::async_trait]
impl Transport for StallDone {
    fn name(&self) -> &'static str {
        "stall-done"
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn create_queue(&self, name: &str, options: &QueueOptions) -> courier::Result<()> {
        self.0.create_queue(name, options).await
    }
    async fn create_topic(&self, name: &str, options: &TopicOptions) -> courier::Result<()> {
        self.0.create_topic(name, options).await
    }
    async fn create_subscription(
        &self,
        topic: &str,
        name: &str,
        options: &courier::SubscriptionOptions,
    ) -> courier::Result<()> {
        self.0.create_subscription(topic, name, options).await
    }
    async fn delete(&self, path: &EntityPath) -> courier::Result<()> {
        self.0.delete(path).await
    }
    async fn sender(&self, entity: &str, options: SenderOptions) -> courier::Result<Arc<dyn Sender>> {
        if entity == "done" {
            return Ok(Arc::new(StallingSender));
        }
        self.0.sender(entity, options).await
    }
    async fn receiver(&self, path: &EntityPath) -> courier::Result<Arc<dyn Receiver>> {
        self.0.receiver(path).await
    }
    async fn accept_session(
        &self,
        path: &EntityPath,
        session: SessionSelector,
        max_wait: Duration,
    ) -> courier::Result<Arc<dyn SessionReceiver>> {
        self.0.accept_session(path, session, max_wait).await
    }
    async fn peek(&self, path: &EntityPath, from: SequenceNumber, max: usize) -> courier::Result<Vec<ReceivedMessage>> {
        self.0.peek(path, from, max).await
    }
    async fn counts(&self, path: &EntityPath) -> courier::Result<courier::EntityCounts> {
        self.0.counts(path).await
    }
    async fn close(&self) {
        self.0.close().await;
    }
}

#[courier::handler]
async fn record_and_send(job: courier_tests::CrashJob, ctx: &mut courier::Context) -> Result<(), HandlerError> {
    let id = format!("job-{}", job.n);
    let store = *ctx.state::<ChildStore>()?;
    courier_tests::crash::insert_order(ctx, store == ChildStore::Postgres, &id).await?;
    ctx.send(&courier_tests::CrashDone { n: job.n })?;
    if store == ChildStore::Embedded {
        stall::<()>("IN_TRANSACTION").await;
    }
    Ok(())
}

/// Which store the child's endpoint has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChildStore {
    Sqlite,
    Postgres,
    Embedded,
}

async fn outbox(broker: Embedded, queue: &str, store: &str, group: usize) {
    let (transport, kind, store): (Arc<dyn Transport>, _, Arc<dyn courier::Store>) = if store == "embedded" {
        let store = broker.store();
        (Arc::new(broker), ChildStore::Embedded, Arc::new(store))
    } else if let Some(path) = store.strip_prefix("sqlite:") {
        let store = courier::SqliteStore::open(path).await.unwrap();
        (Arc::new(StallDone(broker)), ChildStore::Sqlite, Arc::new(store))
    } else {
        let store = courier::PostgresStore::connect(store).await.unwrap();
        (Arc::new(StallDone(broker)), ChildStore::Postgres, Arc::new(store))
    };
    let _running = Endpoint::builder(queue)
        .transport(transport)
        .routes(Routes::new().send::<courier_tests::CrashDone>("done"))
        .store(store)
        .state(kind)
        .group_commit(group)
        .handler(record_and_send)
        .start()
        .await
        .unwrap();
    std::future::pending::<()>().await;
}

/// Handles the queued jobs with a history, four at a time, prints `HANDLING` once 30 are
/// handled, and goes on until it is killed: the kill falls among commits.
async fn history(broker: Embedded, queue: &str, store: &str) {
    let (kind, store): (ChildStore, Arc<dyn courier::Store>) = if store == "embedded" {
        (ChildStore::Embedded, Arc::new(broker.store()))
    } else if let Some(path) = store.strip_prefix("sqlite:") {
        (
            ChildStore::Sqlite,
            Arc::new(courier::SqliteStore::open(path).await.unwrap()),
        )
    } else {
        (
            ChildStore::Postgres,
            Arc::new(courier::PostgresStore::connect(store).await.unwrap()),
        )
    };
    let running = Endpoint::builder(queue)
        .transport(Arc::new(broker))
        .routes(Routes::new().send::<courier_tests::CrashDone>("done"))
        .store(store)
        .state(kind)
        .concurrency(4)
        .history(courier::HistoryOptions::new().with_bodies(true))
        .handler(record_job)
        .start()
        .await
        .unwrap();
    while running.stats().completed < 30 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    stall::<()>("HANDLING").await;
}

/// Records the job in the store's transaction and sends `CrashDone`.
#[courier::handler]
async fn record_job(job: courier_tests::CrashJob, ctx: &mut courier::Context) -> Result<(), HandlerError> {
    let id = format!("job-{}", job.n);
    let postgres = *ctx.state::<ChildStore>()? == ChildStore::Postgres;
    courier_tests::crash::insert_order(ctx, postgres, &id).await?;
    ctx.send(&courier_tests::CrashDone { n: job.n })?;
    Ok(())
}

async fn saga(broker: Embedded, queue: &str, store: &str) {
    let store: Arc<dyn courier::Store> = if store == "embedded" {
        Arc::new(broker.store())
    } else if let Some(path) = store.strip_prefix("sqlite:") {
        Arc::new(courier::SqliteStore::open(path).await.unwrap())
    } else {
        Arc::new(courier::PostgresStore::connect(store).await.unwrap())
    };
    let running = Endpoint::builder(queue)
        .transport(Arc::new(broker))
        .store(store)
        .saga::<courier_tests::crash_saga::CrashFlow>()
        .start()
        .await
        .unwrap();
    let start = courier_tests::crash_saga::CrashFlowStart { id: "flow-1".into() };
    running
        .bus()
        .send_with(&start, SendOptions::new().to(queue))
        .await
        .unwrap();
    while running.stats().completed == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stall::<()>("COMMITTED").await;
}

/// The modes of the test servers' cleanup: make something, print `READY ...`, wait.
async fn servers(mode: &str, container: Option<&String>) -> ! {
    let mut line = String::from("READY");
    // Kept alive until the process is killed.
    let mut keep: Vec<Box<dyn std::any::Any>> = Vec::new();
    match mode {
        "watch" => {
            courier::test_servers::remove_when_process_ends(container.expect("a container name")).unwrap();
        }
        "containers" => {
            courier_tests::containers::images_for_test_servers();
            keep.push(Box::new(courier_tests::pg::PgServer::container().await));
            keep.push(Box::new(courier::test_servers::postgres_database().await.unwrap()));
        }
        _ => {
            let harness = courier_tests::pg::TestDatabase::create().await;
            let fixture = courier::test_servers::postgres_database().await.unwrap();
            line = format!("READY {} {}", harness.name, fixture.name());
            if std::env::var_os("AMQP_URL").is_some() {
                let vhost = courier::test_servers::rabbitmq_vhost().await.unwrap();
                line = format!("{line} {}", vhost.name());
            }
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
    drop(out);
    loop {
        std::future::pending::<()>().await;
    }
}
