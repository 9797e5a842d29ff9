//! A process killed (SIGKILL) after a saga's state and its timeout committed, long before
//! the timeout is due: the restarted endpoint fires the timeout at its time, once, on each
//! store. Nothing of the timeout lived only in the dead process.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use courier::{Clock, Embedded, Endpoint, PostgresStore, SqliteStore, Store, Transport, VirtualClock};
use courier_tests::crash_saga::{CrashFlow, Fired};
use courier_tests::eventually;
use courier_tests::pg::TestDatabase;
use courier_tests::stores::StoreKind;

const CHILD: &str = env!("CARGO_BIN_EXE_courier-test-child");

enum Db {
    Sqlite(sqlx::SqlitePool),
    Postgres(sqlx::PgPool, Box<TestDatabase>),
}

impl Db {
    async fn count(&self, table: &str) -> i64 {
        let sql = match self {
            Db::Sqlite(_) => format!("SELECT COUNT(*) FROM courier_{table}"),
            Db::Postgres(..) => format!("SELECT COUNT(*) FROM courier.{table}"),
        };
        let sql = sqlx::AssertSqlSafe(sql);
        match self {
            Db::Sqlite(p) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
            Db::Postgres(p, _) => sqlx::query_scalar(sql).fetch_one(p).await.unwrap(),
        }
    }
}

async fn killed_after_the_state_committed(kind: StoreKind) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("broker.db");
    let (store_arg, store_db) = match kind {
        StoreKind::Sqlite => {
            let path = dir.path().join("store.db");
            let store = SqliteStore::open(&path).await.unwrap();
            store.migrate().await.unwrap();
            (format!("sqlite:{}", path.display()), Db::Sqlite(store.pool().clone()))
        }
        StoreKind::Embedded => {
            // The broker's schema (and the store's tables in it) exist once it opened.
            Embedded::open(&db).await.unwrap().close().await;
            let pool = SqliteStore::open(&db).await.unwrap().pool().clone();
            ("embedded".to_owned(), Db::Sqlite(pool))
        }
        StoreKind::Postgres => {
            let test_db = TestDatabase::create().await;
            let pool = test_db.pool().await;
            PostgresStore::from_pool(pool.clone()).migrate().await.unwrap();
            (test_db.url(), Db::Postgres(pool, Box::new(test_db)))
        }
    };

    let mut child = Command::new(CHILD)
        .args(["saga", db.to_str().unwrap(), "flows", &store_arg])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let line = BufReader::new(stdout).lines().next().unwrap().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        line
    })
    .await
    .unwrap();
    assert_eq!(line, "COMMITTED");
    assert_eq!(store_db.count("saga").await, 1, "the instance committed");
    assert_eq!(store_db.count("saga_timeout").await, 1, "its timeout committed with it");

    // Restart on a virtual clock standing where the child's system clock stood.
    let clock = VirtualClock::starting_now();
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let broker = Embedded::builder()
        .path(&db)
        .clock(shared.clone())
        .open()
        .await
        .unwrap();
    let store: Arc<dyn Store> = match &store_db {
        _ if kind == StoreKind::Embedded => Arc::new(broker.store()),
        Db::Sqlite(p) => Arc::new(SqliteStore::from_pool(p.clone())),
        Db::Postgres(p, _) => Arc::new(PostgresStore::from_pool(p.clone())),
    };
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
        store_db.count("saga").await == 0
    })
    .await;
    assert_eq!(store_db.count("saga_timeout").await, 0);
    clock.advance(Duration::from_secs(3600));
    eventually("idle", || async { running.stats().running == 0 }).await;
    assert_eq!(fired.0.load(Ordering::SeqCst), 1, "fired once");
    running.shutdown().await.unwrap();
    transport.close().await;
    if let Db::Postgres(pool, test_db) = store_db {
        pool.close().await;
        test_db.drop_now().await;
    }
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
