//! The application's own tables in the embedded broker's file (issue 13, point 6): its
//! migrations applied when the broker opens (`EmbeddedBuilder::migrations`), its rows
//! written by handlers in the message's transaction, and read outside handlers through
//! `Embedded::read_pool` while the engine stays the only writer. And the same migrations
//! on a `SqliteStore` (`SqliteStore::run_migrations`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use courier::sqlx::migrate::{Migration, MigrationType, Migrator};
use courier::{
    Context, Embedded, Endpoint, EntityPath, ErrorKind, HandlerError, RetryPolicy, Routes, SqliteStore, Store,
    Transport,
};
use courier_tests::eventually;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use tokio::sync::Semaphore;

/// The migrations of the docs' examples: one table, `orders`.
fn migrations() -> Migrator {
    sqlx::migrate!("../examples/migrations")
}

const ORDERS_VERSION: i64 = 20261201000001;

#[derive(Debug, Serialize, Deserialize, courier::Message)]
#[message(name = "appdata.PlaceOrder")]
struct PlaceOrder {
    id: String,
    total_cents: i64,
}

/// What the handler shares with the test: how often it ran, and a gate it waits at after
/// writing its row, inside its transaction.
#[derive(Clone)]
struct Probe {
    calls: Arc<AtomicU32>,
    gate: Arc<Semaphore>,
}

/// Writes the order into the application's table, waits at the gate, and fails for a
/// negative total (after writing).
#[courier::handler]
async fn place_order(order: PlaceOrder, ctx: &mut Context) -> Result<(), HandlerError> {
    let probe = ctx.state::<Probe>()?.clone();
    let tx = ctx.transaction::<sqlx::Sqlite>()?;
    sqlx::query("INSERT INTO orders (id, total_cents) VALUES (?1, ?2)")
        .bind(&order.id)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await?;
    probe.calls.fetch_add(1, Ordering::SeqCst);
    probe
        .gate
        .acquire()
        .await
        .map_err(|_| HandlerError::msg("the gate closed"))?
        .forget();
    if order.total_cents < 0 {
        return Err(HandlerError::msg("a negative total"));
    }
    Ok(())
}

