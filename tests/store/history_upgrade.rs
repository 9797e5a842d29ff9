//! A store whose history was written before the history told of timeouts (migration
//! `20261205000001_history_timeouts`) keeps every event and its instance index through
//! the upgrade, and then takes the dispatcher's events (`timeout_dispatched`,
//! `timeout_dead_lettered`) and still refuses an outcome none of Courier's. On SQLite the
//! migration builds the table anew (a CHECK cannot change in place) and sets the index's
//! rows aside, as dropping the old table would otherwise empty the index by its cascade.

use std::path::Path;

use courier::{PostgresStore, SqliteStore, Store};
use courier_tests::pg::TestDatabase;
use sqlx::migrate::Migrator;

/// The last migration before the one under test.
const BEFORE: i64 = 20261203000001;

/// `dir`'s migrations up to [`BEFORE`], recorded in `table` as the store records them.
async fn migrations_before(dir: &str, table: &'static str) -> Migrator {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut migrator = Migrator::new(path).await.unwrap();
    migrator.migrations = migrator
        .migrations
        .iter()
        .filter(|m| m.version <= BEFORE)
        .cloned()
        .collect::<Vec<_>>()
        .into();
    migrator.dangerous_set_table_name(table);
    migrator
}

#[tokio::test]
async fn a_sqlite_history_keeps_its_events_and_index_through_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("store.db");
    let store = SqliteStore::open(&file).await.unwrap();
    let pool = store.pool().clone();
    migrations_before("migrations/sqlite", "courier_migrations")
        .await
        .run(&pool)
        .await
        .unwrap();
    for (id, kind) in [(1, "handled"), (2, "retried"), (3, "handled")] {
        sqlx::query(
            "INSERT INTO courier_history (id, endpoint, kind, at, message_id, attempt, detail) \
             VALUES (?1, 'flows', ?2, 1000, 'm-' || ?1, 1, '{}')",
        )
        .bind(id)
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    for id in [1, 3] {
        sqlx::query("INSERT INTO courier_history_instance VALUES (?1, 'tests.Flow', 'c-1')")
            .bind(id)
            .execute(&pool)
            .await
            .unwrap();
    }
    let refused = sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'timeout_dispatched', 1, 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(refused.is_err(), "before the upgrade the new outcomes are refused");

    store.migrate().await.unwrap();

    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT id, kind FROM courier_history ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec![(1, "handled".into()), (2, "retried".into()), (3, "handled".into())]
    );
    let index: Vec<i64> = sqlx::query_scalar(
        "SELECT history_id FROM courier_history_instance WHERE saga_type = 'tests.Flow' AND correlation = 'c-1' \
         ORDER BY history_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(index, vec![1, 3], "the instance index kept");
    for kind in ["timeout_dispatched", "timeout_dead_lettered"] {
        sqlx::query(
            "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('flows', ?1, 2000, 't-1', 1, '{}')",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let next: i64 = sqlx::query_scalar("SELECT MAX(id) FROM courier_history")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(next, 5, "ids go on after the kept ones");
    let bogus = sqlx::query(
        "INSERT INTO courier_history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'lost', 1, 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(bogus.is_err(), "an outcome none of Courier's is still refused");
    // The index still follows its events: deleting one deletes its index row.
    sqlx::query("DELETE FROM courier_history WHERE id = 1")
        .execute(&pool)
        .await
        .unwrap();
    let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM courier_history_instance")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 1, "ON DELETE CASCADE kept");
}

#[tokio::test]
async fn a_postgres_history_keeps_its_events_through_the_upgrade() {
    let db = TestDatabase::create().await;
    let pool = db.pool().await;
    sqlx::query("CREATE SCHEMA IF NOT EXISTS courier")
        .execute(&pool)
        .await
        .unwrap();
    migrations_before("migrations/postgres", "courier.migrations")
        .await
        .run(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'handled', now(), 'm-1', 1, '{}')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let store = PostgresStore::from_pool(pool.clone());
    store.migrate().await.unwrap();
    for kind in ["timeout_dispatched", "timeout_dead_lettered"] {
        sqlx::query(
            "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
             VALUES ('flows', $1, now(), 't-1', 1, '{}')",
        )
        .bind(kind)
        .execute(&pool)
        .await
        .unwrap();
    }
    let kinds: Vec<String> = sqlx::query_scalar("SELECT kind FROM courier.history ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(kinds, ["handled", "timeout_dispatched", "timeout_dead_lettered"]);
    let bogus = sqlx::query(
        "INSERT INTO courier.history (endpoint, kind, at, message_id, attempt, detail) \
         VALUES ('flows', 'lost', now(), 'm', 1, '{}')",
    )
    .execute(&pool)
    .await;
    assert!(bogus.is_err(), "an outcome none of Courier's is still refused");
    pool.close().await;
    db.drop_now().await;
}
