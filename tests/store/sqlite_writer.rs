//! The SQLite store's writer connection (`store/sqlite_tx.rs`): its writers write on one
//! connection taken out of the pool and kept with the write turn. The pool lends another
//! in its place, so a store over a pool of one connection still reads and writes.

use std::time::Duration;

use courier::{SqliteStore, Store};

/// A pool of one connection: the writer takes it out for good, and every read after
/// (each on the pool) and every write (each on the writer connection) still runs, with
/// no wait for a connection that never comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_over_a_pool_of_one_connection_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("one.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options)
        .await
        .unwrap();
    let store = SqliteStore::from_pool(pool);
    store.migrate().await.unwrap();
    let now = chrono::Utc::now();
    for i in 0..3 {
        let courier::Begin::Fresh(mut work) = store.begin("e", &format!("m{i}"), None, now).await.unwrap() else {
            panic!("a fresh id");
        };
        let out = courier::Envelope::new("{}").with_message_id(format!("out-{i}"));
        work.store_outgoing(vec![("done".to_owned(), false, out)], now)
            .await
            .unwrap();
        work.commit().await.unwrap();
        // A read on the pool, then a write on the writer connection.
        let later = now + chrono::Duration::seconds(1);
        let left = store.undispatched("e", later, 10).await.unwrap();
        assert_eq!(left.len(), 1, "the message just stored");
        store.mark_dispatched(&[left[0].id]).await.unwrap();
    }
    let purged = store
        .purge_inbox("e", now + chrono::Duration::seconds(1), 10)
        .await
        .unwrap();
    assert_eq!(purged, 3);
    assert!(store.undispatched("e", now, 10).await.unwrap().is_empty());
}
