//! A process killed (SIGKILL) after a saga's state and its timeout committed, long before
//! the timeout is due: the restarted endpoint fires the timeout at its time, once, on each
//! store. Nothing of the timeout lived only in the dead process.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use courier::{Clock, Embedded, Endpoint, Transport, VirtualClock};
use courier_tests::crash::{StoreDb, kill_after_first_line};
use courier_tests::crash_saga::{CrashFlow, Fired};
use courier_tests::eventually;
use courier_tests::stores::StoreKind;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

async fn killed_after_the_state_committed(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broker.db");
    let (store_arg, store_db) = StoreDb::prepare(kind, dir.path(), &db).await;
    let line = kill_after_first_line(CHILD, &["saga", db.to_str().unwrap(), "flows", &store_arg]).await;
    assert_eq!(line, "COMMITTED");
    assert_eq!(store_db.rows("saga").await, 1, "the instance committed");
    assert_eq!(store_db.rows("saga_timeout").await, 1, "its timeout committed with it");

    // Restart on a virtual clock standing where the child's system clock stood.
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
    let fired = Arc::new(Fired::default());
    let running = Endpoint::builder("flows")
        .transport(transport.clone())
        .clock(shared)
        .store(store)
        .state(fired.clone())
        .saga::<CrashFlow>()
        .start()
        .await
        .unwrap();
    assert_eq!(fired.0.load(Ordering::SeqCst), 0, "not before its time");
    clock.advance(Duration::from_secs(3601));
    eventually("the timeout fired and its completion committed", || async {
        store_db.rows("saga").await == 0
    })
    .await;
    assert_eq!(store_db.rows("saga_timeout").await, 0);
    clock.advance(Duration::from_secs(3600));
    eventually("idle", || async { running.stats().running == 0 }).await;
    assert_eq!(fired.0.load(Ordering::SeqCst), 1, "fired once");
    running.shutdown().await.unwrap();
    transport.close().await;
    store_db.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_killed_after_the_state_committed() {
    killed_after_the_state_committed(StoreKind::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_killed_after_the_state_committed() {
    killed_after_the_state_committed(StoreKind::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_killed_after_the_state_committed() {
    killed_after_the_state_committed(StoreKind::Embedded).await;
}
