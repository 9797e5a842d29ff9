//! A process killed (SIGKILL) at the worst moment of a message's handling, on each store.
//! With a separate store, that moment is between the commit and the end of the dispatch:
//! after a restart, the redelivered message is recognised by the inbox and the message
//! its handler sent is dispatched once, with the id it was stored with. With the embedded
//! broker's own file as the store, the worst moment is inside the one transaction: after
//! a restart nothing of it is visible and the message is handled once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::{
    Bus, Clock, Context, Embedded, Endpoint, EntityPath, HandlerError, QueueOptions, Routes, SendOptions, Transport,
    VirtualClock,
};
use courier_tests::crash::{StoreDb, insert_order, kill_after_first_line};
use courier_tests::{CrashDone, CrashJob, eventually};

use super::Kind;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

/// The restarted endpoint's handler: the child's, counted.
#[derive(Clone, Default)]
struct Calls(Arc<AtomicU32>);

#[courier::handler]
async fn record_and_send(job: CrashJob, ctx: &mut Context) -> Result<(), HandlerError> {
    ctx.state::<Calls>()?.0.fetch_add(1, Ordering::SeqCst);
    let kind = *ctx.state::<Kind>()?;
    let id = format!("job-{}", job.n);
    insert_order(ctx, kind == Kind::Postgres, &id).await?;
    ctx.send(&CrashDone { n: job.n })?;
    Ok(())
}

async fn killed_at_the_worst_moment(kind: Kind) {
    killed_with(kind, &[7], "outbox").await;
}

/// `jobs` sent before the child starts, handled by it in `mode`, until it is killed.
async fn killed_with(kind: Kind, jobs: &[u32], mode: &str) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broker.db");
    {
        let broker = Embedded::open(&db).await.unwrap();
        for q in ["jobs", "done"] {
            broker.create_queue(q, &QueueOptions::default()).await.unwrap();
        }
        let transport: Arc<dyn Transport> = Arc::new(broker);
        let bus = Bus::new(transport.clone(), Routes::new().send::<CrashJob>("jobs"));
        for &n in jobs {
            bus.send_with(&CrashJob { n }, SendOptions::new().message_id(format!("job-{n}")))
                .await
                .unwrap();
        }
        transport.close().await;
    }
    // The store, its tables and the application's `orders` table.
    let (store_arg, store_db) = StoreDb::prepare(kind, dir.path(), &db).await;
    store_db.exec("CREATE TABLE orders (id TEXT NOT NULL)").await;
    let line = kill_after_first_line(CHILD, &[mode, db.to_str().unwrap(), "jobs", &store_arg]).await;
    let n = i64::try_from(jobs.len()).unwrap();

    if kind.one_transaction() {
        assert_eq!(line, "IN_TRANSACTION");
        assert_eq!(
            store_db.count("SELECT COUNT(*) FROM orders").await,
            0,
            "nothing committed"
        );
    } else {
        assert_eq!(
            line, "DISPATCHING",
            "killed between the commit and the end of the dispatch"
        );
        assert_eq!(store_db.count("SELECT COUNT(*) FROM orders").await, n, "committed");
    }

    // Restart: this process opens the same files.
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .path(&db)
        .clock(shared.clone())
        .open()
        .await
        .unwrap();
    let store = store_db.store(kind, &broker);
    let transport: Arc<dyn Transport> = Arc::new(broker);
    let calls = Calls::default();
    let running = Endpoint::builder("jobs")
        .transport(transport.clone())
        .clock(shared)
        .routes(Routes::new().send::<CrashDone>("done"))
        .store(store)
        .state(calls.clone())
        .state(kind)
        .handler(record_and_send)
        .start()
        .await
        .unwrap();
    eventually("the jobs settled", || async {
        let c = transport.counts(&EntityPath::queue("jobs")).await.unwrap();
        c.active == 0 && running.stats().completed == jobs.len() as u64
    })
    .await;
    // Past the outbox sweeper's age: it must find nothing left to send.
    clock.advance(Duration::from_secs(45));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let done = transport.peek(&EntityPath::queue("done"), 0, 10).await.unwrap();
    let mut causes: Vec<String> = done.iter().filter_map(|m| m.envelope.causation_id.clone()).collect();
    causes.sort();
    let mut expected: Vec<String> = jobs.iter().map(|n| format!("job-{n}")).collect();
    expected.sort();
    assert_eq!(causes, expected, "each outgoing message dispatched exactly once");
    assert_eq!(store_db.count("SELECT COUNT(*) FROM orders").await, n, "effects once");
    let handled = u32::try_from(jobs.len()).unwrap();
    if kind.one_transaction() {
        assert_eq!(
            calls.0.load(Ordering::SeqCst),
            handled,
            "handled once, after the restart"
        );
        assert_eq!(running.stats().duplicates, 0);
    } else {
        assert_eq!(
            calls.0.load(Ordering::SeqCst),
            0,
            "recognised by the inbox, not handled again"
        );
        assert_eq!(running.stats().duplicates, u64::from(handled));
        eventually("the outbox emptied", || async { store_db.rows("outbox").await == 0 }).await;
    }
    running.shutdown().await.unwrap();
    transport.close().await;
    store_db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_killed_between_commit_and_dispatch() {
    killed_at_the_worst_moment(Kind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_killed_between_commit_and_dispatch() {
    killed_at_the_worst_moment(Kind::Postgres).await;
}

/// A group commit (Postgres): four jobs committed in one transaction, then the process is
/// killed before any of their messages was dispatched. After the restart each job is
/// recognised and its message dispatched once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_group_killed_between_commit_and_dispatch() {
    killed_with(Kind::Postgres, &[1, 2, 3, 4], "outbox-group").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_killed_inside_its_one_transaction() {
    killed_at_the_worst_moment(Kind::Embedded).await;
}