async fn count(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

async fn orders_with_id(pool: &SqlitePool, id: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM orders WHERE id = ?1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A handler on the embedded store writes a row of the application's table in the
/// message's transaction. While it holds that transaction (the engine's only write
/// connection is lent to it), the read pool reads at once and sees nothing of it; after
/// the commit it sees the row, with the message completed. A handler that fails leaves no
/// row. The read pool refuses writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_write_in_the_message_transaction_and_the_read_pool_reads_beside_them() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Embedded::builder()
        .path(dir.path().join("app.db"))
        .migrations(migrations())
        .open()
        .await
        .unwrap();
    let probe = Probe {
        calls: Arc::new(AtomicU32::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let orders = Endpoint::builder("orders")
        .transport(broker.clone())
        .store(broker.store())
        .routes(Routes::new().send::<PlaceOrder>("orders"))
        .state(probe.clone())
        .handler(place_order)
        .recoverability(RetryPolicy::none())
        .concurrency(1)
        .start()
        .await
        .unwrap();
    let reads = broker.read_pool().clone();

    orders
        .bus()
        .send(&PlaceOrder {
            id: "o-1".into(),
            total_cents: 1250,
        })
        .await
        .unwrap();
    eventually("the handler wrote its row", || async {
        probe.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // The handler's transaction is open: a read neither waits for it nor sees its row. (The
    // bound only keeps a read that would wait for the writer from hanging the test.)
    let during = tokio::time::timeout(Duration::from_secs(10), orders_with_id(&reads, "o-1"))
        .await
        .expect("a read does not wait for the engine's transaction");
    assert_eq!(during, 0, "an uncommitted row is not visible");

    probe.gate.add_permits(1);
    eventually("the committed row", || async {
        orders_with_id(&reads, "o-1").await == 1
    })
    .await;
    let total: i64 = sqlx::query_scalar("SELECT total_cents FROM orders WHERE id = 'o-1'")
        .fetch_one(&reads)
        .await
        .unwrap();
    assert_eq!(total, 1250);
    let queue = EntityPath::queue("orders");
    eventually("the message completed", || async {
        broker.counts(&queue).await.unwrap().active == 0
    })
    .await;
    assert_eq!(count(&reads, "SELECT COUNT(*) FROM courier_inbox").await, 1);

    // Writes its row, then fails: rolled back with the message's transaction.
    probe.gate.add_permits(1);
    orders
        .bus()
        .send(&PlaceOrder {
            id: "o-2".into(),
            total_cents: -1,
        })
        .await
        .unwrap();
    eventually("the failed order dead-lettered", || async {
        broker.counts(&queue).await.unwrap().dead_lettered == 1
    })
    .await;
    assert_eq!(probe.calls.load(Ordering::SeqCst), 2, "it did write, once");
    assert_eq!(orders_with_id(&reads, "o-2").await, 0, "no row of a failed handling");

    // The read pool does not write, not the application's tables nor Courier's.
    for write in [
        "INSERT INTO orders (id, total_cents) VALUES ('o-3', 1)",
        "DELETE FROM courier_inbox",
        "CREATE TABLE notes (body TEXT)",
    ] {
        let error = sqlx::query(write).execute(&reads).await.expect_err(write);
        let db = error.as_database_error().expect("a database error");
        assert_eq!(db.code().as_deref(), Some("8"), "SQLITE_READONLY for {write}: {db}");
        assert!(db.message().contains("readonly"), "{}", db.message());
    }
    assert_eq!(orders_with_id(&reads, "o-3").await, 0);
    assert_eq!(count(&reads, "SELECT COUNT(*) FROM courier_inbox").await, 1);

    orders.shutdown().await.unwrap();
    broker.close().await;
}

/// In memory the read pool shares the engine's database through SQLite's shared cache,
/// which locks table by table: a read of a table a handling is writing waits until that
/// transaction ends (sqlx's `sqlite-unlock-notify`), and then sees the committed row.
/// Before, it failed at once with "database table is locked" (and `courier::admin`'s
/// reads of an in-memory broker, such as the web console's, failed the same way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_read_of_a_table_being_written_waits_for_the_commit() {
    let broker = Embedded::builder()
        .in_memory()
        .migrations(migrations())
        .open()
        .await
        .unwrap();
    let probe = Probe {
        calls: Arc::new(AtomicU32::new(0)),
        gate: Arc::new(Semaphore::new(0)),
    };
    let orders = Endpoint::builder("orders")
        .transport(broker.clone())
        .store(broker.store())
        .routes(Routes::new().send::<PlaceOrder>("orders"))
        .state(probe.clone())
        .handler(place_order)
        .recoverability(RetryPolicy::none())
        .concurrency(1)
        .start()
        .await
        .unwrap();
    let reads = broker.read_pool().clone();
    orders
        .bus()
        .send(&PlaceOrder {
            id: "m-1".into(),
            total_cents: 700,
        })
        .await
        .unwrap();
    eventually("the handler wrote its row", || async {
        probe.calls.load(Ordering::SeqCst) == 1
    })
    .await;
    // The handler holds its transaction (with the row) at the gate: the read waits.
    let read = tokio::spawn({
        let reads = reads.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT COUNT(*) FROM orders WHERE id = 'm-1'")
                .fetch_one(&reads)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!read.is_finished(), "the read waits for the handling's transaction");
    probe.gate.add_permits(1);
    let seen = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the read ends once the transaction commits")
        .unwrap()
        .expect("the read waited instead of failing with `database table is locked`");
    assert_eq!(seen, 1, "it sees the committed row");
    orders.shutdown().await.unwrap();
    broker.close().await;
}

/// The application's migrations keep their own table, are applied once per file, and a
/// migration that fails, or that changed after it was applied, is named in the error;
/// a migrator that would share Courier's migrations table is refused before anything
/// runs.
#[tokio::test]
async fn the_applications_migrations_apply_once_and_name_the_one_that_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("app.db");
    let open = |migrator: Migrator| Embedded::builder().path(&path).migrations(migrator).open();

    let broker = open(migrations()).await.unwrap();
    let reads = broker.read_pool().clone();
    let courier_versions = count(&reads, "SELECT COUNT(*) FROM courier_migrations").await;
    assert!(courier_versions > 0);
    assert_eq!(count(&reads, "SELECT COUNT(*) FROM _sqlx_migrations").await, 1);
    assert_eq!(count(&reads, "SELECT COUNT(*) FROM orders").await, 0);
    broker.close().await;
    drop(broker);

    // Again: nothing new to apply.
    let broker = open(migrations()).await.unwrap();
    assert_eq!(
        count(broker.read_pool(), "SELECT COUNT(*) FROM _sqlx_migrations").await,
        1
    );
    assert_eq!(
        count(broker.read_pool(), "SELECT COUNT(*) FROM courier_migrations").await,
        courier_versions,
        "Courier's migrations table holds only Courier's"
    );
    broker.close().await;
    drop(broker);

    // A new migration that fails: the error names it; the broker does not open.
    let mut broken: Vec<Migration> = migrations().iter().cloned().collect();
    broken.push(Migration::new(
        ORDERS_VERSION + 1,
        "add a column to a missing table".into(),
        MigrationType::Simple,
        sqlx::SqlStr::from_static("ALTER TABLE no_such_table ADD COLUMN note TEXT"),
        false,
    ));
    let error = open(Migrator::with_migrations(broken)).await.unwrap_err();
    let text = error.to_string();
    assert!(
        matches!(error.kind(), ErrorKind::Storage { transient: false, .. }),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} (add a column to a missing table)", ORDERS_VERSION + 1)),
        "{text}"
    );
    assert!(text.contains("no_such_table"), "{text}");

    // An applied migration edited since: named too.
    let edited = Migrator::with_migrations(vec![Migration::new(
        ORDERS_VERSION,
        "orders".into(),
        MigrationType::Simple,
        sqlx::SqlStr::from_static("CREATE TABLE orders (id TEXT PRIMARY KEY NOT NULL)"),
        false,
    )]);
    let error = open(edited).await.unwrap_err();
    let text = error.to_string();
    assert!(text.contains(&format!("{ORDERS_VERSION} (orders)")), "{text}");
    assert!(text.contains("changed"), "{text}");

    // Courier's migrations table (or any courier_* name) is refused.
    let mut colliding = migrations();
    colliding.dangerous_set_table_name("courier_migrations");
    let error = open(colliding).await.unwrap_err();
    assert!(matches!(error.kind(), ErrorKind::InvalidOptions { .. }), "{error}");
    assert!(error.to_string().contains("courier_migrations"), "{error}");

    // The failures left the file as it was, and free for the next broker.
    let broker = open(migrations()).await.unwrap();
    assert_eq!(
        count(broker.read_pool(), "SELECT COUNT(*) FROM _sqlx_migrations").await,
        1
    );
    broker.close().await;
}

/// `SqliteStore::run_migrations`: the same migrations next to the store's tables, once,
/// in their own table; Courier's table name refused.
#[tokio::test]
async fn sqlite_store_runs_the_applications_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("store.db")).await.unwrap();
    store.migrate().await.unwrap();
    store.run_migrations(&migrations()).await.unwrap();
    store.run_migrations(&migrations()).await.unwrap();
    assert_eq!(count(store.pool(), "SELECT COUNT(*) FROM _sqlx_migrations").await, 1);
    assert_eq!(count(store.pool(), "SELECT COUNT(*) FROM orders").await, 0);
    let mut colliding = migrations();
    colliding.dangerous_set_table_name("Courier_Timeouts");
    let error = store.run_migrations(&colliding).await.unwrap_err();
    assert!(matches!(error.kind(), ErrorKind::InvalidOptions { .. }), "{error}");
}
